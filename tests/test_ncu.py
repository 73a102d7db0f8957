"""Nsight Compute integration without a GPU: the ncu command line, finding ncu, the metric catalogue,
and the report parser and derived tables on real reports recorded on an H100 (tests/data/ncu/).

Method: the command builder's output is compared with the exact argv; `find_ncu` runs against fake
installs in a temporary folder; the catalogue is checked against `ncu --query-metrics --chip` lists
saved from Nsight Compute 2025.3.1 (every name faprof asks ncu for must exist on its chip). The
fixtures hold kernels with known work (tests/data/ncu/tiny_kernels.cu: exact FFMA and HMMA counts,
a 32-way bank conflict) and faprof's own naive/fa1/fa2 kernels; parsed values are compared with what
`ncu --import R --page raw --csv --print-units base` printed for the same report (the *_ncu_raw.csv
files), then the derived tables with the kernels' known work (`collect()` against a fake ncu is in
tests/test_ncu_collect.py, rule results in tests/test_ncu_rules.py, the plan in
tests/test_ncu_plan.py). Reports are read with the PyPI package `ncu-report`; tests that need it
skip when it cannot load.
"""

from __future__ import annotations

import gzip
import stat
from pathlib import Path

import pandas as pd
import pytest

from faprof.errors import FaprofError
from faprof.model.scenarios import load_scenario, parse_scenario
from faprof.nsight import ncu
from faprof.nsight.ncu import find as ncu_find
from faprof.nsight.ncu import tables as cat
from faprof.nsight.ncu.catalogue import base_name, concept, names_for, requested_metrics, unit_scale
from faprof.nsight.ncu.catalogue_core import ALL_KERNELS, CC_CHIPS, KNOWN_CCS, OCCUPANCY_LIMITERS, cc_key
from faprof.nsight.ncu.catalogue_stalls import STALL_REASONS, STALL_SOURCES, stall_metric
from faprof.nsight.ncu.roofline import ROOFLINE_COLUMNS, roofline_table
from faprof.nsight.ncu.summary import SUMMARY_COLUMNS, summarize

DATA = Path(__file__).parent / "data" / "ncu"

#: ncu's L2 hit rate of kernels that move a few KB reads slightly above 100% (101.3% in tiny_basic):
#: sectors that hit count against a lookup total that misses some; a few % of slack, not more.
L2_HIT_SLACK_PCT = 3.0

#: Hardware over analytic FLOPs of faprof's kernels on the fixture's shapes: 1.12 (fa2, 64x64) up
#: to ~15 (Sq=17 Sk=113 causal: the exact count is 153 pairs a head, the kernels compute whole
#: padded, partly masked tiles); below 1 a kernel would skip required math. The upper bound is
#: checked per shape: at most this factor over the work of every 64x64 tile the problem touches.
HW_OVER_ANALYTIC_FIXTURE = (0.99, 3.0)


