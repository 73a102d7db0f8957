"""The advisor on recorded data: an ncu report of kernels with known behaviour recorded on the H100,
and the committed example bundles (l4_causal with ncu tables, with an nsys timeline)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from faprof import advisor
from faprof.cli import main
from faprof.store import Bundle

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).parent.parent / "examples" / "runs"
L4_NCU = EXAMPLES / "20261121T202207Z_nvidia-h100-80gb-hbm3_l4-causal"
L4_NSYS = EXAMPLES / "20261121T201056Z_nvidia-h100-80gb-hbm3_l4-causal"


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("ncu_report", reason="the ncu-report package reads the recorded .ncu-rep")
    from faprof.nsight import ncu

    plan = ncu.load_plan(DATA / "ncu" / "tiny_full_plan.json")
    metrics = ncu.read_report(DATA / "ncu" / "tiny_full.ncu-rep", plan)
    return advisor.diagnose({"ncu_metrics": metrics, **ncu.derive_tables(metrics, plan)})


def _primary(d: pd.DataFrame, variant: str, shape: str) -> pd.Series:
    p = d[(d["variant"] == variant) & (d["shape_id"] == shape) & d["primary"]]
    assert len(p) == 1, d[(d["variant"] == variant) & (d["shape_id"] == shape)]
    return p.iloc[0]


def test_recorded_kernels_get_the_cause_they_were_built_to_show(tiny):
    # one block on 132 SMs: report 003's "2 CTAs on 58 SMs"
    one = _primary(tiny, "tiny_ffma", "blocks1_t128_it256")
    assert one["cause"] == "too_few_ctas" and "131 SMs idle" in one["evidence"]
    # 32 lanes reading an int with a 32-int stride: ncu's excessive wavefronts, mio_throttle stalls
    smem = _primary(tiny, "tiny_smem", "blocks132_stride32_it64")
    assert smem["cause"] == "smem_bank_conflicts" and "mio_throttle" in smem["evidence"]
    # wmma on the H100: mma.sync-class HMMA with no GMMA
    hmma = tiny[(tiny["variant"] == "tiny_hmma") & (tiny["cause"] == "mma_sync_on_hopper")]
    assert len(hmma) == 1 and "0 GMMA" in hmma.iloc[0]["evidence"]
    assert (tiny["evidence"].str.len() > 0).all() and (tiny["fix"].str.len() > 0).all()


@pytest.fixture(scope="module")
def l4():
    return advisor.diagnose(Bundle.open(L4_NCU))


def test_l4_causal_diagnosis_does_not_contradict_the_evidence(l4):
    # sdpa_efficient fp32 emulates fp32 with TF32 products: a note, never wasted work
    fp32 = l4[(l4["variant"] == "sdpa_efficient") & (l4["dtype"] == "fp32")]
    assert "wasted_work" not in set(fp32["cause"])
    assert set(fp32[fp32["cause"] == "tf32_emulation"]["kind"]) == {"note"}
    # small-S causal fa2 (one tile computes ~2x the exact pairs) is not told it wastes work
    assert "wasted_work" not in set(l4[l4["variant"] == "fa2"]["cause"])
    # bank conflicts only from excessive wavefronts: fa1 at b4_h8 had 77 raw conflicts, 2% excessive
    fa1 = l4[(l4["variant"] == "fa1") & (l4["shape_id"] == "b4_h8_sq128_sk128_d64_fp32_causal_fwd")]
    assert "smem_bank_conflicts" not in set(fa1["cause"])
    for ev in l4[l4["cause"] == "smem_bank_conflicts"]["evidence"]:
        assert "excessive" in ev
    # one primary per (variant, shape) that ran (5 shapes x (naive, fa1, fa2, sdpa_efficient) fp32 + 5 fp16),
    # except where the call is level with its comparator within noise: no cause there, a 'level' note
    prim = l4[l4["primary"]].groupby(["variant", "shape_id"]).size()
    level = set(map(tuple, l4.loc[l4["cause"] == "level", ["variant", "shape_id"]].values.tolist()))
    assert (prim == 1).all() and len(prim) + len(level) == 25
    assert not level & set(prim.index)


def test_the_shared_memory_limiter_gets_its_own_advice():
    """fa1's occupancy is limited by shared memory in the l4 bundle; its latency finding says what to do."""
    d = advisor.diagnose(Bundle.open(L4_NCU))
    lat = d[(d["variant"] == "fa1") & (d["cause"] == "latency_bound")]
    assert not lat.empty
    assert all("limited by shared_memory" in e for e in lat["evidence"])
    assert all(advisor.LIMITER_ADVICE["shared_memory"] in f for f in lat["fix"])


