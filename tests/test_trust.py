"""Numbers that cannot lie: aliases only when every record proves them, physically impossible rows never ok,
and what was timed is what was checked (the input sets and the checked timed calls; tests/test_timing_gaming.py
plants the kernels that game the timer).

Method: the recorded H100 bundle of tests/data/triton_variants (five constexpr variants of one Triton kernel:
the same kernel name, and for three of them the same grid and block; faprof 78e8876 plus this change, see
its README) read offline; every committed H100 bundle (examples/runs, tests/data) re-judged against the
physical limits; synthetic rows for the rules' edges.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from faprof.analysis import aliases
from faprof.analysis import speedups as analysis
from faprof.cli import main as cli
from faprof.model import schema
from faprof.model.problem import AttentionProblem
from faprof.rows import limits
from faprof.store import Bundle
from faprof.timing import rotation

ROOT = Path(__file__).resolve().parent.parent
TRITON = next((ROOT / "tests" / "data" / "triton_variants").glob("*_triton-variants"))
TV = ("tv_good", "tv_f32dot", "tv_nopipe", "tv_headmajor", "tv_smalltile")
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "smi_max_sm_clock_mhz": "1980", "ceilings": {"copy_gbs": 3020.0}}


# ------------------------------------------------------------------------------ aliases only when proven
def test_constexpr_variants_of_one_triton_kernel_are_one_row_each():
    b = Bundle.open(TRITON)
    meas = b.measurements()
    sigs = {r.variant: json.loads(r.kernel_sig) for r in meas.itertuples() if r.shape_id.startswith("b2_")}
    # what the old judgement compared (name, grid, block) is the same for three of them ...
    assert len({tuple(sigs[v][0][:3]) for v in ("tv_good", "tv_f32dot", "tv_nopipe")}) == 1
    # ... and nothing is folded: each variant keeps its own row and median at every shape
    rows = aliases.measurements(b)
    for sid, g in rows.groupby("shape_id"):
        assert set(TV) <= set(g["variant"]), sid
        assert g["aliases"].isna().all()
        assert g.set_index("variant").loc[list(TV), "median_ms"].nunique() == len(TV)


def test_show_prints_every_triton_variant_with_its_own_median():
    out = CliRunner().invoke(cli, ["show", str(TRITON)], terminal_width=250)
    assert out.exit_code == 0, out.output
    assert "(also" not in out.output
    meas = Bundle.open(TRITON).measurements()
    f32 = meas[(meas["variant"] == "tv_f32dot") & meas["shape_id"].str.startswith("b1_")]["median_ms"].iloc[0]
    assert f"{f32:.4g}" in out.output


@pytest.mark.parametrize("against", [v for v in TV if v != "tv_f32dot"])
def test_explain_against_works_for_pairs_of_one_triton_kernel(against):
    sid = "b1_h16_sq4096_sk4096_d128_fp16_causal_fwd"
    out = CliRunner().invoke(cli, ["explain", str(TRITON), "--variant", "tv_f32dot", "--against", against,
                                   "--shape", sid], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert f"tv_f32dot · {sid}" in out.output and f"slowdown to {against}" in out.output


def _records(regs: int = 117, smem: int = 65536, grid: str = "8,16,1") -> str:
    return json.dumps([["_attn_fwd", grid, "256,1,1", regs, smem]])


def _meas(rows: list[dict]) -> pd.DataFrame:
    base = {"shape_id": "s", "direction": "fwd", "status": "ok", "kernels_per_call": 1.0, "rel_ci": 0.002,
            "gpu_name": H100["gpu_name"]}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_the_same_kernel_needs_every_record_and_the_time_to_agree():
    same = {"variant": "a", "median_ms": 1.0, "kernel_sig": _records()}
    twin = {"variant": "b", "median_ms": 1.01, "kernel_sig": _records()}
    assert aliases.find(_meas([same, twin]), None, {}).shape[0] == 1  # every record agrees: one kernel
    for other in ({**twin, "kernel_sig": _records(regs=168)},  # registers differ (a precision switch)
                  {**twin, "kernel_sig": _records(smem=24576)},  # shared memory differs (num_stages)
                  {**twin, "kernel_sig": _records(grid="16,8,1")},  # grid differs (block order)
                  {**twin, "median_ms": 1.2},  # the records agree, the times do not
                  {**twin, "status": "untrusted"},  # a time that is not a result proves nothing
                  {**twin, "kernel_sig": None}):  # nothing recorded: nothing proven
        assert aliases.find(_meas([same, other]), None, {}).empty, other


def test_times_are_told_apart_by_the_gpus_noise_floor():
    tol = aliases.time_tolerance(H100["gpu_name"])
    assert 0.02 < tol < 0.06  # 1.96 x sqrt(2) x the H100's recorded row_sd (1.35%)
    a = {"median_ms": 1.0, "rel_ci": 0.001, "gpu_name": H100["gpu_name"]}
    assert aliases.times_agree(a, {**a, "median_ms": 1.0 + tol / 2})
    assert not aliases.times_agree(a, {**a, "median_ms": 1.0 + 2 * tol})
    assert aliases.times_agree(a, {**a, "median_ms": 1.2, "rel_ci": 0.3})  # wide CIs: cannot tell apart


def test_the_advisor_asks_the_same_judgement():
    from faprof.advisor.differential import same_kernels_as
    from faprof.advisor.evidence import calls_from, tables_from

    calls = [c for c in calls_from(tables_from(Bundle.open(TRITON))) if c.shape_id.startswith("b1_")]
    by = {c.variant: c for c in calls}
    assert not same_kernels_as(by["tv_good"], by["tv_f32dot"])
    assert same_kernels_as(by["tv_good"], by["tv_good"])


# ------------------------------------------------------------------------------ physical limits
def _row(**kw) -> dict:
    p = AttentionProblem(B=1, H=16, Sq=4096, Sk=4096, D=128, dtype="fp16", causal=True)
    return {"status": "ok", "device": "cuda", "dtype": "fp16", "gpu_name": H100["gpu_name"], "flops": p.flops(),
            "min_bytes": p.min_bytes(), **kw}


def test_a_row_faster_than_the_gpu_can_be_is_untrusted():
    # 68.7 GFLOP in 0.0099 ms: ~6,900 TFLOP/s on a GPU whose fastest dense path is ~1,000
    judged = limits.judge(_row(median_ms=0.0099), H100)
    assert judged["status"] == "untrusted" and judged["timing_flagged"] is True
    assert "physically impossible" in judged["reason"] and "TFLOP/s" in judged["reason"]
    # an honest 0.26 ms (tv_good's) is not; a wrong row stays wrong, flagged
    assert limits.judge(_row(median_ms=0.26), H100) == {}
    assert limits.judge(_row(median_ms=0.0099, status="wrong"), H100)["timing_flagged"] is True
    assert "status" not in limits.judge(_row(median_ms=0.0099, status="wrong"), H100)


def test_bandwidth_above_the_memory_is_impossible_only_with_a_clean_l2():
    p = AttentionProblem(B=16, H=32, Hkv=8, Sq=1, Sk=8192, D=128, dtype="bf16", causal=True, mask_align="bottom_right")
    row = {"status": "ok", "device": "cuda", "dtype": "bf16", "gpu_name": H100["gpu_name"], "flops": p.flops(),
           "min_bytes": p.min_bytes()}
    honest = p.min_bytes() / 2.9e12 * 1e3  # 2.9 TB/s: what decode_splitkv reaches on the H100
    assert limits.judge({**row, "median_ms": honest}, H100) == {}
    fast = p.min_bytes() / 10e12 * 1e3  # 10 TB/s: three times the H100's HBM
    assert "GB/s" in limits.judge({**row, "median_ms": fast}, H100)["reason"]
    assert limits.judge({**row, "median_ms": fast, "l2_flushed": False}, H100) == {}  # the L2 could serve it


def test_unknown_gpus_and_cpu_rows_are_not_judged():
    assert limits.judge(_row(median_ms=1e-6, gpu_name="Some Future GPU"), {"gpu_name": "Some Future GPU"}) == {}
    assert limits.judge(_row(median_ms=1e-6, device="cpu"), H100) == {}


def test_an_old_bundle_is_rejudged_when_read(tmp_path):
    dst = tmp_path / TRITON.name
    shutil.copytree(TRITON, dst)
    meas = pd.read_parquet(dst / "measurements.parquet")
    at = (meas["variant"] == "tv_good") & meas["shape_id"].str.startswith("b1_")
    meas.loc[at, "median_ms"] = 0.0099  # as an older faprof wrote a gamed row: ok, unflagged
    meas = meas.drop(columns=["l2_flushed", "input_sets", "timed_checked", "host_ms", "kernel_sig"])
    meas.to_parquet(dst / "measurements.parquet")
    df = Bundle.open(dst).measurements()
    row = df[(df["variant"] == "tv_good") & df["shape_id"].str.startswith("b1_")].iloc[0]
    assert row["status"] == "untrusted" and "physically impossible" in row["reason"]
    # it is not a result: no speedup, not among the timed rows, named in the run's table with its reason
    assert (df["status"] == "untrusted").sum() == 1
    sp = analysis.speedups_for(df, Bundle.open(dst).manifest())
    assert pd.isna(sp[(sp["variant"] == "tv_good") & sp["shape_id"].str.startswith("b1_")]["speedup"]).all()
    out = CliRunner().invoke(cli, ["show", str(dst)], terminal_width=250)
    assert out.exit_code == 0 and "untrusted" in out.output


def test_no_committed_h100_row_is_impossible():
    """Every recorded H100 bundle of the repository (faprof's kernels, PyTorch's, the planted sets, decode,
    GQA, varlen, paged), re-judged: the physical limits flag none of their honest rows."""
    n = 0
    for m in sorted([*ROOT.glob("examples/runs/*/manifest.json"), *ROOT.glob("tests/data/**/manifest.json")]):
        try:
            df = Bundle.open(m.parent).measurements()
        except Exception:  # noqa: BLE001  (damaged-bundle fixtures are tested elsewhere)
            continue
        if "status" not in df:
            continue
        timed = df[df["status"].isin((*schema.TIMED, limits.UNTRUSTED))]
        bad = timed[timed["timing_flag_reason"].fillna("").str.contains("physically impossible")] \
            if "timing_flag_reason" in timed else timed.iloc[0:0]
        assert bad.empty, (m.parent.name, bad[["variant", "shape_id", "median_ms"]].to_dict("records"))
        n += len(timed)
    assert n > 2000


# ------------------------------------------------------------------------------ input sets
def test_the_second_input_set_is_the_first_negated_and_its_outputs_follow_exactly():
    import torch

    from faprof.correctness import check as correctness
    from faprof.variants import get

    p = AttentionProblem(B=1, H=2, Sq=16, Sk=16, D=8, dtype="fp32", causal=True)
    inputs = correctness.make_inputs(p, "cpu", seed=1)
    ts, dout = correctness.prepare(p, inputs, "cpu", "torch_standard")
    rot = rotation.Rotation(get("torch_standard"), p, ts, dout, None, inputs.args)
    a, b = rot(), rot()
    assert rot.sets == 2 and rot.last == 1
    assert torch.equal(b, rotation.expected(p, [a], 1)[0])  # -O, bit for bit
    fresh = rot.fresh()()
    assert not torch.allclose(fresh, a)  # new values, a new answer


def test_checked_timed_calls_cover_both_input_sets_and_stay_few():
    for _ in range(200):
        first = rotation.chosen(10, batch=0, checked=0, sets=2)
        assert len(first) == 2 and {j % 2 for j in first} == {0, 1} and max(first) < 10
    assert len(rotation.chosen(20, batch=1, checked=2, sets=2)) == 1
    assert rotation.chosen(40, batch=3, checked=rotation.CHECKS_MAX, sets=2) == set()
    assert len(rotation.chosen(1, batch=0, checked=0, sets=2)) == 1


def test_compulsory_bytes_count_only_the_keys_some_query_sees():
    # top-left causal with one query over 1024 keys: the query sees key 0 alone, and a kernel that reads
    # only it is honest, not faster than the memory (the bytes ceiling must not flag it)
    tl = AttentionProblem(B=1, H=1, Sq=1, Sk=1024, D=64, dtype="fp16", causal=True)
    br = AttentionProblem(B=1, H=1, Sq=1, Sk=1024, D=64, dtype="fp16", causal=True, mask_align="bottom_right")
    assert tl.min_bytes() < br.min_bytes() / 100
    row = {"status": "ok", "device": "cuda", "dtype": "fp16", "gpu_name": H100["gpu_name"], "flops": tl.flops(),
           "min_bytes": tl.min_bytes(), "median_ms": 0.002}
    assert limits.judge(row, H100) == {}