def _padded_tile_ratio(problem) -> float:
    """Pairs of the 64x64 tiles covering Sq x Sk over the problem's unmasked pairs."""
    def pad(n: int) -> int:
        return -(-n // 64) * 64

    return pad(problem.Sq) * pad(problem.Sk) / problem.unmasked_pairs()

#: Relative tolerance between our reading of a report and ncu's CSV of the same report: the CSV
#: prints values rounded to a few significant digits.
CSV_REL_TOL = 1e-3


# ------------------------------------------------------------------------------------ argv


def test_command_basic_exact_argv():
    argv = ncu.ncu_command(
        "/b/raw/ncu",
        ncu="/opt/ncu",
        scenario="/b/raw/ncu_scenario.toml",
        variants=["naive", "fa2"],
        plan_out="/b/raw/ncu_plan.json",
        python="/usr/bin/python3",
    )
    assert argv == [
        "/opt/ncu",
        "--nvtx",
        "--nvtx-include",
        "naive/",
        "--nvtx-include",
        "naive",
        "--nvtx-include",
        "fa2/",
        "--nvtx-include",
        "fa2",
        "--set",
        "basic",
        "--cache-control",
        "all",
        "--clock-control",
        "none",
        "-f",
        "-o",
        "/b/raw/ncu",
        "/usr/bin/python3",
        "-m",
        "faprof.nsight.target",
        "--scenario",
        "/b/raw/ncu_scenario.toml",
        "--tool",
        "ncu",
        "--variants",
        "naive,fa2",
        "--plan-out",
        "/b/raw/ncu_plan.json",
        "--iters",
        "1",
    ]


def test_command_full_with_metrics_source_shapes_and_user_variants():
    argv = ncu.ncu_command(
        Path("r"),
        ncu="ncu",
        scenario="smoke",
        variants=["fa2", "fa2"],
        plan_out="p.json",
        ncu_set="full",
        metrics=["dram__bytes_read.sum", "lts__t_sector_hit_rate.pct", "dram__bytes_read.sum"],
        cache_control="none",
        clock_control="base",
        import_source=True,
        shapes=["s1", "s2"],
        iters=2,
        user_variants=["my.py"],
        python="py",
    )
    assert argv == [
        "ncu",
        "--nvtx",
        "--nvtx-include",
        "fa2/",
        "--nvtx-include",
        "fa2",
        "--set",
        "full",
        "--metrics",
        "dram__bytes_read.sum,lts__t_sector_hit_rate.pct",
        "--cache-control",
        "none",
        "--clock-control",
        "base",
        "--import-source",
        "yes",
        "-f",
        "-o",
        "r",
        "py",
        "-m",
        "faprof.nsight.target",
        "--scenario",
        "smoke",
        "--tool",
        "ncu",
        "--variants",
        "fa2",
        "--plan-out",
        "p.json",
        "--iters",
        "2",
        "--shapes",
        "s1,s2",
        "--user-variants",
        "my.py",
    ]


def test_command_metrics_only_and_warmup_exclusion_with_own_target():
    argv = ncu.ncu_command(
        "out",
        ncu_set=None,
        metrics=["gpu__time_duration.sum"],
        nvtx_variants=[],
        target=["./tiny", "plan.json"],
    )
    assert argv == [
        "ncu",
        "--nvtx",
        "--nvtx-exclude",
        "faprof_warmup/",
        "--metrics",
        "gpu__time_duration.sum",
        "--cache-control",
        "all",
        "--clock-control",
        "none",
        "-f",
        "-o",
        "out",
        "./tiny",
        "plan.json",
    ]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"ncu_set": "everything"}, "ncu set"),
        ({"ncu_set": None}, "metrics"),
        ({"cache_control": "some"}, "cache control"),
        ({"clock_control": "reset"}, "clock control"),
        ({"iters": 0}, "iterations"),
    ],
)
def test_command_rejects_bad_options(kwargs, words):
    with pytest.raises(FaprofError, match=words):
        ncu.ncu_command("r", scenario="smoke", variants=["fa2"], plan_out="p", **kwargs)


def test_nvtx_filter_includes_each_variant_range_once():
    # 'a/': the push/pop range on the launching thread; 'a': the start/end range of that name, open
    # for every thread (a backward's kernels are launched by autograd's thread)
    assert ncu.nvtx_filter(["a", "b", "a", ""]) == ["--nvtx", "--nvtx-include", "a/", "--nvtx-include", "a",
                                                    "--nvtx-include", "b/", "--nvtx-include", "b"]
    assert ncu.nvtx_filter([]) == ["--nvtx", "--nvtx-exclude", "faprof_warmup/"]


# ------------------------------------------------------------------------------- find_ncu


def _fake_exe(path: Path, body: str = "echo fake") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_installs(monkeypatch):
    monkeypatch.setattr(ncu_find, "CUDA_NCU_GLOBS", ())
    monkeypatch.setattr(ncu_find, "NSIGHT_NCU_GLOBS", ())


def test_find_ncu_prefers_explicit_env_then_path(tmp_path, no_installs):
    on_path = _fake_exe(tmp_path / "bin" / "ncu")
    explicit = _fake_exe(tmp_path / "custom" / "ncu")
    assert ncu.find_ncu({"PATH": str(on_path.parent)}) == on_path
    assert ncu.find_ncu({"PATH": str(on_path.parent), "NCU": str(explicit)}) == explicit
    assert ncu.find_ncu({"PATH": "", "NCU": str(explicit.parent)}) == explicit  # a folder holding ncu
    assert ncu.find_ncu({"PATH": str(on_path.parent), "NCU": str(tmp_path / "missing")}) == on_path
    assert ncu.find_ncu({"PATH": ""}) is None


