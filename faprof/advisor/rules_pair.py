"""Rules that compare the slower call with its reference: bytes by memory level and math by path.

A kernel's own counters cannot say that its DRAM bytes are too many or that its math runs on a slow
path: the problem's compulsory bytes and FLOPs, and the comparator doing the same problem, can. Each
rule here takes (call, ref) and returns Findings about the slower call, in shares of its time (the
excess bytes' time at the level's bandwidth, or the slower path's share); the partition
(`faprof.advisor.partition`) then gives each the gap terms it produces. Counters only, never names.

- excess_dram_bytes: DRAM reads at least EXCESS_BYTES_RATIO x the reference's, and why: data-movement
  kernels before the math materialising transformed inputs (copies, K/V repeated per query head, casts),
  the math kernels asking L2 for more bytes (inputs re-read), or an L2 hit rate L2_HIT_DROP_PCT lower
  (reuse the problem allows, each K/V tile serving every query tile of its head, lost in L2);
- global_rmw: a math kernel's global writes at least EXCESS_BYTES_RATIO x the reference's and beyond the
  problem's outputs, with its own reads up as much: a value written to global memory and read back inside
  its loop (bytes one kernel writes and another reads are a hand-off, not this);
- excess_onchip_bytes: L2 bytes per executed FLOP at least EXCESS_BYTES_RATIO x the reference's, DRAM
  bytes not (smaller tiles: each loaded byte feeds fewer FLOPs);
- slower_math_path: the model's FLOPs executed on a path with a lower peak than the reference's main
  path (tensor fp16 -> tf32, tensor -> CUDA cores, fp32 -> fp64), named for both paths.
"""

from __future__ import annotations

import math

from faprof.advisor.differential import INPUTS_TERM
from faprof.advisor.evidence import Call, nansum, ok
from faprof.advisor.findings import Finding, big, num
from faprof.advisor.roles import describe_movers, input_movers, math_launches, moved_ms
from faprof.advisor.rules_code import barrier_imbalance
from faprof.advisor.thresholds import value as T
from faprof.advisor.traffic import Traffic, excess_seconds, traffic
from faprof.model.problem import AttentionProblem

#: Math paths, fastest first (dense peaks per SM on sm_80..sm_90: fp8 tensor 2x fp16 tensor (sm_89+),
#: bf16 = fp16 tensor, tf32 tensor 1/2 of fp16, CUDA-core fp16x2 above fp32 FFMA, fp64 tensor (DMMA) and
#: FP64 pipe slowest): the order, not the ratios, decides which path is slower.
PATHS: tuple[tuple[str, str], ...] = (
    ("tensor_fp8", "tensor cores, fp8 sources"),
    ("tensor_fp16", "tensor cores, fp16 sources"),
    ("tensor_bf16", "tensor cores, bf16 sources"),
    ("tensor_tf32", "tensor cores, tf32 sources"),
    ("cuda_fp16", "CUDA cores, fp16 (HFMA2)"),
    ("cuda_fp32", "CUDA cores, fp32 (FFMA)"),
    ("tensor_fp64", "tensor cores, fp64 (DMMA)"),
    ("cuda_fp64", "CUDA cores, fp64 (DFMA)"),
)
_RANK = {k: i for i, (k, _) in enumerate(PATHS)}
_NAME = dict(PATHS)
#: Paths of equal speed (their order in PATHS is not a slowdown).
_SAME_SPEED = {frozenset(("tensor_fp16", "tensor_bf16"))}

#: Kernel rules that already name a slower path from the kernel's own counters (CUDA cores for an
#: fp16/bf16 problem, fp64 in a non-fp64 one): where one holds, slower_math_path would say it twice.
PATH_CAUSES = ("tensor_cores_unused", "fp64_arithmetic")


