"""The evidence the rules read: a bundle's tables regrouped per call and per kernel launch.

Every table is optional. A `Call` is one (variant, shape_id): its measured row, its nsys row and
its ncu launches; a `Launch` is one profiled kernel launch: its ncu_summary row, every metric ncu
recorded for it (the long ncu_metrics table, read by name), its stall shares and its roofline row.
Metric names come from the catalogue (`faprof.nsight.ncu.catalogue`), by concept key: the first
name a report holds wins, and a metric a set did not collect is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from faprof.model.values import as_float
from faprof.nsight.ncu import catalogue

#: Tables diagnose() reads, by bundle file stem.
TABLES = ("measurements", "ncu_summary", "ncu_metrics", "stalls", "roofline", "nsys_summary", "nsys_kernels",
          "ncu_rules", "source_lines")

def ok(x: Any) -> bool:
    """True for a real number (not NaN, not None)."""
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def nansum(*xs: float) -> float:
    vals = [x for x in xs if ok(x)]
    return float(sum(vals)) if vals else math.nan


@dataclass
class Launch:
    """One profiled kernel launch."""

    kernel: str
    kernel_id: int
    launch: int
    row: dict[str, Any]
    metrics: dict[str, float]
    cc: str | None
    stalls: list[tuple[str, float]] = field(default_factory=list)  # (reason, share), largest first
    roofline: dict[str, Any] = field(default_factory=dict)
    share: float = math.nan  # of the call's profiled GPU time

    def col(self, name: str) -> float:
        """A numeric ncu_summary column (NaN when absent)."""
        return as_float(self.row.get(name))

    def metric(self, key: str) -> float:
        """A metric by catalogue concept key (`faprof.nsight.ncu.catalogue`); NaN when the report
        lacks it. A key the catalogue does not know is a KeyError: every metric a rule reads is
        one the catalogue can request (tests/test_advise_metrics.py)."""
        for n in catalogue.names_for(key, self.cc):
            v = self.metrics.get(n)
            if v is not None and ok(v):
                return float(v)
        return math.nan

    def stall_share(self, *reasons: str) -> float:
        shares = dict(self.stalls)
        vals = [shares[r] for r in reasons if r in shares]
        return float(sum(vals)) if vals else math.nan

    @property
    def duration_ms(self) -> float:
        return self.col("duration_ms")

    @property
    def grid(self) -> float:
        return self.col("grid_size")

    @property
    def sms(self) -> float:
        return self.col("sm_count")


@dataclass
class Call:
    """One (variant, shape_id): what was measured about it."""

    variant: str
    shape_id: str
    measurement: dict[str, Any] = field(default_factory=dict)
    nsys: dict[str, Any] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    analytic_flops: float = math.nan
    rules: list[dict[str, Any]] = field(default_factory=list)  # ncu's own rule results

    def problem(self, key: str) -> Any:
        return self.measurement.get(key)

    @property
    def dtype(self) -> str | None:
        d = self.measurement.get("dtype")
        return str(d) if isinstance(d, str) else None

    @property
    def profiled_ms(self) -> float:
        return nansum(*(lz.duration_ms for lz in self.launches))


@dataclass
class Tables:
    """A bundle's tables (empty frames for those not collected) and its environment."""

    frames: dict[str, pd.DataFrame]
    env: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    """The bundle's manifest where known (declared aliases, baselines, variant order)."""

    def get(self, name: str) -> pd.DataFrame:
        df = self.frames.get(name)
        return df if isinstance(df, pd.DataFrame) else pd.DataFrame()


def tables_from(source: Any) -> Tables:
    """Tables from a Bundle, a Tables, or a mapping {table name: DataFrame} (plus optional 'env')."""
    if isinstance(source, Tables):
        return source
    if isinstance(source, Mapping):
        frames = {k: v for k, v in source.items() if isinstance(v, pd.DataFrame)}
        env = source.get("env") if isinstance(source.get("env"), dict) else {}
        manifest = source.get("manifest") if isinstance(source.get("manifest"), dict) else {}
        return Tables(frames, dict(env or {}), dict(manifest or {}))
    read = getattr(source, "read", None)
    if callable(read):
        # the rows as every view reads them (a foreign table refused, old rows re-judged: an impossible time
        # is untrusted here too, never a timed row to explain or compare with)
        rows = getattr(source, "measurements", None)
        frames = {name: rows() if name == "measurements" and callable(rows) else read(name) for name in TABLES}
        try:
            manifest = dict(source.manifest() or {})
        except Exception:  # a bundle without a readable manifest still has tables
            manifest = {}
        return Tables(frames, manifest.get("env", {}) or {}, manifest)
    raise TypeError(f"diagnose() takes a Bundle or a mapping of tables, not {type(source).__name__}")


