"""One kernel, one row: declared aliases (Variant.aliases), the plan that times them once, aliases
detected from recorded kernel records, and the views (report, explain, dashboard) that show a kernel once.

Method: recorded H100 bundles only. The l4_causal bundle of tests/data/accounting ran fa3_bwd_a..d on
forward problems, whose forward is fa3_wgmma_e's kernel (Nsight Compute recorded the same kernel,
grid and block for all five); the l20_fwd_bwd example ran them without fa3_wgmma_e (the same kernels
again, detected from nsys and ncu); the l4_causal example of 2026-11-23 ran sdpa_auto, which launched
cuDNN's kernel at fp16 and the memory-efficient one at fp32. The report and explain tests read a copy
of the first bundle cut to two of its shapes (every table filtered alike), so the advisor runs in seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from faprof import advisor
from faprof import variants as registry
from faprof.analysis import aliases
from faprof.analysis.load import load_runs
from faprof.model import plan, schema
from faprof.model.scenarios import load_scenario
from faprof.report import writer as report
from faprof.store import Bundle

ROOT = Path(__file__).resolve().parent.parent
ACCOUNTING_L4 = ROOT / "tests" / "data" / "accounting" / "20261125T041303Z_nvidia-h100-80gb-hbm3_l4-causal"
L20 = ROOT / "examples" / "runs" / "20261125T044408Z_nvidia-h100-80gb-hbm3_l20-fwd-bwd"
L4_NSYS = ROOT / "examples" / "runs" / "20261123T053932Z_nvidia-h100-80gb-hbm3_l4-causal"
BWD_STEPS = ("fa3_bwd_a", "fa3_bwd_b", "fa3_bwd_c", "fa3_bwd_d")
#: The two shapes the cut copy keeps: the smallest and the largest fp16 problem.
KEEP = ("b1_h1_sq128_sk128_d64_fp16_causal_fwd", "b16_h8_sq512_sk512_d64_fp16_causal_fwd")


def _tables(path: Path) -> dict[str, pd.DataFrame]:
    b = Bundle.open(path)
    return {t: b.read(t) for t in ("ncu_summary", "nsys_kernels") if b.has(t)}


@pytest.fixture(scope="module")
def cut(tmp_path_factory) -> Path:
    """The accounting l4_causal bundle with every table cut to the shapes in KEEP."""
    dest = tmp_path_factory.mktemp("aliases") / ACCOUNTING_L4.name
    dest.mkdir()
    shutil.copy(ACCOUNTING_L4 / "manifest.json", dest / "manifest.json")
    for f in ACCOUNTING_L4.glob("*.parquet"):
        t = pd.read_parquet(f)
        t[t["shape_id"].isin(KEEP)].reset_index(drop=True).to_parquet(dest / f.name)
    return dest


@pytest.fixture(scope="module")
def cut_run(cut) -> report.Run:
    return report.read_run(Bundle.open(cut))


# ------------------------------------------------------------------------------ declared
def test_the_hopper_backward_steps_declare_their_forward_as_fa3_wgmma_e():
    for name in BWD_STEPS:
        v = registry.get(name)
        assert v.aliases == {"fwd": "fa3_wgmma_e"} and v.alias_of("fwd") == "fa3_wgmma_e"
        assert v.alias_of("bwd") is None and v.alias_of("fwd_bwd") is None  # their own backward kernels
    # every declared target is a registered variant that runs that direction itself
    for v in registry.all_variants(include_hidden=True):
        for direction, target in v.aliases.items():
            assert direction in registry.get(target).directions, (v.name, direction, target)


def test_the_plan_times_a_declared_alias_once_when_its_target_runs():
    scn = load_scenario("l4_causal")  # forward only, variants 'all': fa3_wgmma_e and fa3_bwd_a..d
    pairs = plan.plan(scn, None)
    names = {v.name for _, v in pairs}
    assert "fa3_wgmma_e" in names and not names & set(BWD_STEPS)
    folded = plan.folded_aliases(scn, None)
    assert set(folded) == {("fa3_wgmma_e", p.shape_id) for p in scn.problems}
    assert all(v == list(BWD_STEPS) for v in folded.values())
    assert plan.alias_lines(scn, None) == [
        f"fa3_wgmma_e (also fa3_bwd_a..d): fwd timed once for all of them ({len(scn.problems)} shapes)"]
    assert plan.declared_aliases(scn, None) == {n: {"fwd": "fa3_wgmma_e"} for n in BWD_STEPS}
    # without its target in the run an alias is timed as itself; so is a direction it does not alias
    alone = plan.plan(scn, ["fa3_bwd_a", "fa2_mma"])
    assert {v.name for _, v in alone} == {"fa3_bwd_a", "fa2_mma"} and plan.folded_aliases(scn, ["fa3_bwd_a"]) == {}
    assert "aliases" in schema.ROW_COLUMNS


def test_alias_names_read_short():
    assert plan.also_label("fa3_wgmma_e", list(BWD_STEPS)) == "fa3_wgmma_e (also fa3_bwd_a..d)"
    assert plan.also_label("sdpa_cudnn", ["sdpa_auto"]) == "sdpa_cudnn (also sdpa_auto)"
    assert plan.alias_names(["x_a", "x_c", "x_d"]) == "x_a, x_c, x_d"  # not consecutive: listed
    assert plan.also_label("fa2", None) == "fa2"


# ------------------------------------------------------------------------------ detected
def test_aliases_are_detected_from_the_recorded_kernels_when_nothing_declares_them():
    b = Bundle.open(ACCOUNTING_L4)
    m = b.manifest()
    undeclared = {**m, "settings": {**m["settings"], "aliases": {}}}  # as a user's variants: no declaration
    found = aliases.find(b.measurements(), _tables(ACCOUNTING_L4), undeclared)
    fp16 = found[found["shape_id"].str.contains("fp16")]
    assert set(fp16["how"]) == {"kernels"} and set(fp16["canonical"]) == {"fa3_wgmma_e"}
    assert set(fp16["variant"]) == set(BWD_STEPS) and len(fp16) == 4 * 5
    # no Nsight record at fp32 (the steps are unsupported there): nothing detected, nothing declared
    assert found[~found["shape_id"].str.contains("fp16")].empty
    # declared (the registry, for this bundle written before manifests recorded aliases): every shape
    declared = aliases.find(b.measurements(), _tables(ACCOUNTING_L4), m)
    assert set(declared["how"]) == {"declared"} and len(declared) == 4 * 10


def test_a_different_grid_or_an_incomplete_record_is_not_the_same_kernel():
    b = Bundle.open(ACCOUNTING_L4)
    m = b.manifest()
    undeclared = {**m, "settings": {**m["settings"], "aliases": {}}}
    tables = _tables(ACCOUNTING_L4)
    summ = tables["ncu_summary"].copy()
    at = (summ["variant"] == "fa3_bwd_b") & (summ["shape_id"] == KEEP[1]) & (summ["kernel"] != "(all)")
    summ.loc[at, "grid"] = "(8, 8, 16)"
    found = aliases.find(b.measurements(), {"ncu_summary": summ}, undeclared)
    assert ("fa3_bwd_b", KEEP[1]) not in set(zip(found["variant"], found["shape_id"], strict=True))
    assert ("fa3_bwd_b", KEEP[0]) in set(zip(found["variant"], found["shape_id"], strict=True))
    meas = b.measurements()
    meas.loc[(meas["variant"] == "fa3_bwd_c") & (meas["shape_id"] == KEEP[0]), "kernels_per_call"] = 2.0
    found = aliases.find(meas, tables, undeclared)  # ncu saw one of the call's two kernels: not proof
    assert ("fa3_bwd_c", KEEP[0]) not in set(zip(found["variant"], found["shape_id"], strict=True))


def test_nsys_records_find_a_dispatcher_and_the_kernels_it_ran():
    b = Bundle.open(L4_NSYS)
    found = aliases.find(b.measurements(), _tables(L4_NSYS), b.manifest())
    pairs = set(zip(found["variant"], found["canonical"], found["shape_id"].str.contains("fp16"), strict=True))
    # sdpa_auto launched cuDNN's kernel at fp16 and the efficient kernel (the fp32 baseline) at fp32
    assert pairs == {("sdpa_auto", "sdpa_cudnn", True), ("sdpa_auto", "sdpa_efficient", False)}
    b20 = Bundle.open(L20)  # fa3_bwd_a..d without fa3_wgmma_e: aliases of each other on forward shapes only
    f20 = aliases.find(b20.measurements(), _tables(L20), b20.manifest())
    steps = f20[f20["variant"].isin(BWD_STEPS)]
    direction = b20.measurements().drop_duplicates("shape_id").set_index("shape_id")["direction"]
    assert not steps.empty and set(steps["canonical"]) == {"fa3_bwd_a"}
    assert set(steps["shape_id"].map(direction)) == {"fwd"}


# ------------------------------------------------------------------------------ views
def test_collapse_keeps_one_row_per_kernel_and_reads_old_bundles():
    b = Bundle.open(ACCOUNTING_L4)
    raw = b.measurements()
    assert "aliases" not in raw.columns  # written before the column existed
    df = aliases.measurements(b)
    assert not df["variant"].isin(BWD_STEPS).any() and len(df) == len(raw) - 4 * 10
    e = df[df["variant"] == "fa3_wgmma_e"]
    assert len(e) == 10 and set(e["aliases"]) == {",".join(BWD_STEPS)}
    assert aliases.labels_of(df)["fa3_wgmma_e"] == "fa3_wgmma_e (also fa3_bwd_a..d)"


def test_the_report_shows_each_kernel_once_and_names_its_aliases(cut_run):
    md = report.render_markdown(cut_run)
    answer = md.split("\n## The answer")[1].split("\n## Why")[0]
    rows = [ln.split("|")[1].strip() for ln in answer.splitlines() if ln.startswith("| ") and "|--" not in ln][1:]
    assert "fa3_wgmma_e (also fa3_bwd_a..d)" in rows
    assert not any(r.startswith("fa3_bwd") for r in rows)
    assert len(rows) == len(set(rows))  # one row per kernel in the answer's table
    why = md.split("\n## Why")[1]
    assert "fa3_bwd" not in why.replace("(also fa3_bwd_a..d)", "")
    appendix = report.render_appendix(cut_run)
    assert "fa3_bwd" not in appendix.replace("(also fa3_bwd_a..d)", "")  # results, advisor and ncu tables
    assert "| fa3_wgmma_e (also fa3_bwd_a..d) | B=16 H=8 S=512" in appendix
    legend = {tr.name for c in report.build_charts(cut_run) for tr in c.figure.data} if cut_run.blocks else set()
    assert not any(n.startswith("fa3_bwd") for n in legend)


def test_explain_names_the_alias_and_never_compares_a_kernel_with_itself(cut, cut_run):
    diag = cut_run.diag
    assert not diag["variant"].isin(BWD_STEPS).any() and not diag["against"].isin(BWD_STEPS).any()
    text = advisor.render_text(diag)
    assert "fa3_wgmma_e (also fa3_bwd_a..d)" in text
    assert "fa3_bwd" not in text.replace("(also fa3_bwd_a..d)", "")
    # no finding compares two calls that ran the same kernels (recorded name, grid and block)
    summ = pd.read_parquet(cut / "ncu_summary.parquet")
    summ = summ[summ["kernel"] != "(all)"]
    sig = {k: tuple(zip(g["kernel"], g["grid"], g["block"], strict=True))
           for k, g in summ.groupby(["variant", "shape_id"])}
    compared = diag.dropna(subset=["against"])
    assert not compared.empty
    for v, a, s in zip(compared["variant"], compared["against"], compared["shape_id"], strict=True):
        assert sig.get((v, s)) != sig.get((a, s)), (v, a, s)
    # asked against an alias, the gap is to the kernel it runs (its canonical), never to the call itself
    against = advisor.diagnose(Bundle.open(cut), against="fa3_bwd_b")
    assert set(against["against"].dropna()) == {"fa3_wgmma_e"}
    assert against.loc[against["variant"] == "fa3_wgmma_e", "against"].isna().all()


def test_the_dashboard_loads_one_row_per_kernel(cut):
    rs = load_runs([(cut, "command line")])
    assert not rs.measurements["variant"].isin(BWD_STEPS).any()
    assert "fa3_wgmma_e (also fa3_bwd_a..d)" in set(rs.measurements["variant_label"])
    assert not rs.table("ncu_summary")["variant"].isin(BWD_STEPS).any()


def test_a_new_manifest_records_the_declared_aliases():
    from faprof.model.options import ProfileOptions
    from faprof.run.resolve import new_manifest

    scn = load_scenario("l4_causal")
    m = new_manifest(scn, ProfileOptions(), {}, scn.timing, plan.plan(scn, None), None, False, None)
    assert m["settings"]["aliases"] == {n: {"fwd": "fa3_wgmma_e"} for n in BWD_STEPS}
    assert aliases.declared_of(json.loads(json.dumps(m)), []) == m["settings"]["aliases"]


def test_profile_prints_what_it_measures_with_the_aliases_named():
    from faprof.run.profile import measures_lines
    from faprof.run.resolve import setup

    su = setup("l4_causal", None, None)
    lines = measures_lines(su)
    assert lines[0].startswith(f"measures {len(su.pairs)} (variant, shape) pair(s)")
    assert lines[1:] == ["  alias fa3_wgmma_e (also fa3_bwd_a..d): fwd timed once for all of them (10 shapes)"]


def test_a_row_names_the_declared_aliases_it_stands_for(tmp_path):
    from faprof.run.finish import base_row

    scn = load_scenario("l4_causal")
    b = Bundle.create(tmp_path, scn.name, "cpu", {"scenario": {"name": scn.name}})
    p = scn.problems[0]
    assert base_row(b, scn, registry.get("fa3_wgmma_e"), p)["aliases"] == ",".join(BWD_STEPS)
    assert base_row(b, scn, registry.get("fa2_mma"), p)["aliases"] is None
    # with --variants naming the target alone, its row stands for no alias
    assert base_row(b, scn, registry.get("fa3_wgmma_e"), p, ["fa3_wgmma_e"])["aliases"] is None


@pytest.fixture(scope="module")
def as_new(cut, tmp_path_factory) -> Path:
    """The cut bundle as a run of this faprof writes it: no alias rows, the target's row naming them,
    the declarations in the manifest (made by faprof's own collapse, from the recorded rows)."""
    dest = tmp_path_factory.mktemp("aliases_new") / cut.name
    shutil.copytree(cut, dest)
    b = Bundle.open(dest)
    rows = aliases.measurements(b)
    for t in ("ncu_summary", "ncu_metrics", "stalls", "roofline", "ncu_rules", "source_lines"):
        b.write(t, aliases.without_aliases(b.read(t), rows))
    b.write("measurements", rows)
    b.update_manifest(settings={**b.manifest()["settings"], "aliases": {n: {"fwd": "fa3_wgmma_e"} for n in BWD_STEPS}})
    return dest


def test_explain_against_an_alias_that_was_never_timed(as_new):
    from click.testing import CliRunner

    from faprof.cli import main

    res = CliRunner().invoke(main, ["explain", str(as_new), "--against", "fa3_bwd_b", "--format", "text"])
    assert res.exit_code == 0, res.output
    assert "fa3_bwd" not in res.output.replace("(also fa3_bwd_a..d)", "")
    assert "vs fa3_wgmma_e" in res.output  # the gaps are to the kernel fa3_bwd_b runs
    assert "(also fa3_bwd_a..d)" in report.render_markdown(Bundle.open(as_new))
