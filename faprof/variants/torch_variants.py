"""The PyTorch variants: the float64 CPU oracle, explicit attention in torch, and SDPA with each backend."""

from __future__ import annotations

from faprof.model.problem import AttentionProblem
from faprof.model.variant import Variant, register

#: Past this many multiply-adds per (b, h) pair the fp64 CPU reference gets slow (seconds);
#: used by `cpu_ref.supports` only when the CPU is the variant under test, never to refuse
#: the oracle itself (the harness picks an fp32 GPU reference for big problems instead).
CPU_REF_MAX_FLOPS = 2.0e11


def masked_scores(q, k, causal: bool, scale: float):
    """scale·QKᵀ with the causal mask (top-left aligned, as SDPA's is_causal) applied as -inf."""
    import torch

    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return s


def standard_attention(q, k, v, causal: bool, scale: float, out=None):
    """Explicit QKᵀ, softmax, PV: the 'standard attention' of the seeds (materializes Sq x Sk)."""
    import torch

    s = masked_scores(q, k, causal, scale)
    p = torch.softmax(s, dim=-1)
    if causal:
        # Rows with no visible key (only when Sq > Sk is impossible with top-left alignment,
        # but kept for safety) would be NaN; SDPA returns zeros there.
        p = torch.nan_to_num(p, nan=0.0)
    return torch.matmul(p, v)


def _cpu_ref_fn(q, k, v, causal: bool, scale: float, out=None):
    # As a timed variant, cpu_ref runs on inputs already on the CPU in float64 (the harness
    # prepares them), so the timing is the computation, not the upcast.
    return standard_attention(q, k, v, causal, scale)


def _sdpa_fn(backend_name: str | None):
    def fn(q, k, v, causal: bool, scale: float, out=None):
        import torch.nn.functional as F

        if backend_name is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    return fn


def _flash_check(problem: AttentionProblem) -> str | None:
    if problem.D % 8 != 0 or problem.D > 256:
        return f"PyTorch's flash backend needs D a multiple of 8 and at most 256, got D={problem.D}"
    if problem.causal and problem.Sq != problem.Sk:
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
        ),
        Variant(
            "torch_standard",
            "torch",
            "explicit matmul, softmax, matmul in torch (materializes the Sq x Sk scores)",
            standard_attention,
            directions=all_dirs,
            device="auto",
            source="faprof/variants/torch_variants.py (torch.matmul + torch.softmax)",
        ),
        Variant(
            "sdpa_auto",
            "torch",
            "F.scaled_dot_product_attention with PyTorch's own backend choice",
            _sdpa_fn(None),
            directions=all_dirs,
            device="cuda",
            source="torch.nn.functional.scaled_dot_product_attention",
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
        ),
        Variant(
            "sdpa_math",
            "torch",
            "PyTorch SDPA forced to its math (composite, unfused) backend",
            _sdpa_fn("MATH"),
            directions=all_dirs,
            device="auto",
            source="torch SDPBackend.MATH",
        ),
    ]


def register_all() -> None:
    """Register every torch variant (a loader of the registry)."""
    for v in builtin_variants():
        register(v)