def test_find_ncu_under_cuda_home_and_newest_nsight_install(tmp_path, monkeypatch, no_installs):
    cuda = _fake_exe(tmp_path / "cuda-12.4" / "bin" / "ncu")
    assert ncu.find_ncu({"PATH": "", "CUDA_HOME": str(cuda.parent.parent)}) == cuda
    for v in ("2023.3.0", "2025.3.1", "2024.1.1"):
        _fake_exe(tmp_path / "nsight-compute" / v / "ncu")
    (tmp_path / "nsight-compute" / "2026.1.0").mkdir()  # a folder without ncu is skipped
    monkeypatch.setattr(ncu_find, "NSIGHT_NCU_GLOBS", (str(tmp_path / "nsight-compute" / "*" / "ncu"),))
    assert ncu.find_ncu({"PATH": ""}) == tmp_path / "nsight-compute" / "2025.3.1" / "ncu"


def test_find_ncu_skips_non_executables(tmp_path, no_installs):
    f = tmp_path / "bin" / "ncu"
    f.parent.mkdir()
    f.write_text("not executable")
    assert ncu.find_ncu({"PATH": str(f.parent), "NCU": str(f)}) is None


def test_ncu_version_parsed_from_the_tool(tmp_path):
    exe = _fake_exe(
        tmp_path / "ncu",
        'echo "NVIDIA (R) Nsight Compute Command Line Profiler"; '
        'echo "Version 2025.3.1.0 (build 36398880) (public-release)"',
    )
    text, version = ncu.ncu_version(exe)
    assert text == "2025.3.1.0" and version == (2025, 3, 1)
    assert ncu.supports_import_source(version) and not ncu.supports_import_source((2019, 5, 0))
    assert ncu.ncu_version(tmp_path / "absent") == (None, None)


# ------------------------------------------------------------------------------- catalogue


def _query_names(chip: str) -> set[str]:
    return ncu.parse_query_metrics(
        gzip.decompress((DATA / f"query_metrics_{chip}.txt.gz").read_bytes()).decode()
    )


def test_cc_key_maps_unknown_ccs_to_the_nearest_older_known_one():
    assert [cc_key(c) for c in ("8.0", "8.6", "8.9", "9.0")] == ["8.0", "8.6", "8.9", "9.0"]
    assert cc_key((8, 7)) == "8.6" and cc_key("10.0") == "9.0" and cc_key("12.0") == "9.0"
    assert cc_key("7.5") == "8.0" and cc_key(None) == "9.0" and cc_key("x") == "9.0"


def test_catalogue_names_differ_per_cc_where_chips_differ():
    assert names_for("tensor_gmma_inst", "9.0") and not names_for("tensor_gmma_inst", "8.0")
    assert names_for("peak_tensor_gmma_per_cycle", "9.0") and not names_for(
        "peak_tensor_gmma_per_cycle", "8.9"
    )
    # Ada counts HMMA with corrected `_v2` counters; the others (and Ada as a fallback) without
    assert names_for("tensor_hmma_inst", "8.9") == (
        "sm__inst_executed_pipe_tensor_op_hmma_v2.sum",
        "sm__inst_executed_pipe_tensor_op_hmma.sum",
    )
    assert names_for("tensor_hmma_inst", "8.6") == ("sm__inst_executed_pipe_tensor_op_hmma.sum",)
    # Hopper's fp16 tensor counter has no destination type; Ampere/Ada split fp16 and fp32 accumulate
    assert names_for("tensor_ops_fp16", "9.0") == ("sm__ops_path_tensor_src_fp16.sum",)
    assert names_for("tensor_ops_fp16", "8.0") == ("sm__ops_path_tensor_src_fp16_dst_fp32.sum",)
    assert names_for("tensor_ops_fp8", "8.9") and not names_for("tensor_ops_fp8", "8.6")
    assert names_for("tensor_fp_util", "9.0")[0].startswith(
        "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma"
    )
    for cc in KNOWN_CCS:
        assert names_for("duration", cc) == ("gpu__time_duration.sum",)
        assert names_for("inst_ffma", cc)[0] == "sm__sass_thread_inst_executed_op_ffma_pred_on.sum"
    with pytest.raises(KeyError, match="known"):
        concept("no_such_thing")


