"""faprof's own CUDA kernels (kernels/*.cu) as registry variants.

Importing this module only registers the variants; the extension is built the first time one of
them runs (`faprof.build.load()`, cheap after the first call in a process). Each fn follows the
registry's signature fn(q, k, v, causal, scale, out=None) -> out, allocates the workspaces its op
needs (scores, l and m, lse), writes into `out` when given (so the harness can poison it) and
returns it.

One block per variant: to add one, write its .cu file and launcher, its op in binding.cpp, and a
Variant below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.model.variant import Variant, get, register
from faprof.variants import backward as kernel_bwd
from faprof.variants import build
from faprof.variants import decode as kernel_decode
from faprof.variants import fa3_backward as kernel_fa3_bwd

#: Head dimensions the fa1 and fa2 CUDA-core kernels are instantiated for (kernels/fa1.cu,
#: kernels/fa2.cu: kFaprofFa1HeadDims / kFaprofFa2HeadDims in faprof_kernels.h).
FA1_HEAD_DIMS = (32, 64, 128)
FA2_HEAD_DIMS = (32, 64, 128)

#: Head dimensions of the tensor-core kernels fa2_wmma and fa2_mma (kFaprofTcHeadDims in
#: faprof_kernels.h): each has a tile config for these three.
TC_HEAD_DIMS = (64, 128, 256)

#: The naive kernel materializes fp32 scores B·H·Sq·Sk·4 bytes; past 8 GiB that matrix alone
#: outgrows most GPUs (and the point of the comparison is made long before).
NAIVE_MAX_SCORE_BYTES = 8 * 2**30

#: The kernels index rows with 32-bit ints; B·H, Sq, Sk and Sq·D must stay below this.
INT32_MAX = 2**31 - 1


def _ops():
    """torch.ops.faprof, building/loading the extension first."""
    import torch

    build.load()
    return torch.ops.faprof


def _alloc_out(q, out):
    import torch

    return torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out


def _int32_check(problem: AttentionProblem) -> str | None:
    if (
        problem.B * problem.H > INT32_MAX
        or problem.Sq * problem.D > INT32_MAX
        or problem.Sk * problem.D > INT32_MAX
    ):
        return "the CUDA-core kernels index with 32-bit ints: B·H and S·D must stay below 2^31"
    return None


def _head_dim_check(variant: str, dims: tuple[int, ...]):
    def check(problem: AttentionProblem) -> str | None:
        if problem.D not in dims:
            return f"D={problem.D} not supported by {variant} (supported: {', '.join(map(str, dims))})"
        return _int32_check(problem)

    return check


def naive_score_bytes(problem: AttentionProblem) -> int:
    """Bytes of the naive kernel's fp32 score workspace [B, H, Sq, Sk]."""
    return problem.B * problem.H * problem.Sq * problem.Sk * 4


def _naive_check(problem: AttentionProblem) -> str | None:
    need = naive_score_bytes(problem)
    if need > NAIVE_MAX_SCORE_BYTES:
        return (
            f"naive materializes the fp32 score matrix B·H·Sq·Sk: {need / 2**30:.1f} GiB, over the "
            f"{NAIVE_MAX_SCORE_BYTES / 2**30:.0f} GiB faprof allows it"
        )
    return _int32_check(problem)


# ------------------------------------------------------------------------------ naive
def naive_fwd(q, k, v, causal: bool, scale: float, out=None):
    """Three kernels: S = scale·QKᵀ to global memory, row softmax in place, O = P·V."""
    import torch

    ops = _ops()
    out = _alloc_out(q, out)
    B, H, Sq, _ = q.shape
    scores = torch.empty((B, H, Sq, k.shape[2]), dtype=torch.float32, device=q.device)
    ops.naive_fwd(q, k, v, out, scores, bool(causal), float(scale))
    return out


# -------------------------------------------------------------------------------- fa1
def fa1_fwd(q, k, v, causal: bool, scale: float, out=None, return_lm: bool = False):
    """FlashAttention-1 loop order; with return_lm, also the global l and m ([B, H, Sq] fp32)."""
    import torch

    ops = _ops()
    out = _alloc_out(q, out)
    B, H, Sq, _ = q.shape
    l = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)  # noqa: E741 (the paper's name)
    m = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    ops.fa1_fwd(q, k, v, out, l, m, bool(causal), float(scale))
    return (out, l, m) if return_lm else out


