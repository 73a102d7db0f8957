"""The ncu plan without a GPU: default targets, selectors, the estimate and the faprof section set.

Method: l4_causal's variants (every registered one) go through `default_targets`; the kernels per
call used as expectations are those the nsys capture of l4_causal on the H100 recorded
(examples/runs/*_l4-causal with nsys_kernels.parquet): one per forward call for each SDPA backend
and faprof's kernels, three for naive. Shape selectors are checked on the scenario's groups; the
estimate's arithmetic and labels on an empty and a filled cost cache; the command line of the
faprof set exactly.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pandas as pd
import pytest

from faprof.errors import FaprofError
from faprof.model import plan as run_plan
from faprof.model.scenarios import load_scenario
from faprof.nsight import ncu
from faprof.nsight.ncu import session_plan as ncu_plan

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def l4():
    s = load_scenario("l4_causal")
    return s, run_plan.plan(s, None)


def test_default_targets_are_kernels_and_fused_sdpa(l4):
    _, pairs = l4
    vs = list({v.name: v for _, v in pairs}.values())
    chosen, left = ncu_plan.default_targets(vs)
    kinds = {v.name: v.kind for v in vs}
    # every fused baseline the scenario runs (flex is not in 'all': the modern scenarios name it)
    assert {n for n in chosen if kinds[n] == "torch"} == set(ncu_plan.FUSED_SDPA) & set(kinds)
    assert all(kinds[n] in ("cuda", "user") for n in chosen if n not in ncu_plan.FUSED_SDPA)
    assert {"naive", "fa1", "fa2", "fa2_wmma", "fa2_mma"} <= set(chosen)
    assert set(left) == {"cpu_ref", "torch_standard", "sdpa_math", "sdpa_auto"} | {
        n for n, k in kinds.items() if k == "cuda" and n not in chosen
    }
    note = ncu_plan.left_out_note(left)
    assert "torch_standard" in note and "--ncu-variants" in note and "cpu_ref" not in note


def test_default_targets_match_the_kernels_nsys_saw_per_call(l4):
    """The issue's count: ~55 kernels a user came to study in one pass of l4_causal."""
    found = glob.glob(str(ROOT / "examples/runs/*l4-causal/nsys_kernels.parquet"))
    if not found:
        pytest.skip("no l4_causal nsys bundle in examples/")
    k = pd.read_parquet(found[0])
    k = k[k["iteration"] == k["iteration"].min()]
    per_pair = k.groupby(["variant", "shape_id"]).size()
    s, pairs = l4
    p = ncu_plan.make_plan(pairs, s, "faprof", costs={})
    covered = per_pair[[(v, sh) in set(p.pairs) for v, sh in per_pair.index]]
    assert set(covered.index) == set(p.pairs) & set(per_pair.index)
    assert (covered[[v in ncu_plan.FUSED_SDPA for v, _ in covered.index]] == 1).all()
    assert covered.sum() == 55
    assert (
        per_pair.sum() - covered.sum() > 250
    )  # the baselines left out: sdpa_math, torch_standard, sdpa_auto


def test_shape_words_pick_per_group(l4):
    s, _ = l4
    small = run_plan.select_shapes(s, ["smallest"])
    large = run_plan.select_shapes(s, ["largest"])
    assert small == ["b1_h1_sq128_sk128_d64_fp16_causal_fwd", "b1_h1_sq128_sk128_d64_fp32_causal_fwd"]
    assert large == ["b16_h8_sq512_sk512_d64_fp16_causal_fwd", "b16_h8_sq512_sk512_d64_fp32_causal_fwd"]
    both = run_plan.select_shapes(s, ["smallest,largest", "b4_h8_sq128_sk128_d64_fp16_causal_fwd"])
    assert len(both) == 5 and both == [p.shape_id for p in s.problems if p.shape_id in both]
    assert run_plan.select_shapes(s, []) == [p.shape_id for p in s.problems]
    with pytest.raises(FaprofError, match="unknown shape 'tiny'.*smallest or largest"):
        run_plan.select_shapes(s, ["tiny"])


def test_variant_selection_is_checked(l4):
    s, pairs = l4
    with pytest.raises(FaprofError, match="unknown variant 'fa7'"):
        ncu_plan.make_plan(pairs, s, "faprof", variants=["fa7"], costs={})
    smoke = load_scenario("smoke")
    with pytest.raises(FaprofError, match="not part of this run"):
        ncu_plan.make_plan(run_plan.plan(smoke, ["fa2"]), smoke, "faprof", variants=["naive"], costs={})
    with pytest.raises(FaprofError, match="nothing for ncu to profile"):
        ncu_plan.make_plan(
            pairs,
            s,
            "faprof",
            variants=["fa2_mma"],
            shapes=["b1_h1_sq128_sk128_d64_fp32_causal_fwd"],
            costs={},
        )


