"""`faprof gate`'s outputs: the console tables, a Markdown summary (a CI step summary), JUnit XML and JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET
from typing import Any

import pandas as pd
from rich.markup import escape
from rich.table import Table

from faprof.analysis.comparison.shift import AMBIGUOUS, FASTER, SAME, SLOWER
from faprof.gate.judge import EXIT_AMBIGUOUS, EXIT_OK, EXIT_REGRESSION, GateResult
from faprof.gate.verdicts import FAILED, MISSING, UNTIMED, WRONG, pct_text
from faprof.gate.why_moved import fmt_value
from faprof.store.disk import jsonable

#: Version of the JSON document `--json` writes (bumped when a key changes meaning).
JSON_SCHEMA = "faprof-gate/2"  # 2: verdicts with between-run noise, per-kernel `kernels`, row_ci_* and kernel_* columns

_STYLE = {SLOWER: "bold red", WRONG: "bold red", FAILED: "bold red", AMBIGUOUS: "yellow", FASTER: "green",
          SAME: "", UNTIMED: "dim", MISSING: "dim"}
#: A JUnit failure's or skip's message is cut here: CI pages show it on one line, and the whole text
#: is in the element's body and in system-out.
JUNIT_MESSAGE_CHARS = 500
#: Variants named per verdict in the counts line; more are counted ("and 3 more"), keeping it one line.
NAMES_IN_COUNTS = 6

#: Verdicts whose rows the console and Markdown tables list one by one; the rest are counted.
_LISTED = (WRONG, FAILED, SLOWER, AMBIGUOUS, FASTER)

EXIT_MEANING = {EXIT_OK: "pass: no gated row slower, wrong or failed, none undecided",
                EXIT_REGRESSION: "fail: a gated row is slower, or a candidate row is wrong or failed",
                EXIT_AMBIGUOUS: "ambiguous: no regression, but a kernel that looks slower past the threshold, "
                                "not significantly (--confirm re-times it)"}


def _f(x: Any, spec: str = ".3f") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(v) else format(v, spec)


def _ci(r: Any) -> str:
    """The row's interval with the run-to-run noise when it has one, else its samples' interval."""
    lo, hi = _f(r.get("row_ci_low")), _f(r.get("row_ci_high"))
    if not (lo and hi):
        lo, hi = _f(r["ci_low"]), _f(r["ci_high"])
    return f"{lo}-{hi}" if lo and hi else ""


def _kernel(r: Any) -> str:
    """'0.996x (0.962-1.031)' for a row judged with its kernel, 'row alone' for one judged alone."""
    if r.get("decided_by") == "row":
        return "row alone"
    k = _f(r.get("kernel_ratio"))
    return f"{k}x ({_f(r.get('kernel_ci_low'))}-{_f(r.get('kernel_ci_high'))})" if k else ""


def _names(rows: pd.DataFrame) -> str:
    names = list(dict.fromkeys(rows["variant"]))
    more = len(names) - NAMES_IN_COUNTS
    return ", ".join(names[:NAMES_IN_COUNTS]) + (f" and {more} more" if more > 0 else "")


def counts_text(result: GateResult) -> str:
    """'4 slower (fa2_mma); 1 wrong (x); 98 same; ...': every verdict with its count, the variants of regressions."""
    r = result.rows
    parts = []
    for v in (WRONG, FAILED, SLOWER, AMBIGUOUS, FASTER, SAME, UNTIMED, MISSING):
        sel = r[r["verdict"] == v]
        if sel.empty:
            continue
        text = f"{len(sel)} {v}"
        gated = sel[sel["regression"].astype(bool) | sel["undecided"].astype(bool)]
        if v in (WRONG, FAILED, SLOWER, AMBIGUOUS) and not gated.empty:
            text += f" ({_names(gated)})"
        ungated = int((~sel["gated"].astype(bool)).sum()) if v in (SLOWER, AMBIGUOUS, FASTER, SAME) else 0
        if ungated:
            text += f", {ungated} of them host-clock rows, not gated"
        parts.append(text)
    return "; ".join(parts) or "no rows"


def summary_line(result: GateResult) -> str:
    """The last line of `faprof gate`: the outcome, the exit code and the counts."""
    return (f"gate: {result.outcome.upper()} (exit {result.exit_code}): {counts_text(result)}; "
            f"threshold {pct_text(result.threshold)} ({result.threshold_source})")


# ----------------------------------------------------------------------------- console
def provenance_table(result: GateResult) -> Table:
    """Provenance item by item: baseline, candidate, and whether the difference matters."""
    t = Table(title="Provenance", header_style="bold")
    for col in ("item", "baseline", "candidate", ""):
        t.add_column(col)
    mark = {"same": "[green]same[/]", "info": "[dim]differs[/]", "warn": "[yellow]warning[/]",
            "refuse": "[bold red]refused[/]"}
    for c in result.checks:
        t.add_row(c.item, escape(c.baseline), escape(c.candidate), mark.get(c.level, c.level))
    return t


def listed_rows(result: GateResult) -> pd.DataFrame:
    """The rows a summary lists one by one: gated rows that moved or are ambiguous, and every regression."""
    r = result.rows
    if r.empty:
        return r
    return r[(r["verdict"].isin(_LISTED) & r["gated"].astype(bool)) | r["regression"].astype(bool)]


def verdict_table(result: GateResult, show_all: bool = False) -> Table:
    """The rows that need a look (`listed_rows`; every row with show_all)."""
    rows = result.rows if show_all else listed_rows(result)
    clocks = rows["ratio_equal_clock"].notna().any() if not rows.empty else False
    caption = (f"* undecided: its kernel looks slower by more than {pct_text(result.threshold)}, not significantly "
               "(--confirm re-times it)") if rows["undecided"].astype(bool).any() else None
    t = Table(title=f"Rows (threshold {pct_text(result.threshold)}; {result.confidence:.0%} intervals of candidate "
                    "time / baseline time with the run-to-run noise; each row judged with its kernel)",
              header_style="bold", caption=caption)
    cols = ["variant", "shape", "GPU", "verdict", "ratio", "CI", "kernel", *(["at equal clock"] if clocks else []),
            "baseline ms", "candidate ms", "why / notes"]
    multi_gpu = result.rows["gpu_name"].nunique() > 1
    for c in cols:
        if c == "GPU" and not multi_gpu:
            continue
        t.add_column(c, justify="right" if c in ("ratio", "CI", "kernel", "at equal clock", "baseline ms", "candidate ms")
                     else "left",
                     overflow="fold" if c == "why / notes" else "ellipsis")
    for _, r in rows.iterrows():
        v = r["verdict"]
        style = _STYLE.get(v, "") if (r["gated"] or v in (WRONG, FAILED)) else "dim"
        label = v + ("" if r["gated"] else " (not gated)") + (" *" if r["undecided"] else "")
        detail = "; ".join([*(r["notes"] or [])])
        if isinstance(r["why"], dict):
            detail = "; ".join(x for x in (r["why"].get("summary") or r["why"].get("note", ""), detail) if x)
        if v in (WRONG, FAILED, UNTIMED, MISSING):
            detail = "; ".join(x for x in (str(r["reason"]), detail) if x)
        t.add_row(r["variant"], r["shape_id"], *([str(r["gpu_name"])] if multi_gpu else []),
                  f"[{style}]{escape(label)}[/]" if style else escape(label), _f(r["ratio"]), _ci(r), _kernel(r),
                  *([_f(r["ratio_equal_clock"])] if clocks else []),
                  _f(r["median_ms_baseline"], ".4g"), _f(r["median_ms_candidate"], ".4g"), escape(detail))
    return t


def kernel_table(result: GateResult) -> Table:
    """One line per kernel (variant and GPU model) judged on all its rows: the gate's decisions."""
    t = Table(title=f"Kernels (all rows of a variant together; {result.confidence:.0%} interval, and adjusted for the "
                    "number of kernels, with the run-to-run noise)", header_style="bold")
    multi_gpu = not result.kernels.empty and result.kernels["gpu_name"].nunique() > 1
    for c in ("variant", *(["GPU"] if multi_gpu else []), "rows", "verdict", "ratio", "CI", "adjusted CI",
              "row spread", "noise used", "reason"):
        t.add_column(c, justify="right" if c in ("rows", "ratio", "CI", "adjusted CI", "row spread", "noise used")
                     else "left", overflow="fold" if c == "reason" else "ellipsis")
    for _, k in result.kernels.iterrows():
        v = k["verdict"] + ("" if k["gated"] else " (not gated)") + (" *" if k["undecided"] else "")
        style = _STYLE.get(k["verdict"], "") if k["gated"] else "dim"
        t.add_row(k["variant"], *([str(k["gpu_name"])] if multi_gpu else []), str(k["rows"]),
                  f"[{style}]{escape(v)}[/]" if style else escape(v), _f(k["ratio"]),
                  f"{_f(k['ci_low'])}-{_f(k['ci_high'])}", f"{_f(k['adj_low'])}-{_f(k['adj_high'])}",
                  _f(k["row_spread"], ".2%"), _f(k["noise_sd"], ".2%"), escape(_short(k["reason"])))
    return t


