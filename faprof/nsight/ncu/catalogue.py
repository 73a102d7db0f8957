"""Nsight Compute metric catalogue: which ncu metric measures a concept on each compute capability.

The catalogue maps a *concept* (achieved occupancy, DRAM bytes read, tensor-pipe utilization...)
to the ncu metric names that measure it on each compute capability faprof knows (sm_80, sm_86,
sm_89, sm_90). Metric names differ between chips (Ada has corrected `_v2` HMMA counters, Hopper
adds the warp-group GMMA path and counts fp16 tensor FLOPs without a destination type, FP8 exists
from Ada on), so nothing in faprof hard-codes one name for all GPUs: code asks the catalogue for a
concept's names on the report's CC and takes the first one the report holds. Every name faprof asks
ncu for was checked against `ncu --query-metrics --chip <chip>` of Nsight Compute 2025.3.1 (ga100,
ga102, ad102, gh100; the lists are in tests/data/ncu/) and the values against reports recorded on
an H100 with kernels of known work (tests/data/ncu/tiny_kernels.cu). Also here: the warp stall
reasons and the unit conversions. `faprof.nsight.metrics` re-exports all of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# ----------------------------------------------------------------------------------- identities

#: Compute capabilities the catalogue has names for (Ampere A100, GA10x, Ada, Hopper).
KNOWN_CCS = ("8.0", "8.6", "8.9", "9.0")

#: Chip names `ncu --query-metrics --chip` takes for each CC (one representative chip each).
CC_CHIPS = {"8.0": "ga100", "8.6": "ga102", "8.9": "ad102", "9.0": "gh100"}

#: Range name and label of the per-(variant, shape_id) aggregate rows of ncu_summary and roofline.
ALL_KERNELS = "(all)"

#: Columns that identify one profiled kernel launch in every ncu table.
KEY_COLUMNS = ("variant", "shape_id", "kernel", "kernel_id", "launch")

#: Values `occupancy_limiter` can take: what bounds the blocks that fit on one SM.
OCCUPANCY_LIMITERS = ("registers", "shared_memory", "warps", "blocks", "barriers")

#: Order used to break ties between equal occupancy limits: a resource the kernel's author can
#: change (registers, shared memory) is named before a shape limit (warps, blocks).
_LIMITER_METRICS = {
    "registers": "launch__occupancy_limit_registers",
    "shared_memory": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
    "barriers": "launch__occupancy_limit_barriers",
}


def cc_key(cc: str | tuple[int, int] | None) -> str:
    """The catalogue column for a compute capability: itself when known, else the nearest older one.

    Args:
        cc: "8.6", (8, 6), or None (treated as the newest known CC).

    Returns:
        One of KNOWN_CCS. A newer chip (sm_100, sm_120) maps to "9.0" and an older Turing-class one
        to "8.0": names mostly carry over, and a name a chip lacks is simply absent from its report.
    """
    if cc is None:
        return KNOWN_CCS[-1]
    if isinstance(cc, tuple):
        cc = f"{cc[0]}.{cc[1]}"
    if cc in KNOWN_CCS:
        return cc
    try:
        major, minor = (int(x) for x in str(cc).split(".")[:2])
    except ValueError:
        return KNOWN_CCS[-1]
    older = [k for k in KNOWN_CCS if tuple(int(x) for x in k.split(".")) <= (major, minor)]
    return older[-1] if older else KNOWN_CCS[0]


# ----------------------------------------------------------------------------------- catalogue


@dataclass(frozen=True)
class Concept:
    """One quantity faprof reads from ncu, with its metric names per compute capability."""

    key: str
    """Catalogue key, e.g. "achieved_occupancy"."""
    description: str
    """What it measures, in a line."""
    names: Mapping[str, tuple[str, ...]]
    """CC ("8.0", ...) -> metric names in order of preference (the first one a report holds wins)."""
    request: bool = False
    """Whether faprof asks ncu for it on top of the section set (`--metrics`), so that even
    `--set basic` yields FLOPs, DRAM bytes, the L2 hit rate, bank conflicts and the roofline peaks."""
    provided_by: str = ""
    """For a concept faprof does not request: which set provides it (a rule reading it has a
    fallback where it is absent, and says which metric it lacks)."""

    def for_cc(self, cc: str | tuple[int, int] | None) -> tuple[str, ...]:
        """Metric names of this concept on a compute capability (possibly empty)."""
        return self.names.get(cc_key(cc), ())


def _same(*names: str) -> dict[str, tuple[str, ...]]:
    """The same names on every known CC (for metrics whose name did not change since sm_80)."""
    return {cc: tuple(names) for cc in KNOWN_CCS}


def _per_cc(common: Sequence[str] = (), **by_cc: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Names per CC: keyword sm80=..., sm86=..., sm89=..., sm90=... first, then the common ones."""
    out = {}
    for cc in KNOWN_CCS:
        out[cc] = tuple(by_cc.get("sm" + cc.replace(".", ""), ())) + tuple(common)
    return out


#: Where the counters faprof does not request come from.
_FULL_SET = "the `full` set (SourceCounters section: SASS-patched counters)"

_FLOP_OPS = ("fadd", "fmul", "ffma", "hadd", "hmul", "hfma", "dadd", "dmul", "dfma")

