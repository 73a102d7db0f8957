"""Rules that read how a kernel's work is done: its memory classes and its per-score instructions, from the
SASS the source pass kept and the counters that class the memory operations.

- `global_atomics` (per launch): global atomics and reductions (ATOMG, RED) are a memory class of their
  own, read-modify-writes serialised at L2, not loads that fetch too many sectors: their L2 sectors
  (`lts__t_sectors_srcunit_tex_op_atom/red`), their L1 requests and instructions, against the kernel's L2
  sectors.
- `dependent_global_loads` (per launch, with per-instruction source rows): global loads whose address is
  computed from another global load's result (an index table, a block table): two memory latencies in
  series per element. Found on the SASS def-use chains (`faprof.advisor.producers.dependent_loads`); the
  evidence is the share of long-scoreboard samples charged to the chain's loads.
- `sass_per_score` (used by `rules_kernel.transcendentals`): MUFU instructions by function (EX2, RCP, ...)
  and divisions (MUFU.RCP with its fixups, FCHK, the division routine) per computed score, from the issue
  samples per instruction: one exp2 per score and no division (one reciprocal per row at the end) is the
  minimum.
- `barrier_imbalance` (a call against its reference): at equal barrier counts, barrier waits that grew
  by more than the warp-cycles every other state added, with fewer active lanes per instruction: the added
  work runs on a few threads while the others wait at the barrier (`faprof.advisor.accounting.barrier_imbalance`).

Rules take a context with `lines` (the bundle's source rows, `faprof.advisor.sources.borrow`'s) and `code`
(parsed kernels kept across rules); they read counters and SASS, never a kernel's or a variant's name.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from faprof.advisor.accounting import barrier_imbalance as imbalance_ratio
from faprof.advisor.accounting import call_account
from faprof.advisor.evidence import Call, Launch, nansum, ok
from faprof.advisor.findings import Finding, big, num, pct_of_share
from faprof.advisor.producers import Instr, blame, dependent_loads, kernel_code, last_writer, register_writers
from faprof.advisor.roles import math_launches
from faprof.advisor.thresholds import value as T

#: MUFU functions (the modifier after MUFU.) that are a division's reciprocal.
RECIPROCALS = ("RCP", "RCP64H")


def launch_code(lz: Launch, call: Call, ctx: Any) -> list[Instr] | None:
    """The launch's kernel as parsed SASS with its samples per instruction, from the source rows of the call's
    shape, else of a profiled shape of the variant whose launch ran the same template instantiation (the
    same full demangled name: the same SASS; a D=64 shape never reads the D=128 kernel's code); None
    without such rows. Parsed once per (variant, shape, kernel) and kept in `ctx.code`; the rows are
    grouped once per bundle."""
    lines = getattr(ctx, "lines", None)
    if lines is None or lines.empty or "pc" not in lines.columns:
        return None
    memo = ctx.code
    asked = ("asked", call.variant, call.shape_id, lz.kernel)
    if asked in memo:
        return memo[asked]
    groups = memo.get("groups")
    if groups is None:  # the SASS rows of each (variant, kernel), split once instead of filtered per rule and call
        sass = lines[lines["pc"].notna()]
        groups = memo["groups"] = {k: g for k, g in sass.groupby(["variant", "kernel"], sort=False)}
    mine = groups.get((call.variant, lz.kernel))
    code = None
    if mine is not None and not mine.empty:
        shape: str | None = call.shape_id
        if not (mine["shape_id"] == call.shape_id).any():
            names = getattr(ctx, "demangled", {})
            same = names.get((call.variant, call.shape_id, lz.kernel))
            shape = next((str(s) for s in dict.fromkeys(mine["shape_id"])
                          if names.get((call.variant, str(s), lz.kernel)) == same), None)
        if shape is not None:
            key = (call.variant, shape, lz.kernel)
            if key not in memo:
                memo[key] = kernel_code(mine[mine["shape_id"] == shape])
            code = memo[key] or None
    memo[asked] = code
    return code


# ------------------------------------------------------------------------------------ memory classes
def global_atomics(lz: Launch, call: Call, ctx: Any) -> Finding | None:
    """Global atomics and reductions moving at least ATOMIC_MIN_SHARE of the kernel's L2 sectors: each is a
    read-modify-write done at L2 (one per key per lane: as many round trips as updates, serialised where lanes
    share an address), a cause of its own rather than loads that fetch too many sectors."""
    atom, red = lz.metric("l2_sectors_atom"), lz.metric("l2_sectors_red")
    moved = nansum(atom, red)
    total = nansum(lz.metric("l2_sectors_read"), lz.metric("l2_sectors_write"), moved)
    if not (ok(moved) and ok(total) and total > 0 and moved > 0):
        return None
    share = moved / total
    if share < T("ATOMIC_MIN_SHARE"):
        return None
    inst = nansum(lz.metric("global_atom_inst"), lz.metric("global_red_inst"))
    req = nansum(lz.metric("global_atom_requests"), lz.metric("global_red_requests"))
    per_req = f"; {num(moved / req, '.1f')} L2 sectors per atomic request" if ok(req) and req > 0 else ""
    busy = lz.stall_share("long_scoreboard", "lg_throttle", "drain", "membar")
    ev = (f"global atomics and reductions move {big(moved)} of {big(total)} L2 sectors ({pct_of_share(share)}: "
          f"{big(atom if ok(atom) else 0)} atomic, {big(red if ok(red) else 0)} reduction sectors)"
          + (f", {big(inst)} ATOMG/RED warp instructions" if ok(inst) and inst > 0 else "") + per_req
          + (f"; warps stalled on long scoreboard, LG throttle, drain and membar {pct_of_share(busy)} of cycles" if ok(busy) else "")
          + f"; {pct_of_share(lz.share)} of the call's kernel time")
    fix = ("accumulate in registers or shared memory and write once per tile (a block-level reduction, then one "
           "atomic or a plain store per output), or give each key's update to one owner instead of an atomic per "
           "lane per key")
    gain = lz.share * min(1.0, share * (busy if ok(busy) and busy > 0 else 0.5) * 2)
    return Finding(call.variant, call.shape_id, "global_atomics", min(1.0, gain), ev, fix, "global_atomics",
                   kernel=lz.kernel)


def dependent_global_loads(lz: Launch, call: Call, ctx: Any) -> Finding | None:
    """Global loads whose address comes from a prior global load (an index table): at least
    DEPENDENT_LOAD_MIN_SHARE of the kernel's long-scoreboard samples charged to the loads of such chains (the
    index loads and the loads they address)."""
    code = launch_code(lz, call, ctx)
    if not code:
        return None
    key = ("deps", id(code))  # the parsed code lives in ctx.code as long as ctx: its id stays its own
    if key not in ctx.code:
        ctx.code[key] = dependent_loads(code)
    deps = ctx.code[key]
    if not deps:
        return None
    if ("ls_blame", id(code)) not in ctx.code:
        b = blame(code, ("long_scoreboard",))
        ctx.code[("ls_blame", id(code))] = b[b["reason"] == "long_scoreboard"]
    b = ctx.code[("ls_blame", id(code))]
    total = float(b["samples"].sum())
    if total <= 0:
        return None
    chain = set(deps) | {i for idx in deps.values() for i in idx}
    held = float(b.loc[b["producer_index"].isin(chain), "samples"].sum())
    share = held / total
    if share < T("DEPENDENT_LOAD_MIN_SHARE"):
        return None
    top = max(deps, key=lambda i: float(b.loc[b["producer_index"] == i, "samples"].sum()))
    index = code[min(deps[top])]
    stalled = lz.stall_share("long_scoreboard")
    ev = (f"{len(deps)} global load(s) take their address from another global load's result: "
          f"`{code[top].sass}` at {code[top].file.rsplit('/', 1)[-1]}:{code[top].line} is addressed by "
          f"`{index.sass}` at {index.file.rsplit('/', 1)[-1]}:{index.line}; {pct_of_share(share)} of the long-scoreboard "
          f"samples are charged to these chains (two memory latencies in series per element)"
          + (f"; long scoreboard {pct_of_share(stalled)} of warp cycles" if ok(stalled) else "")
          + f"; {pct_of_share(lz.share)} of the call's kernel time")
    fix = ("load the index table once per tile (into registers or shared memory, a tile of indices ahead) and "
           "issue the dependent loads for many elements before waiting on any (prefetch the next tile's indices), "
           "or gather whole rows per index (16-byte vectors) instead of one element per index")
    gain = lz.share * share * (stalled if ok(stalled) else 0.5)
    return Finding(call.variant, call.shape_id, "dependent_global_loads", min(1.0, gain), ev, fix,
                   "dependent_global_loads", kernel=lz.kernel)


# ------------------------------------------------------------------------------------ per score
def mufu_mix(code: list[Instr]) -> tuple[dict[str, float], float]:
    """(issue samples by MUFU function ('EX2', 'RCP', ...), divisions' issue samples) of a kernel: the sampled
    instructions issuing ('selected'), in proportion to how often each was executed. A division counts once
    per MUFU.RCP, or per FCHK (IEEE division's range check) where that is more, or per call of a division
    routine. An RCP whose operand an I2F wrote is an integer division's (index arithmetic such as
    `row / group`: I2F.RP, MUFU.RCP, F2I), not a division per score."""
    mufu: dict[str, float] = defaultdict(float)
    fchk: float = 0.0
    calls: float = 0.0
    int_rcp: float = 0.0
    writers = register_writers(code)
    for i, ins in enumerate(code):
        issued = ins.samples.get("selected", 0.0)
        if issued <= 0:
            continue
        if ins.op == "MUFU":
            func = (ins.opcode.split(".") + [""])[1]
            mufu[func] += issued
            if func in RECIPROCALS and any((w := last_writer(code, writers, i, r)) is not None and w.op.startswith("I2F")
                                           for r in ins.srcs):
                int_rcp += issued
        elif ins.op == "FCHK":
            fchk += issued
        elif ins.op == "CALL" and "div" in ins.sass.lower():
            calls += issued
    return dict(mufu), max(sum(mufu.get(r, 0.0) for r in RECIPROCALS) - int_rcp, fchk) + calls


def sass_per_score(lz: Launch, call: Call, ctx: Any, xu_per_score: float) -> dict[str, float] | None:
    """MUFU functions and divisions per computed score, the kernel's XU instructions per score split by the
    MUFU instructions' issue samples: {'EX2': .., 'RCP': .., 'division': .., ...}; None without
    per-instruction rows or MUFU samples."""
    code = launch_code(lz, call, ctx)
    if not code or not ok(xu_per_score):
        return None
    mufu, divisions = mufu_mix(code)
    total = sum(mufu.values())
    if total <= 0:
        return None
    out = {f: xu_per_score * v / total for f, v in mufu.items()}
    out["division"] = xu_per_score * divisions / total
    return out


def per_score_text(mix: dict[str, float]) -> str:
    """'1.00 MUFU.EX2, 1.00 MUFU.RCP per score; 1.00 division per score' from sass_per_score."""
    funcs = ", ".join(f"{num(v, '.2f')} MUFU.{f}" for f, v in sorted(mix.items(), key=lambda x: -x[1])
                      if f != "division" and v >= 0.01)
    return f"{funcs} per score (issue samples per SASS instruction); {num(mix['division'], '.2f')} divisions per score"


# ------------------------------------------------------------------------------------ against a reference
def barrier_imbalance(call: Call, ref: Call) -> list[Finding]:
    """At equal barrier counts (CBU instructions within SAME_COUNT_RATIO), barrier warp-cycles that grew by at
    least BARRIER_IMBALANCE_RATIO x the warp-cycles every other state added: the added work runs on a few warps
    of each block while the others wait at the barrier, and the active lanes per instruction fell by more than
    one (the work runs on fewer threads: one thread doing the block's loading). Claims the barrier term and the
    inactive lanes. Without the lanes' sign no finding: the barrier wait stays its own term (it can be exposed
    memory latency, every warp waiting for the slowest one's copy), never folded into a pipe's."""
    a, b = call_account(call, math_launches(call)), call_account(ref, math_launches(ref))
    if a is None or b is None:
        return []
    if a.pipes.get("cbu", 0.0) > T("SAME_COUNT_RATIO") * b.pipes.get("cbu", 0.0):
        return []
    ratio = imbalance_ratio(a, b)
    if not ratio >= T("BARRIER_IMBALANCE_RATIO"):
        return []
    added = a.warp_cycles.get("barrier", 0.0) - b.warp_cycles.get("barrier", 0.0)
    q = 1 / (1 + ratio) if math.isfinite(ratio) else 0.0
    lanes = ok(a.active_lanes) and ok(b.active_lanes) and a.active_lanes < b.active_lanes - 1
    if not lanes:
        # no sign of work on fewer threads: a barrier wait grown beyond the other states can also be exposed
        # memory latency (warps waiting at the barrier for the slowest sibling's copy: Triton without software
        # pipelining, tests/data/triton_variants), which the barrier's own term says
        return []
    ev = (f"at equal barrier counts ({big(a.pipes.get('cbu', 0.0))} vs {big(b.pipes.get('cbu', 0.0))} CBU warp "
          f"instructions), warps waited {big(added)} warp-cycles more at barriers, "
          + (f"{num(ratio, '.1f')}x" if math.isfinite(ratio) else "while no other state added any of")
          + " the warp-cycles every other state added: the added work runs on at most "
          f"{pct_of_share(q)} of a block's warps while the others wait at the barrier; {num(a.active_lanes)} vs "
          f"{num(b.active_lanes)} active lanes per instruction (the work on fewer threads)")
    fix = ("share the work before the barrier over every thread of the block (each thread loads its part of the "
           "tile, coalesced), or let producer warps run ahead (cp.async/TMA with mbarriers) so consumers do not wait "
           "for one thread at __syncthreads")
    gain = min(1.0, added / a.total_warp_cycles) if a.total_warp_cycles > 0 else math.nan
    return [Finding(call.variant, call.shape_id, "barrier_imbalance", gain, ev, fix, "barrier_imbalance",
                    claims=("lanes:inactive",))]
