"""FlashAttention-4 (the CuTe DSL package flash-attn-4, module flash_attn.cute) as the baseline `fa4`.

Dense problems through `flash_attn_func` and packed (varlen) batches through
`flash_attn_varlen_func`, forward and backward (its autograd functions, FlashAttnFunc and
FlashAttnVarlenFunc, carry the backward). faprof's dense q/k/v [B, H, S, D] are handed to it as
strided [B, S, H, D] views (flash_attn.cute takes any layout whose strides are 16-byte aligned with a
contiguous last dimension, `maybe_contiguous`), and its output comes back the same way, so nothing is
copied; faprof's packed [tokens, H, D] with int32 cu_seqlens is its varlen layout as it is.

Its masks are FlashAttention's: causal and the window (left, right) aligned to the bottom-right
corner, either side None for unbounded; a soft-cap is `softcap`. Its kernels are compiled by the CuTe
DSL on the first call of a configuration (no nvcc), which the harness never times. On Hopper it runs
the SM90 forward and backward kernels; its forward also has SM80 and SM100/SM120 kernels and its
backward SM90 and later (flash_attn/cute/interface.py: `_flash_attn_fwd`, `_flash_attn_bwd`).
"""

from __future__ import annotations

from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.model.variant import Variant
from faprof.variants.definition import AttnArgs
from faprof.variants.libraries import FA4, compute_capability, mask_alignment_reason

#: Compute capability majors faprof runs FA4 on: Hopper (9) and Blackwell (10, 11), where it has both a
#: forward and a backward kernel (its SM8x forward takes no soft-cap, and SM12x is not a target here).
ARCH_MAJORS = (9, 10, 11)

#: Head dims its SM90 kernels take: 8 to 256, a multiple of 8 for 16-bit types (_validate_head_dims).
HEAD_DIM_RANGE = (8, 256)
HEAD_DIM_MULTIPLE = 8

#: SM100/SM110 take 8 to 128, or 256 (and DeepSeek's 192/128, which faprof's equal head dims never are).
BLACKWELL_HEAD_DIMS = "8 to 128 or 256"

FEATURES = frozenset({"gqa", "bottom_right", "window", "softcap", "varlen"})


def _check(problem: AttentionProblem) -> str | None:
    """The library's own limits first (they hold on every machine), then whether it is installed, then the GPU."""
    lo, hi = HEAD_DIM_RANGE
    if not lo <= problem.D <= hi or problem.D % HEAD_DIM_MULTIPLE:
        return (f"FlashAttention-4 takes head dims from {lo} to {hi} in multiples of {HEAD_DIM_MULTIPLE} "
                f"(fp16/bf16), got D={problem.D}")
    reason = mask_alignment_reason(problem, "FlashAttention-4")
    if reason:
        return reason
    missing = FA4.missing()
    if missing:
        return missing
    cc = compute_capability()
    if cc is not None:
        if cc[0] not in ARCH_MAJORS:
            return (f"faprof runs FlashAttention-4 on Hopper and Blackwell (compute capability "
                    f"{', '.join(f'{m}.x' for m in ARCH_MAJORS)}), this GPU is {cc[0]}.{cc[1]}")
        if cc[0] in (10, 11) and not (problem.D <= 128 or problem.D == 256):
            return f"FlashAttention-4 on SM100/SM110 takes head dims {BLACKWELL_HEAD_DIMS}, got D={problem.D}"
    return None


def _window(problem: AttentionProblem) -> tuple[int | None, int | None]:
    """FlashAttention's window_size: (left, right), None where faprof's side is unbounded (-1)."""
    if problem.window is None:
        return None, None
    left, right = problem.window
    return (left if left >= 0 else None, right if right >= 0 else None)


def fa4_fn(q, k, v, causal: bool, scale: float, out=None, attn: AttnArgs | None = None):
    """fa4's call (the variant signature): dense q [B, H, Sq, D], k/v [B, Hkv, Sk, D]; or packed q [total_q, H, D],
    k/v [total_k, Hkv, D] with attn's cu_seqlens. Differentiable (FA4's autograd functions)."""
    with FA4.imported():
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    problem = attn.problem if attn is not None else None
    kw: dict[str, Any] = {"softmax_scale": scale, "causal": causal}
    if problem is not None:
        kw.update(causal=problem.causal, window_size=_window(problem), softcap=problem.softcap)
    if problem is not None and problem.layout == "varlen":
        res = flash_attn_varlen_func(q, k, v, cu_seqlens_q=attn.cu_seqlens_q, cu_seqlens_k=attn.cu_seqlens_k,  # type: ignore[union-attr]
                                     max_seqlen_q=problem.Sq, max_seqlen_k=problem.Sk, **kw)
        return res[0] if isinstance(res, tuple) else res
    res = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kw)
    o = res[0] if isinstance(res, tuple) else res
    return o.transpose(1, 2)


def fa4_path(problem: AttentionProblem, q, k, v, attn: AttnArgs | None) -> str:
    what = "flash_attn_varlen_func" if problem.layout == "varlen" else "flash_attn_func ([B, S, H, D] strided views)"
    cc = compute_capability()
    arch = f", SM{cc[0]}{cc[1]} kernels" if cc else ""
    return (f"fused: FlashAttention-4 {FA4.version() or '?'} {what}{arch}; CuTe DSL kernels compiled on the "
            f"first call (untimed)")


def variants() -> list[Variant]:
    """The FA4 variant (registered whether or not the package is installed)."""
    return [Variant(
        "fa4", "torch",
        "FlashAttention-4 (CuTe DSL, flash_attn.cute): dense and packed varlen forward and backward on Hopper "
        "and Blackwell",
        fa4_fn, dtypes=("fp16", "bf16"), directions=("fwd", "bwd", "fwd_bwd"), device="cuda", check=_check,
        features=FEATURES, path_of=fa4_path, in_all=False, tags=("library", "fa4", "flash"),
        source=f"FlashAttention-4 ({FA4.dist}=={FA4.pin}, optional: {FA4.install})",
    )]
