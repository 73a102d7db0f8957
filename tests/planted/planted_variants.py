"""TEST ONLY: the planted-fault kernels as hidden user variants (never part of `faprof list`).

Each kernel is FlashAttention-2 with one deliberate performance defect (results stay exact, so
they pass faprof's correctness check), plus a clean control; the advisor must name each defect as
its primary finding from the hardware counters alone (tests/test_advise_planted.py, on a bundle
recorded on an H100 by scripts/record_planted.sh). The kernels are copies of GPU-verified ones with
small changes marked `PLANTED FAULT` (kernels/planted_mma.cu from kernels/fa2_mma.cu,
kernels/planted_cuda_core.cu from kernels/fa2.cu) and are built as their own small extension
(`faprof_planted_ext`, ops torch.ops.faprof_planted.*) the first time one runs, so faprof's own
build does not grow. Load with

    faprof profile --scenario tests/planted/planted.toml --user-variants tests/planted/planted_variants.py

=========================  ===================================================  ==================
variant                    defect                                               advisor cause
=========================  ===================================================  ==================
planted_clean              none (the control: fa2_mma as it is)                 not a defect
planted_bank_conflicts     shared-memory rows not swizzled (8-way ldmatrix)     smem_bank_conflicts
planted_spills             registers capped at 128/thread: local-memory spills  register_spills
planted_uncoalesced        lanes walk down rows, 4-byte plain loads             uncoalesced_global
planted_no_tensor_cores    fp16 attention on CUDA cores (fa2 with fp16 I/O)     tensor_cores_unused
planted_no_causal_skip     causal blocks visit tiles above the diagonal         wasted_work
planted_few_ctas           one block per (b, h): grid (1, H, B)                 too_few_ctas
planted_launch_per_head    the clean kernel launched once per (b, h)            launch_split
=========================  ===================================================  ==================
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.variants import Variant, build, register

KERNELS = Path(__file__).resolve().parent / "kernels"
SOURCES = ("planted_binding.cpp", "planted_mma.cu", "planted_cuda_core.cu")
EXTENSION_NAME = "faprof_planted_ext"

#: Fault codes of torch.ops.faprof_planted.mma_fwd (kernels/planted_kernels.h).
MMA_FAULTS = {"clean": 0, "bank_conflicts": 1, "spills": 2, "uncoalesced": 3, "no_causal_skip": 4, "few_ctas": 5}

#: Variant name -> the advisor cause its defect must be diagnosed as (None: the control).
EXPECTED_CAUSE: dict[str, str | None] = {
    "planted_clean": None,
    "planted_bank_conflicts": "smem_bank_conflicts",
    "planted_spills": "register_spills",
    "planted_uncoalesced": "uncoalesced_global",
    "planted_no_tensor_cores": "tensor_cores_unused",
    "planted_no_causal_skip": "wasted_work",
    "planted_few_ctas": "too_few_ctas",
    "planted_launch_per_head": "launch_split",
}

_LOCK = threading.Lock()
_LOADED = False


def extension() -> build.ExtensionSpec:
    """The planted kernels' extension: their own sources, faprof's PTX wrappers (mma_ptx.cuh) from kernels/."""
    return build.ExtensionSpec(EXTENSION_NAME, tuple(KERNELS / s for s in SOURCES), (KERNELS, build.KERNELS_DIR),
                               (KERNELS, build.KERNELS_DIR), build_prefix="planted-",
                               what="the planted-fault kernels")


def load_extension() -> None:
    """Build (once per source/flag/torch/arch combination, cached like faprof's) and load the ops."""
    global _LOADED
    with _LOCK:
        if _LOADED:
            return
        build.build_extension(extension())
        _LOADED = True


def _ops() -> Any:
    import torch

    load_extension()
    return torch.ops.faprof_planted


def _mma(fault: str, per_head: bool = False):
    code = MMA_FAULTS[fault]

    def fn(q, k, v, causal: bool, scale: float, out=None):
        import torch

        out = torch.empty_like(q) if out is None else out
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        _ops().mma_fwd(q, k, v, out, lse, bool(causal), float(scale), code, per_head)
        return out

    return fn


def _cuda_core(q, k, v, causal: bool, scale: float, out=None):
    import torch

    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    _ops().cuda_core_fwd(q, k, v, out, lse, bool(causal), float(scale))
    return out


def _check(problem: AttentionProblem) -> str | None:
    if problem.D not in (64, 128):
        return f"the planted kernels take D = 64 or 128, not {problem.D}"
    if problem.softmax_scale <= 0:
        return "the planted kernels need scale > 0"
    if problem.B > 65535 or problem.H > 65535:
        return "the planted kernels launch a (tiles, H, B) grid: B and H must be at most 65535"
    return None


def _register() -> None:
    common: dict[str, Any] = dict(directions=("fwd",), device="cuda", hidden=True, check=_check,
                                  source="tests/planted/kernels", tags=("test", "planted"))
    descriptions = {
        "clean": "TEST ONLY: the planted kernels' control (fa2_mma as it is)",
        "bank_conflicts": "TEST ONLY: fa2_mma with unswizzled shared-memory rows (bank conflicts)",
        "spills": "TEST ONLY: fa2_mma capped at 128 registers/thread (register spills)",
        "uncoalesced": "TEST ONLY: fa2_mma loading tiles with uncoalesced 4-byte loads",
        "no_causal_skip": "TEST ONLY: fa2_mma computing causal tiles above the diagonal",
        "few_ctas": "TEST ONLY: fa2_mma with one block per (b, h) (too few CTAs)",
    }
    for fault, text in descriptions.items():
        register(Variant(f"planted_{fault}", "user", text, _mma(fault), dtypes=("fp16",), compute="tensor",
                         **common), replace=True)
    register(Variant("planted_launch_per_head", "user", "TEST ONLY: fa2_mma launched once per (b, h)",
                     _mma("clean", per_head=True), dtypes=("fp16",), compute="tensor", **common), replace=True)
    register(Variant("planted_no_tensor_cores", "user", "TEST ONLY: FlashAttention-2 on fp16 with CUDA cores only",
                     _cuda_core, dtypes=("fp16",), compute="cuda_core", **common), replace=True)


_register()
