"""The PyTorch variants: the float64 CPU oracle, explicit attention in torch, and SDPA with each backend."""

from __future__ import annotations

from faprof.model.mask import TOP_LEFT_CAUSAL
from faprof.model.problem import FEATURES, AttentionProblem
from faprof.model.scores import scores
from faprof.model.variant import Variant, register
from faprof.variants import flex
from faprof.variants.definition import AttnArgs, attention

#: SDPA runs GQA (enable_gqa), a bottom-right causal mask (CausalBias) and a window (an explicit
#: boolean mask); it has no packed-varlen or paged API and no soft-cap.
SDPA_FEATURES = frozenset({"gqa", "bottom_right", "window"})

#: Past this many multiply-adds per (b, h) pair the fp64 CPU reference gets slow (seconds);
#: used by `cpu_ref.supports` only when the CPU is the variant under test, never to refuse
#: the oracle itself (the harness picks an fp32 GPU reference for big problems instead).
CPU_REF_MAX_FLOPS = 2.0e11


def masked_scores(q, k, causal: bool, scale: float):
    """scale·QKᵀ with the causal mask (top-left aligned, as SDPA's is_causal) applied as -inf
    (faprof.model.scores; the mask built on the scores' device, torch.ones and tril)."""
    return scores(q, k, scale, allowed=TOP_LEFT_CAUSAL if causal else None)


def standard_attention(q, k, v, causal: bool, scale: float, out=None, attn: AttnArgs | None = None):
    """Explicit QKᵀ, softmax, PV: the 'standard attention' of the seeds (materializes Sq x Sk); with
    `attn`, the definition one sequence at a time in the problem's layout (faprof.variants.definition)."""
    import torch

    if attn is not None and attn.problem.features():  # 2022's problems keep the batched path (and its timing)
        return attention(attn.problem, q, k, v, attn)
    s = masked_scores(q, k, causal, scale)
    p = torch.softmax(s, dim=-1)
    if causal:
        # Rows with no visible key (only when Sq > Sk is impossible with top-left alignment,
        # but kept for safety) would be NaN; SDPA returns zeros there.
        p = torch.nan_to_num(p, nan=0.0)
    return torch.matmul(p, v)


def _cpu_ref_fn(q, k, v, causal: bool, scale: float, out=None, attn: AttnArgs | None = None):
    # As a timed variant, cpu_ref runs on inputs already on the CPU in float64 (the harness
    # prepares them), so the timing is the computation, not the upcast.
    return standard_attention(q, k, v, causal, scale, attn=attn)


def _sdpa_mask(attn: AttnArgs | None, causal: bool, q):
    """(attn_mask, is_causal, enable_gqa) for SDPA: a CausalBias for bottom-right causal, an explicit
    boolean mask for a window, is_causal for top-left causal."""
    if attn is None:
        return None, causal, False
    p = attn.problem
    gqa = p.kv_heads != p.H
    if p.total_pairs() == p.B * p.Sq * p.Sk:
        return None, False, gqa  # the mask hides nothing (decode of one token): no mask, the fastest paths
    if p.window is not None:
        return _window_mask(p, q.device), False, gqa
    if p.causal and p.mask_align == "bottom_right":
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(p.Sq, p.Sk), False, gqa
    return None, p.causal, gqa


_WINDOW_MASKS: dict[tuple[str, str], object] = {}


def _window_mask(p: AttentionProblem, device):
    """The [Sq, Sk] boolean mask SDPA needs for a window, built once per problem and device (a user would
    build it once too; 268 MB at S = 16k, so not inside every timed call)."""
    from faprof.model.mask import allowed

    key = (p.shape_id, str(device))
    if key not in _WINDOW_MASKS:
        _WINDOW_MASKS.clear()  # one problem at a time
        _WINDOW_MASKS[key] = allowed(p.mask, p.Sq, p.Sk).to(device)
    return _WINDOW_MASKS[key]


