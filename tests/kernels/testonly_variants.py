"""TEST ONLY: kernels that break things on purpose, as hidden variants (never part of `faprof list`).

The tests need a kernel that faults (an illegal memory access that loses the CUDA context:
`_fault_oob`, tests/kernels/fault.cu), one with a real data race beside its correct twin
(`_race_plain`, `_race_atomic`: split-K attention summed without / with atomics, race.cu), and one
warpgroup wgmma GEMM to check the fa3 kernels' layouts against torch (`ops().wgmma_gemm_test`,
wgmma_test.cu). They are built as their own small extension (`faprof_test_ext`, ops
torch.ops.faprof_test.*) the first time one runs, with faprof's toolchain, flags and build cache
(`faprof.variants.build.build_extension`), so faprof's extension carries none of them.

Load the variants in a run (they run in worker processes, which load this file too) with

    faprof profile --scenario SCENARIO --variants _fault_oob --user-variants tests/kernels/testonly_variants.py

or in-process with `faprof.variants.load_user_variants(str(TESTONLY_VARIANTS))`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from faprof.variants import Variant, build, register

KERNELS = Path(__file__).resolve().parent
TESTONLY_VARIANTS = KERNELS / "testonly_variants.py"
SOURCES = ("testonly_binding.cpp", "fault.cu", "race.cu", "wgmma_test.cu")
EXTENSION_NAME = "faprof_test_ext"

_LOCK = threading.Lock()
_LOADED: build.BuildInfo | None = None


def extension() -> build.ExtensionSpec:
    """The test-only extension: these sources, faprof's headers (fa3_common.cuh, mma_ptx.cuh) from kernels/."""
    return build.ExtensionSpec(
        EXTENSION_NAME, tuple(KERNELS / s for s in SOURCES), (KERNELS, build.KERNELS_DIR),
        (KERNELS, build.KERNELS_DIR), build_prefix="testonly-", what="the test-only kernels' extension",
    )


def load_extension() -> build.BuildInfo:
    """Build (once per source/flag/torch/arch combination, cached like faprof's) and load the ops."""
    global _LOADED
    with _LOCK:
        if _LOADED is None:
            _LOADED = build.build_extension(extension())
        return _LOADED


def ops() -> Any:
    """torch.ops.faprof_test, building/loading the extension first."""
    import torch

    load_extension()
    return torch.ops.faprof_test


def fault_oob(q, k, v, causal: bool, scale: float, out=None):
    """Launches a kernel that writes to an unmapped address (illegal memory access).

    The launch itself succeeds; the error surfaces at the next synchronization and leaves the
    process's CUDA context unusable. Run it only in a process you can throw away.
    """
    import torch

    out = torch.empty_like(q) if out is None else out
    ops().fault_oob(q, out)
    return out


def _race(atomic: bool):
    def fn(q, k, v, causal: bool, scale: float, out=None):
        """Split-K attention, partial outputs summed with (atomic) or without atomics."""
        import torch

        out = torch.empty_like(q) if out is None else out
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        ops().race_fwd(q, k, v, out, lse, causal, scale, atomic)
        return out

    return fn


def _register() -> None:
    common: dict[str, Any] = dict(dtypes=("fp32",), directions=("fwd",), device="cuda", compute="cuda_core",
                                  hidden=True, tags=("test",))
    register(Variant("_fault_oob", "cuda", "TEST ONLY: a kernel that faults with an out-of-bounds write "
                     "(illegal memory access)", fault_oob, source="tests/kernels/fault.cu", **common), replace=True)
    for name, atomic, what in (("_race_atomic", True, "split-K with atomicAdd: correct"),
                               ("_race_plain", False, "split-K with plain read-add-write: a data race")):
        register(Variant(name, "cuda", f"TEST ONLY: {what}", _race(atomic), source="tests/kernels/race.cu",
                         deterministic=(),  # fp32 atomics add in any order
                         **common), replace=True)


_register()
