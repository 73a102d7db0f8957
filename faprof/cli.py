"""The `faprof` command line: a thin shell over the stages (parse, call, print with rich)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from faprof import __version__
from faprof import variants as _variants  # noqa: F401  (fills the variant registry: scenarios name variants)
from faprof.errors import FaprofError

# Piped output (CI logs, a GPU machine's captured stdout) gets wide tables instead of rich's 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=200)

_STATUS_STYLE = {"ok": "green", "wrong": "bold red", "failed": "bold red", "unsupported": "yellow", "skipped": "dim"}


def say(message: str, style: str | None = None) -> None:
    """One line (or more) of prose on stdout, never hard-wrapped: paths and commands stay pasteable."""
    console.print(message, style=style, soft_wrap=True, highlight=False, markup=False)


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
def _fmt(x: Any, spec: str = ".3g", empty: str = "") -> str:
    if x is None:
        return empty
    try:
        if isinstance(x, float) and math.isnan(x):
            return empty
        return format(x, spec)
    except (TypeError, ValueError):
        return str(x)


def results_table(df, baseline: str, title: str | None = None) -> Table:
    """The profile table: variant, shape, status, median ms, TFLOP/s, % of peak, speedup, max error."""
    t = Table(title=title, show_lines=False, header_style="bold")
    multi = "gpu_name" in df.columns and df["gpu_name"].nunique() > 1  # a bundle of several GPU models
    if multi:
        t.add_column("GPU", justify="left")
    for col, just in (("variant", "left"), ("shape", "left"), ("status", "left"), ("median ms", "right"),
                      ("95% CI of median", "right"), ("TFLOP/s", "right"), ("% peak", "right"),
                      ("speedup", "right"), ("max err", "right"), ("ref", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for _, r in df.iterrows():
        status = r["status"]
        ci = ""
        if r.get("ci95_high_ms") is not None and not _isnan(r.get("ci95_high_ms")):
            ci = f"{_fmt(r['ci95_low_ms'], '.4g')}–{_fmt(r['ci95_high_ms'], '.4g')}"
        speed = r.get("speedup")
        shaky = " [yellow]unstable[/]" if r.get("unstable") is True or str(r.get("unstable")) == "True" else ""
        t.add_row(
            *([str(r["gpu_name"])] if multi else []), r["variant"], _shape_label(r), f"[{_STATUS_STYLE.get(status, '')}]{status}[/]{shaky}",
            _fmt(r.get("median_ms"), ".4g"), ci, _fmt(r.get("tflops"), ".3g"), _fmt(r.get("pct_peak"), ".1f"),
            (_fmt(speed, ".2f") + "x") if speed is not None and not _isnan(speed) else "",
            _fmt(r.get("max_abs_err"), ".1e"), _ref_short(r.get("reference")),
        )
    return t


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _ref_short(ref: Any) -> str:
    if not ref or _isnan(ref):
        return ""
    return {"cpu_ref fp64": "cpu64", "gpu fp32": "gpu32"}.get(ref, str(ref))


def _shape_label(r) -> str:
    s = f"S={r['Sq']}" if r["Sq"] == r["Sk"] else f"Sq={r['Sq']},Sk={r['Sk']}"
    mask = " causal" if r["causal"] else ""
    d = "" if r["direction"] == "fwd" else f" {r['direction']}"
    return f"B={r['B']} H={r['H']} {s} D={r['D']} {r['dtype']}{mask}{d}"


def _print_timing_note(df) -> None:
    """Which clock timed the rows, and rows measured while the GPU throttled (they carry a flag)."""
    if "timer" not in df:
        return
    names = {"cupti": "CUPTI kernel time per call (sum of the call's kernel durations)",
             "cuda_event": "CUDA events around each call (fallback: a few-µs floor per call)", "host": "host clock (CPU rows)"}
    timers = [t for t in dict.fromkeys(df["timer"].dropna()) if t]
    if timers:
        say("GPU times: " + "; ".join(f"{names.get(t, t)}: {int((df['timer'] == t).sum())} rows" for t in timers))
    notes = sorted({str(n) for n in df.get("timer_note", []) if isinstance(n, str) and n})
    for n in notes[:3]:
        say(f"  timer fallback: {n}", style="yellow")
    if "unstable" in df:
        shaky = df[df["unstable"].fillna(False).astype(bool)]
        if not shaky.empty:
            say(f"  {len(shaky)} row(s) have unstable timings (their medians may not repeat; compare does not test them):",
                style="yellow")
            for _, r in shaky.head(5).iterrows():
                say(f"    {r['variant']} {_shape_label(r)}: {r.get('unstable_reason')}", style="yellow")
            if len(shaky) > 5:
                say(f"    ... and {len(shaky) - 5} more (the bundle's unstable_reason column)", style="yellow")
    if "throttled" in df:
        thr = df[df["throttled"].fillna(False).astype(bool)]
        if not thr.empty:
            say(f"  {len(thr)} row(s) measured while the GPU throttled ({', '.join(sorted(set(thr['variant'])))}): "
                "see throttle_reasons in the bundle", style="yellow")


def _print_baselines(df) -> None:
    """Say what the speedup column is relative to (a scenario's groups may have their own baselines)."""
    if "baseline" not in df:
        return
    per = df.groupby("baseline", sort=False)["group"].unique() if "group" in df else None
    if per is None or len(per) <= 1:
        say(f"speedup = {df['baseline'].iloc[0]}'s median / the row's median (above 1: faster than it)")
        return
    parts = [f"{b} for {', '.join(str(g) for g in gs)}" for b, gs in per.items()]
    say("speedup = the baseline's median / the row's median; baselines: " + "; ".join(parts))


def _print_reasons(df) -> None:
    bad = df[~df["status"].isin(["ok"])]
    if bad.empty:
        return
    seen = set()
    for _, r in bad.iterrows():
        key = (r["variant"], r["status"], r["reason"])
        if key in seen:
            continue
        seen.add(key)
        style = _STATUS_STYLE.get(r["status"], "")
        console.print(f"  [{style}]{r['status']}[/] {r['variant']}: {escape(str(r['reason']))}", soft_wrap=True)


# ----------------------------------------------------------------------------- profile
#: `faprof profile`'s exit code when rows are failed or wrong (2 is a usage error, 130 Ctrl-C).
EXIT_ROWS_BAD = 3


@main.command()
@click.option("--scenario", "-s", "scenario", help="Scenario name (see `faprof list scenarios`) or path to a .toml file.")
@click.option("--variants", "-v", "variant_list", help="Comma-separated variant names to run instead of the scenario's ('all' for every variant).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Folder that receives the run bundle.")
@click.option("--resume", "resume", type=click.Path(path_type=Path), help="Finish an interrupted run bundle instead of starting a new one.")
@click.option("--ncu", is_flag=False, flag_value="faprof", type=click.Choice(["none", "faprof", "basic", "detailed", "full"]),
              help="Collect Nsight Compute metrics with this section set (a bare --ncu: 'faprof', the sections faprof's tables read).")
@click.option("--ncu-variants", help="Variants ncu profiles (default: faprof's and user kernels, sdpa_flash/cudnn/efficient).")
@click.option("--ncu-shapes", help="Shapes ncu profiles: shape ids and/or 'smallest', 'largest' (per problem group).")
@click.option("--ncu-kernel", help="Profile only kernels whose function name matches this regex.")
@click.option("--ncu-launches", type=click.IntRange(1, 100), help="Profiled calls per (variant, shape) (default 1).")
@click.option("--ncu-source", type=click.Choice(["auto", "all", "off"]), help="Source-line pass after the section set: "
              "each variant's dominant kernel (auto, the default), every profiled kernel (all), or none (off).")
@click.option("--ncu-cache-control", type=click.Choice(["all", "none"]), help="ncu --cache-control (default all: caches flushed before every replay pass).")
@click.option("--ncu-clock-control", type=click.Choice(["none", "base"]), help="ncu --clock-control (default none: the card as it is; 'base' locks base clocks).")
@click.option("--nsys/--no-nsys", default=None, help="Capture an Nsight Systems timeline.")
@click.option("--budget", type=float, help="Timing budget per variant and shape, in seconds (overrides the scenario).")
@click.option("--user-variants", "user_variants", multiple=True, help="A .py file or module registering extra variants (repeatable).")
@click.option("--kernel", "kernels", multiple=True,
              help="Your kernel as a variant: FILE.cu[:LAUNCHER] (built with nvcc, see faprof_attention.h) or FILE.py:FUNCTION (repeatable).")
@click.option("--name", "kernel_name", help="Variant name for the one --kernel (default: the file's stem).")
@click.option("--no-isolate", is_flag=True, help="Run variants in this process instead of a worker (no fault containment).")
@click.option("--timeout", "task_timeout", type=float, default=600.0, show_default=True, help="Seconds before a variant counts as hung.")
@click.option("--timer", type=click.Choice(["auto", "cupti", "events"]),
              help="GPU time source (overrides the scenario): CUPTI kernel records (auto: when cupti-python works) or CUDA events.")
@click.option("--allow-failures", is_flag=True, help=f"Exit 0 even when rows are failed or wrong (default: exit {EXIT_ROWS_BAD}).")
@click.option("--gpus", "gpus", help="Run on several GPUs of this machine, one worker each: 'all' or indices, e.g. 0,1.")
@click.option("--cluster", "cluster", help="Run the tasks on a Dask cluster: the scheduler's address, e.g. tcp://host:8786 "
              "(needs pip install 'faprof[cluster]').")
def profile(scenario: str | None, variant_list: str | None, out_dir: Path, resume: Path | None, ncu: str | None,
            ncu_variants: str | None, ncu_shapes: str | None, ncu_kernel: str | None, ncu_launches: int | None,
            ncu_source: str | None,
            ncu_cache_control: str | None, ncu_clock_control: str | None, nsys: bool | None, budget: float | None,
            user_variants: tuple[str, ...], kernels: tuple[str, ...], kernel_name: str | None, no_isolate: bool,
            task_timeout: float, timer: str | None, allow_failures: bool, gpus: str | None, cluster: str | None) -> None:
    """Measure a scenario's variants on its problems and write a run bundle.

    Each variant is checked against a reference before it is timed. Rows are written as they
    finish; an interrupted run is completed with --resume; `faprof ncu RUN` re-runs Nsight Compute
    alone on a bundle.

    \b
    Exit codes: 0 done, every row ok (or unsupported/skipped); 1 an unexpected error;
    2 bad input (one line says what); 3 some rows are `failed` or `wrong` (--allow-failures
    exits 0 for those), or the Nsight Compute stage asked for produced no tables (the reason is
    printed; the timing rows are complete in the bundle); 130 interrupted (finished rows kept).
    """
    from faprof import run as runner
    from faprof.analysis import core as analysis
    from faprof.model.scenarios import load_scenario

    if not scenario and not resume:
        raise FaprofError("give --scenario NAME|PATH (see `faprof list scenarios`) or --resume RUN")
    if resume and (scenario or variant_list is not None):
        raise FaprofError("--resume finishes a run as it was started: drop --scenario/--variants, or start a new run")
    from faprof.model.plan import plan, split_list

    names = [v.strip() for v in variant_list.split(",") if v.strip()] if variant_list is not None else None
    if names == []:
        raise FaprofError(f"--variants {variant_list!r} names no variant: give comma-separated names "
                          "(see `faprof list variants`), 'all', or leave --variants out for the scenario's own")
    if resume and kernels:
        raise FaprofError("--resume finishes a run with the kernels it was started with: drop --kernel")
    if kernel_name is not None and len(kernels) != 1:
        raise FaprofError("--name names the one --kernel; with several, write --kernel NAME=FILE.cu[:LAUNCHER]")
    from faprof.variants.user_kernel import make_spec

    kernel_specs = [make_spec(k, kernel_name) for k in kernels]
    if gpus is not None and cluster:
        raise FaprofError("--gpus runs on this machine's GPUs, --cluster on a Dask cluster's workers: give one of them")
    if (gpus is not None or cluster) and no_isolate:
        raise FaprofError("--gpus and --cluster run every task in a worker process: drop --no-isolate")
    from faprof.run.pool import parse_gpus

    options = runner.ProfileOptions(
        gpus=parse_gpus(gpus), cluster=cluster,
        variants=names,
        out_dir=out_dir, ncu=ncu, nsys=nsys, isolate=not no_isolate, task_timeout_s=task_timeout,
        ncu_cache_control=ncu_cache_control, ncu_clock_control=ncu_clock_control,
        ncu_variants=split_list(ncu_variants) or None, ncu_shapes=split_list(ncu_shapes) or None,
        ncu_kernel=ncu_kernel, ncu_launches=ncu_launches, ncu_source=ncu_source,
        user_variants=[*user_variants, *kernel_specs],
        settings_overrides={**({"budget_s": budget} if budget is not None else {}), **({"timer": timer} if timer else {})},
    )
    from faprof.variants import load_user_variants

    for spec in user_variants:
        load_user_variants(spec)
    kernel_names = [n for spec in kernel_specs for n in load_user_variants(spec)]  # builds: errors stop here
    if scenario and not resume:
        scn = load_scenario(scenario)  # validate before any work starts
        if kernel_names and names is None and scn.variants != ["all"]:  # the scenario's variants and yours
            options.variants = list(dict.fromkeys([*scn.variants, *kernel_names]))
        elif kernel_names and names is not None and names != ["all"]:
            options.variants = list(dict.fromkeys([*names, *kernel_names]))
        plan(scn, options.variants)  # an unknown variant is one line before the progress bar is drawn
        _check_ncu_selectors(scn, options, ncu if ncu is not None else scn.collect["ncu"], explicit=ncu is not None)
    state: dict[str, Any] = {"notices": []}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[current]}"), console=console, transient=False) as bar:
        task_id = bar.add_task("profiling", total=None, current="")

        def on(event: str, info: dict[str, Any]) -> None:
            if event == "status":
                bar.update(task_id, current=info["message"])
            elif event == "bundle":
                state["path"] = info["path"]
                bar.console.print(f"bundle: {info['path']}", soft_wrap=True, highlight=False)
            elif event == "start":
                bar.update(task_id, total=info["total"], completed=info["done"], current="")
            elif event == "row":
                bar.advance(task_id)
                bar.update(task_id, current=f"{info['variant']} {info['label']} -> {info['status']}")
            elif event in ("warning", "nsight"):
                bar.console.print(info.get("message", ""), style="yellow", soft_wrap=True, highlight=False)
                if event == "warning" and info.get("message") and info["message"] not in state["notices"]:
                    state["notices"].append(info["message"])  # repeated under the table: they scroll away
                if event == "nsight":
                    bar.update(task_id, current=info.get("message", ""))

        try:
            bundle = runner.profile(scenario or "", options, progress=on, resume=resume)
        except KeyboardInterrupt:
            path = state.get("path")
            click.echo("", err=True)
            if path:
                error_line(f"finished rows are kept in {path}; complete the run with:", prefix="interrupted: ")
                click.echo(f"  faprof profile --resume {path}", err=True)
            else:
                error_line("no bundle was written yet", prefix="interrupted: ")
            ncu_rec = _ncu_record(path)
            if ncu_rec.get("status") == "interrupted" and ncu_rec.get("rerun"):
                error_line("Nsight Compute was interrupted; re-run it alone with:", prefix="")
                click.echo(f"  {ncu_rec['rerun']}", err=True)
            sys.exit(130)
    m = bundle.manifest()
    df = analysis.speedups_for(bundle.measurements(), m)
    env = m.get("env", {})
    gpu = env.get("gpu_name") or "no GPU (CPU only)"
    console.print(results_table(df, m["scenario"]["baseline"], title=f"{m['scenario']['name']} on {gpu}"))
    _print_baselines(df)
    _print_timing_note(df)
    _print_reasons(df)
    counts = df["status"].value_counts().to_dict()
    say("status: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    for notice in state["notices"]:
        say(f"notice: {notice}", style="yellow")
    say(f"bundle: {bundle.path}")
    ncu_set = (m.get("settings") or {}).get("ncu")
    ncu_code = _print_ncu_outcome(m.get("ncu") or {}) if ncu_set and ncu_set != "none" else 0
    rows_code = 0
    bad = df[df["status"].isin(["failed", "wrong"])]
    if not bad.empty:
        what = ", ".join(f"{n} {st}" for st, n in bad["status"].value_counts().items())
        bad_names = ", ".join(sorted(set(bad["variant"])))
        if allow_failures:
            say(f"{what} ({bad_names}); exit 0 (--allow-failures)")
        else:
            say(f"exit {EXIT_ROWS_BAD}: {what} ({bad_names}); see the reasons above, or pass --allow-failures to exit 0",
                style="bold red")
            rows_code = EXIT_ROWS_BAD
    if rows_code or ncu_code:
        sys.exit(rows_code or ncu_code)


def _ncu_record(path: Any) -> dict[str, Any]:
    """The manifest's `ncu` entry of a bundle folder ({} when there is none)."""
    if not path:
        return {}
    from faprof.store import Bundle

    try:
        return Bundle.open(path).manifest().get("ncu") or {}
    except FaprofError:
        return {}


def _check_ncu_selectors(scn: Any, options: Any, ncu_set: str | None, explicit: bool) -> None:
    """Refuse bad --ncu-* selectors before any work starts (unknown variant or shape, bad regex, nothing to
    profile); a scenario file's own `collect.ncu` is only checked when selectors are given."""
    from faprof.nsight.ncu import command as ncu_command
    from faprof.nsight.ncu import plan as ncu_plan

    given = [n for n, v in (("--ncu-variants", options.ncu_variants), ("--ncu-shapes", options.ncu_shapes),
                            ("--ncu-kernel", options.ncu_kernel), ("--ncu-launches", options.ncu_launches)) if v]
    if not ncu_set or ncu_set == "none":
        if given:
            raise FaprofError(f"{', '.join(given)} select(s) what Nsight Compute profiles: add --ncu [SET]")
        return
    if not (explicit or given):
        return
    if not options.ncu_variants:  # torch baselines are left out by default: say so, not "nothing supported"
        from faprof.model.plan import plan

        by_name = {v.name: v for _, v in plan(scn, options.variants)}
        chosen, left = ncu_plan.default_targets(list(by_name.values()))
        if not chosen and left:
            why = "; ".join(f"{k}: {v}" for k, v in left.items())
            raise FaprofError(f"--ncu has no kernel to profile by default among {', '.join(left)} ({why}); name the "
                              f"ones to profile kernel by kernel with --ncu-variants (e.g. --ncu-variants {next(iter(left))})"
                              " or drop --ncu")
    settings = ncu_command.NcuSettings.resolve(options, scn, ncu_set)
    ncu_plan.plan_for(scn, options, ncu_set, settings, costs={})


def _print_ncu_outcome(rec: dict[str, Any]) -> int:
    """One line on the Nsight Compute stage; the exit code (0 tables written, 3 none)."""
    status = rec.get("status", "not run")
    if status == "ok":
        console.print(f"ncu: {rec.get('kernels')} kernel(s), {_fmt(rec.get('passes'), 'g')} passes each, "
                      f"{_fmt(rec.get('wall_s'), '.1f')} s (set {rec.get('set')}); rerun alone: {rec.get('rerun')}",
                      markup=False, soft_wrap=True)
        return 0
    error_line(str(rec.get("reason", "no tables")), prefix=f"ncu ({status}): ")
    return 3


# --------------------------------------------------------------------------------- ncu
@main.command(name="ncu")
@click.argument("run")
@click.option("--set", "ncu_set", type=click.Choice(["faprof", "basic", "detailed", "full"]), default="faprof",
              show_default=True, help="Section set ('faprof': the sections faprof's tables read).")
@click.option("--variants", "ncu_variants", help="Variants to profile (default: faprof's and user kernels, sdpa_flash/cudnn/efficient).")
@click.option("--shapes", "ncu_shapes", help="Shape ids and/or 'smallest', 'largest' (per problem group).")
@click.option("--kernel", "ncu_kernel", help="Profile only kernels whose function name matches this regex.")
@click.option("--launches", "ncu_launches", type=click.IntRange(1, 100), help="Profiled calls per (variant, shape) (default 1).")
@click.option("--source", "ncu_source", type=click.Choice(["auto", "all", "off"]), default="auto", show_default=True,
              help="Source-line pass after the set: each variant's dominant kernel, every profiled kernel, or none.")
@click.option("--cache-control", "ncu_cache_control", type=click.Choice(["all", "none"]), help="ncu --cache-control (default all).")
@click.option("--clock-control", "ncu_clock_control", type=click.Choice(["none", "base"]), help="ncu --clock-control (default none).")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def ncu_cmd(run: str, ncu_set: str, ncu_variants: str | None, ncu_shapes: str | None, ncu_kernel: str | None,
            ncu_launches: int | None, ncu_source: str, ncu_cache_control: str | None, ncu_clock_control: str | None,
            runs_dir: Path) -> None:
    """Run Nsight Compute alone on a run bundle (finished or interrupted); its timing rows stay as they are.

    Prints the plan (kernels, passes, estimated time) first, then writes ncu_metrics, ncu_summary,
    stalls, roofline and ncu_rules into the bundle (replacing an earlier session's; a failed
    session leaves an earlier successful one in place).

    \b
    Exit codes: 0 tables written; 2 bad input (unknown run, variant or shape id, a kernel regex
    matching none of the kernels seen before, another GPU); 3 no tables (ncu missing, no counter
    permission, the regex matched nothing, ncu failed: one line says why); 130 interrupted.
    """
    from faprof.model.plan import split_list
    from faprof.model.scenarios import parse_scenario
    from faprof.nsight.ncu.run import NcuOptions, rerun, this_gpu
    from faprof.nsight.ncu.source_run import collect_source
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir)
    if not this_gpu()[0]:  # before the bundle's user kernels are built for a GPU that is not there
        raise FaprofError("no CUDA GPU visible here: Nsight Compute needs the GPU the bundle was measured on "
                          f"({(bundle.manifest().get('env') or {}).get('gpu_name') or 'none recorded'}); "
                          "run `faprof ncu` on that machine")
    opts = NcuOptions(ncu_variants=split_list(ncu_variants) or None, ncu_shapes=split_list(ncu_shapes) or None,
                      ncu_kernel=ncu_kernel, ncu_launches=ncu_launches, ncu_cache_control=ncu_cache_control,
                      ncu_clock_control=ncu_clock_control, ncu_source=ncu_source)
    console.print(f"bundle: {bundle.path}", markup=False, soft_wrap=True)

    def on(event: str, info: dict[str, Any]) -> None:
        if event in ("warning", "nsight"):
            console.print(info.get("message", ""), markup=False, soft_wrap=True,
                          style="yellow" if event == "warning" else None)

    try:
        rec = rerun(bundle, ncu_set, opts, on)
        if rec.get("status") == "ok":
            scenario = parse_scenario(bundle.manifest()["scenario"]["raw"], f"{bundle.path}/manifest.json scenario")
            collect_source(bundle, scenario, opts, ncu_source, on)
            rec = bundle.manifest().get("ncu", rec)
    except KeyboardInterrupt:
        rec = _ncu_record(bundle.path)
        click.echo("", err=True)
        error_line(str(rec.get("reason") or "Nsight Compute stopped"), prefix="interrupted: ")
        sys.exit(130)
    sys.exit(_print_ncu_outcome(rec))


