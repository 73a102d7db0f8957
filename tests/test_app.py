"""The dashboard on real run bundles: every page through Streamlit's AppTest, and its data functions.

Fixtures (tests/data/bundles/, copies of real runs; its README says how each was made): an H100
`smoke` and `l4_causal` run (torch baselines), H100 `smoke` runs with Nsight Compute
(`--ncu full`) and Nsight Systems (`--nsys`) tables, the same `l4_causal` on the CPU (a second machine for the GPUs and Diff
pages), and a CPU `flags` run whose two buggy user variants give real `wrong` and `failed` rows. Checks are what a user looks for: each page renders without an
exception, shows its charts and tables, flags wrong/failed rows, labels published figures as
published, and says which flag produces data it lacks.
"""

from __future__ import annotations

import io
import json
import shlex
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from faprof import analysis as fd
from faprof.advisor import views as advisor_views
from faprof.errors import FaprofError
from faprof.store import Bundle

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = ROOT / "tests" / "data" / "bundles"
APP = ROOT / "app" / "dashboard.py"
H100_L4 = "20261121T192510Z_nvidia-h100-80gb-hbm3_l4-causal"
H100_NCU = "20261121T195544Z_nvidia-h100-80gb-hbm3_smoke"
H100_NSYS = "20261121T194831Z_nvidia-h100-80gb-hbm3_smoke"
CPU_L4 = "20261121T193107Z_cpu_l4-causal"
FLAGS = "20261121T193159Z_cpu_flags"
PAGES = ("overview", "variants", "gpus", "ncu", "timeline", "diff", "wrong", "leaderboard")

#: AppTest's per-run timeout: the first run imports plotly and loads every bundle (2-core CI).
APPTEST_TIMEOUT_S = 60