# -------------------------------------------------------------------------------- fa2
def fa2_fwd(q, k, v, causal: bool, scale: float, out=None, return_lse: bool = False):
    """FlashAttention-2 partition; with return_lse, also lse = m + log(l) ([B, H, Sq] fp32)."""
    import torch

    ops = _ops()
    out = _alloc_out(q, out)
    B, H, Sq, _ = q.shape
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    ops.fa2_fwd(q, k, v, out, lse, bool(causal), float(scale))
    return (out, lse) if return_lse else out


# ------------------------------------------------------------------- fa2_wmma, fa2_mma
def _tc_fwd(op_name: str):
    def fn(q, k, v, causal: bool, scale: float, out=None, return_lse: bool = False):
        import torch

        ops = _ops()
        out = _alloc_out(q, out)
        B, H, Sq, _ = q.shape
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
        getattr(ops, op_name)(q, k, v, out, lse, bool(causal), float(scale))
        return (out, lse) if return_lse else out

    fn.__name__ = op_name
    fn.__doc__ = f"torch.ops.faprof.{op_name}; with return_lse, also lse = m + log(l) ([B, H, Sq] fp32)."
    return fn


fa2_wmma_fwd = _tc_fwd("fa2_wmma_fwd")
fa2_mma_fwd = _tc_fwd("fa2_mma_fwd")


# ------------------------------------------------- problems beyond 2022's (GQA, masks, windows, varlen, paged KV)
#: Features the forward of fa2_mma runs (its GEN instantiation, kernels/fa2_mma.cu).
FA2_MMA_FEATURES = frozenset({"gqa", "bottom_right", "window", "softcap", "varlen"})

#: Features the forward of fa3_wgmma_e runs (its GEN instantiation, kernels/fa3_wgmma_ws.cu).
FA3_E_FEATURES = frozenset({"gqa", "bottom_right", "window", "varlen"})


def ex_lse_shape(problem: AttentionProblem) -> tuple[int, ...]:
    """The LSE a *_fwd_ex op writes: [H, total_q] for a packed batch (FlashAttention's), else [B, H, Sq]."""
    if problem.layout == "varlen":
        return (problem.H, problem.total_q)
    return (problem.B, problem.H, problem.Sq)


def _with_features(op_name: str, classic: Callable) -> Callable:
    """fn(q, k, v, causal, scale, out=None, return_lse=False, attn=None): `classic` (2022's op, and the
    autograd path) for problems without features, torch.ops.faprof.<op_name> (the *_fwd_ex op) with
    the problem's KV heads, mask, soft-cap and cu_seqlens otherwise."""

    def fn(q, k, v, causal: bool, scale: float, out=None, return_lse: bool = False, attn=None):
        if attn is None or not attn.problem.features():
            return classic(q, k, v, causal, scale, out, return_lse)
        import torch

        p = attn.problem
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ValueError(f"{op_name}: problems with {sorted(p.features())} run forward only (no backward)")
        out = _alloc_out(q, out)
        lse = torch.empty(ex_lse_shape(p), dtype=torch.float32, device=q.device)
        left, right = attn.window
        getattr(_ops(), op_name)(q, k, v, out, lse, bool(causal), float(scale), int(p.kv_heads),
                                 bool(attn.bottom_right), int(left), int(right), float(p.softcap),
                                 attn.cu_seqlens_q, attn.cu_seqlens_k, int(p.Sq), int(p.Sk))
        return (out, lse) if return_lse else out

    fn.__name__ = op_name
    fn.__doc__ = (f"2022's problems: {getattr(classic, '__name__', 'the classic op')}; with attn= and problem "
                  f"features: torch.ops.faprof.{op_name}.")
    return fn


def _forward_only_features(variant: str, check: Callable[[AttentionProblem], str | None]):
    """`check`, plus: a problem with features (GQA, windows, ...) runs only forward."""

    def wrapped(problem: AttentionProblem) -> str | None:
        feats = problem.features()
        if feats and problem.direction != "fwd":
            return (f"{variant} runs {', '.join(sorted(feats))} forward only; its backward kernels are 2022's "
                    "(equal heads, top-left causal, dense)")
        return check(problem)

    return wrapped


def _tc_check(variant: str):
    head_dims = _head_dim_check(variant, TC_HEAD_DIMS)

    def check(problem: AttentionProblem) -> str | None:
        if problem.softmax_scale <= 0:
            return f"{variant} needs scale > 0 (its running max is taken on raw scores), got {problem.softmax_scale:g}"
        if problem.B > 65535 or problem.H > 65535:
            return f"{variant} launches a (query tiles, H, B) grid: B and H must be at most 65535"
        return head_dims(problem)

    return check