def test_l4_causal_aggregated_view_fits_a_screen_per_dtype(l4):
    s = advisor.summarize(l4)
    assert s.groupby(["dtype", "variant", "cause"]).size().max() == 1
    assert set(s["dtype"]) == {"fp16", "fp32"}
    for _dtype, g in s.groupby("dtype"):
        assert len(g) <= 20


def test_launch_overhead_is_aggregated_and_only_where_the_gpu_waits():
    d = advisor.diagnose(Bundle.open(L4_NSYS))
    lo = d[d["cause"] == "launch_overhead"]
    # single-kernel calls (every SDPA backend, fa2_mma, ...) are never launch-bound from faprof's loop
    assert set(lo["variant"]) <= {"torch_standard", "sdpa_math", "naive"}
    assert "sdpa_efficient" not in set(lo["variant"]) and "fa2_mma" not in set(lo["variant"])
    s = advisor.summarize(d)
    rows = s[s["cause"] == "launch_overhead"]
    assert rows.groupby(["dtype", "variant"]).size().max() == 1 and len(rows) <= 5  # instead of ~60 rows
    assert rows["n_shapes"].sum() == len(lo)



def test_explain_of_one_shape_shows_where_by_default():
    """The README's `faprof explain` command, without --format, prints each finding with its `where:`
    line (the text view), as the README shows; --format table has a where column too."""
    run = DATA / "accounting" / "20261125T041303Z_nvidia-h100-80gb-hbm3_l4-causal"
    args = ["explain", str(run), "--variant", "fa2_mma", "--against", "sdpa_cudnn",
            "--shape", "b16_h8_sq512_sk512_d64_fp16_causal_fwd"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "fa2_mma · b16_h8_sq512_sk512_d64_fp16_causal_fwd"
    assert any(ln.startswith("    where: 99% of tensor hmma instructions at mma_ptx.cuh:40") for ln in lines), r.output
    r = CliRunner().invoke(main, [*args, "--format", "table"])
    assert r.exit_code == 0 and "where" in r.output and "mma_ptx.cuh:40" in r.output


def test_explain_command(tmp_path):
    r = CliRunner().invoke(main, ["explain", str(L4_NCU), "--format", "text", "--variant", "fa1"])
    assert r.exit_code == 0, r.output
    assert "fa1 (fp32)" in r.output and "too few CTAs" in r.output and "evidence:" in r.output
    r = CliRunner().invoke(main, ["explain", str(L4_NCU), "--format", "md", "--shape", "b16_h8_sq512_sk512_d64_fp32_causal_fwd"])
    assert r.exit_code == 0 and "| 1 | **" in r.output
    r = CliRunner().invoke(main, ["explain", str(L4_NCU)])
    assert r.exit_code == 0 and "Why:" in r.output
    r = CliRunner().invoke(main, ["explain", str(L4_NCU), "--variant", "nope"])
    assert r.exit_code == 2 and "no findings for variant 'nope'" in r.output
    r = CliRunner().invoke(main, ["explain", str(EXAMPLES / "20261121T200405Z_nvidia-h100-80gb-hbm3_h100-headline")])
    assert r.exit_code == 0 and "No findings" in r.output