@pytest.fixture(scope="module", autouse=True)
def _keep_main_module():
    """Streamlit's AppTest leaves the dashboard script as `__main__`; every process spawned after this module
    (dask's workers in test_cluster, ...) would then run the dashboard again on start (5 s each on 2 cores)."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(scope="module")
def runs() -> fd.RunSet:
    return fd.load_runs([(BUNDLES, "command line"), (fd.EXAMPLES_DIR, "example")])


# --------------------------------------------------------------------------------- data layer
def test_loads_every_fixture_bundle_once(runs):
    ids = set(runs.runs["run_id"])
    assert {H100_L4, CPU_L4, FLAGS} <= ids
    assert runs.runs["run_id"].is_unique  # examples/runs copies of the fixtures are not loaded twice
    assert not runs.warnings
    row = runs.runs.set_index("run_id").loc[FLAGS]
    assert (row["gpu"], row["scenario"], row["wrong"], row["failed"]) == ("CPU (no GPU)", "flags", 3, 6)
    h100 = runs.runs.set_index("run_id").loc[H100_L4]
    assert h100["gpu"] == "NVIDIA H100 80GB HBM3" and h100["torch"].startswith("2.11")


def test_speedup_is_over_each_runs_own_baseline(runs):
    m = runs.measurements
    h = m[(m["run_id"] == H100_L4) & (m["variant"] == "sdpa_flash")]
    assert np.allclose(h["speedup"], 1.0)  # l4_causal's baseline is sdpa_flash
    f = m[(m["run_id"] == FLAGS) & (m["variant"] == "torch_standard")]
    assert np.allclose(f["speedup"], 1.0)  # flags' baseline is torch_standard
    assert m.loc[(m["run_id"] == FLAGS) & (m["status"] == "failed"), "speedup"].isna().all()


def test_missing_and_damaged_sources_become_warnings(tmp_path):
    bad = tmp_path / "broken"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    rs = fd.load_runs([(tmp_path / "nope", "command line"), (bad, "command line"), (tmp_path, "command line")])
    assert rs.runs.empty and rs.measurements.empty
    assert any("does not exist" in w for w in rs.warnings)
    assert any("could not be read" in w for w in rs.warnings)


def test_flagged_rows_carry_their_reasons(runs):
    bad = fd.flagged(runs.measurements[runs.measurements["run_id"] == FLAGS])
    assert sorted(bad["status"].value_counts().items()) == [("failed", 6), ("wrong", 3)]
    assert bad.loc[bad["status"] == "failed", "reason"].str.contains("RuntimeError").all()
    wrong = bad[bad["status"] == "wrong"]
    assert (wrong["variant"] == "user_nomask").all() and wrong["problem"].str.contains("causal").all()
    assert (wrong["rel_err"] > wrong["rtol"]).all()


def test_x_axis_follows_the_grid(runs):
    m = runs.measurements
    # flags: a clean S grid per mask -> lines over S; l4_causal changes B, H and S together -> per problem.
    assert fd.default_x_axis(m[m["run_id"] == FLAGS]) == "sequence length"
    assert fd.default_x_axis(m[m["run_id"] == H100_L4]) == "problem (ordered by FLOPs)"
    order = fd.problem_order(m[m["run_id"] == H100_L4])
    assert order[0].startswith("B=1 H=1 S=128") and order[-1].startswith("B=16 H=8 S=512")


def test_short_labels_drop_only_shared_words():
    short, common = fd.short_labels(["B=1 H=2 S=64 D=32 fp32", "B=1 H=2 S=64 D=32 fp32 causal", "B=1 H=2 S=128 D=32 fp32"])
    assert common == "B=1 H=2 D=32 fp32"
    assert short["B=1 H=2 S=64 D=32 fp32 causal"] == "S=64 causal"
    assert fd.short_labels(["only one"]) == ({"only one": "only one"}, "")


def test_published_figures_are_labelled_and_converted(runs):
    pub = fd.published_figures(runs, ["l4_causal"])
    assert (pub["source"] == "published (report 003, NVIDIA L4)").all()
    lat = pub[(pub["what"] == "latency") & (pub["subject"] == "PyTorch SDPA")]
    assert len(lat) == 5 and lat["problem"].notna().all()
    big = lat[lat["problem"].str.startswith("B=16 H=8 S=512")].iloc[0]
    # faprof's FLOP count (causal: exact pairs 512*513/2): 4*16*8*(512*513/2)*64 FLOP in 0.326 ms.
    assert big["tflops"] == pytest.approx(4 * 16 * 8 * (512 * 513 // 2) * 64 / 0.326e-3 / 1e12)
    assert 0 < big["pct_peak"] < 100
    thr = pub[pub["what"] == "throughput"]
    assert thr["tflops"].isna().all()  # the report's own FLOP convention is not mixed into faprof's
    assert fd.measured_label("NVIDIA H100 80GB HBM3") == "measured (faprof, NVIDIA H100 80GB HBM3)"


def test_seed_tables_from_real_runs(runs):
    m = runs.measurements
    h = m[m["run_id"] == H100_L4]
    rank = fd.ranking_table(fd.timed(h))
    assert rank["median_tflops"].is_monotonic_decreasing and set(rank["variant"]) >= {"sdpa_flash", "torch_standard"}
    mem = fd.memory_tables(h, "sdpa_flash")
    assert len(mem) == 5 and (mem["measured_reduction"] > 1).all()
    fb = fd.fwd_bwd_tables(m[m["scenario"] == "smoke"])
    assert not fb.empty and (fb["bwd_over_fwd"] > 0).all()
    assert fd.memory_tables(m[m["run_id"] == CPU_L4]).empty  # no peak memory on the CPU


# ------------------------------------------------------------------------------ significance
def test_diff_uses_faprofs_one_significance_method():
    from scipy import stats as sps

    rng = np.random.default_rng(7)
    x, y = rng.gamma(2.0, 1.0, 40), rng.gamma(2.0, 1.3, 40)
    a = pd.DataFrame([{"variant": "v", "shape_id": "s", "problem": "p", "status": "ok", "median_ms": float(np.median(x)),
                       "n": 40, "samples_ms": list(x)}])
    b = a.assign(median_ms=float(np.median(y)), samples_ms=[list(y)])
    d = fd.diff_runs(a, b).iloc[0]
    assert d["p_value"] == pytest.approx(sps.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").pvalue)


def test_diff_of_two_real_runs(runs):
    m = runs.measurements
    d = fd.diff_runs(m[m["run_id"] == H100_L4], m[m["run_id"] == CPU_L4])
    both = d[d["ratio"].notna()]
    assert set(both["variant"]) == {"cpu_ref", "torch_standard", "sdpa_math"}  # timed on both machines
    tsd = both[(both["variant"] == "torch_standard") & both["problem"].str.startswith("B=16 H=8 S=512")].iloc[0]
    assert tsd["ratio"] > 10  # the CPU is far slower, but its timings are unstable (a loaded CPU, 0.1 s budget):
    assert tsd["verdict"] == "not tested: unstable timings (B)" and not tsd["significant"]  # no verdict on them
    assert (d.loc[d["ratio"].isna(), "verdict"].str.contains("only in|not comparable|too few")).all()
    same = fd.diff_runs(m[m["run_id"] == H100_L4], m[m["run_id"] == H100_L4])
    assert (same["ratio"] == 1).all() and not same["significant"].any()


# ---------------------------------------------------------------------------- archives, CSV
def _archive(tmp_path: Path, run_id: str) -> bytes:
    return Bundle(BUNDLES / run_id).archive(tmp_path / f"{run_id}.tar.gz").read_bytes()


def test_archive_round_trip(tmp_path):
    found = fd.safe_extract(_archive(tmp_path, FLAGS), tmp_path / "out")
    assert [p.name for p in found] == [FLAGS]
    rs = fd.load_runs([(found[0], "upload")])
    assert len(rs.measurements) == 30


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"{}") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


@pytest.mark.parametrize("member", [
    _file("../evil/manifest.json"),
    _file("/tmp/evil/manifest.json"),
    _file("run/../../manifest.json"),
])
def test_archive_paths_that_leave_the_folder_are_refused(tmp_path, member):
    dest = tmp_path / "out"
    with pytest.raises(FaprofError, match="refused"):
        fd.safe_extract(_tar([member]), dest)
    assert not (tmp_path / "evil").exists() and not list(dest.rglob("*.json"))


def test_archive_links_are_refused(tmp_path):
    link = tarfile.TarInfo("run/manifest.json")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    with pytest.raises(FaprofError, match="link"):
        fd.safe_extract(_tar([(link, None)]), tmp_path / "out")
    with pytest.raises(FaprofError, match="not a bundle archive"):
        fd.safe_extract(b"plain text, not a tar", tmp_path / "out2")
    with pytest.raises(FaprofError, match="no run bundle"):
        fd.safe_extract(_tar([_file("run/notes.txt", b"hi")]), tmp_path / "out3")


def test_csv_keeps_samples_as_json(runs):
    rows = runs.measurements[runs.measurements["run_id"] == H100_L4].head(2)
    back = pd.read_csv(io.BytesIO(fd.csv_bytes(rows)))
    assert list(back.columns) == list(rows.columns)
    assert json.loads(back["samples_ms"].iloc[0]) == pytest.approx(list(rows["samples_ms"].iloc[0]))
    assert "samples_ms" not in fd.for_display(rows)


# ---------------------------------------------------------------------------- Nsight shaping
def test_timeline_from_a_recorded_nsys_capture():
    nsys = pytest.importorskip("faprof.nsight.nsys")
    data = ROOT / "tests" / "data" / "nsys"
    if not (data / "smoke.sqlite").exists():
        pytest.skip("no recorded nsys capture in tests/data/nsys")
    plan = json.loads((data / "smoke_plan.json").read_text())
    kernels = nsys.attribute_kernels(nsys.load_sqlite(data / "smoke.sqlite"), plan).assign(run_id="r")
    shape = kernels["shape_id"].iloc[0]
    tl = fd.timeline(kernels, "r", shape, iterations=2)
    assert not tl.empty and (tl["duration_us"] > 0).all()
    assert (tl.groupby("variant")["start_us"].min() == 0).all()  # each lane starts at its first kernel
    assert (tl.groupby("variant")["iteration"].nunique() <= 2).all()


def test_ncu_tables_of_a_real_run(runs):
    summary = runs.table("ncu_summary")
    summary = summary[summary["run_id"] == H100_NCU]
    occ = fd.occupancy(summary)
    assert set(occ["metric"]) == {"achieved", "theoretical"} and occ["value"].between(0, 100).all()
    assert "registers" in set(occ["limiter"])
    assert not occ["key"].str.contains(r"\(all\)").any()  # the per-pair aggregate rows are left out
    thr = fd.throughput(summary)
    assert {"SM (compute)", "memory (busiest unit)", "DRAM"} <= set(thr["metric"])
    main = fd.main_launches(summary)
    assert len(main) == summary[summary["kernel"] != "(all)"].groupby(["variant", "shape_id"]).ngroups
    stalls = runs.table("stalls")
    stalls = stalls[stalls["run_id"] == H100_NCU]
    assert fd.stall_sources(stalls)[0] == "warp_state"
    sh = fd.stall_shares(stalls)
    assert np.allclose(sh.groupby("key")["share_pct"].sum(), 100.0)  # one source, 100% per launch
    roof = runs.table("roofline")
    rl = fd.roofline(roof[roof["run_id"] == H100_NCU])  # the page shows one run at a time
    assert rl.source == "ncu" and rl.memory["DRAM"] > 1000  # GB/s of an H100
    assert any(k.startswith("tensor peak") for k in rl.compute) and any(k.startswith("fp32 peak") for k in rl.compute)
    assert (rl.points["intensity"] > 0).all() and rl.points["key"].is_unique


def test_short_kernel_names():
    assert fd.short_kernel("void at::native::(anonymous namespace)::fmha_fwd<float, 64>(Params)") == "fmha_fwd"
    assert fd.short_kernel("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_nn>(Params)").startswith("cutlass_80")
    assert fd.short_kernel("fa2_fwd_kernel") == "fa2_fwd_kernel"


# ---------------------------------------------------------------------------------- the app
@pytest.fixture
def app(monkeypatch):
    pytest.importorskip("streamlit")
    pytest.importorskip("plotly")
    from streamlit.testing.v1 import AppTest

    def make(runs_dir: Path = BUNDLES):
        monkeypatch.setenv("FAPROF_RUNS", str(runs_dir))
        at = AppTest.from_file(str(APP), default_timeout=APPTEST_TIMEOUT_S)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return make


def _open(at, page: str):
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, f"{page}: {[e.value for e in at.exception]}"
    return at


def _chart_specs(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _trace_names(at) -> set[str]:
    names = set()
    for spec in _chart_specs(at):
        for tr in spec.get("data", []):
            names.add(str(tr.get("name", "")))
            if tr.get("legendgrouptitle"):
                names.add(str(tr["legendgrouptitle"].get("text", "")))
    return names


def _axis_titles(at) -> list[str]:
    out = []
    for spec in _chart_specs(at):
        for k, v in spec.get("layout", {}).items():
            if k.startswith(("xaxis", "yaxis")) and isinstance(v, dict):
                t = v.get("title")
                out.append(t.get("text", "") if isinstance(t, dict) else str(t or ""))
    return out


def test_leaderboard_page_ranks_every_kernel_against_the_measured_ceiling(app):
    at = _open(app(), "leaderboard")
    assert at.title[0].value == "Leaderboard"
    at.selectbox(key="lb_scenario").set_value("llama3_70b_decode").run()
    assert not at.exception, [e.value for e in at.exception]
    top = at.dataframe[0].value
    assert top.iloc[0]["variant"] == "decode_splitkv" and set(top["who"]) >= {"faprof", "PyTorch"}
    assert any("No library baseline was timed here" in i.value for i in at.info)  # the committed runs predate them
    assert len(at.dataframe) == 2 and at.dataframe[1].value.shape[0] == len(top[top["shapes"] > 0])


def test_every_page_renders(app):
    at = app()
    for page in PAGES:
        _open(at, page)
        assert at.title, page


def test_overview_lists_the_runs(app, runs):
    at = _open(app(), "overview")
    assert at.metric[0].value == str(len(runs.runs))
    assert len(at.get("plotly_chart")) == 1 and at.dataframe
    assert any("wrong" in w.value and "failed" in w.value for w in at.warning)
    assert at.get("download_button")


def test_variants_page_charts_and_tables(app):
    at = _open(app(), "variants")
    assert len(at.get("plotly_chart")) >= 5  # latency, TFLOP/s, speedup, % of peak, error, roofline
    titles = " | ".join(_axis_titles(at))
    for unit in ("median latency (ms)", "TFLOP/s", "% of peak", "speedup (x)"):
        assert unit in titles
    assert "tflops" not in titles and "median_ms" not in titles  # no raw column names on axes
    assert len(at.dataframe) >= 2 and len(at.get("download_button")) == len(at.dataframe)  # ranking, all rows
    assert not at.warning  # the H100 run has no wrong or failed rows


def test_variants_page_flags_wrong_and_failed_rows(app):
    at = _open(app(), "variants")
    at.selectbox(key="variants_run").set_value(FLAGS).run()
    assert not at.exception
    assert any("3 wrong and 6 failed" in w.value for w in at.warning)
    assert "wrong result" in _trace_names(at)
    flagged = [d.value for d in at.dataframe if "reason" in d.value.columns and set(d.value["status"]) == {"failed", "wrong"}]
    assert flagged and flagged[0]["reason"].str.contains("RuntimeError").sum() == 6


def test_a_cpu_run_is_not_counted_as_a_gpu(app, runs):
    """l4_causal ran on GPUs (the H100, the H200) and on the CPU: the CPU is never counted as a GPU."""
    assert fd.machine_count(["NVIDIA H100 80GB HBM3", fd.CPU_LABEL]) == (1, True)
    assert fd.machines_phrase(["NVIDIA H100 80GB HBM3", fd.CPU_LABEL]) == "1 GPU and the CPU"
    assert fd.machines_phrase([fd.CPU_LABEL]) == "the CPU only"
    at = _open(app(), "gpus")
    box = at.selectbox(key="gpus_scenario")
    assert box.value == "l4_causal"
    label = next(o for o in box.options if o.startswith("l4_causal"))
    l4 = runs.runs[runs.runs["scenario"] == "l4_causal"]
    gpus = sorted(set(l4["gpu"]) - {fd.CPU_LABEL})
    assert fd.CPU_LABEL in set(l4["gpu"]) and gpus, "the fixture needs l4_causal runs on the CPU and on a GPU"
    phrase = fd.machines_phrase([*gpus, fd.CPU_LABEL])
    assert phrase == f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''} and the CPU"
    assert label.startswith(f"l4_causal ({phrase}")
    assert f"{len(gpus) + 1} GPUs" not in " ".join(box.options)
    if len(gpus) == 1:  # the page asks for a second GPU only while there is one
        assert any(phrase in i.value for i in at.info)
    else:
        assert not any("on another GPU" in i.value for i in at.info)
    overview = _open(app(), "overview")
    gpus_metric = next(m for m in overview.metric if m.label == "GPUs")
    assert gpus_metric.value == str(runs.runs["gpu"].nunique() - 1)  # the CPU-only runs are not a GPU


def test_one_gpu_shows_its_newest_run_so_lines_do_not_zigzag(runs):
    m = runs.measurements
    rows = fd.gpu_comparison(m, "l4_causal")
    h100 = rows[rows["gpu"] == "NVIDIA H100 80GB HBM3"]
    assert m[(m["scenario"] == "l4_causal") & (m["gpu"] == "NVIDIA H100 80GB HBM3")]["run_id"].nunique() > 1
    assert not h100.duplicated(["variant", "shape_id"]).any()
    newest = h100.groupby(["variant", "shape_id"])["run_id"].first()
    every = m[(m["scenario"] == "l4_causal") & (m["gpu"] == "NVIDIA H100 80GB HBM3") & m["status"].isin(["ok", "wrong"])]
    assert (newest == every.groupby(["variant", "shape_id"])["run_id"].max().loc[newest.index]).all()


def test_ranking_never_mixes_dtypes(runs):
    m = runs.measurements
    rank = fd.ranking_table(fd.timed(m[m["run_id"] == "20261121T200256Z_nvidia-h100-80gb-hbm3_l4-causal"]))
    assert set(rank["dtype"]) == {"fp16", "fp32"}
    assert list(rank.columns[:4]) == ["dtype", "direction", "variant", "problems"]
    for _, g in rank.groupby("dtype"):
        assert g["median_tflops"].is_monotonic_decreasing
    # an fp32-only kernel is ranked among fp32 rows only
    assert set(rank.loc[rank["variant"].isin(["fa1", "fa2", "naive"]), "dtype"]) <= {"fp32"}


L20 = "20261123T110445Z_nvidia-h100-80gb-hbm3_l20-fwd-bwd"


def test_rankings_are_over_the_problems_every_ranked_variant_ran(runs):
    """l20_fwd_bwd: fa2_mma's backward runs 2 of the 5 backward problems (D=64 only); ranking it by its median
    TFLOP/s over those against sdpa_flash's over all 5 compared different problems."""
    m = runs.measurements
    rank = fd.ranking_table(m[m["run_id"] == L20])
    bwd = rank[(rank["dtype"] == "fp16") & (rank["direction"] == "bwd")]
    left = bwd[~bwd["ranked"].astype(bool)]
    assert set(left["variant"]) == {"fa2_mma", "fa2_mma_det"} and set(left["problems"]) == {2}
    assert left["median_tflops"].isna().all()  # not ranked, only counted
    ranked = bwd[bwd["ranked"].astype(bool)]
    assert (ranked["problems"] == 5).all() and (ranked["rows"] == 5).all()  # every ranked variant over the same 5
    t = fd.timed(m[m["run_id"] == L20])
    for (dt, dr), g in rank[rank["ranked"].astype(bool)].groupby(["dtype", "direction"]):
        sets = [set(t[(t["variant"] == v) & (t["dtype"] == dt) & (t["direction"] == dr)]["shape_id"]) for v in g["variant"]]
        assert len(set.intersection(*sets)) == g["problems"].iloc[0], (dt, dr)


