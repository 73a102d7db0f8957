"""The CI gate's provenance: what differs between the two runs (GPU, driver, versions, clocks, timer, ncu).

Different GPU models refuse unless allowed; every other difference is marked 'warn' (can move
times) or 'info' (expected, such as the commit or the host).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

from faprof.gate.verdicts import CLOCK_NOTE_REL
from faprof.model.schema import TIMED
from faprof.model.values import as_float
from faprof.store import Bundle


@dataclass(frozen=True)
class Check:
    """One provenance item of the two runs."""

    item: str
    """What is compared ('driver', 'SM clock during the rows (median)', ...)."""
    baseline: str
    """The baseline's value as text ('not recorded' when its bundle has none)."""
    candidate: str
    """The candidate's value as text."""
    level: str
    """'same', 'info' (differs, expected: commit, host), 'warn' (differs and can move times) or 'refuse'."""
    note: str = ""
    """What the difference means (warnings and refusals)."""


def _s(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "not recorded"
    return str(x)


def cudnn_version(v: Any) -> str:
    """torch.backends.cudnn.version()'s integer as a version: 91900 -> '9.19.0', 8907 -> '8.9.7'."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return _s(v)
    if n >= 10000:  # cuDNN 9 encodes major*10000 + minor*100 + patch
        return f"{n // 10000}.{n % 10000 // 100}.{n % 100}"
    return f"{n // 1000}.{n % 1000 // 100}.{n % 100}"


def _median_clock(rows: pd.DataFrame, col: str) -> float:
    v = pd.to_numeric(rows[col], errors="coerce").dropna() if col in rows else pd.Series(dtype=float)
    return float(v.median()) if not v.empty else math.nan


def _throttle_text(rows: pd.DataFrame, side: str) -> tuple[str, set[str]]:
    flags = rows.get(f"throttled_{side}")
    if flags is None or flags.isna().all():
        return "not recorded", set()
    thr = rows[flags.fillna(False).astype(bool)]
    reasons = {p.strip() for x in thr.get(f"throttle_reasons_{side}", pd.Series(dtype=object)).dropna()
               for p in str(x).split(",") if p.strip()}
    text = f"{len(thr)} of {len(rows)} rows" + (f" ({', '.join(sorted(reasons))})" if reasons else "")
    return text, reasons


def _ncu_text(m: dict[str, Any]) -> str:
    n = m.get("ncu") or {}
    if not n or n.get("status") not in ("ok", None) or not n.get("ncu_version"):
        return "not collected" if not n else f"{n.get('status')}"
    return f"{n.get('ncu_version')}, set {n.get('set')}, clock control {n.get('clock_control')}"


def _timing_text(m: dict[str, Any]) -> tuple[str, tuple[Any, Any]]:
    t = (m.get("settings") or {}).get("timing") or {}
    if not t:
        return "not recorded", (None, None)
    key = (t.get("flush_l2"), t.get("timer"))
    text = (f"L2 flush {'on' if t.get('flush_l2') else 'off'}, timer {t.get('timer', 'auto')}, "
            f"target CI {as_float(t.get('target_rel_ci', t.get('target_rel_sem'))):.1%}, budget {t.get('budget_s')} s")
    return text, key


def provenance(a: Bundle, b: Bundle, paired: pd.DataFrame, models: tuple[list[str], list[str]],
               allow_mismatch: bool) -> list[Check]:
    """The two runs' provenance, item by item, each marked same / info / warn / refuse.

    Args:
        a: the baseline bundle.
        b: the candidate bundle.
        paired: the rows of both (as `_pair_rows` makes them).
        models: the GPU models the baseline's and the candidate's rows ran on.
        allow_mismatch: different GPU models warn instead of refusing.

    Returns:
        The checks, GPU model first.
    """
    ma, mb = a.manifest(), b.manifest()
    ea, eb = ma.get("env") or {}, mb.get("env") or {}
    checks: list[Check] = []

    def add(item: str, va: Any, vb: Any, level_if_differs: str, note: str = "") -> None:
        sa, sb = _s(va), _s(vb)
        checks.append(Check(item, sa, sb, "same" if sa == sb else level_if_differs, "" if sa == sb else note))

    ga, gb = ", ".join(models[0]), ", ".join(models[1])
    if ga == gb:
        checks.append(Check("GPU model", ga, gb, "same"))
    else:
        level = "warn" if allow_mismatch else "refuse"
        checks.append(Check("GPU model", ga, gb, level,
                            f"different GPU models (baseline {ga}, candidate {gb}): the ratios compare machines, not code"))
    add("driver", ea.get("smi_driver") or ea.get("cuda_driver"), eb.get("smi_driver") or eb.get("cuda_driver"), "warn",
        "different drivers: kernel times can move with the driver")
    add("CUDA (torch's)", ea.get("torch_cuda"), eb.get("torch_cuda"), "warn",
        "different CUDA versions: SDPA's and cuBLAS's kernels differ between releases")
    add("torch", ea.get("torch"), eb.get("torch"), "warn", "different torch versions: the SDPA backends' kernels may differ")
    add("cuDNN", cudnn_version(ea.get("cudnn")) if ea.get("cudnn") else None,
        cudnn_version(eb.get("cudnn")) if eb.get("cudnn") else None, "warn",
        "different cuDNN versions: sdpa_cudnn's kernels differ between releases")
    add("nvcc", ea.get("nvcc"), eb.get("nvcc"), "warn", "different nvcc: faprof's and user kernels were compiled differently")
    add("max SM clock (MHz)", ea.get("smi_max_sm_clock_mhz"), eb.get("smi_max_sm_clock_mhz"), "warn",
        "different maximum SM clocks: another SKU or locked application clocks")
    add("power cap (W)", ea.get("smi_power_limit_w"), eb.get("smi_power_limit_w"), "warn",
        "different power caps: large kernels run at the clock the cap allows")
    timed = paired[paired["_merge"].eq("both") & paired["status_a"].isin(TIMED)
                   & paired["status_b"].isin(TIMED)] if "status_a" in paired else paired.iloc[0:0]
    ca, cb = _median_clock(timed, "sm_clock_mhz_a"), _median_clock(timed, "sm_clock_mhz_b")
    clock_level = "same"
    if math.isfinite(ca) and math.isfinite(cb) and abs(cb / ca - 1) > CLOCK_NOTE_REL:
        clock_level = "warn"
    elif not (math.isfinite(ca) and math.isfinite(cb)) and (math.isfinite(ca) or math.isfinite(cb)):
        clock_level = "info"
    checks.append(Check("SM clock during the rows (median)", f"{ca:.0f} MHz" if math.isfinite(ca) else "not recorded",
                        f"{cb:.0f} MHz" if math.isfinite(cb) else "not recorded", clock_level,
                        f"the rows ran at different SM clocks ({ca:.0f} vs {cb:.0f} MHz, median): see each row's "
                        "ratio at equal clocks" if clock_level == "warn" else ""))
    (ta, ra), (tb, rb) = _throttle_text(timed, "a"), _throttle_text(timed, "b")
    level = "same" if ta == tb else ("info" if ra == rb else "warn")
    checks.append(Check("throttled rows (NVML clock events)", ta, tb, level,
                        f"throttle reasons differ ({', '.join(sorted(ra)) or 'none'} vs {', '.join(sorted(rb)) or 'none'})"
                        if level == "warn" else ""))
    tim_a = Counter(str(t) for t in timed.get("timer_a", pd.Series(dtype=object)).dropna())
    tim_b = Counter(str(t) for t in timed.get("timer_b", pd.Series(dtype=object)).dropna())
    fa = ", ".join(f"{k} {v}" for k, v in sorted(tim_a.items())) or "not recorded"
    fb = ", ".join(f"{k} {v}" for k, v in sorted(tim_b.items())) or "not recorded"
    checks.append(Check("GPU timer (rows)", fa, fb, "same" if set(tim_a) == set(tim_b) else "warn",
                        "" if set(tim_a) == set(tim_b) else
                        "the rows were timed by different clocks: rows whose timers differ are ambiguous"))
    tsa, key_a = _timing_text(ma)
    tsb, key_b = _timing_text(mb)
    checks.append(Check("timing settings", tsa, tsb, "same" if tsa == tsb else ("warn" if key_a != key_b else "info"),
                        "the L2 flush or the timer setting differs: the runs measured different things"
                        if key_a != key_b else ""))
    na, nb = _ncu_text(ma), _ncu_text(mb)
    checks.append(Check("ncu", na, nb, "same" if na == nb else "info", ""))
    add("scenario", (ma.get("scenario") or {}).get("name"), (mb.get("scenario") or {}).get("name"), "warn",
        "different scenarios: only the (variant, shape) rows both ran are compared")
    add("faprof commit", ea.get("git_sha"), eb.get("git_sha"), "info")
    add("host", ea.get("host"), eb.get("host"), "info")
    return checks

