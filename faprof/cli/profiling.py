"""`faprof profile`, `faprof ncu` and `faprof sanitize`: the commands that run kernels and write bundles."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from faprof.cli.group import (
    EXIT_ROWS_BAD,
    console,
    error_line,
    main,
    ncu_record,
    note,
    print_baselines,
    print_ncu_outcome,
    print_reasons,
    print_sanitizer,
    print_timing_note,
    results_table,
    say,
)
from faprof.errors import FaprofError


# ----------------------------------------------------------------------------- profile
def _ncu_select(variants: str | None, shapes: str | None, kernel: str | None, launches: int | None,
                source: str | None, cache_control: str | None, clock_control: str | None) -> Any:
    """The `--ncu-*` flags as the run's NcuSelection (comma-separated lists split)."""
    from faprof.model.options import NcuSelection
    from faprof.model.plan import split_list

    return NcuSelection(variants=split_list(variants) or None, shapes=split_list(shapes) or None, kernel=kernel,
                        launches=launches, source=source, cache_control=cache_control, clock_control=clock_control)


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
@click.option("--quick", is_flag=True, help="The edit-run-read loop: check and time only the one --kernel (scenario "
              "default: smoke), a short budget, no baselines, ceilings or Nsight, then print the delta against the "
              "previous --quick run of that kernel on the same scenario and device under --out.")
def profile(scenario: str | None, variant_list: str | None, out_dir: Path, resume: Path | None, ncu: str | None,
            ncu_variants: str | None, ncu_shapes: str | None, ncu_kernel: str | None, ncu_launches: int | None,
            ncu_source: str | None,
            ncu_cache_control: str | None, ncu_clock_control: str | None, nsys: bool | None, budget: float | None,
            user_variants: tuple[str, ...], kernels: tuple[str, ...], kernel_name: str | None, no_isolate: bool,
            task_timeout: float, timer: str | None, allow_failures: bool, gpus: str | None, cluster: str | None,
            quick: bool) -> None:
    """Measure a scenario's variants on its problems and write a run bundle.

    Each variant is checked against a reference before it is timed. Rows are written as they
    finish; an interrupted run is completed with --resume; `faprof ncu RUN` re-runs Nsight Compute
    alone on a bundle.

    \b
    Exit codes: 0 done, every row ok (or unsupported/skipped); 1 an unexpected error;
    2 bad input (one line says what); 3 some rows are `failed`, `wrong` or `untrusted` (--allow-failures
    exits 0 for those), or the Nsight Compute stage asked for produced no tables (the reason is
    printed; the timing rows are complete in the bundle); 130 interrupted (finished rows kept).

    \b
    --quick: `faprof profile --kernel FILE --quick [--scenario S]` checks and times your kernel alone and
    prints faster / slower / same against its previous quick run (the gate's statistics); every run is a
    normal bundle (`faprof explain`, `faprof report` read it).
    """
    from faprof.run.request import QUICK_SCENARIO, ProfileRequest, resolve

    req = ProfileRequest(
        scenario=scenario, resume=resume, variants=variant_list, out_dir=out_dir, ncu=ncu,
        ncu_select=_ncu_select(ncu_variants, ncu_shapes, ncu_kernel, ncu_launches, ncu_source, ncu_cache_control,
                               ncu_clock_control),
        nsys=nsys, budget=budget, timer=timer, user_variants=user_variants,
        kernels=kernels, kernel_name=kernel_name, isolate=not no_isolate, task_timeout_s=task_timeout, gpus=gpus,
        cluster=cluster, quick=quick)
    options = resolve(req)
    bundle, notices = _run_with_progress(scenario or (QUICK_SCENARIO if quick else ""), options, resume)
    code = _print_profile_outcome(bundle, notices, allow_failures)
    if options.quick:
        _print_quick_delta(bundle, options.quick, out_dir)
    if code:
        sys.exit(code)


def _print_quick_delta(bundle: Any, kernel: str, out_dir: Path) -> None:
    """--quick: the kernel's delta against its previous quick run (same scenario and device) under out_dir."""
    from faprof.gate.quick_delta import delta_lines, previous_run
    from faprof.store import device_of

    m = bundle.manifest()
    prev = previous_run(out_dir, kernel, m["scenario"]["name"], device_of(m), before=bundle)
    for i, line in enumerate(delta_lines(prev, bundle, kernel, out_dir)):
        say(line, style="bold" if i == 0 else None)


