"""GPU correctness of faprof's CUDA-core kernels (naive, fa1, fa2) against a float64 reference.

Method: every case draws fresh torch.randn inputs (never zeros) on the GPU, poisons the outputs
(O, and lse / l / m / the score workspace) with NaN, runs the op, and compares with
softmax(scale·Q·Kᵀ, top-left causal mask)·V computed in float64 on the GPU. Error is
‖out − ref‖ / ‖ref‖ and max |out − ref|; a NaN left anywhere fails. Shapes are the awkward ones
(1, 17, 113, 203, 1000: tails of every tile size; Sq != Sk both ways) over D in {32, 64, 128},
causal and not: the full grid at B = H = 1, then a B = 3, H = 5 sweep, then behaviour (bad inputs
raise RuntimeError with a clear message; the faulting kernel faults, in a child process).

The extension is built once per session (faprof.build.load(); cached across runs).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
from attention_reference import reference
from testonly import TESTONLY_VARIANTS

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]

#: fp32 CUDA-core math against float64: dot products of up to 128 terms and sums over up to 1000
#: keys land near 1e-6 relative; 1e-5 leaves a 10x margin and still catches any indexing or
#: masking bug (those give errors of order 1).
REL_TOL = 1e-5
#: Outputs are convex combinations of N(0, 1) values (|O| < ~4): 1e-4 absolute is ~1e-5 relative.
MAX_ABS_TOL = 1e-4
#: lse = m + log(l) and the row max m carry the rounding of the fp32 scores, which grows with
#: their magnitude (|m| ~ 3 at scale 1/sqrt(D), ~45 in the sharp-softmax case): the bound is
#: relative, err <= LSE_REL_TOL * (1 + |ref|), ~40x fp32 epsilon.
LSE_REL_TOL = 5e-6

VARIANTS = ("naive", "fa1", "fa2")
HEAD_DIMS = (32, 64, 128)
SEQ_LENS = (1, 17, 113, 128, 203, 1000)
SEQ_PAIRS = ((17, 203), (203, 17), (1, 1000), (1000, 113))


#: Worst errors seen per variant in this module (printed at the end with `pytest -s`).
WORST: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_worst_errors():
    yield
    for name, errs in sorted(WORST.items()):
        print(f"\n{name}: worst " + ", ".join(f"{k}={v:.2e}" for k, v in sorted(errs.items())))


def _note(variant: str, **errs: float) -> None:
    seen = WORST.setdefault(variant, {})
    for k, v in errs.items():
        seen[k] = max(seen.get(k, 0.0), v)


def make_inputs(B, H, Sq, Sk, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, Sq, D, device="cuda", generator=g)
    k = torch.randn(B, H, Sk, D, device="cuda", generator=g)
    v = torch.randn(B, H, Sk, D, device="cuda", generator=g)
    return q, k, v


def nan_like(shape):
    return torch.full(shape, float("nan"), device="cuda", dtype=torch.float32)


def run_variant(ops, variant, q, k, v, causal, scale):
    """Run one op on NaN-poisoned outputs; returns (out, extras dict)."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    out = nan_like((B, H, Sq, D))
    if variant == "naive":
        scores = nan_like((B, H, Sq, Sk))
        ops.naive_fwd(q, k, v, out, scores, causal, scale)
        return out, {}
    if variant == "fa1":
        l, m = nan_like((B, H, Sq)), nan_like((B, H, Sq))  # noqa: E741
        ops.fa1_fwd(q, k, v, out, l, m, causal, scale)
        return out, {"l": l, "m": m}
    lse = nan_like((B, H, Sq))
    ops.fa2_fwd(q, k, v, out, lse, causal, scale)
    return out, {"lse": lse}


