"""How `faprof profile --ncu --gpus 0,1` divides the ncu work over GPUs, what it expects, what it saw.

Nsight Compute serializes kernel profiling between processes through a lock file,
`TMPDIR/nsight-compute-lock` (TMPDIR of each ncu process; /tmp when unset). The fan-out gives each
GPU's ncu process its own TMPDIR, hence its own lock file (`FAPROF_NCU_LOCK=per-gpu`, the default);
`FAPROF_NCU_LOCK=shared` leaves every part on this process's TMPDIR, one lock file, as two ncu
commands typed by hand would be: the parts then take turns, kernel by kernel. Whether the GPUs do
profile at once is measured on every fanned-out run: each part's profiled-kernel times (as its
progress lines arrive here) give its profiling window and its seconds per kernel; the record says
how long two or more windows were open at once, each part's pace against one ncu process's on this
GPU (from the cost cache: about 1x when the GPUs profiled at once, about Nx when N parts took turns
kernel by kernel, which overlapping windows alone cannot show), and how the stage compares with the
plan's two predictions (all parts at once, or one kernel at a time).

The split weighs each (variant, shape) pair by the kernels it is expected to profile (kernels per
call seen on this GPU before, from the ncu cost cache; 1 where unknown), so the parts end together
rather than holding the same number of pairs.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from faprof.errors import FaprofError

#: FAPROF_NCU_LOCK values: 'per-gpu' gives each GPU's ncu process its own TMPDIR (its own
#: nsight-compute-lock); 'shared' keeps this process's TMPDIR for all (one lock, ncu's default).
LOCK_MODES = ("per-gpu", "shared")
DEFAULT_LOCK_MODE = "per-gpu"

#: Below this share of the stage with two or more parts profiling at once, the windows are called
#: serial: the parts' ncu processes took turns as wholes (a lock held for a whole process).
SERIAL_OVERLAP_SHARE = 0.1


def lock_mode(env: Mapping[str, str] | None = None) -> str:
    """FAPROF_NCU_LOCK, checked ('per-gpu' when unset)."""
    raw = (env if env is not None else os.environ).get("FAPROF_NCU_LOCK", "").strip() or DEFAULT_LOCK_MODE
    if raw not in LOCK_MODES:
        raise FaprofError(f"FAPROF_NCU_LOCK must be one of {', '.join(LOCK_MODES)}, got {raw!r}")
    return raw


def part_env(base: Mapping[str, str], gpu: int, tmpdir: str, mode: str) -> dict[str, str]:
    """The environment of GPU `gpu`'s part process: pinned to that GPU, TMPDIR per part unless `mode`
    is 'shared', and FAPROF_NCU_PART set (a part does not teach the cost cache its timings)."""
    env = {**base, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONUNBUFFERED": "1",
           "FAPROF_NCU_PART": "1"}
    if mode == "per-gpu":
        env["TMPDIR"] = tmpdir
    return env


def pair_weights(pairs: Sequence[tuple[str, str]], calls: int, seen_pairs: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """Kernels each pair is expected to profile: calls x kernels per call seen on this GPU (1 unknown)."""
    out = {}
    for v, s in pairs:
        entry = seen_pairs.get(f"{v}|{s}") or {}
        out[(v, s)] = max(int(calls), 1) * max(int(entry.get("kernels_per_call") or 1), 1)
    return out


def split_weighted(pairs: Sequence[tuple[str, str]], n: int,
                   weights: Mapping[tuple[str, str], float] | None = None) -> list[tuple[list[str], list[str]]]:
    """Split (variant, shape_id) pairs into at most `n` parts of (variants, shapes) selectors.

    By shape when there are at least `n` shapes (each part: every variant, some shapes), else by
    variant; greedy, heaviest key first onto the lightest part, a pair weighing `weights[pair]`
    (1 when not given). Every pair is in exactly one part's variants x shapes."""
    variants = list(dict.fromkeys(v for v, _ in pairs))
    shapes = list(dict.fromkeys(s for _, s in pairs))
    by_shape = len(shapes) >= n or len(variants) < 2
    keys = shapes if by_shape else variants
    w = weights or {}
    weight = {k: sum(float(w.get((v, s), 1)) for v, s in pairs if (s if by_shape else v) == k) for k in keys}
    bins: list[list[str]] = [[] for _ in range(min(n, len(keys)))]
    loads = [0.0] * len(bins)
    for k in sorted(keys, key=lambda k: -weight[k]):
        i = loads.index(min(loads))
        bins[i].append(k)
        loads[i] += weight[k]
    out = []
    for b in bins:
        chosen = [k for k in keys if k in b]  # scenario order inside a part
        out.append((variants, chosen) if by_shape else (chosen, shapes))
    return [p for p in out if p[0] and p[1]]


@dataclass
class PartPlan:
    """One GPU's share of the ncu work."""

    gpu: int
    variants: list[str]
    shapes: list[str]
    pairs: int
    kernels: int
    """Kernels expected (pair weights summed)."""


def plan_parts(pairs: Sequence[tuple[str, str]], gpus: Sequence[int],
               weights: Mapping[tuple[str, str], int]) -> list[PartPlan]:
    """The parts `split_weighted` makes, one per GPU (in `gpus` order), with their expected kernels."""
    out = []
    for gpu, (vs, ss) in zip(gpus, split_weighted(pairs, len(gpus), weights), strict=False):
        mine = [p for p in pairs if p[0] in vs and p[1] in ss]
        out.append(PartPlan(gpu, vs, ss, len(mine), sum(int(weights.get(p, 1)) for p in mine)))
    return out


