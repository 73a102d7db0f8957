"""Labels for people: column names with units, run titles, problem labels, short chart ticks.

Shared by the dashboard (faprof/app) and the reports; nothing here reads a bundle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd

LABELS: dict[str, str] = {
    "median_ms": "median latency (ms)",
    "mean_ms": "mean latency (ms)",
    "min_ms": "min latency (ms)",
    "std_ms": "std (ms)",
    "ci95_low_ms": "95% CI low (ms)",
    "ci95_high_ms": "95% CI high (ms)",
    "e2e_ms": "end-to-end (ms)",
    "graph_ms": "CUDA graph (ms)",
    "host_enqueue_ms": "host enqueue (ms)",
    "tflops": "TFLOP/s",
    "pct_peak": "% of peak",
    "peak_tflops": "peak (TFLOP/s)",
    "pct_measured_ceiling": "% of measured ceiling",
    "gbps": "GB/s (min traffic)",
    "pct_bw": "% of DRAM bandwidth",
    "pct_copy": "% of the measured copy bandwidth",
    "copy_gbs": "measured copy bandwidth (GB/s)",
    "bound": "bound (compute or memory)",
    "path": "kernel path the library took",
    "Hkv": "KV heads",
    "speedup": "speedup (x)",
    "baseline_ms": "baseline (ms)",
    "max_abs_err": "max |error|",
    "rel_err": "relative error",
    "rtol": "tolerance (rel)",
    "atol": "tolerance (abs)",
    "seq_len": "sequence length Sq (tokens)",
    "kv_len": "KV length Sk (tokens)",
    "flops": "FLOPs per call",
    "problem": "problem",
    "config": "problem (without S)",
    "variant": "variant",
    "gpu": "GPU",
    "run": "run",
    "status": "status",
    "reason": "reason",
    "extra_mem_bytes": "extra memory (bytes)",
    "peak_mem_bytes": "peak memory (bytes)",
    "tokens_per_s": "tokens/s",
    "n": "samples",
    "intensity": "arithmetic intensity (FLOP/byte)",
    "median_tflops": "median TFLOP/s",
    "max_tflops": "max TFLOP/s",
    "median_pct_peak": "median % of peak",
    "median_speedup": "median speedup (x)",
    "fwd_ms": "forward (ms)",
    "bwd_ms": "backward (ms)",
    "fwd_bwd_ms": "forward + backward (ms)",
    "bwd_over_fwd": "backward / forward",
    "footprint_standard_bytes": "standard footprint (bytes, analytic)",
    "footprint_flash_bytes": "flash footprint (bytes, analytic)",
    "measured_reduction": "measured reduction (x)",
    "analytic_reduction": "analytic reduction (x)",
    "status_a": "status A",
    "status_b": "status B",
    "median_ms_a": "median A (ms)",
    "median_ms_b": "median B (ms)",
    "n_a": "samples A",
    "n_b": "samples B",
    "ratio": "B / A",
    "change_pct": "change (%)",
    "p_value": "p-value",
    "significant": "significant at 5%",
    "verdict": "verdict",
    "shape_id": "shape id",
    "reference": "reference",
    "problems": "problems",
    "rows": "rows",
}
"""Human labels (with units) for the schema's column names: axis titles and table headers."""


def label(column: str) -> str:
    """The human label of a column (its name when there is none)."""
    return LABELS.get(column, column)

CPU_LABEL = "CPU (no GPU)"
"""The `gpu` value of runs made without a GPU: a machine, but not a GPU (never counted as one)."""


def gpu_label(env: dict[str, Any]) -> str:
    """The machine a run measured: the GPU's name, or 'CPU (no GPU)'."""
    return env.get("gpu_name") or CPU_LABEL


def machine_count(gpus: Iterable[Any]) -> tuple[int, bool]:
    """(how many distinct GPUs, whether a CPU-only run is among them) for a column of `gpu` labels."""
    seen = {str(g) for g in gpus}
    return len(seen - {CPU_LABEL}), CPU_LABEL in seen


def machines_phrase(gpus: Iterable[Any]) -> str:
    """'2 GPUs', '1 GPU and the CPU', 'the CPU only', 'no GPU': what a scenario was measured on."""
    n, cpu = machine_count(gpus)
    head = f"{n} GPU{'s' * (n != 1)}" if n else ""
    if cpu:
        return f"{head} and the CPU" if head else "the CPU only"
    return head or "no GPU"


