"""The advisor's thresholds: one table, each with its value, unit and reason (the README quotes it).

Rules read a threshold as `value("NAME")`; nothing in a rule hard-codes a number that decides
whether a finding fires or how it ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Threshold:
    value: float
    unit: str
    why: str


THRESHOLDS: dict[str, Threshold] = {
    # ---- ranking
    "PRIMARY_MIN_GAIN": Threshold(0.05, "share of the call", "a cause must explain at least this much of the call's time to be the primary one; below it the roofline position is primary"),
    "AT_BOUND_HEADROOM": Threshold(0.05, "share of the call", "a call within this share of its measured ceiling (copy bandwidth for a memory-bound problem, matmul for a compute-bound one) is at its bound: no cause can claim more of its time than lies above the ceiling"),
    "MIN_GAIN": Threshold(0.02, "share of the call", "findings that would save less than this are dropped (small kernels get findings only when they matter)"),
    "SMALL_KERNEL_SHARE": Threshold(0.10, "share of the call", "a kernel below this share of the call's GPU time gets no roofline-position finding"),
    # ---- memory
    "SPILL_MIN_SHARE": Threshold(0.05, "of L1 bytes", "local-memory (spill) traffic at least this share of the kernel's L1 bytes (local and global sectors x 32 B, shared wavefronts x 128 B; memory instructions when sectors were not collected)"),
    "UNCOALESCED_MIN_SHARE": Threshold(0.25, "of global sectors", "excessive global sectors (beyond what the accessed bytes need) at least this share of all global sectors"),
    "UNCOALESCED_MAX_SECTORS_PER_REQUEST": Threshold(16.0, "sectors", "a warp request of 32 x 16 bytes needs 16 sectors; more per request is uncoalesced for any access width (fallback when ncu's excessive-sector metric is absent)"),
    "SMEM_EXCESS_MIN_SHARE": Threshold(0.10, "of shared wavefronts", "excessive shared-memory wavefronts (bank conflicts beyond the ideal, from ncu's source counters) at least this share of all shared wavefronts; without source counters (the faprof set), bank-conflict counts over wavefronts, the ratio and threshold of ncu's SharedMemoryConflicts rule"),
    # ---- compute
    "TENSOR_IDLE_PCT": Threshold(1.0, "% of peak", "tensor pipes below this are idle"),
    "FMA_BUSY_PCT": Threshold(20.0, "% of peak", "an FMA pipe above this does the math on CUDA cores"),
    "TENSOR_MIN_FLOP_SHARE": Threshold(0.01, "of exact FLOPs", "tensor FLOPs below this share of the problem's exact FLOPs: the matrix products are not on tensor cores"),
    "CUDA_CORE_MATH_SHARE": Threshold(0.5, "of exact FLOPs", "CUDA-core FLOPs carrying at least this share of the exact FLOPs: the matrix products run on CUDA cores"),
    "FP64_MIN_INST_SHARE": Threshold(0.01, "of thread instructions", "fp64 instructions above this share in a non-fp64 problem are a finding (the FP64 pipe is 2x to 64x slower than fp32)"),
    "XU_PER_SCORE_MAX": Threshold(1.6, "XU instructions per score", "a softmax needs one exp2 per computed score (MUFU.EX2); more XU work per score than this is avoidable special-function work (expf, powf, a division per score)"),
    "XU_ISSUE_COST": Threshold(4.0, "x", "an XU (MUFU) warp instruction takes about this many times an FMA one's issue slots (16 vs 64 lanes per cycle per SM partition on sm_80..sm_90)"),
    "DIVERGENCE_MAX_LANES": Threshold(28.0, "lanes of 32", "fewer active lanes per executed instruction than this is divergence (tails and causal masks predicate lanes off; they do not deactivate them)"),
    "DIVERGENCE_MIN_WEIGHT": Threshold(0.5, "share", "the least weight the idle lanes' share gets when the schedulers are not issue-bound (inactive lanes still cost issue slots and latency)"),
    "STALL_TERM_MIN_SHARE": Threshold(0.15, "of warp cycles", "a stall reason holding at least this share of a kernel's warp cycles is a finding of its own (with the catalogue's meaning and fix)"),
    "TENSOR_OVER_FMA_DEFAULT": Threshold(8.0, "x", "tensor over fp32 FMA peak when neither ncu nor the GPU database gives both peaks"),
    "HOPPER_WGMMA_OVER_MMA": Threshold(1.5, "x", "on sm_90 the warp-group MMA (wgmma) roof is 1.5x the warp-level mma.sync one (540,672 vs 360,448 dense fp16 FLOP/cycle on an H100 SXM)"),
    "HOPPER_MMA_MIN_UTIL_PCT": Threshold(5.0, "% of peak", "mma.sync on Hopper is a finding only when the HMMA pipe is at least this busy"),
    "TF32_PRODUCTS": Threshold(3.0, "x", "fp32 emulated on tensor cores (CUTLASS 3xTF32) executes three TF32 products per fp32 one: tensor FLOPs from TF32 count 1/3 as exact work"),
    "WASTED_WORK_TILE": Threshold(128.0, "rows", "largest query/key tile assumed when computing the work a tiled kernel cannot avoid (causal diagonal tiles, padded tails)"),
    "WASTED_WORK_MIN_RATIO": Threshold(1.3, "x", "hardware FLOPs above the tile-granular minimum by this factor are wasted work"),
    # ---- parallelism
    "TOO_FEW_CTAS_PER_SM": Threshold(1.0, "blocks per SM", "a grid with fewer blocks than this times the SM count leaves SMs idle for the whole kernel"),
    "WAVE_TAIL_MIN_LOSS": Threshold(0.20, "of the kernel", "a partial last wave costing at least this share of the kernel (1 - waves/ceil(waves)) is a finding"),
    "WAVE_TAIL_MAX_WAVES": Threshold(4.0, "waves", "beyond this many waves the tail matters little"),
    # ---- position on the roofline
    "BUSY_PCT": Threshold(60.0, "% of peak", "a unit (SM, DRAM, memory) above this is the bottleneck"),
    "IDLE_PCT": Threshold(40.0, "% of peak", "with SM and memory both below this the kernel is latency-bound"),
    "STALL_SHARE": Threshold(0.15, "of stall cycles", "stall reasons above this share are quoted"),
    # ---- the comparative diagnosis (a gap to the fastest variant, or to --against)
    "LEVEL_RATIO": Threshold(1.05, "x", "calls within this ratio of each other are level: no gap is split (the H100 showed 3-4% between two same-code runs of one kernel, so a smaller gap is not a kernel's)"),
    "LEVEL_CYCLES_RATIO": Threshold(1.02, "x", "a gap under LEVEL_RATIO is still the kernels' when the timed medians and Nsight Compute's replayed SM cycles both show at least this ratio (within one H100 run two calls of one code differed by at most 1.8% in time, planted 2026-11-25; in replayed cycles by 0.2% for ms-long kernels and up to 6% for 5-µs ones, l4_causal's fa3 aliases: the time carries the noise control there)"),
    "MIN_GAP_SHARE": Threshold(0.05, "of the gap", "causes explaining less of the gap than this are left out"),
    "PRIMARY_MIN_GAP_SHARE": Threshold(0.10, "of the gap", "the primary cause of a gap must explain at least this much of it"),
    "MAX_UNEXPLAINED_GAP": Threshold(0.15, "of the gap", "a residual (ncu replay vs timing) above this is said with the causes"),
    "SHARED_GAIN_RATIO": Threshold(0.5, "x", "a cause the reference (faster) call has with at least this share of the slower call's gain does not explain the gap; when the fastest call has it, it is a note about the shape"),
    "SHAPE_NOTE_MIN_SHARE": Threshold(0.5, "of the variants", "a cause the fastest call and at least this share of the other profiled calls at a shape have is said once, as a note about the shape"),
    # ---- bytes by memory level and math by path (faprof.advisor.rules_pair: the slower call against its reference)
    "EXCESS_BYTES_RATIO": Threshold(1.5, "x", "a level's bytes at least this multiple of the reference's are excess traffic (two same-code runs differ by a few % in DRAM bytes, 2026-11-25 H100 planted bundle)"),
    "L2_HIT_DROP_PCT": Threshold(10.0, "percentage points", "excess DRAM reads count as lost L2 reuse when the L2 hit rate is at least this much lower than the reference's (spilled or uncoalesced kernels move more bytes at an equal or higher hit rate)"),
    "GQA_REREAD_SHARE": Threshold(0.75, "of H/Hkv", "a GQA/MQA call whose math kernels read at least this share of H/Hkv times the compulsory bytes from DRAM reads K/V about once per query head (the fix then names the KV-head mapping)"),
    "SAME_WORK_PER_BYTE": Threshold(1.1, "x", "math kernels executing within this ratio (either way) of the comparator's warp instructions per DRAM byte read do the same work per byte, so the instructions they add process the bytes they add (the decode plant against decode_splitkv: 0.058 per byte on both sides, H100 2026-11-28)"),
    "RMW_READBACK_SHARE": Threshold(0.5, "of the extra writes", "extra global writes are a read-modify-write when at least this share of their bytes is also read back"),
    "MOVE_MAX_FLOPS_PER_INST": Threshold(0.5, "FLOPs per thread instruction", "a kernel of a multi-kernel call below this does none of the problem's matrix products: it moves data (H100 bundles of 2026-11-21..28: attention kernels 0.62-1.5 on CUDA cores, 5-60 on tensor cores; copy, cast, convert, combine and preprocessing kernels 0-0.37, PyTorch's elementwise copies 0.05, their FLOPs the compiler's HFMA2.MMA register moves)"),
    "PRODUCTS_ON_TC_SHARE": Threshold(0.5, "share of executed FLOPs", "a call whose math kernels execute at least this share of their FLOPs on tensor cores does its matrix products there: more fp32/fp16 CUDA-core instructions then point to element-wise work per score, not to the products (H100 bundles of 2026-11-28: tensor-core kernels 0.90-0.99, planted_no_tensor_cores 0)"),
    "MATH_KERNEL_MIN_SHARE": Threshold(0.25, "of the exact FLOPs", "a kernel carrying less of the problem's exact FLOPs (shared over a call's kernels by the FLOPs each executed) holds none of its matrix products (QKᵀ and PV are half each): no 'tensor cores unused' for it, and its special functions are counted per score of the whole problem (a combine executes 0.4-0.7% of a split-KV call's FLOPs, naive's softmax 6-10%, H100 bundles 2026-11-21..28)"),
    "MATH_PATH_MIN_SHARE": Threshold(0.5, "of the model FLOPs", "a math path is a call's main path, and a move of FLOPs between paths a cause, from this share of the problem's FLOPs"),
    # ---- the partition's estimates (faprof.advisor.partition)
    "FIXED_LATENCY_CYCLES": Threshold(4.0, "cycles per added warp instruction", "a rise of fixed-latency waits ('wait') is the cost of the instructions that rose when it is at most this per added instruction (the dependent-issue latency of fp32 and integer arithmetic on Volta through Hopper in published microbenchmarks); a larger rise is a dependency chain among instructions both calls execute"),
    "SAME_COUNT_RATIO": Threshold(1.01, "x", "instruction counts of one code on one shape repeat exactly (the planted bundle's same-code pairs: equal CBU counts); a count within this ratio of the reference's is not more of those instructions"),
    "BARRIER_IMBALANCE_RATIO": Threshold(1.0, "x the other states' added warp-cycles", "at equal barrier counts, barrier warp-cycles rising by at least this multiple of the warp-cycles every other state added are an imbalance of the work before the barrier: added work C done by a share q of a block's warps makes the others wait (1-q)/q x C there, so a ratio of 1 puts it on at most half of the warps (the planted bundles' pairs at equal CBU counts: at most 0.15, where every warp does the added work: spills, bank conflicts, index math)"),
    # ---- memory classes and per-score work read from the SASS (faprof.advisor.rules_code)
    "ATOMIC_MIN_SHARE": Threshold(0.05, "of L2 sectors", "global atomics and reductions (ATOMG, RED) moving at least this share of a kernel's L2 sectors are a memory class of their own: read-modify-writes serialised at L2 (a tile scheduler's one atomic per CTA moves under 0.1%: cuDNN's sm90 kernels, H100 bundles of 2026-11-27..28)"),
    "DIV_PER_SCORE_MAX": Threshold(0.25, "divisions per score", "a division per score (MUFU.RCP with its FFMA fixups and FCHK, or a call of the division routine) where one reciprocal per row at the end is the minimum (1/Sk per score): more than this is a division inside the score loop"),
    "DEPENDENT_LOAD_MIN_SHARE": Threshold(0.25, "of long-scoreboard samples", "global loads whose address comes from another global load's result (an index table) holding at least this share of a kernel's long-scoreboard samples (charged to their producers) are a dependent-load chain: two memory latencies in series per element"),
    # ---- calls
    "LAUNCH_IDLE_MIN_SHARE": Threshold(0.20, "of the call's GPU span", "GPU idle between the kernels of one call (nsys) above this share: the GPU waits for the host"),
    "NCU_RULE_MIN_SPEEDUP_PCT": Threshold(5.0, "%", "ncu rule results with a smaller estimated speedup are left out"),
}


def value(name: str) -> float:
    """A threshold's value (KeyError names the known ones)."""
    try:
        return THRESHOLDS[name].value
    except KeyError:
        raise KeyError(f"no advisor threshold {name!r}; known: {', '.join(THRESHOLDS)}") from None


def thresholds_table():
    """THRESHOLDS as a DataFrame (name, value, unit, why), for docs and `faprof explain --thresholds`."""
    import pandas as pd

    return pd.DataFrame([{"name": k, "value": t.value, "unit": t.unit, "why": t.why} for k, t in THRESHOLDS.items()])