def test_directions_never_share_a_line(runs):
    m = runs.measurements
    rows = fd.timed(m[m["run_id"] == L20])
    series = fd.line_series(rows, "problem")
    assert set(series) == {"fwd", "bwd", "fwd_bwd"}
    per_line = rows.assign(_s=series).groupby(["variant", "_s"])["direction"].nunique()
    assert (per_line == 1).all()
    one = rows[rows["direction"] == "fwd"]
    assert set(fd.line_series(one, "problem")) == {""}  # one direction, one dtype: one line per variant


def test_pages_offer_the_users_own_newest_run_first(runs):
    order = fd.run_order(runs.runs)
    origin = runs.runs.set_index("run_id")["origin"]
    kinds = [origin[r] for r in order]
    assert kinds == sorted(kinds, key=lambda o: fd.ORIGINS.index(o))  # command line, then the examples
    own = [r for r in order if origin[r] == "command line"]
    assert own == sorted(own, reverse=True)  # run ids start with their UTC time: newest first
    assert fd.run_order(runs.runs, among=[L20, H100_L4]) == [H100_L4, L20]  # the user's (older) run before the example


def test_the_pages_open_on_the_users_newest_run(app, runs):
    at = _open(app(), "variants")
    own = runs.runs[runs.runs["origin"] == "command line"].sort_values("run_id")
    assert at.selectbox(key="variants_run").value == own["run_id"].iloc[-1]
    at = _open(at, "ncu")
    with_ncu = [r for r in own["run_id"] if r in set(runs.table("ncu_summary")["run_id"])]
    assert at.selectbox(key="ncu_run").value == with_ncu[-1]


