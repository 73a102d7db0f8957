"""The baselines on today's problems, on a GPU, without the harness: each one checked against the
definition (fp32 on the GPU, one KV head group at a time) and timed, with the path it took.

    python3 scripts/gpu/gpu_modern_baselines.py [--scenarios llama3_70b_decode,...] [--reps 30] [--out DIR]

For every problem of the named scenarios and every baseline it lists (torch_standard, sdpa_*, flex):
max |error| against the definition, a verdict against a dtype-scaled bound, the median of `reps`
CUDA-event timings with the L2 flushed before each (a 2x-L2 write then read), TFLOP/s, GB/s of the
minimum traffic (K/V once per KV head) and its share of a device-to-device copy measured in the same
run. Prints a table last and writes it as CSV under --out. A quick check of the baselines the full
pipeline (`faprof profile --scenario ...`) then measures with CUPTI.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

import faprof.variants  # noqa: F401  (registers the variants)
from faprof.correctness import layouts
from faprof.model import variant as registry
from faprof.model.problem import AttentionProblem
from faprof.model.scenarios import load_scenario
from faprof.timing import env, gpu_clock
from faprof.variants.definition import assemble_q, attend, sequence_views

#: |error| bound per dtype for the quick verdict (bf16 keeps 8 mantissa bits; attention averages).
BOUND = {"bf16": 3e-2, "fp16": 4e-3, "fp32": 1e-4}


def reference(p: AttentionProblem, q, k, v, args):
    """fp32 definition on the GPU, one sequence and one KV head (with its query heads) at a time."""
    g = p.group
    outs = []
    for sv in sequence_views(p, q, k, v, args):
        parts = [attend(p, sv.q[h * g:(h + 1) * g].float(), sv.k[h:h + 1].float(), sv.v[h:h + 1].float())
                 for h in range(p.kv_heads)]
        outs.append(torch.cat(parts, dim=0))
    return assemble_q(p, outs)


def time_call(fn, reps: int, flush) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        flush()
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="llama3_70b_decode,llama3_8b_prefill,mistral_window,varlen_packed")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default="/tmp")
    a = ap.parse_args()
    flush = gpu_clock.L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size)
    ceiling = env.measure_ceilings()["copy_gbs"]  # the run's device-to-device copy, read + written
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, copy ceiling {ceiling:.0f} GB/s")
    rows = []
    for scn in a.scenarios.split(","):
        s = load_scenario(scn)
        for p in s.problems:
            g = torch.Generator().manual_seed(0)
            q, k, v, _, args = layouts.make_layout_inputs(p, "cuda", g)
            ref = reference(p, q, k, v, args)
            for name in s.variants:
                try:
                    var = registry.get(name)
                except Exception:
                    continue
                if var.kind not in ("torch",):
                    continue
                ok, why = var.supports(p, cuda_available=True)
                row = {"scenario": scn, "problem": p.label, "variant": name}
                if not ok:
                    rows.append({**row, "status": "unsupported", "note": why[:70]})
                    continue
                kw = {"attn": args} if var.features else {}

                def fn(var=var, kw=kw, q=q, k=k, v=v, p=p):
                    return var.fn(q, k, v, p.causal, p.softmax_scale, **kw)

                try:
                    t0 = time.perf_counter()
                    out = fn()
                    torch.cuda.synchronize()
                    first = time.perf_counter() - t0
                    err = (torch.nan_to_num(out.float(), nan=float("inf")) - ref).abs().max().item()
                    ms = time_call(fn, a.reps, flush)
                except Exception as e:  # a refusal or a crash: said, not hidden
                    rows.append({**row, "status": "error", "note": f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"})
                    continue
                path = var.path_of(p, q, k, v, args if var.features else None) if var.path_of else ""
                gbps = p.min_bytes() / (ms * 1e-3) / 1e9
                rows.append({**row, "status": "ok" if err <= BOUND[p.dtype] else "WRONG", "max_err": f"{err:.2e}",
                             "us": f"{ms * 1e3:.1f}", "TFLOP/s": f"{p.flops() / (ms * 1e-3) / 1e12:.1f}",
                             "GB/s": f"{gbps:.0f}", "%copy": f"{100 * gbps / ceiling:.0f}",
                             "first_s": f"{first:.1f}", "note": path[:70]})
                del out
            del q, k, v, ref
            torch.cuda.empty_cache()
    cols = ["scenario", "problem", "variant", "status", "max_err", "us", "TFLOP/s", "GB/s", "%copy", "first_s", "note"]
    out = Path(a.out) / "modern_baselines.csv"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print(f"\ncopy ceiling {ceiling:.0f} GB/s (device-to-device copy, read + write); {out}")
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
