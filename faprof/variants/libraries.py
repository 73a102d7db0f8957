"""Baselines from the attention libraries users run (FlashInfer, FlashAttention-4), as optional extras.

Each library is an optional extra of faprof with a pinned version (`pip install 'faprof[flashinfer]'`,
`pip install 'faprof[fa4]'`), never installed by default. Its variants are registered whether or not
it is installed, so `faprof list` shows them and a scenario can name them; the library is imported
only inside a call. Where it is missing, every problem is `unsupported` with the reason and the one
pip line; where it is installed, `supports()` refuses what the library itself cannot run, in its own
limits' words. Whether a package is installed is read from its distribution metadata
(importlib.metadata), which imports nothing, so `faprof list`, `faprof doctor` and the support tests
stay fast on a machine without the library or a GPU.

The variants: faprof.variants.lib_flashinfer (`flashinfer_decode`, `flashinfer_prefill`) and
faprof.variants.lib_fa4 (`fa4`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from faprof.checks import Check
from faprof.errors import FaprofError
from faprof.model.problem import AttentionProblem


@dataclass(frozen=True)
class Library:
    """One optional attention library: its distribution on the package index and faprof's extra."""

    name: str
    """How users call it ('FlashInfer')."""
    dist: str
    """Its distribution name on the package index ('flashinfer-python')."""
    extra: str
    """faprof's extra that installs it ('flashinfer')."""
    pin: str
    """The version the extra pins."""
    variants: tuple[str, ...]
    """The faprof variants it backs."""
    note: str = ""
    """What else it needs at run time (one line for the docs and the doctor)."""

    @property
    def install(self) -> str:
        """The one pip line that installs it."""
        return f"pip install 'faprof[{self.extra}]'"

    def version(self) -> str | None:
        """The installed version, or None (from the distribution's metadata: nothing is imported)."""
        return installed_version(self.dist)

    @contextmanager
    def imported(self) -> Iterator[None]:
        """Around the library's import in a call: an installed package that does not import (a dependency
        missing, a build for another CUDA) is one line naming the library, its version and the pip line,
        not a bare ModuleNotFoundError from inside it."""
        try:
            yield
        except ImportError as e:
            raise FaprofError(f"{self.name} {self.version() or ''} is installed but does not import ({e}); "
                              f"reinstall it with its dependencies: {self.install}") from e

    def missing(self) -> str | None:
        """Why the library's variants cannot run here for want of the package, or None when installed."""
        if self.version() is not None:
            return None
        return f"{self.name} is not installed (the package {self.dist}): {self.install}"


FLASHINFER = Library(
    "FlashInfer", "flashinfer-python", "flashinfer", "0.6.18.post1", ("flashinfer_decode", "flashinfer_prefill"),
    note="compiles its kernels on first use (JIT): needs nvcc (the CUDA toolkit) and ninja at run time",
)
FA4 = Library(
    "FlashAttention-4", "flash-attn-4", "fa4", "4.0.0b40", ("fa4",),
    note="CuTe DSL kernels compiled on first use (nvidia-cutlass-dsl, no nvcc); 'faprof[fa4-cu13]' for a "
         "CUDA 13 build of torch",
)

#: Every optional library, in the order `faprof doctor` lists them.
LIBRARIES = (FLASHINFER, FA4)


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or None."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability, or None without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return int(major), int(minor)


def mask_alignment_reason(problem: AttentionProblem, library: str) -> str | None:
    """Why `library`, whose causal mask and window are aligned to the bottom-right corner (FlashAttention's
    convention: query i of a sequence with sq queries and sk keys sits on key i + sk - sq), cannot run
    `problem`'s top-left aligned mask; None when the corners agree or the problem has no mask."""
    if problem.mask_align != "top_left" or not (problem.causal or problem.window is not None):
        return None
    if all(q == k for q, k in zip(problem.q_lens(), problem.k_lens(), strict=True)):
        return None  # every sequence square: both corners give the same mask
    return (f"{library} aligns its causal mask and window to the bottom-right corner (query i of a sequence sees "
            f"keys up to i + Sk - Sq); this problem's mask is aligned top-left (SDPA's is_causal) with Sq != Sk: "
            f"give it mask_align = 'bottom_right'")


def doctor_checks() -> list[Check]:
    """One `faprof doctor` line per optional library: the installed version, or the pip line."""
    out = []
    for lib in LIBRARIES:
        v = lib.version()
        variants = ", ".join(lib.variants)
        if v is None:
            out.append(Check(lib.name, "info", f"not installed: {lib.install} (variants {variants})",
                             lib.note))
        elif v != lib.pin:
            out.append(Check(lib.name, "warn", f"{lib.dist} {v} installed; faprof pins {lib.pin} (variants {variants})",
                             f"rows record the version that ran; {lib.install} for the pinned one"))
        else:
            out.append(Check(lib.name, "ok", f"{lib.dist} {v} (variants {variants})", lib.note))
    return out

