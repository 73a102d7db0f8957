"""What the adversarial inputs cost: a scenario's correctness check with and without them, per shape.

For every shape of the scenario: the randn check (inputs, reference, and one checked call of every
variant that runs here) against the probes (their inputs and references, made once per shape, and
one checked call of every variant on each probe), wall-clock, on this machine. Timing itself is
not run. The issue's budget: the check with the probes costs at most 2x the check without them.

    python scripts/gpu/wrong_check_cost.py --scenario l4_causal [--variants a,b] [--repeat 3]

On a GPU machine the GPU variants run too; on a CPU-only one, the CPU variants (cpu_ref,
torch_standard, sdpa_math). Prints one line per shape and the totals; exits 1 if a correct-looking
variant is flagged by a probe (it names it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from faprof import variants
from faprof.correctness import adversarial
from faprof.correctness import check as correctness
from faprof.correctness.reference import compute_reference
from faprof.model.plan import plan
from faprof.model.scenarios import load_scenario
from faprof.timing import harness


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="l4_causal")
    ap.add_argument("--variants", default=None, help="comma-separated (default: the scenario's)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per shape; the median is reported")
    args = ap.parse_args()
    scn = load_scenario(args.scenario)
    cuda_ok = torch.cuda.is_available()
    dev = "cuda" if cuda_ok else "cpu"
    pairs = plan(scn, args.variants.split(",") if args.variants else None)
    shapes = list(dict.fromkeys(p for p, _ in pairs))
    flagged = []
    tot_base, tot_probe = 0.0, 0.0
    print(f"{'shape':44s} {'variants':>8s} {'randn check s':>14s} {'probes s':>9s} {'ratio':>6s}")
    for problem in shapes:
        vs = [v for p, v in pairs if p == problem and v.supports(problem, cuda_available=cuda_ok)[0]]
        if not vs:
            continue
        tol = scn.tolerance[problem.dtype]
        base_t, probe_t = [], []
        for rep in range(args.repeat):
            t0 = time.perf_counter()
            inputs = correctness.make_inputs(problem, dev, seed=1000 + rep)
            ref = compute_reference(problem, inputs, cuda_ok)
            for v in vs:
                correctness.check_correctness(v, problem, inputs, ref, v.resolved_device(cuda_ok), tol)
            _sync()
            t1 = time.perf_counter()
            ps = adversarial.ProbeSet(problem, dev, lambda p, i: compute_reference(p, i, cuda_ok),
                                      inputs.seed)
            for v in vs:
                d = v.resolved_device(cuda_ok)
                res = adversarial.run(ps, lambda p, v=v: v.supports(p, cuda_available=cuda_ok),
                                      harness.probe_checker(v, d, tol))
                flagged += [(v.name, problem.shape_id, rec["name"], rec["reason"]) for rec in res["probes"]
                            if rec["status"] not in ("ok", "skipped")]
            _sync()
            t2 = time.perf_counter()
            base_t.append(t1 - t0)
            probe_t.append(t2 - t1)
        b, pr = statistics.median(base_t), statistics.median(probe_t)
        tot_base += b
        tot_probe += pr
        print(f"{problem.shape_id:44s} {len(vs):8d} {b:14.3f} {pr:9.3f} {(b + pr) / b:6.2f}")
    print(f"{'total':44s} {'':8s} {tot_base:14.3f} {tot_probe:9.3f} {(tot_base + tot_probe) / tot_base:6.2f}"
          "  (ratio: check with probes / check without)")
    for name, sid, probe, reason in dict.fromkeys(flagged):
        print(f"FLAGGED {name} on {sid} by {probe}: {reason}", file=sys.stderr)
    return 1 if flagged else 0


if __name__ == "__main__":
    variants.all_variants()
    raise SystemExit(main())
