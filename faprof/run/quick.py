"""`faprof profile --quick`: the previous quick run of a kernel, to compare the new one with.

A quick run writes `quick = {kernel, started_s}` in its manifest (`faprof.run.resolve.new_manifest`). The
previous run of a kernel is the newest bundle under the run folder that is complete, was a quick run of
the same kernel name, on the same scenario and the same device (GPU model, or the CPU); an interrupted,
failed or still running bundle never counts, nor a full `faprof profile` run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faprof.errors import FaprofError
from faprof.store import Bundle, find_bundles


def device_of(manifest: dict[str, Any]) -> str:
    """The device a bundle ran on: its GPU model, or 'cpu'."""
    return str((manifest.get("env") or {}).get("gpu_name") or "cpu")


def previous_run(out_dir: str | Path, kernel: str, scenario: str, device: str,
                 before: Bundle | None = None) -> Bundle | None:
    """The newest complete quick run of `kernel` on `scenario` and `device` under `out_dir`.

    Args:
        out_dir: the folder quick runs are written to (searched recursively).
        kernel: the kernel's variant name.
        scenario: the scenario's name.
        device: GPU model or 'cpu' (`device_of`).
        before: the run just made: left out, and only runs started before it count.

    Returns:
        The bundle, or None when there is none.
    """
    limit = None
    if before is not None:
        limit = (before.manifest().get("quick") or {}).get("started_s")
    best: tuple[float, Bundle] | None = None
    for b in find_bundles(out_dir):
        if before is not None and b.path.resolve() == before.path.resolve():
            continue
        try:
            m = b.manifest()
        except FaprofError:  # a damaged manifest is not a previous run
            continue
        q = m.get("quick") or {}
        started = q.get("started_s")
        if (m.get("status") != "complete" or q.get("kernel") != kernel or not isinstance(started, int | float)
                or (m.get("scenario") or {}).get("name") != scenario or device_of(m) != device
                or (limit is not None and started >= limit)):
            continue
        if best is None or started > best[0]:
            best = (float(started), b)
    return best[1] if best else None