@pytest.mark.parametrize("cc", KNOWN_CCS)
def test_every_requested_metric_exists_on_its_chip(cc):
    names = _query_names(CC_CHIPS[cc])
    assert len(names) > 500
    requested = requested_metrics(cc, names)
    assert requested == requested_metrics(cc)  # nothing had to be dropped: the catalogue is right
    for m in requested:
        assert base_name(m) in names, (cc, m)
    # the concepts the summary needs most are requested on every chip
    for key in ("dram_bytes_read", "inst_ffma", "tensor_hmma_inst", "l2_hit_rate", "peak_ffma_per_cycle"):
        assert base_name(names_for(key, cc)[0]) in names, (cc, key)


def test_requested_metrics_drop_what_the_chip_lacks():
    got = requested_metrics("9.0", {"dram__bytes_read", "lts__t_sector_hit_rate"})
    assert got == ["dram__bytes_read.sum", "lts__t_sector_hit_rate.pct"]


def test_parse_query_metrics_reads_the_first_word_of_rows():
    text = "Device GH100\n----\nMetric Name  Metric Description\ndram__bytes  # bytes\n  sm__cycles_elapsed  # cycles\nfoo bar\n"
    assert ncu.parse_query_metrics(text) == {"dram__bytes", "sm__cycles_elapsed"}


@pytest.mark.parametrize(
    "name, parsed",
    [
        (
            "smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio",
            ("warp_latency", "long_scoreboard"),
        ),
        (
            "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
            ("warp_state", "no_instructions"),
        ),
        ("smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", ("warp_state", "barrier")),
        ("smsp__pcsamp_warps_issue_stalled_mio_throttle", ("pc_sampling", "mio_throttle")),
        ("smsp__pcsamp_warps_issue_stalled_mio_throttle_not_issued", None),
        ("smsp__warps_issue_stalled_barrier", None),
        ("gpu__time_duration.sum", None),
    ],
)
def test_stall_metric_names(name, parsed):
    assert stall_metric(name) == parsed


@pytest.mark.parametrize(
    "unit, factor, base",
    [
        ("nsecond", 1e-9, "second"),
        ("usecond", 1e-6, "second"),
        ("msecond", 1e-3, "second"),
        ("Kbyte", 1e3, "byte"),
        ("Gbyte/second", 1e9, "byte/second"),
        ("cycle/nsecond", 1e9, "cycle/second"),
        ("byte/block", 1.0, "byte/block"),
        ("%", 1.0, "%"),
        ("", 1.0, ""),
        ("register/thread", 1.0, "register/thread"),
    ],
)
def test_unit_scale(unit, factor, base):
    f, b = unit_scale(unit)
    assert f == pytest.approx(factor) and b == base


def test_derived_tables_of_an_empty_report_have_their_columns():
    empty = pd.DataFrame(columns=list(ncu.METRICS_COLUMNS))
    assert list(summarize(empty).columns) == list(SUMMARY_COLUMNS)
    assert list(cat.stall_table(empty).columns) == list(cat.STALL_COLUMNS)
    assert list(roofline_table(empty).columns) == list(ROOFLINE_COLUMNS)


# --------------------------------------------------------------------------- NVTX attribution


def test_attribute_uses_the_plan_pairs_then_the_iter_range():
    pairs = {("fa2", "b1"), ("naive", "b1")}
    assert ncu.attribute(["fa2", "b1", "iter0"], pairs) == ("fa2", "b1", 0)
    assert ncu.attribute(["outer", "naive", "b1", "iter3"], pairs) == ("naive", "b1", 3)
    assert ncu.attribute(["b1", "fa2", "iter0"], pairs) == ("fa2", "b1", 0)  # both open, any order
    assert ncu.attribute(["faprof_warmup"], pairs) == (None, None, None)
    assert ncu.attribute([], pairs) == (None, None, None)
    assert ncu.attribute(["v", "s", "iter1"]) == ("v", "s", 1)
    assert ncu.attribute(["v", "s"]) == (None, None, None)


