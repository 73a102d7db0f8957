"""What one profiled kernel costs under Nsight Compute, per section set (run on a GPU machine).

Profiles 1 and then N (9) launches of a small fused-attention kernel (SDPA flash, fp16) under each
candidate set; the difference over N-1 is the cost of one kernel, apart from ncu's and Python's
start-up. Prints passes, wall seconds and seconds per kernel; with --sections-out, also copies
Nsight Compute's section and rule files (to read which metrics a rule needs).

    python scripts/gpu/ncu_cost.py [--ncu PATH] [--sections-out DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGET = """
import sys, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
n = int(sys.argv[1])
q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(n):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
"""


def run(ncu: str, args: list[str], n: int) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "t.py"
        script.write_text(TARGET)
        cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:flash", "--launch-count", str(n), *args,
               "-f", "-o", str(Path(d) / "r"), sys.executable, str(script), str(n)]
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t
    m = re.findall(r"(\d+) pass", r.stdout + r.stderr)
    return wall, (m[-1] if m else f"? rc {r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")


def main() -> int:
    import torch

    from faprof.nsight.ncu import catalogue as ncu_catalogue
    from faprof.nsight.ncu import command as ncu_command
    from faprof.nsight.ncu import find as ncu_find

    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", default=None)
    ap.add_argument("--sections-out", type=Path, default=None)
    ap.add_argument("--many", type=int, default=9, help="launches of the second run (default 9)")
    ap.add_argument("--full-breakdown", action="store_true",
                    help="instead: what each part of ncu's `full` set costs (sections left out one at a time, sampling options)")
    a = ap.parse_args()
    ncu = a.ncu or str(ncu_find.find_ncu() or "ncu")
    if a.sections_out:
        real = Path(shutil.which(ncu) or ncu).resolve()
        for cand in (real.parent / "sections", real.parent.parent / "sections",
                     *Path("/opt/nvidia/nsight-compute").glob("*/sections")):
            if cand.is_dir():
                shutil.copytree(cand, a.sections_out, dirs_exist_ok=True)
                print(f"sections from {cand}")
                break
    p = torch.cuda.get_device_properties(0)
    metrics = ncu_catalogue.requested_metrics((p.major, p.minor), ncu_find.query_metrics(ncu))
    mets = ["--metrics", ",".join(metrics)]
    base = list(ncu_command.FAPROF_SECTIONS)
    secs = lambda names: [x for s in names for x in ("--section", s)]  # noqa: E731
    configs = {
        "one metric (gpu__time_duration)": ["--metrics", "gpu__time_duration.sum"],
        "SpeedOfLight": secs(["SpeedOfLight"]),
        "faprof set today": [*ncu_command.set_args("faprof"), *mets],
        "faprof minus MWA_Tables": [*secs(base), *mets],
        "minus MWA_Tables, cache-control none": [*secs(base), *mets, "--cache-control", "none"],
        "LaunchStats+Occupancy+WarpStateStats + metrics": [*secs(["LaunchStats", "Occupancy", "WarpStateStats"]), *mets],
        "full": ["--set", "full"],
    }
    if a.full_breakdown:
        configs = full_breakdown(ncu)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", TARGET, "1"], check=True)
    bare = time.perf_counter() - t
    print(f"target without ncu: {bare:.1f} s")
    rows = []
    for name, args in configs.items():
        w1, p1 = run(ncu, args, 1)
        w9, p9 = run(ncu, args, a.many)
        rows.append((name, p9, w1, w9, (w9 - w1) / (a.many - 1)))
        print(f"{name}: passes {p9}, 1 kernel {w1:.1f} s, {a.many} kernels {w9:.1f} s", flush=True)
    print(f"\n{'set':48s} {'passes':>6s} {'1 kern s':>8s} {'N kern s':>8s} {'s/kernel':>8s}")
    for name, p, w1, w9, per in rows:
        print(f"{name:48s} {p:>6s} {w1:8.1f} {w9:8.1f} {per:8.2f}")
    return 0


def full_breakdown(ncu: str) -> dict[str, list[str]]:
    """`full` as its sections, then without each costly one, then with fewer sampling passes."""
    real = Path(shutil.which(ncu) or ncu).resolve()
    folder = next((c for c in (real.parent / "sections", real.parent.parent / "sections",
                               *Path("/opt/nvidia/nsight-compute").glob("*/sections")) if c.is_dir()), None)
    if folder is None:
        raise SystemExit("no sections folder next to ncu")
    full = []
    for f in sorted(folder.glob("*.section")):
        text = f.read_text(errors="replace")
        ident = re.search(r'^Identifier:\s*"([^"]+)"', text, re.M)
        if ident and re.search(r'Sets\s*\{[^}]*Identifier:\s*"full"', text):
            full.append(ident.group(1))
    print("full =", full)
    h = subprocess.run([ncu, "--help"], capture_output=True, text=True).stdout
    print("\n".join(line for line in h.splitlines() if "sampling" in line.lower()))
    secs = lambda names: [x for s in names for x in ("--section", s)]  # noqa: E731
    out = {"full (--set full)": ["--set", "full"]}
    for drop in ("PmSampling", "SourceCounters", "InstructionStats", "WarpStateStats", "MemoryWorkloadAnalysis_Tables"):
        if drop in full:
            out[f"full minus {drop}"] = secs([s for s in full if s != drop])
    if "--pm-sampling-max-passes" in h:
        out["full, --pm-sampling-max-passes 1"] = ["--set", "full", "--pm-sampling-max-passes", "1"]
    if "--warp-sampling-max-passes" in h:
        out["full, --warp-sampling-max-passes 1"] = ["--set", "full", "--warp-sampling-max-passes", "1"]
    return out


if __name__ == "__main__":
    sys.exit(main())
