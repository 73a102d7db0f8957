"""The seed reports' published figures beside faprof's measurements (the GPUs page, cross-GPU views)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from faprof.analysis.load import SCENARIO_DIR, RunSet
from faprof.analysis.speed import timed
from faprof.errors import FaprofError
from faprof.model import gpus
from faprof.model.problem import AttentionProblem

# ---------------------------------------------------------------------------------- published
_REPORT_RE = (re.compile(r"seeds/(\d{3})_"), re.compile(r"[Rr]eport (\d{3})"))
_LATENCY_UNITS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "µs": 1e-3}


def report_number(*texts: str | None) -> str | None:
    """The seed report a scenario reproduces ('003'), from its source or description."""
    for t in texts:
        for rx in _REPORT_RE:
            m = rx.search(t or "")
            if m:
                return m.group(1)
    return None


def published_label(report: str | None, gpu: str) -> str:
    """Legend text of a published figure: 'published (report 003, NVIDIA L4)'."""
    return f"published (report {report}, {gpu})" if report else f"published ({gpu})"


def measured_label(gpu: str) -> str:
    """Legend text of a figure faprof measured: 'measured (faprof, NVIDIA H100 80GB HBM3)'."""
    return f"measured (faprof, {gpu})"


def _scenario_file_published(name: str) -> tuple[list[dict[str, Any]], str | None]:
    """[[published]] of a shipped scenario file, read as plain TOML (no variant validation, so a
    scenario naming a variant this faprof lacks still gives its figures)."""
    path = SCENARIO_DIR / f"{name}.toml"
    if not path.is_file():
        return [], None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return [], None
    pubs = [p for p in data.get("published", []) if isinstance(p, dict)]
    return pubs, report_number(str(data.get("source", "")), str(data.get("description", "")))


def published_figures(runset: RunSet, scenarios: Iterable[str] | None = None) -> pd.DataFrame:
    """The seed reports' published figures for the loaded scenarios, one row per figure.

    Figures come from the runs' manifests (the scenario as run), or from the shipped scenario file
    when no manifest carries them. A figure whose shape names a problem the runs measured gets that
    problem's label; a published latency of a fully given shape also gets `tflops` (faprof's FLOP
    count over the published time) and `pct_peak` (of the published GPU's peak in the database), so
    it can stand beside measured points in faprof's convention.

    Returns:
        Columns: scenario, report, source (the legend label), gpu, what, subject, value, unit, stat,
        maps_to, section, note, problem, ms, tflops, pct_peak.
    """
    wanted = set(scenarios) if scenarios is not None else None
    by_scenario: dict[str, tuple[list[dict[str, Any]], str | None]] = {}
    for m in runset.manifests.values():
        scen = m.get("scenario") or {}
        name = scen.get("name", "")
        if (wanted is not None and name not in wanted) or by_scenario.get(name, ([], None))[0]:
            continue
        pubs = [p for p in m.get("published") or [] if isinstance(p, dict)]
        report = report_number(scen.get("source"), (scen.get("raw") or {}).get("description"))
        if not pubs:
            pubs, file_report = _scenario_file_published(name)
            report = report or file_report
        by_scenario[name] = (pubs, report)
    rows = []
    meas = runset.measurements
    for name, (pubs, report) in by_scenario.items():
        probs = meas[meas["scenario"] == name] if not meas.empty else meas
        for p in pubs:
            rows.append(_published_row(name, report, p, probs))
    cols = ["scenario", "report", "source", "gpu", "what", "subject", "value", "unit", "stat", "maps_to",
            "section", "note", "problem", "ms", "tflops", "pct_peak"]
    return pd.DataFrame(rows, columns=cols)


def _published_row(scenario: str, report: str | None, p: dict[str, Any], probs: pd.DataFrame) -> dict[str, Any]:
    gpu = str(p.get("gpu", "?"))
    shape = dict(p.get("shape") or {})
    row: dict[str, Any] = {
        "scenario": scenario, "report": report, "source": published_label(report, gpu), "gpu": gpu,
        "what": p.get("what", ""), "subject": p.get("subject", ""), "value": p.get("value"),
        "unit": p.get("unit", ""), "stat": p.get("stat", ""), "maps_to": p.get("maps_to", ""),
        "section": p.get("section", ""), "note": p.get("note", ""), "problem": None,
        "ms": np.nan, "tflops": np.nan, "pct_peak": np.nan,
    }
    if "S" in shape:
        shape["Sq"] = shape["Sk"] = shape.pop("S")
    if shape and not probs.empty:
        mask = pd.Series(True, index=probs.index)
        for k, v in shape.items():
            if k in probs:
                mask &= probs[k] == v
        if "direction" not in shape and "direction" in probs:
            mask &= probs["direction"] == "fwd"
        matched = probs.loc[mask, "problem"].unique()
        if len(matched) == 1:
            row["problem"] = matched[0]
    unit = str(row["unit"])
    if row["what"] == "latency" and unit in _LATENCY_UNITS and isinstance(row["value"], int | float):
        row["ms"] = float(row["value"]) * _LATENCY_UNITS[unit]
        full = all(k in shape for k in ("B", "H", "Sq", "Sk", "D"))
        if full and row["ms"] > 0:
            row.update(_published_rates(gpu, shape, row["ms"]))
    return row


def _published_rates(gpu: str, shape: dict[str, Any], ms: float) -> dict[str, float]:

    try:
        prob = AttentionProblem(B=int(shape["B"]), H=int(shape["H"]), Sq=int(shape["Sq"]), Sk=int(shape["Sk"]),
                                D=int(shape["D"]), dtype=str(shape.get("dtype", "fp16")),
                                causal=bool(shape.get("causal", False)), direction=str(shape.get("direction", "fwd")))
    except (FaprofError, ValueError, TypeError):
        return {}
    out = {"tflops": prob.flops() / (ms * 1e-3) / 1e12}
    spec = gpus.lookup(gpu)
    if spec is not None:
        compute = "tensor" if prob.dtype in ("fp16", "bf16") else "cuda_core"
        peak, _ = gpus.peak_tflops(spec, prob.dtype, compute)
        if peak:
            out["pct_peak"] = 100.0 * out["tflops"] / peak
    return out


def gpu_comparison(df: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """Timed rows of one scenario, one per (machine, variant, problem), with a `source` label saying
    which GPU measured them. When one machine ran the scenario several times, the newest run's row
    is kept (run ids start with their UTC time), so a line never zigzags between runs at one x."""
    t = timed(df)
    if t.empty:
        return t
    t = t[t["scenario"] == scenario]
    if "run_id" in t and not t.empty:
        t = t.sort_values("run_id").drop_duplicates(["gpu", "variant", "shape_id"], keep="last")
    return t.assign(source=[measured_label(g) for g in t["gpu"]])