# -------------------------------------------------------------------------------- list
@main.command(name="list")
@click.argument("what", type=click.Choice(["all", "scenarios", "variants", "gpus"]), default="all")
@click.option("--hidden", is_flag=True, help="Also list test-only variants.")
def list_cmd(what: str, hidden: bool) -> None:
    """List scenarios, variants and known GPUs."""
    if what in ("all", "scenarios"):
        from faprof.model.scenarios import list_scenarios, load_scenario

        t = Table(title="scenarios", header_style="bold")
        for c in ("name", "problems", "baseline", "description"):
            t.add_column(c)
        for name in list_scenarios():
            try:
                s = load_scenario(name)
                t.add_row(name, str(len(s.problems)), s.baseline, s.description)
            except FaprofError as e:
                t.add_row(name, "", "", f"[red]invalid: {e}[/]")
        console.print(t)
    if what in ("all", "variants"):
        from faprof.variants import all_variants

        t = Table(title="variants", header_style="bold")
        for c in ("name", "kind", "device", "dtypes", "directions", "description"):
            t.add_column(c)
        for v in all_variants(include_hidden=hidden):
            t.add_row(v.name, v.kind, v.device, ",".join(v.dtypes), ",".join(v.directions), v.description)
        console.print(t)
    if what in ("all", "gpus"):
        from faprof.model import gpus

        df = gpus.as_dataframe()
        t = Table(title="GPUs (datasheet figures; dense tensor rates, fp32 accumulate)", header_style="bold")
        cols = [("name", "GPU"), ("cc", "CC"), ("sms", "SMs"), ("mem_bw_gbs", "GB/s"), ("l2_mb", "L2 MB"),
                ("fp32_tflops", "fp32"), ("fp16_tensor_tflops", "fp16 TC"), ("bf16_tensor_tflops", "bf16 TC")]
        for _, label in cols:
            t.add_column(label)
        for _, r in df.iterrows():
            t.add_row(*[_fmt(r[c], "g") for c, _ in cols])
        console.print(t)


