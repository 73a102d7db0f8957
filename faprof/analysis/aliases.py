"""Aliases: variants whose kernels at a shape are another variant's, shown once (one kernel, one row).

Two ways a variant is an alias of another at a shape:

- declared: the variant says so for the shape's direction (`Variant.aliases`; a bundle records the
  run's declared aliases in its manifest's settings, older bundles are read through the registry);
- detected, only when every record agrees (`same_kernel`): the kernels recorded for the two
  (variant, shape) calls are the same binaries launched alike — the same sequence of (kernel name,
  grid, block, registers per thread, shared memory) in every table that records both calls (the
  timed calls' CUPTI records, `kernel_sig`; Nsight Compute's `ncu_summary`, whose instruction
  counts must also agree within COUNT_REL; Nsight Systems' `nsys_kernels`), at least one table,
  covering the whole call (as many kernels as the CUPTI timer counted per call) — *and* their
  medians cannot be told apart by the GPU's between-run noise floor (`times_agree`). Variants of
  one Triton kernel that differ only in constexprs share the name, grid and block; their registers,
  shared memory, counts or times tell them apart. Anything less is two kernels, shown as two rows.

The canonical variant of a group is the declared target, else the run's baseline, else the first in
the run's order; the others are its aliases at that shape. `collapse` keeps the canonical row and
names the aliases in its `aliases` column (faprof.model.schema), so every view built on it — the
report's tables, charts and Why lines, the advisor's comparators, the dashboard — shows a kernel
once. Nothing here looks at variant names beyond the declarations: detection rests on the records.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from faprof import variants as _variants  # noqa: F401  (fills the registry: declarations of old bundles)
from faprof.analysis.speedups import baselines_of
from faprof.errors import FaprofError
from faprof.model import schema
from faprof.model import variant as registry
from faprof.model.plan import also_label
from faprof.model.values import as_float
from faprof.rows import noise_floor

#: Columns of the alias table: at shape_id, `variant` runs `canonical`'s kernels; how: declared / kernels.
ALIAS_COLUMNS = ("shape_id", "variant", "canonical", "how")

#: One launch as a kernel table records it: (name, grid, block, registers per thread, shared memory
#: bytes per block); registers and shared memory are None where the table lacks them.
Launch = tuple[str, str, str, int | None, int | None]

#: A call's record in one table: its launches in order, and (Nsight Compute only) each launch's counts.
Record = tuple[tuple[Launch, ...], tuple[tuple[float, ...], ...] | None]

#: Nsight Compute counts compared between two variants (the instruction mix each launch executed) ...
NCU_COUNTS = ("tensor_hmma_inst", "tensor_gmma_inst", "smem_inst", "global_ld_requests", "spill_inst", "hw_flops")

#: ... within this share: two launches of one binary on one problem execute the same instructions.
COUNT_REL = 0.01


def _text(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return str(x)


def _int(x: Any) -> int | None:
    v = as_float(x)
    return None if math.isnan(v) or math.isinf(v) else int(v)


def _ncu_records(summ: pd.DataFrame) -> dict[tuple[str, str], Record]:
    need = {"variant", "shape_id", "kernel"}
    if summ.empty or not need <= set(summ.columns):
        return {}
    s = summ[summ["kernel"] != "(all)"]
    order = [c for c in ("launch", "kernel_id") if c in s.columns]
    s = s.sort_values(["variant", "shape_id", *order], kind="stable")
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in s.to_dict("records"):
        out.setdefault((str(r["variant"]), str(r["shape_id"])), []).append(r)
    return {k: _ncu_record(rows) for k, rows in out.items()}


def _ncu_record(rows: Sequence[Mapping[str, Any]]) -> Record:
    """One call's Nsight Compute summary rows (one per launch, in launch order) as its record."""
    launches, counts = [], []
    for r in rows:
        name = _text(r.get("kernel_demangled")) or _text(r.get("kernel"))
        smem = r.get("smem_per_block_bytes")
        if _int(smem) is None and (_int(r.get("smem_static_bytes")) is not None or _int(r.get("smem_dynamic_bytes")) is not None):
            smem = (_int(r.get("smem_static_bytes")) or 0) + (_int(r.get("smem_dynamic_bytes")) or 0)
        launches.append((name, _text(r.get("grid")), _text(r.get("block")), _int(r.get("registers_per_thread")),
                         _int(smem)))
        counts.append(tuple(as_float(r.get(c)) for c in NCU_COUNTS))
    return tuple(launches), tuple(counts)