# ------------------------------------------------------------------------------ scenario file


@pytest.mark.parametrize("name", ["smoke", "l4_causal", "rtx3090_tensorcore", "l20_fwd_bwd"])
def test_scenario_written_for_the_target_round_trips(tmp_path, name):
    import tomllib

    s = load_scenario(name)
    text = ncu.toml_dumps(s.raw)
    assert tomllib.loads(text) == s.raw
    again = parse_scenario(tomllib.loads(text), "round trip")
    assert [p.shape_id for p in again.problems] == [p.shape_id for p in s.problems]


# ------------------------------------------------------------------------ real reports (fixtures)


def _reader():
    try:
        mod, _ = ncu.load_report_module()
    except FaprofError as e:
        pytest.skip(f"ncu_report cannot load here: {e}")
    return mod


FIXTURES = ("tiny_full", "tiny_basic", "fa_basic", "fa_full", "bwd_basic")


@pytest.fixture(scope="session")
def report_files(tmp_path_factory) -> dict[str, Path]:
    """The fixtures, unpacked: they are committed gzipped (ncu's files compress 5-10x)."""
    d = tmp_path_factory.mktemp("ncu_reports")
    out = {}
    for name in FIXTURES:
        gz = DATA / f"{name}.ncu-rep.gz"
        if gz.exists():
            out[name] = d / f"{name}.ncu-rep"
            out[name].write_bytes(gzip.decompress(gz.read_bytes()))
    return out


@pytest.fixture(scope="module")
def reports(report_files):
    mod = _reader()
    out = {}
    for name, rep in report_files.items():
        plan = ncu.load_plan(DATA / f"{name}_plan.json")
        out[name] = (ncu.read_report(rep, plan, mod), plan)
    return out


def _report(reports, name):
    if name not in reports:
        pytest.skip(f"fixture {name}.ncu-rep not recorded")
    return reports[name]


def _ncu_csv(name: str) -> pd.DataFrame:
    """ncu's own CSV of the fixture: one row per kernel, metric columns; units row dropped."""
    df = pd.read_csv(DATA / f"{name}_ncu_raw.csv", dtype=str)
    return df.iloc[1:].reset_index(drop=True)


def _num(text: str) -> float:
    return float(str(text).replace(",", ""))


def _resolution(text: str) -> float:
    """Half a unit of the last decimal ncu printed ("0.03" -> 0.005, "4,032" -> 0.5)."""
    t = str(text).replace(",", "")
    decimals = len(t.split(".", 1)[1]) if "." in t else 0
    return 0.5 * 10.0**-decimals


def test_fixtures_are_small(report_files):
    assert set(report_files) == set(FIXTURES)
    for name, p in report_files.items():
        assert (DATA / f"{name}.ncu-rep.gz").stat().st_size < 2 * 2**20, name
        assert p.stat().st_size < 10 * 2**20, name


@pytest.mark.parametrize("name", FIXTURES)
def test_parsed_values_equal_ncus_own_csv(reports, name):
    df, _ = _report(reports, name)
    csv = _ncu_csv(name)
    assert df["kernel_id"].nunique() == len(csv)
    checked = 0
    for kid, row in csv.iterrows():
        got = df[df["kernel_id"] == kid]
        assert got["kernel"].iloc[0] in row["Kernel Name"]
        values = dict(zip(got["metric"], got["value"], strict=True))
        for metric in csv.columns[2:]:
            if pd.isna(row[metric]) or metric not in values:
                continue
            # both are in the units ncu stores (--print-units base): no conversion; the CSV rounds
            # to the decimals it prints
            assert values[metric] == pytest.approx(
                _num(row[metric]), rel=CSV_REL_TOL, abs=_resolution(row[metric])
            ), (kid, metric)
            checked += 1
    assert checked >= 10 * len(csv)