def parse_stamp(stamp: str | None) -> datetime | None:
    """A bundle's UTC stamp ('20261121T192450Z') as a datetime (None if absent or malformed)."""
    if not stamp:
        return None
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def run_title(manifest: dict[str, Any]) -> str:
    """A short name for a run in menus and legends: 'GPU · scenario · date'."""
    when = parse_stamp(manifest.get("created_utc"))
    date = when.strftime("%Y-%m-%d %H:%M") if when else manifest.get("run_id", "?")
    return f"{gpu_label(manifest.get('env') or {})} · {(manifest.get('scenario') or {}).get('name', '?')} · {date}"


def _present(r: pd.Series | dict[str, Any], col: str) -> Any:
    v = r.get(col)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def heads_text(r: pd.Series | dict[str, Any]) -> str:
    """'H=32' or, for grouped-query heads, 'H=32/8kv' (bundles from before GQA have no Hkv column)."""
    hkv = _present(r, "Hkv")
    h = r.get("H")
    return f"H={h}" if hkv is None or h is None or int(hkv) == int(h) else f"H={h}/{int(hkv)}kv"


def mask_text(r: pd.Series | dict[str, Any]) -> str:
    """' causal', ' causal (bottom-right)', ' causal win 4095,0', ' paged/256', ' varlen 16384 tok' or ''."""
    mask = _present(r, "mask")
    words = ""
    if mask is None:  # a bundle from before masks had names
        words = " causal" if bool(r.get("causal")) else ""
    else:
        m = str(mask)
        words = (" causal" if m.startswith("causal") else "") + (" (bottom-right)" if "_br" in m or m.endswith("br")
                                                                 else "")
        win = _present(r, "window")
        if win is not None:
            left, right = json.loads(win) if isinstance(win, str) else win
            words += f" win {left},{right}"
    cap = _present(r, "softcap")
    if cap:
        words += f" cap {cap:g}"
    layout = _present(r, "layout")
    if layout == "varlen":
        words += f" varlen {_present(r, 'total_q')} tok"
    elif layout == "paged":
        words += f" paged/{_present(r, 'page_size')}"
    return words


def problem_label(r: pd.Series | dict[str, Any]) -> str:
    """'B=4 H=8 S=128 D=64 fp16 causal' (+ ' bwd' for backward rows; Hkv, window, layout where set): a
    problem, in full."""
    sq, sk = r.get("Sq"), r.get("Sk")
    s = f"S={sq}" if sq == sk else f"Sq={sq} Sk={sk}"
    d = "" if r.get("direction") in (None, "fwd") else f" {r.get('direction')}"
    return f"B={r.get('B')} {heads_text(r)} {s} D={r.get('D')} {r.get('dtype')}{mask_text(r)}{d}"

def config_label(r: pd.Series | dict[str, Any]) -> str:
    """A problem without its sequence length: 'B=1 H=2 D=32 fp32 causal' (one line of a chart; the mask
    is always named, 'full' or 'causal', so two lines that differ by it have distinct names)."""
    mask = mask_text(r).strip() or "full"
    d = "" if r.get("direction") in (None, "fwd") else f" {r.get('direction')}"
    return f"B={r.get('B')} {heads_text(r)} D={r.get('D')} {r.get('dtype')} {mask}{d}"


def problem_order(df: pd.DataFrame) -> list[str]:
    """Problem labels ordered by dtype, then FLOPs, then label: a category order for charts."""
    if df.empty:
        return []
    # Problems of one dtype stay together (a scenario may repeat its shapes in another dtype), then FLOPs.
    # Bundles from before every row carried its FLOPs have NaN on unsupported rows: take the max.
    agg = {c: ("max" if c == "flops" else "first") for c in ("dtype", "flops") if c in df.columns}
    t = df.groupby("problem", as_index=False).agg(agg) if agg else df[["problem"]].drop_duplicates()
    return t.sort_values([*agg, "problem"], na_position="last")["problem"].tolist()


def short_labels(labels: Sequence[str]) -> tuple[dict[str, str], str]:
    """Problem labels without the words they all share, for chart ticks that fit.

    Returns:
        (label -> short label, the shared words): ['B=1 S=64 fp32', 'B=2 S=64 fp32'] gives
        {'B=1 S=64 fp32': 'B=1', ...} and 'S=64 fp32'. A label left empty keeps its full text.
    """
    uniq = list(dict.fromkeys(str(x) for x in labels))
    if len(uniq) < 2:
        return {u: u for u in uniq}, ""
    words = [u.split() for u in uniq]
    common = [w for w in words[0] if all(w in ws for ws in words[1:])]
    out = {}
    for u, ws in zip(uniq, words, strict=True):
        short = " ".join(w for w in ws if w not in common)
        out[u] = short or u
    return out, " ".join(common)