def path_flops(call: Call) -> dict[str, float]:
    """Executed FLOPs per math path (tensor ops by source type; CUDA-core FLOPs from the SASS counters)."""
    out: dict[str, float] = {}
    lzs = math_launches(call)  # a data-movement kernel's FLOPs (register moves) are no path of the problem's
    for key in ("fp8", "fp16", "bf16", "tf32", "fp64"):
        v = nansum(*(lz.metric(f"tensor_ops_{key}") for lz in lzs))
        if key == "fp16":
            v = nansum(v, *(lz.metric("tensor_ops_fp16_acc16") for lz in lzs))
        if ok(v):
            out[f"tensor_{key}"] = v
    for key, col in (("cuda_fp16", "fp16_flops"), ("cuda_fp32", "fp32_flops"), ("cuda_fp64", "fp64_flops")):
        v = nansum(*(lz.col(col) for lz in lzs))
        if ok(v):
            out[key] = v
    return out


def main_path(flops: dict[str, float], model: float) -> str | None:
    """The path carrying the most FLOPs, when it carries at least MATH_PATH_MIN_SHARE of the model's."""
    if not flops or not ok(model) or model <= 0:
        return None
    k = max(flops, key=lambda p: flops[p])
    return k if flops[k] >= T("MATH_PATH_MIN_SHARE") * model else None


def slower_math_path(call: Call, ref: Call) -> list[Finding]:
    model = call.analytic_flops
    fa, fb = path_flops(call), path_flops(ref)
    pa, pb = main_path(fa, model), main_path(fb, model)
    if pa is None or pb is None or pa == pb or frozenset((pa, pb)) in _SAME_SPEED or _RANK[pa] <= _RANK[pb]:
        return []
    moved = fa[pa] - fb.get(pa, 0.0)
    if moved < T("MATH_PATH_MIN_SHARE") * model:
        return []
    ev = (f"{big(fa[pa])} FLOPs on {_NAME[pa]} where {ref.variant} runs {big(fb[pb])} on {_NAME[pb]} "
          f"(model: {big(model)} FLOPs); {ref.variant} has {big(fb.get(pa, 0.0))} on {_NAME[pa]}; "
          f"the same work on a slower path, not extra work")
    fix = f"run the matrix products on {_NAME[pb]}, as {ref.variant} does (operand types, MMA instruction shape)"
    f = Finding(call.variant, call.shape_id, "slower_math_path", min(1.0, moved / nansum(*fa.values())), ev, fix,
                "slower_math_path", title=f"math on {_NAME[pa]} (reference: {_NAME[pb]})")
    return [f]


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB" if ok(x) else "n/a"


def _time_text(extra: float, sec: float, bw: float, src: str) -> str:
    if not ok(sec):
        return f"{_gb(extra)} more"
    return f"{_gb(extra)} more = {1e6 * sec:.1f} µs at {bw / 1e9:.0f} GB/s ({src})"


def _gain(call: Call, sec: float) -> float:
    t = call.profiled_ms * 1e-3
    return min(1.0, max(0.0, sec / t)) if ok(sec) and ok(t) and t > 0 else math.nan