def test_ranges_attribute_every_kernel_of_the_faprof_target(reports):
    df, plan = _report(reports, "fa_basic")
    assert df["variant"].notna().all()
    per = df.drop_duplicates("kernel_id").groupby(["variant", "shape_id"])["launch"].apply(list).to_dict()
    ran = [(p["variant"], p["shape_id"]) for p in plan["pairs"] if p["ran"]]
    assert sorted(per) == sorted(ran)
    for (variant, _), launches in per.items():
        assert launches == list(range({"naive": 3}.get(variant, 1)))
    assert set(df["iteration"].dropna()) == {0}
    assert df["nvtx"].str.endswith("/iter0").all()


def test_backward_kernels_launched_by_autograds_thread_are_attributed(reports):
    """bwd_basic (scripts/record/record_ncu_bwd_fixture.sh): fa2_mma and fa2_mma_det, bwd and fwd_bwd calls.
    The backward kernels carry no push/pop range of faprof's (autograd's thread launched them); the
    start/end ranges place them, so every kernel of every call is attributed, in launch order."""
    df, plan = _report(reports, "bwd_basic")
    k = df.drop_duplicates("kernel_id")
    assert k["variant"].notna().all(), k[k["variant"].isna()]["kernel"].tolist()
    ran = {(p["variant"], p["shape_id"]) for p in plan["pairs"] if p["ran"]}
    assert set(zip(k["variant"], k["shape_id"], strict=True)) == ran and len(ran) == 4
    for (variant, shape_id), g in k.groupby(["variant", "shape_id"]):
        names = list(g.sort_values("launch")["kernel"])
        assert list(g.sort_values("launch")["launch"]) == list(range(len(names)))
        bwd = [n for n in names if "bwd" in n]
        assert len(bwd) == 3 and any("preprocess" in n for n in bwd), (variant, names)
        assert ("dq_kernel" in " ".join(bwd)) == (variant == "fa2_mma_det")
        assert len(names) == (4 if shape_id.endswith("_fwd_bwd") else 3), names
        if shape_id.endswith("_fwd_bwd"):
            assert "fwd" in names[0]  # the forward: on the calling thread, before the backward
    assert set(k["iteration"]) == {0}
    assert k["nvtx"].str.endswith("/iter0").all()


def test_kernels_outside_every_range_stay_unattributed(reports):
    df, _ = _report(reports, "tiny_basic")
    outside = df[df["variant"].isna()].drop_duplicates("kernel_id")
    assert list(outside["kernel"]) == ["tiny_setup"] and (outside["launch"] == -1).all()
    assert ALL_KERNELS not in set(outside["kernel"])
    s = summarize(df)
    assert "tiny_setup" not in set(s["kernel"])


def _expected(plan, variant):
    return [p["expected"] for p in plan["pairs"] if p["variant"] == variant]


@pytest.mark.parametrize("name", ["tiny_full", "tiny_basic"])
def test_hardware_flops_match_the_kernels_known_work(reports, name):
    df, plan = _report(reports, name)
    s = summarize(df, plan)
    k = s[s["kernel"] != ALL_KERNELS].set_index("shape_id")
    for p in plan["pairs"]:
        exp, row = p["expected"], k.loc[p["shape_id"]]
        assert row["kernel"] == exp["kernel"]
        assert row["grid_size"] == exp["blocks"] and row["block_size"] == exp["threads_per_block"]
        if "ffma" in exp:
            assert row["fp32_flops"] == exp["fp32_flops"]  # exact: every FFMA, no other FP32 op
            # ptxas moves constants with zero-operand HFMA2 (one per thread here): counted as fp16
            assert 0 <= row["fp16_flops"] <= 2 * exp["blocks"] * exp["threads_per_block"]
            assert row["tensor_flops"] == 0  # the tensor FLOP counters see no MMA, whatever moves ran
            assert row["hw_flops"] == row["fp32_flops"] + row["fp16_flops"]
        if "wmma_m16n16k16" in exp:
            assert row["tensor_flops"] == exp["tensor_flops"]
            assert row["fp32_flops"] == 0
            assert row["tensor_pipe_util_pct"] > 0
        if "static_smem_bytes" in exp:
            assert row["smem_static_bytes"] == exp["static_smem_bytes"]
            assert row["smem_bank_conflicts"] > 0 and row["smem_bank_conflicts_ld"] > 0