#: What every CUDA-core variant shares: fp32 forward on the GPU, from faprof's extension.
_CUDA_CORE: dict[str, Any] = dict(
    dtypes=("fp32",), directions=("fwd",), device="cuda", compute="cuda_core", needs_extension=True
)

#: What every tensor-core variant shares: fp16/bf16 forward on the GPU, from faprof's extension.
_TENSOR_CORE: dict[str, Any] = dict(
    dtypes=("fp16", "bf16"), directions=("fwd",), device="cuda", compute="tensor", needs_extension=True
)


def _register_cuda_core() -> None:
    """naive, fa1, fa2 and fa2_det (fp32, CUDA cores)."""
    common = _CUDA_CORE
    register(
        Variant(
            "naive",
            "cuda",
            "three CUDA-core kernels: scores to global memory, row softmax, P·V (fp32)",
            naive_fwd,
            check=_naive_check,
            source="kernels/naive.cu",
            tags=("cuda_core", "materializes_scores"),
            **common,
        )
    )
    register(
        Variant(
            "fa1",
            "cuda",
            "FlashAttention-1 loop order on CUDA cores: block per (b, h), O/l/m in global memory (fp32)",
            fa1_fwd,
            check=_head_dim_check("fa1", FA1_HEAD_DIMS),
            source="kernels/fa1.cu",
            tags=("cuda_core", "flash"),
            **common,
        )
    )
    # fa2 and fa2_mma run forward and backward (faprof/kernel_bwd.py); their backward adds dQ with
    # atomics, so only the forward is bit-reproducible. The *_det variants add the backward with a
    # separate dQ kernel, deterministic in every direction.
    fa2_common = {**common, "directions": kernel_bwd.ALL_DIRECTIONS}
    register(
        Variant(
            "fa2",
            "cuda",
            "FlashAttention-2 partition on CUDA cores: grid over query tiles x B·H, O on chip (fp32); "
            "backward with atomic dQ",
            kernel_bwd.differentiable("fa2", fa2_fwd),
            check=_head_dim_check("fa2", FA2_HEAD_DIMS),
            source="kernels/fa2.cu",  # backward: kernels/fa2_bwd.cu
            tags=("cuda_core", "flash"),
            **fa2_common,
        )
    )
    register(
        Variant(
            "fa2_det",
            "cuda",
            "fa2 with a deterministic backward: dQ from a separate kernel over query tiles, no atomics (fp32)",
            kernel_bwd.differentiable("fa2", fa2_fwd, deterministic=True),
            check=_head_dim_check("fa2", FA2_HEAD_DIMS),
            source="kernels/fa2_bwd.cu",
            tags=("cuda_core", "flash", "deterministic"),
            **{**common, "directions": kernel_bwd.GRAD_DIRECTIONS, "deterministic": kernel_bwd.ALL_DIRECTIONS},
        )
    )


def _register_tensor_core() -> None:
    """fa2_wmma, fa2_mma, fa2_mma_det and the hidden _fa2_mma_bwd_1buf (fp16/bf16, mma.sync / wmma)."""
    tc = _TENSOR_CORE
    register(
        Variant(
            "fa2_wmma",
            "cuda",
            "FlashAttention-2 on tensor cores via nvcuda::wmma 16x16x16, softmax through shared memory (fp16/bf16)",
            fa2_wmma_fwd,
            check=_tc_check("fa2_wmma"),
            source="kernels/fa2_wmma.cu",
            tags=("tensor_core", "flash", "wmma"),
            **tc,
        )
    )
    mma_check = kernel_bwd.with_bwd_head_dims("fa2_mma", _tc_check("fa2_mma"), kernel_bwd.MMA_BWD_HEAD_DIMS)
    register(
        Variant(
            "fa2_mma",
            "cuda",
            "FlashAttention-2 via mma.sync m16n8k16 + ldmatrix, swizzled smem, cp.async K/V pipeline, P in registers; "
            "backward with atomic dQ; forward also GQA, bottom-right causal, windows, soft-cap, varlen",
            _with_features("fa2_mma_fwd_ex", kernel_bwd.differentiable("fa2_mma", fa2_mma_fwd)),
            check=_forward_only_features("fa2_mma", mma_check),
            source="kernels/fa2_mma.cu",  # backward: kernels/fa2_mma_bwd.cu
            tags=("tensor_core", "flash", "mma"),
            features=FA2_MMA_FEATURES,
            **{**tc, "directions": kernel_bwd.ALL_DIRECTIONS},
        )
    )
    register(
        Variant(
            "fa2_mma_det",
            "cuda",
            "fa2_mma with a deterministic backward: dQ from a separate mma.sync kernel over query tiles, no atomics",
            kernel_bwd.differentiable("fa2_mma", fa2_mma_fwd, deterministic=True),
            check=mma_check,
            source="kernels/fa2_mma_bwd.cu",
            tags=("tensor_core", "flash", "mma", "deterministic"),
            **{**tc, "directions": kernel_bwd.GRAD_DIRECTIONS, "deterministic": kernel_bwd.ALL_DIRECTIONS},
        )
    )
    register(
        Variant(
            "_fa2_mma_bwd_1buf",
            "cuda",
            "TEST ONLY: fa2_mma with its earlier, single-buffered atomic backward (no Q/dO prefetch, no "
            "staggered start), kept to measure beside fa2_mma's double-buffered one",
            kernel_bwd.differentiable("fa2_mma", fa2_mma_fwd, single_buffer=True),
            check=mma_check,
            hidden=True,
            source="kernels/fa2_mma_bwd.cu",
            tags=("tensor_core", "flash", "mma", "test"),
            **{**tc, "directions": kernel_bwd.GRAD_DIRECTIONS},
        )
    )