# ------------------------------------------------------------------------------ doctor
@main.command()
def doctor() -> None:
    """Check this machine: Python, torch and its CUDA, GPU, nvcc, ninja (and the Nsight tools)."""
    from faprof import doctor as doc

    checks = doc.run_checks()
    t = Table(title="faprof doctor", header_style="bold")
    for c in ("check", "status", "detail"):
        t.add_column(c)
    style = {"ok": "green", "warn": "yellow", "fail": "red", "info": "cyan"}
    for chk in checks:
        t.add_row(chk.name, f"[{style[chk.status]}]{chk.status}[/]", chk.detail)
    console.print(t)
    for chk in checks:
        if chk.hint and chk.status in ("warn", "fail"):
            console.print(f"[{style[chk.status]}]{chk.name}[/]: {escape(chk.hint)}", soft_wrap=True)


# ------------------------------------------------------------------------------ export
@main.command()
@click.argument("run")
@click.option("--csv", "csv_dir", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder for the CSV files.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def export(run: str, csv_dir: Path, runs_dir: Path) -> None:
    """Write a run bundle's tables as CSV files (and its manifest as JSON)."""
    from faprof.store import export_csv, resolve_run

    bundle = resolve_run(run, runs_dir)
    for p in export_csv(bundle, csv_dir):
        say(f"wrote {p}")


# ------------------------------------------------------------------------------- build
@main.command()
@click.option("--arch", default="sm_80,sm_89,sm_90", show_default=True, help="Comma-separated archs to compile for with nvcc (no GPU needed).")
@click.option("--load", "do_load", is_flag=True, help="Instead: JIT-build (or load from the cache) the torch extension for the GPU present and print the time.")
def build(arch: str, do_load: bool) -> None:
    """Compile the kernels with nvcc and print ptxas' resource usage and the occupancy it implies.

    With --load, build the torch extension for this GPU instead: the first run compiles (cold),
    later runs in new processes reuse the cached build (warm) while sources and flags are unchanged.
    """
    from faprof.variants import build as b

    if do_load:
        info = b.load()
        say(f"extension: {info.summary()}")
        return
    archs = tuple(a.strip() for a in arch.split(",") if a.strip())
    if not archs:
        raise FaprofError(f"--arch {arch!r} names no architecture: give e.g. sm_80,sm_89,sm_90")
    for a in archs:
        b.require_kernel_arch(a)  # one line before any nvcc runs
    with console.status(f"compiling kernels/*.cu for {', '.join(archs)} (unchanged files come from the cache)"):
        from faprof.variants.ptxas import resource_report

        df = resource_report(archs=archs)
    console.print(build_table(df))
    compiled, pairs = df.attrs.get("compiled"), df.attrs.get("pairs")
    if pairs:
        say(f"{compiled} of {pairs} (file, arch) compiles ran; the rest reused ptxas output cached by source hash "
            f"under {b.cache_root() / 'ptxas'}" if compiled != pairs else f"compiled {pairs} (file, arch) pairs")
    spill = df["spill_store_bytes"].fillna(0).gt(0) | df["spill_load_bytes"].fillna(0).gt(0)
    if spill.any():
        say(f"{int(spill.sum())} kernel/arch pair(s) spill registers to local memory", style="yellow")


def build_table(df) -> Table:
    """ptxas' table for people: one row per kernel instantiation and arch, the template arguments
    in full in their own column (folded, never cut), shared memory in KiB, occupancy as a whole %."""
    t = Table(title="ptxas resource usage per kernel and arch, and the theoretical occupancy it implies "
                    "(namespaces dropped from names)", header_style="bold")
    t.add_column("file")
    t.add_column("kernel")
    t.add_column("template arguments", overflow="fold", min_width=16)
    for label in ("D", "arch", "threads", "regs", "smem KiB", "stack B", "spills B (st/ld)", "blocks/SM", "occupancy"):
        t.add_column(label, justify="right", no_wrap=True)
    t.add_column("limited by", no_wrap=True)
    prev = None
    for _, r in df.iterrows():
        smem = _num(r.get("smem_static_bytes")) + _num(r.get("dyn_smem_bytes"), 0.0)
        st, ld = _num(r.get("spill_store_bytes"), 0.0), _num(r.get("spill_load_bytes"), 0.0)
        occ = _num(r.get("occupancy_pct"))
        spills = "0" if st == 0 and ld == 0 else f"[yellow]{st:.0f}/{ld:.0f}[/]"
        same = prev is not None and (prev["file"], prev["name"]) == (r["file"], r["name"])
        t.add_row(
            "" if same else str(r["file"]), "" if same else _unqualified(r["name"]), _unqualified(r.get("template_args")),
            _int(r.get("D")), str(r["arch"]), _int(r.get("threads")),
            _int(r.get("registers")) + (f" ({r['role_registers']})" if isinstance(r.get("role_registers"), str) and r["role_registers"] else ""),
            "" if smem != smem else f"{smem / 1024:.1f}", _int(r.get("stack_frame_bytes")), spills,
            _int(r.get("blocks_per_sm")), "" if occ != occ else f"{occ:.0f}%", str(r.get("limiter") or ""),
        )
        prev = r
    return t


def _unqualified(name: Any) -> str:
    """'ns::Cfg<64, 128>, true' -> 'Cfg<64, 128>, true': every argument kept, namespaces dropped."""
    import re

    return re.sub(r"\b[A-Za-z_]\w*::", "", str(name or ""))


def _num(x: Any, default: float = float("nan")) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return default if v != v else v


def _int(x: Any) -> str:
    v = _num(x)
    return "" if v != v else f"{v:.0f}"


# ------------------------------------------------------------------------------ report
@main.command()
@click.argument("run")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def show(run: str, runs_dir: Path) -> None:
    """Print a run bundle's table again (RUN: a folder, a run id prefix, or 'latest')."""
    from faprof.analysis import core as analysis
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir)
    m = bundle.manifest()
    if m.get("kind") == "sanitize":
        _print_sanitizer(bundle, f"compute-sanitizer: {', '.join((m.get('settings') or {}).get('variants') or [])} "
                                 f"on {(m.get('scenario') or {}).get('name')}")
        return
    df = analysis.speedups_for(bundle.measurements(), m)
    if df.empty:
        raise FaprofError(f"{bundle.path} has no measurements yet (status: {m.get('status')})")
    gpu = m.get("env", {}).get("gpu_name") or "no GPU (CPU only)"
    console.print(results_table(df, m["scenario"]["baseline"], title=f"{m['scenario']['name']} on {gpu} ({m.get('status')})"))
    _print_baselines(df)
    _print_timing_note(df)
    _print_reasons(df)