@pytest.mark.parametrize("name", FIXTURES)
def test_summary_values_are_sane(reports, name):
    df, plan = _report(reports, name)
    s = summarize(df, plan)
    assert list(s.columns) == list(SUMMARY_COLUMNS)
    k = s[s["kernel"] != ALL_KERNELS]
    assert len(k) == df[df["variant"].notna()]["kernel_id"].nunique()
    assert (k["duration_ms"] > 0).all() and (k["duration_ms"] < 100).all()
    assert k["achieved_occupancy_pct"].between(0, 100, inclusive="right").all()
    assert k["theoretical_occupancy_pct"].between(0, 100, inclusive="right").all()
    assert k["occupancy_limiter"].isin(OCCUPANCY_LIMITERS).all()
    assert (k["cc"] == "9.0").all() and (k["sm_count"] == 132).all()
    assert k["l2_hit_rate_pct"].between(0, 100 + L2_HIT_SLACK_PCT).all()
    assert (k["dram_bytes"] >= 0).all()
    assert (k["hw_flops"] > 0).sum() >= 1
    agg = s[s["kernel"] == ALL_KERNELS]
    assert len(agg) == k.groupby(["variant", "shape_id"]).ngroups
    for _, a in agg.iterrows():
        g = k[(k["variant"] == a["variant"]) & (k["shape_id"] == a["shape_id"])]
        assert a["kernels"] == len(g)
        assert a["duration_ms"] == pytest.approx(g["duration_ms"].sum())
        assert a["hw_flops"] == pytest.approx(g["hw_flops"].sum())


def test_faprof_kernels_compare_with_the_analytic_flops(reports):
    from faprof.model.problem import AttentionProblem

    df, plan = _report(reports, "fa_basic")
    s = summarize(df, plan)
    agg = s[s["kernel"] == ALL_KERNELS].set_index(["variant", "shape_id"])
    assert len(agg) == sum(p["ran"] for p in plan["pairs"]) == 8
    for (variant, shape_id), row in agg.iterrows():
        entry = next(p for p in plan["pairs"] if (p["variant"], p["shape_id"]) == (variant, shape_id))
        prob = AttentionProblem(**entry["problem"])
        assert row["analytic_flops"] == prob.flops()
        # A kernel cannot do less math than the analytic count (exact unmasked pairs); the softmax
        # (scale, exp, sums) and computed-then-masked tiles put the hardware count above it.
        upper = HW_OVER_ANALYTIC_FIXTURE[1] * max(1.0, _padded_tile_ratio(prob) / 2)
        assert HW_OVER_ANALYTIC_FIXTURE[0] < row["hw_over_analytic"] < upper, (
            variant,
            shape_id,
        )
        if variant in ("fa2_wmma", "fa2_mma"):
            assert row["tensor_flops"] >= row["analytic_flops"] and row["fp32_flops"] < row["tensor_flops"]
        else:
            assert row["tensor_flops"] == 0 and row["fp32_flops"] >= row["analytic_flops"]
    # fa2_mma computes every tile of this causal problem in full: exactly the non-causal count,
    # 2 x 128 / 129 of the exact causal count (128*129/2 pairs a head); fa2_wmma skips some.
    mma = agg.loc[("fa2_mma", "b1_h2_sq128_sk128_d64_fp16_causal_fwd")]
    full = AttentionProblem(B=1, H=2, Sq=128, Sk=128, D=64, dtype="fp16").flops()
    assert mma["tensor_flops"] == full == mma["analytic_flops"] * 2 * 128 / 129


def test_move_idiom_hmma_instructions_are_not_counted_as_tensor_flops(reports):
    df, plan = _report(reports, "fa_basic")
    s = summarize(df, plan)
    fa2 = s[(s["variant"] == "fa2") & (s["kernel"] != ALL_KERNELS)]
    # ptxas's HFMA2.MMA register moves issue on the HMMA pipe: the instruction counter sees them,
    # the tensor FLOP counters do not.
    assert (fa2["tensor_hmma_inst"] > 0).all() and (fa2["tensor_flops"] == 0).all()


