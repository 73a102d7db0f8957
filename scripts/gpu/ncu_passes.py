"""How many replay passes each part of faprof's Nsight Compute set costs (run on a GPU machine).

The `faprof` set took 33 passes per kernel on the H100 against `full`'s 39 (issue 10): this prints
the passes ncu reports for each section alone, the sections together, the catalogue's extra metrics
alone, and the whole set, profiling one small fused-attention kernel (SDPA flash, fp16), so the set
can be cut where the passes are.

    python scripts/gpu/ncu_passes.py [--ncu PATH]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGET = """
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
"""


def passes(ncu: str, args: list[str]) -> str:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "t.py"
        script.write_text(TARGET)
        cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:flash", "--launch-count", "1", *args,
               sys.executable, str(script)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.findall(r"(\d+) pass", r.stdout + r.stderr)
    return m[-1] if m else f"? (rc {r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]})"


def main() -> int:
    import torch

    from faprof.nsight.ncu import catalogue as ncu_catalogue
    from faprof.nsight.ncu import command as ncu_command
    from faprof.nsight.ncu import find as ncu_find

    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", default=None)
    a = ap.parse_args()
    ncu = a.ncu or str(ncu_find.find_ncu() or "ncu")
    p = torch.cuda.get_device_properties(0)
    metrics = ncu_catalogue.requested_metrics((p.major, p.minor), ncu_find.query_metrics(ncu))
    rows: list[tuple[str, str]] = []
    for s in ncu_command.FAPROF_SECTIONS:
        rows.append((f"section {s}", passes(ncu, ["--section", s])))
    secs = ncu_command.set_args("faprof")
    rows.append(("faprof sections, no extra metrics", passes(ncu, secs)))
    rows.append((f"catalogue metrics alone ({len(metrics)})", passes(ncu, ["--metrics", ",".join(metrics)])))
    rows.append(("faprof set (sections + metrics)", passes(ncu, [*secs, "--metrics", ",".join(metrics)])))
    for s in ("basic", "full"):
        rows.append((f"--set {s}", passes(ncu, ["--set", s])))
    print(f"\n=== ncu replay passes on {p.name} (one flash-attention kernel) ===")
    for name, n in rows:
        print(f"{name:48} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