def expected_wall(parts: Sequence[PartPlan], seconds_per_kernel: float, overhead_s: float) -> dict[str, float]:
    """The stage's wall time predicted two ways: 'parallel' (each GPU profiles its kernels at once with
    the others: the largest part decides) and 'serial' (start-ups overlap, kernels take turns)."""
    ks = [p.kernels for p in parts] or [0]
    return {"parallel": overhead_s + max(ks) * seconds_per_kernel,
            "serial": overhead_s + sum(ks) * seconds_per_kernel}


#: What the plan says about scaling, from Nsight Compute's documentation and a measurement.
SERIALIZES = ("Nsight Compute serializes kernel profiling across processes, whatever the lock file (its "
              "Profiling Guide: some GPU and driver objects can only be acquired by a single process at a time); "
              "on two H100s the l4_causal ncu stage took 51.1 s against 56.3 s on one (docs/measure/ncu-multi-gpu.md): "
              "expect the serialized figure")


def plan_lines(parts: Sequence[PartPlan], expected: Mapping[str, float], mode: str, eta_source: str) -> list[str]:
    """The fan-out's plan as printed: the GPUs, each one's share, the two predicted wall times."""
    share = "; ".join(f"GPU {p.gpu}: {p.pairs} pair(s), ~{p.kernels} kernel(s)" for p in parts)
    gpus = ", ".join(str(p.gpu) for p in parts)
    lock = ("one lock file per GPU (each part's own TMPDIR/nsight-compute-lock)" if mode == "per-gpu" else
            "one shared lock file (FAPROF_NCU_LOCK=shared): the GPUs take turns, kernel by kernel")
    return [
        f"ncu fan-out over GPUs {gpus}: {share} (split by expected kernels)",
        f"ncu fan-out: {lock}; expected ~{expected['parallel']:.0f} s if the GPUs profile at once, "
        f"~{expected['serial']:.0f} s if ncu serializes them ({eta_source})",
        f"ncu fan-out: {SERIALIZES}",
    ]


def windows(times: Mapping[int, Sequence[float]]) -> dict[int, tuple[float, float]]:
    """Each part's profiling window: (first, last) time a profiled kernel was reported (parts with one)."""
    return {g: (min(ts), max(ts)) for g, ts in times.items() if ts}


def overlap_s(wins: Mapping[int, tuple[float, float]]) -> float:
    """Seconds during which two or more windows were open at once."""
    events = sorted([(a, 1) for a, _ in wins.values()] + [(b, -1) for _, b in wins.values()])
    total, depth, last = 0.0, 0, 0.0
    for t, d in events:
        if depth >= 2:
            total += t - last
        depth, last = depth + d, t
    return total


def concurrency(times: Mapping[int, Sequence[float]], wall_s: float, expected: Mapping[str, float] | None,
                seconds_per_kernel: float | None = None) -> dict[str, Any]:
    """What the parts did together: their windows, the seconds two or more profiled at once, each
    part's seconds per kernel, and the stage's wall time against the two predictions.

    Overlapping windows alone do not show that the GPUs profiled at once: a lock taken per kernel
    lets both processes advance in turn. `seconds_per_kernel` (one ncu process's pace on this GPU,
    from the cost cache) tells the two apart: `pace_vs_one` near 1, each part kept one GPU's pace
    (they profiled at once); near the number of parts, they took turns kernel by kernel."""
    wins = windows(times)
    ov = overlap_s(wins)
    out: dict[str, Any] = {
        "windows_s": {str(g): [round(a, 2), round(b, 2)] for g, (a, b) in wins.items()},
        "overlap_s": round(ov, 2),
        "kernels_by_gpu": {str(g): len(ts) for g, ts in times.items()},
    }
    pace = {g: (wins[g][1] - wins[g][0]) / (len(ts) - 1) for g, ts in times.items() if len(ts) >= 2}
    if pace:
        out["seconds_per_kernel_by_gpu"] = {str(g): round(v, 3) for g, v in pace.items()}
        if seconds_per_kernel:
            out["pace_vs_one"] = round(statistics.median(pace.values()) / seconds_per_kernel, 2)
    if len(wins) >= 2:
        span = max(b for _, b in wins.values()) - min(a for a, _ in wins.values())
        out["windows"] = "serial" if span <= 0 or ov < SERIAL_OVERLAP_SHARE * span else "overlapping"
    if expected:
        out["expected_s"] = {k: round(v, 1) for k, v in expected.items()}
        out["closer_to"] = min(expected, key=lambda k: abs(expected[k] - wall_s))
    return out


def summary_line(c: Mapping[str, Any], wall_s: float) -> str:
    """One log line from `concurrency`'s record."""
    line = f"ncu fan-out: {wall_s:.1f} s; profiling windows overlapped {c.get('overlap_s', 0):.1f} s"
    if "pace_vs_one" in c:
        line += f"; seconds per kernel {c['pace_vs_one']:.2f}x one GPU's"
    if "expected_s" in c:
        e = c["expected_s"]
        line += (f"; predicted {e['parallel']:.0f} s at once / {e['serial']:.0f} s serialized: "
                 f"closer to {'at once' if c.get('closer_to') == 'parallel' else 'serialized'}")
    return line
