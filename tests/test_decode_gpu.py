"""GPU correctness of the split-KV decode kernel (decode_splitkv) against attention from the definition.

Method: every case builds its inputs with faprof.correctness.layouts.make_layout_inputs (torch.randn, never
zeros; a paged pool with shuffled blocks and spare ones, per-sequence cache lengths, the last block
partly filled), poisons O and the LSE with NaN, runs torch.ops.faprof.decode_splitkv_fwd, and compares
with layouts.reference_forward (fp32, from the same rounded inputs: query head h reads KV head
h // (H / Hkv), faprof.model.mask's rule, zeros and LSE -inf for a query that sees no key). Error is
‖O − ref‖ / ‖ref‖ and the largest LSE error; a NaN left anywhere fails.

The awkward grid: Sk in {1, 17, 1000, 4097} (tails of the 64-key tile and of every split), Sq in
{1, 3, 4, 8}, groups 1, 4 and 8 (16 to 64 packed rows, one to four row warps, and 128 rows: two row
tiles), no mask and causal aligned bottom-right (Sq > Sk: queries that see nothing) and top-left,
contiguous and paged caches (page sizes 16, 1 and 48: pages smaller than, equal to a fraction of, and
not dividing the 64-key tile), fp16 and bf16, D 64 and 128; then forced split counts from 1 to more
splits than tiles (splits shorter and longer than a tile, empty splits of short sequences), the
registry's variant with `attn=`, and the op's input checks.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from faprof.correctness import layouts  # noqa: E402
from faprof.model.problem import AttentionProblem  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]

#: P and O are rounded to the input type once each on top of fp32 accumulation (as in fa2_mma):
#: fp16 lands near 3e-4 relative, bf16 near 2e-3. The limits leave a 3-4x margin; an indexing,
#: masking or combine bug gives errors of order 1.
REL_TOL = {"fp16": 1e-3, "bf16": 1e-2}
#: The LSE comes from fp32 sums (and an fp32 log-sum-exp over splits): bounded as err <= LSE_TOL * (1 + |ref|).
LSE_TOL = 1e-4

SEQ = ((1, 1), (1, 17), (1, 1000), (1, 4097), (3, 17), (3, 1000), (4, 1), (4, 4097), (8, 3), (8, 1000))
#: (H, Hkv): group 1, 4, 8, and 16 (Sq 8 x 16 = 128 packed rows: two row tiles of 64).
HEADS = ((3, 3), (8, 2), (16, 2), (32, 2))
#: (layout, page size): contiguous, and paged with pages below, inside and across the 64-key tile.
LAYOUTS = (("dense", 0), ("paged", 16), ("paged", 1), ("paged", 48))
MASKS = ("none", "causal_br", "causal_tl")


def problem_for(layout: str, page: int, B: int, H: int, Hkv: int, Sq: int, Sk: int, D: int, dtype: str,
                mask: str) -> AttentionProblem:
    """The problem of one case; a paged batch has sequences of Sk, about Sk/2 and Sk - 17 tokens."""
    extra: dict = {}
    if layout == "paged":
        lens = (Sk, max(1, (Sk + 1) // 2), max(1, Sk - 17))[:B]
        extra = dict(page_size=page, seqlens_k=lens)
    return AttentionProblem(B=B, H=H, Sq=Sq, Sk=Sk, D=D, dtype=dtype, Hkv=Hkv, causal=mask != "none",
                            mask_align="bottom_right" if mask == "causal_br" else "top_left", **extra)


def run(problem: AttentionProblem, seed: int, num_splits: int = 0):
    """(o, lse, ref_o, ref_lse, splits used) with NaN-poisoned outputs."""
    from faprof.variants import build

    build.load()
    gen = torch.Generator().manual_seed(seed)
    q, k, v, _, args = layouts.make_layout_inputs(problem, "cuda", gen)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device="cuda")
    splits = torch.ops.faprof.decode_splitkv_fwd(q, k, v, out, lse, args.block_table, args.seqlens_k,
                                                 problem.causal, args.bottom_right, problem.softmax_scale,
                                                 num_splits)
    torch.cuda.synchronize()
    ref, ref_lse = layouts.reference_forward(problem, q, k, v, args, "cuda", torch.float32, with_lse=True)
    return out, lse, ref, ref_lse, splits


def check(problem: AttentionProblem, out, lse, ref, ref_lse, what: str) -> None:
    assert not torch.isnan(out).any(), f"{what}: NaN left in O (an element was not written)"
    assert not torch.isnan(lse).any(), f"{what}: NaN left in the LSE"
    o, r = out.float(), ref.float()
    rel = ((o - r).norm() / r.norm().clamp_min(1e-6)).item()
    assert rel < REL_TOL[problem.dtype], f"{what}: relative error {rel:.2e}"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty), f"{what}: LSE -inf at the wrong rows"
    if empty.any():  # a query that sees no key: zeros (FlashAttention's convention, the reference's)
        assert (out.float()[empty] == 0).all(), f"{what}: a query with no visible key has a non-zero output"
    if (~empty).any():
        err = ((lse - ref_lse).abs() / (1 + ref_lse.abs()))[~empty].max().item()
        assert err <= LSE_TOL, f"{what}: LSE error {err:.2e}"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}kv{h[1]}")
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x[0] + (str(x[1]) if x[1] else ""))
@pytest.mark.parametrize("mask", MASKS)
def test_awkward_grid(dtype, D, heads, layout, mask):
    H, Hkv = heads
    kind, page = layout
    B = 3 if kind == "paged" else 2
    for i, (Sq, Sk) in enumerate(SEQ):
        if mask == "causal_tl" and Sq > Sk:
            continue  # top-left causal with more queries than keys is not a decode problem
        p = problem_for(kind, page, B, H, Hkv, Sq, Sk, D, dtype, mask)
        out, lse, ref, ref_lse, splits = run(p, seed=1000 + i)
        check(p, out, lse, ref, ref_lse, f"{p.label} {p.mask_name} {dtype} ({splits} splits)")


@pytest.mark.parametrize("layout", (("dense", 0), ("paged", 16), ("paged", 48)),
                         ids=lambda x: x[0] + (str(x[1]) if x[1] else ""))
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16, 63, 100000])
def test_forced_split_counts(layout, splits):
    """Splits of one tile and of many, uneven last splits, more splits than tiles (clamped), and with
    paged cache lengths of about Sk/2, splits past a short sequence's end (empty: LSE -inf partials)."""
    kind, page = layout
    for Sq, Sk, mask in ((1, 4097, "none"), (4, 1000, "causal_br"), (8, 130, "causal_br")):
        p = problem_for(kind, page, 3, 16, 2, Sq, Sk, 128, "bf16", mask)
        out, lse, ref, ref_lse, used = run(p, seed=7 + splits, num_splits=splits)
        tiles = math.ceil(p.Sk / 64) if kind == "dense" else math.ceil(max(p.blocks_per_seq()) * page / 64)
        assert 1 <= used <= min(splits, tiles), (used, splits, tiles)
        check(p, out, lse, ref, ref_lse, f"{p.label} {p.mask_name} splits {splits} (ran {used})")


