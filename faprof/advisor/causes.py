"""The causes the advisor can name: one record per cause, everything the advisor knows about it by key.

A `Cause` holds a cause's title and kind, the gap terms it claims as a mechanism and the byte counts it
absorbs (`faprof.advisor.partition`), the source metrics that locate it (`faprof.advisor.sources`), the
fix and meaning said when it is a term of the accounting (`faprof.advisor.gap_findings`), and whether it
can be a fact about a shape (`faprof.advisor.diagnose`). `CAUSES` holds every record, in the order the
reference page lists them; `record(key)` reads one and raises on a key that has none, so a part is never
skipped silently. A new cause is one record here (and the rule that names it).

Planted-fault tests, the report and bundles refer to causes by key; a finding naming a key with no
record is an error (`faprof.advisor.findings.Finding`).
"""

from __future__ import annotations

from dataclasses import dataclass

from faprof.nsight.ncu.catalogue_stalls import PIPE_ADVICE, STALL_ADVICE, Advice

#: Kinds of finding, in the order a ranked list shows them after the primary one.
#:   correctness: wrong results (always first);
#:   defect: a mechanism in the kernel or the call that costs time and can be removed, named from
#:     its own evidence (spills, bank conflicts, fp64 math, divergence, ...);
#:   limit: a limit of the chosen design (instruction, grid shape, host) with a measurable cost;
#:   term: a term of the accounting no mechanism claims: a warp state (stall reason), a pipe's
#:     instructions, lanes, warps resident or idle SMs, with its share of the time or of the gap;
#:   position: where the kernel sits on the roofline (memory-, compute- or latency-bound): primary
#:     only when no defect, limit or term explains PRIMARY_MIN_GAIN of the call;
#:   ncu: a rule result of Nsight Compute's own with its estimated speedup (never primary);
#:   note: a fact that prevents a wrong conclusion (no gain, never primary).
KINDS = ("correctness", "defect", "limit", "term", "position", "ncu", "note")


@dataclass(frozen=True)
class Cause:
    """One cause the advisor can name."""

    key: str
    title: str
    kind: str
    """One of KINDS."""
    claims: tuple[str, ...] = ()
    """Gap terms the cause explains as a mechanism, when it holds for the slower call and not as much for
    the reference ('pipe:*': every pipe). Where two claim one term, the first in MECHANISMS wins."""
    absorbs: tuple[str, ...] = ()
    """Byte-count mechanisms this one says *why* of: where both hold, the byte count is its symptom and
    its terms are this cause's."""
    metrics: tuple[str, ...] = ()
    """Source metrics ('stall:x', 'pipe:x') that locate the cause's lines, in order of preference; the
    lines where the kernel's warps spend most samples come after them (a cause with none points there)."""
    fix: str = ""
    """What to do, said when the cause is a term of the gap's accounting (rules write their own fix)."""
    meaning: str = ""
    """What the term is (the ncu catalogue's meaning of a stall reason or pipe), or ''."""
    of_shape: bool = False
    """Whether it can be a fact about a shape rather than a kernel: when the fastest call has it as much as
    most calls do, it is said once for the shape."""


def _advice_fix(a: Advice) -> str:
    return f"{a.fix} (points to: {a.points_to})"


#: Pipe terms titled otherwise than '<pipe> instructions'.
_PIPE_TITLES = {"fma_int": "integer multiply-adds on the FMA pipe (IMAD)"}
#: Pipe terms located otherwise than at their own instructions' lines. IMAD lines: `pipe:fma_int` in source
#: passes that count it apart, inside `pipe:fma` in older ones.
_PIPE_METRICS = {"fma_int": ("pipe:fma_int", "pipe:fma")}