#: Warp states of the accounting (WarpStateStats reasons, 'selected' = issuing) and the CCs that
#: report each; checked against `ncu --query-metrics` of ga100, ga102, ad102 and gh100.
_ALL = ("8.0", "8.6", "8.9", "9.0")
_WARP_STATES: dict[str, tuple[str, ...]] = {
    **{r: _ALL for r in ("selected", "barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss",
                         "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc",
                         "no_instructions", "not_selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")},
    "gmma": ("9.0",),
}
#: Metric spelling of a reason where it differs from faprof's (warp-state metrics say `no_instruction`).
_WARP_STATE_SPELLING = {"no_instructions": "no_instruction"}


def _pipe(common: Sequence[str] = (), **by_cc: Sequence[str]) -> dict[str, tuple[str, ...]]:
    return _per_cc(common=[f"sm__inst_executed_pipe_{n}.sum" for n in common],
                   **{k: [f"sm__inst_executed_pipe_{n}.sum" for n in v] for k, v in by_cc.items()})


#: Issue pipes of the accounting: pipe -> (what it runs, metric names per CC). fp16 FMA-pipe work is
#: its own pipe (`fp16`: the FP16 pipe of GA100, the FMA pipe's fp16 type elsewhere); `fma` is then
#: the fp32 part (fma minus fp16 where the chip counts the fp16 type inside fma, done by the
#: accounting). Pipes the chip lacks have no names there.
_PIPES: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {
    "tensor_hmma": ("warp-level tensor pipe (HMMA: mma.sync, wmma)",
                    _pipe(sm89=("tensor_op_hmma_v2",), common=("tensor_op_hmma",))),
    "tensor_gmma": ("warp-group tensor pipe (GMMA: wgmma)", _pipe(sm90=("tensor_op_gmma",))),
    "tensor_imma": ("integer tensor pipe (IMMA)", _pipe(sm89=("tensor_op_imma_v2",), common=("tensor_op_imma",))),
    "tensor_dmma": ("fp64 tensor pipe (DMMA)", _pipe(sm80=("tensor_op_dmma",), sm90=("tensor_op_dmma",))),
    "fma": ("FMA pipe (fp32 FFMA/FADD/FMUL, IMAD)", _pipe(common=("fma",))),
    "fp16": ("fp16 pipe (HFMA2/HADD2/HMUL2)", _pipe(sm80=("fp16",), sm86=("fma_type_fp16",), sm89=("fma_type_fp16",),
                                                      sm90=("fma_type_fp16",))),
    "fp64": ("FP64 pipe (DFMA/DADD/DMUL)", _pipe(common=("fp64",))),
    "alu": ("ALU pipe (integer, logic, compare, conversions)", _pipe(common=("alu",))),
    "xu": ("XU pipe (MUFU: exp2, lg2, rcp, rsqrt, sin; conversions)", _pipe(common=("xu",))),
    "lsu": ("LSU pipe (shared, local, global loads/stores)", _pipe(common=("lsu",))),
    "adu": ("ADU pipe (address divergence, branch targets)", _pipe(common=("adu",))),
    "cbu": ("CBU pipe (branches, barriers, warp sync)", _pipe(common=("cbu",))),
    "uniform": ("uniform datapath (warp-uniform integer work)", _pipe(common=("uniform",))),
    "tex": ("TEX pipe (texture, some global loads)", _pipe(common=("tex",))),
    "ipa": ("IPA pipe (interpolation)", _pipe(common=("ipa",))),
    "tma": ("TMA unit issue (cp.async.bulk.tensor)", _pipe(sm90=("tma",))),
}



