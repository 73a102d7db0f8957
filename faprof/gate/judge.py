"""`faprof gate BASELINE CANDIDATE`: a CI regression gate over two run bundles: verdicts, provenance, why rows moved.

For every (variant, shape_id[, gpu_name]) row of the two bundles the gate gives one verdict:

- `faster` / `slower` / `same` / `ambiguous`: both sides timed; each row's Hodges-Lehmann shift
  (`faprof.analysis.comparison.shift`), judged with the other rows of its kernel and the GPU model's
  between-run noise floor (`faprof.analysis.comparison.pool`, `faprof.gate.noise`: two runs of one
  commit differ by more than either run's samples say) against the practical threshold
  (`--threshold`, a scenario's `[gate] threshold`, else `DEFAULT_THRESHOLD`);
- `wrong` / `failed`: the candidate's row is wrong or failed: a regression, whatever the baseline;
- `untimed`: not timed on a side (unsupported, skipped, or failed on the baseline), listed only;
- `missing`: the row is in one bundle only, listed only.

Provenance comes first: GPU model, driver, CUDA/torch, cuDNN, nvcc, the SM clock during the rows,
power cap and throttle flags, the GPU timer and ncu. Different GPU models refuse (a FaprofError,
exit 2) unless `allow_mismatch`; every other difference is a warning, and rows whose SM clocks
differ get a clock-normalised ratio beside the raw one. Regressed rows get the ncu counters and
stall shares that moved most and the advisor findings that appeared or vanished, when both bundles
have ncu tables.

Exit codes (`GateResult.exit_code`): `EXIT_OK` nothing slower, `EXIT_REGRESSION` a row slower,
wrong or failed, `EXIT_AMBIGUOUS` no regression but rows the data cannot decide. Rows timed by the
host clock (CPU rows) get verdicts but gate nothing unless `include_host`: the same commit's
`cpu_ref` rows moved by 1.09-1.57x between two runs on one H200 (examples/runs/h200x2, run1 and
run2 of g1), which no threshold for GPU kernels would absorb.

Only bundles are read here; re-timing ambiguous rows is a callback (`Retime`) the caller passes in
(`faprof.run.gate_runs.retime`), so the gate itself only reads bundles.

Modules: the rows' verdicts (`faprof.gate.verdicts`) and the provenance checks
(`faprof.gate.provenance`); this one reads and pairs the two bundles and runs the gate
(`run_gate`); import each name from the module that defines it (or from `faprof.gate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from faprof.analysis import aliases, comparison
from faprof.analysis.comparison import pool as gate_pool
from faprof.analysis.comparison.shift import SLOWER
from faprof.errors import FaprofError
from faprof.gate.provenance import Check, provenance
from faprof.gate.verdicts import (
    GATE_COLUMNS,
    VERDICT_ORDER,
    GateOptions,
    apply_reruns,
    judge_row,
    pool_verdicts,
    row_record,
    rows_to_retime,
)
from faprof.gate.why_moved import Nsight, why_moved
from faprof.model.scenarios import gate_threshold
from faprof.rows import stats
from faprof.rows.noise_floor import NoiseFloor, load_floors
from faprof.store import Bundle

#: The relative change that counts when neither --threshold nor the scenario says: three runs of one
#: commit on one H200 (examples/runs/h200x2 run1-3, g1, 300 row pairs timed by CUPTI) differed by a
#: median 0.5%, 1.3% at the 95th percentile and 2.6% at most.
DEFAULT_THRESHOLD = 0.02

#: Exit code: no row slower, wrong or failed, and none ambiguous.
EXIT_OK = 0
#: Exit code: at least one gated row is slower, or a candidate row is wrong or failed.
EXIT_REGRESSION = 1
#: Exit code: no regression, but gated rows that may be one: their kernel looks slower past the
#: threshold, not significantly (faprof.analysis.comparison.pool), or the row's own interval reaches past it
#: where it could not be judged with its kernel (2 is a usage error, 3 is `faprof profile`'s failed rows).
EXIT_AMBIGUOUS = 4

#: Re-times (variant, shape_id) rows of the candidate on this machine; returns the new bundles.
Retime = Callable[[Bundle, list[tuple[str, str]]], list[Bundle]]


@dataclass
class GateResult:
    """The gate's answer: provenance, one verdict per row, what re-timing did."""

    baseline: dict[str, Any]
    """The baseline bundle: run_id, path, scenario, gpu_name, git_sha, has_ncu."""
    candidate: dict[str, Any]
    """The candidate bundle, likewise."""
    threshold: float
    """The relative change that counted."""
    threshold_source: str
    """Where it came from: '--threshold', the scenario's [gate] table, or 'default'."""
    confidence: float
    """Confidence level of the rows' intervals."""
    checks: list[Check]
    """Provenance, item by item."""
    rows: pd.DataFrame
    """One row per compared row (GATE_COLUMNS): regressions first, then undecided rows."""
    notes: list[str] = field(default_factory=list)
    """Things said once (ncu missing on a side, rows re-timed where)."""
    reruns: list[str] = field(default_factory=list)
    """Bundles written by --rerun-ambiguous / --confirm."""
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    """One row per variant and GPU model judged on all its rows (`gate_pool.units_table`)."""

    @property
    def warnings(self) -> list[str]:
        return [c.note for c in self.checks if c.level == "warn" and c.note]

    def count(self, verdict_name: str, gated_only: bool = False) -> int:
        r = self.rows
        if r.empty:
            return 0
        sel = r["verdict"] == verdict_name
        if gated_only:
            sel &= r["gated"].astype(bool)
        return int(sel.sum())

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows["regression"].astype(bool)] if not self.rows.empty else self.rows

    @property
    def undecided(self) -> pd.DataFrame:
        """Gated ambiguous rows that may be regressions (`EXIT_AMBIGUOUS`)."""
        return self.rows[self.rows["undecided"].astype(bool)] if not self.rows.empty else self.rows

    @property
    def exit_code(self) -> int:
        if not self.regressions.empty:
            return EXIT_REGRESSION
        if not self.undecided.empty:
            return EXIT_AMBIGUOUS
        return EXIT_OK

    @property
    def outcome(self) -> str:
        """'fail', 'ambiguous' or 'pass' (the exit code in words)."""
        return {EXIT_REGRESSION: "fail", EXIT_AMBIGUOUS: "ambiguous"}.get(self.exit_code, "pass")


