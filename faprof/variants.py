"""The variant registry: name -> Variant (kind, callable, what it supports and why not).

A variant's callable has one signature everywhere:

    fn(q, k, v, causal: bool, scale: float, out: Tensor | None = None) -> Tensor

with q [B, H, Sq, D], k and v [B, H, Sk, D], contiguous, on the variant's device. Torch
baselines ignore `out` (they allocate their own result, which the harness poisons through the
allocator instead); CUDA kernels write into `out` when given, so the harness can hand them an
output filled with NaN and see every element that was not written.

Kinds: 'cpu' (runs on the host), 'torch' (a PyTorch baseline), 'cuda' (a kernel from kernels/,
built as one extension) and 'user' (registered by the user: a Python callable or a .cu op).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from faprof.errors import FaprofError
from faprof.problem import AttentionProblem

KINDS = ("cpu", "torch", "cuda", "user")

#: Past this many multiply-adds per (b, h) pair the fp64 CPU reference gets slow (seconds);
#: used by `cpu_ref.supports` only when the CPU is the variant under test, never to refuse
#: the oracle itself (the harness picks an fp32 GPU reference for big problems instead).
CPU_REF_MAX_FLOPS = 2.0e11


@dataclass
class Variant:
    """One implementation of attention that faprof can check and time."""

    name: str
    """Registry name, used on the command line and in every table."""
    kind: str
    """'cpu', 'torch', 'cuda' or 'user'."""
    description: str
    """One line: what it is."""
    fn: Callable
    """fn(q, k, v, causal, scale, out=None) -> o (see the module docstring)."""
    dtypes: tuple[str, ...] = ("fp16", "bf16", "fp32", "fp64")
    """Element types it accepts."""
    directions: tuple[str, ...] = ("fwd",)
    """Directions it supports; 'bwd' and 'fwd_bwd' need fn to be differentiable by autograd."""
    device: str = "cuda"
    """'cuda', 'cpu', or 'auto' (CUDA when a GPU is present, else the CPU)."""
    compute: str = "tensor"
    """'tensor' (tensor cores: % of peak uses the dense tensor rate) or 'cuda_core' (fp32 rate)."""
    check: Callable[[AttentionProblem], str | None] | None = None
    """Extra support test: returns the reason it cannot run a problem, or None."""
    hidden: bool = False
    """Hidden from `faprof list` and from 'all' (test-only variants such as the faulting kernel)."""
    needs_extension: bool = False
    """True for kernels in the faprof CUDA extension: the harness builds/loads it first."""
    source: str = ""
    """Where it comes from: a file in kernels/, a torch function, a user module."""
    tags: tuple[str, ...] = field(default_factory=tuple)
    deterministic: tuple[str, ...] = ("fwd",)
    """Directions whose output is bitwise identical from call to call. The harness compares a
    timed call's output with the checked call's bitwise for these, within the correctness rules
    for the others (backward kernels that accumulate with atomics are not deterministic)."""
    tile: tuple[int, int] | Callable[[AttentionProblem, str], tuple[int, int] | None] | None = None
    """(query rows, keys) of the tile a kernel block works on, for wrong-result reports (which tile a
    wrong element falls in); a callable (problem, output name) -> tile where it depends on the head
    dim or on the kernel writing that output ('out', 'lse': the forward's; 'dq', 'dk', 'dv': the
    backward's). None: not known (torch baselines)."""

    def tile_for(self, problem: AttentionProblem, output: str = "out") -> tuple[int, int] | None:
        """The (query rows, keys) tile behind `output` of `problem`, or None when not known."""
        if callable(self.tile):
            return self.tile(problem, output)
        return self.tile

    def resolved_device(self, cuda_available: bool) -> str:
        if self.device == "auto":
            return "cuda" if cuda_available else "cpu"
        return self.device

    def supports(self, problem: AttentionProblem, cuda_available: bool | None = None) -> tuple[bool, str]:
        """Whether this variant can run `problem` here; when not, the reason (for status and tables)."""
        if cuda_available is None:
            cuda_available = _cuda_available()
        if problem.dtype not in self.dtypes:
            return False, f"{self.name} supports dtypes {list(self.dtypes)}, not {problem.dtype}"
        if problem.direction not in self.directions:
            return False, f"{self.name} supports directions {list(self.directions)}, not {problem.direction}"
        if self.resolved_device(cuda_available) == "cuda" and not cuda_available:
            return False, "needs an NVIDIA GPU with CUDA; none is available here (see `faprof doctor`)"
        if self.check is not None:
            reason = self.check(problem)
            if reason:
                return False, reason
        return True, ""


_REGISTRY: dict[str, Variant] = {}
_LOADED = False


def register(variant: Variant, *, replace: bool = False) -> Variant:
    """Add a variant to the registry. Names are unique unless `replace` is set."""
    if variant.kind not in KINDS:
        raise FaprofError(f"variant {variant.name!r}: kind must be one of {list(KINDS)}, got {variant.kind!r}")
    if variant.name in _REGISTRY and not replace:
        raise FaprofError(f"a variant named {variant.name!r} is already registered; choose another name")
    _REGISTRY[variant.name] = variant
    return variant


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------ torch baselines
def _masked_scores(q, k, causal: bool, scale: float):
    """scale·QKᵀ with the causal mask (top-left aligned, as SDPA's is_causal) applied as -inf."""
    import torch

    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return s


def _standard_attention(q, k, v, causal: bool, scale: float, out=None):
    """Explicit QKᵀ, softmax, PV: the 'standard attention' of the seeds (materializes Sq x Sk)."""
    import torch

    s = _masked_scores(q, k, causal, scale)
    p = torch.softmax(s, dim=-1)
    if causal:
        # Rows with no visible key (only when Sq > Sk is impossible with top-left alignment,
        # but kept for safety) would be NaN; SDPA returns zeros there.
        p = torch.nan_to_num(p, nan=0.0)
    return torch.matmul(p, v)


def _cpu_ref_fn(q, k, v, causal: bool, scale: float, out=None):
    # As a timed variant, cpu_ref runs on inputs already on the CPU in float64 (the harness
    # prepares them), so the timing is the computation, not the upcast.
    return _standard_attention(q, k, v, causal, scale)


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
    return None


def _cpu_ref_check(problem: AttentionProblem) -> str | None:
    per_call = problem.fwd_flops() * (1 if problem.direction == "fwd" else 3.5)
    if per_call > CPU_REF_MAX_FLOPS:
        return (
            f"the float64 CPU reference would need {per_call / 1e9:.0f} GFLOP per call; faprof times it only "
            f"up to {CPU_REF_MAX_FLOPS / 1e9:.0f} GFLOP (the GPU rows are then checked against an fp32 GPU reference)"
        )
    return None


def _builtin_variants() -> list[Variant]:
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
            source="faprof/variants.py (torch, float64, CPU)",
        ),
        Variant(
            "torch_standard",
            "torch",
            "explicit matmul, softmax, matmul in torch (materializes the Sq x Sk scores)",
            _standard_attention,
            directions=all_dirs,
            device="auto",
            source="faprof/variants.py (torch.matmul + torch.softmax)",
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


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for v in _builtin_variants():
        register(v)
    # CUDA-kernel variants live beside the kernels; importing the module only registers them
    # (building the extension waits until one is run).
    try:
        importlib.import_module("faprof.kernel_variants")
    except ModuleNotFoundError as e:
        if e.name != "faprof.kernel_variants":
            raise


def get(name: str) -> Variant:
    """The variant called `name`; a FaprofError listing the known names otherwise."""
    _load()
    if name not in _REGISTRY:
        known = ", ".join(sorted(v.name for v in _REGISTRY.values() if not v.hidden))
        raise FaprofError(f"unknown variant {name!r}; known variants: {known} (see `faprof list variants`)")
    return _REGISTRY[name]


def all_variants(include_hidden: bool = False) -> list[Variant]:
    """Every registered variant, in registration order."""
    _load()
    return [v for v in _REGISTRY.values() if include_hidden or not v.hidden]


def resolve(names: list[str] | str) -> list[Variant]:
    """Turn 'all' or a list of names into variants, in the order given."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if names == ["all"] or names == []:
        return all_variants()
    return [get(n) for n in names]


def load_user_variants(spec: str) -> list[str]:
    """Register user variants from a Python file or module that calls `faprof.variants.register`.

    `spec` is a path to a .py file or a dotted module name, or a kernel spec of `--kernel`
    ([NAME=]FILE.cu[:launcher] or [NAME=]FILE.py:function, see faprof.user_kernel). Returns the
    names it added.
    """
    _load()
    from faprof import user_kernel  # imports this module: loaded here, not at the top

    if user_kernel.parse_spec(spec) is not None:  # --kernel FILE.cu[:launcher] or FILE.py:fn
        key = user_kernel.resolve_spec(spec)
        if key not in _USER_SPECS:
            _USER_SPECS[key] = [user_kernel.load_kernel(key).name]
        return _USER_SPECS[key]
    key = str(Path(spec).resolve()) if spec.endswith(".py") else spec
    if key in _USER_SPECS:  # loading the same file twice is a no-op, not a name clash
        return _USER_SPECS[key]
    before = set(_REGISTRY)
    path = Path(spec)
    try:
        if path.suffix == ".py":
            if not path.exists():
                raise FaprofError(f"user variant file {spec} does not exist")
            mod_spec = importlib.util.spec_from_file_location(f"faprof_user_{path.stem}", path)
            assert mod_spec and mod_spec.loader
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except FaprofError:
        raise
    except Exception as e:  # a user's module failing to import is a user error
        raise FaprofError(f"could not load user variants from {spec}: {type(e).__name__}: {e}") from e
    _USER_SPECS[key] = sorted(set(_REGISTRY) - before)
    return _USER_SPECS[key]


_USER_SPECS: dict[str, list[str]] = {}


def user_variant(
    name: str,
    fn: Callable,
    *,
    description: str = "user variant",
    dtypes: tuple[str, ...] = ("fp16", "bf16", "fp32"),
    directions: tuple[str, ...] = ("fwd",),
    device: str = "cuda",
    compute: str = "tensor",
    check: Callable[[AttentionProblem], str | None] | None = None,
) -> Variant:
    """Register a Python callable fn(q, k, v, causal, scale, out=None) -> o as a 'user' variant."""
    return register(
        Variant(name, "user", description, fn, dtypes=dtypes, directions=directions, device=device,
                compute=compute, check=check, source=getattr(fn, "__module__", "user"))
    )
