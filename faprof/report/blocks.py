"""The report's unit of comparison: a block of rows (one scenario group, dtype and direction) and its ranking.

A ranking compares each variant with the block's baseline where the baseline ran (the geometric mean
over the shapes both timed of the baseline's median over the variant's), and with the fastest variant
of each shape where it did not: `Block.reference` says which, in words a headline can use as they are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pandas as pd

from faprof.model import schema
from faprof.report import table_text as rt


def geomean(x: pd.Series) -> float:
    """Geometric mean of the positive values (NaN when there are none)."""
    x = x[(x > 0) & x.notna()]
    return float(math.exp(x.map(math.log).mean())) if len(x) else math.nan


def timed(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that carry a timing (ok and wrong)."""
    return df[df["status"].isin(schema.TIMED) & (pd.to_numeric(df["median_ms"], errors="coerce") > 0)]


@dataclass
class Block:
    """Rows a ranking compares: one scenario group, dtype and direction."""

    group: str
    dtype: str
    direction: str
    baseline: str | None
    rows: pd.DataFrame
    ranking: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def title(self) -> str:
        causal = set(self.rows["causal"].astype(bool))
        mask = " causal" if causal == {True} else (" non-causal" if causal == {False} else "")
        word = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}.get(self.direction, self.direction)
        head = f"{self.dtype}{mask} {word}"
        # The group's name only when it says more than the dtype/mask/direction do ('forward fp32' does not).
        return head if set(self.group.split()) <= set(head.split()) else f"{self.group} · {head}"

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", f"{self.group}-{self.dtype}-{self.direction}".lower()).strip("-")

    @property
    def shapes(self) -> int:
        return int(self.rows["shape_id"].nunique())

    def baseline_shapes(self) -> int:
        """On how many of the block's shapes the baseline was timed."""
        if not self.baseline:
            return 0
        return int(timed(self.rows[self.rows["variant"] == self.baseline])["shape_id"].nunique())

    @property
    def baseline_ran(self) -> bool:
        return self.baseline_shapes() > 0

    def baseline_missing_why(self) -> str:
        """Why the baseline has no timing here, from its rows' statuses and reasons ('' when it ran)."""
        if self.baseline_ran:
            return ""
        if not self.baseline:
            return "the scenario names no baseline"
        rows = self.rows[self.rows["variant"] == self.baseline]
        if rows.empty:
            return f"{self.baseline} was not among the variants run"
        r = rows.iloc[0]
        reason = str(r.get("reason") or "").strip()
        return f"{self.baseline} was {r['status']}" + (f": {reason}" if reason else "")

    @property
    def baseline_note(self) -> str:
        """Why the block's baseline is a fallback, not the one the scenario declared ('' when it is that one;
        analysis.with_speedups)."""
        if "baseline_note" not in self.rows:
            return ""
        notes = [n for n in dict.fromkeys(self.rows["baseline_note"].fillna("").astype(str)) if n]
        return "; ".join(notes)

    @property
    def reference(self) -> str:
        """What the ranking's ratios are relative to, in words: "sdpa_flash's speed" or the fallback."""
        return f"{self.baseline}'s speed" if self.baseline_ran else "the fastest variant's speed at each shape"


def blocks(df: pd.DataFrame) -> list[Block]:
    """The run's blocks in scenario order, each with its ranking (see `rank`)."""
    out = []
    groups = df["group"].fillna("") if "group" in df else pd.Series("", index=df.index)
    for (g, dt, dr), rows in df.assign(_g=groups).groupby(["_g", "dtype", "direction"], sort=False):
        base = rows["baseline"].dropna() if "baseline" in rows else pd.Series(dtype=object)
        b = Block(str(g), str(dt), str(dr), str(base.iloc[0]) if not base.empty else None, rows.drop(columns="_g"))
        b.ranking = rank(b)
        out.append(b)
    return out


def rank(block: Block) -> pd.DataFrame:
    """Variants of a block by speed: geometric mean over its shapes of the baseline's median over the
    variant's (or, without a timed baseline, of the fastest variant's median per shape over the variant's).
    Variants timed on every shape come first, then those timed on fewer (their ratios cover fewer shapes).

    Returns:
        Columns: variant, score, low, high (the per-shape ratio's range), shapes (timed and compared),
        total (shapes in the block), wrong (rows flagged wrong), unstable (rows with unstable timings).
    """
    t = timed(block.rows)
    total = block.shapes
    cols = ["variant", "score", "low", "high", "shapes", "total", "wrong", "unstable"]
    if t.empty:
        return pd.DataFrame(columns=cols)
    base = t[t["variant"] == block.baseline].set_index("shape_id")["median_ms"] if block.baseline else pd.Series(dtype=float)
    ref = base if not base.empty else t.groupby("shape_id")["median_ms"].min()
    t = t[t["shape_id"].isin(ref.index)]
    t = t.assign(_rel=ref.reindex(t["shape_id"]).to_numpy() / t["median_ms"].to_numpy())
    unstable = t["unstable"].fillna(False).astype(bool) if "unstable" in t else pd.Series(False, index=t.index)
    rows = [{"variant": v, "score": geomean(g["_rel"]), "low": float(g["_rel"].min()), "high": float(g["_rel"].max()),
             "shapes": g["shape_id"].nunique(), "total": total, "wrong": int((g["status"] == "wrong").sum()),
             "unstable": int(unstable[g.index].sum())}
            for v, g in t.groupby("variant", sort=False)]
    out = pd.DataFrame(rows, columns=cols)
    # Variants timed on every shape first: a ratio over fewer shapes is not comparable with theirs.
    out["_partial"] = out["shapes"] < total
    return out.sort_values(["_partial", "score"], ascending=[True, False], kind="stable").drop(columns="_partial") \
        .reset_index(drop=True)


def best(block: Block) -> pd.Series | None:
    """The fastest variant worth naming: right on every shape it ran and timed on all of them (else the
    fastest right one, else the fastest)."""
    r = block.ranking
    if r.empty:
        return None
    ok = r[(r["wrong"] == 0) & (r["shapes"] == r["total"])]
    right = r[r["wrong"] == 0]
    return (ok if not ok.empty else right if not right.empty else r).iloc[0]


def largest_shape(block: Block, variant: str) -> pd.Series | None:
    """The variant's timed row at the block's largest problem (most FLOPs) it ran."""
    t = timed(block.rows)
    t = t[t["variant"] == variant]
    return None if t.empty else t.sort_values("flops").iloc[-1]


def shape_label(r: pd.Series) -> str:
    """'B=16 H=8 S=512 D=64 causal': a problem without its dtype (the block names it)."""
    return rt.shape(r, dtype=False)
