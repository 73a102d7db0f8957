"""The regression gate's between-run noise floor: how much kernel times move between two runs of the same code, per GPU model.

A row's kept samples say how precisely one run measured it (0.1-0.3% on the H100), not how much
the next run of the same code will differ: between runs the GPU's power and clock state changes,
and on the H100 a large call's time moves by 1-2.5% a row, now and then by 9% (tests/data/gate).
The gate therefore needs a model of that noise, estimated from runs of one code:

    log t[run, variant, shape] = mu[variant, shape] + c[run, variant] + u[run, variant, shape]

- `u`, the row's own run-to-run noise, standard deviation `row_sd` (per run);
- `c`, an offset shared by all rows of one variant in one run, standard deviation `offset_sd`
  (the whole run, or the variant's stretch of it, ran warmer or cooler).

Both are estimated per GPU model by a two-way analysis of variance of the log times of every
variant that ran unchanged in two or more runs (`estimate`); `prior_df` says how far the recorded
`row_sd` can be trusted for a variant it has not seen: the kernels' own run-to-run spreads differ
(0.6% for sdpa_flash, 2.4% for fa3_wgmma_e on the H100), and how much more they scatter than
sampling alone would make them sets it (`prior_df`, the method of moments of Smyth's
moderated-variance model). The gate's pooling (`faprof.analysis.comparison.pool`) uses the floor as a prior that a
variant's own rows update.

The recorded floors are data (`faprof/data/gate_noise.toml`, written by
`scripts/analysis/gate_noise_floor.py` from the bundles it names; `tests/test_gate_noise.py` recomputes
them). A GPU model without a recorded floor gets the noisiest recorded one, with a note.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from faprof.analysis import comparison
from faprof.analysis.comparison.shift import hl_one_sample
from faprof.errors import FaprofError
from faprof.model.schema import TIMED
from faprof.rows import stats
from faprof.rows.noise_floor import NoiseFloor, RunSource
from faprof.store import Bundle

#: Rows timed by these clocks are what the floors describe (host-clock rows have no floor).
GPU_TIMERS = comparison.GPU_TIMERS

# ----------------------------------------------------------------------------- estimation
@dataclass(frozen=True)
class RunSet:
    """Runs of one code on one GPU model, and which of their variants ran unchanged in all of them."""

    bundles: tuple[Bundle, ...]
    variants: tuple[str, ...] | None = None
    """None: every variant timed in all the runs."""


def _log_times(b: Bundle) -> pd.DataFrame:
    m = b.measurements()
    for c in ("timer", "gpu_name"):
        if c not in m.columns:
            m[c] = None
    m = m[m["status"].isin(TIMED) & m["timer"].isin(GPU_TIMERS)]
    med = m["samples_ms"].map(lambda s: float(np.median(stats.as_samples(s))) if stats.as_samples(s).size else math.nan)
    med = med.where(med > 0, m["median_ms"])
    return pd.DataFrame({"variant": m["variant"], "shape_id": m["shape_id"], "gpu_name": m["gpu_name"],
                         "log_ms": np.log(med.astype(float))}).dropna(subset=["log_ms"])


@dataclass(frozen=True)
class _Group:
    variant: str
    source: int
    shapes: int
    runs: int
    ss_res: float
    ss_run: float
    max_move: float

    @property
    def df_res(self) -> int:
        return (self.runs - 1) * (self.shapes - 1)

    @property
    def df_run(self) -> int:
        return self.runs - 1


def _groups(run_sets: Sequence[RunSet]) -> tuple[list[_Group], set[str]]:
    """Per (run set, variant): the two-way ANOVA sums of squares of log time (shapes x runs)."""
    out: list[_Group] = []
    gpus: set[str] = set()
    for si, rs in enumerate(run_sets):
        if len(rs.bundles) < 2:
            raise FaprofError(f"run set {si + 1}: a noise floor needs two or more runs of the same code, got "
                              f"{len(rs.bundles)}")
        tables = [_log_times(b) for b in rs.bundles]
        for t in tables:
            gpus.update(str(g) for g in t["gpu_name"].dropna())
        common = set.intersection(*(set(t["variant"]) for t in tables))
        names = sorted(common if rs.variants is None else common & set(rs.variants))
        missing = sorted(set(rs.variants or ()) - common)
        if missing:
            raise FaprofError(f"run set {si + 1}: variant(s) {', '.join(missing)} are not timed in every run of the set")
        for v in names:
            x = pd.concat([t[t["variant"] == v].set_index("shape_id")["log_ms"] for t in tables], axis=1,
                          join="inner").to_numpy()
            if x.shape[0] < 2:
                continue  # one shape: its run-to-run change cannot be split into offset and row noise
            out.append(_Group(v, si, x.shape[0], x.shape[1], *anova_sums(x), max_alone(x)))
    return out, gpus


def max_alone(x: np.ndarray) -> float:
    """The largest move of one shape away from the others between any two runs: over run pairs (i, j) and
    shapes s, |d_s - HL(d without s)| with d = x[:, j] - x[:, i] (0 with fewer than 3 shapes).

    Args:
        x: log times, one row per shape, one column per run.

    Returns:
        The move, in log time.
    """
    if x.shape[0] < 3:
        return 0.0
    best = 0.0
    for i in range(x.shape[1]):
        for j in range(i + 1, x.shape[1]):
            d = x[:, j] - x[:, i]
            for s in range(d.size):
                best = max(best, abs(float(d[s]) - hl_one_sample(np.delete(d, s))))
    return best


def anova_sums(x: np.ndarray) -> tuple[float, float]:
    """Two-way analysis of variance without interaction of log times (shapes x runs).

    Args:
        x: log times, one row per shape, one column per run.

    Returns:
        (residual sum of squares, on (runs-1)(shapes-1) degrees of freedom; the runs' sum of
        squares, on runs-1).
    """
    resid = x - x.mean(axis=1, keepdims=True) - x.mean(axis=0, keepdims=True) + x.mean()
    return float((resid ** 2).sum()), x.shape[0] * float(((x.mean(axis=0) - x.mean()) ** 2).sum())


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (Newton's method from Smyth 2004's starting point)."""
    from scipy.special import polygamma

    x = 0.5 + 1.0 / y
    for _ in range(50):
        tri = float(polygamma(1, x))
        step = tri * (1.0 - tri / y) / float(polygamma(2, x))
        x += step
        if -step / x < 1e-8:
            break
    return x