# ------------------------------------------------------------------------------ report
@main.command()
@click.argument("run")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the report (default: RUN/report/, printed at the end).")
@click.option("--format", "formats", default="md,html,csv", show_default=True,
              help="Comma-separated: md (report.md with PNG charts when kaleido works, and appendix.md), html "
                   "(report.html, self-contained, interactive charts, the appendix collapsed), csv (csv/: every table).")
@click.option("--focus", "focus", help="A variant: the report is about it against the rest (per shape: it, the baseline, "
              "the fastest other variant; its causes only).")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def report(run: str, out_dir: Path | None, formats: str, focus: str | None, runs_dir: Path) -> None:
    """Write a report of a run bundle that leads with the answer: how fast, against what, why.

    report.md fits a page or two; appendix.md has every table (report.html: both, the appendix in
    collapsed sections); csv/ every table as CSV. Into RUN/report/ unless --out says otherwise.
    Everything is read and rendered before the folder is made, so a damaged bundle leaves nothing behind.
    """
    from faprof.report.writer import write_reports
    from faprof.store import resolve_run

    fmts = tuple(dict.fromkeys(f.strip().lower() for f in formats.split(",") if f.strip()))
    bad = set(fmts) - {"md", "html", "csv"}
    if bad or not fmts:
        raise FaprofError(f"unknown report format(s) {sorted(bad) or [formats]}: use md, html and/or csv")
    bundle = resolve_run(run, runs_dir)
    if bundle.measurements().empty and bundle.manifest().get("kind") != "sanitize":
        raise FaprofError(f"{bundle.path} has no measurements yet; nothing to report")
    dest = out_dir or bundle.path / "report"
    written = write_reports(bundle, dest, fmts, notice=lambda m: say(f"note: {m}", style="yellow"), focus=focus)
    for p in written:
        say(f"wrote {p}")
    main_file = next((p for p in written if p.suffix in (".md", ".html")), None)
    if main_file is not None:
        say(f"report: {main_file}")


