"""Nsight Compute end to end on a GPU: `faprof profile --scenario smoke --ncu` (the faprof set) through the runner.

Method: run the smoke scenario with faprof's CUDA-core kernels (naive: 3 kernels per call, fa1, fa2:
one each) under `runner.profile(..., ProfileOptions(ncu="faprof"))`, then check the bundle as the
report and the app read it: the manifest records the ncu settings (cache all, clocks untouched) and
status ok; every (variant, shape) the target ran has its kernels in ncu_summary, attributed through
their NVTX ranges (naive's three launches in order, plus the "(all)" row), with sane values
(durations > 0, occupancy in (0, 100], a limiter from the allowed set, hardware FLOPs within a few x of
the analytic count); ncu_metrics holds the catalogue's metrics, the roofline has both ceilings, the
faprof set's sections gave the stall table (WarpStateStats), ncu's rule results and the advisor's
counters, in fewer replay passes than `full` takes (38 on the H100).
Torch's own kernels are left out: their reports are tens of MB (see faprof.nsight.ncu).
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from faprof import run as runner  # noqa: E402
from faprof.nsight import ncu  # noqa: E402
from faprof.nsight.ncu.catalogue_core import ALL_KERNELS, OCCUPANCY_LIMITERS  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
    pytest.mark.skipif(ncu.find_ncu() is None, reason="needs Nsight Compute (ncu)"),
]

VARIANTS = ["naive", "fa1", "fa2"]

#: Kernels per forward call of each variant (naive: scores, softmax, P.V).
KERNELS_PER_CALL = {"naive": 3, "fa1": 1, "fa2": 1}

#: Kernels per backward call (smoke has one bwd problem): fa2's preprocess (delta) and dK/dV/dQ
#: kernel (dQ by fp32 atomics into a cudaMemsetAsync-cleared buffer: no kernel for that).
BWD_KERNELS_PER_CALL = {"fa2": 2}

#: Hardware FP32 FLOPs over the analytic 4.B.H.Sq.Sk.D (halved when causal). No kernel can do
#: less math than that (0.99: the analytic count is exact), and the softmax plus tiles computed then
#: masked on ragged shapes put it above: 1.12 to 2.37 on the H100 (tests/data/ncu/fa_basic). Past
#: 20x the counting is broken, not the kernel.
HW_OVER_ANALYTIC_RANGE = (0.99, 20.0)

#: Replay passes of `--set full` (with faprof's metrics) per kernel on the H100 (tests/data/ncu/fa_full).
FULL_SET_PASSES = 38


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    messages: list[tuple[str, str]] = []

    def progress(event, info):
        if event in ("warning", "nsight"):
            messages.append((event, info.get("message", "")))

    opts = runner.ProfileOptions(variants=VARIANTS, out_dir=out, ncu="faprof", ceilings=False)
    b = runner.profile("smoke", opts, progress=progress)
    b.messages = messages  # type: ignore[attr-defined]
    return b


def test_manifest_records_ncu_settings(bundle):
    m = bundle.manifest()["ncu"]
    assert m["status"] == "ok", (m.get("reason"), bundle.manifest().get("log"))
    assert m["set"] == "faprof" and m["cache_control"] == "all" and m["clock_control"] == "none"
    assert m["command"][m["command"].index("--clock-control") + 1] == "none"
    # the plan's kernel count is an estimate (kernels per call are learned from earlier sessions)
    assert m["kernels"] > 0 and m["plan"]["kernels"] > 0 and m["wall_s"] > 0
    assert 0 < m["passes"] < FULL_SET_PASSES, m["passes"]
    assert (bundle.path / m["report"]).is_file()
    assert any(e == "nsight" and "profiled kernel" in msg for e, msg in bundle.messages)


def test_every_ran_pair_is_in_the_summary(bundle):
    plan = json.loads((bundle.path / "raw" / ncu.PLAN_FILE).read_text())
    ran = [(p["variant"], p["shape_id"]) for p in plan["pairs"] if p["ran"]]
    assert ran, plan
    s = bundle.read("ncu_summary")
    for variant, shape_id in ran:
        rows = s[(s["variant"] == variant) & (s["shape_id"] == shape_id)]
        launches = rows[rows["kernel"] != ALL_KERNELS]
        n = BWD_KERNELS_PER_CALL[variant] if shape_id.endswith("_bwd") else KERNELS_PER_CALL[variant]
        assert list(launches["launch"]) == list(range(n)), (variant, shape_id, list(launches["kernel"]))
        agg = rows[rows["kernel"] == ALL_KERNELS]
        assert len(agg) == 1 and agg["kernels"].iloc[0] == n
        assert agg["duration_ms"].iloc[0] == pytest.approx(launches["duration_ms"].sum())


def test_summary_values_are_sane(bundle):
    s = bundle.read("ncu_summary")
    k = s[s["kernel"] != ALL_KERNELS]
    assert (k["duration_ms"] > 0).all()
    assert k["achieved_occupancy_pct"].between(0, 100, inclusive="right").all()
    assert k["theoretical_occupancy_pct"].between(0, 100, inclusive="right").all()
    assert k["occupancy_limiter"].isin(OCCUPANCY_LIMITERS).all()
    assert (k["registers_per_thread"] > 0).all() and (k["grid_size"] >= 1).all()
    assert (k["cc"] == "{}.{}".format(*torch.cuda.get_device_capability())).all()
    agg = s[s["kernel"] == ALL_KERNELS]
    assert (agg["fp32_flops"] > 0).all()
    lo, hi = HW_OVER_ANALYTIC_RANGE
    assert agg["hw_over_analytic"].between(lo, hi).all(), agg[["variant", "shape_id", "hw_over_analytic"]]


def test_metrics_table_is_long_and_complete(bundle):
    m = bundle.read("ncu_metrics")
    assert list(m.columns) == list(ncu.METRICS_COLUMNS)
    per_launch = m.groupby("kernel_id")["metric"].nunique()
    assert (per_launch > 60).all()  # the catalogue's metrics, the stall reasons, the device attributes
    assert m["variant"].notna().all()  # the NVTX include profiled nothing outside faprof's ranges
    assert {"gpu__time_duration.sum", "launch__grid_size", "dram__bytes_read.sum"} <= set(m["metric"])


def test_roofline_has_both_ceilings(bundle):
    r = bundle.read("roofline")
    assert set(r["ceiling_source"]) == {"ncu", "gpu_db"}
    ncu_rows = r[r["ceiling_source"] == "ncu"]
    assert (ncu_rows["peak_flops_per_s"] > 0).all() and (ncu_rows["peak_dram_bytes_per_s"] > 0).all()
    assert (r["achieved_flops_per_s"] > 0).all()
    assert not math.isnan(r["arithmetic_intensity"].max())


def test_faprof_set_feeds_stalls_rules_and_advisor_counters(bundle):
    st = bundle.read("stalls")
    assert not st.empty and set(st["source"]) == {"warp_state"}
    rules = bundle.read("ncu_rules")
    assert not rules.empty and set(rules["section"]) <= set(ncu.FAPROF_SECTIONS)
    s = bundle.read("ncu_summary")
    k = s[s["kernel"] != ALL_KERNELS]
    for col in (
        "local_ld_sectors",
        "global_ld_sectors_per_request",
        "fma_pipe_util_pct",
        "l2_throughput_pct",
    ):
        assert k[col].notna().all(), col
    fa2 = k[k["variant"] == "fa2"]
    assert (
        not fa2.empty and (fa2["local_ld_sectors"] == 0).all()
    )  # fa2 does not spill (tests/data/ncu/fa_full)


def test_backward_kernels_launched_by_autograd_are_profiled(tmp_path):
    """A backward's kernels come from autograd's own thread, outside the caller's push/pop NVTX
    ranges; the target's start/end ranges still put them in ncu_summary under their (variant,
    shape): fa2's bwd call is its preprocess, dK/dV (atomic dQ) and dQ convert kernels, its fwd_bwd
    call the forward kernel first, then those three."""
    from faprof.model.scenarios import parse_scenario

    scen = parse_scenario({
        "name": "bwd_ncu", "baseline": "fa2", "variants": ["fa2"],
        "groups": [{"name": "b", "defaults": {"B": 1, "H": 2, "S": 96, "D": 64, "dtype": "fp32"},
                    "grid": {"direction": ["bwd", "fwd_bwd"]}}],
        "timing": {"budget_s": 0.05},
    }, "test")
    b = runner.profile(scen, runner.ProfileOptions(out_dir=tmp_path, ncu="basic", ceilings=False))
    assert b.manifest()["ncu"]["status"] == "ok", b.manifest()["ncu"].get("reason")
    s = b.read("ncu_summary")
    s = s[s["kernel"] != ALL_KERNELS]
    # faprof's own kernels, in launch order (torch may add a fill or copy kernel of its own)
    per = {sid: [k for k in g.sort_values("launch")["kernel"] if k.startswith("fa2_")]
           for sid, g in s[s["variant"] == "fa2"].groupby("shape_id")}
    bwd = next(k for sid, k in per.items() if sid.endswith("_bwd") and not sid.endswith("_fwd_bwd"))
    both = next(k for sid, k in per.items() if sid.endswith("_fwd_bwd"))
    assert len(bwd) >= 2 and all("bwd" in k for k in bwd) and "fa2_bwd_preprocess_kernel" in bwd, per
    assert "fwd" in both[0] and both[1:] == bwd, per