def excess_dram_bytes(call: Call, ref: Call, a: Traffic, b: Traffic) -> list[Finding]:
    """DRAM reads at least EXCESS_BYTES_RATIO x the reference's, and why they moved: data-movement kernels
    before the math that materialise transformed inputs (their time is the bytes'), the math kernels asking
    L2 for more bytes (inputs read more times than the comparator reads them), or reuse lost in L2 (the same
    requests, a hit rate L2_HIT_DROP_PCT lower). None of these (more bytes at an equal hit rate from spills or
    uncoalesced loads) is left to the mechanism that moves them."""
    da, db = a.levels["dram"], b.levels["dram"]
    if not (ok(da.read) and ok(db.read) and db.read > 0) or da.read < T("EXCESS_BYTES_RATIO") * db.read:
        return []
    ma, mb = traffic(call, math_launches(call)), traffic(ref, math_launches(ref))
    if ma is None or mb is None:
        return []
    copies = input_movers(call)
    copy_ms = moved_ms(call, copies) - moved_ms(ref, input_movers(ref))
    copied = bool(copies) and copy_ms > 0
    ra, rb = ma.levels["l2"].read, mb.levels["l2"].read
    asked = ok(ra) and ok(rb) and rb > 0 and ra >= T("EXCESS_BYTES_RATIO") * rb
    lost = ok(ma.l2_hit_rate) and ok(mb.l2_hit_rate) and mb.l2_hit_rate - ma.l2_hit_rate >= T("L2_HIT_DROP_PCT")
    if not (copied or asked or lost):
        return []
    wrote = not copied and ok(da.write) and ok(db.write) and db.write > 0 and da.write >= T("EXCESS_BYTES_RATIO") * db.write
    parts, sec = _dram_parts(call, ref, a, b, ma, mb, copies if copied else [], copy_ms)
    if copied:
        fix = ("read the inputs in place: no copy, repeat, cast or transpose of them before the kernel (index the "
               "original tensors in the kernel: their strides, a dtype conversion on load)")
    elif wrote:
        parts.append(f"DRAM writes {_gb(da.write)} vs {_gb(db.write)} too: intermediates (scores, partial outputs) "
                     "make a round trip through DRAM")
        fix = "keep intermediates on chip: fuse the kernels or the passes that write and read them back"
    elif asked:
        fix = ("read each input byte from DRAM fewer times: let one block serve every query row that shares a K/V "
               "tile (the query heads of a KV head, more query rows per tile), or order the grid so blocks sharing "
               "tiles run together")
    else:
        parts.append("the same bytes fetched from DRAM again: the reuse the problem allows (every K/V tile serves "
                     "all query tiles of its head) is lost in L2")
        fix = ("move fewer bytes from DRAM: schedule the blocks that share K/V tiles together (heads or batches as the "
               "slowest grid dimension, query tiles fastest), or keep a K/V tile on chip for more query rows")
    gqa = _gqa_fix(call, ma.levels["dram"].read / a.compulsory if ok(a.compulsory) and a.compulsory > 0 else math.nan)
    if (copied or asked) and not wrote and gqa:
        fix += f"; {gqa}"
    claimed: tuple[str, ...] = (INPUTS_TERM,) if copied else ()
    per_byte = _inst_per_byte(call), _inst_per_byte(ref)
    same = ok(per_byte[0]) and ok(per_byte[1]) and per_byte[1] > 0 and (
        1 / T("SAME_WORK_PER_BYTE") <= per_byte[0] / per_byte[1] <= T("SAME_WORK_PER_BYTE"))
    if (copied or asked) and same:
        # the same instructions per byte read as the comparator: every instruction the math kernels add
        # processes a byte they add (more blocks over more copies), so the added instructions are the bytes'
        parts.append(f"{num(per_byte[0])} vs {num(per_byte[1])} warp instructions per DRAM byte read: the added "
                     "instructions process the added bytes")
        claimed += ("pipe:*",)
    head = (f"the call moves {_gb(da.total)} through DRAM (reads {_gb(da.read)}, writes {_gb(da.write)}) where the "
            f"problem needs {_gb(a.compulsory)} and {ref.variant} moves {_gb(db.total)}")
    return [Finding(call.variant, call.shape_id, "excess_dram_bytes", _gain(call, sec), f"{head}: " + "; ".join(parts),
                    fix, "excess_dram_bytes", claims=claimed)]


def _dram_parts(call: Call, ref: Call, a: Traffic, b: Traffic, ma: Traffic, mb: Traffic, copies: list,
                copy_ms: float) -> tuple[list[str], float]:
    """The evidence of excess_dram_bytes (the copies before the math, the math kernels' reads) and the time
    of the excess (s): the copies' kernel time beyond the comparator's, plus the math kernels' extra reads
    at the measured DRAM bandwidth."""
    parts, sec = [], 0.0
    if copies:
        parts.append(f"{describe_movers(copies)} run before the math kernel, transformed copies of the inputs that "
                     f"{ref.variant} does not make ({1e3 * copy_ms:.1f} µs more of kernel time)")
        sec += 1e-3 * copy_ms
    xa, xb = ma.levels["dram"], mb.levels["dram"]
    ra, rb = ma.levels["l2"].read, mb.levels["l2"].read
    extra, sec_m = excess_seconds(ma, mb, "dram", "read")
    parts.append(f"the math kernel{'s' if len(math_launches(call)) > 1 else ''} read {_gb(xa.read)} from DRAM, "
                 f"{num(xa.read / a.compulsory)}x the compulsory bytes ({ref.variant}: {_gb(xb.read)}, "
                 f"{num(xb.read / b.compulsory)}x), L2 read requests "
                 f"{num(ra / rb if ok(ra) and ok(rb) and rb > 0 else math.nan)}x {ref.variant}'s, L2 hit rate "
                 f"{num(ma.l2_hit_rate, '.0f')}% vs {num(mb.l2_hit_rate, '.0f')}%; "
                 + _time_text(extra, sec_m, xa.bandwidth, xa.bandwidth_source))
    if ok(sec_m) and sec_m > 0:
        sec += sec_m
    return parts, sec


