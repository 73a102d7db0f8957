"""Aliases: variants whose kernels at a shape are another variant's, shown once (one kernel, one row).

Two ways a variant is an alias of another at a shape:

- declared: the variant says so for the shape's direction (`Variant.aliases`; a bundle records the
  run's declared aliases in its manifest's settings, older bundles are read through the registry);
- detected: the kernels recorded for the two (variant, shape) calls are the same kernel functions
  launched alike — the same sequence of (kernel name, grid, block) in Nsight Compute's
  `ncu_summary` and/or Nsight Systems' `nsys_kernels`, agreeing in every table both appear in, and
  covering the whole call (as many kernels as the CUPTI timer counted per call, `kernels_per_call`).

The canonical variant of a group is the declared target, else the run's baseline, else the first in
the run's order; the others are its aliases at that shape. `collapse` keeps the canonical row and
names the aliases in its `aliases` column (faprof.model.schema), so every view built on it — the
report's tables, charts and Why lines, the advisor's comparators, the dashboard — shows a kernel
once. Nothing here looks at variant names beyond the declarations: detection rests on the records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from faprof import variants as _variants  # noqa: F401  (fills the registry: declarations of old bundles)
from faprof.analysis.core import baselines_of
from faprof.errors import FaprofError
from faprof.model import schema
from faprof.model import variant as registry
from faprof.model.plan import also_label

#: Columns of the alias table: at shape_id, `variant` runs `canonical`'s kernels; how: declared / kernels.
ALIAS_COLUMNS = ("shape_id", "variant", "canonical", "how")

Signature = tuple[tuple[str, str, str], ...]


def _text(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return str(x)


def _ncu_signatures(summ: pd.DataFrame) -> dict[tuple[str, str], Signature]:
    need = {"variant", "shape_id", "kernel"}
    if summ.empty or not need <= set(summ.columns):
        return {}
    s = summ[summ["kernel"] != "(all)"]
    order = [c for c in ("launch", "kernel_id") if c in s.columns]
    s = s.sort_values(["variant", "shape_id", *order], kind="stable")
    kernel = s["kernel"].map(_text)
    name = s["kernel_demangled"].map(_text) if "kernel_demangled" in s else kernel
    name = name.where(name != "", kernel)
    grid, block = (s[c].map(_text) if c in s else pd.Series("", index=s.index) for c in ("grid", "block"))
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for v, sid, n, g, b in zip(s["variant"].astype(str), s["shape_id"].astype(str), name, grid, block, strict=True):
        out.setdefault((v, sid), []).append((n, g, b))
    return {key: tuple(seq) for key, seq in out.items()}


def _nsys_signatures(kern: pd.DataFrame) -> dict[tuple[str, str], Signature]:
    need = {"variant", "shape_id", "kernel", "iteration", "kernel_index"}
    if kern.empty or not need <= set(kern.columns):
        return {}
    first = kern.groupby(["variant", "shape_id"], sort=False)["iteration"].transform("min")
    k = kern[kern["iteration"] == first].sort_values(["variant", "shape_id", "kernel_index"], kind="stable")
    dims = [c for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z") if c in k.columns]
    as_text = {c: k[c].astype(str).to_numpy() for c in dims}
    grid = [",".join(t) for t in zip(*(as_text[c] for c in dims[:3]), strict=True)] if dims[:3] else [""] * len(k)
    block = [",".join(t) for t in zip(*(as_text[c] for c in dims[3:]), strict=True)] if dims[3:] else [""] * len(k)
    out: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for v, sid, name, g, b in zip(k["variant"].astype(str), k["shape_id"].astype(str), k["kernel"].astype(str),
                                  grid, block, strict=True):
        out.setdefault((v, sid), []).append((name, g, b))
    return {key: tuple(seq) for key, seq in out.items()}


def kernel_signatures(tables: Mapping[str, pd.DataFrame]) -> list[dict[tuple[str, str], Signature]]:
    """Per kernel table (ncu_summary, nsys_kernels): (variant, shape_id) -> the call's kernels as a
    sequence of (name, grid, block), in launch order."""
    empty = pd.DataFrame()
    return [_ncu_signatures(tables.get("ncu_summary", empty)), _nsys_signatures(tables.get("nsys_kernels", empty))]


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


def _complete(sig: Signature, row: Mapping[str, Any] | None) -> bool:
    """Whether a signature covers the whole call: as many kernels as CUPTI counted (when it did)."""
    if not sig:
        return False
    k = row.get("kernels_per_call") if row else None
    try:
        k = float(k)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    return math.isnan(k) or k <= 0 or int(k) == len(sig)


def _same_kernels(a: str, b: str, sid: str, sigs: list[dict[tuple[str, str], Signature]],
                  rows: Mapping[tuple[str, str], Mapping[str, Any]]) -> bool:
    seen = False
    for table in sigs:
        sa, sb = table.get((a, sid)), table.get((b, sid))
        if sa is None or sb is None:
            continue
        if not (_complete(sa, rows.get((a, sid))) and _complete(sb, rows.get((b, sid)))) or sa != sb:
            return False
        seen = True
    return seen


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
    kpc = measurements["kernels_per_call"] if "kernels_per_call" in measurements else pd.Series(None, index=measurements.index)
    rows = {(str(v), str(s)): {"kernels_per_call": k}
            for v, s, k in zip(measurements["variant"], measurements["shape_id"], kpc, strict=True)}
    sigs = kernel_signatures(tables or {})
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
            home = next((c for c in classes if _same_kernels(c[0], v, str(sid), sigs, rows)), None)
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


def of_bundle(bundle: Any) -> pd.DataFrame:
    """The alias table (`find`) of a faprof Bundle, from its measurements, kernel tables and manifest."""
    tables = {t: bundle.read(t) for t in ("ncu_summary", "nsys_kernels") if bundle.has(t)}
    return find(bundle.measurements(), tables, bundle.manifest())


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