@main.command()
@click.argument("run")
@click.option("--variant", "variant", help="Only this variant.")
@click.option("--shape", "shape", help="Only this shape_id: its ranked findings, one by one.")
@click.option("--per-shape", is_flag=True, help="Ranked findings of every (variant, shape) instead of the summary across shapes.")
@click.option("--against", "against", help="Explain each variant's gap to this variant (default: the fastest profiled one at each shape).")
@click.option("--format", "fmt", type=click.Choice(["table", "text", "md"]), default="table", show_default=True,
              help="A rich table, plain text, or Markdown.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def explain(run: str, variant: str | None, shape: str | None, per_shape: bool, against: str | None, fmt: str,
            runs_dir: Path) -> None:
    """Why each variant is as fast as it is: the advisor's ranked diagnosis of a run bundle.

    One primary cause per (variant, shape) with its estimated share of the call's time, then the
    secondary findings; by default aggregated across shapes (one row per variant and cause).
    """
    from faprof import advisor
    from faprof.measure.wrong_text import explain_wrong_rows
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir)
    # wrong rows first: which bug it looks like and where (the timing findings wait for a right result)
    wrong = explain_wrong_rows(bundle.measurements(), bundle.read("error_maps"), variant, shape)
    for line in wrong:
        console.print(line, markup=False, soft_wrap=True, style="bold red" if not line.startswith(" ") else None)
    if against and against not in set(bundle.measurements()["variant"]):
        raise FaprofError(f"--against {against!r}: no such variant in {bundle.path.name}")
    diag = advisor.diagnose(bundle, against=against)
    for key, val in (("variant", variant), ("shape_id", shape)):
        if val and not diag.empty and val not in set(diag[key]):
            known = ", ".join(dict.fromkeys(diag[key]))
            raise FaprofError(f"no findings for {key} {val!r} in {bundle.path.name}; with findings: {known}")
    diag = advisor.select(diag, variant, shape)
    if diag.empty and wrong:
        return
    if diag.empty:
        console.print(f"No findings for {bundle.path.name}: the advisor needs timed rows with ncu and/or nsys tables "
                      "(run `faprof profile ... --ncu --nsys`).")
        return
    per = per_shape or bool(shape)
    if fmt == "md":
        console.print(advisor.render_markdown(diag, per_shape=per), markup=False, soft_wrap=True)
    elif fmt == "text":
        console.print(advisor.render_text(diag, per_shape=per, width=console.width), markup=False, soft_wrap=True)
    else:
        console.print(advisor.rich_table(diag, per_shape=per, title=f"Why: {bundle.path.name}"))