def test_hopper_mma_sync_kernel_gets_the_hmma_tensor_roof(reports):
    df, plan = _report(reports, "fa_basic")
    r = roofline_table(df, plan)
    mma = r[(r["variant"] == "fa2_mma") & (r["kernel"] == ALL_KERNELS)].set_index("ceiling_source")
    assert set(mma["precision"]) == {"tensor"}
    # mma.sync peaks at 2/3 of wgmma on an H100 (360,448 vs 540,672 dense fp16 FLOP/cycle); the
    # datasheet's 989 TFLOP/s is the wgmma figure.
    ratio = mma.loc["ncu", "peak_flops_per_s"] / mma.loc["gpu_db", "peak_flops_per_s"]
    assert 0.6 < ratio < 0.8


@pytest.mark.parametrize("name", ["tiny_full", "fa_full"])
def test_stall_shares_sum_to_one(reports, name):
    df, _ = _report(reports, name)
    st = cat.stall_table(df)
    assert not st.empty
    assert set(st["reason"]) <= set(STALL_REASONS)
    assert "selected" not in set(st["reason"])
    sums = st.groupby(["kernel_id", "source"])["share"].sum()
    assert sums.to_numpy() == pytest.approx(1.0)
    assert st["share"].between(0, 1).all()
    assert set(st["source"]) <= set(STALL_SOURCES)


def test_basic_set_has_no_stalls(reports):
    df, _ = _report(reports, "fa_basic")
    st = cat.stall_table(df)
    assert st.empty and list(st.columns) == list(cat.STALL_COLUMNS)


def test_smem_kernel_stalls_on_shared_memory(reports):
    df, plan = _report(reports, "tiny_full")
    st = cat.stall_table(df)
    smem = st[(st["variant"] == "tiny_smem") & (st["source"] == "warp_state")]
    top = smem.sort_values("share", ascending=False)["reason"].iloc[0]
    # 32-way conflicts serialize the shared loads: the warps wait on the MIO queue / its results.
    assert top in ("mio_throttle", "short_scoreboard", "lg_throttle"), smem[["reason", "share"]]


@pytest.mark.parametrize("name", FIXTURES)
def test_roofline_points_and_ceilings(reports, name):
    df, plan = _report(reports, name)
    r = roofline_table(df, plan)
    assert list(r.columns) == list(ROOFLINE_COLUMNS)
    assert set(r["ceiling_source"]) == {"ncu", "gpu_db"}
    assert (r["ceiling_label"][r["ceiling_source"] == "gpu_db"] == "H100 SXM5").all()
    fp32 = r[(r["precision"] == "fp32")]
    ncu_fp32 = fp32[fp32["ceiling_source"] == "ncu"]["peak_flops_per_s"]
    db_fp32 = fp32[fp32["ceiling_source"] == "gpu_db"]["peak_flops_per_s"]
    # ncu's peak uses the clock measured during the kernel; the datasheet's the boost clock.
    assert ((ncu_fp32 > 0.5 * db_fp32.iloc[0]) & (ncu_fp32 < 1.1 * db_fp32.iloc[0])).all()
    bw = r[r["ceiling_source"] == "ncu"]["peak_dram_bytes_per_s"]
    assert bw.between(2.5e12, 3.5e12).all()  # H100 SXM HBM3: 3.35 TB/s
    pts = r[
        (r["ceiling_source"] == "ncu")
        & (r["flops"] > 0)
        & (r["dram_bytes"] > 0)
        & r["peak_flops_per_s"].notna()
    ]
    assert not pts.empty
    assert (pts["achieved_flops_per_s"] <= pts["peak_flops_per_s"] * 1.05).all()
    assert pts["bound"].isin(["memory", "compute"]).all()


def test_tensor_kernel_uses_the_tensor_ceiling(reports):
    df, plan = _report(reports, "tiny_full")
    r = roofline_table(df, plan)
    h = r[(r["variant"] == "tiny_hmma") & (r["kernel"] == "tiny_hmma")]
    assert set(h["precision"]) == {"tensor"}
    db = h[h["ceiling_source"] == "gpu_db"]["peak_flops_per_s"].iloc[0]
    assert db == pytest.approx(989.4e12, rel=0.05)  # H100 SXM dense fp16, fp32 accumulate


