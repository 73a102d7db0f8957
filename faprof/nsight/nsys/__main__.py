"""`python -m faprof.nsight.nsys capture|parse ...`: the pieces of `faprof profile --nsys`, by hand.

capture: run the target under nsys into OUT (report, SQLite, plan, log, timings.json, tables).
parse: print the summary of an existing export.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.nsight.nsys.capture import PROFILE_TIMEOUT_S, env_for_target, run_capture, run_export
from faprof.nsight.nsys.command import DEFAULT_ITERS, nsys_command
from faprof.nsight.nsys.find import check_importer, find_nsys, nsys_version
from faprof.nsight.nsys.read import read_kernels
from faprof.nsight.nsys.tables import summarize


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run `capture` or `parse`.

    Args:
        argv: the arguments (default: sys.argv[1:]).

    Returns:
        The exit status: 0 done; 1 nsys made no report; 2 no nsys.
    """
    ap = argparse.ArgumentParser(prog="python -m faprof.nsight.nsys",
                                 description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--scenario", required=True)
    c.add_argument("--variants", required=True)
    c.add_argument("--shapes", default=None)
    c.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    c.add_argument("--user-variants", action="append", default=[])
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--name", default="nsys")
    c.add_argument("--timeout", type=float, default=PROFILE_TIMEOUT_S)
    p = sub.add_parser("parse")
    p.add_argument("sqlite", type=Path)
    p.add_argument("--plan", type=Path, default=None)
    p.add_argument("--measurements", type=Path, default=None)
    a = ap.parse_args(argv)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    return _parse(a) if a.cmd == "parse" else _capture(a)


def _parse(a: argparse.Namespace) -> int:
    """Print the summary of an existing export (with its plan and the bundle's measurements when given)."""
    plan = json.loads(a.plan.read_text()) if a.plan else None
    kernels = read_kernels(a.sqlite, plan)
    meas = pd.read_parquet(a.measurements) if a.measurements else None
    print(summarize(kernels, meas, plan).drop(columns=["kernel_names"]).to_string())
    return 0


def _capture(a: argparse.Namespace) -> int:
    """Capture, export and read into `a.out`, and write what happened to `<name>_timings.json`."""
    nsys = find_nsys()
    if nsys is None:
        print("nsys not found", file=sys.stderr)
        return 2
    ok, message = check_importer(nsys)
    print(f"nsys {nsys} ({nsys_version(nsys)}); importer: {message}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    base, plan_path = a.out / a.name, a.out / f"{a.name}_plan.json"
    cmd = nsys_command(nsys, base, a.scenario, a.variants.split(","), a.iters, plan_path,
                       shapes=a.shapes.split(",") if a.shapes else None, user_variants=a.user_variants)
    print(shlex.join(cmd), flush=True)
    cap = run_capture(cmd, base, a.out / f"{a.name}.log", timeout_s=a.timeout, env=env_for_target(),
                      on_message=lambda m: print(m, flush=True))
    timings: dict[str, Any] = {"argv": cmd, "rc": cap.rc, "wall_s": cap.wall_s, "report_after_s": cap.report_after_s,
                               "stopped": cap.stopped, "qdstrm_removed": cap.qdstrm_removed}
    if cap.report is not None:
        t0 = time.monotonic()
        ok, out = run_export(nsys, cap.report, a.out / f"{a.name}.sqlite", env=env_for_target())
        timings.update(export_ok=ok, export_s=time.monotonic() - t0, export_out=out[-2000:])
        if ok:
            plan = json.loads(plan_path.read_text()) if plan_path.exists() else None
            kernels = read_kernels(a.out / f"{a.name}.sqlite", plan)
            summary = summarize(kernels, None, plan)
            kernels.to_parquet(a.out / f"{a.name}_kernels.parquet", index=False)
            summary.to_parquet(a.out / f"{a.name}_summary.parquet", index=False)
            print(summary.drop(columns=["kernel_names"]).to_string())
    (a.out / f"{a.name}_timings.json").write_text(json.dumps(timings, indent=1, default=str))
    print(json.dumps({k: v for k, v in timings.items() if k != "argv"}, default=str))
    return 0 if cap.report is not None else 1


if __name__ == "__main__":
    sys.exit(main())