def _inst_per_byte(call: Call) -> float:
    """The math kernels' warp instructions per DRAM byte they read."""
    lzs = math_launches(call)
    inst = nansum(*(lz.metric("inst_executed") for lz in lzs))
    read = nansum(*(lz.metric("dram_bytes_read") for lz in lzs))
    return inst / read if ok(inst) and ok(read) and read > 0 else math.nan


def _gqa_fix(call: Call, reread: float) -> str:
    """For GQA/MQA whose K/V the math kernels read about once per query head (a re-read factor of at least
    GQA_REREAD_SHARE x H/Hkv): K/V once per KV head; '' otherwise."""
    p = AttentionProblem.from_row(call.measurement)
    group = p.group if p is not None else 1
    if group > 1 and ok(reread) and reread >= T("GQA_REREAD_SHARE") * group:
        return (f"read K/V once per KV head, not once per query head (re-read {num(reread)}x, H/Hkv = {group}): map "
                f"query head h to KV head h // {group} inside the kernel and let one block serve the {group} query "
                "heads of a KV head, instead of repeating K/V per query head (repeat_kv / repeat_interleave)")
    return ""


def global_rmw(call: Call, ref: Call, a: Traffic, b: Traffic) -> list[Finding]:
    """A math kernel that writes beyond the reference's writes and the problem's outputs and reads back as
    much itself: a value written to global memory and read back inside its loop. Per kernel: bytes one kernel
    writes and a later one reads are a hand-off between kernels (kernels_per_call, or copies of the inputs:
    excess_dram_bytes), and a data-movement kernel has no loop of the problem's to keep a value across."""
    lb = b.levels["l2"]
    prob_out = _output_bytes(call)
    if not (ok(lb.write) and lb.write > 0 and ok(lb.read)):
        return []
    best: tuple[float, Traffic, str] | None = None
    for lz in math_launches(call):
        t = traffic(call, [lz])
        la = t.levels["l2"] if t is not None else None
        if t is None or la is None or not (ok(la.write) and ok(la.read)):
            continue
        if la.write < T("EXCESS_BYTES_RATIO") * lb.write or (ok(prob_out) and la.write < T("EXCESS_BYTES_RATIO") * prob_out):
            continue
        # read back: the extra reads match the extra writes within 1 / RMW_READBACK_SHARE either way (reads grown
        # far beyond the writes grew for another reason: a different design, uncoalesced loads)
        more_w, more_r = la.write - lb.write, la.read - lb.read
        if T("RMW_READBACK_SHARE") * more_w <= more_r <= more_w / T("RMW_READBACK_SHARE") and (
                best is None or more_w > best[0]):
            best = (more_w, t, lz.kernel)
    if best is None:
        return []
    _, at, kernel = best
    la = at.levels["l2"]
    extra, sec = excess_seconds(at, b, "l2", "write")
    extra_r, sec_r = excess_seconds(at, b, "l2", "read")
    sec_all = nansum(sec, sec_r)
    ev = (f"global writes {_gb(la.write)} vs {ref.variant}'s {_gb(lb.write)} (the problem's outputs: {_gb(prob_out)}), "
          f"and reads {_gb(extra_r)} more, by the same kernel: values written to global memory and read back inside "
          f"its loop ({la.source}); {_time_text(nansum(extra, extra_r), sec_all, la.bandwidth, la.bandwidth_source)}")
    fix = "keep the running value (accumulator, statistics) in registers or shared memory across the loop; write it once at the end"
    return [Finding(call.variant, call.shape_id, "global_rmw", _gain(call, sec_all), ev, fix, "global_rmw",
                    kernel=kernel if len(call.launches) > 1 else "")]