def test_one_colour_per_variant_in_every_chart_of_a_session(app):
    at = _open(app(), "variants")
    at.selectbox(key="variants_run").set_value(L20).run()
    seen: dict[str, set[str]] = {}
    charts = {"variants": _chart_specs(at)}
    charts["gpus"] = _chart_specs(_open(at, "gpus"))
    drawn = {page: 0 for page in charts}
    for page, specs in charts.items():
        for spec in specs:
            for tr in spec.get("data", []):
                variant = str(tr.get("name", "")).split(",")[0].split(" (")[0]  # 'fa2_mma, bwd' / 'fa2_mma (bwd)'
                colour = (tr.get("line") or {}).get("color") or (tr.get("marker") or {}).get("color")
                if variant in fd.KNOWN_ORDER and isinstance(colour, str):
                    seen.setdefault(variant, set()).add(colour)
                    drawn[page] += 1
    assert drawn["variants"] > 20 and drawn["gpus"] > 5  # both pages' charts were read
    # sdpa_auto ran cuDNN's kernel on this run's shapes (nsys/ncu records), folded into one line where the two
    # medians agree; at B=64 H=64 they are 5.4% apart (3.62 vs 3.81 ms), so sdpa_cudnn has a point of its own
    assert {"fa2_mma", "sdpa_flash", "sdpa_auto", "sdpa_cudnn"} <= set(seen)
    assert all(len(c) == 1 for c in seen.values()), {v: c for v, c in seen.items() if len(c) > 1}


