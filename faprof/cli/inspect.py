"""`faprof show`, `export`, `report`, `explain` and `compare`: the commands that read run bundles."""

from __future__ import annotations

from pathlib import Path

import click

from faprof.cli.app import (
    console,
    fmt,
    main,
    print_baselines,
    print_reasons,
    print_timing_note,
    results_table,
    say,
)
from faprof.errors import FaprofError


# -------------------------------------------------------------------------------- show
@main.command()
@click.argument("run")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def show(run: str, runs_dir: Path) -> None:
    """Print a run bundle's table again (RUN: a folder, a run id prefix, or 'latest')."""
    from faprof.analysis import core as analysis
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir)
    m = bundle.manifest()
    df = analysis.speedups_for(bundle.measurements(), m)
    if df.empty:
        raise FaprofError(f"{bundle.path} has no measurements yet (status: {m.get('status')})")
    gpu = m.get("env", {}).get("gpu_name") or "no GPU (CPU only)"
    console.print(results_table(df, m["scenario"]["baseline"], title=f"{m['scenario']['name']} on {gpu} ({m.get('status')})"))
    print_baselines(df)
    print_timing_note(df)
    print_reasons(df)


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


# ------------------------------------------------------------------------------ report
@main.command()
@click.argument("run")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the report (default: RUN/report/, printed at the end).")
@click.option("--format", "formats", default="md,html,csv", show_default=True,
              help="Comma-separated: md (report.md with PNG charts when kaleido works), html (report.html, "
                   "self-contained, interactive charts), csv (csv/: every table).")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def report(run: str, out_dir: Path | None, formats: str, runs_dir: Path) -> None:
    """Write a report of a run bundle that leads with the answer: ranking, diagnosis, published figures.

    Markdown, HTML and/or CSV, into RUN/report/ unless --out says otherwise. Everything is read
    and rendered before the folder is made, so a damaged bundle leaves nothing behind.
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
    written = write_reports(bundle, dest, fmts, notice=lambda m: say(f"note: {m}", style="yellow"))
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

    from faprof.report.writer import compare_runs, compare_summary, gpu_models
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
    from faprof.report.compare import PCT_NOTE, compare_table

    t, pct = compare_table(df, summary.headline, fmt)
    console.print(t)
    say("B vs A: A's median over B's ('1.30x faster': B takes 1/1.30 of A's time); significant: two-sided "
        "Mann-Whitney U on the kept samples at p < 0.05 (the dashboard's Diff page uses the same test)")
    if pct:
        say(PCT_NOTE)
    for w in summary.warnings:
        say(f"warning: {w}", style="yellow")
