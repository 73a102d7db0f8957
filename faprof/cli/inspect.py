"""`faprof show`, `export`, `report`, `explain`, `compare` and `gate`: the commands that read run bundles."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from faprof.cli.group import (
    console,
    fmt,
    main,
    note,
    print_baselines,
    print_reasons,
    print_sanitizer,
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
    """Print a run bundle's table again (RUN: a folder, a run id prefix, or 'latest': the newest complete run)."""
    from faprof.analysis import aliases
    from faprof.analysis import speedups as analysis
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir, note)
    m = bundle.manifest()
    if m.get("kind") == "sanitize":
        print_sanitizer(bundle, f"compute-sanitizer: {', '.join((m.get('settings') or {}).get('variants') or [])} "
                                f"on {(m.get('scenario') or {}).get('name')}")
        return
    df = analysis.speedups_for(aliases.measurements(bundle), m)
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

    bundle = resolve_run(run, runs_dir, note)
    for p in export_csv(bundle, csv_dir):
        say(f"wrote {p}")


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
    bundle = resolve_run(run, runs_dir, note)
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
@click.option("--format", "fmt", type=click.Choice(["table", "text", "md"]),
              help="A rich table, plain text, or Markdown (default: text for one shape or --per-shape: each finding "
                   "with its evidence, the source line it points at (where) and its fix; a table for the summary).")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True)
def explain(run: str, variant: str | None, shape: str | None, per_shape: bool, against: str | None, fmt: str | None,
            runs_dir: Path) -> None:
    """Why each variant is as fast as it is: the advisor's ranked diagnosis of a run bundle.

    One primary cause per (variant, shape) with its estimated share of the call's time, then the
    secondary findings; by default aggregated across shapes (one row per variant and cause).
    """
    from faprof import advisor
    from faprof.analysis.aliases import split as split_aliases
    from faprof.correctness.wrong_text import explain_wrong_rows
    from faprof.store import resolve_run

    bundle = resolve_run(run, runs_dir, note)
    # wrong rows first: which bug it looks like and where (the timing findings wait for a right result)
    wrong = explain_wrong_rows(bundle.measurements(), bundle.read("error_maps"), variant, shape)
    for line in wrong:
        console.print(line, markup=False, soft_wrap=True, style="bold red" if not line.startswith(" ") else None)
    meas = bundle.measurements()
    named = {n for a in meas.get("aliases", []) for n in split_aliases(a)}
    if against and against not in set(meas["variant"]) | named:  # an alias timed as its target's row counts
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
    fmt = fmt or ("text" if per else "table")  # findings one by one read as text; the summary as a table
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

    a = resolve_run(run_a, runs_dir, note)
    b = resolve_run(run_b, runs_dir, note) if run_b else a
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
    t, pct = compare_table(df, summary.headline, fmt)
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
              "scripts/analysis/gate_noise_floor.py), or 'none' to judge on the runs' own samples and rows only "
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
    from faprof.gate import GateOptions, parse_threshold, run_gate
    from faprof.model.plan import split_list
    from faprof.rows.noise_floor import load_floors
    from faprof.run import gate_runs as gate_run
    from faprof.store import resolve_run

    options = GateOptions(threshold=parse_threshold(threshold) if threshold is not None else None,
                          allow_mismatch=allow_mismatch, include_host=include_host, equal_clocks=equal_clocks,
                          confirm=confirm, noise_floor=noise_floor)
    if noise_floor and noise_floor.lower() != "none":
        load_floors(noise_floor)  # a bad floor file stops here, before a candidate scenario is profiled
    base = resolve_run(baseline, runs_dir, note)

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
        cand = resolve_run(candidate, runs_dir, note)
    retime = (lambda b, pairs: gate_run.retime(b, pairs, out_dir, progress)) if rerun_ambiguous or confirm else None
    result = run_gate(base, cand, options, retime)
    _show_gate(result, show_all, md_file, junit_file, json_file)
    sys.exit(result.exit_code)


def _show_gate(result: Any, show_all: bool, md_file: Path | None, junit_file: Path | None,
               json_file: Path | None) -> None:
    """Print a gate's tables, notes and summary; write its Markdown, JUnit and JSON files."""
    from faprof.gate.outputs import (
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
    from faprof.gate.outputs import verdict_table as gate_table
    from faprof.store import write_files

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