def prior_df(variances: Sequence[float], dfs: Sequence[int]) -> tuple[float, float]:
    """Smyth's (2004) moment estimates of a scaled-F prior for variances measured with their own degrees of freedom.

    Each group's variance s_g^2 on d_g degrees of freedom is taken to scatter around s0^2 by sampling
    (trigamma(d_g / 2) in log variance) and by the groups' real differences (trigamma(d0 / 2)): the
    excess scatter gives d0, the prior's worth in degrees of freedom.

    Args:
        variances: the groups' variances (positive).
        dfs: their degrees of freedom.

    Returns:
        (s0^2, d0): d0 is inf when the groups scatter no more than sampling explains.
    """
    from scipy.special import digamma, polygamma

    s2 = np.asarray(variances, dtype=float)
    d = np.asarray(dfs, dtype=float)
    keep = (s2 > 0) & (d > 0)
    s2, d = s2[keep], d[keep]
    if s2.size == 0:
        return 0.0, math.inf
    e = np.log(s2) - digamma(d / 2) + np.log(d / 2)
    mean = float(e.mean())
    if s2.size < 2:
        return float(np.exp(mean)), math.inf
    excess = float(((e - mean) ** 2).sum() / (s2.size - 1) - polygamma(1, d / 2).mean())
    if excess <= 0:
        return float(np.exp(mean)), math.inf
    d0 = 2.0 * _trigamma_inverse(excess)
    return float(np.exp(mean + digamma(d0 / 2) - math.log(d0 / 2))), d0


def estimate(run_sets: Sequence[RunSet], note: str = "") -> NoiseFloor:
    """The noise floor of one GPU model from sets of runs of the same code.

    Per (run set, variant) with two or more shapes, the log times (shapes x runs) are split by a
    two-way analysis of variance: the residual mean square estimates row_sd^2, and the runs' mean
    square less it, over the shape count, estimates offset_sd^2 (cut at zero per variant). Both are
    pooled over the groups by their degrees of freedom; the groups' residual variances give
    prior_df (`prior_df`).

    Args:
        run_sets: runs of one code each (a variant must be unchanged across the runs of its set).
        note: what the runs were, for the record.

    Returns:
        The NoiseFloor.

    Raises:
        FaprofError: a set of fewer than two runs, a named variant missing from a run, runs on more
            than one GPU model, or nothing to estimate from.
    """
    groups, gpus = _groups(run_sets)
    if len(gpus) != 1:
        raise FaprofError(f"a noise floor is per GPU model; the runs are on {', '.join(sorted(gpus)) or 'no GPU'}")
    df_res = sum(g.df_res for g in groups)
    if df_res == 0:
        raise FaprofError("no variant was timed on two or more shapes in two or more runs: nothing to estimate from")
    row_var = sum(g.ss_res for g in groups) / df_res
    df_run = sum(g.df_run for g in groups)
    # E[run mean square] = row_sd^2 + shapes * offset_sd^2. Each variant's estimate is cut at zero before
    # pooling, so a noisy variant's row noise (fa3_wgmma_e's 2.4%) cannot cancel a quiet one's offsets
    # (fa2_mma's -0.85% run): this errs high, which a floor should
    off = sum(g.df_run * max(g.ss_run / g.df_run - g.ss_res / g.df_res, 0.0) / g.shapes for g in groups)
    offset_var = off / df_run if df_run else 0.0
    _, d0 = prior_df([g.ss_res / g.df_res for g in groups], [g.df_res for g in groups])
    per_variant: dict[str, list[float]] = {}
    for g in groups:
        acc = per_variant.setdefault(g.variant, [0.0, 0.0])
        acc[0] += g.ss_res
        acc[1] += g.df_res
    sources = tuple(RunSource(tuple(str(b.path) for b in rs.bundles), rs.variants) for rs in run_sets)
    return NoiseFloor(next(iter(gpus)), math.sqrt(row_var), math.sqrt(offset_var), d0,
                      max(g.max_move for g in groups), df_res, df_run,
                      sum(g.shapes * g.runs for g in groups), sources, note,
                      {v: math.sqrt(ss / df) for v, (ss, df) in sorted(per_variant.items()) if df})


def run_sets(floor: NoiseFloor, root: str | Path = ".") -> list[RunSet]:
    """A recorded floor's run sets as bundles (paths relative to `root`): to estimate it again.

    Raises:
        FaprofError: a recorded bundle is not there.
    """
    out = []
    for src in floor.sources:
        bundles = []
        for p in src.bundles:
            path = Path(root) / p
            if not (path / "manifest.json").is_file():
                raise FaprofError(f"{floor.gpu_name}'s noise floor names {p}, which is not a bundle under {root}")
            bundles.append(Bundle(path))
        out.append(RunSet(tuple(bundles), src.variants))
    return out