_CONCEPTS: list[Concept] = [
    # ---- time and clocks
    Concept("duration", "kernel duration on the GPU", _same("gpu__time_duration.sum")),
    Concept(
        "sm_clock",
        "SM clock during the kernel (cycles per second)",
        _same("sm__cycles_elapsed.avg.per_second"),
        request=True,
    ),
    Concept(
        "dram_clock",
        "DRAM clock during the kernel",
        _same("dram__cycles_elapsed.avg.per_second"),
        request=True,
    ),
    Concept(
        "elapsed_cycles", "GPU cycles elapsed", _same("gpc__cycles_elapsed.max", "sm__cycles_elapsed.max")
    ),
    # ---- launch configuration (LaunchStats section; not hardware counters)
    Concept("grid_size", "blocks in the grid", _same("launch__grid_size")),
    Concept("block_size", "threads per block", _same("launch__block_size")),
    Concept("grid_dim_x", "grid x dimension", _same("launch__grid_dim_x")),
    Concept("grid_dim_y", "grid y dimension", _same("launch__grid_dim_y")),
    Concept("grid_dim_z", "grid z dimension", _same("launch__grid_dim_z")),
    Concept("block_dim_x", "block x dimension", _same("launch__block_dim_x")),
    Concept("block_dim_y", "block y dimension", _same("launch__block_dim_y")),
    Concept("block_dim_z", "block z dimension", _same("launch__block_dim_z")),
    Concept("registers_per_thread", "registers per thread", _same("launch__registers_per_thread")),
    Concept("smem_static", "static shared memory per block", _same("launch__shared_mem_per_block_static")),
    Concept("smem_dynamic", "dynamic shared memory per block", _same("launch__shared_mem_per_block_dynamic")),
    Concept(
        "smem_driver",
        "shared memory the driver reserves per block",
        _same("launch__shared_mem_per_block_driver"),
    ),
    Concept("smem_config", "shared memory carve-out per SM", _same("launch__shared_mem_config_size")),
    Concept("waves_per_sm", "waves of blocks per SM", _same("launch__waves_per_multiprocessor")),
    Concept(
        "sm_count", "SMs of the device", _same("device__attribute_multiprocessor_count", "launch__sm_count")
    ),
    # ---- occupancy (Occupancy section)
    Concept(
        "theoretical_occupancy",
        "theoretical occupancy, % of the SM's warps",
        _same("sm__maximum_warps_per_active_cycle_pct"),
    ),
    Concept(
        "achieved_occupancy",
        "achieved occupancy, % of the SM's warps",
        _same("sm__warps_active.avg.pct_of_peak_sustained_active"),
        request=True,
    ),
    *(
        Concept(f"occupancy_limit_{k}", f"blocks per SM allowed by {k.replace('_', ' ')}", _same(m))
        for k, m in _LIMITER_METRICS.items()
    ),
    # ---- speed of light (SpeedOfLight section)
    Concept(
        "sm_throughput",
        "compute (SM) throughput, % of peak",
        _same("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ),
    Concept(
        "memory_throughput",
        "memory throughput, % of peak (max over DRAM, L2, L1, shared)",
        _same("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    ),
    Concept(
        "dram_throughput",
        "DRAM throughput, % of peak",
        _same(
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        ),
    ),
    # ---- memory
    Concept("dram_bytes_read", "bytes read from DRAM", _same("dram__bytes_read.sum"), request=True),
    Concept("dram_bytes_write", "bytes written to DRAM", _same("dram__bytes_write.sum"), request=True),
    Concept("dram_bytes_per_second", "DRAM bandwidth achieved", _same("dram__bytes.sum.per_second")),
    Concept("l2_hit_rate", "L2 hit rate, % of sectors", _same("lts__t_sector_hit_rate.pct"), request=True),
    Concept("l1_hit_rate", "L1/TEX hit rate, % of sectors", _same("l1tex__t_sector_hit_rate.pct")),
    Concept(
        "smem_bank_conflicts_ld",
        "shared-memory bank conflicts of loads",
        _same("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
        request=True,
    ),
    Concept(
        "smem_bank_conflicts_st",
        "shared-memory bank conflicts of stores",
        _same("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
        request=True,
    ),
    Concept(
        "smem_bank_conflicts",
        "shared-memory bank conflicts (all shared-memory instructions)",
        _same("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),
    ),
    Concept(
        "smem_pipe_util",
        "shared-memory wavefronts of the LSU pipe, % of peak (how busy shared memory is)",
        _same("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed"),
        request=True,
    ),
    Concept(
        "ldsm_inst",
        "ldmatrix instructions executed (shared-memory loads besides LDS)",
        _same("smsp__inst_executed_op_ldsm.sum"),
        request=True,
    ),
    Concept(
        "l2_throughput",
        "L2 throughput, % of peak",
        _same("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        request=True,
    ),
    # ---- advisor: local memory (register spills), global coalescing, shared-memory wavefronts.
    # Hardware counters (in every chip's `--query-metrics`), so the `faprof` set asks for them: local
    # loads/stores only happen for spills and local arrays; sectors per request above 4 (32-bit words)
    # mean a warp's accesses are spread; wavefronts above one per shared instruction mean conflicts.
    *(
        Concept(key, text, _same(name), request=True)
        for key, text, name in (
            (
                "local_ld_sectors",
                "L1 sectors of local-memory loads",
                "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
            ),
            (
                "local_st_sectors",
                "L1 sectors of local-memory stores",
                "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
            ),
            (
                "local_ld_requests",
                "local-memory load requests",
                "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum",
            ),
            (
                "local_st_requests",
                "local-memory store requests",
                "l1tex__t_requests_pipe_lsu_mem_local_op_st.sum",
            ),
            (
                "global_ld_sectors",
                "L1 sectors of global loads",
                "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
            ),
            ("global_ld_requests", "global load requests", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
            (
                "global_st_sectors",
                "L1 sectors of global stores",
                "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
            ),
            (
                "global_st_requests",
                "global store requests",
                "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
            ),
            (
                "global_ld_sectors_per_request",
                "sectors per global load request (4 = 32-bit words fully coalesced)",
                "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio",
            ),
            (
                "smem_wavefronts_ld",
                "shared-memory load wavefronts",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
            ),
            (
                "smem_wavefronts_st",
                "shared-memory store wavefronts",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
            ),
            (
                "smem_inst_ld",
                "shared-memory load instructions (warp level)",
                "smsp__sass_inst_executed_op_shared_ld.sum",
            ),
            (
                "smem_inst_st",
                "shared-memory store instructions (warp level)",
                "smsp__sass_inst_executed_op_shared_st.sum",
            ),
            (
                "fma_pipe_util",
                "FMA pipe active, % of peak",
                "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
            ),
            ("fma_inst", "warp instructions on the FMA pipe", "sm__inst_executed_pipe_fma.sum"),
        )
    ),
    # Advisor memory counters that are SASS/LSU counters (in every chip's `--query-metrics`).
    *(
        Concept(key, text, _same(name), request=True)
        for key, text, name in (
            ("local_ld_inst", "local-memory load instructions (warp level)", "smsp__sass_inst_executed_op_local_ld.sum"),
            ("local_st_inst", "local-memory store instructions (warp level)", "smsp__sass_inst_executed_op_local_st.sum"),
            ("global_ldgsts_requests", "cp.async (LDGSTS) global requests",
             "sm__sass_l1tex_t_requests_pipe_lsu_mem_global_op_ldgsts.sum"),
            ("global_ldgsts_sectors_bypass", "cp.async (LDGSTS) global sectors, L1 bypassed",
             "sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum"),
            ("global_ldgsts_sectors_access", "cp.async (LDGSTS) global sectors through L1",
             "sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum"),
            ("global_ld_bytes_per_sector", "bytes used per 32-byte sector of global loads",
             "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.ratio"),
            ("smem_wavefronts", "shared-memory wavefronts (loads, stores, ldmatrix, atomics)",
             "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"),
            ("hmma_pipe_util", "warp-level HMMA pipe active, % of peak",
             "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
        )
    ),
    # ---- the accounting (faprof.advisor.accounting): every warp cycle of a kernel is one warp state
    # (issuing: 'selected', or stalled for one reason), every issued instruction goes to one pipe.
    # issue_active x the per-reason ratios gives the warp-cycles of each state; warps_active is their
    # total, so the shares sum to 1 (checked on the recorded fixtures).
    Concept("inst_executed", "warp instructions executed", _same("smsp__inst_executed.sum"), request=True),
    Concept("inst_issued", "warp instructions issued", _same("smsp__inst_issued.sum"), request=True),
    # one instruction issues per issue-active cycle on sm_80..sm_90, so `full` reports (which have
    # inst_issued but not issue_active) still give the accounting
    Concept("issue_active", "scheduler cycles that issued an instruction, summed over SMSPs",
            _same("smsp__issue_active.sum", "smsp__inst_issued.sum"), request=True),
    Concept("issue_active_per_cycle", "instructions issued per active scheduler cycle (at most 1)",
            _same("smsp__issue_active.avg.per_cycle_active"), request=True),
    Concept("warps_active_sum", "warp-cycles resident (active warps summed over cycles and SMSPs)",
            _same("smsp__warps_active.sum"), request=True),
    Concept("smsp_cycles_active_sum", "scheduler cycles with a warp resident, summed over SMSPs",
            _same("smsp__cycles_active.sum"), request=True),
    Concept("smsp_cycles_active_avg", "scheduler cycles with a warp resident, per SMSP",
            _same("smsp__cycles_active.avg"), request=True),
    Concept("sm_cycles_elapsed_avg", "cycles elapsed per SM (the kernel's duration in SM cycles)",
            _same("sm__cycles_elapsed.avg"), request=True),
    Concept("thread_inst_executed", "thread instructions executed (active lanes summed)",
            _same("smsp__thread_inst_executed.sum"), request=True),
    Concept("thread_inst_pred_on", "thread instructions executed with the predicate on",
            _same("smsp__thread_inst_executed_pred_on.sum"), request=True),
    Concept("thread_inst_xu", "thread instructions on the XU (MUFU: exp2, rcp, rsqrt, sin...) pipe",
            _same("smsp__thread_inst_executed_pipe_xu_pred_on.sum"), request=True),
    Concept("thread_inst_fp64", "thread instructions on the FP64 pipe",
            _same("smsp__thread_inst_executed_pipe_fp64_pred_on.sum"), request=True),
    *(
        Concept(f"warp_state_{reason}", f"warps in state '{reason}' per issue-active cycle",
                _per_cc(**{f"sm{cc.replace('.', '')}": (
                    f"smsp__average_warps_issue_stalled_{_WARP_STATE_SPELLING.get(reason, reason)}"
                    "_per_issue_active.ratio",) for cc in ccs}), request=True)
        for reason, ccs in _WARP_STATES.items()
    ),
    *(
        Concept(f"pipe_inst_{pipe}", f"warp instructions executed on the {text}", names, request=True)
        for pipe, (text, names) in _PIPES.items()
    ),
    # Source-counter metrics (SourceCounters section: `--set full`; not hardware counters, so not in
    # `--query-metrics` and not asked for by the `faprof` set): exact spill and excess counts.
    Concept(
        "spill_requests",
        "local-memory requests caused by register spills",
        _same("derived__local_spilling_requests"), provided_by=_FULL_SET,
    ),
    Concept(
        "spill_inst",
        "register-spilling instructions executed",
        _same("sass__inst_executed_register_spilling"), provided_by=_FULL_SET,
    ),
    Concept(
        "global_excessive_sectors",
        "global-memory sectors beyond the ideal for the accessed bytes",
        _same("derived__memory_l2_theoretical_sectors_global_excessive"), provided_by=_FULL_SET,
    ),
    Concept(
        "global_ideal_sectors",
        "ideal global-memory sectors",
        _same("memory_l2_theoretical_sectors_global_ideal"), provided_by=_FULL_SET,
    ),
    Concept(
        "smem_excessive_wavefronts",
        "shared-memory wavefronts beyond the ideal (bank conflicts, wide accesses)",
        _same("derived__memory_l1_wavefronts_shared_excessive"), provided_by=_FULL_SET,
    ),
    Concept(
        "smem_ideal_wavefronts", "ideal shared-memory wavefronts", _same("memory_l1_wavefronts_shared_ideal"), provided_by=_FULL_SET),
    Concept("replay_passes", "ncu replay passes for this kernel", _same("profiler__replayer_passes")),
    # ---- tensor pipes (ad102 has corrected `_v2` HMMA counters; Hopper adds the warp-group GMMA path)
    Concept(
        "tensor_util",
        "tensor pipes active, % of peak (every tensor instruction type)",
        _same("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
        request=True,
    ),
    Concept(
        "tensor_fp_util",
        "floating-point MMA tensor pipe active, % of peak (HMMA; on Hopper also HGMMA/QGMMA)",
        _per_cc(
            sm89=("sm__pipe_tensor_op_hmma_cycles_active_v2.avg.pct_of_peak_sustained_active",),
            sm90=(
                "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
            ),
            common=("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",),
        ),
        request=True,
    ),
    Concept(
        "tensor_hmma_inst",
        "warp-level HMMA instructions executed (mma.sync, wmma)",
        _per_cc(
            sm89=("sm__inst_executed_pipe_tensor_op_hmma_v2.sum",),
            common=("sm__inst_executed_pipe_tensor_op_hmma.sum",),
        ),
        request=True,
    ),
    # ptxas's register-move idiom HFMA2.MMA (zero operands) issues on the HMMA pipe and is counted
    # above: one per warp in tests/data/ncu's FFMA kernel. ga100 and gh100 count it separately.
    Concept(
        "tensor_hmma_hfma2_inst",
        "HFMA2.MMA instructions counted among the HMMA ones (register moves)",
        _per_cc(
            sm80=("sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum",),
            sm90=("sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum",),
        ),
        request=True,
    ),
    Concept(
        "tensor_gmma_inst",
        "warp-group GMMA instructions executed (Hopper wgmma)",
        _per_cc(sm90=("sm__inst_executed_pipe_tensor_op_gmma.sum",)),
        request=True,
    ),
    # Tensor FLOPs by source type: `sm__ops_path_tensor_src_*` count 2 FLOPs per multiply-add (checked
    # on an H100 with wmma: 528 warps x 64 x 16x16x16 MMAs read 276,824,064), HMMA and GMMA alike.
    *(
        Concept(f"tensor_ops_{k}", f"tensor-pipe FLOPs with {k} sources", names, request=True)
        for k, names in {
            "fp16": {
                **_same("sm__ops_path_tensor_src_fp16_dst_fp32.sum"),
                "9.0": ("sm__ops_path_tensor_src_fp16.sum",),
            },
            "fp16_acc16": _per_cc(
                sm80=("sm__ops_path_tensor_src_fp16_dst_fp16.sum",),
                sm86=("sm__ops_path_tensor_src_fp16_dst_fp16.sum",),
                sm89=("sm__ops_path_tensor_src_fp16_dst_fp16.sum",),
            ),
            "bf16": _same("sm__ops_path_tensor_src_bf16_dst_fp32.sum"),
            "tf32": _same("sm__ops_path_tensor_src_tf32_dst_fp32.sum"),
            "fp64": _same("sm__ops_path_tensor_src_fp64.sum"),
            "fp8": _per_cc(
                sm89=("sm__ops_path_tensor_src_fp8.sum",), sm90=("sm__ops_path_tensor_src_fp8.sum",)
            ),
        }.items()
    ),
    # ---- FLOP counters (SASS thread instructions with all predicates true)
    *(
        Concept(
            f"inst_{op}",
            f"{op.upper()} thread instructions executed (predicate on)",
            _same(
                f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum",
                f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum",
            ),
            request=True,
        )
        for op in _FLOP_OPS
    ),
    # ---- roofline peaks (constants per chip; asking for them costs no replay pass)
    Concept(
        "peak_ffma_per_cycle",
        "FFMA thread instructions per cycle at peak, whole GPU",
        _same("sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained"),
        request=True,
    ),
    Concept(
        "peak_dfma_per_cycle",
        "DFMA thread instructions per cycle at peak, whole GPU",
        _same("sm__sass_thread_inst_executed_op_dfma_pred_on.sum.peak_sustained"),
        request=True,
    ),
    Concept(
        "peak_hfma_per_cycle",
        "HFMA thread instructions per cycle at peak, whole GPU",
        _same("sm__sass_thread_inst_executed_op_hfma_pred_on.sum.peak_sustained"),
        request=True,
    ),
    Concept(
        "peak_dram_bytes_per_cycle",
        "DRAM bytes per DRAM cycle at peak",
        _same("dram__bytes.sum.peak_sustained"),
        request=True,
    ),
    # Dense (sparsity off) fp16-in fp32-accumulate tensor FLOPs per cycle, whole GPU. On Hopper the
    # warp-group path (wgmma) peaks 1.5x higher than warp-level mma.sync: 540,672 vs 360,448 per
    # cycle on an H100 SXM, so an mma.sync kernel's roof is the HMMA one.
    Concept(
        "peak_tensor_mma_per_cycle",
        "dense fp16 tensor FLOPs per cycle at peak, warp-level MMA (mma.sync)",
        _per_cc(
            sm90=("sm__ops_path_tensor_op_hmma_src_fp16_dst_fp32_sparsity_off.sum.peak_sustained",),
            common=("sm__ops_path_tensor_src_fp16_dst_fp32_sparsity_off.sum.peak_sustained",),
        ),
        request=True,
    ),
    Concept(
        "peak_tensor_gmma_per_cycle",
        "dense fp16 tensor FLOPs per cycle at peak, warp-group MMA (wgmma)",
        _per_cc(sm90=("sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum.peak_sustained",)),
        request=True,
    ),
]

#: Concept key -> Concept, every entry of the catalogue.
CATALOGUE: dict[str, Concept] = {c.key: c for c in _CONCEPTS}

#: FLOPs per SASS thread instruction when counting hardware FLOPs: an FMA is a multiply and an add.
FLOPS_PER_INST = {
    "fadd": 1,
    "fmul": 1,
    "ffma": 2,
    "hadd": 1,
    "hmul": 1,
    "hfma": 2,
    "dadd": 1,
    "dmul": 1,
    "dfma": 2,
}

#: Instruction families of each CUDA-core precision.
PRECISION_OPS = {
    "fp32": ("fadd", "fmul", "ffma"),
    "fp16": ("hadd", "hmul", "hfma"),
    "fp64": ("dadd", "dmul", "dfma"),
}

#: Dense FLOPs of one warp-level HMMA instruction of shape m16n8k16 (2*16*8*16), the shape
#: `mma.sync` and fp16/bf16 `wmma` 16x16x16 compile to on sm_80..sm_90 (one wmma = 2 HMMA).
#: Used only when a report has no tensor FLOP counter (see `hardware_flops`).
HMMA_16816_FLOPS = 2 * 16 * 8 * 16


def concept(key: str) -> Concept:
    """A catalogue entry by key (KeyError names the known keys)."""
    try:
        return CATALOGUE[key]
    except KeyError:
        raise KeyError(f"no metric concept {key!r}; known: {', '.join(sorted(CATALOGUE))}") from None


def names_for(key: str, cc: str | tuple[int, int] | None) -> tuple[str, ...]:
    """Metric names of a concept on a compute capability, in order of preference."""
    return concept(key).for_cc(cc)


def requested_metrics(cc: str | tuple[int, int] | None, available: Iterable[str] | None = None) -> list[str]:
    """Metrics faprof adds to ncu's section set (`--metrics`) on a compute capability.

    Args:
        cc: the GPU's compute capability.
        available: base metric names the chip has (`ncu --query-metrics`), to drop names it lacks;
            None keeps every catalogue name (ncu fails on a name the chip does not have).

    Returns:
        Full metric names (with rollup and suffix), sorted, without duplicates.
    """
    base = set(available) if available is not None else None
    out = set()
    for c in _CONCEPTS:
        if not c.request:
            continue
        for name in c.for_cc(cc):
            if base is None or base_name(name) in base:
                out.add(name)
                break
    return sorted(out)


_CATALOGUE_NAMES: frozenset[str] | None = None


def catalogue_metric_names() -> frozenset[str]:
    """Every metric name the catalogue knows, on every compute capability (what the reader keeps)."""
    global _CATALOGUE_NAMES
    if _CATALOGUE_NAMES is None:
        _CATALOGUE_NAMES = frozenset(n for c in _CONCEPTS for names in c.names.values() for n in names)
    return _CATALOGUE_NAMES


def base_name(metric: str) -> str:
    """The base metric name `ncu --query-metrics` lists: the part before the first '.'."""
    return metric.split(".", 1)[0]


# --------------------------------------------------------------------------------- stall reasons

@dataclass(frozen=True)
class Advice:
    """What a warp state or a pipe means, what it points to in a kernel, and what usually fixes it."""

    meaning: str
    points_to: str
    fix: str


#: Every warp state ncu reports (WarpStateStats, SourceCounters' PC sampling): the accounting splits
#: a kernel's warp cycles over these, and the advisor names them when they explain its time or a gap.
STALL_ADVICE: dict[str, Advice] = {
    "selected": Advice("issuing an instruction", "the instructions themselves",
                       "fewer instructions for the same work: tensor cores, wider loads, less index math"),
    "barrier": Advice("waiting at a block-wide barrier (__syncthreads, bar.sync) for sibling warps",
                      "barriers in the main loop, or warps of a block doing unequal work",
                      "fewer block-wide barriers per tile (double-buffer so one barrier covers a tile), "
                      "named barriers over the warps that need them, balanced warps"),
    "branch_resolving": Advice("waiting for a branch target to be computed", "divergent or indirect branches",
                               "fewer divergent branches: predication, uniform conditions"),
    "dispatch_stall": Advice("the dispatcher could not issue the selected instruction",
                             "pipe or register-file conflicts at dispatch", "rare; change the instruction mix"),
    "drain": Advice("waiting for memory stores to drain at exit", "many stores at the end of the kernel",
                    "normal at kernel end; spread the stores or write fewer bytes"),
    "imc_miss": Advice("waiting for an immediate constant cache miss",
                       "constants read with per-lane divergent addresses, or too many distinct constants",
                       "uniform constant-memory indexing; large tables in shared or global memory instead"),
    "lg_throttle": Advice("local/global memory instruction queue full", "many small global or local (spill) accesses",
                          "vectorized 16-byte or cp.async/TMA loads, fewer local-memory (spill) accesses"),
    "long_scoreboard": Advice("waiting on L1TEX (global, local, texture) data: memory latency",
                              "loads not issued early enough, spills, uncoalesced or dependent global accesses",
                              "prefetch the next tile (cp.async/TMA pipeline), keep more loads in flight, remove "
                              "spills, coalesce"),
    "math_pipe_throttle": Advice("the math pipe the instruction needs is busy",
                                 "a saturated pipe: fine for the tensor pipe; a slow pipe (fp64, MUFU) otherwise",
                                 "move the math to a faster pipe (tensor cores, fp32 instead of fp64, exp2 "
                                 "with folded scales)"),
    "membar": Advice("waiting on a memory fence (__threadfence, fence.*)", "fences in the loop",
                     "drop fences the algorithm does not need; one fence per tile, not per step"),
    "mio_throttle": Advice("memory input/output queue full (shared memory, special math, dynamic branches)",
                           "shared-memory traffic: bank conflicts, many narrow shared accesses",
                           "wider, fewer shared-memory accesses (ldmatrix, 16-byte); remove bank conflicts"),
    "misc": Advice("miscellaneous hardware reasons", "—", "see Nsight Compute's source view"),
    "no_instructions": Advice("instruction cache miss or no instruction fetched",
                              "very large unrolled code, or short kernels", "smaller unrolled code; fewer variants per kernel"),
    "not_selected": Advice("eligible, but another warp was selected", "a busy scheduler (issue-bound)",
                           "fewer instructions: the scheduler is the limit"),
    "short_scoreboard": Advice("waiting on MIO data: shared memory or special-function (MUFU) results",
                               "dependent shared-memory loads or MUFU results used at once",
                               "load shared operands earlier (ldmatrix into registers), fold scales into exp2"),
    "sleeping": Advice("all threads of the warp are sleeping (nanosleep) or yielded", "spin-waits, producer/consumer waits",
                       "balance producers and consumers; fewer spin-waits"),
    "tex_throttle": Advice("texture unit queue full", "many texture/global instructions through TEX",
                           "fewer, wider memory instructions"),
    "wait": Advice("fixed-latency dependency wait", "each instruction using the previous one's result at once (no ILP)",
                   "more independent instructions per warp: several accumulators, unrolled independent chains"),
    "gmma": Advice("waiting for warp-group MMA (wgmma) resources or results (Hopper)",
                   "wgmma issued back to back without overlap", "deeper wgmma pipelining, overlap softmax with wgmma"),
    "warpgroup_arrive": Advice("waiting at a warp-group arrive/wait (wgmma fence, Hopper)", "wgmma fences",
                               "balanced warp groups; fewer fences"),
    "tmem": Advice("waiting on tensor memory (Blackwell)", "tensor-memory traffic", "see Nsight Compute"),
}

#: Warp stall reasons and what each means (STALL_ADVICE's meanings, kept for the readers of names).
STALL_REASONS = {k: v.meaning for k, v in STALL_ADVICE.items() if k != "selected"}

#: Every pipe of the accounting: what its instructions are, what more of them points to, the fix.
PIPE_ADVICE: dict[str, Advice] = {
    "tensor_hmma": Advice("warp-level tensor-core MMA (mma.sync, wmma: HMMA)",
                          "warp-level MMA where warp-group MMA would do the same work in far fewer instructions",
                          "on Hopper use wgmma (warp-group MMA with TMA-fed shared memory)"),
    "tensor_gmma": Advice("warp-group tensor-core MMA (wgmma: GMMA)", "more tensor work", "skip masked tiles"),
    "tensor_imma": Advice("integer tensor-core MMA (IMMA)", "integer MMA", "—"),
    "tensor_dmma": Advice("fp64 tensor-core MMA (DMMA)", "fp64 matrix math", "compute in fp16/bf16/fp32 as the problem needs"),
    "fma": Advice("fp32 FMA-pipe instructions (FFMA, FADD, FMUL, IMAD)",
                  "math on CUDA cores (matrix products not on tensor cores), or integer multiply-adds of index math",
                  "do QKᵀ and PV on tensor cores; hoist index math out of the loop"),
    "fp16": Advice("fp16 CUDA-core instructions (HFMA2, HADD2)", "fp16 math on CUDA cores",
                   "tensor cores for the matrix products"),
    "fp64": Advice("fp64 instructions (DFMA, DADD, DMUL)", "double-precision math in a kernel that does not need it",
                   "compute in fp32 (fp64 runs at a small fraction of the fp32 rate)"),
    "alu": Advice("ALU instructions (integer, logic, compares, min/max, conversions)",
                  "index and address arithmetic, masking, comparisons per element",
                  "hoist index math out of inner loops, strength-reduce divisions and modulos, fewer conversions"),
    "xu": Advice("XU/MUFU instructions (exp2, lg2, rcp, rsqrt, sin; some conversions)",
                 "transcendentals per score (expf, powf, divisions) beyond one exp2",
                 "one exp2 per score with log2(e) folded into the scale; multiply by a reciprocal"),
    "lsu": Advice("LSU instructions (shared, local and global loads/stores, ldmatrix)",
                  "operands reloaded through shared memory, narrow accesses, spills",
                  "keep reused operands in registers, 16-byte accesses, wgmma reading shared memory directly"),
    "adu": Advice("ADU instructions (address divergence, indirect branch targets)", "divergent addressing",
                  "uniform addressing"),
    "cbu": Advice("CBU instructions (branches, barriers, warp synchronization)", "many branches or barriers per tile",
                  "fewer branches and barriers in the main loop"),
    "uniform": Advice("uniform-datapath instructions (warp-uniform integer work)", "warp-uniform bookkeeping",
                      "—"),
    "tex": Advice("TEX-pipe instructions", "texture or some global loads", "—"),
    "ipa": Advice("IPA instructions (interpolation)", "—", "—"),
    "tma": Advice("TMA issue (cp.async.bulk.tensor)", "bulk tensor copies", "—"),
    "other": Advice("instructions no pipe counter claims (NOPs, moves, ...)", "—", "—"),
}

#: Spellings that differ between metric families: warp-state metrics say `no_instruction`,
#: PC sampling `no_instructions`.
_REASON_ALIASES = {"no_instruction": "no_instructions"}

#: Reasons that are not stalls and stay out of the stall-cycle total: 'selected' is the cycle a
#: warp issued an instruction.
NOT_A_STALL = ("selected",)

#: Warp-state sampling metrics (WarpStateStats): average stall cycles per issued instruction.
_WARP_STATE_RE = re.compile(
    r"^smsp__average_warps_issue_stalled_(?P<reason>[a-z0-9_]+?)_per_issue_active(?:\.ratio)?$"
)
#: Average warp latency per reason (a newer family, same meaning per warp rather than per issue).
_WARP_LATENCY_RE = re.compile(
    r"^smsp__average_warp_latency_issue_stalled_(?P<reason>[a-z0-9_]+?)(?:\.ratio|\.sum|\.avg)?$"
)
#: PC-sampling metrics (SourceCounters, `--set full`): samples per reason.
_PC_SAMPLING_RE = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(?P<reason>[a-z0-9_]+?)(?:\.sum|\.avg)?$")

STALL_SOURCES = {
    "warp_state": "WarpStateStats: stall cycles per issued instruction (--set full)",
    "warp_latency": "average warp latency per stall reason (when a section collects it)",
    "pc_sampling": "SourceCounters: program-counter samples per reason (--set detailed/full)",
}


def stall_metric(name: str) -> tuple[str, str] | None:
    """(source, reason) when `name` is a per-reason stall metric, else None."""
    if name.endswith("_not_issued") or name.split(".")[0].endswith("_not_issued"):
        return None
    for source, regex in (
        ("warp_state", _WARP_STATE_RE),
        ("warp_latency", _WARP_LATENCY_RE),
        ("pc_sampling", _PC_SAMPLING_RE),
    ):
        m = regex.match(name)
        if m:
            reason = m.group("reason")
            return source, _REASON_ALIASES.get(reason, reason)
    return None


# ----------------------------------------------------------------------------------------- units

_PREFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_PREFIXABLE = ("second", "byte", "hz", "Hz", "cycle", "inst", "sector", "warp")
#: Short spellings ncu_report uses ("ns" for gpu__time_duration, "byte/s", "hz").
_ALIASES = {
    "ns": (1e-9, "second"),
    "us": (1e-6, "second"),
    "ms": (1e-3, "second"),
    "s": (1.0, "second"),
    "Hz": (1.0, "hz"),
    "KHz": (1e3, "hz"),
    "MHz": (1e6, "hz"),
    "GHz": (1e9, "hz"),
}


def _unit_part(part: str) -> tuple[float, str]:
    if part in _ALIASES:
        return _ALIASES[part]
    if part in _PREFIXABLE:
        return 1.0, part
    if len(part) > 1 and part[0] in _PREFIXES and part[1:] in _PREFIXABLE:
        return _PREFIXES[part[0]], part[1:]
    return 1.0, part


def unit_scale(unit: str | None) -> tuple[float, str]:
    """Factor to multiply a value by to express it in base units, and the base unit.

    "ns" and "nsecond" -> (1e-9, "second"); "Gbyte/second" -> (1e9, "byte/second"); "byte/s" ->
    (1, "byte/second"); "cycle/nsecond" -> (1e9, "cycle/second"); "Kbyte/block" -> (1e3,
    "byte/block"); "%" -> (1, "%"). Decimal prefixes, as ncu uses them.
    """
    if not unit:
        return 1.0, ""
    parts = unit.split("/")
    factor, base = _unit_part(parts[0])
    names = [base]
    for p in parts[1:]:
        f, b = _unit_part(p)
        factor /= f
        names.append(b)
    return factor, "/".join(names)
