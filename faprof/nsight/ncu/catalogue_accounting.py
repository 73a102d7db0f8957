"""Metric catalogue entries, part 2: the warp-state and pipe accounting, tensor pipes, FLOPs, roofline peaks.

Also the source counters the `full` set provides.

Part of `faprof.nsight.ncu.catalogue` (import that, not this module), which joins
`catalogue_memory.CONCEPTS` and this list in this order.
"""

from __future__ import annotations

from collections.abc import Sequence

from faprof.nsight.ncu.catalogue_core import Concept, _per_cc, _same

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



#: The catalogue's entries after `catalogue_memory.CONCEPTS`, in catalogue order.
CONCEPTS: list[Concept] = [
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