# ----------------------------------------------------------------------------- threshold
def parse_threshold(text: str) -> float:
    """`--threshold` as a fraction: '2%' or '0.02' -> 0.02.

    Raises:
        FaprofError: not a number, or outside (0, 1) as a fraction.
    """
    s = text.strip()
    try:
        value = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
    except ValueError:
        raise FaprofError(f"--threshold {text!r}: give a fraction (0.02) or a percentage (2%)") from None
    if not 0 < value < 1:
        raise FaprofError(f"--threshold {text!r}: the relative change that counts must be between 0 and 100% "
                          "(0.02 or 2% for two percent)")
    return value


def resolve_threshold(explicit: float | None, baseline: Bundle, candidate: Bundle) -> tuple[float, str]:
    """The threshold and where it came from: --threshold, else the candidate's scenario's (or the
    baseline's) `[gate] threshold`, else DEFAULT_THRESHOLD."""
    if explicit is not None:
        if not 0 < explicit < 1:
            raise FaprofError(f"threshold {explicit}: give a fraction between 0 and 1 (0.02 for 2%)")
        return explicit, "--threshold"
    for side, b in (("candidate", candidate), ("baseline", baseline)):
        scn = b.manifest().get("scenario") or {}
        raw = scn.get("raw")
        if isinstance(raw, dict):
            t = gate_threshold(raw, f"{b.path}/manifest.json scenario")
            if t is not None:
                return t, f"[gate] threshold of the {side}'s scenario {scn.get('name')}"
    return DEFAULT_THRESHOLD, "default"


# ----------------------------------------------------------------------------- reading the sides
def _measurements(b: Bundle) -> pd.DataFrame:
    """A bundle's rows with the columns the gate reads (None where an older bundle lacks them)."""
    df = aliases.as_planned(b)  # an older side's declared aliases fold as a run of this faprof times them
    env = b.manifest().get("env") or {}
    for c in ("gpu_name", "timer", "sm_clock_mhz", "throttled", "throttle_reasons", "samples_ms", "median_ms",
              "status", "reason", "check_reason", "dtype", "device", "timing_flagged", "timing_flag_reason"):
        if c not in df.columns:
            df[c] = None
    df["gpu_name"] = df["gpu_name"].where(df["gpu_name"].notna(), env.get("gpu_name") or "CPU only")
    return df