def _run_with_progress(scenario: str, options: Any, resume: Path | None) -> tuple[Any, list[str]]:
    """Run `faprof.run.profile` under a progress bar; the bundle and the warnings to repeat under the table.

    Ctrl-C prints how to resume (and how to re-run an interrupted ncu stage) and exits 130.
    """
    from faprof import run as runner

    state: dict[str, Any] = {"notices": []}
    lines = None if console.is_terminal else RowLines()  # CI logs, `| tee`, a file: a line now and then
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[current]}"), console=console, transient=False) as bar:
        task_id = bar.add_task("profiling", total=None, current="")

        def on(event: str, info: dict[str, Any]) -> None:
            if event == "status":
                bar.update(task_id, current=info["message"])
            elif event == "bundle":
                state["path"] = info["path"]
                bar.console.print(f"bundle: {info['path']}", soft_wrap=True, highlight=False)
            elif event == "plan":
                bar.console.print(info.get("message", ""), soft_wrap=True, highlight=False, markup=False,
                                  style=info.get("style"))
            elif event == "start":
                bar.update(task_id, total=info["total"], completed=info["done"], current="")
                if lines is not None:
                    lines.start(info["total"], info["done"])
            elif event == "row":
                bar.advance(task_id)
                bar.update(task_id, current=f"{info['variant']} {info['label']} -> {info['status']}")
                line = lines.row(info) if lines is not None else None
                if line:
                    bar.console.print(line, soft_wrap=True, highlight=False, markup=False)
            elif event in ("warning", "nsight"):
                bar.console.print(info.get("message", ""), style="yellow", soft_wrap=True, highlight=False)
                if event == "warning" and info.get("message") and info["message"] not in state["notices"]:
                    state["notices"].append(info["message"])  # repeated under the table: they scroll away
                if event == "nsight":
                    bar.update(task_id, current=info.get("message", ""))

        try:
            bundle = runner.profile(scenario, options, progress=on, resume=resume)
        except KeyboardInterrupt:
            _interrupted(state.get("path"))
    return bundle, state["notices"]