def _nsys_records(kern: pd.DataFrame) -> dict[tuple[str, str], Record]:
    need = {"variant", "shape_id", "kernel", "iteration", "kernel_index"}
    if kern.empty or not need <= set(kern.columns):
        return {}
    first = kern.groupby(["variant", "shape_id"], sort=False)["iteration"].transform("min")
    k = kern[kern["iteration"] == first].sort_values(["variant", "shape_id", "kernel_index"], kind="stable")
    dims = [c for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z") if c in k.columns]
    out: dict[tuple[str, str], list[Launch]] = {}
    for r in k.to_dict("records"):
        grid = ",".join(str(r[c]) for c in dims[:3])
        block = ",".join(str(r[c]) for c in dims[3:])
        out.setdefault((str(r["variant"]), str(r["shape_id"])), []).append(
            (str(r["kernel"]), grid, block, _int(r.get("registers_per_thread")), _int(r.get("smem_bytes"))))
    return {key: (tuple(seq), None) for key, seq in out.items()}


def _cupti_records(meas: pd.DataFrame) -> dict[tuple[str, str], Record]:
    """The timed calls' kernels as CUPTI recorded them (the rows' `kernel_sig`, faprof.timing.cupti_timer)."""
    if meas.empty or "kernel_sig" not in meas.columns:
        return {}
    out: dict[tuple[str, str], Record] = {}
    for v, sid, sig in zip(meas["variant"].astype(str), meas["shape_id"].astype(str), meas["kernel_sig"], strict=True):
        launches = cupti_launches(sig)
        if launches:
            out[(v, sid)] = (launches, None)
    return out


def cupti_launches(sig: Any) -> tuple[Launch, ...]:
    """A row's `kernel_sig` (JSON: [[name, grid, block, registers, smem], ...]) as launches; () if none."""
    if not isinstance(sig, str) or not sig:
        return ()
    try:
        items = json.loads(sig)
    except ValueError:
        return ()
    return tuple((str(k[0]), str(k[1]), str(k[2]), _int(k[3]), _int(k[4])) for k in items if len(k) >= 5)


def kernel_records(tables: Mapping[str, pd.DataFrame],
                   measurements: pd.DataFrame | None = None) -> list[dict[tuple[str, str], Record]]:
    """Per kernel table (CUPTI's `kernel_sig` of the rows, ncu_summary, nsys_kernels): (variant, shape_id) ->
    the call's launches in order (and Nsight Compute's counts)."""
    empty = pd.DataFrame()
    return [_cupti_records(measurements if measurements is not None else empty),
            _ncu_records(tables.get("ncu_summary", empty)), _nsys_records(tables.get("nsys_kernels", empty))]


def _launches_agree(a: tuple[Launch, ...], b: tuple[Launch, ...]) -> bool:
    """Same launches: name, grid and block equal, and registers and shared memory where both record them."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x[:3] != y[:3]:
            return False
        if any(p is not None and q is not None and p != q for p, q in zip(x[3:], y[3:], strict=True)):
            return False
    return True


def _counts_agree(a: tuple[tuple[float, ...], ...] | None, b: tuple[tuple[float, ...], ...] | None) -> bool:
    if a is None or b is None:
        return True
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x, y, strict=True):
            if math.isnan(p) or math.isnan(q):
                continue
            if abs(p - q) > COUNT_REL * max(abs(p), abs(q)):
                return False
    return True


def records_agree(a: Record, b: Record) -> bool:
    """Whether two calls' records in one table say they ran the same kernel binaries alike."""
    return _launches_agree(a[0], b[0]) and _counts_agree(a[1], b[1])


@functools.lru_cache(maxsize=1)
def _floors() -> tuple[noise_floor.NoiseFloor, ...]:
    try:
        return tuple(noise_floor.load_floors())
    except FaprofError:
        return ()


#: Two-sided 95% quantile of the normal distribution: the band two draws of one noise fall within.
Z95 = 1.96


def time_tolerance(gpu_name: Any) -> float:
    """How far apart (in log time) two medians of one GPU model can be and still not be told apart: 95% of
    the differences of two draws of the recorded between-run noise (Z95 x sqrt(2) x row_sd,
    faprof.rows.noise_floor; the noisiest recorded floor for a model without one): 3.7% on the H100."""
    floor, _ = noise_floor.floor_for(str(gpu_name or ""), _floors())
    return Z95 * math.sqrt(2) * floor.row_sd


def times_agree(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two rows' medians cannot be told apart: their log ratio within the noise floor's band of
    their GPU model (`time_tolerance`), or within their medians' 95% CIs (rel_ci) added, whichever is wider. Rows without a
    timed median never agree (nothing proves them the same)."""
    ma, mb = as_float(a.get("median_ms")), as_float(b.get("median_ms"))
    if not (ma > 0 and mb > 0):
        return False
    ci = sum(x for x in (as_float(a.get("rel_ci")), as_float(b.get("rel_ci"))) if x >= 0)
    return abs(math.log(ma / mb)) <= max(time_tolerance(a.get("gpu_name") or b.get("gpu_name")), ci)


def _complete(rec: Record, row: Mapping[str, Any] | None) -> bool:
    """Whether a record covers the whole call: as many kernels as CUPTI counted (when it did)."""
    if not rec[0]:
        return False
    k = as_float(row.get("kernels_per_call")) if row else math.nan
    return math.isnan(k) or k <= 0 or int(k) == len(rec[0])


def same_kernel(a: str, b: str, sid: str, recs: Sequence[Mapping[tuple[str, str], Record]],
                rows: Mapping[tuple[str, str], Mapping[str, Any]]) -> bool:
    """Whether `a` and `b` ran the same kernel at shape `sid`: every kernel table that records both agrees
    (`records_agree`, covering the whole call), at least one does, and their medians cannot be told apart
    (`times_agree`). The one judgement of "the same kernel" (the tables, the reports, the advisor)."""
    seen = False
    ra_row, rb_row = rows.get((a, sid)), rows.get((b, sid))
    for table in recs:
        ra, rb = table.get((a, sid)), table.get((b, sid))
        if ra is None or rb is None:
            continue
        if not (_complete(ra, ra_row) and _complete(rb, rb_row)) or not records_agree(ra, rb):
            return False
        seen = True
    return seen and times_agree(ra_row or {}, rb_row or {})


def same_kernel_of(a: tuple[Sequence[Mapping[str, Any]], Mapping[str, Any]],
                   b: tuple[Sequence[Mapping[str, Any]], Mapping[str, Any]]) -> bool:
    """`same_kernel` of two calls given as (their Nsight Compute summary rows, their measurement row), for
    the advisor's comparisons: the same judgement on the same records."""
    calls = {"a": a, "b": b}
    ncu = {(t, ""): _ncu_record(lrows) for t, (lrows, _) in calls.items() if lrows}
    cupti = {(t, ""): (cupti_launches(m.get("kernel_sig")), None) for t, (_, m) in calls.items()
             if cupti_launches(m.get("kernel_sig"))}
    rows = {(t, ""): _proof_row(m) for t, (_, m) in calls.items()}
    return same_kernel("a", "b", "", [cupti, ncu], rows)


def _proof_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A measurement row as evidence for `same_kernel`: its median counts only where its time is a result."""
    return {**row, "median_ms": row.get("median_ms") if row.get("status") in (None, *schema.TIMED) else None}


def declared_of(manifest: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, str]]:
    """alias -> {direction: target}: the manifest's record (`settings.aliases`), else the registry's
    declarations of the variants named (unknown variants, such as a user's not loaded here, declare none)."""
    rec = (manifest.get("settings") or {}).get("aliases")
    if isinstance(rec, Mapping):
        return {str(k): dict(v) for k, v in rec.items() if isinstance(v, Mapping)}
    out: dict[str, dict[str, str]] = {}
    for n in dict.fromkeys(names):
        try:
            v = registry.get(n)
        except FaprofError:
            continue
        if v.aliases:
            out[n] = dict(v.aliases)
    return out


def find(measurements: pd.DataFrame, tables: Mapping[str, pd.DataFrame] | None = None,
         manifest: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The aliases of a run: one row per (shape_id, variant) whose kernels are `canonical`'s there.

    Args:
        measurements: the run's measurement rows (variant, shape_id, direction; kernels_per_call used
            when present).
        tables: the run's kernel tables (ncu_summary, nsys_kernels), each optional.
        manifest: the run's manifest (declared aliases, baseline and variant order), optional.

    Returns:
        A frame with ALIAS_COLUMNS (empty when no variant is another's alias).
    """
    manifest = manifest or {}
    if measurements.empty or not {"variant", "shape_id"} <= set(measurements.columns):
        return pd.DataFrame(columns=list(ALIAS_COLUMNS))
    order = list(dict.fromkeys([*((manifest.get("settings") or {}).get("variants") or []),
                                *measurements["variant"].astype(str)]))
    rank = {v: i for i, v in enumerate(order)}
    baseline, group_baselines = baselines_of(dict(manifest))
    declared = declared_of(manifest, order)
    cols = [c for c in ("kernels_per_call", "median_ms", "rel_ci", "gpu_name", "status") if c in measurements.columns]
    rows = {(str(r["variant"]), str(r["shape_id"])): _proof_row({c: r[c] for c in cols})
            for r in measurements[["variant", "shape_id", *cols]].to_dict("records")}
    recs = kernel_records(tables or {}, measurements)
    out: list[dict[str, Any]] = []
    found: list[tuple[str, str | None, list[str]]] = []  # (shape_id, its baseline, a class of same-kernel variants)
    partners: dict[str, set[str]] = {}
    for sid, g in measurements.groupby("shape_id", sort=False):
        here = sorted(dict.fromkeys(g["variant"].astype(str)), key=lambda v: rank.get(v, len(rank)))
        direction = str(g["direction"].iloc[0]) if "direction" in g else "fwd"
        group = g["group"].iloc[0] if "group" in g else None
        base = group_baselines.get(group, baseline) if isinstance(group, str) else baseline
        declared_here = {}
        for v in here:  # declared first: their target is canonical
            t = (declared.get(v) or {}).get(direction)
            if t and t != v and t in here and (declared.get(t) or {}).get(direction) is None:
                declared_here[v] = t
        out += [{"shape_id": str(sid), "variant": v, "canonical": t, "how": "declared"} for v, t in declared_here.items()]
        classes: list[list[str]] = []
        for v in (v for v in here if v not in declared_here):
            home = next((c for c in classes if all(same_kernel(m, v, str(sid), recs, rows) for m in c)), None)
            if home is None:
                classes.append([v])
            else:
                home.append(v)
        for c in classes:
            if len(c) > 1:
                found.append((str(sid), base, c))
                for v in c:
                    partners.setdefault(v, set()).update(set(c) - {v})
    for sid, base_at, c in found:
        # canonical: the baseline, else the variant with the fewest same-kernel partners over the run (a
        # dispatcher that runs one variant's kernels here and another's there is named as their alias),
        # else the first in the run's order
        canon = min(c, key=lambda v: (v != base_at, len(partners.get(v, ())), rank.get(v, len(rank))))
        out += [{"shape_id": sid, "variant": v, "canonical": canon, "how": "kernels"} for v in c if v != canon]
    return pd.DataFrame(out, columns=list(ALIAS_COLUMNS))


def split(text: Any) -> list[str]:
    """The names in an `aliases` cell (None/NaN: none)."""
    return [w for w in _text(text).split(schema.ALIAS_SEP) if w]


def collapse(measurements: pd.DataFrame, found: pd.DataFrame) -> pd.DataFrame:
    """`measurements` with each alias row dropped and its variant named in the canonical row's
    `aliases` column (the column is added when missing, so old bundles read like new ones)."""
    df = measurements.copy()
    if "aliases" not in df.columns:
        df["aliases"] = None
    if df.empty or found.empty:
        return df
    drop = set(zip(found["variant"], found["shape_id"], strict=True))
    extra: dict[tuple[str, str], list[str]] = {}
    for r in found.to_dict("records"):
        extra.setdefault((r["canonical"], r["shape_id"]), []).append(r["variant"])
    keys = list(zip(df["variant"].astype(str), df["shape_id"].astype(str), strict=True))
    df["aliases"] = [schema.ALIAS_SEP.join(dict.fromkeys([*split(a), *extra.get(k, [])])) or None
                     for a, k in zip(df["aliases"], keys, strict=True)]
    return df[[k not in drop for k in keys]].reset_index(drop=True)


def measurements(bundle: Any) -> pd.DataFrame:
    """A bundle's measurement rows with one row per kernel: aliases folded into their canonical row."""
    meas = bundle.measurements()
    tables = {t: bundle.read(t) for t in ("ncu_summary", "nsys_kernels") if bundle.has(t)}
    return collapse(meas, find(meas, tables, bundle.manifest()))


def alias_names_of(df: pd.DataFrame) -> dict[str, list[str]]:
    """variant -> every alias its rows name (run order), for labels: 'fa3_wgmma_e (also fa3_bwd_a..d)'."""
    out: dict[str, list[str]] = {}
    if df.empty or "aliases" not in df.columns:
        return out
    for v, a in zip(df["variant"], df["aliases"], strict=True):
        names = split(a)
        if names:
            cur = out.setdefault(str(v), [])
            cur.extend(n for n in names if n not in cur)
    return out


def labels_of(df: pd.DataFrame) -> dict[str, str]:
    """variant -> its display label: the name, with '(also ...)' where its rows stand for aliases."""
    names = alias_names_of(df)
    return {str(v): also_label(str(v), names.get(str(v))) for v in dict.fromkeys(df.get("variant", []))}


def label(variant: str, df: pd.DataFrame) -> str:
    """One variant's display label (see `labels_of`)."""
    return also_label(variant, alias_names_of(df).get(variant))


def folded_keys(df: pd.DataFrame) -> set[tuple[str, str]]:
    """(alias, shape_id) of every alias the collapsed rows `df` name (their own rows were folded)."""
    if df.empty or "aliases" not in df.columns:
        return set()
    return {(n, str(s)) for s, a in zip(df["shape_id"], df["aliases"], strict=True) for n in split(a)}


def without_aliases(table: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """A per-(variant, shape_id) table (ncu_summary, stalls, nsys_kernels, ...) without the rows of
    aliases that the collapsed measurement rows `df` fold into their canonical variant."""
    drop = folded_keys(df)
    if table.empty or not drop or not {"variant", "shape_id"} <= set(table.columns):
        return table
    keys = zip(table["variant"].astype(str), table["shape_id"].astype(str), strict=True)
    return table[[k not in drop for k in keys]].reset_index(drop=True)


def runs_kernel_of(df: pd.DataFrame, variant: str) -> pd.Series:
    """Rows of `df` that measure `variant`'s kernels: its own, and those of the canonical variant it
    was folded into (its name in their `aliases`), so a figure asked of an alias finds its kernel."""
    own = df["variant"] == variant
    if "aliases" not in df.columns:
        return own
    return own | df["aliases"].map(lambda a: variant in split(a))


def as_planned(bundle: Any) -> pd.DataFrame:
    """A bundle's rows as a run of this faprof writes them: declared aliases folded into their target's
    row, nothing detected (that depends on which Nsight tables a run has), so two runs pair row for row
    (`faprof compare`, the gate) whichever faprof wrote them."""
    meas = bundle.measurements()
    return collapse(meas, find(meas, None, bundle.manifest()))
