"""GPU correctness of the Hopper backward steps (issue 28): fa3_bwd_a (kernels/fa3_bwd_a.cu, cp.async),
fa3_bwd_b (kernels/fa3_bwd_b.cu, TMA), fa3_bwd_c (kernels/fa3_bwd_c.cu, warp-specialized) and fa3_bwd_d
(kernels/fa3_bwd_d.cu, dQ by the TMA unit's bulk reduce-add), all with fa3_wgmma_e's forward.

Three layers, so that a failure says where it is:

1. test_bwd_wgmma_gemm: one warpgroup wgmma GEMM (tests/kernels/wgmma_test.cu, TEST ONLY) in each operand
   form the backward adds to the forward's: K = 64 (the backward's dV/dK at D=128 and its Sᵀ/dPᵀ at
   D=64) and an MN-major A through the transpose-A bit (dQ = dS·K reads dS from the dSᵀ tile),
   against float64 torch.matmul of the same rounded inputs. A layout error is of order 1 here
   (scripts/gpu/wgmma_diag.py says which descriptor offsets would pass).
2. The awkward-shape grid of tests/test_bwd_kernels_gpu.py (its `check`: the harness's own path,
   fresh randn Q, K, V, dO, the variant's fn under autograd on NaN-poisoned memory, O, dQ, dK, dV
   against float64 autograd on the CPU (fp32 on the GPU for the big case) under the dtype's
   per-element rule and FlashAttention's 3x-PyTorch rule): Sq = 1, tails of every tile size
   (17, 113, 203, 1000) and exact tiles (128), Sq != Sk both ways, causal with Sq > Sk and Sq < Sk,
   B·H > 1, D = 64 and 128, fp16 and bf16, each step. Test ids name the step, so `-k fa3_bwd_b`
   runs one (scripts/gpu/gpu_bwd3_check.sh runs one pytest per step under a timeout: a hang in a
   barrier names its step). Sq = 1000 and 2048 run 8-32 query tiles per block, so the 2- and
   3-stage rings of steps c/d wrap several times.
3. Against faprof's other backward on the same GPU: fa2_mma's deterministic path on the same
   forward output and LSE agrees within a few roundings; dK and dV repeat bit for bit (each block
   sums its query tiles in a fixed order: a race would make them drift) while dQ (fp32 atomics)
   agrees within a rounding; the steps agree with each other; bad inputs raise clear errors.

On a GPU that is not compute capability 9.0 these skip, and test_refuses_other_archs checks the
op's refusal instead (the variants are `unsupported` there).
"""

from __future__ import annotations

import math

import pytest
from test_bwd_kernels_gpu import SEQ_PAIRS, _print_worst, check  # noqa: F401 (_print_worst: autouse fixture)

torch = pytest.importorskip("torch")


def _sm90() -> bool:
    return torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) == (9, 0)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]
sm90_only = pytest.mark.skipif(not _sm90(), reason="wgmma needs a compute capability 9.0 GPU (H100/H200)")

STEPS = ("fa3_bwd_a", "fa3_bwd_b", "fa3_bwd_c", "fa3_bwd_d")
DTYPES = ("fp16", "bf16")
CASES = [(s, d) for s in STEPS for d in DTYPES]
#: Tails of every tile size (the backward's query tiles are 64 or 128 rows, its key tiles 128) and
#: one exact tile.
SEQ_LENS = (1, 17, 113, 128, 203, 1000)
#: fp32 accumulation of K <= 128 products of exactly representable inputs: ~1e-6; a layout bug is of order 1.
GEMM_TOL = 1e-3
#: Unit roundoff of the input dtype. Two backward paths round P, dS and the gradients to it in
#: different places (fa2_mma keeps P in fp32 for dS, the fa3 steps use the rounded P dV uses): they
#: differ by about one unit roundoff in the norm (0.9u for both dtypes in a CPU emulation of the two
#: roundings at B=2 H=3 Sq=1000 Sk=517), a layout bug by order 1.
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
#: Bound on the norm-wise relative difference of two paths: a few roundings.
AGREE_UNITS = 4


# ------------------------------------------------------------------------- wgmma building blocks
#: The forms the backward adds to the forward's (tests/test_fa3_gpu.py::test_wgmma_gemm covers K = 16
#: and 128 of SS and RS): (A form, B MN-major, N, K). K = 64: the backward's dV/dK at D=128 (RS, B
#: MN-major, N = 128) and its Sᵀ/dPᵀ at D=64 (SS, B K-major, N = 128), with their neighbours; SS-At:
#: an MN-major A through the transpose-A bit, dQ's form (B MN-major, N = 64, K = 128), with its neighbours.
GEMM_CASES = [(form, mn, N, 64) for form in ("SS", "RS") for mn in (False, True) for N in (64, 128)] + [
    ("SS-At", mn, N, K) for mn in (False, True) for N in (64, 128) for K in (16, 64, 128)]