class RowLines:
    """Progress as plain lines, for output that is not a terminal (where no bar is drawn): one line when a
    row finishes, at most one every `every_s` seconds, and always the last, each with the rows
    done/total, the time elapsed and an estimate of the time left."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.every_s, self.clock = every_s, clock
        self.t0 = self.t_rows = self.t_said = clock()
        self.total: int | None = None
        self.done = self.done_before = 0

    def start(self, total: int, done: int) -> None:
        """The rows stage starts: `total` rows, `done` of them finished before (a resumed run)."""
        self.total, self.done, self.done_before = total, done, done
        self.t_rows = self.t_said = self.clock()

    def row(self, info: dict[str, Any]) -> str | None:
        """The line to print for a finished row, or None (too soon after the last one)."""
        self.done += 1
        now = self.clock()
        last = self.total is not None and self.done >= self.total
        if not last and now - self.t_said < self.every_s:
            return None
        self.t_said = now
        total = self.total if self.total is not None else "?"
        here = self.done - self.done_before
        if last:
            left = "done"
        elif self.total is not None and here > 0:
            left = f"~{_clock((now - self.t_rows) / here * (self.total - self.done))} left"
        else:
            left = "time left unknown"
        row = f"{info.get('variant')} {info.get('label')} -> {info.get('status')}"
        return f"rows {self.done}/{total}, {_clock(now - self.t0)} elapsed, {left} (last: {row})"


def _clock(s: float) -> str:
    """Seconds as '42s', '3m05s' or '1h02m'."""
    s = max(0, round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _interrupted(path: Any) -> NoReturn:
    """After Ctrl-C: where the finished rows are and the commands that complete the run; exit 130."""
    click.echo("", err=True)
    if path:
        error_line(f"finished rows are kept in {path}; complete the run with:", prefix="interrupted: ")
        click.echo(f"  faprof profile --resume {path}", err=True)
    else:
        error_line("no bundle was written yet", prefix="interrupted: ")
    ncu_rec = ncu_record(path)
    if ncu_rec.get("status") == "interrupted" and ncu_rec.get("rerun"):
        error_line("Nsight Compute was interrupted; re-run it alone with:", prefix="")
        click.echo(f"  {ncu_rec['rerun']}", err=True)
    sys.exit(130)


def _print_profile_outcome(bundle: Any, notices: list[str], allow_failures: bool) -> int:
    """The results table, its notes and the ncu line; the exit code (0, or EXIT_ROWS_BAD)."""
    from faprof.analysis import aliases
    from faprof.analysis import speedups as analysis

    m = bundle.manifest()
    df = analysis.speedups_for(aliases.measurements(bundle), m)
    env = m.get("env", {})
    gpu = env.get("gpu_name") or "no GPU (CPU only)"
    console.print(results_table(df, m["scenario"]["baseline"], title=f"{m['scenario']['name']} on {gpu}"))
    print_baselines(df)
    print_timing_note(df)
    print_reasons(df)
    counts = df["status"].value_counts().to_dict()
    say("status: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    for notice in notices:
        say(f"notice: {notice}", style="yellow")
    say(f"bundle: {bundle.path}")
    ncu_set = (m.get("settings") or {}).get("ncu")
    ncu_code = print_ncu_outcome(m.get("ncu") or {}) if ncu_set and ncu_set != "none" else 0
    rows_code = 0
    bad = df[df["status"].isin(["failed", "wrong", "untrusted"])]
    if not bad.empty:
        what = ", ".join(f"{n} {st}" for st, n in bad["status"].value_counts().items())
        bad_names = ", ".join(sorted(set(bad["variant"])))
        if allow_failures:
            say(f"{what} ({bad_names}); exit 0 (--allow-failures)")
        else:
            say(f"exit {EXIT_ROWS_BAD}: {what} ({bad_names}); see the reasons above, or pass --allow-failures to exit 0",
                style="bold red")
            rows_code = EXIT_ROWS_BAD
    return rows_code or ncu_code


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
@click.option("--gpus", "gpus", help="Profile on these GPUs of this machine, one ncu process each: 'all' or indices, e.g. 0,1.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def ncu_cmd(run: str, ncu_set: str, ncu_variants: str | None, ncu_shapes: str | None, ncu_kernel: str | None,
            ncu_launches: int | None, ncu_source: str, ncu_cache_control: str | None, ncu_clock_control: str | None,
            gpus: str | None, runs_dir: Path) -> None:
    """Run Nsight Compute alone on a run bundle (finished or interrupted); its timing rows stay as they are.

    Prints the plan (kernels, passes, estimated time) first, then writes ncu_metrics, ncu_summary,
    stalls, roofline and ncu_rules into the bundle (replacing an earlier session's; a failed
    session leaves an earlier successful one in place).

    \b
    Exit codes: 0 tables written; 2 bad input (unknown run, variant or shape id, a kernel regex
    matching none of the kernels seen before, another GPU); 3 no tables (ncu missing, no counter
    permission, the regex matched nothing, ncu failed: one line says why); 130 interrupted.
    """
    from faprof.model.options import ProfileOptions
    from faprof.model.scenarios import parse_scenario
    from faprof.nsight.ncu.run import rerun, this_gpu
    from faprof.nsight.ncu.source_run import collect_source
    from faprof.run import fanout
    from faprof.run.gpu_pool import parse_gpus
    from faprof.store import resolve_run

    gpu_list = parse_gpus(gpus)
    bundle = resolve_run(run, runs_dir, note)
    if not this_gpu()[0]:  # before the bundle's user kernels are built for a GPU that is not there
        raise FaprofError("no CUDA GPU visible here: Nsight Compute needs the GPU the bundle was measured on "
                          f"({(bundle.manifest().get('env') or {}).get('gpu_name') or 'none recorded'}); "
                          "run `faprof ncu` on that machine")
    opts = ProfileOptions(ncu_select=_ncu_select(ncu_variants, ncu_shapes, ncu_kernel, ncu_launches, ncu_source,
                                                 ncu_cache_control, ncu_clock_control))
    console.print(f"bundle: {bundle.path}", markup=False, soft_wrap=True)

    def on(event: str, info: dict[str, Any]) -> None:
        if event in ("warning", "nsight"):
            console.print(info.get("message", ""), markup=False, soft_wrap=True,
                          style="yellow" if event == "warning" else None)

    def over_gpus(b: Any, scenario: Any, o: Any, st: str, progress: Any, cuda_ok: bool) -> None:
        fanout.collect_ncu(b, scenario, o, st, progress, cuda_ok, gpu_list or [])  # one GPU: ncu pinned to it

    try:
        rec = rerun(bundle, ncu_set, opts, on, stage=over_gpus if gpu_list else None)
        if rec.get("status") == "ok":
            scenario = parse_scenario(bundle.manifest()["scenario"]["raw"], f"{bundle.path}/manifest.json scenario")
            with fanout.pinned(gpu_list[0] if gpu_list else None):
                collect_source(bundle, scenario, opts, ncu_source, on)
            rec = bundle.manifest().get("ncu", rec)
    except KeyboardInterrupt:
        rec = ncu_record(bundle.path)
        click.echo("", err=True)
        error_line(str(rec.get("reason") or "Nsight Compute stopped"), prefix="interrupted: ")
        sys.exit(130)
    sys.exit(print_ncu_outcome(rec))


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
    df, totals = print_sanitizer(bundle, f"compute-sanitizer: {variant} on {scenario}", tool_list)
    say(f"bundle: {bundle.path}")
    if not df.empty or any(n is None or n > 0 for n in totals.values()):
        sys.exit(EXIT_ROWS_BAD)