def _sdpa_fn(backend_name: str | None):
    def fn(q, k, v, causal: bool, scale: float, out=None, attn: AttnArgs | None = None):
        import torch.nn.functional as F

        mask, is_causal, gqa = _sdpa_mask(attn, causal, q)
        kw = {"attn_mask": mask, "is_causal": is_causal, "scale": scale, **({"enable_gqa": True} if gqa else {})}
        if backend_name is None:
            return F.scaled_dot_product_attention(q, k, v, **kw)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, **kw)

    return fn


#: torch.nn.attention.SDPBackend's values, as `torch._fused_sdp_choice` returns them.
_SDP_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def _sdpa_path(backend_name: str | None):
    """path_of for an SDPA variant: which backend ran it. A forced backend runs or refuses (then the row
    is unsupported); PyTorch's own choice is asked of the dispatcher (`torch._fused_sdp_choice`) on the
    row's inputs, so a silent fall-back to the unfused math path is named."""
    def path(problem: AttentionProblem, q, k, v, attn: AttnArgs | None) -> str:
        if backend_name == "MATH":
            return "unfused: SDPA math backend (composite matmul/softmax kernels)"
        if backend_name is not None:
            return f"fused: SDPA {backend_name.lower().replace('_attention', '')} backend (forced)"
        import torch

        mask, is_causal, gqa = _sdpa_mask(attn, problem.causal, q)
        try:
            if mask is not None and not isinstance(mask, torch.Tensor):
                # a CausalBias (bottom-right causal) is dispatched by CausalBias itself: flash if it can,
                # else the memory-efficient kernel, else math with the mask materialized
                from torch.backends.cuda import (
                    SDPAParams,
                    can_use_efficient_attention,
                    can_use_flash_attention,
                )

                params = SDPAParams(q, k, v, None, 0.0, False, gqa)
                choice = 1 if can_use_flash_attention(params) else 2 if can_use_efficient_attention(params) else 0
            else:
                choice = int(torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, scale=problem.softmax_scale,
                                                     enable_gqa=gqa))
        except Exception as e:  # private APIs: say what failed rather than guess
            return f"unknown: PyTorch's backend choice could not be read ({type(e).__name__}: {str(e)[:80]})"
        name = _SDP_NAMES.get(choice, str(choice))
        return ("slow path: PyTorch chose its unfused math backend" if name == "math"
                else f"fused: PyTorch chose its {name} backend")

    return path


def _flash_check(problem: AttentionProblem) -> str | None:
    if problem.window is not None:
        return "PyTorch's flash backend takes no explicit mask, which a sliding window needs in SDPA"
    if problem.D % 8 != 0 or problem.D > 256:
        return f"PyTorch's flash backend needs D a multiple of 8 and at most 256, got D={problem.D}"
    if problem.causal and problem.Sq != problem.Sk and problem.mask_align == "top_left":
        return (f"PyTorch's flash backend refuses is_causal when Sq != Sk (its mask is aligned bottom-right), "
                f"got Sq={problem.Sq}, Sk={problem.Sk}")
    return None


def _cpu_ref_check(problem: AttentionProblem) -> str | None:
    per_call = problem.fwd_flops() * (1 if problem.direction == "fwd" else 3.5)
    if per_call > CPU_REF_MAX_FLOPS:
        return (
            f"the float64 CPU reference would need {per_call / 1e9:.0f} GFLOP per call; faprof times it only "
            f"up to {CPU_REF_MAX_FLOPS / 1e9:.0f} GFLOP (the GPU rows are then checked against an fp32 GPU reference)"
        )
    return None