def _short(reason: str) -> str:
    """A kernel's reason without its figures (they are in the columns): what follows the last '): '."""
    return reason.rsplit("): ", 1)[-1]


def noise_line(result: GateResult) -> str:
    """Which between-run noise floors the kernels were judged with, in one line ('' when none)."""
    k = result.kernels
    if k.empty:
        return ""
    used = k[k["floor_gpu"] != "none"].drop_duplicates("floor_gpu")
    if used.empty:
        return "between-run noise: no floor (the runs' own samples and rows only)"
    return "between-run noise floor: " + "; ".join(
        f"{r['floor_gpu']}'s, a row {r['floor_row_sd']:.2%} and a kernel's offset {r['floor_offset_sd']:.2%} per run"
        for _, r in used.iterrows())


def unlisted_line(result: GateResult) -> str:
    """What the default table leaves out, in one line ('' when it lists every row)."""
    rest = len(result.rows) - len(listed_rows(result))
    return f"{rest} more row(s) not listed (same, untimed, missing, or host-clock rows, not gated): --show-all lists them" \
        if rest else ""


# ----------------------------------------------------------------------------- markdown
def _md(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _md_row(cells: list[Any]) -> str:
    return "| " + " | ".join(_md(c) for c in cells) + " |"


def _why_lines(why: dict[str, Any]) -> list[str]:
    out = []
    for c in why.get("advisor", []):
        ga, gb = c["baseline_gain_pct"], c["candidate_gain_pct"]
        gains = " -> ".join(f"~{g:.0f}%" if isinstance(g, float) and math.isfinite(g) else "-" for g in (ga, gb))
        out.append(f"  - advisor, {c['change']}: {c['title']} ({gains} of the call)")
    multi = len({c["kernel"] for c in why.get("counters", [])}) > 1
    for c in why.get("counters", []):
        k = f"`{c['kernel']}` " if multi else ""
        if c["counter"] == "kernel":
            out.append(f"  - kernel `{c['kernel']}` {'appeared' if c['candidate'] else 'vanished'}")
            continue
        rel = f" ({c['rel_change']:+.1%})" if isinstance(c["rel_change"], float) and math.isfinite(c["rel_change"]) else ""
        out.append(f"  - {k}{c['label']} (`{c['counter']}`): {fmt_value(c['baseline'], c['unit'])} -> "
                   f"{fmt_value(c['candidate'], c['unit'])}{rel}")
    for s in why.get("stalls", []):
        out.append(f"  - stall `{s['reason']}`: {s['baseline']:.1%} -> {s['candidate']:.1%} of the kernel's stall cycles")
    if why.get("note"):
        out.append(f"  - {why['note']}")
    return out


def render_markdown(result: GateResult) -> str:
    """A Markdown summary for a CI job's step summary: outcome, regressions with why, provenance, every row."""
    b, c = result.baseline, result.candidate
    lines = [f"## faprof gate: {result.outcome.upper()} (exit {result.exit_code})", "",
             f"- baseline: `{b['run_id']}` ({b.get('gpu_name') or 'CPU only'}, commit {b.get('git_sha') or '?'})",
             f"- candidate: `{c['run_id']}` ({c.get('gpu_name') or 'CPU only'}, commit {c.get('git_sha') or '?'})",
             f"- threshold {pct_text(result.threshold)} ({result.threshold_source}); each kernel judged on all its rows "
             f"(Hodges-Lehmann shifts of the kept samples) with the between-run noise, {result.confidence:.0%} intervals",
             *([f"- {noise_line(result)}"] if noise_line(result) else []),
             f"- {counts_text(result)}", ""]
    for w in [*result.warnings, *result.notes]:
        lines.append(f"> warning: {w}" if w in result.warnings else f"> note: {w}")
    if result.warnings or result.notes:
        lines.append("")
    if not result.kernels.empty:
        head = ["variant", "GPU", "rows", "verdict", "ratio", f"{result.confidence:.0%} CI", "adjusted CI",
                "row spread", "noise used", "why"]
        lines += ["### Kernels (all rows of a variant together)", "", _md_row(head), _md_row(["---"] * len(head))]
        for _, k in result.kernels.iterrows():
            v = k["verdict"] + ("" if k["gated"] else " (not gated)") + (" (undecided)" if k["undecided"] else "")
            lines.append(_md_row([k["variant"], k["gpu_name"], k["rows"], f"**{v}**" if k["regression"] else v,
                                  _f(k["ratio"]), f"{_f(k['ci_low'])}-{_f(k['ci_high'])}",
                                  f"{_f(k['adj_low'])}-{_f(k['adj_high'])}", _f(k["row_spread"], ".2%"),
                                  _f(k["noise_sd"], ".2%"), _short(k["reason"])]))
        lines.append("")
    listed = listed_rows(result)
    clocks = bool(listed["ratio_equal_clock"].notna().any()) if not listed.empty else False
    header = ["variant", "shape", "verdict", "ratio", f"{result.confidence:.0%} CI (runs)", "kernel",
              *(["at equal clock"] if clocks else []), "baseline ms", "candidate ms", "n (b / c)", "reason"]
    if not listed.empty:
        lines += ["### Rows that moved or could not be decided", "", _md_row(header), _md_row(["---"] * len(header))]
        for _, r in listed.iterrows():
            v = r["verdict"] + ("" if r["gated"] else " (not gated)") + (" (undecided)" if r["undecided"] else "")
            reason = "; ".join([str(r["reason"]), *(r["notes"] or [])])
            lines.append(_md_row([r["variant"], f"`{r['shape_id']}`", f"**{v}**" if r["regression"] else v,
                                  _f(r["ratio"]), _ci(r), _kernel(r), *([_f(r["ratio_equal_clock"])] if clocks else []),
                                  _f(r["median_ms_baseline"], ".4g"), _f(r["median_ms_candidate"], ".4g"),
                                  f"{r['n_baseline']} / {r['n_candidate']}", reason]))
        lines.append("")
    whys = result.rows[result.rows["why"].map(lambda w: isinstance(w, dict))]
    if not whys.empty:
        lines += ["### Why they moved (ncu and the advisor, baseline -> candidate)", ""]
        for _, r in whys.iterrows():
            lines.append(f"- **{r['variant']}** `{r['shape_id']}` ({_f(r['ratio'])}x): {r['why'].get('summary', '')}")
            lines += _why_lines(r["why"])
        lines.append("")
    lines += ["### Provenance", "", _md_row(["", "baseline", "candidate", ""]), _md_row(["---"] * 4)]
    for ch in result.checks:
        lines.append(_md_row([ch.item, ch.baseline, ch.candidate, {"same": "", "info": "differs",
                                                                   "warn": "**warning**"}.get(ch.level, ch.level)]))
    lines += ["", f"<details><summary>All {len(result.rows)} rows</summary>", "",
              _md_row(["variant", "shape", "GPU", "verdict", "ratio", "CI (runs)", "status (b / c)"]), _md_row(["---"] * 7)]
    for _, r in result.rows.iterrows():
        lines.append(_md_row([r["variant"], f"`{r['shape_id']}`", r["gpu_name"], r["verdict"], _f(r["ratio"]), _ci(r),
                              f"{r['status_baseline'] or '-'} / {r['status_candidate'] or '-'}"]))
    lines += ["", "</details>", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- JUnit
def render_junit(result: GateResult) -> str:
    """JUnit XML: one test case per row; regressions are failures, undecided and untimed or missing
    rows are skipped, everything else passes (with the reason in system-out)."""
    rows = result.rows
    failures = int(rows["regression"].astype(bool).sum()) if not rows.empty else 0
    skipped_mask = (rows["undecided"].astype(bool) | rows["verdict"].isin([UNTIMED, MISSING])) & ~rows["regression"].astype(bool)
    suite_name = f"faprof gate {result.baseline['run_id']} -> {result.candidate['run_id']}"
    top = ET.Element("testsuites", name="faprof gate", tests=str(len(rows)), failures=str(failures),
                     errors="0", skipped=str(int(skipped_mask.sum())))
    suite = ET.SubElement(top, "testsuite", name=suite_name, tests=str(len(rows)), failures=str(failures),
                          errors="0", skipped=str(int(skipped_mask.sum())))
    props = ET.SubElement(suite, "properties")
    for k, v in (("threshold", str(result.threshold)), ("threshold_source", result.threshold_source),
                 ("baseline", result.baseline["path"]), ("candidate", result.candidate["path"]),
                 ("exit_code", str(result.exit_code))):
        ET.SubElement(props, "property", name=k, value=v)
    multi_gpu = rows["gpu_name"].nunique() > 1 if not rows.empty else False
    for i, r in rows.iterrows():
        name = r["shape_id"] + (f" [{r['gpu_name']}]" if multi_gpu else "")
        case = ET.SubElement(suite, "testcase", classname=f"faprof.gate.{r['variant']}", name=name, time="0")
        text = "; ".join([f"{r['verdict']}: {r['reason']}", *(r["notes"] or [])])
        if isinstance(r["why"], dict):
            text += "\nwhy: " + (r["why"].get("summary") or r["why"].get("note", ""))
        if r["regression"]:
            failure = ET.SubElement(case, "failure", message=f"{r['verdict']}: {r['reason']}"[:JUNIT_MESSAGE_CHARS],
                                    type=str(r["verdict"]))
            failure.text = text
        elif skipped_mask.iloc[i]:
            ET.SubElement(case, "skipped", message=f"{r['verdict']}: {r['reason']}"[:JUNIT_MESSAGE_CHARS])
        ET.SubElement(case, "system-out").text = text
    ET.indent(top)
    return ET.tostring(top, encoding="unicode", xml_declaration=True) + "\n"


# ----------------------------------------------------------------------------- JSON
def result_dict(result: GateResult) -> dict[str, Any]:
    """The gate's answer as plain data: what `--json` writes."""
    return jsonable({
        "schema": JSON_SCHEMA, "outcome": result.outcome, "exit_code": result.exit_code,
        "exit_meaning": EXIT_MEANING[result.exit_code],
        "threshold": result.threshold, "threshold_source": result.threshold_source, "confidence": result.confidence,
        "method": ("per row, the Hodges-Lehmann shift of candidate/baseline time on log samples; per kernel, the "
                   "one-sample Hodges-Lehmann shift of its rows with a between-run noise model (a GPU model's "
                   "recorded floor updated by the rows' own spread; faprof/analysis/comparison/pool.py)"),
        "baseline": result.baseline, "candidate": result.candidate,
        "counts": {v: result.count(v) for v in (WRONG, FAILED, SLOWER, AMBIGUOUS, FASTER, SAME, UNTIMED, MISSING)},
        "provenance": [dataclasses.asdict(c) for c in result.checks], "warnings": result.warnings, "notes": result.notes,
        "reruns": result.reruns,
        "kernels": result.kernels.to_dict("records"),
        "rows": result.rows.to_dict("records"),
    })


def render_json(result: GateResult) -> str:
    """`result_dict` as indented JSON (NaN as null)."""
    return json.dumps(result_dict(result), indent=2, allow_nan=False) + "\n"
