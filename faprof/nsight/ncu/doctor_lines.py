"""`faprof doctor`'s Nsight Compute lines: ncu found and its version, the report reader, counter permission."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from faprof.checks import Check
from faprof.errors import FaprofError
from faprof.nsight.ncu.find import (
    DOCTOR_PROBE_TIMEOUT_S,
    PERMISSION_ERROR,
    PERMISSION_HINT,
    _run_quick,
    find_ncu,
    ncu_version,
)
from faprof.nsight.ncu.parse import load_report_module


def doctor_checks() -> list[Check]:
    """`faprof doctor` lines: ncu found and its version, the report reader, counter permission."""
    checks: list[Check] = []
    ncu = find_ncu()
    if ncu is None:
        checks.append(
            Check(
                "ncu",
                "warn",
                "not found (PATH, $NCU, CUDA installs, /opt/nvidia/nsight-compute)",
                "install Nsight Compute or set NCU=/path/to/ncu to collect kernel metrics (--ncu)",
            )
        )
    else:
        text, _ = ncu_version(ncu)
        checks.append(Check("ncu", "ok" if text else "warn", f"{ncu} ({text or 'did not answer --version'})"))
    try:
        _, reader = load_report_module(ncu)
        checks.append(Check("ncu report reader", "ok", reader))
    except FaprofError as e:
        checks.append(Check("ncu report reader", "warn", "ncu_report not importable", str(e)))
    checks.append(_counter_check(ncu))
    return checks


def _counter_check(ncu: Path | None) -> Check:
    if ncu is None:
        return Check("ncu counters", "info", "skipped: no ncu")
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        return Check("ncu counters", "info", "skipped: no CUDA GPU to profile")
    probe = "import torch; x = torch.ones(1024, device='cuda'); torch.cuda.synchronize(); print((x + 1).sum().item())"
    argv = [
        str(ncu),
        "--metrics",
        "sm__cycles_elapsed.avg",
        "--launch-count",
        "1",
        sys.executable,
        "-c",
        probe,
    ]
    t0 = time.perf_counter()
    r = _run_quick(argv, timeout=DOCTOR_PROBE_TIMEOUT_S)
    took = time.perf_counter() - t0
    if r is None:
        return Check(
            "ncu counters",
            "warn",
            f"probe did not finish in {DOCTOR_PROBE_TIMEOUT_S:.0f} s",
            "run `ncu --metrics sm__cycles_elapsed.avg python -c ...` by hand to see why",
        )
    out = r.stdout + r.stderr
    if PERMISSION_ERROR in out:
        return Check(
            "ncu counters",
            "fail",
            "ERR_NVGPUCTRPERM: this user may not read GPU performance counters",
            PERMISSION_HINT,
        )
    if "sm__cycles_elapsed.avg" in out and r.returncode == 0:
        return Check("ncu counters", "ok", f"readable (probe profiled one kernel in {took:.1f} s)")
    last = next((ln for ln in reversed(out.splitlines()) if ln.strip()), "no output")
    return Check(
        "ncu counters",
        "warn",
        f"probe failed (exit {r.returncode}): {last[:160]}",
        "run the probe by hand: ncu --metrics sm__cycles_elapsed.avg python -c 'import torch; ...'",
    )
