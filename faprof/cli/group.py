"""The `faprof` click group and the printing helpers its commands share (console, errors, the results table)."""

from __future__ import annotations

import math
import sys
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from faprof import __version__
from faprof import variants as _variants  # noqa: F401  (fills the variant registry: scenarios name variants)
from faprof.errors import FaprofError

# Piped output (CI logs, a GPU machine's captured stdout) gets wide tables instead of rich's 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=200)

STATUS_STYLE = {"ok": "green", "wrong": "bold red", "untrusted": "bold magenta", "failed": "bold red", "unsupported": "yellow",
                "skipped": "dim"}


def say(message: str, style: str | None = None) -> None:
    """One line (or more) of prose on stdout, never hard-wrapped: paths and commands stay pasteable."""
    console.print(message, style=style, soft_wrap=True, highlight=False, markup=False)


def note(message: str) -> None:
    """A note on stdout before a command's output ('note: ...'): what the command chose for the user."""
    say(f"note: {message}", style="yellow")


def error_line(message: str, prefix: str = "error: ") -> None:
    """An error or hint on stderr exactly as written: click.echo never wraps, and colours only a terminal.

    (rich's Console(stderr=True) wraps at 80 columns when stderr is not a terminal, which split
    paths and the `--resume PATH` hint across lines.)
    """
    click.echo(click.style(prefix, fg="red", bold=True) + message, err=True)


class FaprofGroup(click.Group):
    """Prints FaprofError as a one-line message (no traceback) and exits with code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FaprofError as e:
            error_line(str(e))
            sys.exit(2)


@click.group(cls=FaprofGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="faprof")
def main() -> None:
    """Profile FlashAttention-style kernels and explain why one is slower than another.

    \b
    Typical use:
      faprof profile --scenario l4_causal          # measure, write a run bundle, print a table
      faprof list                                  # scenarios, variants, GPUs
      faprof doctor                                # what this machine can do
      faprof explain runs/<run>                    # why each variant is as fast as it is
      faprof gate perf/baseline runs/<run>         # CI: is any kernel slower than the baseline, and why
      faprof report runs/<run>                     # Markdown/HTML report that leads with the answer
    """


# --------------------------------------------------------------------------- helpers
def fmt(x: Any, spec: str = ".3g", empty: str = "") -> str:
    """`x` formatted with `spec`; `empty` for None and NaN, str(x) where the spec does not apply."""
    if x is None:
        return empty
    try:
        if isinstance(x, float) and math.isnan(x):
            return empty
        return format(x, spec)
    except (TypeError, ValueError):
        return str(x)


def _variant_label(r: Any) -> str:
    """The row's variant, with the aliases its kernel also stands for (one kernel, one row)."""
    from faprof.analysis.aliases import split
    from faprof.model.plan import also_label

    return also_label(str(r["variant"]), split(r.get("aliases")))