def check_case(ops, variant, B, H, Sq, Sk, D, causal, scale=None, seed=0):
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q, k, v = make_inputs(B, H, Sq, Sk, D, seed)
    out, extra = run_variant(ops, variant, q, k, v, causal, scale)
    torch.cuda.synchronize()
    o_ref, lse_ref, m_ref, l_ref = reference(q, k, v, causal, scale)
    case = f"{variant} B={B} H={H} Sq={Sq} Sk={Sk} D={D} causal={causal} scale={scale:g}"

    assert not torch.isnan(out).any(), (
        f"{case}: {int(torch.isnan(out).sum())} output elements left unwritten (NaN)"
    )
    diff = out.double() - o_ref
    rel = (diff.norm() / o_ref.norm()).item()
    max_abs = diff.abs().max().item()
    _note(variant, rel=rel, max_abs=max_abs)
    assert rel < REL_TOL, f"{case}: relative error {rel:.3e} >= {REL_TOL:g}"
    assert max_abs < MAX_ABS_TOL, f"{case}: max abs error {max_abs:.3e} >= {MAX_ABS_TOL:g}"

    if "lse" in extra:
        lse = extra["lse"]
        assert not torch.isnan(lse).any(), f"{case}: lse has unwritten (NaN) rows"
        err = ((lse.double() - lse_ref).abs() / (1 + lse_ref.abs())).max().item()
        _note(variant, lse=err)
        assert err < LSE_REL_TOL, f"{case}: lse error {err:.3e} >= {LSE_REL_TOL:g} (relative to 1 + |lse|)"
    if "m" in extra:
        l, m = extra["l"], extra["m"]  # noqa: E741
        assert not torch.isnan(m).any() and not torch.isnan(l).any(), (
            f"{case}: l or m has unwritten (NaN) rows"
        )
        m_err = ((m.double() - m_ref).abs() / (1 + m_ref.abs())).max().item()
        assert m_err < LSE_REL_TOL, f"{case}: m (row max) error {m_err:.3e} (relative to 1 + |m|)"
        l_rel = ((l.double() - l_ref).abs() / l_ref).max().item()
        _note(variant, m=m_err, l=l_rel)
        assert l_rel < REL_TOL, f"{case}: l (row sum) max relative error {l_rel:.3e}"


