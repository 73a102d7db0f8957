"""The environment a run is measured in: GPU, clocks, driver, CUDA, torch, tools, host, git.

Recorded once per run in the manifest, so that every figure can be traced to the machine and
software that produced it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import faprof
from faprof import resources
from faprof.model.problem import torch_dtype
from faprof.timing.gpu_clock import sm_clock_mhz


def _run(cmd: list[str], timeout: float = 20.0) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_sha() -> str | None:
    """The faprof source tree's commit (with '-dirty' when it has uncommitted changes).

    FAPROF_GIT_SHA, when set, wins: a copy of the tree (as on a lent GPU machine) may carry a stale
    .git of another commit, and the one who copied it knows which commit it is."""
    told = os.environ.get("FAPROF_GIT_SHA")
    if told:
        return told
    root = resources.source_root()
    sha = _run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"]) if root is not None else None
    if sha is None:
        return None
    dirty = _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    return sha + ("-dirty" if dirty else "")


def nvcc_version() -> str | None:
    nvcc = shutil.which("nvcc") or (str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"))
    out = _run([nvcc, "--version"]) if nvcc and Path(nvcc).exists() else None
    if not out:
        return None
    for line in out.splitlines():
        if "release" in line:
            return line.split("release")[-1].strip().split(",")[0]
    return out.splitlines()[-1]


def nvidia_smi(index: int = 0) -> dict[str, Any]:
    """Clocks, driver, power limit and memory from nvidia-smi, when it is there."""
    fields = ["driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
              "power.limit", "temperature.gpu", "pstate", "persistence_mode", "memory.total"]
    out = _run(["nvidia-smi", f"--id={index}", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if not out:
        return {}
    vals = [v.strip() for v in out.splitlines()[0].split(",")]
    return dict(zip(["driver", "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "max_mem_clock_mhz",
                     "power_limit_w", "temperature_c", "pstate", "persistence_mode", "memory_total_mib"],
                    vals, strict=False))


def host_env() -> dict[str, Any]:
    """What can be read without touching the GPU: host, Python, packages, tools, git."""
    import torch

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "faprof": faprof.__version__,
        "git_sha": git_sha(),
        "nvcc": nvcc_version(),
    }
    try:
        import pandas as pd

        env["pandas"] = pd.__version__
    except ImportError:  # pragma: no cover
        pass
    return env


def gpu_env(device_index: int = 0) -> dict[str, Any]:
    """GPU facts from torch and nvidia-smi (initializes CUDA: call inside the worker)."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu_name": None, "cuda_available": False}
    p = torch.cuda.get_device_properties(device_index)
    env: dict[str, Any] = {
        "cuda_available": True,
        "gpu_name": p.name,
        "cc": f"{p.major}.{p.minor}",
        "sms": p.multi_processor_count,
        "gpu_memory_bytes": p.total_memory,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "smem_per_block_optin": getattr(p, "shared_memory_per_block_optin", None),
        "smem_per_sm": getattr(p, "shared_memory_per_multiprocessor", None),
        "regs_per_sm": getattr(p, "regs_per_multiprocessor", None),
        "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", None),
        "gpu_uuid": str(getattr(p, "uuid", "")),
        "device_count": torch.cuda.device_count(),
    }
    env.update({f"smi_{k}": v for k, v in nvidia_smi(device_index).items()})
    return env


def measure_ceilings(dtypes: tuple[str, ...] = ("fp16", "bf16")) -> dict[str, float]:
    """The machine's own ceilings, measured once per run (a few hundred ms on a big GPU):

    - `matmul_<dtype>_tflops` for fp16 and bf16: an 8192³ matmul (the dense tensor rate cuBLAS reaches);
    - `matmul_tf32_tflops`: an 8192³ fp32 matmul with TF32 allowed (tensor cores on fp32 data);
    - `matmul_fp32_tflops`: a 4096³ fp32 matmul with TF32 off (the CUDA-core rate cuBLAS reaches);
    - `copy_gbs`: a 1 GiB device-to-device copy, counting bytes read plus written;
    - `ceilings_sm_clock_mhz`: the SM clock right after the matmuls (the ceilings hold at that clock).
    Random data, not zeros (zeros run faster on some chips). Times are CUDA-event medians: each
    matmul runs for milliseconds, far above the events' few-µs floor.
    """
    import torch


    out: dict[str, float] = {}

    def bench(fn, reps: int) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        return times[len(times) // 2]

    n = 8192
    for dtype in dtypes:
        x = torch.randn(n, n, device="cuda", dtype=torch_dtype(dtype))
        y = torch.randn(n, n, device="cuda", dtype=torch_dtype(dtype))
        ms = bench(lambda a=x, b=y: a @ b, 10)
        out[f"matmul_{dtype}_tflops"] = 2 * n**3 / ms / 1e9
        del x, y
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        x = torch.randn(n, n, device="cuda")
        y = torch.randn(n, n, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        ms = bench(lambda a=x, b=y: a @ b, 5)
        out["matmul_tf32_tflops"] = 2 * n**3 / ms / 1e9
        del x, y
        torch.backends.cuda.matmul.allow_tf32 = False
        m = 4096
        x = torch.randn(m, m, device="cuda")
        y = torch.randn(m, m, device="cuda")
        ms = bench(lambda a=x, b=y: a @ b, 5)
        out["matmul_fp32_tflops"] = 2 * m**3 / ms / 1e9
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    del x, y
    with contextlib.suppress(Exception):  # the spin kernel needs the extension's toolchain
        out["ceilings_sm_clock_mhz"] = sm_clock_mhz()
    nbytes = 1 << 30
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda d=dst, s=src: d.copy_(s), 10)
    out["copy_gbs"] = 2 * nbytes / ms / 1e6
    del src, dst
    torch.cuda.empty_cache()
    return out
