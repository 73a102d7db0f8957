"""Rules that compare the slower call with its reference: bytes by memory level and math by path.

A kernel's own counters cannot say that its DRAM bytes are too many or that its math runs on a slow
path: the problem's compulsory bytes and FLOPs, and the comparator doing the same problem, can. Each
rule here takes (call, ref) and returns Findings about the slower call, in shares of its time (the
excess bytes' time at the level's bandwidth, or the slower path's share); the partition
(`faprof.advisor.partition`) then gives each the gap terms it produces. Counters only, never names.

- excess_dram_bytes: DRAM reads at least EXCESS_BYTES_RATIO x the reference's with an L2 hit rate
  L2_HIT_DROP_PCT lower: reuse the problem allows (each K/V tile serves every query tile of its head)
  was lost, the same bytes fetched from DRAM again;
- global_rmw: global writes at least EXCESS_BYTES_RATIO x the reference's and beyond the problem's
  outputs, with reads up too: a value written to global memory and read back inside the loop;
- excess_onchip_bytes: L2 bytes per executed FLOP at least EXCESS_BYTES_RATIO x the reference's, DRAM
  bytes not (smaller tiles: each loaded byte feeds fewer FLOPs);
- slower_math_path: the model's FLOPs executed on a path with a lower peak than the reference's main
  path (tensor fp16 -> tf32, tensor -> CUDA cores, fp32 -> fp64), named for both paths.
"""

from __future__ import annotations

import math

from faprof.advisor.evidence import Call, nansum, ok
from faprof.advisor.findings import Finding, big, num
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
    for key in ("fp8", "fp16", "bf16", "tf32", "fp64"):
        v = nansum(*(lz.metric(f"tensor_ops_{key}") for lz in call.launches))
        if key == "fp16":
            v = nansum(v, *(lz.metric("tensor_ops_fp16_acc16") for lz in call.launches))
        if ok(v):
            out[f"tensor_{key}"] = v
    for key, col in (("cuda_fp16", "fp16_flops"), ("cuda_fp32", "fp32_flops"), ("cuda_fp64", "fp64_flops")):
        v = nansum(*(lz.col(col) for lz in call.launches))
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
    da, db = a.levels["dram"], b.levels["dram"]
    if not (ok(da.read) and ok(db.read) and db.read > 0) or da.read < T("EXCESS_BYTES_RATIO") * db.read:
        return []
    if not (ok(a.l2_hit_rate) and ok(b.l2_hit_rate)) or b.l2_hit_rate - a.l2_hit_rate < T("L2_HIT_DROP_PCT"):
        return []
    extra, sec = excess_seconds(a, b, "dram", "read")
    head = (f"DRAM reads {_gb(da.read)} vs {ref.variant}'s {_gb(db.read)} for {_gb(a.compulsory)} of compulsory bytes "
            f"(re-read {num(da.read / a.compulsory)}x vs {num(db.read / b.compulsory)}x); L2 hit rate "
            f"{num(a.l2_hit_rate, '.0f')}% vs {num(b.l2_hit_rate, '.0f')}%")
    if ok(da.write) and ok(db.write) and db.write > 0 and da.write >= T("EXCESS_BYTES_RATIO") * db.write:
        why = (f"; DRAM writes {_gb(da.write)} vs {_gb(db.write)} too: intermediates (scores, partial outputs) "
               "make a round trip through DRAM")
        fix = "keep intermediates on chip: fuse the kernels or the passes that write and read them back"
    else:
        why = "; the same bytes fetched from DRAM again: the reuse the problem allows (every K/V tile serves all " \
              "query tiles of its head) is lost in L2"
        fix = ("move fewer bytes from DRAM: schedule the blocks that share K/V tiles together (heads or batches as "
               "the slowest grid dimension, query tiles fastest), or keep a K/V tile on chip for more query rows")
    ev = f"{head}{why}; {_time_text(extra, sec, da.bandwidth, da.bandwidth_source)}"
    return [Finding(call.variant, call.shape_id, "excess_dram_bytes", _gain(call, sec), ev, fix, "excess_dram_bytes")]


def global_rmw(call: Call, ref: Call, a: Traffic, b: Traffic) -> list[Finding]:
    la, lb = a.levels["l2"], b.levels["l2"]
    prob_out = _output_bytes(call)
    if not (ok(la.write) and ok(lb.write) and lb.write > 0 and ok(la.read) and ok(lb.read)):
        return []
    if la.write < T("EXCESS_BYTES_RATIO") * lb.write or (ok(prob_out) and la.write < T("EXCESS_BYTES_RATIO") * prob_out):
        return []
    # read back: the extra reads match the extra writes within 1 / RMW_READBACK_SHARE either way (reads grown
    # far beyond the writes grew for another reason: a different design, uncoalesced loads)
    more_w, more_r = la.write - lb.write, la.read - lb.read
    if not T("RMW_READBACK_SHARE") * more_w <= more_r <= more_w / T("RMW_READBACK_SHARE"):
        return []
    extra, sec = excess_seconds(a, b, "l2", "write")
    extra_r, sec_r = excess_seconds(a, b, "l2", "read")
    sec_all = nansum(sec, sec_r)
    ev = (f"global writes {_gb(la.write)} vs {ref.variant}'s {_gb(lb.write)} (the problem's outputs: {_gb(prob_out)}), "
          f"and reads {_gb(extra_r)} more: values written to global memory and read back inside the loop "
          f"({la.source}); {_time_text(nansum(extra, extra_r), sec_all, la.bandwidth, la.bandwidth_source)}")
    fix = "keep the running value (accumulator, statistics) in registers or shared memory across the loop; write it once at the end"
    return [Finding(call.variant, call.shape_id, "global_rmw", _gain(call, sec_all), ev, fix, "global_rmw")]


def _output_bytes(call: Call) -> float:
    p = AttentionProblem.from_row(call.measurement)
    if p is None:
        return math.nan
    return float(p.B * p.H * p.Sq * p.D * p.elt_bytes) if p.direction == "fwd" else math.nan


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
    for f in out:
        f.evidence += f"; against {ref.variant}"
    return out

