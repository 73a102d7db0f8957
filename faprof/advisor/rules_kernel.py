"""Rules about one kernel launch, from its Nsight Compute counters.

Each rule takes (launch, call, ctx) and returns a Finding or None. The estimated gain is the
launch's share of the call's profiled GPU time times the share of the kernel's time the cause
accounts for (the part of a unit's work the defect adds x how busy that unit is, or the gap to a
roof). Every finding quotes the counters it rests on; none looks at kernel or variant names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faprof.advisor.accounting import WARP_SIZE, launch_account
from faprof.advisor.evidence import Call, Launch, nansum, ok
from faprof.advisor.findings import (
    LIMITER_ADVICE,
    STALL_ADVICE,
    Finding,
    big,
    num,
    pct_of_share,
    split_kv_fix,
)
from faprof.advisor.qk_pairs import row_pairs
from faprof.advisor.roles import exact_flops, executed_flops, math_share
from faprof.advisor.rules_code import dependent_global_loads, global_atomics, per_score_text, sass_per_score
from faprof.advisor.thresholds import value as T
from faprof.model import gpus
from faprof.model.values import as_float
from faprof.nsight.ncu import catalogue_stalls


@dataclass
class Context:
    """What rules share besides the launch and the call."""

    env: dict[str, Any] = field(default_factory=dict)
    split_launches: set[int] = field(default_factory=set)  # kernel_ids covered by a launch_split finding
    lines: Any = None
    """The bundle's source rows (`faprof.advisor.sources.borrow`'s), for rules that read the SASS
    (`faprof.advisor.rules_code`); None without a source pass."""
    code: dict = field(default_factory=dict)
    """Kernels parsed from `lines`, by (variant, shape, kernel), kept across rules."""
    demangled: dict = field(default_factory=dict)
    """(variant, shape_id, kernel) -> the launch's full demangled name: which profiled shape ran the same
    template instantiation (the same SASS) as a shape the source pass did not profile."""


def _busy_memory(lz: Launch) -> float:
    """How much memory latency or throughput limits the kernel, 0..1: the larger of the memory
    throughput (% of peak) and the share of stalls waiting on L1TEX (long_scoreboard, lg_throttle)."""
    mem = lz.col("memory_throughput_pct") / 100
    stall = lz.stall_share("long_scoreboard", "lg_throttle")
    vals = [v for v in (mem, stall) if ok(v)]
    return min(1.0, max(vals)) if vals else 0.5


def _stall_text(lz: Launch, n: int = 3) -> str:
    top = [(r, s) for r, s in lz.stalls[:n] if s >= T("STALL_SHARE")] or lz.stalls[:1]
    return ", ".join(f"{r} {pct_of_share(s)}" for r, s in top)


def _f(call: Call, lz: Launch, cause: str, gain: float, evidence: str, fix: str, rule: str) -> Finding:
    return Finding(call.variant, call.shape_id, cause, gain, evidence, fix, rule, kernel=lz.kernel)


def _share_text(lz: Launch) -> str:
    return f"{pct_of_share(lz.share)} of the call's kernel time"


# ------------------------------------------------------------------------------------ memory
def register_spills(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Local-memory (spill) traffic as a share of the kernel's L1 traffic: local sectors x 32 B
    against global sectors x 32 B plus shared wavefronts x 128 B (bytes, so that one 4-byte spill
    is not weighed like a 512-byte ldmatrix); instruction counts when sectors were not collected."""
    spill = lz.metric("spill_requests")
    source = "spill requests (derived__local_spilling_requests)"
    if not ok(spill):
        spill = nansum(lz.metric("local_ld_inst"), lz.metric("local_st_inst"))
        source = "local-memory instructions"
    local = nansum(lz.metric("local_ld_sectors"), lz.metric("local_st_sectors"))
    if not (ok(spill) and spill > 0) and not (ok(local) and local > 0):
        return None
    shared = lz.metric("smem_wavefronts")
    if not ok(shared):
        shared = nansum(lz.metric("smem_wavefronts_ld"), lz.metric("smem_wavefronts_st"))
    glob = nansum(lz.metric("global_ld_sectors"), lz.metric("global_st_sectors"),
                  lz.metric("global_ldgsts_sectors_bypass"), lz.metric("global_ldgsts_sectors_access"))
    if ok(local) and local > 0 and (ok(shared) or ok(glob)):
        other = 32 * (glob if ok(glob) else 0.0) + 128 * (shared if ok(shared) else 0.0)
        share = 32 * local / (32 * local + other)
        what = f"{big(local)} local-memory sectors = {pct_of_share(share)} of the kernel's L1 bytes (global sectors, shared wavefronts)"
    else:
        mem = nansum(spill, lz.metric("global_ld_requests"), lz.metric("global_st_requests"),
                     lz.metric("global_ldgsts_requests"), lz.metric("smem_inst_ld"), lz.metric("smem_inst_st"))
        share = spill / mem if ok(mem) and mem > 0 else math.nan
        what = f"{pct_of_share(share)} of the kernel's memory instructions"
    if not ok(share) or share < T("SPILL_MIN_SHARE"):
        return None
    busy = _busy_memory(lz)
    regs = lz.col("registers_per_thread")
    ev = ((f"{big(spill)} {source}; " if ok(spill) and spill > 0 else "") + what
          + f"; {num(regs, '.0f')} registers/thread; memory/L1TEX pressure {pct_of_share(busy)}"
          + (f" (stalls: {_stall_text(lz)})" if lz.stalls else "") + f"; {_share_text(lz)}")
    fix = ("keep fewer values live per thread (smaller per-thread tiles or accumulators, no dynamically indexed "
           "local arrays) or loosen the register cap (__launch_bounds__ min blocks, -maxrregcount)")
    return _f(call, lz, "register_spills", lz.share * share * busy, ev, fix, "register_spills")