def test_variants_page_shows_one_dtype_at_a_time(app):
    at = _open(app(), "variants")
    at.selectbox(key="variants_run").set_value("20261121T200256Z_nvidia-h100-80gb-hbm3_l4-causal").run()  # example run
    dt = at.selectbox(key="variants_dtype")
    assert set(dt.options) == {"fp16", "fp32"}
    for d in ("fp16", "fp32"):
        dt.set_value(d).run()
        assert not at.exception
        ranking = next(x.value for x in at.dataframe if "median_tflops" in x.value.columns)
        assert set(ranking["dtype"]) == {d}


def test_log_axis_ticks_are_never_a_single_one():
    ui = _faprof_ui()
    for lo, hi in ((0.964, 1.018), (0.98, 1.01), (0.5, 1.0), (0.75, 1.2), (0.0012, 0.0021), (0.01, 100.0)):
        ticks = ui.log_ticks(lo, hi)
        inside = [t for t in ticks if lo / 1.06 <= t <= hi * 1.06]
        assert 3 <= len(inside) <= 9, (lo, hi, ticks)


def test_ncu_labels_leave_the_chart_its_width(runs):
    s = runs.table("ncu_summary")
    keys = fd.ncu_key(s)
    lines = [line for k in keys for line in k.split("<br>")]
    assert max(len(line) for line in lines) <= 60
    # 'variant · kernel' over the problem; a problem id longer than a line (varlen, windows, paged) takes two
    from faprof.analysis.ncu_views import LABEL_LINE_CHARS

    for k in keys:
        shape_id = "".join(k.split("<br>")[1:]).split(" #")[0]
        assert k.count("<br>") == (2 if len(shape_id) > LABEL_LINE_CHARS else 1), k
    assert any("varlen" in k for k in keys)  # the committed bundles include a packed batch