# ----------------------------------------------------------------------------- fa3_wgmma
#: Head dimensions of the Hopper wgmma kernels (kFaprofFa3HeadDims in faprof_kernels.h).
FA3_HEAD_DIMS = (64, 128)

#: Why the fa3 steps do not run on a GPU other than compute capability 9.0.
FA3_ARCH_REASON = "needs sm_90a (wgmma/TMA): a compute capability 9.0 GPU such as the H100 or H200"

fa3_wgmma_a_fwd = _tc_fwd("fa3_wgmma_a_fwd")
fa3_wgmma_b_fwd = _tc_fwd("fa3_wgmma_b_fwd")
fa3_wgmma_c_fwd = _tc_fwd("fa3_wgmma_c_fwd")
fa3_wgmma_d_fwd = _tc_fwd("fa3_wgmma_d_fwd")
fa3_wgmma_e_fwd = _tc_fwd("fa3_wgmma_e_fwd")


def _fa3_check(variant: str):
    tc = _tc_check(variant)

    def check(problem: AttentionProblem) -> str | None:
        if problem.D not in FA3_HEAD_DIMS:
            return f"D={problem.D} not supported by {variant} (supported: {', '.join(map(str, FA3_HEAD_DIMS))})"
        reason = tc(problem)
        if reason:
            return reason
        import torch

        # supports() asks only once a GPU is known to be there; other archs are `unsupported`.
        if torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) != (9, 0):
            return FA3_ARCH_REASON
        return None

    return check


def _register_fa3() -> None:
    steps = (
        ("fa3_wgmma_a", fa3_wgmma_a_fwd, "Hopper step (a): wgmma SS for QKᵀ and RS for PV (P in registers), "
         "cp.async K/V double buffer in 128B-swizzled smem, 2 warpgroups x 64 rows (sm_90a)", ()),
        ("fa3_wgmma_b", fa3_wgmma_b_fwd, "Hopper step (b): step (a) with TMA loads (cp.async.bulk.tensor) and a "
         "2-stage mbarrier ring for K/V (sm_90a)", ("tma",)),
        ("fa3_wgmma_c", fa3_wgmma_c_fwd, "Hopper step (c): step (b) warp-specialized: a TMA producer warpgroup "
         "(setmaxnreg 24) and 2 consumer warpgroups (setmaxnreg 240) meeting at full/empty mbarriers (sm_90a)",
         ("tma", "warp_specialized")),
        ("fa3_wgmma_d", fa3_wgmma_d_fwd, "Hopper step (d): step (c) with pingpong: the two consumer warpgroups' "
         "GEMMs alternate (named barriers), one's softmax under the other's GEMMs (sm_90a)",
         ("tma", "warp_specialized", "pingpong")),
        ("fa3_wgmma_e", fa3_wgmma_e_fwd, "Hopper step (e): step (d) with intra-warpgroup overlap: softmax of S_j "
         "while O += P_{j-1} V_{j-1} runs (sm_90a)", ("tma", "warp_specialized", "pingpong", "overlap")),
    )
    for name, fn, what, extra in steps:
        gen = name == "fa3_wgmma_e"  # the final step also runs GQA, bottom-right causal and windows
        register(
            Variant(
                name,
                "cuda",
                what + ("; also GQA, bottom-right causal, windows, varlen" if gen else ""),
                _with_features("fa3_wgmma_e_fwd_ex", fn) if gen else fn,
                check=_fa3_check(name),
                features=FA3_E_FEATURES if gen else frozenset(),
                source="kernels/fa3_wgmma_ws.cu" if "warp_specialized" in extra else "kernels/fa3_wgmma.cu",
                tags=("tensor_core", "flash", "wgmma", "sm90a", *extra),
                dtypes=("fp16", "bf16"),
                directions=("fwd",),
                device="cuda",
                compute="tensor",
                needs_extension=True,
            )
        )