def _metric_dicts(metrics: pd.DataFrame) -> dict[int, dict[str, float]]:
    if metrics.empty or not {"kernel_id", "metric", "value"} <= set(metrics.columns):
        return {}
    m = metrics[metrics["value"].notna()]
    out: dict[int, dict[str, float]] = {}
    for kid, g in m.groupby("kernel_id", sort=False):
        vals = pd.to_numeric(g["value"], errors="coerce")
        out[int(kid)] = dict(zip(g["metric"], vals, strict=True))
    return out


def _stalls(stalls: pd.DataFrame) -> dict[int, list[tuple[str, float]]]:
    if stalls.empty or not {"kernel_id", "reason", "share", "source"} <= set(stalls.columns):
        return {}
    src = "warp_state" if (stalls["source"] == "warp_state").any() else str(stalls["source"].iloc[0])
    s = stalls[(stalls["source"] == src) & stalls["share"].notna()]
    out: dict[int, list[tuple[str, float]]] = {}
    for kid, g in s.groupby("kernel_id", sort=False):
        g = g.sort_values("share", ascending=False)
        out[int(kid)] = [(str(r), float(v)) for r, v in zip(g["reason"], g["share"], strict=True)]
    return out


def _roofline(roof: pd.DataFrame) -> dict[int, dict[str, Any]]:
    if roof.empty or "kernel_id" not in roof.columns:
        return {}
    r = roof[roof["ceiling_source"] == "ncu"] if "ceiling_source" in roof.columns else roof
    return {int(k): dict(g.iloc[0]) for k, g in r.groupby("kernel_id", sort=False) if int(k) >= 0}


def calls_from(tables: Tables) -> list[Call]:
    """One Call per (variant, shape_id) found in any table, in measurement order."""
    calls: dict[tuple[str, str], Call] = {}

    def call(v: Any, s: Any) -> Call:
        key = (str(v), str(s))
        if key not in calls:
            calls[key] = Call(*key)
        return calls[key]

    meas = tables.get("measurements")
    if not meas.empty and {"variant", "shape_id"} <= set(meas.columns):
        for r in meas.to_dict("records"):
            call(r["variant"], r["shape_id"]).measurement = r
    ns = tables.get("nsys_summary")
    if not ns.empty and {"variant", "shape_id"} <= set(ns.columns):
        for r in ns.to_dict("records"):
            if r.get("status", "ok") == "ok":
                call(r["variant"], r["shape_id"]).nsys = r
    summ = tables.get("ncu_summary")
    if not summ.empty and {"variant", "shape_id", "kernel"} <= set(summ.columns):
        mdicts = _metric_dicts(tables.get("ncu_metrics"))
        stalls = _stalls(tables.get("stalls"))
        roof = _roofline(tables.get("roofline"))
        for r in summ.to_dict("records"):
            c = call(r["variant"], r["shape_id"])
            if r["kernel"] == "(all)":
                c.analytic_flops = as_float(r.get("analytic_flops"))
                continue
            kid = int(as_float(r.get("kernel_id"))) if ok(as_float(r.get("kernel_id"))) else -1
            cc = r.get("cc") if isinstance(r.get("cc"), str) and r.get("cc") else None
            c.launches.append(Launch(str(r["kernel"]), kid, int(as_float(r.get("launch")) or 0), r, mdicts.get(kid, {}),
                                     cc, stalls.get(kid, []), roof.get(kid, {})))
            if not ok(c.analytic_flops):
                c.analytic_flops = as_float(r.get("analytic_flops"))
    rules = tables.get("ncu_rules")
    if not rules.empty and {"variant", "shape_id"} <= set(rules.columns):
        for r in rules.to_dict("records"):
            if (str(r["variant"]), str(r["shape_id"])) in calls:
                calls[(str(r["variant"]), str(r["shape_id"]))].rules.append(r)
    for c in calls.values():
        c.launches.sort(key=lambda lz: lz.launch)
        total = c.profiled_ms
        for lz in c.launches:
            lz.share = lz.duration_ms / total if ok(total) and total > 0 and ok(lz.duration_ms) else math.nan
    return list(calls.values())
