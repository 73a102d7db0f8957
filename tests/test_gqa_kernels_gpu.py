"""GPU correctness of fa2_mma's and fa3_wgmma_e's forward on the problems beyond 2022's (issue 36).

GQA/MQA, causal masks aligned to either corner, sliding windows, a soft-cap and packed varlen
batches, through the ops `fa2_mma_fwd_ex` and `fa3_wgmma_e_fwd_ex`, on the awkward grid: tails
(Sq, Sk not multiples of the 128/64/128 tiles), Sq != Sk both ways under both alignments, windows at
the edges (left 0, right 0, larger than the sequence, cutting tiles), groups 1, 4, 8 and MQA, varlen
with lengths 1 and 4097 and mixes, fp16 and bf16, D 64 and 128.

Method: inputs from faprof.correctness.layouts.make_layout_inputs (the problem's layout and its
cu_seqlens), outputs and LSE poisoned with NaN with a NaN guard tail (an unwritten element or a
store past the end shows up), the reference from faprof.correctness.layouts.reference_forward in
float64 on the GPU. A failure names the case and the worst element: its sequence, head, query row
and column, the kernel's and the reference's values, and whether the row sees any key; rows that see
no key must be exactly zero with LSE -inf.

`-k fa2_mma` or `-k fa3_wgmma_e` runs one kernel; scripts/gpu/gpu_gqa_bench.sh runs these tests before
its benchmark.
"""

from __future__ import annotations

import pytest

from faprof.correctness.layouts import make_layout_inputs, reference_forward
from faprof.model.problem import AttentionProblem

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]


def _sm90() -> bool:
    return torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) == (9, 0)


sm90_only = pytest.mark.skipif(not _sm90(), reason="wgmma needs a compute capability 9.0 GPU (H100/H200)")

#: Relative error ‖O − ref‖ / ‖ref‖: P and O are rounded to the input type once each on top of fp32
#: accumulation (fp16 ~3e-4, bf16 ~2.2e-3 measured for fa2_mma on the H100, tests/test_tc_kernels_gpu.py);
#: 3-4x margin. A wrong KV head, mask bound or sequence offset gives errors of order 1.
REL_TOL = {"fp16": 1e-3, "bf16": 1e-2}
#: Largest |O − ref| of one element, against 1 + |ref|: one misplaced row or column of keys moves
#: elements by O(0.1-1), rounding by ~1e-2 at most (bf16).
ELEM_TOL = {"fp16": 2e-2, "bf16": 6e-2}
#: LSE from fp32 sums of exp2 terms: ~1e-6 relative; bounded as err <= LSE_TOL * (1 + |ref|).
LSE_TOL = 1e-4
#: NaN-filled elements after O and after the LSE: a store past the end shows up there.
GUARD = 4096

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
KERNELS = ("fa2_mma", "fa3_wgmma_e")

#: (Sq, Sk): tails of every tile, Sq != Sk both ways, one query, one key.
SHAPES = ((113, 203), (203, 113), (1, 1000), (1000, 1), (128, 128), (257, 300))

#: (causal, align, window): causal under both alignments, windows at the edges.
MASKS = (
    (True, "bottom_right", None),
    (True, "top_left", (64, 0)),          # sliding window cutting tiles
    (True, "bottom_right", (0, 0)),       # left 0: the diagonal key only
    (False, "top_left", (17, 33)),        # two-sided, not causal
    (False, "bottom_right", (0, 0)),      # right 0 and left 0, not causal
    (False, "bottom_right", (-1, 3)),     # right only
    (True, "bottom_right", (5000, 0)),    # window larger than any sequence here
    (False, "top_left", (150, -1)),       # left only, window wider than a tile
)


def _mask_id(m) -> str:
    causal, align, window = m
    return f"{'causal' if causal else 'full'}-{align}-w{window[0]},{window[1]}" if window else \
        f"{'causal' if causal else 'full'}-{align}"


def _problem(B, H, Hkv, Sq, Sk, D, dtype, causal, align="top_left", window=None, softcap=0.0,
             seqlens_q=None, seqlens_k=None) -> AttentionProblem:
    return AttentionProblem(B, H, Sq, Sk, D, dtype, causal, Hkv=Hkv, mask_align=align, window=window,
                            softcap=softcap, seqlens_q=seqlens_q, seqlens_k=seqlens_k)


def _locate(problem: AttentionProblem, flat: int, shape: tuple[int, ...]) -> str:
    """'seq b, head h, row i, col d' for a flat index into O (or the LSE when shape has no D)."""
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    idx.reverse()
    if problem.layout == "varlen":
        starts, t = [0], 0
        for n in problem.q_lens():
            t += n
            starts.append(t)
        if len(shape) == 3:     # O [total_q, H, D]
            tok, h, d = idx
        else:                   # LSE [H, total_q]
            (h, tok), d = idx, None
        b = max(i for i in range(problem.B) if starts[i] <= tok)
        row = tok - starts[b]
    elif len(shape) == 4:
        b, h, row, d = idx
    else:
        (b, h, row), d = idx, None
    return f"seq {b}, head {h} (KV head {h // problem.group}), row {row}" + (f", col {d}" if d is not None else "")