@main.command()
@click.argument("run_a")
@click.argument("run_b", required=False)
@click.option("--gpu-a", help="GPU model of RUN_A's rows to compare (a bundle of several GPU models, from --gpus).")
@click.option("--gpu-b", help="GPU model of RUN_B's rows to compare.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def compare(run_a: str, run_b: str | None, gpu_a: str | None, gpu_b: str | None, runs_dir: Path) -> None:
    """Compare two runs row by row: medians, which is faster and by how much, and whether each difference is
    significant (two-sided Mann-Whitney U on the kept samples, as the dashboard's Diff page).

    Two GPUs side by side: each row's % of its own GPU's peak and of its measured ceiling (the
    GPU's own matmul rate). A bundle of two GPU models (`--gpus` on mixed GPUs) compares with
    itself when RUN_B is left out (A: the first model, B: the second), or pick models with --gpu-a/--gpu-b.
    Says first when the runs differ in GPU, in the devices rows ran on, or in dtypes.
    """

    from faprof.report.compare import (
        PCT_NOTE,
        compare_runs,
        compare_summary,
        compare_table,
        gpu_models,
        unstable_notes,
    )
    from faprof.store import resolve_run

    a = resolve_run(run_a, runs_dir)
    b = resolve_run(run_b, runs_dir) if run_b else a
    if run_b is None:
        models = gpu_models(a)
        if len(models) < 2 and not (gpu_a and gpu_b):
            raise FaprofError(f"{a.run_id} holds rows of one GPU model only: give a second run to compare with")
        gpu_a, gpu_b = gpu_a or models[0], gpu_b or next(m for m in models if m != (gpu_a or models[0]))
    df = compare_runs(a, b, gpu_a, gpu_b)
    if df.empty:
        raise FaprofError("the two runs share no (variant, shape_id) pair to compare")
    summary = compare_summary(a, b, df, gpu_a, gpu_b)
    for w in summary.warnings:
        say(f"warning: {w}", style="yellow")
    say(f"A = {a.run_id} ({summary.gpu_a})")
    say(f"B = {b.run_id} ({summary.gpu_b})")
    t, pct = compare_table(df, summary.headline, _fmt)
    console.print(t)
    say("B vs A: A's median over B's ('1.30x faster': B takes 1/1.30 of A's time); significant: two-sided "
        "Mann-Whitney U on the kept samples at p < 0.05 (the dashboard's Diff page uses the same test); "
        "rows with unstable timings are not tested")
    for line in unstable_notes(df):
        say(line, style="yellow")
    if pct:
        say(PCT_NOTE)
    for w in summary.warnings:
        say(f"warning: {w}", style="yellow")


# ------------------------------------------------------------------------------- gate
@main.command()
@click.argument("baseline")
@click.argument("candidate")
@click.option("--threshold", help="The relative change that counts, '2%' or 0.02 (default: the scenario's [gate] "
              "threshold, else 2%).")
@click.option("--allow-mismatch", is_flag=True, help="Compare runs on different GPU models (refused otherwise).")
@click.option("--include-host", is_flag=True, help="Let rows timed by the host clock (CPU rows) gate too.")
@click.option("--at-equal-clocks", "equal_clocks", is_flag=True, help="Judge rows on cycles (time x the row's SM clock) "
              "where both sides recorded it: for compute-bound kernels on power-capped GPUs.")
@click.option("--rerun-ambiguous", is_flag=True, help="Re-time the kernels with undecided rows on this machine (a second "
              "candidate run) before deciding.")
@click.option("--confirm", is_flag=True, help="Re-time the kernels with slower or undecided rows on this machine (a second "
              "candidate run) before deciding: a slowdown must hold in both runs.")
@click.option("--noise-floor", "noise_floor", help="The between-run noise floors (a TOML file written by "
              "scripts/gate_noise_floor.py), or 'none' to judge on the runs' own samples and rows only "
              "(default: faprof's recorded floors).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Folder for the bundles this command writes (a CANDIDATE scenario's run, re-timed rows).")
@click.option("--variants", "-v", "variant_list", help="CANDIDATE scenario: variants to run instead of its own.")
@click.option("--kernel", "kernels", multiple=True, help="CANDIDATE scenario: your kernel as a variant, as for "
              "`faprof profile --kernel` (repeatable).")
@click.option("--ncu", is_flag=False, flag_value="faprof", type=click.Choice(["none", "faprof", "basic", "detailed", "full"]),
              help="CANDIDATE scenario: collect Nsight Compute metrics (for why rows moved).")
@click.option("--ncu-variants", help="CANDIDATE scenario: the variants ncu profiles.")
@click.option("--markdown", "md_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--junit", "junit_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write JUnit XML here (one test case per row, regressions as failures).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path), help="Write the verdicts as JSON here.")
@click.option("--show-all", is_flag=True, help="List every row, not only those that moved or are undecided.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def gate(baseline: str, candidate: str, threshold: str | None, allow_mismatch: bool, include_host: bool,
         equal_clocks: bool, rerun_ambiguous: bool, confirm: bool, noise_floor: str | None, out_dir: Path, variant_list: str | None, kernels: tuple[str, ...], ncu: str | None,
         ncu_variants: str | None, md_file: Path | None, junit_file: Path | None, json_file: Path | None,
         show_all: bool, runs_dir: Path) -> None:
    """Gate CANDIDATE against BASELINE (run bundles): is any kernel slower, and why?

    Per (variant, shape) a verdict, faster / slower / same / ambiguous: each kernel judged on all
    its rows (Hodges-Lehmann shifts of the kept samples) with the GPU model's between-run noise
    floor, against the threshold; wrong or failed candidate rows are regressions. Provenance
    (GPU, driver, CUDA, cuDNN, clocks, throttling, timer) is checked first. CANDIDATE may be a
    scenario (name or .toml) to profile now, into --out.

    \b
    Exit codes: 0 nothing slower, wrong or failed; 1 a regression; 4 no regression but a kernel
    that looks slower past the threshold, not significantly (--confirm re-times it);
    2 bad input, or GPU models that differ without --allow-mismatch.
    """
    from faprof.model.plan import split_list
    from faprof.report.gate import GateOptions, parse_threshold, run_gate
    from faprof.report.gate_noise import load_floors
    from faprof.report.gate_render import (
        kernel_table,
        listed_rows,
        noise_line,
        provenance_table,
        render_json,
        render_junit,
        render_markdown,
        summary_line,
        unlisted_line,
    )
    from faprof.report.gate_render import verdict_table as gate_table
    from faprof.run import gate as gate_run
    from faprof.store import write_files

    options = GateOptions(threshold=parse_threshold(threshold) if threshold is not None else None,
                          allow_mismatch=allow_mismatch, include_host=include_host, equal_clocks=equal_clocks,
                          confirm=confirm, noise_floor=noise_floor)
    if noise_floor and noise_floor.lower() != "none":
        load_floors(noise_floor)  # a bad floor file stops here, before a candidate scenario is profiled
    base = gate_run.open_bundle(baseline, runs_dir)

    def progress(event: str, info: dict[str, Any]) -> None:
        if event == "bundle":
            say(f"bundle: {info['path']}")
        elif event == "row":
            say(f"  {info['variant']} {info['shape_id']} -> {info['status']}", style="dim")
        elif event in ("warning", "nsight"):
            say(str(info.get("message", "")), style="yellow")

    if gate_run.is_scenario(candidate, runs_dir):
        say(f"profiling the candidate scenario {candidate} into {out_dir}")
        cand = gate_run.profile_candidate(candidate, split_list(variant_list) or None, kernels, ncu,
                                          split_list(ncu_variants) or None, out_dir, progress)
    elif variant_list or kernels or ncu or ncu_variants:
        raise FaprofError("--variants, --kernel, --ncu and --ncu-variants apply when CANDIDATE is a scenario to run "
                          f"now; {candidate} is a bundle")
    else:
        cand = gate_run.open_bundle(candidate, runs_dir)
    retime = (lambda b, pairs: gate_run.retime(b, pairs, out_dir, progress)) if rerun_ambiguous or confirm else None
    result = run_gate(base, cand, options, retime)
    say(f"baseline  = {result.baseline['run_id']} ({result.baseline['path']})")
    say(f"candidate = {result.candidate['run_id']} ({result.candidate['path']})")
    console.print(provenance_table(result))
    for w in result.warnings:
        say(f"warning: {w}", style="yellow")
    if not result.kernels.empty:
        console.print(kernel_table(result))
        say(noise_line(result), style="dim")
    if show_all or not listed_rows(result).empty:
        console.print(gate_table(result, show_all))
    if not show_all and unlisted_line(result):
        say(unlisted_line(result))
    for n in result.notes:
        say(f"note: {n}", style="yellow")
    for path, render in ((md_file, render_markdown), (junit_file, render_junit), (json_file, render_json)):
        if path is not None:
            write_files(path.parent, {path.name: render(result)})
            say(f"wrote {path}")
    say(summary_line(result), style={0: "green", 1: "bold red"}.get(result.exit_code, "yellow"))
    sys.exit(result.exit_code)


# --------------------------------------------------------------------------- sanitize
@main.command()
@click.argument("variant")
@click.option("--scenario", default="smoke", show_default=True, help="Scenario whose shapes are run (name or TOML path).")
@click.option("--shapes", default="smallest", show_default=True, help="Shape ids and/or 'smallest'/'largest' (per problem group).")
@click.option("--tool", "tools", help="Comma-separated compute-sanitizer tools (default: memcheck,racecheck,initcheck,synccheck).")
@click.option("--kernel", "kernels", multiple=True, help="Load a kernel as for `faprof profile --kernel` (then name it as VARIANT).")
@click.option("--user-variants", "user_variants", multiple=True, help="A .py file or module registering extra variants.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Folder for the sanitize bundle.")
def sanitize(variant: str, scenario: str, shapes: str, tools: str | None, kernels: tuple[str, ...],
             user_variants: tuple[str, ...], out_dir: Path) -> None:
    """Run VARIANT (or several, comma-separated) under NVIDIA compute-sanitizer on small shapes.

    Each tool runs once over every (variant, shape) pair; the reports go into sanitizer.parquet
    in a new bundle under --out, the tools' text output into its raw/ folder.

    Exit codes: 0 no reports; 3 the tools reported something (see the table); 2 bad input or no
    compute-sanitizer.
    """
    from faprof.model.plan import split_list
    from faprof.run import sanitize as sz
    from faprof.variants.user_kernel import make_spec

    tool_list = sz.parse_tools(tools)
    specs = [*user_variants, *(make_spec(k) for k in kernels)]
    bundle = sz.run(variant, scenario, tool_list, out_dir, split_list(shapes), specs,
                    progress=lambda m: say(m, style="dim"))
    df, totals = _print_sanitizer(bundle, f"compute-sanitizer: {variant} on {scenario}", tool_list)
    say(f"bundle: {bundle.path}")
    if not df.empty or any(n is None or n > 0 for n in totals.values()):
        sys.exit(EXIT_ROWS_BAD)


def _print_sanitizer(bundle: Any, title: str, tools: list[str] | None = None) -> tuple[Any, dict[str, Any]]:
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


# --------------------------------------------------------------------------- dashboard
@main.command()
@click.argument("runs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--port", type=int, help="Port for the Streamlit server (default: Streamlit's, 8501).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 127.0.0.1 keeps the dashboard on this machine (0.0.0.0: every interface).")
@click.option("--print-command", is_flag=True, help="Print the streamlit command instead of running it.")
def dashboard(runs: tuple[Path, ...], port: int | None, host: str, print_command: bool) -> None:
    """Open the Streamlit dashboard on run bundles (folders of runs, bundles; default: runs/).

    The examples under examples/runs/ are always loaded too; bundle archives can be uploaded in the page.
    """
    import importlib.util
    import os

    from faprof.analysis.load import APP_PATH

    if importlib.util.find_spec("streamlit") is None or importlib.util.find_spec("plotly") is None:
        raise FaprofError("the dashboard needs streamlit and plotly: pip install 'faprof[app]'")
    if not APP_PATH.is_file():
        raise FaprofError(f"the dashboard app is not at {APP_PATH}: reinstall faprof (its app is package data)")
    for r in runs:
        if not r.exists():
            raise FaprofError(f"{r} does not exist (give run bundles or folders of them)")
    argv = [sys.executable, "-m", "streamlit", "run", str(APP_PATH), "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal", "--server.maxUploadSize", "4096",  # MB: archives with raw reports
            "--server.address", host]
    if port:
        argv += ["--server.port", str(port)]
    argv += ["--", *[str(r.resolve()) for r in runs]]
    if print_command:
        say(" ".join(argv))
        return
    sys.stdout.flush()
    os.execv(sys.executable, argv)


if __name__ == "__main__":  # pragma: no cover
    main()