_C = Cause
_RECORDS: tuple[Cause, ...] = (
    _C("correctness", "wrong results", "correctness"),
    # local loads and stores, and the address products (IMAD) a register cap makes the compiler recompute
    _C("register_spills", "register spills", "defect",
       claims=("stall:long_scoreboard", "stall:lg_throttle", "pipe:lsu", "pipe:fma_int"),
       absorbs=("excess_dram_bytes", "excess_onchip_bytes", "global_rmw"),
       metrics=("stall:lg_throttle", "stall:long_scoreboard")),
    # one load per narrow element: the load instructions, their per-lane address products (IMAD; address
    # divergence on the ADU) and the waits on the sectors they fetch
    _C("uncoalesced_global", "uncoalesced global access", "defect",
       claims=("stall:long_scoreboard", "stall:lg_throttle", "stall:tex_throttle", "pipe:lsu", "pipe:fma_int",
               "pipe:adu"),
       absorbs=("excess_dram_bytes", "excess_onchip_bytes"),
       metrics=("stall:long_scoreboard", "stall:lg_throttle")),
    # read-modify-writes done at L2 (ATOMG/RED): their waits (a returning atomic), the LG queue and the drain
    # at exit they fill, their instructions and per-key addresses; the excess sectors and read-backs they show
    _C("global_atomics", "global atomics", "defect",
       claims=("stall:long_scoreboard", "stall:lg_throttle", "stall:drain", "stall:membar", "pipe:lsu", "pipe:fma_int",
               "pipe:adu"),
       absorbs=("uncoalesced_global", "global_rmw", "excess_dram_bytes", "excess_onchip_bytes"),
       metrics=("stall:long_scoreboard", "stall:lg_throttle", "stall:drain", "pipe:lsu")),
    # an index table read, then the data it addresses: two latencies in series per element, their LSU
    # instructions and the address products between them
    _C("dependent_global_loads", "dependent global loads (addresses read from an index table)", "defect",
       claims=("stall:long_scoreboard", "stall:lg_throttle", "stall:tex_throttle", "pipe:lsu", "pipe:fma_int",
               "pipe:adu"),
       absorbs=("uncoalesced_global", "excess_dram_bytes", "excess_onchip_bytes"),
       metrics=("stall:long_scoreboard", "stall:lg_throttle")),
    # warps waiting at a barrier for work a few of them do (one thread loading the tile): the barrier's wait
    # is the imbalance's, never the pipe issuing that work (inactive lanes too, where the finding says so)
    _C("barrier_imbalance", "warps wait at barriers for work few of them do (imbalance)", "defect",
       claims=("stall:barrier",), metrics=("stall:barrier",)),
    _C("smem_bank_conflicts", "shared-memory bank conflicts", "defect",
       claims=("stall:mio_throttle", "stall:short_scoreboard"),
       metrics=("stall:mio_throttle", "stall:short_scoreboard")),
    # matrix products on CUDA cores: every multiply-add an FFMA/HFMA2, its operands loaded from shared memory
    # one by one, their addresses computed, the loops around them: more instructions of every pipe
    _C("tensor_cores_unused", "tensor cores unused", "defect",
       claims=("pipe:*", "stall:math_pipe_throttle"), metrics=("pipe:fma", "pipe:fp16")),
    # DFMA/DADD chains wait their fixed latency; conversions to and from double (F2F) run on the ALU
    _C("fp64_arithmetic", "fp64 arithmetic", "defect",
       claims=("pipe:fp64", "stall:math_pipe_throttle", "stall:wait", "pipe:alu"), metrics=("pipe:fp64",)),
    # accurate expf/powf and IEEE division: MUFU work plus FMA-pipe range reduction and Newton steps
    # (range reduction on the ALU, the IEEE division's FCHK and its slow-path branch on the CBU)
    _C("transcendentals", "special functions beyond one exp2 per score", "defect",
       claims=("pipe:xu", "pipe:fma", "pipe:alu", "pipe:cbu", "stall:math_pipe_throttle", "stall:branch_resolving",
               "stall:no_instructions"),
       metrics=("pipe:xu", "pipe:fma")),
    # work that cannot contribute (tiles above the causal diagonal, padding) is more of every instruction
    _C("wasted_work", "wasted work", "defect", claims=("pipe:*", "lanes:predicated_off")),
    # the same FLOPs on a slower path: that path's instructions and the waits its latency adds
    _C("slower_math_path", "the same math on a slower path", "defect",
       claims=("pipe:tensor_hmma", "pipe:tensor_gmma", "pipe:tensor_dmma", "pipe:fma", "pipe:fp16", "pipe:fp64",
               "pipe:alu", "stall:math_pipe_throttle", "stall:wait", "stall:mio_throttle", "stall:short_scoreboard"),
       metrics=("pipe:tensor_hmma", "pipe:tensor_gmma", "pipe:fma", "pipe:fp64", "pipe:fp16")),
    # bytes that should not move: the waits on the memory that moves them and the instructions moving them
    _C("excess_dram_bytes", "DRAM bytes beyond the comparator's", "defect",
       claims=("stall:long_scoreboard", "stall:lg_throttle", "stall:drain", "stall:barrier", "pipe:lsu"),
       metrics=("stall:long_scoreboard", "stall:lg_throttle", "pipe:lsu")),
    _C("global_rmw", "global read-modify-write inside the loop", "defect",
       claims=("stall:long_scoreboard", "stall:lg_throttle", "stall:drain", "stall:membar", "pipe:lsu"),
       metrics=("stall:long_scoreboard", "stall:lg_throttle", "stall:drain", "pipe:lsu")),
    _C("excess_onchip_bytes", "on-chip bytes per FLOP beyond the comparator's (smaller tiles)", "defect",
       claims=("stall:long_scoreboard", "stall:lg_throttle", "stall:mio_throttle", "stall:short_scoreboard",
               "stall:barrier", "pipe:lsu", "pipe:alu", "pipe:uniform"),
       metrics=("stall:mio_throttle", "stall:short_scoreboard", "stall:long_scoreboard", "pipe:lsu")),
    # a grid too small to fill the SMs leaves schedulers idle and also caps the warps the busy ones hold
    _C("too_few_ctas", "too few CTAs", "defect", claims=("idle", "occupancy"), of_shape=True),
    _C("launch_split", "one launch per slice", "defect", claims=("idle", "occupancy"), of_shape=True),
    # kernels that hand bytes to each other: the data-movement kernels' time (`faprof.advisor.roles`)
    _C("kernels_per_call", "kernels per call (fusion)", "defect",
       claims=("kernels:input_copies", "kernels:data_movement")),
    _C("kernels:input_copies", "data-movement kernels before the math (copies, casts, preprocessing of the inputs)",
       "term", fix=("read the inputs in place: index the original tensors inside the attention kernel (their "
                    "strides, a dtype conversion on load, KV head = query head // group) instead of copying, casting "
                    "or transposing them first, and compute per-row preprocessing where the math kernel loads the rows")),
    _C("kernels:data_movement", "data-movement kernels between or after the math kernels", "term",
       fix=("fewer kernels that only move data: keep intermediates on chip instead of handing them to another "
            "kernel, and write the output once, in its final layout and dtype")),
    _C("mma_sync_on_hopper", "mma.sync on Hopper", "limit", claims=("pipe:tensor_hmma", "pipe:lsu"),
       metrics=("pipe:tensor_hmma",)),
    _C("wave_tail", "wave quantization / tail", "limit", claims=("idle", "occupancy"), of_shape=True),
    _C("launch_overhead", "launch overhead", "limit", of_shape=True),
    _C("occupancy_limit", "fewer warps resident (occupancy)", "limit"),
    _C("memory_bound", "memory-bound", "position", of_shape=True),
    _C("compute_bound", "compute-bound", "position", of_shape=True),
    _C("latency_bound", "latency-bound", "position", of_shape=True),
    _C("ncu_rule", "Nsight Compute rule", "ncu"),
    _C("tf32_emulation", "fp32 emulated with TF32", "note"),
    _C("shape_note", "the shape, not the kernel", "note"),
    _C("missing_counters", "accounting not possible", "note"),
    _C("ahead", "where it is ahead of the reference", "note"),
    _C("level", "level with the comparator (within noise)", "note"),
    _C("at_bound", "at its bound (the measured ceiling)", "note"),
    # ---- accounting terms (faprof.advisor.differential / accounting), one per warp state and pipe
    *(_C(f"stall:{r}", f"warps stalled: {r.replace('_', ' ')}", "term", metrics=(f"stall:{r}",),
         fix=_advice_fix(a), meaning=a.meaning)
      for r, a in STALL_ADVICE.items() if r != "selected"),
    *(_C(f"pipe:{p}", _PIPE_TITLES.get(p, f"{p.replace('_', ' ')} instructions"), "term",
         metrics=_PIPE_METRICS.get(p, (f"pipe:{p}",)), fix=_advice_fix(a), meaning=a.meaning)
      for p, a in PIPE_ADVICE.items()),
    _C("lanes:inactive", "inactive lanes (warp divergence)", "term", metrics=("stall:branch_resolving",),
       fix="keep a warp's lanes on one path: move lane-dependent branches out of the inner loop, give each warp whole rows"),
    _C("lanes:predicated_off", "predicated-off lanes", "term",
       fix="fewer masked lanes: skip fully masked tiles, peel the tail tile out of the main loop"),
    _C("occupancy", "fewer warps resident", "term",
       fix="fewer registers or less shared memory per block, or more warps per block, so more warps are resident"),
    _C("idle", "idle SMs (active fraction)", "term", of_shape=True,
       fix="more blocks than SMs, a whole number of waves, or a persistent grid with a tile scheduler"),
    _C("smsps", "fewer schedulers (another GPU)", "term", fix="see the term's meaning"),
    _C("clock", "lower SM clock", "term",
       fix="the GPU ran slower during this row (power or thermal state): compare at equal clocks"),
)

