"""Physical limits: a timed row whose figures the GPU cannot reach is never a result.

A row's achieved rates come from its median and the problem's exact work (`faprof.rows.derive`):
FLOP/s over the problem's FLOPs, bytes/s over its compulsory bytes (`AttentionProblem.min_bytes`:
each input read once, each output written once, keys no query sees left out). A median that skips
work, serves a cached result or times only part of the call shows up as a rate above what the GPU
can do. `judge` holds each timed GPU row against two ceilings:

- compute: the fastest dense path a kernel could take and still pass the check at the problem's
  precision (`compute_ceiling`): for fp16/bf16 the 16-bit tensor rates (fp16 accumulate where it is
  faster), for fp32 the tensor paths with an fp32 accumulator (TF32, and fp16/bf16 whose 10-bit
  mantissa is TF32's: faprof's fp32 tolerance accepts TF32), for fp64 twice the fp64 rate (DMMA); at
  the highest SM clock the GPU reports (`clock_allowance`), plus COMPUTE_MARGIN;
- memory: the datasheet DRAM bandwidth or the run's measured copy ceiling, whichever is higher,
  plus BYTES_MARGIN (the log-sum-exp a kernel may not write, rounding), for rows timed with a clean
  L2 (every input starts in DRAM; without the flush nothing bounds a rate by DRAM).

A row above either gets status `untrusted` (faprof.model.schema: timed, but its time is not a
result), the figure and the ceiling in its reason, and the flag. The same judgement runs when a
row is written (faprof.run.finish) and when any bundle is read (faprof.store), so a bundle written
by an older faprof is re-judged. `host_time` is the other judgement of what a kernel-time median
leaves out, made when a row is measured (faprof.timing.harness): a call whose host-clock time
dwarfs its kernel time (it computes on the host, or waits, or loops in Python) is flagged, and its
host time per call is the row's `host_ms`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from faprof.model import gpus
from faprof.model.values import as_float

#: Above the compute ceiling at the GPU's highest clock by more than this share: impossible (the
#: datasheet rates are exact products of units and clock; the margin covers clock readings).
COMPUTE_MARGIN = 0.05

#: Above the DRAM ceiling by more than this share: impossible (the margin covers the fp32 LSE that
#: a kernel need not write, index tensors and the datasheet's rounding).
BYTES_MARGIN = 0.10

#: A call whose host-clock time (call + synchronize) exceeds its kernel time by this factor ...
HOST_FACTOR = 10.0

#: ... and by this much per call spends its time outside kernels: host work or synchronisation.
#: Launch overhead and the Python of an honest library call stay below it: cuDNN's SDPA spent ~1.07 ms
#: per call outside a 5 µs kernel on the H100 (l4_causal, 2026-12-05); a call computed on the host, 17 ms.
HOST_ABS_MS = 5.0

UNTRUSTED = "untrusted"


def compute_ceiling(spec: gpus.GPUSpec, dtype: str) -> tuple[float | None, str]:
    """(TFLOP/s, label): the fastest dense rate of `spec` a kernel could use and still compute the
    problem at `dtype`'s precision (see the module docstring); None when the database lacks it."""
    if dtype == "fp64":
        v = spec.fp64_tflops
        return (2 * v, "twice the fp64 rate (DMMA)") if v else (None, "no fp64 rate")
    fields: tuple[str, ...] = ("fp16_tensor_tflops", "bf16_tensor_tflops", "tf32_tensor_tflops", "fp32_tflops")
    if dtype in ("fp16", "bf16"):  # bf16 values convert to fp16 exactly: either 16-bit path, any accumulator
        fields = ("fp16_tensor_fp16acc_tflops", *fields)
    rates = {f: getattr(spec, f) for f in fields if getattr(spec, f, None)}
    if not rates:
        return None, "no peak rates"
    best = max(rates, key=lambda f: rates[f])
    return rates[best], f"dense {best.replace('_tflops', '').replace('_', ' ')}"


def clock_allowance(spec: gpus.GPUSpec, env: Mapping[str, Any], dtype: str) -> float:
    """How much faster than its datasheet clock the GPU may run: its highest SM clock (nvidia-smi's
    max, else the spec's boost clock) over the clock the tensor peaks assume; at least 1."""
    peak_clock = spec.peak_clock_mhz("tensor", dtype if dtype in ("fp16", "bf16") else "fp16")
    top = max((v for v in (as_float(env.get("smi_max_sm_clock_mhz")), as_float(spec.boost_clock_mhz)) if v > 0),
              default=math.nan)
    if not (peak_clock and top > 0):
        return 1.0
    return max(1.0, top / peak_clock)


