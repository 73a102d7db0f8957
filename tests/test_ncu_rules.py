"""ncu's rule results and the advisor's counters, read offline from reports recorded on an H100.

Method: the fixtures of tests/data/ncu (recorded with `--set basic` and `--set full` plus faprof's
metrics; see scripts/record/record_ncu_fixtures.sh) are read with the PyPI `ncu-report` package. Rule
results are checked against what the kernels are known to do: fa_full's fa2 launch has a grid of
4 blocks on the H100's 132 SMs, and ncu's LaunchConfiguration rule estimates the speedup of filling
the GPU as 1 - 4/132; tiny_smem reads shared memory with a 32-word stride (32-way bank conflicts);
faprof's kernels do not spill. The reader keeps only the catalogue's metrics, and the summary's new
columns come from them.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from faprof.errors import FaprofError
from faprof.nsight import ncu
from faprof.nsight.ncu import tables as cat
from faprof.nsight.ncu.catalogue_core import ALL_KERNELS
from faprof.nsight.ncu.parse import keep_metric
from faprof.nsight.ncu.rule_results import MESSAGE_TYPES, clean_message
from faprof.nsight.ncu.summary import SUMMARY_COLUMNS, summarize

DATA = Path(__file__).parent / "data" / "ncu"
FIXTURES = ("tiny_full", "tiny_basic", "fa_basic", "fa_full")

#: SMs of the H100 SXM the fixtures were recorded on.
H100_SMS = 132


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    try:
        mod, _ = ncu.load_report_module()
    except FaprofError as e:
        pytest.skip(f"ncu_report cannot load here: {e}")
    d = tmp_path_factory.mktemp("ncu_rules")
    out = {}
    for name in FIXTURES:
        rep = d / f"{name}.ncu-rep"
        rep.write_bytes(gzip.decompress((DATA / f"{name}.ncu-rep.gz").read_bytes()))
        plan = ncu.load_plan(DATA / f"{name}_plan.json")
        out[name] = (ncu.read_tables(rep, plan, mod), plan, rep, mod)
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_rules_are_read_with_their_columns(tables, name):
    t, plan, _, _ = tables[name]
    r = t.rules
    assert t.rules_read and list(r.columns) == list(ncu.RULES_COLUMNS) and len(r) > 0
    assert set(r["type"]) <= set(MESSAGE_TYPES.values())
    assert r["rule"].str.len().gt(0).all() and r["section"].str.len().gt(0).all()
    assert r["message"].str.len().gt(0).all()
    assert not r["message"].str.contains("@url:|@section:|@sass:|@source:", regex=True).any()
    est = r["est_speedup_pct"].dropna()
    assert len(est) > 0 and est.between(0, 100).all()
    assert set(r.loc[r["est_speedup_pct"].notna(), "speedup_type"]) <= {"local", "global"}
    # every rule row belongs to a launch of the metrics table
    assert set(r["kernel_id"]) <= set(t.metrics["kernel_id"])


def test_launch_configuration_rule_on_a_small_grid(tables):
    t, _, _, _ = tables["fa_full"]
    s = summarize(t.metrics)
    blocks = s[s["kernel"] == "fa2_fwd_kernel"]["grid_size"].iloc[0]
    rule = t.rules[t.rules["rule"] == "LaunchConfiguration"].iloc[0]
    assert rule["section"] == "LaunchStats" and rule["type"] == "optimization"
    assert f"only {int(blocks)} blocks" in rule["message"]
    assert rule["est_speedup_pct"] == pytest.approx(100 * (1 - blocks / H100_SMS), rel=1e-6)


def test_basic_set_rules_come_only_from_its_sections(tables):
    t, _, _, _ = tables["fa_basic"]
    assert set(t.rules["section"]) <= {"SpeedOfLight", "LaunchStats", "Occupancy", "WorkloadDistribution"}
    full, _, _, _ = tables["fa_full"]
    assert "SourceCounters" in set(full.rules["section"])  # full's source counters bring their rules


def test_read_rules_alone_equals_the_combined_read(tables):
    t, plan, rep, mod = tables["tiny_full"]
    alone = ncu.read_rules(rep, plan, mod)
    assert alone.equals(t.rules)


def test_clean_message_keeps_link_text():
    text = "See @url:the guide:https://docs.nvidia.com/x@ and @section:Occupancy:the occupancy section@ for  more."
    assert clean_message(text) == "See the guide and the occupancy section for more."
    assert clean_message(None) == ""


# ------------------------------------------------------------------------------- catalogue only


@pytest.mark.parametrize("name", FIXTURES)
def test_only_catalogue_metrics_are_kept(tables, name):
    t, plan, rep, mod = tables[name]
    assert t.metrics["metric"].map(keep_metric).all()
    per_launch = t.metrics.groupby("kernel_id")["metric"].nunique()
    everything = ncu.read_report(rep, plan, mod, all_metrics=True).groupby("kernel_id")["metric"].nunique()
    assert (per_launch < 200).all() and (everything > 3 * per_launch).all()
    # what the derived tables read is the same either way
    assert summarize(t.metrics, plan).equals(
        summarize(ncu.read_report(rep, plan, mod, all_metrics=True), plan)
    )


def test_replay_passes_per_set(tables):
    for name, passes in (("fa_basic", 15), ("fa_full", 38), ("tiny_full", None)):
        t, plan, _, _ = tables[name]
        s = summarize(t.metrics, plan)
        got = s[s["kernel"] != ALL_KERNELS]["replay_passes"]
        if passes is None:
            assert got.between(30, 40).all()  # full, a pass less where a section does not apply
        else:
            assert (got == passes).all()


# ------------------------------------------------------------------------------- advisor counters


def test_bank_conflicts_show_as_wavefronts_per_shared_instruction(tables):
    t, plan, _, _ = tables["tiny_full"]
    s = summarize(t.metrics, plan).set_index("kernel")
    smem = s.loc["tiny_smem"]
    smem = smem[smem["launch"] >= 0].iloc[0] if smem.ndim > 1 else smem
    # 64 strided loads (32 wavefronts each) and 4 conflict-free stores per thread
    expected = (64 * 32 + 4) / (64 + 4)
    assert smem["smem_wavefronts_per_inst"] == pytest.approx(expected, rel=0.02)
    assert smem["smem_excessive_wavefronts"] > 0.9 * smem["smem_wavefronts"]
    fa2, _, _, _ = tables["fa_full"]
    f = summarize(fa2.metrics)
    f = f[f["kernel"] == "fa2_fwd_kernel"].iloc[0]
    assert 1 <= f["smem_wavefronts_per_inst"] < 3  # fa2's tiles are laid out without conflicts


@pytest.mark.parametrize("name", ["tiny_full", "fa_full"])
def test_no_spills_in_kernels_that_do_not_spill(tables, name):
    t, plan, _, _ = tables[name]
    s = summarize(t.metrics, plan)
    k = s[s["kernel"] != ALL_KERNELS]
    assert (k["local_ld_sectors"] == 0).all() and (k["local_st_sectors"] == 0).all()
    assert (k["spill_requests"] == 0).all() and (k["spill_inst"] == 0).all()


def test_coalescing_counters(tables):
    t, plan, _, _ = tables["fa_full"]
    s = summarize(t.metrics, plan)
    k = s[s["kernel"] == "fa2_fwd_kernel"].iloc[0]
    assert k["global_ld_sectors_per_request"] == pytest.approx(
        k["global_ld_sectors"] / k["global_ld_requests"]
    )
    assert k["global_excessive_sectors"] >= 0 and 0 < k["fma_pipe_util_pct"] < 100
    assert 0 < k["l2_throughput_pct"] < 100


def test_basic_set_has_no_advisor_counters_but_keeps_its_columns(tables):
    t, plan, _, _ = tables["fa_basic"]
    s = summarize(t.metrics, plan)
    assert list(s.columns) == list(SUMMARY_COLUMNS)
    assert s["smem_wavefronts_per_inst"].isna().all() and s["spill_requests"].isna().all()


# ------------------------------------------------------------------- the faprof set's own fixture

FAPROF_SET = DATA / "faprof_set.ncu-rep.gz"


@pytest.mark.skipif(
    not FAPROF_SET.exists(),
    reason="faprof_set fixture not recorded yet (scripts/record/record_ncu_faprof_fixture.sh)",
)
def test_faprof_set_fixture(tmp_path):
    """The report `faprof profile --ncu` wrote on the H100: its sections, stalls, rules and counters."""
    import pandas as pd

    try:
        mod, _ = ncu.load_report_module()
    except FaprofError as e:
        pytest.skip(f"ncu_report cannot load here: {e}")
    rep = tmp_path / "faprof_set.ncu-rep"
    rep.write_bytes(gzip.decompress(FAPROF_SET.read_bytes()))
    plan = ncu.load_plan(DATA / "faprof_set_plan.json")
    t = ncu.read_tables(rep, plan, mod)
    assert set(t.rules["section"]) <= set(ncu.FAPROF_SECTIONS)
    s = summarize(t.metrics, plan)
    k = s[s["kernel"] != ALL_KERNELS]
    assert k["variant"].notna().all() and (k["replay_passes"] < 38).all()
    for col in (
        "achieved_occupancy_pct",
        "sm_throughput_pct",
        "local_ld_sectors",
        "smem_wavefronts_per_inst",
        "global_ld_sectors_per_request",
        "fma_pipe_util_pct",
        "hw_flops",
        "dram_bytes",
    ):
        assert k[col].notna().any(), col
    assert not cat.stall_table(t.metrics).empty
    csv = pd.read_csv(DATA / "faprof_set_ncu_raw.csv", dtype=str).iloc[1:].reset_index(drop=True)
    assert len(csv) == t.metrics["kernel_id"].nunique()
    for kid, row in csv.iterrows():
        got = dict(zip(*t.metrics[t.metrics["kernel_id"] == kid][["metric", "value"]].T.values, strict=True))
        for metric in csv.columns[2:]:
            if pd.notna(row[metric]) and metric in got:
                text = row[metric].replace(",", "")
                half_unit = 0.5 * 10.0 ** -(len(text.split(".", 1)[1]) if "." in text else 0)
                assert got[metric] == pytest.approx(float(text), rel=1e-3, abs=half_unit), metric