def _faprof_ui():
    pytest.importorskip("streamlit")
    import sys

    sys.path.insert(0, str(ROOT / "app"))
    try:
        import faprof_ui
    finally:
        sys.path.remove(str(ROOT / "app"))
    return faprof_ui


def test_gpus_page_labels_published_and_measured(app):
    at = _open(app(), "gpus")
    assert at.selectbox(key="gpus_scenario").value == "l4_causal"
    names = _trace_names(at)
    assert "published (report 003, NVIDIA L4)" in names
    assert "measured (faprof, NVIDIA H100 80GB HBM3)" in names and "measured (faprof, CPU (no GPU))" in names
    assert len(at.get("plotly_chart")) == 3
    assert any("% of peak" in t for t in _axis_titles(at))


@pytest.mark.parametrize("page,tables,flag", [
    ("ncu", ("ncu_summary", "stalls", "roofline"), "--ncu full"),
    ("timeline", ("nsys_kernels", "nsys_summary"), "--nsys"),
])
def test_nsight_pages_chart_or_point_to_the_flag(app, runs, page, tables, flag):
    at = _open(app(), page)
    if any(not runs.table(t).empty for t in tables):
        assert at.get("plotly_chart") and at.dataframe
        assert not any("faprof profile" in i.value for i in at.info)
    else:
        assert any(flag in i.value and "faprof profile --scenario" in i.value for i in at.info)
        assert not at.get("plotly_chart")