#: Every cause by key, in the order the reference page lists them.
CAUSES: dict[str, Cause] = {c.key: c for c in _RECORDS}

#: The order in which mechanisms claim terms (`faprof.advisor.partition`): a path or a byte count that
#: differs from the reference's is a root; mechanisms with their own precise counters next; shapes of the
#: launch last. Exactly the causes with claims.
MECHANISMS = ("slower_math_path", "register_spills", "global_atomics", "dependent_global_loads", "smem_bank_conflicts",
              "uncoalesced_global", "barrier_imbalance", "wasted_work",
              "fp64_arithmetic", "transcendentals", "tensor_cores_unused", "global_rmw", "excess_dram_bytes",
              "kernels_per_call", "excess_onchip_bytes", "mma_sync_on_hopper", "launch_split", "too_few_ctas",
              "wave_tail")

#: Causes that are defects (what the planted-fault kernels plant); the control must not get one.
DEFECT_CAUSES = frozenset(k for k, c in CAUSES.items() if c.kind == "defect")


def record(key: str) -> Cause:
    """The record of a cause; KeyError for a key that has none (never an empty default)."""
    try:
        return CAUSES[key]
    except KeyError:
        raise KeyError(f"advisor cause {key!r} is not in faprof.advisor.causes.CAUSES") from None


