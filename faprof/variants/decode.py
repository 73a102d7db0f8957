"""The split-KV decode kernel (kernels/decode_splitkv.cu) as the variant `decode_splitkv`.

It runs the attention of inference's decode step: a few queries (Sq, typically 1-8) per sequence
against a long KV cache, contiguous ([B, Hkv, Sk, D]) or paged (a pool of blocks and a block table),
with grouped-query heads, and a causal mask aligned either way (bottom-right is decode's: the last
query sees the whole cache). The design and the split heuristic are in docs/kernels/decode.md.
"""

from __future__ import annotations

from faprof.model.problem import AttentionProblem
from faprof.model.variant import Variant, register
from faprof.variants import build

#: Head dimensions the kernel is instantiated for (kFaprofDecodeHeadDims in faprof_kernels.h).
DECODE_HEAD_DIMS = (64, 128)

#: Problem features it runs (faprof.model.problem.FEATURES): GQA/MQA, a bottom-right causal mask,
#: a paged KV cache (with per-sequence cache lengths). Not windows, soft-cap or packed varlen queries.
DECODE_FEATURES = frozenset({"gqa", "bottom_right", "paged"})

#: Packed query rows (Sq x H / Hkv) one CTA holds; more take several row tiles (grid y), each
#: reading the K/V of its split again, which is correct but no longer decode's one read per byte.
ROWS_PER_CTA = 64

#: CUDA grid limit of the y (KV heads x row tiles) and z (B) dimensions.
GRID_YZ_MAX = 65535


def decode_splitkv_fwd(q, k, v, causal: bool, scale: float, out=None, attn=None, num_splits: int = 0,
                       return_lse: bool = False):
    """torch.ops.faprof.decode_splitkv_fwd. `attn` (faprof.variants.definition.AttnArgs) gives the block
    table and cache lengths of a paged problem and the mask's alignment; without it K/V are dense
    [B, Hkv, Sk, D] and a causal mask is top-left aligned (SDPA's is_causal). num_splits 0: the kernel's
    heuristic. With return_lse also the natural-log LSE [B, H, Sq] fp32."""
    import torch

    build.load()
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    B, H, Sq, _ = q.shape
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    table = attn.block_table if attn is not None else None
    lens = attn.seqlens_k if attn is not None else None
    bottom_right = bool(attn.bottom_right) if attn is not None else False
    torch.ops.faprof.decode_splitkv_fwd(q, k, v, out, lse, table, lens, bool(causal), bottom_right, float(scale),
                                        int(num_splits))
    return (out, lse) if return_lse else out


def _check(problem: AttentionProblem) -> str | None:
    if problem.D not in DECODE_HEAD_DIMS:
        return f"D={problem.D} not supported by decode_splitkv (supported: {', '.join(map(str, DECODE_HEAD_DIMS))})"
    if problem.softmax_scale <= 0:
        return f"decode_splitkv needs scale > 0 (its running max is taken on raw scores), got {problem.softmax_scale:g}"
    row_tiles = -(-problem.Sq * problem.group // ROWS_PER_CTA)
    if problem.B > GRID_YZ_MAX or problem.kv_heads * row_tiles > GRID_YZ_MAX:
        return "decode_splitkv launches a (splits, Hkv x row tiles, B) grid: B and Hkv x ceil(Sq·H/Hkv / 64) must be at most 65535"
    if problem.B * problem.H * problem.Sq > 2**31 - 1:
        return "decode_splitkv indexes query rows with 32-bit ints: B·H·Sq must stay below 2^31"
    return None


def register_variant() -> None:
    register(
        Variant(
            "decode_splitkv",
            "cuda",
            "split-KV decoding (flash-decoding): a KV head's Sq x group query rows in one mma.sync tile, keys split "
            "over CTAs, log-sum-exp combine; contiguous or paged KV cache, GQA, bottom-right causal",
            decode_splitkv_fwd,
            check=_check,
            source="kernels/decode_splitkv.cu",
            tags=("tensor_core", "flash", "mma", "decode", "split_kv"),
            features=DECODE_FEATURES,
            in_all=False,  # a decode kernel: the decode scenarios name it
            dtypes=("fp16", "bf16"),
            directions=("fwd",),
            device="cuda",
            compute="tensor",
            needs_extension=True,
        )
    )