def test_ncu_page_shows_occupancy_stalls_and_roofline(app):
    at = _open(app(), "ncu")
    specs = json.dumps(_chart_specs(at))
    assert len(at.get("plotly_chart")) == 4  # occupancy, throughput, stalls, roofline
    assert "limited by registers" in specs and "long_scoreboard" in specs
    assert any(n.startswith("tensor peak") for n in _trace_names(at))
    at.radio(key="ncu_kernels").set_value("every kernel launch").run()
    assert not at.exception and len(at.get("plotly_chart")) == 4


def test_timeline_page_draws_kernels(app):
    at = _open(app(), "timeline")
    assert at.selectbox(key="tl_run").value == H100_NSYS
    names = _trace_names(at)
    assert any("gemm" in n or "kernel" in n for n in names)
    assert any("µs" in t for t in _axis_titles(at))


def test_diff_page_tests_significance(app):
    at = _open(app(), "diff")
    assert at.selectbox(key="diff_a").value != at.selectbox(key="diff_b").value
    assert len(at.get("plotly_chart")) == 1
    table = at.dataframe[0].value
    assert {"ratio", "p_value", "significant", "verdict"} <= set(table.columns)
    assert table["p_value"].dropna().between(0, 1).all()


def test_sidebar_filter_narrows_every_page(app):
    at = app()
    at.multiselect(key="filter_scenario").set_value(["flags"]).run()
    _open(at, "overview")
    assert at.metric[0].value == "1"
    _open(at, "variants")
    assert at.selectbox(key="variants_run").value == FLAGS
    _open(at, "diff")
    assert any("fewer than two" in i.value for i in at.info)


def test_upload_adds_a_bundle_and_refuses_a_bad_archive(app, tmp_path):
    empty = tmp_path / "no_runs"
    empty.mkdir()
    at = app(empty)
    before = int(at.metric[0].value)  # the shipped examples only
    at.file_uploader(key="uploads").set_value((f"{FLAGS}.tar.gz", _archive(tmp_path, FLAGS), "application/gzip")).run()
    assert not at.exception
    assert int(at.metric[0].value) == before + 1
    at.file_uploader(key="uploads").set_value(("evil.tar.gz", _tar([_file("../evil/manifest.json")]), "application/gzip")).run()
    assert not at.exception
    assert any("refused" in e.value for e in at.error)


# ------------------------------------------------------------------------- faprof dashboard
def test_dashboard_command_runs_streamlit_on_the_app(tmp_path):
    from click.testing import CliRunner

    from faprof.cli import main

    pytest.importorskip("streamlit")
    res = CliRunner().invoke(main, ["dashboard", "--print-command", "--port", "8765", str(BUNDLES)])
    assert res.exit_code == 0, res.output
    argv = shlex.split(res.output)  # as a shell reads the printed line: a path with spaces stays one word
    assert argv[argv.index("-m"):argv.index("-m") + 4] == ["-m", "streamlit", "run", str(APP)]
    assert argv[argv.index("--server.port") + 1] == "8765"
    assert argv[-2:] == ["--", str(BUNDLES.resolve())]  # run folders go to the app after `--`
    res = CliRunner().invoke(main, ["dashboard", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_dashboard_command_quotes_a_path_with_spaces(tmp_path):
    from click.testing import CliRunner

    from faprof.cli import main

    pytest.importorskip("streamlit")
    runs = tmp_path / "my runs" / "a run"
    shutil.copytree(BUNDLES, runs)
    res = CliRunner().invoke(main, ["dashboard", "--print-command", str(runs)])
    assert res.exit_code == 0, res.output
    assert shlex.split(res.output)[-1] == str(runs.resolve())


def test_dashboard_command_says_how_to_install_streamlit(monkeypatch):
    import importlib.util

    from click.testing import CliRunner

    from faprof.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a))
    res = CliRunner().invoke(main, ["dashboard"])
    assert res.exit_code == 2 and "pip install 'faprof[app]'" in res.output