def results_table(df, baseline: str, title: str | None = None) -> Table:
    """The profile table: variant, shape, status, median ms, (GB/s and % of the measured copy where a
    problem is memory-bound,) TFLOP/s, % of peak, speedup, max error."""
    t = Table(title=title, show_lines=False, header_style="bold")
    multi = "gpu_name" in df.columns and df["gpu_name"].nunique() > 1  # a bundle of several GPU models
    if multi:
        t.add_column("GPU", justify="left")
    # memory-bound problems (decode) are measured by bandwidth: their GB/s and share of the run's measured
    # copy bandwidth lead, TFLOP/s and % of peak follow (a decode kernel at the copy limit is at 1% of peak)
    memory = "bound" in df.columns and bool((df["bound"] == "memory").any())
    rate_cols = ((("GB/s", "right"), ("% copy", "right")) if memory else ()) + (("TFLOP/s", "right"), ("% peak", "right"))
    for col, just in (("variant", "left"), ("shape", "left"), ("status", "left"), ("median ms", "right"),
                      ("95% CI of median", "right"), *rate_cols,
                      ("speedup", "right"), ("max err", "right"), ("ref", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for _, r in df.iterrows():
        status = r["status"]
        ci = ""
        if r.get("ci95_high_ms") is not None and not _isnan(r.get("ci95_high_ms")):
            ci = f"{fmt(r['ci95_low_ms'], '.4g')}–{fmt(r['ci95_high_ms'], '.4g')}"
        speed = r.get("speedup")
        shaky = " [yellow]unstable[/]" if r.get("unstable") is True or str(r.get("unstable")) == "True" else ""
        t.add_row(
            *([str(r["gpu_name"])] if multi else []), _variant_label(r), _shape_label(r), f"[{STATUS_STYLE.get(status, '')}]{status}[/]{shaky}",
            fmt(r.get("median_ms"), ".4g"), ci,
            *((fmt(r.get("gbps"), ",.0f"), fmt(r.get("pct_copy"), ".1f")) if memory else ()),
            fmt(r.get("tflops"), ".3g"), fmt(r.get("pct_peak"), ".1f"),
            (fmt(speed, ".2f") + "x") if speed is not None and not _isnan(speed) else "",
            fmt(r.get("max_abs_err"), ".1e"), _ref_short(r.get("reference")),
        )
    return t


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _ref_short(ref: Any) -> str:
    if not ref or _isnan(ref):
        return ""
    return {"cpu_ref fp64": "cpu64", "gpu fp32": "gpu32"}.get(ref, str(ref))


def _shape_label(r) -> str:
    """The problem in full: KV heads, the mask's corner, window and layout where the problem has them."""
    from faprof.analysis.labels import problem_label  # here, not at import: `faprof --help` loads no pandas

    return problem_label(r)


def _say_marked(df, flag: str, reason: str, say, words: str) -> None:
    """Rows whose `flag` column is set: a count line, five of them with their `reason`, and a pointer."""
    if flag not in df:
        return
    rows = df[df[flag].fillna(False).astype(bool)]
    if rows.empty:
        return
    say(f"  {len(rows)} row(s) {words}:", style="yellow")
    for _, r in rows.head(5).iterrows():
        say(f"    {r['variant']} {_shape_label(r)}: {r.get(reason)}", style="yellow")
    if len(rows) > 5:
        say(f"    ... and {len(rows) - 5} more (the bundle's {reason} column)", style="yellow")


def print_timing_note(df) -> None:
    """Which clock timed the rows, and rows measured while the GPU throttled (they carry a flag)."""
    if "timer" not in df:
        return
    names = {"cupti": "CUPTI kernel time per call (union of the call's kernel intervals)",
             "cuda_event": "CUDA events around each call (fallback: a few-µs floor per call)", "host": "host clock"}
    timers = [t for t in dict.fromkeys(df["timer"].dropna()) if t]
    # GPU rows' timers under "GPU times", CPU rows' (the host clock) under "CPU times": a run without a
    # GPU has only the latter, and its footer must not call host-clock times GPU times
    parts = [(label, [t for t in timers if (t == "host") == (label == "CPU times")]) for label in ("GPU times", "CPU times")]
    line = "; ".join(f"{label}: " + "; ".join(f"{names.get(t, t)}: {int((df['timer'] == t).sum())} rows" for t in ts)
                     for label, ts in parts if ts)
    if line:
        say(line)
    notes = sorted({str(n) for n in df.get("timer_note", []) if isinstance(n, str) and n})
    for n in notes[:3]:
        say(f"  timer fallback: {n}", style="yellow")
    _say_marked(df, "unstable", "unstable_reason", say,
                "have unstable timings (their medians may not repeat; compare does not test them)")
    _say_marked(df, "timing_flagged", "timing_flag_reason", say,
                "have flagged timings (the call's work is not all where the timer looks)")
    if "throttled" in df:
        thr = df[df["throttled"].fillna(False).astype(bool)]
        if not thr.empty:
            say(f"  {len(thr)} row(s) measured while the GPU throttled ({', '.join(sorted(set(thr['variant'])))}): "
                "see throttle_reasons in the bundle", style="yellow")


def print_baselines(df) -> None:
    """Say what the speedup column is relative to (a scenario's groups may have their own baselines)."""
    if "baseline" not in df:
        return
    per = df.groupby("baseline", sort=False)["group"].unique() if "group" in df else None
    if per is None or len(per) <= 1:
        say(f"speedup = {df['baseline'].iloc[0]}'s median / the row's median (above 1: faster than it)")
    else:
        parts = [f"{b} for {', '.join(str(g) for g in gs)}" for b, gs in per.items()]
        say("speedup = the baseline's median / the row's median; baselines: " + "; ".join(parts))
    notes = df["baseline_note"].fillna("").astype(str) if "baseline_note" in df else []
    for note in dict.fromkeys(n for n in notes if n):  # a fallback baseline (analysis.with_speedups)
        say(f"  {note}", style="yellow")


def print_reasons(df) -> None:
    """One line per (variant, status, reason) of the rows that are not ok."""
    bad = df[~df["status"].isin(["ok"])]
    if bad.empty:
        return
    seen = set()
    for _, r in bad.iterrows():
        key = (r["variant"], r["status"], r["reason"])
        if key in seen:
            continue
        seen.add(key)
        style = STATUS_STYLE.get(r["status"], "")
        console.print(f"  [{style}]{r['status']}[/] {r['variant']}: {escape(str(r['reason']))}", soft_wrap=True)


def print_sanitizer(bundle: Any, title: str, tools: list[str] | None = None) -> tuple[Any, dict[str, Any]]:
    """A sanitize bundle's findings table and each tool's ERROR SUMMARY; (findings, totals per tool)."""
    from faprof.run.sanitize import tool_totals

    df = bundle.read("sanitizer")
    per_tool = tool_totals(bundle)  # each tool's own ERROR SUMMARY, read again from its kept output
    totals = {str(r.tool): (None if r.hazards is None or r.hazards != r.hazards else int(r.hazards))
              for r in per_tool.itertuples()}
    t = Table(title=title, header_style="bold")
    for col in ("tool", "severity", "kind", "kernel", "source", "count"):
        t.add_column(col, justify="right" if col == "count" else "left")
    for r in df.itertuples():
        t.add_row(r.tool, r.severity, escape(str(r.kind)), escape(str(r.kernel))[:60], escape(str(r.source)), str(r.count))
    console.print(t)
    for tool in tools or list(totals):
        n = totals.get(tool)
        say(f"{tool}: " + ("did not finish (see raw/sanitizer_" + tool + ".txt)" if n is None else f"ERROR SUMMARY {n}"))
    return df, totals


# ------------------------------------------------------------------------ shared by profile and ncu
#: `faprof profile`'s and `faprof ncu`'s exit code when rows are failed or wrong or the ncu stage wrote no
#: tables (2 is a usage error, 130 Ctrl-C).
EXIT_ROWS_BAD = 3


def ncu_record(path: Any) -> dict[str, Any]:
    """The manifest's `ncu` entry of a bundle folder ({} when there is none)."""
    if not path:
        return {}
    from faprof.store import Bundle  # deferred: keeps `faprof --help` fast

    try:
        return Bundle.open(path).manifest().get("ncu") or {}
    except FaprofError:
        return {}


def print_ncu_outcome(rec: dict[str, Any]) -> int:
    """One line on the Nsight Compute stage; the exit code (0 tables written, 3 none)."""
    status = rec.get("status", "not run")
    if status == "ok":
        console.print(f"ncu: {rec.get('kernels')} kernel(s), {fmt(rec.get('passes'), 'g')} passes each, "
                      f"{fmt(rec.get('wall_s'), '.1f')} s (set {rec.get('set')}); rerun alone: {rec.get('rerun')}",
                      markup=False, soft_wrap=True)
        return 0
    error_line(str(rec.get("reason", "no tables")), prefix=f"ncu ({status}): ")
    return EXIT_ROWS_BAD