def test_forced_split_count_above_the_combines_limit_is_capped():
    """More splits asked than the combine holds weights for (kMaxSplits = 256) on a cache of 512 tiles:
    the launcher runs at most 256, and the result is right (the combine's weight array is 256 long)."""
    p = problem_for("dense", 0, 1, 8, 1, 1, 32768, 64, "fp16", "none")
    out, lse, ref, ref_lse, used = run(p, seed=11, num_splits=400)
    assert 200 <= used <= 256, used
    check(p, out, lse, ref, ref_lse, f"{p.label} forced 400 splits (ran {used})")


def test_heuristic_splits_a_long_single_sequence():
    """B=1, 8 KV heads: the shape split-KV exists for; the heuristic must split, and agree with one split."""
    p = problem_for("dense", 0, 1, 64, 8, 1, 32768, 128, "bf16", "none")
    out, lse, ref, ref_lse, used = run(p, seed=3)
    assert used > 1
    check(p, out, lse, ref, ref_lse, f"{p.label} heuristic ({used} splits)")


def test_variant_with_attn_args():
    """The registry's variant, called as the harness calls a variant with features (attn=AttnArgs)."""
    from faprof.variants import get

    v = get("decode_splitkv")
    for kind, page in (("dense", 0), ("paged", 16)):
        p = problem_for(kind, page, 3, 32, 8, 4, 777, 128, "fp16", "causal_br")
        ok, why = v.supports(p)
        assert ok, why
        q, k, vv, _, args = layouts.make_layout_inputs(p, "cuda", torch.Generator().manual_seed(11))
        out = v.fn(q, k, vv, p.causal, p.softmax_scale, out=None, attn=args)
        ref = layouts.reference_forward(p, q, k, vv, args, "cuda", torch.float32)
        rel = ((out.float() - ref).norm() / ref.norm()).item()
        assert rel < REL_TOL["fp16"], (kind, rel)


def test_repeatable_bitwise():
    """No race: the same call twice gives identical bits (the combine is a fixed-order sum)."""
    p = problem_for("paged", 16, 3, 32, 8, 4, 3000, 128, "bf16", "causal_br")
    q, k, v, _, args = layouts.make_layout_inputs(p, "cuda", torch.Generator().manual_seed(5))
    outs = []
    for _ in range(2):
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
        torch.ops.faprof.decode_splitkv_fwd(q, k, v, o, lse, args.block_table, args.seqlens_k, True, True,
                                            p.softmax_scale, 0)
        outs.append((o, lse))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_bad_inputs_raise_clear_errors():
    from faprof.variants import build

    build.load()
    ops = torch.ops.faprof
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 2, 100, 128, device="cuda", dtype=torch.float16)
    out = torch.empty_like(q)
    lse = torch.empty(2, 8, 1, device="cuda")
    table = torch.zeros(2, 7, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="both block_table and seqlens_k"):
        ops.decode_splitkv_fwd(q, k, k, out, lse, table, None, False, False, 0.1, 0)
    k3 = torch.randn(2, 3, 100, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="multiple of the KV heads"):
        ops.decode_splitkv_fwd(q, k3, k3, out, lse, None, None, False, False, 0.1, 0)
    with pytest.raises(RuntimeError, match="D=96 not supported"):
        q96 = torch.randn(2, 8, 1, 96, device="cuda", dtype=torch.float16)
        k96 = torch.randn(2, 2, 100, 96, device="cuda", dtype=torch.float16)
        ops.decode_splitkv_fwd(q96, k96, k96, torch.empty_like(q96), lse, None, None, False, False, 0.1, 0)
    pool = torch.randn(8, 16, 2, 128, device="cuda", dtype=torch.float16)  # [num_blocks, page_size, Hkv, D]
    lens = torch.ones(2, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="block_table must be int32"):
        ops.decode_splitkv_fwd(q, pool, pool, out, lse, table.long(), lens, False, False, 0.1, 0)
    with pytest.raises(RuntimeError, match="scale must be > 0"):
        ops.decode_splitkv_fwd(q, pool, pool, out, lse, table, lens, False, False, -0.1, 0)
