"""The profiled process: runs a scenario's (variant, problem) pairs inside NVTX ranges for ncu/nsys.

Run as `python -m faprof.nsight.target --scenario S --tool ncu|nsys [--variants a,b] [--iters N]
--plan-out FILE` under ncu or nsys. For every pair it supports it:

1. builds fresh random inputs on the GPU and warms the variant up (3 calls) inside an NVTX range
   `faprof_warmup` (outside the ranges the profilers select);
2. runs `iters` calls inside nested NVTX ranges: `<variant>` > `<shape_id>` > `iter<i>`, so a kernel's
   range stack reads `variant/shape_id/iter0` — ncu selects with `--nvtx-include "variant/"`
   and nsys joins kernels to ranges through their launch's correlationId. Under ncu the same three
   names are also opened as start/end (process-wide) ranges, selected with `--nvtx-include
   "variant"`: a backward's kernels are launched by autograd's own thread, outside the caller's
   push/pop ranges. Under nsys each call is
   preceded by the harness's L2 flush (`gpu_clock.L2Flusher`), outside the `iter` range, so the capture
   sees a cold L2 as the timing harness does; under ncu `--cache-control all` flushes instead.

For nsys the measured region is bracketed by cudaProfilerStart/Stop (`--capture-range=cudaProfilerApi`).
The plan file (JSON) lists every pair with its problem and whether it ran, so parsers can map
`shape_id` back to the problem and know what was skipped and why.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from faprof import variants
from faprof.correctness import check as correctness
from faprof.model.plan import plan
from faprof.model.scenarios import load_scenario
from faprof.timing import gpu_clock
from faprof.variants import build

WARMUP_RANGE = "faprof_warmup"
WARMUP_CALLS = 3


@contextmanager
def nvtx_range(name: str, process: bool = False):
    """A push/pop range `name` on this thread; with `process`, also a start/end (process-wide) range
    of the same name.

    Push/pop ranges belong to the thread that pushed them, and PyTorch's autograd engine launches a
    CUDA backward from its own device thread, so the kernels of `torch.autograd.grad` are outside
    every push/pop range of the caller. A start/end range is open for every thread of the process:
    ncu selects it with `--nvtx-include <name>` (no '/') and lists it under the kernel's start/end
    ranges, which is how faprof attributes backward kernels (measured with ncu 2025.3 on an H100:
    `pp/` caught none of SDPA's three backward kernels, the start/end range all three).
    """
    import torch

    rid = torch.cuda.nvtx.range_start(name) if process else None
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
        if rid is not None:
            torch.cuda.nvtx.range_end(rid)


def run(scenario_spec: str, tool: str, variant_names: list[str] | None, iters: int, plan_out: Path,
        shapes: list[str] | None = None, user_variants: list[str] | None = None) -> int:
    import torch


    for spec in user_variants or []:
        variants.load_user_variants(spec)
    if not torch.cuda.is_available():
        print("faprof.nsight.target: no CUDA GPU visible; nothing to profile", file=sys.stderr)
        return 3
    scenario = load_scenario(scenario_spec)
    pairs = plan(scenario, variant_names)
    if shapes:
        pairs = [(p, v) for p, v in pairs if p.shape_id in set(shapes)]
    entries: list[dict[str, Any]] = []
    if any(v.needs_extension for _, v in pairs):

        build.load()

    profiling = False
    # nsys times calls back to back: flush the L2 before each one, outside its `iter` range, so the
    # capture sees the same cold L2 as the harness (ncu flushes caches itself: --cache-control all).
    flush = None
    if tool == "nsys":
        flush = gpu_clock.L2Flusher(int(torch.cuda.get_device_properties(0).L2_cache_size))

    def start() -> None:
        nonlocal profiling
        if tool == "nsys" and not profiling:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            profiling = True

    current_shape, inputs = None, None
    for problem, variant in pairs:
        entry: dict[str, Any] = {"variant": variant.name, "shape_id": problem.shape_id, "problem": problem.to_dict(),
                                 "iters": iters, "ran": False, "reason": ""}
        entries.append(entry)
        ok, reason = variant.supports(problem, cuda_available=True)
        if not ok or variant.resolved_device(True) != "cuda":
            entry["reason"] = reason or "runs on the CPU: no kernels to profile"
            continue
        try:
            if inputs is None or current_shape != problem.shape_id:
                inputs = correctness.make_inputs(problem, "cuda")
                current_shape = problem.shape_id
            ts, dout = correctness.prepare(problem, inputs, "cuda", variant.name)
            out = torch.empty_like(ts[0]) if variant.kind in ("cuda", "user") and problem.direction == "fwd" else None
            _, call = correctness.make_call(variant, problem, ts, dout, out, inputs.args)
            with nvtx_range(WARMUP_RANGE):
                for _ in range(WARMUP_CALLS):
                    call()
            torch.cuda.synchronize()
            start()
            process = tool == "ncu"  # nsys joins kernels to ranges by launch correlation (nsys.py)
            with nvtx_range(variant.name, process), nvtx_range(problem.shape_id, process):
                for i in range(iters):
                    if flush is not None:
                        flush()
                    with nvtx_range(f"iter{i}", process):
                        call()
            torch.cuda.synchronize()
            entry["ran"] = True
        except Exception as e:  # one failing pair must not lose the others' profiles
            entry["reason"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            traceback.print_exc()
            msg = str(e).lower()
            if "illegal" in msg or "launch failure" in msg:
                break  # the CUDA context is gone; what ran so far is in the report
        finally:
            plan_out.write_text(json.dumps({"scenario": scenario.name, "tool": tool, "pairs": entries}, indent=1))
    if profiling:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    plan_out.write_text(json.dumps({"scenario": scenario.name, "tool": tool, "pairs": entries}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faprof.nsight.target", description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--tool", choices=["ncu", "nsys", "none"], required=True)
    ap.add_argument("--variants", default=None, help="comma-separated variant names (default: the scenario's)")
    ap.add_argument("--shapes", default=None, help="comma-separated shape_ids to keep")
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--plan-out", type=Path, required=True)
    ap.add_argument("--user-variants", action="append", default=[])
    a = ap.parse_args(argv)
    names = [v for v in a.variants.split(",") if v] if a.variants else None
    shapes = [s for s in a.shapes.split(",") if s] if a.shapes else None
    return run(a.scenario, a.tool, names, a.iters, a.plan_out, shapes, a.user_variants)


if __name__ == "__main__":
    sys.exit(main())