def register_all() -> None:
    """Register faprof's kernel variants (a loader of the registry; the extension is built only when
    one of them runs)."""
    _register_cuda_core()
    _register_tensor_core()
    _register_fa3()
    # Hopper backward steps (faprof/variants/fa3_backward.py): fa3_bwd_a, fa3_bwd_b, with fa3_wgmma_e's forward
    kernel_fa3_bwd.register_variants(_fa3_check, fa3_wgmma_e_fwd)
    # Split-KV decoding (faprof/variants/decode.py)
    kernel_decode.register_variant()
    for _name, _kernel, _bwd in (("naive", "naive", None), ("fa1", "fa1", None), ("fa2", "fa2", "fa2"),
                                 ("fa2_det", "fa2", "fa2"), ("fa2_wmma", "fa2_wmma", None),
                                 ("fa2_mma", "fa2_mma", "fa2_mma"), ("fa2_mma_det", "fa2_mma", "fa2_mma"),
                                 ("_fa2_mma_bwd_1buf", "fa2_mma", "fa2_mma"),
                                 *((f"fa3_wgmma_{s}", "fa3_wgmma", None) for s in "abcde")):
        get(_name).tile = _tile_of(_kernel, _bwd)


# ------------------------------------------------------------------------------- tiles
#: (query rows, keys) a block of each forward kernel works on, by head dim (None: every D), from
#: the tile configs in kernels/: NaiveTile::kTile (naive's score and P·V kernels both use 32x32),
#: Fa1Tile / Fa2Tile (Br = kWarps·kRowsPerWarp = 32, Bc = 64), fa2_wmma's CfgD* (BR = 64),
#: fa2_mma's CfgD* (MmaConfig<D, BR, BC, ...>), fa3's Config<D, 128, 2, 2> (BR = 64·NWG = 128).
#: Wrong-result reports use them to say which tile a wrong element falls in.
FWD_TILES: dict[str, dict[int | None, tuple[int, int]]] = {
    "naive": {None: (32, 32)},
    "fa1": {None: (32, 64)},
    "fa2": {None: (32, 64)},
    "fa2_wmma": {64: (64, 64), 128: (64, 64), 256: (64, 32)},
    "fa2_mma": {64: (128, 128), 128: (128, 64), 256: (64, 32)},
    "fa3_wgmma": {None: (128, 128)},
}

#: (query rows, keys) of the backward kernels: fa2_bwd.cu's kBwdBlock = 32 for both; fa2_mma_bwd.cu's
#: BwdConfig<D, BN keys, BM query rows>: D = 64 -> 64 x 64; D = 128 -> 64 x 128 where BwdD128's 112 KB of
#: shared memory fit (sm_80, sm_90), else BwdD128Small's 64 x 64 (sm_86, sm_89).
FA2_MMA_BWD_D128_SMEM = 2 * 128 * (2 * 128 + 2 * 64) + 2 * 128 * 64


def _bwd_tile(kernel: str, D: int) -> tuple[int, int] | None:
    if kernel == "fa2":
        return (32, 32)
    if D == 64:
        return (64, 64)
    if D != 128:
        return None
    import torch

    if torch.cuda.is_available():
        optin = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "shared_memory_per_block_optin", 0)
        if optin and optin < FA2_MMA_BWD_D128_SMEM:
            return (64, 64)
    return (64, 128)


def _tile_of(kernel: str, bwd: str | None):
    fwd = FWD_TILES[kernel]

    def tile(problem: AttentionProblem, output: str) -> tuple[int, int] | None:
        if output in ("dq", "dk", "dv"):
            return _bwd_tile(bwd, problem.D) if bwd else None
        return fwd.get(problem.D, fwd.get(None))

    return tile


