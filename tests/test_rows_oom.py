"""A task that runs out of GPU memory is a row `skipped` with the reason, not `failed` (the problem does
not fit the machine; sdpa_math's scores at B=1 H=32 S=16384 did not fit an H100's 80 GB, 2026-11-27)."""

import faprof.variants  # noqa: F401 (registers the built-in variants)
from faprof.model.problem import AttentionProblem
from faprof.model.variant import get
from faprof.run.finish import finish_row


def _row(type_name, message):
    problem = AttentionProblem(B=1, H=2, Sq=64, Sk=64, D=32, dtype="fp32")
    return finish_row(None, {}, get("torch_standard"), problem, {}, ("error", (type_name, message)), 1.0)


def test_out_of_memory_is_skipped_with_the_reason():
    row = _row("OutOfMemoryError", "CUDA out of memory. Tried to allocate 8.00 GiB.\nmore")
    assert row["status"] == "skipped"
    assert row["reason"] == "does not fit this GPU's memory: CUDA out of memory. Tried to allocate 8.00 GiB."


def test_other_errors_still_fail():
    row = _row("RuntimeError", "CUDA error: an illegal memory access was encountered")
    assert row["status"] == "failed" and row["reason"].startswith("RuntimeError: CUDA error")
