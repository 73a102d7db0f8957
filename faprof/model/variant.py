"""What a variant is and the registry of them: name -> Variant (kind, callable, what it supports and why not).

A variant's callable has one signature everywhere:

    fn(q, k, v, causal: bool, scale: float, out: Tensor | None = None) -> Tensor

with q [B, H, Sq, D], k and v [B, H, Sk, D], contiguous, on the variant's device. A variant that
declares `features` (GQA, bottom-right causal, windows, soft-cap, varlen, paged: the problem's
FEATURES) is also given, as keyword `attn=`, a `faprof.variants.definition.AttnArgs` (the problem and its
index tensors: cu_seqlens, cache lengths, block table); for such problems q, k and v come in the
problem's layout (AttentionProblem's docstring). Torch
baselines ignore `out` (they allocate their own result, which the harness poisons through the
allocator instead); CUDA kernels write into `out` when given, so the harness can hand them an
output filled with NaN and see every element that was not written.

Kinds: 'cpu' (runs on the host), 'torch' (a PyTorch baseline), 'cuda' (a kernel from kernels/,
built as one extension) and 'user' (registered by the user: a Python callable or a .cu op).

The registry is filled from outside: `faprof.variants` (the implementations) installs a loader
with `add_loader` when it is imported, and the first look-up runs it. This module imports no
implementation, so the model stage (scenarios, plans) can name variants without depending on them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from faprof.errors import FaprofError
from faprof.model.problem import AttentionProblem

KINDS = ("cpu", "torch", "cuda", "user")

#: How a missing feature reads in an 'unsupported' row's reason.
_FEATURE_TEXT = {
    "gqa": "grouped-query heads (Hkv < H)", "bottom_right": "a bottom-right aligned mask",
    "window": "a sliding window", "softcap": "a logit soft-cap", "varlen": "packed variable-length batches",
    "paged": "a paged KV cache",
}


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
    in_all: bool = True
    """Whether 'all' (a scenario's `variants = ["all"]`, `--variants all`) includes it. Baselines and
    kernels for today's problems only (flex, which compiles per problem; the decode kernel) are named
    by the scenarios that want them, so 2022's scenarios run the variants they always ran."""
    """Hidden from `faprof list` and from 'all' (test-only variants such as the faulting kernel)."""
    needs_extension: bool = False
    """True for kernels in the faprof CUDA extension: the harness builds/loads it first."""
    source: str = ""
    """Where it comes from: a file in kernels/, a torch function, a user module."""
    tags: tuple[str, ...] = field(default_factory=tuple)
    features: frozenset[str] = frozenset()
    """Problem features beyond 2022's attention it runs (faprof.model.problem.FEATURES: 'gqa',
    'bottom_right', 'window', 'softcap', 'varlen', 'paged'); it is called with `attn=` (module doc)."""
    path_of: Callable[..., str] | None = None
    """path_of(problem, q, k, v, attn) -> which path the call took ('fused: ...', 'slow path: ...'), for
    baselines whose library picks a kernel silently; recorded in the row's `path`."""
    aliases: dict[str, str] = field(default_factory=dict)
    """direction -> the variant whose kernels this one runs for it (an alias: e.g. the Hopper backward
    steps' forward is fa3_wgmma_e's kernel). A run that has both times the target once, and its row
    names this variant in `aliases`; tables, charts and the advisor show the kernel once. Variants that
    do not declare are still found when their recorded kernels match (faprof.analysis.aliases)."""
    deterministic: tuple[str, ...] = ("fwd",)
    """Directions whose output is bitwise identical from call to call. The harness compares a
    timed call's output with the checked call's bitwise for these, within the correctness rules
    for the others (backward kernels that accumulate with atomics are not deterministic)."""

    tile: tuple[int, int] | Callable[[AttentionProblem, str], tuple[int, int] | None] | None = None
    """(query rows, keys) of the tile a kernel block works on, for wrong-result reports (which tile a
    wrong element falls in); a callable (problem, output name) -> tile where it depends on the head
    dim or on the kernel writing that output ('out', 'lse': the forward's; 'dq', 'dk', 'dv': the
    backward's). None: not known (torch baselines)."""

    def alias_of(self, direction: str) -> str | None:
        """The variant whose kernels this one runs for `direction`, or None (its own kernels)."""
        target = self.aliases.get(direction)
        return target if target and target != self.name else None

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
        missing = sorted(problem.features() - set(self.features))
        if missing:
            return False, f"{self.name} does not run {', '.join(_FEATURE_TEXT[f] for f in missing)}"
        if self.check is not None:  # what the variant cannot run anywhere comes before what this machine lacks
            reason = self.check(problem)
            if reason:
                return False, reason
        if self.resolved_device(cuda_available) == "cuda" and not cuda_available:
            return False, "needs an NVIDIA GPU with CUDA; none is available here (see `faprof doctor`)"
        return True, ""


_REGISTRY: dict[str, Variant] = {}
_LOADERS: list[Callable[[], None]] = []
_LOADED = False


def add_loader(loader: Callable[[], None]) -> None:
    """Run `loader` (it registers variants) before the next look-up; `faprof.variants` adds the
    built-in variants this way when it is imported."""
    global _LOADED
    if loader not in _LOADERS:
        _LOADERS.append(loader)
        _LOADED = False


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for loader in list(_LOADERS):
        loader()


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


def get(name: str) -> Variant:
    """The variant called `name`; a FaprofError listing the known names otherwise."""
    _load()
    if not _LOADERS and not _REGISTRY:
        raise FaprofError(f"unknown variant {name!r}: no variant is registered in this process; import "
                          "faprof.variants (faprof's own variants) before looking one up")
    if name not in _REGISTRY:
        known = ", ".join(sorted(v.name for v in _REGISTRY.values() if not v.hidden))
        raise FaprofError(f"unknown variant {name!r}; known variants: {known} (see `faprof list variants`)")
    return _REGISTRY[name]


def all_variants(include_hidden: bool = False) -> list[Variant]:
    """Every registered variant, in registration order."""
    _load()
    return [v for v in _REGISTRY.values() if include_hidden or not v.hidden]


def resolve(names: list[str] | str) -> list[Variant]:
    """Turn 'all' or a list of names into variants, in the order given. 'all' inside a list stands for every
    variant it includes, so `["all", "fa4"]` adds an optional library baseline to them (each variant once)."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if names == ["all"] or names == []:
        return [v for v in all_variants() if v.in_all]
    out: dict[str, Variant] = {}
    for n in names:
        for v in ([v for v in all_variants() if v.in_all] if n == "all" else [get(n)]):
            out.setdefault(v.name, v)
    return list(out.values())