def problems(records: dict[str, Cause] | None = None, order: tuple[str, ...] | None = None) -> list[str]:
    """What is missing or inconsistent in the records (default: CAUSES and MECHANISMS), one line each; [] when
    every cause has the parts its kind needs: a known kind and a title; a defect claims terms (else its time
    in a gap goes to the terms it produces, unnamed); the mechanisms are exactly the causes with claims; a
    claim is a term of the accounting; an absorbed cause is a mechanism; a mechanism claiming a stall or a
    pipe has source metrics, each a term it claims; a term of the accounting has a fix."""
    recs = CAUSES if records is None else records
    mechs = MECHANISMS if order is None else order
    terms = {k for k, c in recs.items() if c.kind == "term"} | {"pipe:*"}
    out = []
    for k, c in recs.items():
        if c.key != k or c.kind not in KINDS or not c.title:
            out.append(f"{k}: key, kind ({c.kind!r}) or title wrong")
        if c.kind == "defect" and not c.claims:
            out.append(f"{k}: a defect that claims no gap term")
        if bool(c.claims) != (k in mechs):
            out.append(f"{k}: claims terms but is not in MECHANISMS, or is in it and claims none")
        out += [f"{k}: claims {t!r}, not a term of the accounting" for t in c.claims if t not in terms]
        out += [f"{k}: absorbs {a!r}, not a mechanism" for a in c.absorbs if a not in mechs]
        if k in mechs and not c.metrics and any(t.startswith(("stall:", "pipe:")) and t != "pipe:*" for t in c.claims):
            out.append(f"{k}: claims stalls or pipes but has no source metric to locate them")
        if k in mechs:
            out += [f"{k}: locates at {m!r}, which it does not claim" for m in c.metrics
                    if m not in c.claims and not (m.startswith("pipe:") and "pipe:*" in c.claims)]
        out += [f"{k}: metric {m!r} is not a stall or pipe term" for m in c.metrics
                if not (m.startswith(("stall:", "pipe:")) and m in terms)]
        if c.kind == "term" and not c.fix:
            out.append(f"{k}: a term of the accounting with no fix")
    out += [f"MECHANISMS names {m!r}, which has no record" for m in mechs if m not in recs]
    return out
