"""The report's header line and its Method section, generated from what the run recorded.

Every sentence is built from the bundle: the timers its rows name, the stop rule and budget in the
manifest's timing settings (the bundle's faprof, not this one's defaults: older bundles stopped on the
mean's standard error), the correctness rule its tolerances imply, and the FLOP convention its rows'
`flops` follow (checked against the exact pair count and FlashAttention's S²/2).
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from faprof.analysis import aliases
from faprof.model.plan import alias_names
from faprof.model.problem import AttentionProblem
from faprof.model.values import as_float
from faprof.report import fmt as f

#: A row's FLOPs count as following a convention when within this relative distance of it (rounding).
FLOP_MATCH_REL = 1e-6

TIMER_WORDS = {"cupti": "CUPTI kernel time per call (the time the call's kernels run: the union of their intervals)",
               "cuda_event": "CUDA events around each call", "event": "CUDA events around each call",
               "host": "the host clock (time.perf_counter)"}
TIMER_SHORT = {"cupti": "CUPTI kernel times", "cuda_event": "CUDA events", "event": "CUDA events",
               "host": "host clock (CPU rows)"}
_TIMER_ORDER = ("cupti", "cuda_event", "event", "host")


def cite(source: str | None) -> str:
    """A scenario's source cited by its title, then the rest: 'Title, GPU, date' -> '*Title* (GPU, date)'.

    The title ends at the first comma outside parentheses, so a source whose title holds a
    parenthesised list ('Meta Llama 3 8B model card and config.json (num_attention_heads 32, ...),
    2024-04-18') keeps it whole. A seed report given as 'path/003_x.txt (Title, GPU, date)' is cited
    by what is in the parentheses: a user who clones faprof does not have the seed files.
    """
    if not source:
        return ""
    text = str(source).strip()
    seed = re.fullmatch(r"\S+\.(?:txt|md)(?:\s*\((.*)\))?", text, flags=re.DOTALL)
    if seed:
        text = (seed.group(1) or "").strip()
        if not text:
            return ""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth <= 0:
            title, rest = text[:i].strip(), text[i + 1:].strip()
            return f"*{title}* ({rest})" if rest else f"*{title}*"
    return f"*{text}*"


def timers(df: pd.DataFrame) -> list[str]:
    """The timers the rows name, GPU ones first."""
    found = df["timer"].dropna().astype(str).unique().tolist() if "timer" in df else []
    return sorted(found, key=lambda x: _TIMER_ORDER.index(x) if x in _TIMER_ORDER else len(_TIMER_ORDER))


def meta(m: dict[str, Any], df: pd.DataFrame) -> str:
    """The line under the title: run, date, rows per status, timers, the seed report reproduced."""
    counts = df["status"].value_counts()
    n_timed = int(counts.get("ok", 0) + counts.get("wrong", 0))
    stamp = str(m.get("created_utc") or "")
    date = f" on {stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}" if re.match(r"\d{8}T", stamp) else ""
    parts = [f"Run `{m.get('run_id')}`, {m.get('status')}{date}", f"{len(df)} rows: {n_timed} timed"]
    parts[-1] += "".join(f", {int(counts[s])} {s}" for s in ("wrong", "untrusted", "failed", "unsupported", "skipped")
                         if counts.get(s))
    folded = aliases.folded_keys(df)
    if folded:  # one kernel, one row: an alias's (variant, shape) is the row of the kernel it runs
        names = alias_names(sorted({v for v, _ in folded}))
        parts[-1] += f"; {len(folded)} (variant, shape) pairs of aliases ({names}) are their kernel's row"
    used = timers(df)
    if used:
        parts.append("timed with " + ", ".join(TIMER_SHORT.get(x, x) for x in used) + "; medians with their 95% CI")
    src = cite((m.get("scenario") or {}).get("source"))
    if src:  # a seed report whose figures the scenario quotes is reproduced; a model card is only a source
        parts.append(f"reproduces {src}" if m.get("published") else f"source: {src}")
    return " · ".join(parts) + "."


def flop_convention(df: pd.DataFrame) -> str:
    """Which FLOP count the rows' `flops` follow: 'exact' (4·B·H·D per unmasked query-key pair),
    'halved' (causal as 4·B·H·Sq·Sk·D / 2, FlashAttention's convention), 'mixed' or 'unknown'."""
    seen = set()
    for _, r in df.dropna(subset=["flops"]).drop_duplicates("shape_id").iterrows():
        p = AttentionProblem.from_row(r)  # every field of the problem: masks, windows, varlen lengths
        if p is None:
            continue
        exact = p.flops()
        full = p.with_(causal=False, window=None).flops()
        got = float(r["flops"])
        if math.isclose(got, exact, rel_tol=FLOP_MATCH_REL):
            seen.add("exact" if p.causal else "either")
        elif p.causal and math.isclose(got, full / 2, rel_tol=FLOP_MATCH_REL):
            seen.add("halved")
        else:
            seen.add("other")
    seen.discard("either")
    if not seen:
        return "exact"  # only non-causal rows: both conventions agree
    return seen.pop() if len(seen) == 1 else "mixed"


_FLOP_WORDS = {
    "exact": "4·B·H·D per query-key pair the mask lets through (causal is top-left aligned: Sq = Sk = S gives "
             "S(S+1)/2 pairs a head)",
    "halved": "4·B·H·Sq·Sk·D, halved when causal (FlashAttention's convention; the faprof that wrote this bundle "
              "counted this way)",
    "mixed": "not one convention across the rows (a bundle resumed by another faprof version): see each row's flops",
    "other": "a count this faprof does not recognise (see each row's flops)",
}


def _g(x: Any) -> str:
    """A setting as written: 50, 0.1, 2 (not 50.0, 0.100, 2.00)."""
    v = as_float(x)
    return f.text(x) if v != v else f"{v:g}"


def _stop_rule(t: dict[str, Any]) -> tuple[str, str]:
    """(the stop rule, what CPU rows stopped on) in words, as the bundle's timing settings record them."""
    if t.get("target_rel_ci") is not None and "target_rel_sem" not in t:
        host = (f"CPU rows (host clock) stopped at ±{_g(100 * float(t['target_rel_ci_host']))}%"
                if t.get("target_rel_ci_host") is not None else "CPU rows (host clock) under the same rule")
        return f"until the median's 95% CI was within ±{_g(100 * float(t['target_rel_ci']))}% of the median", host
    if t.get("target_rel_sem") is not None:
        return (f"until the mean's standard error was under {_g(100 * float(t['target_rel_sem']))}% of the mean (the stop "
                "rule of the faprof that wrote this bundle; the medians' CIs shown are recomputed from the kept samples)",
                "CPU rows (host clock) under the same rule")
    return "for a fixed budget (the bundle records no stop rule)", ""


def _limits(t: dict[str, Any]) -> str:
    parts = []
    if t.get("min_repeats") is not None:
        short = (f" ({_g(t['min_repeats_short'])} for calls under {_g(t['short_call_ms'])} ms)"
                 if t.get("min_repeats_short") is not None and t.get("short_call_ms") is not None else "")
        parts.append(f"at least {_g(t['min_repeats'])} calls{short}")
    if t.get("max_repeats") is not None:
        parts.append(f"at most {_g(t['max_repeats'])}")
    if t.get("budget_s") is not None:
        parts.append(f"or {_g(t['budget_s'])} s per pair")
    return ", ".join(parts)


def _correctness(m: dict[str, Any]) -> str:
    tol = (m.get("settings") or {}).get("tolerance") or {}
    fa_rule = any(isinstance(v, dict) and v.get("factor") for v in tol.values())
    rule = ("per element |out − ref| ≤ atol + rtol·|ref|, and the largest error within "
            f"{_g(next(v['factor'] for v in tol.values() if isinstance(v, dict) and v.get('factor')))}× PyTorch's own "
            "error computing the same attention in the problem's dtype, plus a rounding slack" if fa_rule else
            "against rtol/atol per dtype as the faprof that wrote this bundle checked them")
    return ("Each variant was checked against the reference (float64 attention on the CPU, or fp32 on the GPU for big "
            f"problems) on fresh random inputs, {rule}, before it was timed (tolerances: appendix).")


def method(m: dict[str, Any], df: pd.DataFrame) -> str:
    """The Method paragraph: correctness, timers, warm-up, flush, stop rule, FLOPs, the speed ratio."""
    t = dict(((m.get("settings") or {}).get("timing")) or {})
    counts = df["timer"].value_counts() if "timer" in df else pd.Series(dtype=int)
    timed_with = ", ".join(f"{TIMER_WORDS.get(x, x)} for {int(counts.get(x, 0))} rows" for x in timers(df))
    warm = f"{_g(t['warmup_ms'])} ms of warm-up" if t.get("warmup_ms") is not None else "a warm-up"
    gpu_rows = bool(set(timers(df)) - {"host"})
    flush = ("" if not gpu_rows else ", the L2 left clean before every GPU call (faprof's flush, outside the timed region)"
             if t.get("flush_l2", True) else ", no L2 flush between calls")
    limits = _limits(t)
    conv = flop_convention(df[df["status"].isin(("ok", "wrong"))]) if "flops" in df else "unknown"
    bwd = "; backward 2.5× the forward (FlashAttention's convention)" if (df.get("direction") != "fwd").any() else ""
    rule, host = _stop_rule(t)
    return (f"{_correctness(m)} Times: {timed_with or 'no timer recorded'}. Each pair: {warm}{flush}, then calls "
            f"{rule}" + (f", {limits}" if limits else "") + (f"; {host}" if host and gpu_rows and "host" in set(timers(df)) else "")
            + ". "
            f"FLOPs: {_FLOP_WORDS.get(conv, 'not recorded')}{bwd}. Speed vs baseline is the baseline's median over the "
            "variant's (above 1: faster); a ratio over several shapes is their geometric mean.")
