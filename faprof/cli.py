"""The `faprof` command line: a thin shell over the stages (parse, call, print with rich)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from faprof import __version__
from faprof.errors import FaprofError

# Piped output (CI logs, a GPU machine's captured stdout) gets wide tables instead of rich's 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True)

_STATUS_STYLE = {"ok": "green", "wrong": "bold red", "failed": "bold red", "unsupported": "yellow", "skipped": "dim"}


class FaprofGroup(click.Group):
    """Prints FaprofError as a one-line message (no traceback) and exits with code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FaprofError as e:
            err_console.print(f"[bold red]error:[/] {e}")
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
      faprof export runs/<run> --csv out/          # tables as CSV
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
    for col, just in (("variant", "left"), ("shape", "left"), ("status", "left"), ("median ms", "right"),
                      ("±95% CI", "right"), ("TFLOP/s", "right"), ("% peak", "right"),
                      ("speedup", "right"), ("max err", "right"), ("ref", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for _, r in df.iterrows():
        status = r["status"]
        ci = ""
        if r.get("ci95_high_ms") is not None and not _isnan(r.get("ci95_high_ms")):
            ci = _fmt((r["ci95_high_ms"] - r["ci95_low_ms"]) / 2, ".2g")
        speed = r.get("speedup")
        t.add_row(
            r["variant"], _shape_label(r), f"[{_STATUS_STYLE.get(status, '')}]{status}[/]",
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


def _print_baselines(df) -> None:
    """Say what the speedup column is relative to (a scenario's groups may have their own baselines)."""
    if "baseline" not in df:
        return
    per = df.groupby("baseline", sort=False)["group"].unique() if "group" in df else None
    if per is None or len(per) <= 1:
        console.print(f"speedup = {df['baseline'].iloc[0]}'s median / the row's median (above 1: faster than it)")
        return
    parts = [f"{b} for {', '.join(str(g) for g in gs)}" for b, gs in per.items()]
    console.print("speedup = the baseline's median / the row's median; baselines: " + "; ".join(parts))


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
        console.print(f"  [{style}]{r['status']}[/] {r['variant']}: {r['reason']}")


# ----------------------------------------------------------------------------- profile
@main.command()
@click.option("--scenario", "-s", "scenario", help="Scenario name (see `faprof list scenarios`) or path to a .toml file.")
@click.option("--variants", "-v", "variant_list", help="Comma-separated variant names to run instead of the scenario's ('all' for every variant).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Folder that receives the run bundle.")
@click.option("--resume", "resume", type=click.Path(path_type=Path), help="Finish an interrupted run bundle instead of starting a new one.")
@click.option("--ncu", type=click.Choice(["none", "basic", "detailed", "full"]), help="Collect Nsight Compute metrics with this section set.")
@click.option("--ncu-cache-control", type=click.Choice(["all", "none"]), help="ncu --cache-control (default all: caches flushed before every replay pass).")
@click.option("--ncu-clock-control", type=click.Choice(["none", "base"]), help="ncu --clock-control (default none: the card as it is; 'base' locks base clocks).")
@click.option("--nsys/--no-nsys", default=None, help="Capture an Nsight Systems timeline.")
@click.option("--budget", type=float, help="Timing budget per variant and shape, in seconds (overrides the scenario).")
@click.option("--user-variants", "user_variants", multiple=True, help="A .py file or module registering extra variants (repeatable).")
@click.option("--no-isolate", is_flag=True, help="Run variants in this process instead of a worker (no fault containment).")
@click.option("--timeout", "task_timeout", type=float, default=600.0, show_default=True, help="Seconds before a variant counts as hung.")
def profile(scenario: str | None, variant_list: str | None, out_dir: Path, resume: Path | None, ncu: str | None,
            ncu_cache_control: str | None, ncu_clock_control: str | None, nsys: bool | None, budget: float | None, user_variants: tuple[str, ...], no_isolate: bool, task_timeout: float) -> None:
    """Measure a scenario's variants on its problems and write a run bundle.

    Each variant is checked against a reference before it is timed. Rows are written as they
    finish; an interrupted run is completed with --resume.
    """
    from faprof import analysis, runner
    from faprof.scenarios import load_scenario

    if not scenario and not resume:
        raise FaprofError("give --scenario NAME|PATH (see `faprof list scenarios`) or --resume RUN")
    if resume and (scenario or variant_list):
        raise FaprofError("--resume finishes a run as it was started: drop --scenario/--variants, or start a new run")
    options = runner.ProfileOptions(
        variants=[v.strip() for v in variant_list.split(",") if v.strip()] if variant_list else None,
        out_dir=out_dir, ncu=ncu, nsys=nsys, isolate=not no_isolate, task_timeout_s=task_timeout,
        ncu_cache_control=ncu_cache_control, ncu_clock_control=ncu_clock_control,
        user_variants=list(user_variants), settings_overrides={"budget_s": budget} if budget is not None else {},
    )
    from faprof.variants import load_user_variants

    for spec in user_variants:
        load_user_variants(spec)
    if scenario and not resume:
        load_scenario(scenario)  # validate before any work starts
    state: dict[str, Any] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[current]}"), console=console, transient=False) as bar:
        task_id = bar.add_task("profiling", total=None, current="")

        def on(event: str, info: dict[str, Any]) -> None:
            if event == "status":
                bar.update(task_id, current=info["message"])
            elif event == "bundle":
                state["path"] = info["path"]
                bar.console.print(f"bundle: {info['path']}")
            elif event == "start":
                bar.update(task_id, total=info["total"], completed=info["done"], current="")
            elif event == "row":
                bar.advance(task_id)
                bar.update(task_id, current=f"{info['variant']} {info['label']} -> {info['status']}")
            elif event in ("warning", "nsight"):
                bar.console.print(f"[yellow]{info.get('message', '')}[/]")
                if event == "nsight":
                    bar.update(task_id, current=info.get("message", ""))

        try:
            bundle = runner.profile(scenario or "", options, progress=on, resume=resume)
        except KeyboardInterrupt:
            path = state.get("path")
            err_console.print(f"\n[bold yellow]interrupted[/]: finished rows are kept in {path}; "
                              f"complete the run with `faprof profile --resume {path}`")
            sys.exit(130)
    m = bundle.manifest()
    df = analysis.speedups_for(bundle.measurements(), m)
    env = m.get("env", {})
    gpu = env.get("gpu_name") or "no GPU (CPU only)"
    console.print(results_table(df, m["scenario"]["baseline"], title=f"{m['scenario']['name']} on {gpu}"))
    _print_baselines(df)
    _print_reasons(df)
    counts = df["status"].value_counts().to_dict()
    console.print("status: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    console.print(f"bundle: [bold]{bundle.path}[/]")


# -------------------------------------------------------------------------------- list
@main.command(name="list")
@click.argument("what", type=click.Choice(["all", "scenarios", "variants", "gpus"]), default="all")
@click.option("--hidden", is_flag=True, help="Also list test-only variants.")
def list_cmd(what: str, hidden: bool) -> None:
    """List scenarios, variants and known GPUs."""
    if what in ("all", "scenarios"):
        from faprof.scenarios import list_scenarios, load_scenario

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
        from faprof import gpus

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
            console.print(f"[{style[chk.status]}]{chk.name}[/]: {chk.hint}")


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
        console.print(f"wrote {p}")


# ------------------------------------------------------------------------------- build
@main.command()
@click.option("--arch", default="sm_80,sm_89,sm_90", show_default=True, help="Comma-separated archs to compile for with nvcc (no GPU needed).")
@click.option("--load", "do_load", is_flag=True, help="Instead: JIT-build (or load from the cache) the torch extension for the GPU present and print the time.")
def build(arch: str, do_load: bool) -> None:
    """Compile the kernels with nvcc and print ptxas' resource usage and the occupancy it implies.

    With --load, build the torch extension for this GPU instead: the first run compiles (cold),
    later runs in new processes reuse the cached build (warm) while sources and flags are unchanged.
    """
    from faprof import build as b

    if do_load:
        info = b.load()
        console.print(f"extension: {info.summary()}")
        return
    archs = tuple(a.strip() for a in arch.split(",") if a.strip())
    with console.status(f"compiling kernels/*.cu for {', '.join(archs)}"):
        df = b.resource_report(archs=archs)
    t = Table(title="ptxas resource usage per kernel and arch, and the theoretical occupancy it implies", header_style="bold")
    cols = [("file", "file"), ("name", "kernel"), ("template_args", "template"), ("D", "D"), ("arch", "arch"), ("threads", "threads"),
            ("registers", "regs"), ("smem_static_bytes", "smem static B"), ("dyn_smem_bytes", "smem dyn B"),
            ("stack_frame_bytes", "stack B"), ("spill_store_bytes", "spill st B"), ("spill_load_bytes", "spill ld B"),
            ("blocks_per_sm", "blocks/SM"), ("occupancy_pct", "occupancy %"), ("limiter", "limiter")]
    cols = [(c, label) for c, label in cols if c in df.columns]
    for _, label in cols:
        t.add_column(label)
    for _, r in df.iterrows():
        t.add_row(*[_fmt(r[c], "g") for c, _ in cols])
    console.print(t)
    spills = df[(df.get("spill_store_bytes", 0) > 0) | (df.get("spill_load_bytes", 0) > 0)] if "spill_store_bytes" in df else df.iloc[0:0]
    if not spills.empty:
        console.print(f"[yellow]{len(spills)} kernel/arch pair(s) spill registers to local memory[/]")


# ------------------------------------------------------------------------------ report
@main.command()
@click.argument("run")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def show(run: str, runs_dir: Path) -> None:
    """Print a run bundle's table again (RUN: a folder, a run id prefix, or 'latest')."""
    from faprof import analysis
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir)
    m = bundle.manifest()
    df = analysis.speedups_for(bundle.measurements(), m)
    if df.empty:
        raise FaprofError(f"{bundle.path} has no measurements yet (status: {m.get('status')})")
    gpu = m.get("env", {}).get("gpu_name") or "no GPU (CPU only)"
    console.print(results_table(df, m["scenario"]["baseline"], title=f"{m['scenario']['name']} on {gpu} ({m.get('status')})"))
    _print_reasons(df)


# ------------------------------------------------------------------------------ report
@main.command()
@click.argument("run")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Folder for report.md, report.html and csv/ (default: RUN/report).")
@click.option("--format", "formats", default="md,html,csv", show_default=True, help="Comma-separated: md, html, csv.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def report(run: str, out_dir: Path | None, formats: str, runs_dir: Path) -> None:
    """Write a Markdown / HTML / CSV report of a run bundle: the seed reports' tables and findings."""
    from faprof.report import write_reports
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir)
    fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
    bad = set(fmts) - {"md", "html", "csv"}
    if bad:
        raise FaprofError(f"unknown report format(s) {sorted(bad)}: use md, html and/or csv")
    if bundle.measurements().empty:
        raise FaprofError(f"{bundle.path} has no measurements yet; nothing to report")
    for p in write_reports(bundle, out_dir or bundle.path / "report", fmts):
        console.print(f"wrote {p}")


@main.command()
@click.argument("run")
@click.option("--variant", "variant", help="Only this variant.")
@click.option("--shape", "shape", help="Only this shape_id: its ranked findings, one by one.")
@click.option("--per-shape", is_flag=True, help="Ranked findings of every (variant, shape) instead of the summary across shapes.")
@click.option("--format", "fmt", type=click.Choice(["table", "text", "md"]), default="table", show_default=True,
              help="A rich table, plain text, or Markdown.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def explain(run: str, variant: str | None, shape: str | None, per_shape: bool, fmt: str, runs_dir: Path) -> None:
    """Why each variant is as fast as it is: the advisor's ranked diagnosis of a run bundle.

    One primary cause per (variant, shape) with its estimated share of the call's time, then the
    secondary findings; by default aggregated across shapes (one row per variant and cause).
    """
    from faprof import advisor
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir)
    diag = advisor.diagnose(bundle)
    for key, val in (("variant", variant), ("shape_id", shape)):
        if val and not diag.empty and val not in set(diag[key]):
            known = ", ".join(dict.fromkeys(diag[key]))
            raise FaprofError(f"no findings for {key} {val!r} in {bundle.path.name}; with findings: {known}")
    diag = advisor.select(diag, variant, shape)
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
@click.argument("run_b")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def compare(run_a: str, run_b: str, runs_dir: Path) -> None:
    """Compare two runs row by row: medians, B/A ratio, and whether the 95% CIs overlap."""
    import pandas as pd

    from faprof.report import compare_runs
    from faprof.store import resolve_run

    a, b = resolve_run(run_a, runs_dir), resolve_run(run_b, runs_dir)
    df = compare_runs(a, b)
    if df.empty:
        raise FaprofError("the two runs share no (variant, shape_id) pair to compare")
    t = Table(title=f"B = {b.run_id} over A = {a.run_id}", header_style="bold")
    for c in ("variant", "shape_id", "A status", "B status", "A ms", "B ms", "B/A", "CIs overlap"):
        t.add_column(c)
    for _, r in df.iterrows():
        ov = r["ci_overlap"]
        t.add_row(r["variant"], r["shape_id"], str(r["status_a"]), str(r["status_b"]), _fmt(r["median_ms_a"], ".4g"),
                  _fmt(r["median_ms_b"], ".4g"), _fmt(r["ratio_b_over_a"], ".3f"),
                  "" if pd.isna(ov) else ("yes" if ov else "[bold]no[/]"))
    console.print(t)


# --------------------------------------------------------------------------- dashboard
@main.command()
@click.argument("runs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--port", type=int, help="Port for the Streamlit server (default: Streamlit's, 8501).")
@click.option("--print-command", is_flag=True, help="Print the streamlit command instead of running it.")
def dashboard(runs: tuple[Path, ...], port: int | None, print_command: bool) -> None:
    """Open the Streamlit dashboard on run bundles (folders of runs, bundles; default: runs/).

    The examples under examples/runs/ are always loaded too; bundle archives can be uploaded in the page.
    """
    import importlib.util
    import os

    from faprof.dashboard import APP_PATH

    if importlib.util.find_spec("streamlit") is None or importlib.util.find_spec("plotly") is None:
        # Printed here, not raised: rich would take "[app]" for markup.
        err_console.print("error: the dashboard needs streamlit and plotly: pip install 'faprof[app]'",
                          markup=False, style="bold red")
        sys.exit(2)
    if not APP_PATH.is_file():
        raise FaprofError(f"the dashboard app is not at {APP_PATH}: run faprof from its source tree (pip install -e .)")
    for r in runs:
        if not r.exists():
            raise FaprofError(f"{r} does not exist (give run bundles or folders of them)")
    argv = [sys.executable, "-m", "streamlit", "run", str(APP_PATH), "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal", "--server.maxUploadSize", "4096"]  # MB: archives with raw reports
    if port:
        argv += ["--server.port", str(port)]
    argv += ["--", *[str(r.resolve()) for r in runs]]
    if print_command:
        console.print(" ".join(argv), soft_wrap=True)
        return
    sys.stdout.flush()
    os.execv(sys.executable, argv)


if __name__ == "__main__":  # pragma: no cover
    main()