def run_and_check(ops, kernel: str, problem: AttentionProblem, seed: int = 0) -> None:
    """Run `kernel`'s *_fwd_ex op on `problem` with poisoned outputs and compare with the definition."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, _, args = make_layout_inputs(problem, "cuda", gen)
    varlen = problem.layout == "varlen"
    lse_shape = (problem.H, problem.total_q) if varlen else (problem.B, problem.H, problem.Sq)
    n_o, n_l = q.numel(), problem.H * problem.total_q if varlen else problem.B * problem.H * problem.Sq
    o_buf = torch.full((n_o + GUARD,), float("nan"), device="cuda", dtype=q.dtype)
    l_buf = torch.full((n_l + GUARD,), float("nan"), device="cuda", dtype=torch.float32)
    o, lse = o_buf[:n_o].view(q.shape), l_buf[:n_l].view(lse_shape)
    left, right = args.window
    getattr(ops, f"{kernel}_fwd_ex")(q, k, v, o, lse, problem.causal, problem.softmax_scale, problem.kv_heads,
                                     args.bottom_right, left, right, problem.softcap, args.cu_seqlens_q,
                                     args.cu_seqlens_k, problem.Sq, problem.Sk)
    torch.cuda.synchronize()
    where = f"{kernel} {problem.shape_id}" + (f" seqlens_q={problem.seqlens_q} seqlens_k={problem.seqlens_k}"
                                               if varlen else "")
    _compare(where, problem, o, lse, o_buf[n_o:], l_buf[n_l:], q, k, v, args)


def _compare(where, problem, o, lse, o_guard, l_guard, q, k, v, args) -> None:
    dtype = problem.dtype
    nan_o = torch.isnan(o)
    if nan_o.any():
        first = int(nan_o.flatten().nonzero()[0])
        raise AssertionError(f"{where}: {int(nan_o.sum())} output elements left unwritten (NaN), first at "
                             f"{_locate(problem, first, tuple(o.shape))}")
    nan_l = torch.isnan(lse)
    if nan_l.any():
        first = int(nan_l.flatten().nonzero()[0])
        raise AssertionError(f"{where}: {int(nan_l.sum())} LSE rows left unwritten (NaN), first at "
                             f"{_locate(problem, first, tuple(lse.shape))}")
    assert torch.isnan(o_guard).all() and torch.isnan(l_guard).all(), f"{where}: stores past the end of O or LSE"

    ref, ref_lse = reference_forward(problem, q, k, v, args, "cuda", torch.float64, with_lse=True)
    od = o.double()
    empty = torch.isinf(ref_lse) & (ref_lse < 0)                  # rows that see no key
    if empty.any():
        bad_lse = empty & ~(torch.isinf(lse) & (lse < 0))
        if bad_lse.any():
            first = int(bad_lse.flatten().nonzero()[0])
            raise AssertionError(f"{where}: {int(bad_lse.sum())} rows that see no key have a finite LSE, first at "
                                 f"{_locate(problem, first, tuple(lse.shape))} = {float(lse.flatten()[first]):.4g}")
        rows_o = od.transpose(0, 1) if problem.layout == "varlen" else od   # [H, total_q, D] or [B, H, Sq, D]
        nonzero = empty & (rows_o != 0).any(dim=-1)
        if nonzero.any():
            first = int(nonzero.flatten().nonzero()[0])
            raise AssertionError(f"{where}: {int(nonzero.sum())} rows that see no key are not zero, first at "
                                 f"{_locate(problem, first, tuple(lse.shape))}")
    err = (od - ref).abs() / (1 + ref.abs())
    flat = int(err.flatten().argmax())
    worst = float(err.flatten()[flat])
    ref_norm = float(ref.norm())
    rel = float((od - ref).norm()) / ref_norm if ref_norm > 0 else float((od - ref).norm())
    detail = (f"worst element at {_locate(problem, flat, tuple(o.shape))}: kernel {float(od.flatten()[flat]):.5g}, "
              f"reference {float(ref.flatten()[flat]):.5g}")
    assert worst <= ELEM_TOL[dtype], f"{where}: element error {worst:.3e} > {ELEM_TOL[dtype]:.0e}; {detail}"
    assert rel <= REL_TOL[dtype], f"{where}: relative error {rel:.3e} > {REL_TOL[dtype]:.0e}; {detail}"
    finite = ~empty
    if finite.any():
        lerr = ((lse.double() - ref_lse).abs() / (1 + ref_lse.abs())).masked_fill(~finite, 0)
        lflat = int(lerr.flatten().argmax())
        lworst = float(lerr.flatten()[lflat])
        assert lworst <= LSE_TOL, (
            f"{where}: LSE error {lworst:.3e} > {LSE_TOL:.0e} at {_locate(problem, lflat, tuple(lse.shape))}: "
            f"kernel {float(lse.flatten()[lflat]):.6g}, reference {float(ref_lse.flatten()[lflat]):.6g}")


def _kernel_param(kernel: str):
    return pytest.param(kernel, marks=sm90_only) if kernel == "fa3_wgmma_e" else kernel


KERNEL_PARAMS = [_kernel_param(k) for k in KERNELS]


# ---------------------------------------------------------------------------------------- masks
@pytest.mark.parametrize("Sq,Sk", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
@pytest.mark.parametrize("mask", MASKS, ids=[_mask_id(m) for m in MASKS])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernel", KERNEL_PARAMS)
def test_masks(ops, kernel, dtype, D, mask, Sq, Sk):
    causal, align, window = mask
    run_and_check(ops, kernel, _problem(2, 4, 2, Sq, Sk, D, dtype, causal, align, window))


# ----------------------------------------------------------------------------------- GQA groups
@pytest.mark.parametrize("H,Hkv", [(8, 8), (8, 2), (8, 1), (32, 4)], ids=["g1", "g4", "mqa8", "g8"])
@pytest.mark.parametrize("causal,align", [(True, "bottom_right"), (True, "top_left"), (False, "top_left")],
                         ids=["causal_br", "causal", "full"])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernel", KERNEL_PARAMS)
def test_gqa_groups(ops, kernel, dtype, D, causal, align, H, Hkv):
    # H == Hkv: group 1 through the *_ex op, i.e. the GEN instantiation with equal heads.
    run_and_check(ops, kernel, _problem(2, H, Hkv, 203, 300, D, dtype, causal, align))


@pytest.mark.parametrize("kernel", KERNEL_PARAMS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gqa_long_causal(ops, kernel, dtype):
    """The benchmark's shape class (Hq 32, Hkv 8, D 128, causal), shortened: every tile interior."""
    run_and_check(ops, kernel, _problem(1, 32, 8, 1100, 1100, 128, dtype, True))