def _output_bytes(call: Call) -> float:
    p = AttentionProblem.from_row(call.measurement)
    if p is None:
        return math.nan
    # total_q: a packed (varlen) batch's output is its query tokens, not B x the longest sequence
    return float(p.total_q * p.H * p.D * p.elt_bytes) if p.direction == "fwd" else math.nan


def _executed_flops(call: Call) -> float:
    v = nansum(*path_flops(call).values())
    return v if ok(v) and v > 0 else math.nan


def excess_onchip_bytes(call: Call, ref: Call, a: Traffic, b: Traffic) -> list[Finding]:
    """L2 bytes per *executed* FLOP (work done above the model's is wasted_work's, not this) at least
    EXCESS_BYTES_RATIO x the reference's, DRAM bytes not: each byte brought on chip feeds fewer FLOPs.
    Shared memory is quoted beside it, not decisive: its wavefronts count access shapes (a broadcast
    LDS.64 takes two) as well as bytes."""
    da, db = a.levels["dram"], b.levels["dram"]
    if ok(da.total) and ok(db.total) and da.total >= T("EXCESS_BYTES_RATIO") * db.total:
        return []  # DRAM bytes grew too: excess_dram_bytes or another mechanism says why
    fa, fb = _executed_flops(call), _executed_flops(ref)
    per = {}
    for level in ("l2", "shared"):
        la, lb = a.levels[level], b.levels[level]
        per[level] = (la.total / fa, lb.total / fb) if ok(fa) and ok(fb) and ok(la.total) and ok(lb.total) else None
    l2 = per["l2"]
    if l2 is None or l2[1] <= 0 or l2[0] < T("EXCESS_BYTES_RATIO") * l2[1]:
        return []
    parts, secs = [], []
    for level, pr in per.items():
        if pr is None:
            continue
        la = a.levels[level]
        extra = (pr[0] - pr[1]) * fa
        sec = extra / la.bandwidth if ok(la.bandwidth) and la.bandwidth > 0 else math.nan
        parts.append(f"{level.replace('l2', 'L2')} {num(pr[0])} vs {num(pr[1])} bytes per executed FLOP "
                     f"({la.source}): {_time_text(extra, sec, la.bandwidth, la.bandwidth_source)}")
        secs.append(sec)
    ev = (f"{'; '.join(parts)}; DRAM {_gb(da.total)} vs {_gb(db.total)}: each byte loaded on chip feeds fewer FLOPs "
          f"than in {ref.variant} (smaller tiles, operands re-read)")
    fix = "larger tiles (more query rows per K/V tile, wider MMA shapes) so each byte brought on chip feeds more FLOPs"
    return [Finding(call.variant, call.shape_id, "excess_onchip_bytes", _gain(call, secs[0]), ev, fix,
                    "excess_onchip_bytes")]


def pair_findings(call: Call, ref: Call, own: list[Finding] | None = None) -> list[Finding]:
    """Every comparative rule's findings about `call` against `ref` (empty when either lacks launches);
    `own`: the call's own findings (a path they already name is not said again)."""
    if not call.launches or not ref.launches:
        return []
    named = any(f.cause in PATH_CAUSES for f in own or [])
    out = [] if named else slower_math_path(call, ref)
    a, b = traffic(call), traffic(ref)
    if a is not None and b is not None:
        for rule in (excess_dram_bytes, global_rmw, excess_onchip_bytes):
            out += rule(call, ref, a, b)
    out += barrier_imbalance(call, ref)
    for f in out:
        f.evidence += f"; against {ref.variant}"
    return out