@sm90_only
@pytest.mark.parametrize("form,mn_major,N,K", GEMM_CASES,
                         ids=[f"{f}-{'Bmn' if m else 'Bk'}-N{n}-K{k}" for f, m, n, k in GEMM_CASES])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_bwd_wgmma_gemm(testonly_ops, dtype, form, mn_major, N, K):
    a_mn = form == "SS-At"
    a = torch.randn(K, 64, device="cuda", dtype=dtype) if a_mn else torch.randn(64, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype) if mn_major else torch.randn(N, K, device="cuda", dtype=dtype)
    c = torch.full((64, N), float("nan"), device="cuda")
    testonly_ops.wgmma_gemm_test(a, b, c, mn_major, form == "RS", -1, -1, a_mn, -1, -1)
    torch.cuda.synchronize()
    ref = (a.double().t() if a_mn else a.double()) @ (b.double() if mn_major else b.double().t())
    err = float(((c.double() - ref).abs() / (1 + ref.abs())).max())
    assert not torch.isnan(c).any(), "accumulator elements left unwritten"
    assert err <= GEMM_TOL, f"max error {err:.2e} (run scripts/gpu/wgmma_diag.py for where)"


# ------------------------------------------------------------------------- the awkward-shape grid
@sm90_only
@pytest.mark.parametrize("S", SEQ_LENS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("variant,dtype", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_square(variant, dtype, D, causal, S):
    check(variant, dtype, 1, 1, S, S, D, causal)


@sm90_only
@pytest.mark.parametrize("Sq,Sk", SEQ_PAIRS, ids=[f"{a}x{b}" for a, b in SEQ_PAIRS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("variant,dtype", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_sq_ne_sk(variant, dtype, D, causal, Sq, Sk):
    check(variant, dtype, 1, 5, Sq, Sk, D, causal)


@sm90_only
@pytest.mark.parametrize("Sq,Sk,D", [(113, 113, 64), (203, 128, 128), (128, 203, 64), (1000, 1000, 128)],
                         ids=lambda x: str(x))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant,dtype", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_batch_and_heads(variant, dtype, causal, Sq, Sk, D):
    check(variant, dtype, 3, 5, Sq, Sk, D, causal)


@sm90_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", STEPS)
def test_fwd_bwd_direction(variant, causal):
    check(variant, "fp16", 2, 3, 300, 260, 64, causal, "fwd_bwd")


@sm90_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", STEPS)
def test_big_problem_against_fp32_gpu_reference(variant, causal):
    # Over reference.CPU_REFERENCE_MAX_FLOPS: checked against fp32 on the GPU, one head at a time.
    check(variant, "bf16", 2, 4, 2048, 2048, 128, causal)


# ------------------------------------------------------------------------- against fa2_mma, repeats
def _forward(ops, q, k, v, causal, scale):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    ops.fa3_wgmma_e_fwd(q, k, v, out, lse, causal, scale)
    return out, lse


@sm90_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=["fp16", "bf16"])
@pytest.mark.parametrize("step", STEPS)
def test_agrees_with_fa2_mma_and_repeats(ops, step, dtype, D, causal):
    """Same out/lse/dout into fa2_mma's deterministic backward and the fa3 step: every gradient within
    a few roundings; the fa3 step again: dK, dV bit-identical, dQ within roundings (atomics)."""
    from faprof.variants import backward as kernel_bwd
    from faprof.variants import fa3_backward as kernel_fa3_bwd

    q, k, v, dout = (torch.randn(2, 3, n, D, device="cuda", dtype=dtype) for n in (1000, 517, 517, 1000))
    scale = 1.0 / math.sqrt(D)
    out, lse = _forward(ops, q, k, v, causal, scale)
    ref = kernel_bwd.backward("fa2_mma", q, k, v, out, dout, lse, causal, scale, deterministic=True)
    got = kernel_fa3_bwd.backward(step, q, k, v, out, dout, lse, causal, scale)
    u = UNIT_ROUNDOFF[dtype]
    for name, a, r in zip(("dq", "dk", "dv"), got, ref, strict=True):
        assert torch.isfinite(a).all(), name
        rel = float((a.double() - r.double()).norm() / r.double().norm())
        assert rel < AGREE_UNITS * u, (name, rel)
    again = kernel_fa3_bwd.backward(step, q, k, v, out, dout, lse, causal, scale)
    assert torch.equal(again[1], got[1]) and torch.equal(again[2], got[2]), "dK/dV differ between two calls: a race?"
    rel = float((again[0].double() - got[0].double()).norm() / got[0].double().norm())
    assert rel < u, rel  # the same fp32 terms summed in another order, then rounded


#: Pairs of steps with the same tile math (only how tiles arrive, how dQ is added and in which order
#: differ): every gradient within one unit roundoff of the other's. Steps c/d at D=128 form dSᵀ from
#: the fp32 Pᵀ where a/b use the rounded Pᵀ (one rounding of a factor of dSᵀ): within AGREE_UNITS.
SAME_MATH = [("fa3_bwd_a", "fa3_bwd_b"), ("fa3_bwd_c", "fa3_bwd_d"), ("fa3_bwd_a", "fa3_bwd_c")]


@sm90_only
@pytest.mark.parametrize("first,second", SAME_MATH, ids=[f"{a}-{b}" for a, b in SAME_MATH])
def test_steps_agree(ops, first, second):
    """Steps on the same bytes: a/b (cp.async or TMA), c/d (dQ by red.global.add or by the TMA unit)
    agree within one unit roundoff (dQ's atomics add in any order); c against a too at D=64, where c
    runs a/b's order of GEMMs, and within AGREE_UNITS at D=128 (fp32 Pᵀ in dSᵀ)."""
    from faprof.variants import fa3_backward as kernel_fa3_bwd

    u = UNIT_ROUNDOFF[torch.bfloat16]
    for D in (64, 128):
        q, k, v, dout = (torch.randn(2, 3, n, D, device="cuda", dtype=torch.bfloat16) for n in (777, 300, 300, 777))
        out, lse = _forward(ops, q, k, v, True, 0.1)
        a = kernel_fa3_bwd.backward(first, q, k, v, out, dout, lse, True, 0.1)
        b = kernel_fa3_bwd.backward(second, q, k, v, out, dout, lse, True, 0.1)
        bound = AGREE_UNITS * u if (first, second, D) == ("fa3_bwd_a", "fa3_bwd_c", 128) else u
        for name, x, y in zip(("dq", "dk", "dv"), a, b, strict=True):
            rel = float((x.double() - y.double()).norm() / x.double().norm())
            assert rel < bound, (D, name, rel)


@sm90_only
@pytest.mark.parametrize("step", STEPS)
def test_bad_inputs_raise_clear_errors(ops, step):
    from faprof.variants import fa3_backward as kernel_fa3_bwd

    q = torch.randn(1, 2, 64, 256, device="cuda", dtype=torch.float16)
    lse = torch.zeros(1, 2, 64, device="cuda")
    with pytest.raises(RuntimeError, match=f"D=256 not supported by {step} backward"):
        kernel_fa3_bwd.backward(step, q, q, q, q, q, lse, False, 0.0625)
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="lse must have shape"):
        kernel_fa3_bwd.backward(step, q, q, q, q, q, lse[:, :1], False, 0.125)
    with pytest.raises(RuntimeError, match="must be float16 or bfloat16"):
        kernel_fa3_bwd.backward(step, *(t.float() for t in (q, q, q, q, q)), lse, False, 0.125)
    ws = torch.empty(1, 2, 64, device="cuda")  # lse2 rows not padded to FA3_BWD_SEQ_PAD
    with pytest.raises(RuntimeError, match="lse2 must have shape"):
        getattr(ops, step)(q, q, q, q, q, lse, torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), ws,
                           ws, torch.empty(1, 2, 64, 64, device="cuda"), False, 0.125)


@pytest.mark.skipif(_sm90(), reason="checks the refusal on GPUs other than compute capability 9.0")
@pytest.mark.parametrize("step", STEPS)
def test_refuses_other_archs(ops, step):
    from faprof import variants
    from faprof.model.problem import AttentionProblem
    from faprof.variants import fa3_backward as kernel_fa3_bwd
    from faprof.variants.kernels import FA3_ARCH_REASON

    q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
    lse = torch.zeros(1, 2, 16, device="cuda")
    with pytest.raises(RuntimeError, match="needs sm_90a"):
        kernel_fa3_bwd.backward(step, q, q, q, q, q, lse, False, 0.125)
    p = AttentionProblem(1, 2, 16, 16, 64, "fp16", direction="bwd")
    assert variants.get(step).supports(p) == (False, FA3_ARCH_REASON)
