"""`faprof doctor`: what this machine can do, and what to install when something is missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from faprof.checks import Check
from faprof.model import gpus
from faprof.nsight import ncu, nsys
from faprof.timing import cupti_timer
from faprof.timing.gpu_monitor import Monitor
from faprof.variants import libraries


def _version(cmd: list[str]) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout or r.stderr).strip() if r.returncode == 0 else None


def timing_checks() -> list[Check]:
    """Which GPU timer the harness will use (CUPTI kernel records or the CUDA-event fallback) and
    whether clocks/temperatures are recorded (NVML). Call only where a GPU is visible."""
    out: list[Check] = []
    info = cupti_timer.describe()
    if info["available"]:
        out.append(Check("gpu timer", "ok", f"CUPTI kernel records (cupti-python {info.get('cupti_python') or '?'})"))
    else:
        out.append(Check("gpu timer", "warn", f"CUDA events (fallback): {info['reason']}",
                         "CUDA events carry a few-µs floor per call; " + cupti_timer.INSTALL_HINT))
    mon = Monitor.open()
    r = mon.read() if mon.ok else None
    if r is not None:
        out.append(Check("clocks (NVML)", "ok", f"SM {r.sm_clock_mhz:.0f} MHz, {r.temperature_c:.0f} C now"))
    else:
        out.append(Check("clocks (NVML)", "warn", mon.error or "no reading",
                         "rows will carry no temperature or throttle record (the SM clock is still calibrated)"))
    return out


def no_gpu_timing_checks() -> list[Check]:
    """The timer and clock rows on a machine without a GPU: what times the CPU rows, what a GPU run would
    use (CUPTI when cupti-python imports), and why no clock is recorded."""
    info = cupti_timer.describe()
    gpu_side = (f"on a GPU: CUPTI kernel records (cupti-python {info.get('cupti_python') or '?'})" if info["available"]
                else f"on a GPU: CUDA events, as {str(info['reason']).split(' (')[0]}")
    return [Check("gpu timer", "info", f"no GPU: CPU rows are timed by the host clock (time.perf_counter); {gpu_side}"),
            Check("clocks (NVML)", "info", "no GPU: no SM clock, temperature or throttle record (CPU rows have none)")]


def run_checks() -> list[Check]:
    checks: list[Check] = []
    py_ok = sys.version_info >= (3, 11)
    checks.append(Check("python", "ok" if py_ok else "fail", sys.version.split()[0],
                        "" if py_ok else "faprof needs Python 3.11 or newer"))
    try:
        import torch

        checks.append(Check("torch", "ok", f"{torch.__version__} (CUDA {torch.version.cuda or 'none: CPU build'})"))
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            checks.append(Check("gpu", "ok", f"{p.name}, CC {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                                             f"{p.total_memory / 2**30:.0f} GiB"))
            spec = gpus.lookup(p.name)
            checks.append(Check("gpu database", "ok" if spec else "warn",
                                spec.name if spec else f"{p.name} is not in faprof's GPU database",
                                "" if spec else "% of peak will be blank: only measured figures are shown for this GPU"))
            checks.extend(timing_checks())
        else:
            hint = ("this torch is a CPU build: install a CUDA build of torch" if not torch.version.cuda
                    else "torch has CUDA but sees no GPU: check the driver (nvidia-smi)")
            checks.append(Check("gpu", "warn", "no CUDA GPU visible to torch", hint + "; CPU variants still run"))
            checks.extend(no_gpu_timing_checks())
    except ImportError:
        checks.append(Check("torch", "fail", "not installed", "pip install torch"))
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc:
        out = _version([nvcc, "--version"]) or ""
        rel = next((ln.split("release")[-1].strip() for ln in out.splitlines() if "release" in ln), out[-60:])
        checks.append(Check("nvcc", "ok", f"{nvcc} ({rel})"))
    else:
        checks.append(Check("nvcc", "warn", "not found", "install the CUDA toolkit to build the CUDA kernel variants"))
    ninja = shutil.which("ninja")
    if ninja is None:
        try:
            import ninja as _ninja  # noqa: F401

            ninja = str(Path(_ninja.BIN_DIR) / "ninja")
        except ImportError:
            pass
    checks.append(Check("ninja", "ok" if ninja else "warn", ninja or "not found",
                        "" if ninja else "pip install ninja (torch's JIT builds need it)"))
    checks.extend(ncu.doctor_checks())
    checks.extend(nsys.doctor_checks())
    checks.extend(libraries.doctor_checks())
    return checks