def uncoalesced_global(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Global sectors beyond what the accessed bytes need (ncu's excessive-sector analysis)."""
    sectors = nansum(lz.metric("global_ld_sectors"), lz.metric("global_st_sectors"))
    excess = lz.metric("global_excessive_sectors")
    bps = lz.metric("global_ld_bytes_per_sector")
    requests = lz.metric("global_ld_requests")
    if ok(excess) and ok(sectors) and sectors > 0:
        share = min(1.0, excess / sectors)
        how = f"{big(excess)} of {big(sectors)} global sectors are excessive (ncu's theoretical-sector analysis)"
    elif ok(bps) and bps > 0:
        share = max(0.0, 1 - bps / 32)
        how = f"global loads use {bps:.1f} of each sector's 32 bytes"
    elif ok(requests) and requests > 0 and ok(sectors):
        spr = sectors / requests
        limit = T("UNCOALESCED_MAX_SECTORS_PER_REQUEST")
        share = 1 - limit / spr if spr > limit else 0.0
        how = f"{spr:.1f} sectors per global load request (at most {limit:.0f} for any coalesced access)"
    else:
        return None
    # The waste is a share of the sectors plain loads and stores move; cp.async (LDGSTS) moves its own,
    # coalesced or not, and those count in the traffic the waste is a share of (a decode kernel whose
    # 4-byte block-table loads use one sector in eight while cp.async streams the K/V cache wastes
    # almost nothing of its traffic).
    async_sectors = nansum(lz.metric("global_ldgsts_sectors_bypass"), lz.metric("global_ldgsts_sectors_access"))
    async_text = ""
    if ok(async_sectors) and async_sectors > 0 and ok(sectors) and sectors > 0:
        plain = sectors / (sectors + async_sectors)
        share *= plain
        async_text = f"; plain loads/stores move {pct_of_share(plain)} of the global sectors (cp.async the rest)"
    if share < T("UNCOALESCED_MIN_SHARE"):
        return None
    busy = _busy_memory(lz)
    spr_text = f"; {sectors / requests:.1f} sectors per load request" if ok(requests) and requests > 0 and ok(sectors) else ""
    ev = (f"{how}{async_text} ({pct_of_share(share)} of the global sectors){spr_text}; memory pressure {pct_of_share(busy)}"
          + (f" (stalls: {_stall_text(lz)})" if lz.stalls else "") + f"; {_share_text(lz)}")
    fix = ("let consecutive lanes read consecutive 16-byte chunks of a row (one warp = whole 128-byte lines), "
           "vectorize to 16 bytes per thread, or stage tiles with cp.async/TMA")
    return _f(call, lz, "uncoalesced_global", lz.share * share * busy, ev, fix, "uncoalesced_global")


def smem_bank_conflicts(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Excessive shared-memory wavefronts (beyond the ideal) from ncu's source counters; where the
    section set has none (the `faprof` set), the bank-conflict counters over the wavefronts, the
    ratio Nsight Compute's own SharedMemoryConflicts rule reads (it counts arbitration conflicts too,
    so the threshold is the same 10% ncu uses)."""
    excess = lz.metric("smem_excessive_wavefronts")
    total = lz.metric("smem_wavefronts")
    ld_w, st_w = lz.metric("smem_wavefronts_ld"), lz.metric("smem_wavefronts_st")
    if not ok(total):
        total = nansum(ld_w, st_w)
    source = "derived__memory_l1_wavefronts_shared_excessive"
    if not ok(excess):
        conflicts = nansum(lz.metric("smem_bank_conflicts_ld"), lz.metric("smem_bank_conflicts_st"))
        if not ok(conflicts) or not ok(ld_w) and not ok(st_w):
            return None
        excess, total = conflicts, nansum(ld_w, st_w)
        source = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld/st over the shared wavefronts"
    if not ok(excess) or not ok(total) or total <= 0:
        return None
    share = min(1.0, excess / total)
    if share < T("SMEM_EXCESS_MIN_SHARE"):
        return None
    util = lz.metric("smem_pipe_util") / 100
    stall = lz.stall_share("mio_throttle", "short_scoreboard")
    busy_vals = [v for v in (util, stall) if ok(v)]
    busy = min(1.0, max(busy_vals)) if busy_vals else 0.5
    kind = "excessive" if source.startswith("derived") else "bank-conflict"
    ev = (f"{big(excess)} of {big(total)} shared-memory wavefronts are {kind} ({pct_of_share(share)}; "
          f"{source}); shared pipe {pct_of_share(util)} busy"
          + (f", stalls: {_stall_text(lz)}" if lz.stalls else "") + f"; {_share_text(lz)}")
    fix = "XOR-swizzle (or pad) shared-memory rows so the 8 rows of an ldmatrix / a warp's accesses fall in distinct banks"
    return _f(call, lz, "smem_bank_conflicts", lz.share * share * busy, ev, fix, "smem_bank_conflicts")


# ----------------------------------------------------------------------------------- compute
def _tensor_over_fma(lz: Launch, ctx: Context, dtype: str) -> tuple[float, str]:
    """Peak tensor FLOP/s over peak fp32 FMA FLOP/s: from ncu's peaks, else the GPU database."""
    ffma, tensor = lz.metric("peak_ffma_per_cycle"), lz.metric("peak_tensor_mma_per_cycle")
    if ok(ffma) and ok(tensor) and ffma > 0:
        return tensor / (2 * ffma), "ncu peak_sustained"
    name = ctx.env.get("gpu_name")
    if name:

        spec = gpus.lookup(name)
        if spec is not None:
            t, _ = gpus.peak_tflops(spec, dtype, "tensor")
            f, _ = gpus.peak_tflops(spec, "fp32", "cuda_core")
            if t and f:
                return t / f, "GPU database"
    return T("TENSOR_OVER_FMA_DEFAULT"), "default"


def tensor_cores_unused(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """fp16/bf16 attention whose matrix products run as CUDA-core multiply-adds while the tensor
    pipes idle: the FLOPs the problem needs ran on the wrong pipe (not extra work).

    Evidence, in order of preference: FLOP counters (tensor FLOPs under TENSOR_MIN_FLOP_SHARE of the
    exact FLOPs while CUDA-core FLOPs carry at least CUDA_CORE_MATH_SHARE of them), else the pipes'
    utilization (tensor idle, FMA busy)."""
    if call.dtype not in ("fp16", "bf16") or math_share(call, lz) < T("MATH_KERNEL_MIN_SHARE"):
        return None  # a kernel beside the products (a combine, a softmax) does none of them, on any pipe
    cuda_flops = nansum(lz.col("fp32_flops"), lz.col("fp16_flops"))
    tflops = lz.col("tensor_flops")
    exact = exact_flops(call, lz)
    fma = lz.metric("fma_pipe_util")
    busy = fma / 100 if ok(fma) else lz.col("sm_throughput_pct") / 100
    if ok(exact) and exact > 0 and ok(tflops) and ok(cuda_flops):
        if tflops >= T("TENSOR_MIN_FLOP_SHARE") * exact or cuda_flops < T("CUDA_CORE_MATH_SHARE") * exact:
            return None
        how = (f"{big(cuda_flops)} CUDA-core FLOPs and {big(tflops)} tensor FLOPs for this kernel's "
               f"{big(exact)} exact FLOPs ({cuda_flops / exact:.2f}x of them on CUDA cores)")
    else:
        tensor = lz.col("tensor_pipe_util_pct")
        if not ok(tensor):
            tensor = lz.col("tensor_fp_util_pct")
        if not (ok(tensor) and tensor < T("TENSOR_IDLE_PCT")) or not ok(busy) or 100 * busy < T("FMA_BUSY_PCT"):
            return None
        how = f"tensor pipes {num(tensor, '.1f')}% active while the FMA pipe is {pct_of_share(busy)} busy"
    ratio, src = _tensor_over_fma(lz, ctx, call.dtype)
    ev = (f"{call.dtype} problem; {how}; FMA pipe {pct_of_share(busy)} busy; tensor peak is {ratio:.1f}x the fp32 FMA "
          f"peak ({src}); {_share_text(lz)}")
    fix = "do QKᵀ and PV with tensor-core MMA (mma.sync/wgmma, or wmma) on fp16/bf16 operands with fp32 accumulation"
    b = min(1.0, busy) if ok(busy) else 1.0
    gain = lz.share * b * (1 - 1 / ratio) if ratio > 1 else 0.0
    return _f(call, lz, "tensor_cores_unused", gain, ev, fix, "tensor_cores_unused")


def fp64_arithmetic(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Double-precision math in a kernel whose problem is not fp64: the FP64 pipe runs at a fraction
    of the fp32 rate (1/2 on an H100 SXM, 1/64 on consumer parts), so a little of it costs a lot."""
    if call.dtype in (None, "fp64"):
        return None
    fp64 = lz.metric("thread_inst_fp64")
    total = lz.metric("thread_inst_executed")
    flops64 = lz.col("fp64_flops")
    if not (ok(fp64) and ok(total) and total > 0) or fp64 < T("FP64_MIN_INST_SHARE") * total:
        return None
    acc = launch_account(call, lz)
    stalled = nansum(acc.state_share("math_pipe_throttle"), acc.state_share("wait")) if acc else math.nan
    pipe_share = acc.pipe_share("fp64") if acc else math.nan
    gain = lz.share * (stalled if ok(stalled) else min(1.0, 8 * fp64 / total))
    ev = (f"{call.dtype} problem; {big(fp64)} fp64 thread instructions = {pct_of_share(fp64 / total, '.1f')} of all "
          + (f"({pct_of_share(pipe_share, '.1f')} of warp instructions on the FP64 pipe)" if ok(pipe_share) else "")
          + (f", {big(flops64)} fp64 FLOPs" if ok(flops64) and flops64 > 0 else "")
          + (f"; warps stalled on math-pipe throttle and fixed-latency waits {pct_of_share(stalled)} of cycles" if ok(stalled) else "")
          + f"; {_share_text(lz)}")
    fix = "compute in fp32 (accumulators, softmax statistics): fp32 keeps attention's accuracy at a fraction of fp64's cost"
    return _f(call, lz, "fp64_arithmetic", gain, ev, fix, "fp64_arithmetic")


def transcendentals(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Special functions beyond one exp2 per score: accurate expf/powf, or a division per score (MUFU on the
    XU pipe, plus the FMA-pipe range reduction and Newton steps of the accurate forms). One exp2 per
    computed score is the minimum of a softmax; the rest is avoidable (log2(e) folded into the scale,
    the division by the row sum done once per row at the end)."""
    xu = lz.metric("thread_inst_xu")
    scores = _computed_scores(call, lz)
    if not (ok(xu) and ok(scores) and scores > 0):
        return None
    per = xu / scores
    mix = sass_per_score(lz, call, ctx, per)  # by MUFU function and divisions, where the SASS was sampled
    divides = mix is not None and mix["division"] >= T("DIV_PER_SCORE_MAX")
    if per < T("XU_PER_SCORE_MAX") and not divides:
        return None
    acc = launch_account(call, lz)
    xu_share = acc.pipe_share("xu") if acc else math.nan
    # the excess XU instructions' issue time (MUFU runs at 1/XU_ISSUE_COST the FMA pipe's rate); a division
    # per score costs its MUFU.RCP and about as many FMA-pipe fixups again
    excess = max(1 - 1 / per, mix["division"] / per if mix is not None and divides and per > 0 else 0.0)
    gain = lz.share * min(1.0, excess * (xu_share if ok(xu_share) else 0.1) * T("XU_ISSUE_COST"))
    pairs = row_pairs(call.measurement, int(T("WASTED_WORK_TILE")))  # the exact count (pairs[0]) at any tile; this one is cached
    h = as_float(call.problem("H"))
    need = (f" ({big(h * pairs[0])} scores unmasked in the problem, {big(scores)} computed)"
            if pairs is not None and ok(h) else "")
    ev = (f"{num(per, '.2f')} XU (MUFU) thread instructions per computed score{need}, where one exp2 per score "
          f"is the minimum and a division none (one reciprocal per row, at the end)"
          + (f": {per_score_text(mix)}" if mix is not None else
             ": accurate expf/powf, a division per score, or the same score's exp2 computed by several threads")
          + f"; XU {pct_of_share(xu_share)} of the warp instructions; {_share_text(lz)}")
    fix = ("one exp2 per score, computed once (not by every thread that needs it), with log2(e) folded into the "
           "softmax scale (exp2f / ex2.approx); no per-score division (multiply by the row sum's reciprocal once "
           "per row, at the end)")
    return _f(call, lz, "transcendentals", min(1.0, gain), ev, fix, "transcendentals")


def _computed_scores(call: Call, lz: Launch) -> float:
    """Scores (query-key pairs) the launch computed. A kernel doing the products (at least
    MATH_KERNEL_MIN_SHARE of the problem's FLOPs): its executed FLOPs over the 4·D FLOPs of a score's two
    products (QKᵀ and PV), padded rows and tiles included, as it computes an exp2 for each. Otherwise, or
    where FLOPs were not counted: the problem's pairs with whole WASTED_WORK_TILE tiles (its mask, every sequence),
    times the launch's share of the problem's FLOPs (`faprof.advisor.roles.math_share`) for a kernel doing
    products, whole for one beside them (a softmax kernel processes every score without their FLOPs)."""
    d = as_float(call.problem("D"))
    done = executed_flops(lz)
    share = math_share(call, lz)
    products = share >= T("MATH_KERNEL_MIN_SHARE")
    if products and ok(done) and done > 0 and ok(d) and d > 0:
        return done / (4 * d)
    counted = row_pairs(call.measurement, int(T("WASTED_WORK_TILE")))  # every sequence, the problem's mask
    try:
        h = int(call.problem("H"))
    except (TypeError, ValueError):
        return math.nan
    return h * counted[1] * (share if products else 1.0) if counted is not None else math.nan


def thread_divergence(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Few active lanes per executed warp instruction: a warp runs both sides of lane-dependent branches
    (or keeps most lanes idle), so the same work takes more instructions."""
    acc = launch_account(call, lz)
    lanes = acc.active_lanes if acc else lz.metric("thread_inst_executed") / lz.metric("inst_executed")
    if not ok(lanes) or lanes >= T("DIVERGENCE_MAX_LANES"):
        return None
    util = acc.issue_util if acc and ok(acc.issue_util) else 1.0
    gain = lz.share * (1 - lanes / WARP_SIZE) * max(util, T("DIVERGENCE_MIN_WEIGHT"))
    ev = (f"{num(lanes, '.1f')} of 32 lanes active per executed warp instruction; scheduler issuing "
          f"{pct_of_share(util)} of cycles; {_share_text(lz)}")
    fix = ("keep a warp's 32 lanes on one path: no lane-dependent branches in the inner loop, whole rows or tiles per "
           "warp, work spread over lanes rather than over iterations")
    return _f(call, lz, "lanes:inactive", gain, ev, fix, "thread_divergence")


def stall_terms(lz: Launch, call: Call, ctx: Context) -> list[Finding]:
    """The accounting's stall reasons as causes: a reason holding at least STALL_TERM_MIN_SHARE of the
    kernel's warp cycles is a finding, its gain that share of the cycles times the scheduler's idle
    share (stalls cost time only when no other warp can issue) times the kernel's share of the call."""
    acc = launch_account(call, lz)
    if acc is None:
        return []
    idle_issue = 1 - acc.issue_util if ok(acc.issue_util) else 1.0
    out = []
    for state in acc.warp_cycles:
        if state in ("selected", "not_selected"):
            continue
        share = acc.state_share(state)
        if not ok(share) or share < T("STALL_TERM_MIN_SHARE"):
            continue
        advice = catalogue_stalls.STALL_ADVICE.get(state)
        cpi = acc.warp_cycles[state] / acc.inst if acc.inst > 0 else math.nan
        ev = (f"{pct_of_share(share)} of the kernel's warp cycles ({num(cpi)} cycles per instruction"
              + (f": {advice.meaning}" if advice else "") + f"); the schedulers issue {pct_of_share(acc.issue_util)} of cycles; "
              + _share_text(lz))
        fix = f"{advice.fix} (points to: {advice.points_to})" if advice else "see Nsight Compute's source view"
        out.append(_f(call, lz, f"stall:{state}", lz.share * share * idle_issue, ev, fix, "stall_terms"))
    return out


def mma_sync_on_hopper(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Warp-level HMMA (mma.sync/wmma) on sm_90, where warp-group MMA has a 1.5x higher roof."""
    if not (lz.cc or "").startswith("9."):
        return None
    hmma, gmma = lz.col("tensor_hmma_inst"), lz.col("tensor_gmma_inst")
    moves = lz.metric("tensor_hmma_hfma2_inst")
    real = hmma - moves if ok(moves) else hmma
    util = lz.metric("hmma_pipe_util")
    if not ok(util):
        util = lz.col("tensor_fp_util_pct")
    if not (ok(real) and real > 0 and ok(gmma) and gmma == 0 and ok(util)) or util < T("HOPPER_MMA_MIN_UTIL_PCT"):
        return None
    r = T("HOPPER_WGMMA_OVER_MMA")
    ev = (f"sm_{(lz.cc or '').replace('.', '')}: {big(real)} warp-level HMMA instructions, 0 GMMA; HMMA pipe {util:.0f}% "
          f"of its peak, whose roof is 1/{r:g} of wgmma's; {_share_text(lz)}")
    fix = "on Hopper use warp-group MMA (wgmma.mma_async with TMA-fed shared memory), as FlashAttention-3 does"
    return _f(call, lz, "mma_sync_on_hopper", lz.share * (1 - 1 / r) * util / 100, ev, fix, "mma_sync_on_hopper")


def tf32_emulation(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """fp32 attention computed with TF32 tensor products (3xTF32): recognised, not wasted work."""
    tf32 = lz.metric("tensor_ops_tf32")
    if call.dtype != "fp32" or not ok(tf32) or tf32 <= 0:
        return None
    exact = exact_flops(call, lz)
    ratio = f" = {tf32 / exact:.1f}x this kernel's share of the exact FLOPs" if ok(exact) and exact > 0 else ""
    ev = (f"fp32 problem, {big(tf32)} TF32 tensor FLOPs{ratio}: fp32 accuracy from {T('TF32_PRODUCTS'):.0f} TF32 "
          f"products per product, so hardware FLOPs exceed the exact count by design")
    return _f(call, lz, "tf32_emulation", math.nan, ev, "none needed: this is how the kernel keeps fp32 accuracy on tensor cores",
              "tf32_emulation")


# ------------------------------------------------------------------------------- parallelism
def too_few_ctas(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """A grid with fewer blocks than SMs: the idle SMs' share of the kernel's time. On a memory-bound
    problem (decode: a few queries against a long KV cache) the evidence adds the bandwidth the call
    achieved against the measured copy ceiling, and the fix is to split the KV sequence over blocks."""
    grid, sms = lz.grid, lz.sms
    if not (ok(grid) and ok(sms)) or lz.kernel_id in ctx.split_launches:
        return None
    if grid >= T("TOO_FEW_CTAS_PER_SM") * sms:
        return None
    ev = (f"grid of {grid:.0f} blocks on {sms:.0f} SMs: {sms - grid:.0f} SMs idle for the whole kernel "
          f"({pct_of_share(grid / sms)} of the SMs busy); {_share_text(lz)}")
    fix = ("put more blocks in the grid: a block per query tile per head (FA2's grid), smaller query tiles, or "
           "split the key loop over blocks (split-KV, as flash-decoding) when B·H·Sq is small")
    if call.problem("bound") == "memory":
        gbps, copy = as_float(call.problem("gbps")), as_float(call.problem("copy_gbs"))
        sk, sq = call.problem("Sk"), call.problem("Sq")
        got = (f"; the call moves {gbps:.0f} GB/s of the minimum traffic, {pct_of_share(gbps / copy)} of the measured copy "
               f"bandwidth ({copy:.0f} GB/s)" if ok(gbps) and ok(copy) and copy > 0 else "")
        ev = (f"memory-bound problem (Sq={sq}, Sk={sk}) on a grid of {grid:.0f} blocks for {sms:.0f} SMs: "
              f"{sms - grid:.0f} SMs never load a byte{got}; {_share_text(lz)}")
        fix = split_kv_fix(sq, sk, grid, sms, gbps, copy)
    return _f(call, lz, "too_few_ctas", lz.share * (1 - grid / sms), ev, fix, "too_few_ctas")


def wave_tail(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """A partial last wave of blocks: up to 1 - waves/ceil(waves) of the kernel runs part-empty."""
    w = lz.col("waves_per_sm")
    if not ok(w) or w < 1 or math.ceil(w) > T("WAVE_TAIL_MAX_WAVES"):
        return None
    loss = 1 - w / math.ceil(w)
    if loss < T("WAVE_TAIL_MIN_LOSS"):
        return None
    ev = (f"{w:.2f} waves of blocks ({lz.grid:.0f} blocks): the last of {math.ceil(w)} waves is "
          f"{pct_of_share(w - math.floor(w))} full, up to {pct_of_share(loss)} of the kernel at partial occupancy; {_share_text(lz)}")
    fix = "size the grid to a whole number of waves (tile size, or a persistent grid of SMs x blocks/SM with a tile scheduler)"
    return _f(call, lz, "wave_tail", lz.share * loss, ev, fix, "wave_tail")


# ---------------------------------------------------------------------------------- position
def roofline_position(lz: Launch, call: Call, ctx: Context) -> Finding | None:
    """Memory-, compute- or latency-bound, from SM / memory / DRAM throughput and the roofline."""
    if not ok(lz.share) or lz.share < T("SMALL_KERNEL_SHARE"):
        return None
    sm, mem, dram = lz.col("sm_throughput_pct"), lz.col("memory_throughput_pct"), lz.col("dram_throughput_pct")
    if not (ok(sm) and ok(mem)):
        return None
    roof = lz.roofline
    roof_pct = as_float(roof.get("pct_of_roof"))
    roof_text = (f"; {roof_pct:.0f}% of its {roof.get('bound')}-side roof ({roof.get('precision')}, "
                 f"{num(as_float(roof.get('arithmetic_intensity')))} FLOP/byte)" if ok(roof_pct) else "")
    busiest = max(sm, mem)
    headroom = 1 - (roof_pct if ok(roof_pct) else busiest) / 100
    occ, theo, lim = lz.col("achieved_occupancy_pct"), lz.col("theoretical_occupancy_pct"), lz.row.get("occupancy_limiter")
    occ_text = f"occupancy {num(occ, '.0f')}% (theoretical {num(theo, '.0f')}%, limited by {lim}"
    if lim == "registers":
        occ_text += f": {num(lz.col('registers_per_thread'), '.0f')} registers/thread"
    elif lim in ("shared_memory", "shared memory"):
        occ_text += f": {num(lz.col('smem_per_block_bytes') / 1024, '.1f')} KiB shared memory/block"
    occ_text += ")"
    few_ctas = ok(lz.grid) and ok(lz.sms) and lz.grid < 0.5 * lz.sms  # too_few_ctas says it better
    if ok(dram) and dram >= T("BUSY_PCT"):
        cause, ev = "memory_bound", f"DRAM {dram:.0f}% of peak ({num(lz.col('dram_gbs'), '.0f')} GB/s), SM {sm:.0f}%"
        fix = "move fewer bytes: keep intermediates on chip (fuse), reuse each K/V tile for more queries, use smaller dtypes"
    elif busiest >= T("BUSY_PCT"):
        if sm >= mem:
            cause, ev = "compute_bound", f"SM throughput {sm:.0f}% of peak (memory {mem:.0f}%)"
            fix = "near the roof of the pipes it uses: fewer instructions per FLOP (tensor cores, exp2 with folded scale)"
        else:
            cause, ev = "memory_bound", f"on-chip memory throughput {mem:.0f}% of peak (L1/shared/L2), DRAM {num(dram, '.0f')}%"
            fix = "fewer or wider shared/L1 accesses: ldmatrix, registers for reused operands, no bank conflicts"
    elif sm < T("IDLE_PCT") and mem < T("IDLE_PCT") and not few_ctas:
        cause = "latency_bound"
        ev = f"neither compute ({sm:.0f}%) nor memory ({mem:.0f}%) is busy; {occ_text}"
        if lz.stalls:
            top = lz.stalls[0][0]
            what, _ = STALL_ADVICE.get(top, (top, ""))
            ev += f"; warps stall on {_stall_text(lz)} (top: waiting for {what})"
        fix = "more independent work in flight per SM"
        if isinstance(lim, str) and lim in LIMITER_ADVICE and ok(theo) and theo < 50:
            fix += f": {LIMITER_ADVICE[lim]}"
        if lz.stalls:
            fix += f"; for {lz.stalls[0][0]}: {STALL_ADVICE.get(lz.stalls[0][0], ('', 'see ncu'))[1]}"
    else:
        return None
    return _f(call, lz, cause, lz.share * headroom, ev + roof_text + f"; {_share_text(lz)}", fix, "roofline_position")


KernelRule = Callable[[Launch, Call, Context], "Finding | None"]

#: The per-launch rules, in the order they run (the order does not rank them).
KERNEL_RULES: tuple[KernelRule, ...] = (
    register_spills, uncoalesced_global, smem_bank_conflicts, global_atomics, dependent_global_loads,
    tensor_cores_unused, fp64_arithmetic, transcendentals, thread_divergence, mma_sync_on_hopper, tf32_emulation,
    too_few_ctas, wave_tail, roofline_position,
)

#: The rules that hold for a data-movement kernel (`faprof.advisor.roles.movers`): how it accesses memory
#: and how its grid fills the GPU. It does none of the problem's math, so no math rule speaks of it, and its
#: time is what its bytes cost (the call's and the comparison's rules say which bytes and why), not a stall
#: or a roofline position to tune.
MOVER_RULES: tuple[KernelRule, ...] = (register_spills, uncoalesced_global, smem_bank_conflicts, global_atomics,
                                       dependent_global_loads, thread_divergence, too_few_ctas, wave_tail)

#: Per-launch rules that return several findings (the accounting's terms).
KERNEL_TERM_RULES = (stall_terms,)