def test_run_folders_come_from_the_environment_and_after_the_double_dash():
    pytest.importorskip("streamlit")
    import sys

    sys.path.insert(0, str(ROOT / "app"))
    try:
        import faprof_ui
    finally:
        sys.path.remove(str(ROOT / "app"))
    entry = str(APP)
    assert faprof_ui.command_line_paths([entry, "a", "b"], {}) == ["a", "b"]
    assert faprof_ui.command_line_paths([entry, "b"], {"FAPROF_RUNS": f"a{__import__('os').pathsep}b"}) == ["a", "b"]
    # Under pytest (AppTest) sys.argv is pytest's: never taken for run folders.
    assert "tests/test_app.py" not in faprof_ui.command_line_paths(["pytest", "tests/test_app.py"], {})


def test_nsight_page_diagnosis_is_the_advisors(runs):
    from faprof import advisor
    from faprof.store import Bundle

    summ, diag = advisor_views.diagnosis(runs, H100_NCU)
    assert not summ.empty and (diag["rank"] >= 1).all()
    path = runs.runs.set_index("run_id").loc[H100_NCU, "path"]
    assert diag.equals(advisor.diagnose(Bundle.open(path)))  # one ranking everywhere
    assert (summ["primary_on"] <= summ["n_shapes"]).all()
    assert advisor_views.diagnosis(runs, "no-such-run")[0].empty


def test_error_ratio_is_the_checked_bound(runs):
    m = runs.measurements
    new = m[m["run_id"] == "20261123T053932Z_nvidia-h100-80gb-hbm3_l4-causal"]
    r = fd.error_ratio(new[new["status"] == "ok"])
    has_fa = new["baseline_max_err"].notna() & (new["status"] == "ok")
    assert has_fa.sum() > 20 and (r[has_fa] <= 1.0).all()  # an ok row is within its own bound
    old = m[m["run_id"] == H100_L4]
    assert np.allclose(fd.error_ratio(old), old["rel_err"] / old["rtol"], equal_nan=True)  # older rows: rel / rtol


def test_sanitize_runs_are_listed_per_tool(runs):
    san = fd.sanitizer_table(runs)
    assert {"memcheck", "racecheck", "initcheck", "synccheck"} <= set(san["tool"])
    assert (san["status"] == "clean").all() and (san["hazards"] == 0).all()  # as recorded on the H100
    assert any("fa2_mma" in v for v in san["variants"])


# ------------------------------------------------------------------------------ wrong results
WRONG_BUNDLES = ROOT / "tests" / "data" / "wrong_bundle"
WRONG_RUN = "20261125T044351Z_nvidia-h100-80gb-hbm3_wrong-gpu"


def test_error_map_grid_of_a_real_wrong_kernel():
    """The H100 batch-offset kernel (every batch reads batch 0): batch 0 right, every other batch wrong."""
    runs = fd.load_runs([(WRONG_BUNDLES, "command line")])
    maps = runs.table("error_maps")
    idx = fd.maps_index(maps)
    assert {"wrong_batch_offset", "wrong_causal_shift"} <= set(idx["variant"])
    assert set(idx[idx["variant"] == "wrong_batch_offset"]["check_input"]) >= {"randn", "large_scores", "tile_plus"}
    grid = fd.map_grid(maps, variant="wrong_batch_offset", shape_id="b3_h2_sq200_sk200_d64_fp16_full_fwd",
                       check_input="randn", output="out")
    batch = grid["z"][grid["axes"].index(fd.AXIS_LABELS["batch"])]
    assert batch[0] == 0 and all(s > 0.3 for s in batch[1:3])  # 2 heads x 200 rows x 64 columns a batch
    assert len(grid["z"]) == len(grid["axes"]) == len(grid["hover"]) and all(len(r) == grid["columns"] for r in grid["z"])
    assert "of 25600 wrong" in grid["hover"][grid["axes"].index(fd.AXIS_LABELS["batch"])][1]
    shift = fd.map_grid(maps, variant="wrong_causal_shift", shape_id="b2_h2_sq128_sk128_d64_fp16_causal_fwd",
                        check_input="randn", output="out")
    assert fd.AXIS_LABELS["mask"] in shift["axes"]  # a causal row is also mapped against its mask


def test_wrong_results_page_draws_the_map_and_names_the_bug(app):
    at = _open(app(WRONG_BUNDLES), "wrong")
    at.selectbox(key="wrong_row").set_value(("wrong_batch_offset", "b3_h2_sq200_sk200_d64_fp16_full_fwd")).run()
    assert not at.exception
    assert any("stride" in m.value or "offset" in m.value for m in at.markdown), [m.value for m in at.markdown]
    specs = _chart_specs(at)
    assert specs and specs[0]["data"][0]["type"] == "heatmap"
    assert fd.AXIS_LABELS["batch"] in specs[0]["data"][0]["y"]
    assert at.dataframe


def test_wrong_results_page_says_when_there_is_nothing_wrong(app):
    at = _open(app(BUNDLES), "wrong")
    assert any("error map" in i.value for i in at.info)  # the flags run's wrong rows predate error maps
