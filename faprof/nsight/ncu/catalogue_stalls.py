"""Warp stall reasons and issue pipes: what each means and fixes (advice), and which metrics carry stalls.

Part of the catalogue (`faprof.nsight.ncu.catalogue`); import these names from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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
    "fma": Advice("fp32 FMA-pipe instructions (FFMA, FADD, FMUL; with IMAD where the report lacks the fp32 counters)",
                  "math on CUDA cores (matrix products not on tensor cores)",
                  "do QKᵀ and PV on tensor cores"),
    "fma_int": Advice("integer multiply-adds on the FMA pipe (IMAD, IMUL, IMAD.WIDE: the FMA pipe's instructions "
                      "beyond the fp32 FFMA/FADD/FMUL counts)",
                      "index and address arithmetic per element (row x stride, 64-bit offsets)",
                      "hoist index math out of the inner loop, advance pointers by a constant stride, 32-bit offsets"),
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
    "uniform": Advice("uniform-datapath instructions (warp-uniform integer work)",
                      "warp-uniform bookkeeping: tile indices, addresses and wgmma/TMA descriptors rebuilt per iteration",
                      "hoist loop-invariant index and descriptor arithmetic out of the main loop and advance "
                      "addresses or descriptors by a constant per tile"),
    "tex": Advice("TEX-pipe instructions", "texture or some global loads",
                  "cp.async or TMA for tiles that are reused from shared memory"),
    "ipa": Advice("IPA instructions (interpolation)", "—", "—"),
    "tma": Advice("TMA issue (cp.async.bulk.tensor)", "bulk tensor copies",
                  "fewer, larger TMA boxes per tile, issued by one thread"),
    "other": Advice("instructions no pipe counter claims (NOPs, moves, ...)",
                    "register moves around fragments (layout conversions) or padding NOPs",
                    "fragment layouts that feed the next MMA directly (no shuffles or moves between them)"),
}

#: The CUDA-core math pipes' advice when the kernel already runs its matrix products on tensor cores
#: (faprof.advisor.roles.products_on_tensor_cores): more of their instructions is then element-wise work per
#: score, not matrix products, and PIPE_ADVICE's "do the products on tensor cores" would be the wrong fix.
PIPE_ADVICE_PRODUCTS_ON_TENSOR_CORES: dict[str, Advice] = {
    pipe: Advice(
        PIPE_ADVICE[pipe].meaning,
        "element-wise work per score beside tensor-core products: the softmax (scale, row max, exp2 argument, "
        "row sums), the output rescale each key tile (more of them with smaller key tiles), a mask or score "
        "modifier evaluated per element, conversions",
        "fewer CUDA-core instructions per score: fold the softmax scale and log2(e) into the one FFMA feeding "
        "exp2, rescale the accumulator once per key tile (larger key tiles: fewer rescales), evaluate a mask only "
        "in the tiles it cuts (whole tiles unmasked, empty tiles skipped)")
    for pipe in ("fma", "fp16")
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

