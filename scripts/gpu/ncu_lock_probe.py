"""Do two ncu processes on two GPUs profile at the same time? (run by scripts/gpu/gpu_ncu_multi.sh)

Three configurations of plain ncu (no faprof in the profiled process), each profiling the same
number of fp16 GEMM launches (torch.mm, 2048^2) with the four sections of faprof's set:

- one:       GPU 0 alone (the pace of one ncu process);
- shared:    GPU 0 and GPU 1 at once, both ncu processes with the same TMPDIR (one
             TMPDIR/nsight-compute-lock, as two commands typed in one shell);
- separate:  GPU 0 and GPU 1 at once, each with its own TMPDIR (its own lock file).

Each ncu output line `==PROF== Profiling ...` is timestamped as it arrives; a process's profiling
window runs from its first such line to its last. The table gives, per configuration, each window,
the seconds two windows were open at once, and the kernels profiled per second over the union of
the windows against `one`'s (2.0 means two GPUs profiled at twice one GPU's pace). The lock files
found in each TMPDIR afterwards are listed (where ncu put its lock).

    python3 scripts/gpu/ncu_lock_probe.py --out DIR [--gpus 0,1] [--kernels 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats")

TARGET = (
    "import torch\n"
    "a = torch.randn(2048, 2048, device='cuda', dtype=torch.half)\n"
    "torch.cuda.synchronize()\n"
    "for _ in range({n}):\n"
    "    torch.mm(a, a)\n"
    "torch.cuda.synchronize()\n"
)


def run_ncu(gpu: int, tmpdir: str, n: int, report: Path, t0: float, out: dict) -> None:
    """One ncu process on GPU `gpu`; fills `out` with its PROF line times, exit code and tail."""
    argv = ["ncu", *[a for s in SECTIONS for a in ("--section", s)], "--cache-control", "all",
            "--clock-control", "none", "-c", str(n), "-f", "-o", str(report),
            sys.executable, "-c", TARGET.format(n=n)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TMPDIR": tmpdir}
    times, tail = [], []
    with open(report.with_suffix(".log"), "w") as log:
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout is not None
        for line in p.stdout:
            log.write(line)
            if line.startswith("==PROF== Profiling"):
                times.append(time.perf_counter() - t0)
            tail = (tail + [line.rstrip()])[-5:]
        p.wait()
    out.update(gpu=gpu, tmpdir=tmpdir, times=times, rc=p.returncode, tail=tail,
               end=time.perf_counter() - t0)


def overlap(wins: list[tuple[float, float]]) -> float:
    if len(wins) < 2:
        return 0.0
    (a0, b0), (a1, b1) = wins[:2]
    return max(0.0, min(b0, b1) - max(a0, a1))


def config(name: str, gpus: list[int], shared: bool, n: int, outdir: Path) -> dict:
    base = Path(tempfile.mkdtemp(prefix=f"ncu_probe_{name}_", dir=outdir))
    dirs = [str(base)] * len(gpus) if shared else [str(base / f"gpu{g}") for g in gpus]
    for d in dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    outs: list[dict] = [{} for _ in gpus]
    threads = [threading.Thread(target=run_ncu, args=(g, d, n, outdir / f"{name}_gpu{g}", t0, o))
               for g, d, o in zip(gpus, dirs, outs, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [(min(o["times"]), max(o["times"])) for o in outs if o.get("times")]
    union = (max(b for _, b in wins) - min(a for a, _ in wins)) if wins else 0.0
    kernels = sum(len(o.get("times") or []) for o in outs)
    locks = sorted(str(p.relative_to(base)) for p in base.rglob("*lock*"))
    return {"config": name, "gpus": gpus, "shared_tmpdir": shared, "wall_s": round(time.perf_counter() - t0, 2),
            "windows_s": [[round(a, 2), round(b, 2)] for a, b in wins], "overlap_s": round(overlap(wins), 2),
            "kernels": kernels, "rate": kernels / union if union > 0 else None, "lock_files": locks,
            "rc": [o.get("rc") for o in outs], "tails": [o.get("tail") for o in outs]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpus", default="0,1")
    ap.add_argument("--kernels", type=int, default=60)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = [int(g) for g in args.gpus.split(",")]
    rows = [config("one", gpus[:1], False, args.kernels, args.out),
            config("shared", gpus[:2], True, args.kernels, args.out),
            config("separate", gpus[:2], False, args.kernels, args.out)]
    (args.out / "ncu_lock_probe.json").write_text(json.dumps(rows, indent=1))
    one = rows[0]["rate"]
    print("ncu lock probe: config, windows (s), overlap (s), kernels, kernels/s over the windows, x one GPU, lock files, exit")
    for r in rows:
        x = f"{r['rate'] / one:.2f}x" if r["rate"] and one else "n/a"
        rate = f"{r['rate']:.2f}" if r["rate"] else "n/a"
        print(f"  {r['config']:9s} {r['windows_s']} overlap {r['overlap_s']} s, {r['kernels']} kernels, "
              f"{rate}/s, {x}, locks {r['lock_files']}, rc {r['rc']}")
        if any(rc for rc in r["rc"]):
            for t in r["tails"]:
                print("    " + " | ".join(t or []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