def ceilings(env: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The row ceilings of this GPU for `dtype`: {'tflops', 'tflops_label', 'gbs', 'gbs_label'}
    (values None where unknown). Unknown GPUs have none: nothing is judged there."""
    name = env.get("gpu_name")
    spec = gpus.lookup(str(name)) if name else None
    out: dict[str, Any] = {"tflops": None, "tflops_label": "", "gbs": None, "gbs_label": ""}
    if spec is None or not spec.known:
        return out
    peak, label = compute_ceiling(spec, dtype)
    if peak:
        allow = clock_allowance(spec, env, dtype)
        out["tflops"] = peak * allow * (1 + COMPUTE_MARGIN)
        out["tflops_label"] = (f"{label} {peak:.4g} TFLOP/s x {allow:.3f} (highest clock) + {COMPUTE_MARGIN:.0%}"
                               if allow > 1 else f"{label} {peak:.4g} TFLOP/s + {COMPUTE_MARGIN:.0%}")
    copy = as_float((env.get("ceilings") or {}).get("copy_gbs"))
    sheet = as_float(spec.mem_bw_gbs)
    bw = max((v for v in (copy, sheet) if v > 0), default=math.nan)
    if bw > 0:
        out["gbs"] = bw * (1 + BYTES_MARGIN)
        which = "measured copy" if copy > 0 and copy >= (sheet if sheet > 0 else 0) else "datasheet DRAM"
        out["gbs_label"] = f"{which} bandwidth {bw:.4g} GB/s + {BYTES_MARGIN:.0%}"
    return out


def impossible(row: Mapping[str, Any], env: Mapping[str, Any], flushed: bool = True) -> str | None:
    """Why the timed GPU row's rates exceed what its GPU can do, or None.

    Args:
        row: a measurement row (median_ms, flops, min_bytes, dtype, device, gpu_name).
        env: the run's environment (gpu_name, smi_max_sm_clock_mhz, ceilings).
        flushed: whether the row was timed with a clean L2 (the bytes ceiling applies only then).
    """
    if row.get("device") != "cuda":
        return None
    ms = as_float(row.get("median_ms"))
    if not ms > 0:
        return None
    gpu_env = {**env, "gpu_name": row.get("gpu_name") or env.get("gpu_name")}
    c = ceilings(gpu_env, str(row.get("dtype") or "fp16"))
    why = []
    flops = as_float(row.get("flops"))
    if c["tflops"] and flops > 0:
        tflops = flops / (ms * 1e-3) / 1e12
        if tflops > c["tflops"]:
            why.append(f"{tflops:,.0f} TFLOP/s is above what the GPU can do ({c['tflops']:,.0f}: "
                       f"{c['tflops_label']})")
    nbytes = as_float(row.get("min_bytes"))
    if flushed and c["gbs"] and nbytes > 0:
        gbs = nbytes / (ms * 1e-3) / 1e9
        if gbs > c["gbs"]:
            why.append(f"{gbs:,.0f} GB/s of compulsory traffic is above what the GPU's memory can move "
                       f"({c['gbs']:,.0f}: {c['gbs_label']}; the L2 was flushed before every call)")
    if not why:
        return None
    return (f"physically impossible: a median of {ms:.4g} ms means " + " and ".join(why)
            + "; the timed calls did not do the problem's work")


def host_time(row: Mapping[str, Any]) -> str | None:
    """Why a GPU row's kernel time is not the call's cost (host-clock time many times the kernel
    time: work on the host, or waiting), or None. Reads e2e_ms (call + synchronize) and median_ms."""
    if row.get("device") != "cuda" or str(row.get("timer") or "").startswith("host"):
        return None
    ms, e2e = as_float(row.get("median_ms")), as_float(row.get("e2e_ms"))
    if not (ms > 0 and e2e > 0):
        return None
    outside = e2e - ms
    if e2e > HOST_FACTOR * ms and outside > HOST_ABS_MS:
        return (f"the call spends {outside:.4g} ms outside kernels (host-clock {e2e:.4g} ms per call against "
                f"{ms:.4g} ms of kernel time): host work or synchronisation, so the kernel time is not the call's cost")
    return None


def judge(row: Mapping[str, Any], env: Mapping[str, Any], flushed: bool = True) -> dict[str, Any]:
    """The updates that make a timed row that breaks a physical limit `untrusted` (or, when it is
    wrong already, flagged): {} when it breaks none. Idempotent: a row judged before is unchanged.
    `flushed`: whether the L2 was flushed before the timed calls, for rows without `l2_flushed`."""
    status = row.get("status")
    if status not in ("ok", "wrong", UNTRUSTED):
        return {}
    own = str(row.get("l2_flushed"))
    if own in ("True", "False"):
        flushed = own == "True"  # the row says how it was timed; `flushed` is for rows that do not
    reason = impossible(row, env, flushed)
    if not reason:
        return {}
    old = [x for x in str(row.get("timing_flag_reason") or "").split("; ") if x]
    flag = "; ".join(dict.fromkeys([*old, reason]))
    out: dict[str, Any] = {"timing_flagged": True, "timing_flag_reason": flag}
    if status in ("ok", UNTRUSTED):
        out.update(status=UNTRUSTED, reason=reason)
    return out


def judge_frame(df: Any, env: Mapping[str, Any], flushed: bool = True) -> Any:
    """`df` (measurement rows) with every row judged (`judge`); the same frame when nothing changes."""
    if df.empty or "status" not in df.columns or "median_ms" not in df.columns:
        return df
    changes = {}
    for i, r in zip(df.index, df.to_dict("records"), strict=True):
        upd = judge(r, env, flushed)
        if upd and any(r.get(k) != v for k, v in upd.items()):
            changes[i] = upd
    if not changes:
        return df
    df = df.copy()
    for c in ("timing_flagged", "timing_flag_reason", "reason"):
        if c not in df.columns:
            df[c] = None
    df["timing_flagged"] = df["timing_flagged"].astype(object)
    for i, upd in changes.items():
        for k, v in upd.items():
            df.at[i, k] = v
    return df