# --------------------------------------------------------------------------------------- varlen
#: (seqlens_q, seqlens_k): one token, 4097 (a tile and one row), mixes, q shorter and longer than k.
VARLEN = (
    ((1,), (1,)),
    ((4097,), (4097,)),
    ((1, 4097, 17, 128), (1, 4097, 17, 128)),
    ((5, 300, 1, 129), (700, 300, 64, 1)),
    ((700, 1, 64), (5, 300, 1)),
)


@pytest.mark.parametrize("lens", VARLEN, ids=[f"q{'-'.join(map(str, a))}_k{'-'.join(map(str, b))}" for a, b in VARLEN])
@pytest.mark.parametrize("mask", [(False, "top_left", None), (True, "bottom_right", None), (True, "top_left", None),
                                  (True, "bottom_right", (32, 0))], ids=["full", "causal_br", "causal", "swa_br"])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernel", KERNEL_PARAMS)
def test_varlen(ops, kernel, dtype, D, mask, lens):
    causal, align, window = mask
    sq, sk = lens
    run_and_check(ops, kernel, _problem(len(sq), 8, 2, max(sq), max(sk), D, dtype, causal, align, window,
                                           seqlens_q=sq, seqlens_k=sk))


# -------------------------------------------------------------------------------------- soft-cap
@pytest.mark.parametrize("softcap", (30.0, 0.5), ids=["cap30", "cap0.5_saturated"])
@pytest.mark.parametrize("causal", (False, True), ids=["full", "causal"])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_softcap_fa2_mma(ops, dtype, D, causal, softcap):
    run_and_check(ops, "fa2_mma", _problem(2, 8, 2, 203, 300, D, dtype, causal, softcap=softcap))


# ------------------------------------------------------------------------- through the registry
@pytest.mark.parametrize("kernel", KERNEL_PARAMS)
def test_variant_fn_takes_attn(kernel):
    """The variant's fn with attn= runs the *_ex op (GQA + window here), as the harness calls it."""
    import faprof.variants  # noqa: F401  (registers the variants)
    from faprof.model.variant import get

    problem = _problem(2, 8, 2, 203, 300, 128, "bf16", True, "bottom_right", (40, 0))
    ok, why = get(kernel).supports(problem)
    assert ok, why
    q, k, v, _, args = make_layout_inputs(problem, "cuda", torch.Generator().manual_seed(1))
    o, lse = get(kernel).fn(q, k, v, problem.causal, problem.softmax_scale, return_lse=True, attn=args)
    torch.cuda.synchronize()
    _compare(f"{kernel} via the registry", problem, o, lse, torch.full((1,), float("nan")),
             torch.full((1,), float("nan")), q, k, v, args)
