"""Rules about a whole call: correctness, wasted work, how its kernels are launched, ncu's rules.

Each rule takes (call, ctx) and returns a list of Findings. Work counts come from the hardware
(ncu's FLOP counters) against the problem's exact FLOPs; launch structure from ncu's launches and
the nsys timeline; nothing reads a kernel or variant name to decide anything.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from faprof.advisor.evidence import Call, Launch, nansum, ok
from faprof.advisor.findings import Finding, big, num, pct_of_share
from faprof.advisor.qk_pairs import row_pairs
from faprof.advisor.roles import describe_movers, input_movers, later_movers, math_launches, movers
from faprof.advisor.rules_kernel import Context
from faprof.advisor.thresholds import value as T
from faprof.model.values import as_float


def correctness(call: Call, ctx: Context) -> list[Finding]:
    r = call.measurement
    if r.get("status") != "wrong":
        return []
    ev = (f"output differs from the {r.get('reference')} reference: max abs error {num(as_float(r.get('max_abs_err')))}, "
          f"relative {num(as_float(r.get('rel_err')))}")
    return [Finding(call.variant, call.shape_id, "correctness", math.nan, ev,
                    "fix correctness before reading any timing", "correctness")]


# -------------------------------------------------------------------------------- wasted work
def _wider_flops(lzs: list[Launch], dtype: str | None) -> float:
    """FLOPs executed in a precision wider than the problem's: fp64 (DFMA/DADD/DMUL and DMMA) in a
    problem whose inputs are not fp64. NaN when neither counter was read; 0 for an fp64 problem."""
    if dtype == "fp64":
        return 0.0
    return nansum(*(lz.col("fp64_flops") for lz in lzs), *(lz.metric("tensor_ops_fp64") for lz in lzs))


def wasted_work(call: Call, ctx: Context) -> list[Finding]:
    """Hardware FLOPs over the exact FLOPs, beyond what whole tiles make unavoidable, counted per
    precision path as work done once.

    TF32 tensor FLOPs count 1/TF32_PRODUCTS (fp32 emulated with three TF32 products does the
    exact work three times by design). FLOPs in a wider precision than the problem's (fp64 in an
    fp16/bf16/fp32 problem) are the problem's math done on a slower path: they count as work only
    up to the exact FLOPs the problem's own paths leave undone, and what they execute beyond that
    (an fp64 exp or division is a polynomial of DFMAs where fp32 spends one MUFU instruction,
    conversions, extended-precision sums) is that path's cost, the fp64 cause's, not extra work.
    The allowance is the work of WASTED_WORK_TILE-row tiles (causal: up to the diagonal tile), so
    small causal problems are not called wasteful.
    """
    if not call.launches or not ok(call.analytic_flops) or call.analytic_flops <= 0:
        return []
    lzs = math_launches(call)  # a data-movement kernel's FLOPs are none of the problem's
    hw, tf32 = 0.0, 0.0
    for lz in lzs:
        hw = nansum(hw, lz.col("hw_flops"))
        tf32 = nansum(tf32, lz.metric("tensor_ops_tf32"))
    if not ok(hw) or hw <= 0:
        return []
    exact = call.analytic_flops
    wide = _wider_flops(lzs, call.dtype)
    wide = min(wide, hw) if ok(wide) and wide > 0 else 0.0
    own = max(0.0, hw - wide - (1 - 1 / T("TF32_PRODUCTS")) * (tf32 if ok(tf32) else 0.0))
    stands_in = min(wide, max(0.0, exact - own))  # the problem's math the wider path does instead
    effective = own + stands_in
    ratio = effective / exact
    tile = int(T("WASTED_WORK_TILE"))
    allowance, allow_text = 1.0, "no problem shape known: no tile allowance"
    # every mask (alignment, window) and every sequence of a packed batch, from the problem's own model
    counted = row_pairs(call.measurement, tile)
    if counted is not None:
        exact_pairs, tiled, over = counted
        allowance = tiled / exact_pairs if exact_pairs else 1.0
        allow_text = f"{tile}-row tiles{over} need {allowance:.2f}x"
    if ratio <= allowance * T("WASTED_WORK_MIN_RATIO"):
        return []
    tf_text = f" (TF32 FLOPs counted 1/{T('TF32_PRODUCTS'):.0f})" if ok(tf32) and tf32 > 0 else ""
    if wide > 0:  # per precision path: the fp64 FLOPs beyond the math they do instead are not work
        ev = (f"the hardware executed {big(hw)} FLOPs, {big(effective)} of them the problem's work counted once "
              f"across precision paths{tf_text}, for {big(exact)} exact ones ({ratio:.2f}x): of its {big(wide)} fp64 "
              f"FLOPs, {big(stands_in)} do math the other paths leave undone (the same work on a slower path) and the "
              f"rest is the fp64 path's own cost, not extra work; {allow_text}")
    else:
        ev = (f"the hardware executed {big(effective)} FLOPs{tf_text} for {big(exact)} exact ones ({ratio:.2f}x); "
              f"{allow_text}")
    fix = ("skip work that cannot contribute: key tiles entirely above the causal diagonal (causal block skipping), "
           "padded tails, recomputation")
    return [Finding(call.variant, call.shape_id, "wasted_work", 1 - allowance / ratio, ev, fix, "wasted_work")]


# ----------------------------------------------------------------------------- launch shape
def _by_kernel(call: Call) -> dict[str, list[Launch]]:
    """Launches grouped by kernel name."""
    out: dict[str, list[Launch]] = {}
    for lz in call.launches:
        out.setdefault(lz.kernel, []).append(lz)
    return out


def _same_launches(call: Call) -> list[list[Launch]]:
    """Groups of launches of one kernel instantiation (full demangled name, template arguments
    included) with one launch configuration: the same code on the same grid, i.e. one launch
    repeated over slices of the data (a generic kernel used for different ops differs in its
    template arguments)."""
    out: dict[tuple[str, str, str], list[Launch]] = {}
    for lz in call.launches:
        name = str(lz.row.get("kernel_demangled") or lz.kernel)
        out.setdefault((name, str(lz.row.get("grid")), str(lz.row.get("block"))), []).append(lz)
    return list(out.values())


def launch_split(call: Call, ctx: Context) -> list[Finding]:
    """The same kernel launched several times per call on the same grid, each launch with fewer
    blocks than SMs: one launch over all slices would fill the GPU (supersedes too_few_ctas there)."""
    out = []
    for lzs in _same_launches(call):
        n = len(lzs)
        grid, sms = lzs[0].grid, lzs[0].sms
        if n < 2 or not (ok(grid) and ok(sms)) or grid >= T("TOO_FEW_CTAS_PER_SM") * sms:
            continue
        share = nansum(*(lz.share for lz in lzs))
        frac = 1 - max(1 / n, grid / sms)
        ctx.split_launches.update(lz.kernel_id for lz in lzs)
        ev = (f"{n} launches of one kernel on one grid per call, each {grid:.0f} blocks on {sms:.0f} SMs "
              f"({pct_of_share(grid / sms)} of the SMs busy per launch; {n * grid:.0f} blocks in all); {pct_of_share(share)} of the call's "
              f"kernel time")
        fix = "launch once over all slices: put batch and heads in the grid (blockIdx.y/z) instead of looping on the host"
        out.append(Finding(call.variant, call.shape_id, "launch_split", share * frac, ev, fix, "launch_split",
                           kernel=lzs[0].kernel))
    return out


def kernels_per_call(call: Call, ctx: Context) -> list[Finding]:
    """Several different kernels per call: bytes make a round trip through DRAM between them.

    What the round trip carries decides the fix (`faprof.advisor.roles`): data-movement kernels launched
    before the first math kernel materialise transformed inputs (copies, K/V repeated per query head, casts,
    transposes); between math kernels they carry intermediates (scores, probabilities); after the last one
    they are an epilogue over the output. Gain: the DRAM traffic beyond the problem's minimum bytes, at peak
    bandwidth, as a share of the call's kernel time (a lower bound of what fusing saves; the data-movement
    kernels' own time is not taken whole, since a launch that overlaps its predecessor, as a split-KV combine
    with programmatic dependent launch does, costs less than its replayed duration). The finding claims
    those kernels' time in a gap's partition (`kernels:input_copies`, `kernels:data_movement`) unless a cause of the comparison claims it
    first. The fix: several math kernels, or data movement between them, is unfused attention (scores and
    probabilities through DRAM); else copies before the math are materialised inputs; else data movement
    after it is an epilogue (a split-KV combine, a cast or transpose of the output)."""
    names = list(_by_kernel(call))
    nsys_names = call.nsys.get("kernel_names")
    if nsys_names is not None and not isinstance(nsys_names, float) and len(set(map(str, nsys_names))) > len(names):
        names = list(dict.fromkeys(map(str, nsys_names)))
    if len(names) < 2:
        return []
    kpc = as_float(call.nsys.get("kernels_per_call"))
    dram = nansum(*(lz.col("dram_bytes") for lz in call.launches))
    min_bytes = as_float(call.problem("min_bytes"))
    bw = as_float(call.problem("mem_bw_gbs")) * 1e9
    t = call.profiled_ms * 1e-3
    gain = math.nan
    extra = ""
    if ok(dram) and ok(min_bytes) and ok(bw) and bw > 0 and ok(t) and t > 0:
        gain = min(1.0, max(0.0, (dram - min_bytes) / bw / t))
        extra = (f"; {big(dram)}B of DRAM traffic vs {big(min_bytes)}B the problem needs: "
                 f"{1e6 * max(0.0, dram - min_bytes) / bw:.1f} µs at {bw / 1e9:.0f} GB/s")
    moving, inputs, later = movers(call), input_movers(call), later_movers(call)
    count = f"{kpc:.0f} kernels" if ok(kpc) else f"{len(call.launches)} kernel launches"
    ev = f"{count} per call ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}){extra}"
    maths = math_launches(call)
    last = max((lz.launch for lz in maths), default=-1)
    between = [lz for lz in later if lz.launch < last]
    epilogue = [lz for lz in later if lz.launch > last]
    if inputs:
        ev += (f"; {describe_movers(inputs)} before the first math kernel: transformed copies of the inputs "
               "(copied, repeated, cast or transposed) that the math kernel then reads")
    if between:
        ev += f"; {describe_movers(between)} between math kernels: intermediates handed from one to the next"
    if epilogue:
        ev += f"; {describe_movers(epilogue)} after the last math kernel: an epilogue over its output"
    if between or len(maths) > 1 or not moving:
        fix = "fuse the kernels so scores and probabilities stay on chip (a FlashAttention-style single kernel)"
    elif inputs:
        fix = ("read the inputs in place: index the original tensors inside the attention kernel (their strides, "
               "a dtype conversion on load, KV head = query head // group for GQA) instead of materialising "
               "copies, casts or transposes before it")
    else:
        fix = ("fold the epilogue into the math kernel: write the output once, in its final layout and dtype (a "
               "split-KV combine, a cast or a transpose of O done where O is computed)")
    return [Finding(call.variant, call.shape_id, "kernels_per_call", gain, ev, fix, "kernels_per_call")]


def launch_overhead(call: Call, ctx: Context) -> list[Finding]:
    """The GPU idle between the kernels of one call in the nsys timeline: it waits for the host.

    Only gaps inside a call count (faprof's own Python between calls is not the kernel's cost);
    tracing lengthens each launch by a few µs, so an untraced run idles somewhat less."""
    idle, gpu = as_float(call.nsys.get("idle_us")), as_float(call.nsys.get("gpu_us"))
    kpc = as_float(call.nsys.get("kernels_per_call"))
    if not (ok(idle) and ok(gpu) and ok(kpc)) or kpc < 2 or gpu + idle <= 0:
        return []
    share = idle / (gpu + idle)
    if share < T("LAUNCH_IDLE_MIN_SHARE"):
        return []
    ev = (f"the GPU sits idle {idle:.1f} µs between the {kpc:.0f} kernels of a call (median over "
          f"{num(as_float(call.nsys.get('iterations')), '.0f')} calls) for {gpu:.1f} µs of kernels: {pct_of_share(share)} of the call's "
          f"GPU span waiting for the host (nsys tracing adds a few µs per launch)")
    fix = "capture the call in a CUDA graph, or fuse its kernels"
    return [Finding(call.variant, call.shape_id, "launch_overhead", share, ev, fix, "launch_overhead")]


# ------------------------------------------------------------------------------ ncu's rules
#: ncu rule names (lower case, punctuation removed) -> the advisor cause they corroborate.
NCU_RULE_CAUSES = (
    (re.compile(r"bank|sharedmem|shared(memory)?(access|conflict)|uncoalescedshared"), "smem_bank_conflicts"),
    (re.compile(r"uncoalescedglobal|globalaccess|sector"), "uncoalesced_global"),
    (re.compile(r"spill|localmem"), "register_spills"),
    (re.compile(r"tail|wave"), "wave_tail"),
    (re.compile(r"launchconfig|smallgrid|gridsize|fewblocks"), "too_few_ctas"),
    (re.compile(r"fp32|tensor|pipeutil"), "tensor_cores_unused"),
)

#: ncu's access-pattern rule speaks of one memory space per result; its message says which
#: ("... for global loads ...", "... for local stores ..."), and that names the cause it corroborates.
ACCESS_PATTERN_RULE = re.compile(r"accesspattern")
ACCESS_PATTERN_SPACES = (("global", "uncoalesced_global"), ("local", "register_spills"), ("shared", "smem_bank_conflicts"))

#: Causes whose own rule needs a counter that a cheap section set may lack (the excessive-wavefront
#: count comes from ncu's source counters, in `full` only). Where the launch has no such counter,
#: ncu's own rule for the cause, from the counters its section did collect, stands in for it.
STAND_IN_CAUSES = {"smem_bank_conflicts": "smem_excessive_wavefronts"}


def _shared_busy(lzs) -> float:
    """How much the shared-memory pipe bounds these launches: its utilization, or the warps' stalls
    on it (mio_throttle, short_scoreboard); 1 when neither was measured."""
    busy_vals = [v for lz in lzs for v in (lz.metric("smem_pipe_util") / 100,
                                            lz.stall_share("mio_throttle", "short_scoreboard")) if ok(v)]
    return min(1.0, max(busy_vals)) if busy_vals else 1.0


def _rule_cause(name: str, message: str = "") -> str | None:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    if ACCESS_PATTERN_RULE.search(key):
        m = re.search(r"for (global|local|shared) (loads|stores)", message.lower())
        return dict(ACCESS_PATTERN_SPACES).get(m.group(1)) if m else None
    for rx, cause in NCU_RULE_CAUSES:
        if rx.search(key):
            return cause
    return None


def merge_ncu_rules(call: Call, findings: list[Finding]) -> list[Finding]:
    """ncu's own rule results (Nsight Compute's analysis of the counters it collected):

    - a rule that corroborates a finding on the same kernel is quoted in its evidence, and where
      ncu estimates more of the kernel's time than faprof's rule did, the finding takes ncu's
      estimate (times the kernel's share of the call);
    - a rule for a cause whose own counter the section set lacked (STAND_IN_CAUSES) becomes that
      cause's finding, with ncu's estimate and message as its evidence;
    - any other rule with an estimated speedup becomes an 'ncu' finding (never primary)."""
    out: list[Finding] = []
    stood_in: dict[tuple[str, str], Finding] = {}
    for r in call.rules:
        est = as_float(r.get("est_speedup_pct"))
        name = str(r.get("rule") or r.get("rule_id") or "")
        kernel = str(r.get("kernel") or "")
        msg = re.sub(r"\s+", " ", str(r.get("message") or "")).strip()
        cause = _rule_cause(name + " " + str(r.get("section") or ""), msg)
        lzs = [lz for lz in call.launches if lz.kernel == kernel] or call.launches
        share = nansum(*(lz.share for lz in lzs)) / max(1, len(lzs)) if lzs else math.nan
        gain = share * est / 100 if ok(share) and ok(est) else math.nan
        mine = [f for f in findings if f.cause == cause and (not kernel or f.kernel in ("", kernel))]
        if cause in STAND_IN_CAUSES and ok(gain):
            # ncu weighs bank conflicts by the L1/TEX throughput, which global traffic through L1
            # also fills; faprof weighs them by how busy the shared pipe itself is (the own rule's
            # weight), so an uncoalesced kernel's L1 load does not make its conflicts look costly
            gain *= _shared_busy(lzs)
        if mine:
            tag = f" [ncu rule {name}{': est. speedup ' + format(est, '.0f') + '%' if ok(est) else ''}]"
            if tag not in mine[0].evidence:
                mine[0].evidence += tag
            if ok(gain) and (not ok(mine[0].gain) or gain > mine[0].gain):
                mine[0].gain = min(1.0, gain)
            continue
        counter = STAND_IN_CAUSES.get(cause or "")
        if counter and ok(gain) and est >= T("NCU_RULE_MIN_SPEEDUP_PCT") and lzs and not any(
                ok(lz.metric(counter)) for lz in lzs):
            key = (cause or "", kernel)
            if key in stood_in:
                stood_in[key].gain = max(stood_in[key].gain, gain)
                continue
            f = Finding(call.variant, call.shape_id, cause or "", gain,
                        f"ncu rule {name}: {msg[:240]}{'...' if len(msg) > 240 else ''} (est. speedup {est:.0f}% of the "
                        f"kernel; the section set has no {counter} counter of faprof's own)",
                        "XOR-swizzle (or pad) shared-memory rows so a warp's accesses fall in distinct banks",
                        f"ncu:{name}", kernel=kernel)
            stood_in[key] = f
            out.append(f)
            continue
        if not ok(est) or est < T("NCU_RULE_MIN_SPEEDUP_PCT"):
            continue
        out.append(Finding(call.variant, call.shape_id, "ncu_rule", gain,
                           f"{msg[:240]}{'...' if len(msg) > 240 else ''} (est. speedup {est:.0f}% of the kernel)",
                           "see the rule's text in Nsight Compute", f"ncu:{name}", kernel=kernel,
                           title=f"ncu: {name}"))
    return out


CallRule = Callable[[Call, Context], list[Finding]]

#: Call rules that run before the kernel rules (launch_split tells too_few_ctas which launches it covers).
CALL_RULES_FIRST: tuple[CallRule, ...] = (correctness, launch_split)
#: Call rules that run after them.
CALL_RULES: tuple[CallRule, ...] = (wasted_work, kernels_per_call, launch_overhead)