def test_plan_counts_and_labels_its_guesses(l4):
    s, pairs = l4
    p = ncu_plan.make_plan(
        pairs, s, "faprof", variants=["fa2", "sdpa_flash"], shapes=["smallest"], calls=2, costs={}
    )
    assert p.pairs == [
        ("sdpa_flash", "b1_h1_sq128_sk128_d64_fp16_causal_fwd"),
        ("fa2", "b1_h1_sq128_sk128_d64_fp32_causal_fwd"),
    ]
    assert p.kernels == 4 and p.kernels_known == 0
    assert p.passes == ncu_plan.DEFAULT_PASSES["faprof"] and "default guess" in p.passes_source
    assert p.eta_s == pytest.approx(p.overhead_s + 4 * p.passes * ncu_plan.DEFAULT_SECONDS_PER_PASS)
    text = "\n".join(p.lines())
    assert "2 variant(s) x 2 shape(s) = 2 pair(s), 2 call(s) each: 4 kernel(s)" in text
    assert "1 assumed for the others" in text and "default guess" in text
    full = ncu_plan.make_plan(pairs, s, "full", costs={})
    assert full.passes == 38 and "H100 fixture reports" in full.passes_source


def test_plan_uses_the_cache_of_this_gpu_only(l4, tmp_path):
    s, pairs = l4
    path = tmp_path / "costs.json"
    ncu_plan.record_costs(
        "GPU A",
        "faprof",
        kernels=10,
        passes=21.0,
        seconds_per_kernel=0.5,
        overhead_s=12.0,
        kernels_per_pair={("naive", "b1_h1_sq128_sk128_d64_fp32_causal_fwd"): 3},
        kernel_names={
            ("naive", "b1_h1_sq128_sk128_d64_fp32_causal_fwd"): ["naive_pv_kernel", "naive_scores_kernel"]
        },
        when="20261124T000000Z",
        path=path,
    )
    costs = ncu_plan.load_costs(path)
    a = ncu_plan.make_plan(
        pairs, s, "faprof", variants=["naive"], shapes=["smallest"], gpu="GPU A", costs=costs
    )
    assert (a.kernels, a.kernels_known, a.passes, a.seconds_per_kernel) == (3, 1, 21.0, 0.5)
    assert a.eta_s == pytest.approx(12.0 + 3 * 0.5) and "measured on this GPU" in a.eta_source
    b = ncu_plan.make_plan(
        pairs, s, "faprof", variants=["naive"], shapes=["smallest"], gpu="GPU B", costs=costs
    )
    assert b.kernels == 1 and "default guess" in b.eta_source
    with pytest.raises(FaprofError, match="matches none of the 2 kernel"):
        ncu_plan.make_plan(
            pairs,
            s,
            "faprof",
            variants=["naive"],
            shapes=["smallest"],
            kernel_regex="softmax",
            gpu="GPU A",
            costs=costs,
        )
    ok = ncu_plan.make_plan(
        pairs,
        s,
        "faprof",
        variants=["naive"],
        shapes=["smallest"],
        kernel_regex="scores",
        gpu="GPU A",
        costs=costs,
    )
    assert ok.regex_matches == ["naive_scores_kernel"]


def test_measured_costs_from_progress_times():
    spk, overhead = ncu_plan.measured_costs([10.0, 11.0, 12.0, 13.0], 15.0)
    assert spk == pytest.approx(1.0) and overhead == pytest.approx(11.0)
    assert ncu_plan.measured_costs([5.0], 6.0) == (None, None)


def test_damaged_cache_is_an_empty_one(tmp_path):
    p = tmp_path / "costs.json"
    p.write_text("{not json")
    assert ncu_plan.load_costs(p) == {"gpus": {}}


def test_faprof_set_command_line():
    argv = ncu.ncu_command(
        "r",
        ncu="ncu",
        scenario="s.toml",
        variants=["fa2"],
        plan_out="p.json",
        ncu_set="faprof",
        metrics=["dram__bytes_read.sum"],
        kernel_regex="fa2_",
        shapes=["a"],
        iters=3,
        python="py",
    )
    assert argv == [
        "ncu",
        "--nvtx",
        "--nvtx-include",
        "fa2/",
        "--nvtx-include",
        "fa2",
        "--section",
        "SpeedOfLight",
        "--section",
        "LaunchStats",
        "--section",
        "Occupancy",
        "--section",
        "WarpStateStats",
        "--metrics",
        "dram__bytes_read.sum",
        "--kernel-name-base",
        "function",
        "--kernel-name",
        "regex:fa2_",
        "--cache-control",
        "all",
        "--clock-control",
        "none",
        "-f",
        "-o",
        "r",
        "py",
        "-m",
        "faprof.nsight.target",
        "--scenario",
        "s.toml",
        "--tool",
        "ncu",
        "--variants",
        "fa2",
        "--plan-out",
        "p.json",
        "--iters",
        "3",
        "--shapes",
        "a",
    ]


def test_scenario_files_may_ask_for_the_faprof_set():
    from faprof.model.scenarios import NCU_SETS

    assert "faprof" in NCU_SETS and set(ncu.NCU_SETS) < set(NCU_SETS)