def _models(df: pd.DataFrame) -> list[str]:
    return sorted({str(g) for g in df["gpu_name"].dropna()})


def _pair_rows(da: pd.DataFrame, db: pd.DataFrame, join_on_gpu: bool) -> pd.DataFrame:
    m = comparison.pair(da, db, on_gpu=join_on_gpu)
    if not join_on_gpu:
        m["gpu_name"] = m["gpu_name_b"].where(m["gpu_name_b"].notna(), m["gpu_name_a"])
    return m


# ----------------------------------------------------------------------------- the gate
def _info(b: Bundle) -> dict[str, Any]:
    m = b.manifest()
    env = m.get("env") or {}
    return {"run_id": b.run_id, "path": str(b.path), "scenario": (m.get("scenario") or {}).get("name"),
            "gpu_name": env.get("gpu_name"), "git_sha": env.get("git_sha"), "has_ncu": not b.read("ncu_summary").empty}


def _rerun_rows(bundles: Sequence[Bundle], want_gpu: dict[tuple[str, str], str], cand_sha: Any,
                notes: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """The re-timed rows by (variant, shape_id): those on the candidate's GPU model only."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for nb in bundles:
        env = nb.manifest().get("env") or {}
        if cand_sha and env.get("git_sha") and env.get("git_sha") != cand_sha:
            notes.append(f"re-timed at commit {env.get('git_sha')}, the candidate was measured at {cand_sha}: "
                         "the re-timed rows measure this tree's code")
        for r in _measurements(nb).to_dict("records"):
            key = (r["variant"], r["shape_id"])
            if key not in want_gpu:
                continue
            if str(r["gpu_name"]) != want_gpu[key]:
                notes.append(f"{key[0]} {key[1]} was re-timed on {r['gpu_name']}, not the candidate's "
                             f"{want_gpu[key]}: its samples are not pooled")
                continue
            out[key] = r
    return out


def run_gate(baseline: Bundle, candidate: Bundle, options: GateOptions | None = None,
             retime: Retime | None = None) -> GateResult:
    """Gate CANDIDATE against BASELINE.

    Args:
        baseline: the reference bundle (in CI, usually a committed one).
        candidate: the bundle of the change under test.
        options: threshold, --allow-mismatch, --include-host, confidence, --confirm, the noise floors.
        retime: when given, every timed row of a kernel with an undecided row (with options.confirm,
            or a slower one) is re-timed through it (on this machine); each re-timed row is a second
            candidate run in the between-run noise model, and the verdicts are given again.

    Returns:
        The GateResult: regressions first, then undecided rows, then the rest in VERDICT_ORDER,
        the largest ratio first within each.

    Raises:
        FaprofError: the GPU models differ without allow_mismatch (one line naming the flag), a
            bad threshold, or bundles with no rows.
    """
    options = options or GateOptions()
    paired, checks, threshold, source = _read_sides(baseline, candidate, options)
    notes: list[str] = []
    samples_b = {i: stats.as_samples(r.get("samples_ms_b")) for i, r in paired.iterrows()}
    judged = {i: judge_row(r, samples_b[i], threshold, options) for i, r in paired.iterrows()}
    floors: list[NoiseFloor] = [] if (options.noise_floor or "").lower() == "none" else load_floors(options.noise_floor)
    extra: dict[int, list[tuple[float, float]]] = {}  # re-timed candidate runs' (shift, error) per row
    final, units, pool_notes = pool_verdicts(paired, judged, extra, floors, threshold, options)
    reruns: list[str] = []
    rerun_n: dict[int, int] = {}
    if retime is not None:
        todo = rows_to_retime(paired, judged, final, options.confirm)
        if todo:
            new_bundles = retime(candidate, list(dict.fromkeys(todo.values())))
            reruns = [str(nb.path) for nb in new_bundles]
            want = {key: str(paired.at[i, "gpu_name_b"] if "gpu_name_b" in paired else paired.at[i, "gpu_name"])
                    for i, key in todo.items()}
            got = _rerun_rows(new_bundles, want, (candidate.manifest().get("env") or {}).get("git_sha"), notes)
            rerun_n = apply_reruns(paired, todo, got, judged, extra, threshold, options)
            final, units, pool_notes = pool_verdicts(paired, judged, extra, floors, threshold, options)
    notes += [n for n in pool_notes if n not in notes]
    rows = _rows_table(paired, final, rerun_n)
    _attach_why(rows, baseline, candidate, notes)
    return GateResult(_info(baseline), _info(candidate), threshold, source, options.confidence, checks,
                      _ordered(rows), notes, reruns, pd.DataFrame(gate_pool.units_table(units)))


def _read_sides(baseline: Bundle, candidate: Bundle, options: GateOptions) -> tuple[pd.DataFrame, list[Check], float, str]:
    """Both bundles' rows paired (index 0..n-1), their provenance, and the threshold with its source.

    Raises:
        FaprofError: a bundle with no rows, a bad threshold, or GPU models that differ without
            allow_mismatch.
    """
    da, db = _measurements(baseline), _measurements(candidate)
    if da.empty or db.empty:
        empty = baseline if da.empty else candidate
        raise FaprofError(f"{empty.path} has no measurements: nothing to gate (finish the run with "
                          f"`faprof profile --resume {empty.path}`)")
    threshold, source = resolve_threshold(options.threshold, baseline, candidate)
    ma_models, mb_models = _models(da), _models(db)
    join_on_gpu = not (options.allow_mismatch and len(ma_models) == 1 and len(mb_models) == 1)
    paired = _pair_rows(da, db, join_on_gpu)
    checks = provenance(baseline, candidate, paired, (ma_models, mb_models), options.allow_mismatch)
    refused = [c for c in checks if c.level == "refuse"]
    if refused:
        c = refused[0]
        raise FaprofError(f"refusing to gate: {c.note}; run both on one GPU model, or pass --allow-mismatch "
                          "to compare anyway")
    return paired.reset_index(drop=True), checks, threshold, source


def _rows_table(paired: pd.DataFrame, final: dict[int, dict[str, Any]], rerun_n: dict[int, int]) -> pd.DataFrame:
    """One row per compared row (GATE_COLUMNS), in the paired order, the re-timed samples counted in."""
    records = []
    for i, r in paired.iterrows():
        rec = row_record(r, final[i])
        rec["rerun_samples"] = rerun_n.get(i, 0)
        if i in rerun_n:
            rec["n_candidate"] += rerun_n[i]
        records.append(rec)
    return pd.DataFrame(records, columns=list(GATE_COLUMNS))


def _ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """Regressions first, then undecided rows, then the rest in VERDICT_ORDER; the largest ratio first within each."""
    order = {v: k + 2 for k, v in enumerate(VERDICT_ORDER)}
    rank = rows["verdict"].map(order).where(~rows["undecided"].astype(bool), 1).where(~rows["regression"].astype(bool), 0)
    rows = rows.assign(_o=rank, _r=-rows["ratio"].fillna(0.0))
    rows = rows.sort_values(["_o", "_r", "variant", "shape_id"], kind="stable").drop(columns=["_o", "_r"])
    return rows.reset_index(drop=True)


def _attach_why(rows: pd.DataFrame, baseline: Bundle, candidate: Bundle, notes: list[str]) -> None:
    """Fill `why` on the regressed slower rows from both bundles' ncu tables (a note when a side has none)."""
    slower = rows.index[(rows["verdict"] == SLOWER) & rows["regression"].astype(bool)]
    if len(slower) == 0:
        return
    na, nb = Nsight.of(baseline), Nsight.of(candidate)
    if na.summary.empty or nb.summary.empty:
        sides = [s for s, n in (("baseline", na), ("candidate", nb)) if n.summary.empty]
        which = "neither bundle has any" if len(sides) == 2 else f"the {sides[0]} has none"
        notes.append(f"why rows moved needs ncu tables on both sides and {which} "
                     "(profile with --ncu, or run `faprof ncu RUN` on the bundle)")
        return
    for i in slower:
        rows.at[i, "why"] = why_moved(na, nb, rows.at[i, "variant"], rows.at[i, "shape_id"])