# ------------------------------------------------------------ correctness, B = H = 1
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("S", SEQ_LENS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_square(ops, variant, S, D, causal):
    check_case(ops, variant, 1, 1, S, S, D, causal, seed=S * 1000 + D)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("Sq,Sk", SEQ_PAIRS, ids=[f"sq{a}_sk{b}" for a, b in SEQ_PAIRS])
@pytest.mark.parametrize("variant", VARIANTS)
def test_sq_ne_sk(ops, variant, Sq, Sk, D, causal):
    check_case(ops, variant, 1, 1, Sq, Sk, D, causal, seed=Sq * 7 + Sk + D)


# ------------------------------------------------------------- batch and heads
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("Sq,Sk", [(17, 17), (203, 203), (113, 1000)], ids=["s17", "s203", "sq113_sk1000"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_batch_heads(ops, variant, Sq, Sk, D, causal):
    check_case(ops, variant, 3, 5, Sq, Sk, D, causal, seed=Sq + Sk + D + 1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_many_heads_past_grid_limit(ops, variant):
    """B·H = 70000 > 65535: the kernels that put B·H on grid y/z loop over it inside the block."""
    check_case(ops, variant, 2, 35000, 3, 5, 32, True, seed=3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_sharp_softmax(ops, variant, causal):
    """scale = 1 with D = 128 gives scores of std ~11: the running max changes often, so the
    online rescaling (fa1, fa2) and the max subtraction (naive) are exercised hard."""
    check_case(ops, variant, 1, 2, 300, 300, 128, causal, scale=1.0, seed=11)


def test_variant_functions_write_into_out(ops):
    """The registry's fn(q, k, v, causal, scale, out) writes into the given out and returns it."""
    from faprof import variants

    q, k, v = make_inputs(2, 3, 77, 77, 64, seed=5)
    o_ref = reference(q, k, v, True, 0.125)[0]
    for name in VARIANTS:
        out = nan_like(q.shape)
        res = variants.get(name).fn(q, k, v, True, 0.125, out)
        torch.cuda.synchronize()
        assert res is out, f"{name} returned a new tensor instead of the given out"
        rel = ((out.double() - o_ref).norm() / o_ref.norm()).item()
        assert rel < REL_TOL, f"{name} through the registry: relative error {rel:.3e}"
        res2 = variants.get(name).fn(q, k, v, True, 0.125)
        torch.cuda.synchronize()
        assert torch.equal(res2, out), f"{name} with out=None differs from the out= call"


def test_fa2_faster_than_fa1_on_large_shape(ops):
    """The point of FA2's partition: many blocks instead of one per (b, h). At B=1, H=4, S=4096
    fa1 runs 4 blocks; fa2 should win by far more than noise (assert only 2x)."""
    q, k, v = make_inputs(1, 4, 4096, 4096, 64, seed=9)
    scale = 0.125
    times = {}
    for name in ("fa1", "fa2"):
        run_variant(ops, name, q, k, v, False, scale)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            run_variant(ops, name, q, k, v, False, scale)
        end.record()
        torch.cuda.synchronize()
        times[name] = start.elapsed_time(end) / 3
    assert times["fa2"] * 2 < times["fa1"], f"fa2 not clearly faster than fa1: {times}"


# ----------------------------------------------------------------- bad inputs
def _qkv(D=64, dtype=torch.float32, device="cuda"):
    q = torch.randn(1, 2, 33, D, device=device, dtype=dtype)
    return q, torch.randn_like(q), torch.randn_like(q)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rejects_fp16(ops, variant):
    q, k, v = _qkv(dtype=torch.float16)
    with pytest.raises(RuntimeError, match="must be float32, got Half"):
        run_variant(ops, variant, q, k, v, False, 0.125)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rejects_non_contiguous(ops, variant):
    q, k, v = _qkv()
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)  # same shape and values, [B, S, H, D] memory
    assert not q_t.is_contiguous()
    with pytest.raises(RuntimeError, match="q must be contiguous"):
        run_variant(ops, variant, q_t, k, v, False, 0.125)


@pytest.mark.parametrize("variant", ["fa1", "fa2"])
def test_rejects_unsupported_head_dim(ops, variant):
    q, k, v = _qkv(D=48)
    with pytest.raises(RuntimeError, match=rf"D=48 not supported by {variant} \(supported: 32, 64, 128\)"):
        run_variant(ops, variant, q, k, v, False, 0.125)


def test_naive_accepts_any_head_dim(ops):
    """naive's tiled matmuls mask their tails, so it runs D=48 (and is checked like the rest)."""
    check_case(ops, "naive", 1, 2, 45, 70, 48, True, seed=48)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rejects_cpu_tensors(ops, variant):
    q, k, v = _qkv(device="cpu")
    B, H, Sq, D = q.shape
    op = getattr(ops, f"{variant}_fwd")
    args = {
        "naive": (torch.empty(B, H, Sq, D), torch.empty(B, H, Sq, Sq)),
        "fa1": (torch.empty(B, H, Sq, D), torch.empty(B, H, Sq), torch.empty(B, H, Sq)),
        "fa2": (torch.empty(B, H, Sq, D), torch.empty(B, H, Sq)),
    }[variant]
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
        op(q, k, v, *args, False, 0.125)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rejects_mismatched_shapes(ops, variant):
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="must have the same B, H and D"):
        run_variant(ops, variant, q, k[:, :1].contiguous(), v[:, :1].contiguous(), False, 0.125)


def test_rejects_wrong_output_shape(ops):
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match=r"lse must have shape \[1, 2, 33\]"):
        ops.fa2_fwd(q, k, v, torch.empty_like(q), nan_like((1, 2, 34)), False, 0.125)


def test_rejects_misaligned_pointer(ops):
    q, k, v = _qkv()
    base = torch.randn(q.numel() + 1, device="cuda")
    q_off = base[1:].view(q.shape)  # contiguous, 4 bytes past a 16-byte boundary
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        run_variant(ops, "fa2", q_off, k, v, False, 0.125)


# ------------------------------------------------------------------- the faulting kernel
def test_fault_oob_raises_illegal_memory_access(ops):
    """In a child process (the fault kills the CUDA context): the launch succeeds, the next
    synchronize raises 'an illegal memory access was encountered'."""
    code = textwrap.dedent(
        """
        import torch
        from faprof import variants
        variants.load_user_variants(TESTONLY)
        q = torch.randn(8, device="cuda")
        variants.get("_fault_oob").fn(q, q, q, False, 1.0)
        print("LAUNCHED", flush=True)
        torch.cuda.synchronize()
        print("NO FAULT", flush=True)
        """
    )
    code = f"TESTONLY = {str(TESTONLY_VARIANTS)!r}\n" + code  # the test-only kernels' own extension
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ}
    )
    assert "LAUNCHED" in res.stdout, f"launch itself failed:\n{res.stdout}\n{res.stderr}"
    assert "NO FAULT" not in res.stdout
    assert res.returncode != 0
    assert "illegal memory access" in res.stderr, res.stderr[-2000:]
