"""Each advisor rule on small in-memory tables: it fires on the evidence it names, quotes the
figures, stays quiet where the evidence says otherwise, and the ranking picks the right primary.

The tables here are built by hand to exercise one rule at a time (they are inputs to pure
functions, not stand-ins for recorded fixtures; the recorded ones are in test_advise.py and
test_advise_planted.py).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from faprof import advisor
from faprof.advisor.thresholds import THRESHOLDS, value

SMS = 132


def launch(kid: int, kernel: str = "k", *, variant: str = "v", shape: str = "s", duration_ms: float = 1.0,
           grid: float = 1024, waves: float = 4.0, sm: float = 50.0, mem: float = 50.0, dram: float = 20.0,
           cc: str = "9.0", **cols) -> dict:
    row = {"variant": variant, "shape_id": shape, "kernel": kernel, "kernel_id": kid, "launch": kid,
           "kernel_demangled": cols.pop("demangled", f"{kernel}(float*)"), "grid": cols.pop("grid_dims", f"({grid:.0f}, 1, 1)"),
           "block": "(128, 1, 1)", "cc": cc, "duration_ms": duration_ms, "grid_size": grid, "waves_per_sm": waves,
           "sm_count": SMS, "sm_throughput_pct": sm, "memory_throughput_pct": mem, "dram_throughput_pct": dram,
           "theoretical_occupancy_pct": 50.0, "achieved_occupancy_pct": 40.0, "occupancy_limiter": "registers",
           "registers_per_thread": 128, "smem_per_block_bytes": 48 * 1024}
    row.update(cols)
    return row


def tables(launches: list[dict], metrics: dict[int, dict[str, float]] | None = None,
           stalls: dict[int, dict[str, float]] | None = None, measurements: list[dict] | None = None,
           nsys: list[dict] | None = None, rules: list[dict] | None = None, analytic: float = math.nan) -> dict:
    summ = pd.DataFrame(launches)
    alls = [{"variant": v, "shape_id": s, "kernel": "(all)", "kernel_id": -1, "launch": -1, "analytic_flops": analytic}
            for v, s in summ[["variant", "shape_id"]].drop_duplicates().itertuples(index=False)]
    out = {"ncu_summary": pd.concat([summ, pd.DataFrame(alls)], ignore_index=True)}
    mrows = [{"kernel_id": k, "metric": n, "value": float(x)} for k, d in (metrics or {}).items() for n, x in d.items()]
    out["ncu_metrics"] = pd.DataFrame(mrows, columns=["kernel_id", "metric", "value"])
    srows = [{"kernel_id": k, "source": "warp_state", "reason": r, "share": x}
             for k, d in (stalls or {}).items() for r, x in d.items()]
    out["stalls"] = pd.DataFrame(srows, columns=["kernel_id", "source", "reason", "share"])
    if measurements is not None:
        out["measurements"] = pd.DataFrame(measurements)
    if nsys is not None:
        out["nsys_summary"] = pd.DataFrame(nsys)
    if rules is not None:
        out["ncu_rules"] = pd.DataFrame(rules)
    return out


def meas(variant="v", shape="s", dtype="fp16", causal=False, S=2048, status="ok", **extra) -> dict:
    return {"variant": variant, "shape_id": shape, "dtype": dtype, "causal": causal, "Sq": S, "Sk": S, "status": status,
            **extra}


def causes(diag: pd.DataFrame) -> list[str]:
    return list(diag["cause"])


def primary(diag: pd.DataFrame, variant="v", shape="s") -> str | None:
    p = diag[(diag["variant"] == variant) & (diag["shape_id"] == shape) & diag["primary"]]
    return None if p.empty else str(p.iloc[0]["cause"])


# ---------------------------------------------------------------------------------- memory
def test_register_spills_from_local_spill_requests():
    m = {0: {"derived__local_spilling_requests": 3e6, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 1e6,
             "smsp__sass_inst_executed_op_shared_ld.sum": 2e6, "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum": 5e6}}
    d = advisor.diagnose(tables([launch(0, mem=70)], m, {0: {"long_scoreboard": 0.6}}, [meas()]))
    f = d[d["cause"] == "register_spills"].iloc[0]
    assert f["primary"]
    assert "3M spill requests" in f["evidence"] and "50% of the kernel's memory instructions" in f["evidence"]
    assert "128 registers/thread" in f["evidence"]
    # share 0.5 x busy 0.7 (memory throughput 70% > long_scoreboard 60%) x 100% of the call
    assert f["estimated_gain_pct"] == pytest.approx(35.0)


def test_register_spills_weighs_local_bytes_against_l1_bytes():
    m = {0: {"derived__local_spilling_requests": 2e5, "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum": 1e6,
             "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 1e6, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 1e6}}
    d = advisor.diagnose(tables([launch(0, mem=60)], m, measurements=[meas()]))
    f = d[d["cause"] == "register_spills"].iloc[0]
    # 32 MB of local traffic against 32 MB global + 128 MB shared: 1/6 of the L1 bytes
    assert "1M local-memory sectors = 17% of the kernel's L1 bytes" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 / 6 * 0.6)
    # a few local sectors beside heavy ldmatrix traffic (fa2_mma's 20-byte spill): no finding
    m[0]["l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"] = 1e4
    assert "register_spills" not in causes(advisor.diagnose(tables([launch(0)], m, measurements=[meas()])))


def test_few_spills_are_not_a_finding():
    m = {0: {"derived__local_spilling_requests": 100, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 1e6,
             "smsp__sass_inst_executed_op_shared_ld.sum": 2e6}}
    d = advisor.diagnose(tables([launch(0)], m, measurements=[meas()]))
    assert "register_spills" not in causes(d)


def test_uncoalesced_from_excessive_sectors_and_from_sectors_per_request():
    m = {0: {"derived__memory_l2_theoretical_sectors_global_excessive": 7e6,
             "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 8e6, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 2.5e5}}
    d = advisor.diagnose(tables([launch(0, mem=80)], m, measurements=[meas()]))
    f = d[d["cause"] == "uncoalesced_global"].iloc[0]
    assert f["primary"] and "7M of 8M global sectors are excessive" in f["evidence"] and "32.0 sectors per load request" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 * 7 / 8 * 0.8)
    # without ncu's excessive-sector metric: 32 sectors per request is beyond any coalesced access
    m2 = {0: {"l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 8e6, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 2.5e5}}
    d2 = advisor.diagnose(tables([launch(0, mem=80)], m2, measurements=[meas()]))
    assert "uncoalesced_global" in causes(d2)
    # 16-byte coalesced loads: 16 sectors per request, nothing excessive
    m3 = {0: {"l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 4e6, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 2.5e5}}
    assert "uncoalesced_global" not in causes(advisor.diagnose(tables([launch(0)], m3, measurements=[meas()])))


def test_bank_conflicts_only_from_excessive_wavefronts():
    # arbitration-only conflicts: a raw conflict count but no excessive wavefronts -> no finding
    m = {0: {"derived__memory_l1_wavefronts_shared_excessive": 0, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 1e6}}
    d = advisor.diagnose(tables([launch(0, smem_bank_conflicts=77)], m, measurements=[meas()]))
    assert "smem_bank_conflicts" not in causes(d)
    # no excessive-wavefront metric at all: no finding either (raw counts are never used)
    d = advisor.diagnose(tables([launch(0, smem_bank_conflicts=5e6)], {0: {}}, measurements=[meas()]))
    assert "smem_bank_conflicts" not in causes(d)
    m = {0: {"derived__memory_l1_wavefronts_shared_excessive": 7e6, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 8e6,
             "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed": 90.0}}
    d = advisor.diagnose(tables([launch(0)], m, {0: {"mio_throttle": 0.5}}, [meas()]))
    f = d[d["cause"] == "smem_bank_conflicts"].iloc[0]
    assert f["primary"] and "7M of 8M shared-memory wavefronts are excessive (88%" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 * 7 / 8 * 0.9)


# --------------------------------------------------------------------------------- compute
def test_tensor_cores_unused_for_fp16_on_the_fma_pipe():
    m = {0: {"sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 70.0}}
    row = launch(0, sm=75, tensor_pipe_util_pct=0.0, fp32_flops=6e10)
    d = advisor.diagnose(tables([row], m, measurements=[meas(dtype="fp16")]))
    f = d[d["cause"] == "tensor_cores_unused"].iloc[0]
    assert f["primary"] and "fp16 problem; tensor pipes 0.0% active while the FMA pipe is 70% busy" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 * 0.7 * (1 - 1 / value("TENSOR_OVER_FMA_DEFAULT")))
    # fp32 problems, or a busy tensor pipe: no finding
    assert "tensor_cores_unused" not in causes(advisor.diagnose(tables([row], m, measurements=[meas(dtype="fp32")])))
    busy = launch(0, sm=75, tensor_pipe_util_pct=40.0)
    assert "tensor_cores_unused" not in causes(advisor.diagnose(tables([busy], m, measurements=[meas()])))


def test_mma_sync_on_hopper_needs_sm90_hmma_and_no_gmma():
    m = {0: {"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": 60.0}}
    row = dict(tensor_hmma_inst=1e6, tensor_gmma_inst=0.0)
    d = advisor.diagnose(tables([launch(0, **row)], m, measurements=[meas()]))
    f = d[d["cause"] == "mma_sync_on_hopper"].iloc[0]
    assert f["kind"] == "limit" and "HMMA pipe 60%" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 * 0.6 * (1 - 1 / 1.5))
    assert "mma_sync_on_hopper" not in causes(advisor.diagnose(tables([launch(0, cc="8.9", **row)], m, measurements=[meas()])))
    wg = dict(tensor_hmma_inst=1e6, tensor_gmma_inst=5e5)
    assert "mma_sync_on_hopper" not in causes(advisor.diagnose(tables([launch(0, **wg)], m, measurements=[meas()])))


def test_tf32_emulation_is_a_note_not_wasted_work():
    # fp32 attention at 3.2x the exact FLOPs, all from TF32 tensor products: no wasted work
    m = {0: {"sm__ops_path_tensor_src_tf32_dst_fp32.sum": 3e12}}
    row = launch(0, hw_flops=3.2e12, tensor_flops=3e12, fp32_flops=2e11)
    d = advisor.diagnose(tables([row], m, measurements=[meas(dtype="fp32", causal=False)], analytic=1e12))
    assert "wasted_work" not in causes(d)
    note = d[d["cause"] == "tf32_emulation"].iloc[0]
    assert note["kind"] == "note" and not note["primary"] and "3 TF32 products" in note["evidence"]


def test_wasted_work_from_exact_flops_with_a_tile_allowance():
    # causal S = 2048 computed as if full: 2x the exact FLOPs, far above whole 128-row tiles' 1.06x
    exact = 4 * 4 * 16 * (2048 * 2049 // 2) * 64
    row = launch(0, hw_flops=2.0 * exact)
    d = advisor.diagnose(tables([row], measurements=[meas(causal=True)], analytic=exact))
    f = d[d["cause"] == "wasted_work"].iloc[0]
    assert f["primary"] and "(2.00x)" in f["evidence"] and "128-row tiles up to the diagonal need 1.06x" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 * (1 - (2048 + 128) / 2049 / 2.0), rel=1e-3)
    # small causal S: one 128-row tile computes 1.98x the exact pairs; 1.6x is not wasted work
    small = 4 * 1 * (128 * 129 // 2) * 64
    d = advisor.diagnose(tables([launch(0, hw_flops=1.6 * small)], measurements=[meas(causal=True, S=128)], analytic=small))
    assert "wasted_work" not in causes(d)


FP64_INST = {"smsp__thread_inst_executed_pipe_fp64_pred_on.sum": 3e9, "smsp__thread_inst_executed.sum": 1e11}


def test_math_in_fp64_is_a_slower_path_not_wasted_work():
    # fp16 problem, products on fp16 tensor cores (the exact FLOPs), softmax in fp64: its exp and division are
    # DFMA polynomials, 0.61x the exact FLOPs more. Counted once per path, that is the fp64 path's cost.
    exact = 4 * 4 * 16 * 2048 * 2048 * 64
    row = launch(0, hw_flops=1.61 * exact, tensor_flops=exact, fp64_flops=0.61 * exact)
    d = advisor.diagnose(tables([row], {0: FP64_INST}, measurements=[meas()], analytic=exact))
    assert "wasted_work" not in causes(d) and primary(d) == "fp64_arithmetic"
    # one of the products in fp64 (DFMA) and the other on tensor cores: the problem's math done once
    row = launch(0, hw_flops=1.6 * exact, tensor_flops=0.5 * exact, fp64_flops=1.1 * exact)
    d = advisor.diagnose(tables([row], {0: FP64_INST}, measurements=[meas()], analytic=exact))
    assert "wasted_work" not in causes(d) and primary(d) == "fp64_arithmetic"
    # the same through DMMA (tensor-pipe fp64 FLOPs)
    m = {0: {**FP64_INST, "sm__ops_path_tensor_src_fp64.sum": 0.61 * exact}}
    row = launch(0, hw_flops=1.61 * exact, tensor_flops=1.61 * exact)
    d = advisor.diagnose(tables([row], m, measurements=[meas()], analytic=exact))
    assert "wasted_work" not in causes(d)


def test_work_beyond_the_exact_flops_stays_wasted_with_an_fp64_path():
    # causal problem with its masked-out half computed anyway on tensor cores, softmax in fp64: 2x the exact
    # work on the problem's own path; the fp64 FLOPs add none to it
    exact = 4 * 4 * 16 * (2048 * 2049 // 2) * 64
    row = launch(0, hw_flops=3.2 * exact, tensor_flops=2.0 * exact, fp64_flops=1.2 * exact)
    d = advisor.diagnose(tables([row], {0: FP64_INST}, measurements=[meas(causal=True)], analytic=exact))
    f = d[d["cause"] == "wasted_work"].iloc[0]
    assert f["primary"] and "(2.00x)" in f["evidence"] and "not extra work" in f["evidence"]
    assert "fp64_arithmetic" in causes(d)


def test_tile_pair_counts():
    from faprof.advisor.qk_pairs import tile_pairs

    assert tile_pairs(256, 256, True, 128) == 128 * 128 * (1 + 2)
    assert tile_pairs(200, 100, False, 128) == 2 * 128 * 128


@pytest.mark.parametrize("kw", [
    dict(causal=True, mask_align="bottom_right", Sq=1, Sk=300),        # decode: the one query sees every key
    dict(causal=True, mask_align="bottom_right", Sq=70, Sk=200),
    dict(causal=True, mask_align="top_left", Sq=200, Sk=70),
    dict(causal=True, mask_align="bottom_right", Sq=90, Sk=40),        # rows 0-49 see nothing
    dict(causal=True, window=(31, 0), Sq=150, Sk=150),                 # sliding window
    dict(causal=False, window=(20, 9), Sq=100, Sk=130),
    dict(causal=True, B=3, seqlens_q=(70, 5, 33), seqlens_k=(70, 5, 33), Sq=70, Sk=70),  # packed batch
])
def test_the_tile_allowance_counts_every_mask_and_sequence_against_brute_force(kw):
    """wasted_work's allowance (whole tiles over the keys each query tile sees) for bottom-right causal,
    windows and packed batches, against enumerating the pairs and the tiles holding any of them."""
    from faprof.advisor.qk_pairs import problem_pairs
    from faprof.model.problem import AttentionProblem

    args = dict(B=1, H=2, D=32, dtype="fp16") | kw
    p = AttentionProblem(**args)
    tile = 16
    exact = tiles = 0
    for sq, sk in zip(p.q_lens(), p.k_lens(), strict=True):
        seen = [[k for k in range(sk) if p.mask.key_range(i, sq, sk)[0] <= k <= p.mask.key_range(i, sq, sk)[1]]
                for i in range(sq)]
        exact += sum(len(s) for s in seen)
        for qt in range(-(-sq // tile)):
            kts = {k // tile for s in seen[qt * tile:(qt + 1) * tile] for k in s}
            tiles += len(kts) * tile * tile
    assert problem_pairs(p, tile) == (exact, tiles)
    assert exact * p.H * 4 * p.D == p.fwd_flops()  # the model's exact FLOPs count the same pairs


# ----------------------------------------------------------------------------- parallelism
def test_too_few_ctas_and_its_gain():
    d = advisor.diagnose(tables([launch(0, grid=64, waves=0.24)], measurements=[meas()]))
    f = d[d["cause"] == "too_few_ctas"].iloc[0]
    assert f["primary"] and "grid of 64 blocks on 132 SMs: 68 SMs idle" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 * (1 - 64 / 132))


def test_one_launch_per_slice_is_named_instead_of_too_few_ctas():
    lzs = [launch(i, "attn", grid=16, waves=0.06, duration_ms=0.03) for i in range(64)]
    d = advisor.diagnose(tables(lzs, measurements=[meas()]))
    assert primary(d) == "launch_split" and "too_few_ctas" not in causes(d)
    f = d[d["cause"] == "launch_split"].iloc[0]
    assert "64 launches of one kernel on one grid per call, each 16 blocks on 132 SMs" in f["evidence"]
    assert f["estimated_gain_pct"] == pytest.approx(100 * (1 - 16 / 132))
    # the same short name with different template arguments (different ops): not one split launch
    ops = [launch(i, "elementwise", grid=16, waves=0.06, demangled=f"elementwise<Op{i}>(float*)") for i in range(4)]
    d = advisor.diagnose(tables(ops, measurements=[meas()]))
    assert "launch_split" not in causes(d) and "too_few_ctas" in causes(d)


def test_wave_tail():
    d = advisor.diagnose(tables([launch(0, grid=512, waves=1.29)], measurements=[meas()]))
    f = d[d["cause"] == "wave_tail"].iloc[0]
    assert "1.29 waves" in f["evidence"] and f["estimated_gain_pct"] == pytest.approx(100 * (1 - 1.29 / 2))
    assert "wave_tail" not in causes(advisor.diagnose(tables([launch(0, waves=3.9)], measurements=[meas()])))


# ------------------------------------------------------------------------------- position
def test_latency_bound_quotes_stalls_and_gives_the_shared_memory_limiter_its_advice():
    row = launch(0, sm=20, mem=24, occupancy_limiter="shared_memory", theoretical_occupancy_pct=25.0,
                 achieved_occupancy_pct=6.2)
    d = advisor.diagnose(tables([row], stalls={0: {"long_scoreboard": 0.5, "barrier": 0.2}}, measurements=[meas()]))
    f = d[d["cause"] == "latency_bound"].iloc[0]
    assert f["primary"]  # no cause explains 5%: the position is primary
    assert "limited by shared_memory: 48.0 KiB shared memory/block" in f["evidence"]
    assert "long_scoreboard 50%, barrier 20%" in f["evidence"]
    assert advisor.LIMITER_ADVICE["shared_memory"] in f["fix"]


def test_memory_and_compute_bound_positions():
    d = advisor.diagnose(tables([launch(0, sm=30, mem=85, dram=85)], measurements=[meas()]))
    assert primary(d) == "memory_bound" and "DRAM 85% of peak" in d.iloc[0]["evidence"]
    d = advisor.diagnose(tables([launch(0, sm=90, mem=40, dram=10)], measurements=[meas()]))
    assert primary(d) == "compute_bound"


def test_a_cause_outranks_the_position_and_small_kernels_stay_quiet():
    main = launch(0, "main", duration_ms=9.5, sm=20, mem=20)
    tiny = launch(1, "tiny", duration_ms=0.5, grid=8, waves=0.01, sm=1, mem=1)
    m = {0: {"derived__memory_l1_wavefronts_shared_excessive": 6e6, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 8e6,
             "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed": 80.0}}
    d = advisor.diagnose(tables([main, tiny], m, measurements=[meas()]))
    assert primary(d) == "smem_bank_conflicts"
    # the tiny kernel's 8-block grid costs 5% x 94% of the call: reported; its position is not
    assert not ((d["kernel"] == "tiny") & (d["kind"] == "position")).any()
    assert d.iloc[0]["rank"] == 1 and list(d["rank"]) == list(range(1, len(d) + 1))


# ---------------------------------------------------------------------------------- calls
def test_correctness_is_always_primary():
    d = advisor.diagnose(tables([launch(0, grid=8, waves=0.1)], measurements=[
        meas(status="wrong", reference="cpu_ref fp64", max_abs_err=0.5, rel_err=0.2)]))
    assert primary(d) == "correctness" and "max abs error 0.5" in d.iloc[0]["evidence"]


def test_launch_overhead_only_from_gpu_idle_inside_multi_kernel_calls_and_aggregated():
    nsys = [{"variant": "torch", "shape_id": f"s{i}", "status": "ok", "kernels_per_call": 9.0, "gpu_us": 20.0,
             "idle_us": 180.0, "iterations": 10, "kernel_names": ["a", "b", "c"]} for i in range(5)]
    nsys += [{"variant": "sdpa", "shape_id": f"s{i}", "status": "ok", "kernels_per_call": 1.0, "gpu_us": 5.0,
              "idle_us": 0.0, "iterations": 10, "kernel_names": ["fmha"]} for i in range(5)]
    d = advisor.diagnose({"nsys_summary": pd.DataFrame(nsys)})
    assert set(d[d["cause"] == "launch_overhead"]["variant"]) == {"torch"}  # a one-kernel call never is
    f = d[d["cause"] == "launch_overhead"].iloc[0]
    assert "idle 180.0 µs between the 9 kernels of a call" in f["evidence"] and f["estimated_gain_pct"] == pytest.approx(90)
    s = advisor.summarize(d)
    row = s[(s["variant"] == "torch") & (s["cause"] == "launch_overhead")]
    assert len(row) == 1 and row.iloc[0]["n_shapes"] == 5  # one row for five shapes


def test_kernels_per_call_gain_from_extra_dram_traffic():
    lzs = [launch(0, "scores", duration_ms=0.2, dram_bytes=3e8), launch(1, "softmax", duration_ms=0.1, dram_bytes=2e8),
           launch(2, "pv", duration_ms=0.2, dram_bytes=1e8)]
    d = advisor.diagnose(tables(lzs, measurements=[meas(min_bytes=1e8, mem_bw_gbs=3000.0)]))
    f = d[d["cause"] == "kernels_per_call"].iloc[0]
    # 500 MB beyond the 100 MB needed at 3 TB/s = 167 µs of a 500 µs call
    assert f["estimated_gain_pct"] == pytest.approx(100 * (5e8 / 3e12) / 5e-4)
    assert "3 kernel launches per call (scores, softmax, pv)" in f["evidence"]


def test_ncu_rules_corroborate_or_add_secondary_findings():
    m = {0: {"derived__memory_l1_wavefronts_shared_excessive": 6e6, "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 8e6}}
    rules = [{"variant": "v", "shape_id": "s", "kernel": "k", "rule": "SharedMemoryConflicts", "section": "MemoryWorkloadAnalysis",
              "type": "OPT", "message": "bank conflicts", "est_speedup_pct": 40.0},
             {"variant": "v", "shape_id": "s", "kernel": "k", "rule": "ThreadDivergence", "section": "SourceCounters",
              "type": "OPT", "message": "Divergent  branches\nhere", "est_speedup_pct": 80.0}]
    d = advisor.diagnose(tables([launch(0)], m, measurements=[meas()], rules=rules))
    bank = d[d["cause"] == "smem_bank_conflicts"].iloc[0]
    assert "[ncu rule SharedMemoryConflicts: est. speedup 40%]" in bank["evidence"]
    ncu = d[d["cause"] == "ncu_rule"].iloc[0]
    assert not ncu["primary"] and ncu["title"] == "ncu: ThreadDivergence" and "Divergent branches here" in ncu["evidence"]
    assert primary(d) == "smem_bank_conflicts"


def test_rules_never_read_names():
    """The same counters under other kernel and variant names give the same diagnosis."""
    m = {0: {"derived__local_spilling_requests": 3e6, "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 1e6}}
    a = advisor.diagnose(tables([launch(0, "fa2_mma_fwd_kernel")], m, measurements=[meas()]))
    b = advisor.diagnose(tables([launch(0, "triton_kernel_0", variant="x", demangled="triton_kernel_0")], m,
                                measurements=[meas(variant="x")]))
    cols = ["rank", "primary", "cause", "estimated_gain_pct"]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_thresholds_quoted_in_the_docs_match_the_code():
    """Every threshold is in the docs' generated table (reference/causes.md, tests/test_docs.py checks
    it); a page that also quotes one by hand (`| `NAME` | value | unit |`) must quote the code's value and unit."""
    import re
    from pathlib import Path

    root = Path(__file__).parent.parent
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for name, val, unit in re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \| ([^|]+) \| ([^|]+) \|", page.read_text(), re.M):
            if name in THRESHOLDS:
                t = THRESHOLDS[name]
                assert (val.strip(), unit.strip()) == (f"{t.value:g}", t.unit), f"{page.name}: {name}"


def test_diagnose_rejects_other_inputs_and_handles_empty_tables():
    with pytest.raises(TypeError, match="Bundle or a mapping"):
        advisor.diagnose(42)
    d = advisor.diagnose({})
    assert d.empty and list(d.columns) == list(advisor.DIAG_COLUMNS)
    assert advisor.summarize(d).empty
    assert "No findings" in advisor.render_text(d)