def builtin_variants() -> list[Variant]:
    """The torch variants, in the order `faprof list` shows them."""
    all_dirs = ("fwd", "bwd", "fwd_bwd")
    return [
        Variant(
            "cpu_ref",
            "cpu",
            "float64 standard attention on the CPU (torch): the correctness oracle and CPU baseline",
            _cpu_ref_fn,
            directions=all_dirs,
            device="cpu",
            compute="cuda_core",
            check=_cpu_ref_check,
            source="faprof/variants/torch_variants.py (torch, float64, CPU)",
            features=frozenset(FEATURES),
        ),
        Variant(
            "torch_standard",
            "torch",
            "explicit matmul, softmax, matmul in torch (materializes the Sq x Sk scores)",
            standard_attention,
            directions=all_dirs,
            device="auto",
            source="faprof/variants/torch_variants.py (torch.matmul + torch.softmax)",
            features=frozenset(FEATURES),
            path_of=lambda *a: "unfused: matmul, softmax, matmul (the scores in memory)",
        ),
        Variant(
            "sdpa_auto",
            "torch",
            "F.scaled_dot_product_attention with PyTorch's own backend choice",
            _sdpa_fn(None),
            directions=all_dirs,
            device="cuda",
            source="torch.nn.functional.scaled_dot_product_attention",
            features=SDPA_FEATURES,
            path_of=_sdpa_path(None),
            deterministic=(),  # it may pick cuDNN, which is not bitwise repeatable (see sdpa_cudnn)
        ),
        Variant(
            "sdpa_flash",
            "torch",
            "PyTorch SDPA forced to its FlashAttention-2 backend",
            _sdpa_fn("FLASH_ATTENTION"),
            dtypes=("fp16", "bf16"),
            directions=all_dirs,
            device="cuda",
            check=_flash_check,
            source="torch SDPBackend.FLASH_ATTENTION",
            features=SDPA_FEATURES,
            path_of=_sdpa_path("FLASH_ATTENTION"),
        ),
        Variant(
            "sdpa_cudnn",
            "torch",
            "PyTorch SDPA forced to its cuDNN backend",
            _sdpa_fn("CUDNN_ATTENTION"),
            dtypes=("fp16", "bf16"),
            directions=all_dirs,
            device="cuda",
            source="torch SDPBackend.CUDNN_ATTENTION",
            features=SDPA_FEATURES,
            # not bitwise repeatable: on decode problems 1-2 of 131072 output elements changed from call
            # to call (H100, torch 2.11, B=16 Hq=64 Hkv=8 Sq=1 Sk=1024 and 32768 bf16, 2026-11-27)
            deterministic=(),
            path_of=_sdpa_path("CUDNN_ATTENTION"),
        ),
        Variant(
            "sdpa_efficient",
            "torch",
            "PyTorch SDPA forced to its memory-efficient (xFormers/CUTLASS) backend",
            _sdpa_fn("EFFICIENT_ATTENTION"),
            dtypes=("fp16", "bf16", "fp32"),
            directions=all_dirs,
            device="cuda",
            source="torch SDPBackend.EFFICIENT_ATTENTION",
            features=SDPA_FEATURES - {"gqa"},  # 'No available kernel' with enable_gqa (H100, torch 2.11)
            path_of=_sdpa_path("EFFICIENT_ATTENTION"),
        ),
        Variant(
            "sdpa_math",
            "torch",
            "PyTorch SDPA forced to its math (composite, unfused) backend",
            _sdpa_fn("MATH"),
            directions=all_dirs,
            device="auto",
            source="torch SDPBackend.MATH",
            features=SDPA_FEATURES,
            path_of=_sdpa_path("MATH"),
        ),
        *_flex_variants(),
    ]


def _flex_variants() -> list[Variant]:
    if not flex.available():
        return []
    return [Variant(
        "flex",
        "torch",
        "FlexAttention (torch.nn.attention.flex_attention): compiled, block masks for masks and windows, "
        "document masking for packed batches, the block table for paged caches",
        flex.flex_fn,
        dtypes=("fp16", "bf16", "fp32"),
        directions=("fwd",),
        device="auto",
        features=frozenset(FEATURES),
        path_of=flex.flex_path,
        in_all=False,
        deterministic=(),  # a timed call's output differed bitwise from the checked one's on the H100
        source="torch.nn.attention.flex_attention (torch.compile on the GPU)",
    )]


def register_all() -> None:
    """Register every torch variant (a loader of the registry)."""
    for v in builtin_variants():
        register(v)
