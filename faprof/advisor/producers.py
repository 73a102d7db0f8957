"""Blame the producer: a dependency stall charged to the instruction that produced what the stalled one waits for.

Nsight Compute samples a warp at the instruction it is stalled *on*: a long-scoreboard stall sits on
the FFMA that consumes a loaded register, not on the load. The load is the cause (its bytes, where they
came from); the FFMA is where the wait shows. As HPCToolkit's GPA does (Zhou et al., "GPA: A GPU
Performance Advisor Based on Instruction Sampling", CGO 2021: backward slicing over the SASS def-use
chains), each dependency stall of an instruction is charged to the instructions that last wrote its
source registers (or, for the scoreboards, the registers it overwrites) before it, among those whose
latency that stall reason waits for:

- long_scoreboard: L1TEX operations (global, local, texture loads, atomics; cp.async through the
  DEPBAR that waits for it, whose wait the sampler often shows on the instruction after it);
- short_scoreboard: MIO operations (shared-memory loads, ldmatrix, MUFU, shuffles, S2R);
- wait: fixed-latency arithmetic (any other writer);
- throttles (mio, lg, tex, math pipe), barrier, membar, branch_resolving and the rest are the stalled
  instruction's own (its pipe is full, it is the barrier): charged to itself.

The search walks back from the consumer in program order and wraps around once (a loop body's
registers come from the previous iteration's end), like a backward slice over the loop's back edge;
control codes (scoreboard masks) are not in ncu's SASS text, so registers are the dependencies. A
stall with several producers is split evenly between them.

Input: the source pass's per-instruction rows (`faprof.nsight.ncu.source`: metric 'sass' rows carry
each instruction's SASS, file and line; 'sass:stall:<reason>' rows its samples).
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

#: Stall reasons charged to a producer, and the producers' opcodes (mnemonic before the first '.').
L1TEX_OPS = frozenset({"LDG", "LD", "LDL", "TLD", "TEX", "TLD4", "ATOM", "ATOMG", "SULD", "LDGSTS", "SUATOM",
                       "STG", "STL", "ST", "RED"})
MIO_OPS = frozenset({"LDS", "LDSM", "MUFU", "SHFL", "S2R", "ATOMS", "POPC", "FLO", "BREV", "LDC", "I2F", "F2I",
                     "F2F", "I2I", "FRND", "DSETP", "DADD", "DFMA", "DMUL", "ULDC"})
PRODUCER_REASONS = ("long_scoreboard", "short_scoreboard", "wait")

#: Opcodes that write no register of their first operand (stores, branches, barriers, reductions).
NO_DEST = frozenset({"ST", "STG", "STS", "STL", "RED", "BAR", "BRA", "BRX", "EXIT", "RET", "CALL", "JMP", "BSSY",
                     "BSYNC", "WARPSYNC", "MEMBAR", "FENCE", "ERRBAR", "DEPBAR", "LDGDEPBAR", "NOP", "YIELD",
                     "NANOSLEEP", "CCTL", "LDGSTS", "STSM", "UTMALDG", "UTMASTG", "SYNCS", "ARRIVES", "BPT",
                     "WARPGROUP", "RPCMOV"})

_GUARD = re.compile(r"^\s*@(!?)(U?P[0-9T]+)\s+")
_REG = re.compile(r"\b(U?R)(\d+|Z)(?:\.(64|128))?\b")
_PRED = re.compile(r"\b(U?P)(\d)\b")


@dataclass
class Instr:
    """One SASS instruction of a kernel."""

    index: int
    """Position in program order."""
    sass: str
    file: str = ""
    line: int = -1
    opcode: str = ""
    """The mnemonic with its modifiers ('LDG.E.128')."""
    dests: set[str] = field(default_factory=set)
    srcs: set[str] = field(default_factory=set)
    samples: dict[str, float] = field(default_factory=dict)
    """Stall reason -> samples on this instruction."""

    @property
    def op(self) -> str:
        return self.opcode.split(".")[0]


def _width(opcode: str) -> int:
    """Registers a destination operand of this instruction spans (R4 of LDG.E.128 is R4..R7)."""
    mods = opcode.split(".")
    op = mods[0]
    if "128" in mods:
        return 4
    if "64" in mods or "WIDE" in mods or op in ("DFMA", "DADD", "DMUL") or (op == "F2F" and "F64" in mods[1:2]):
        return 2
    if op == "HMMA":
        return 4 if "F32" in mods else 2
    if op == "LDSM" and mods[-1] in ("2", "4"):
        return int(mods[-1])
    return 1


def _regs(token: str, opcode: str, dest: bool) -> set[str]:
    out: set[str] = set()
    for kind, num, size in _REG.findall(token):
        if num == "Z":
            continue
        wide_src = opcode.split(".")[0] in ("DFMA", "DADD", "DMUL", "DSETP", "DMNMX")
        n = {"64": 2, "128": 4}.get(size, _width(opcode) if dest else 2 if wide_src else 1)
        out |= {f"{kind}{int(num) + i}" for i in range(n)}
    out |= {f"{k}{n}" for k, n in _PRED.findall(token) if n != "T"}
    return out


def parse(sass: str, index: int = 0, file: str = "", line: int = -1) -> Instr:
    """One instruction: its opcode, destination registers and source registers (and predicates)."""
    text = sass.strip().rstrip(";")
    srcs: set[str] = set()
    g = _GUARD.match(text)
    if g:
        srcs.add(g.group(2))
        text = text[g.end():]
    opcode, _, rest = text.partition(" ")
    operands = [o.strip() for o in rest.split(",")] if rest.strip() else []
    ins = Instr(index, sass.strip(), file, line, opcode)
    if operands and ins.op not in NO_DEST:
        ins.dests = _regs(operands[0], opcode, True)
        # a predicate written beside the register (SHFL's 'PT, R5, ...', LDS/LDG's '@P' forms write it first)
        if (_PRED.fullmatch(operands[0]) or operands[0] == "PT") and len(operands) > 1 and _REG.match(operands[1]):
            ins.dests |= _regs(operands[1], opcode, True)
            operands = operands[1:]
        # SETP-style instructions write predicates in their first two operands
        if opcode.split(".")[0].endswith("SETP") and len(operands) > 1:
            ins.dests |= _regs(operands[1], opcode, True)
            operands = operands[1:]
        operands = operands[1:]
    for o in operands:
        srcs |= _regs(o, opcode, False)
    ins.srcs = srcs - {"RZ", "PT"}
    return ins


def _wants(reason: str, producer: Instr) -> bool:
    if reason == "long_scoreboard":
        return producer.op in L1TEX_OPS
    if reason == "short_scoreboard":
        return producer.op in MIO_OPS
    return producer.op not in L1TEX_OPS and producer.op not in MIO_OPS


def producers(code: list[Instr], i: int, reason: str) -> list[Instr]:
    """The instructions whose results instruction `i` waits for under `reason` (see the module docstring):
    for each source register, its last writer before `i` (wrapping once around the code); those of the
    class the reason waits for. A DEPBAR waiting on cp.async gets the LDGSTS since the previous DEPBAR."""
    me = code[i]
    n = len(code)
    if me.op in ("DEPBAR", "LDGDEPBAR") and reason == "long_scoreboard":
        out: list[Instr] = []
        for k in range(1, n):
            p = code[(i - k) % n]
            if p.op == "DEPBAR" and out:
                break
            if p.op == "LDGSTS":
                out.append(p)
        return out
    found: dict[int, Instr] = {}
    # read-after-write on its sources; for the scoreboards also its destinations: a register overwritten
    # while a load into it (write after write) or a memory instruction reading it as an address or a value
    # (write after read: LDGSTS, STG keep their operands until issued to L1TEX) is in flight waits for it
    hazards = [(reg, False) for reg in me.srcs]
    if reason in ("long_scoreboard", "short_scoreboard"):
        hazards += [(reg, True) for reg in me.dests]
    for reg, war in hazards:
        for k in range(1, n):
            p = code[(i - k) % n]
            if reg in p.dests or (war and reg in p.srcs):
                if _wants(reason, p):
                    found[p.index] = p
                break
    if not found and reason == "long_scoreboard" and code[(i - 1) % n].op == "DEPBAR":
        # the wait a DEPBAR sets up is taken when the next instruction issues: a long-scoreboard stall there
        # that no register explains waits for the cp.async groups the DEPBAR waits for
        return producers(code, (i - 1) % n, reason)
    return list(found.values())


def kernel_code(rows: pd.DataFrame) -> list[Instr]:
    """One kernel's instructions from its per-instruction source rows (metric 'sass' and
    'sass:stall:<reason>'), in program order (the `pc` column)."""
    text = rows[rows["metric"] == "sass"].sort_values("pc")
    code = [parse(str(r.code), k, str(r.file), int(r.line)) for k, r in enumerate(text.itertuples(index=False))]
    at = {int(pc): k for k, pc in enumerate(text["pc"])}
    stalls = rows[rows["metric"].str.startswith("sass:stall:")]
    for r in stalls.itertuples(index=False):
        k = at.get(int(r.pc))
        if k is not None:
            reason = str(r.metric).removeprefix("sass:stall:")
            code[k].samples[reason] = code[k].samples.get(reason, 0.0) + float(r.value)
    return code


#: Global loads whose address can come from another global load (cp.async included: a gather into shared memory).
GLOBAL_LOADS = frozenset({"LDG", "LD", "LDGSTS"})
#: Integer arithmetic that carries an address from a loaded index to a load (index x stride + base).
ADDRESS_OPS = frozenset({"IMAD", "IMUL", "IADD3", "IADD", "LEA", "SHF", "LOP3", "MOV", "SEL", "PRMT", "SGXT",
                         "IABS", "IMNMX", "VIMNMX", "ISCADD", "R2UR", "UIADD3", "UIMAD", "ULEA", "USHF", "UMOV"})
#: How many address instructions a chain may pass between the index load and the load it addresses.
ADDRESS_DEPTH = 8


def register_writers(code: list[Instr]) -> dict[str, list[int]]:
    """Register -> the indices of the instructions writing it, in program order."""
    out: dict[str, list[int]] = defaultdict(list)
    for k, ins in enumerate(code):
        for d in ins.dests:
            out[d].append(k)
    return out


def last_writer(code: list[Instr], writers: dict[str, list[int]], i: int, reg: str) -> Instr | None:
    """The instruction that last wrote `reg` before instruction i, walking back in program order and once
    around the loop (i itself excluded)."""
    ks = writers.get(reg)
    if not ks:
        return None
    pos = bisect.bisect_left(ks, i)
    if pos > 0:
        return code[ks[pos - 1]]
    return code[ks[-1]] if ks[-1] != i else None


def _index_loads(code: list[Instr], writers: dict[str, list[int]], i: int, regs: set[str], depth: int,
                 seen: set[tuple[str, int]]) -> set[int]:
    """Global loads whose results reach `regs` (read by instruction i) through address arithmetic."""
    out: set[int] = set()
    for reg in regs:
        if not reg.startswith(("R", "UR")) or (reg, i) in seen:
            continue
        seen.add((reg, i))
        w = last_writer(code, writers, i, reg)
        if w is None:
            continue
        if w.op in GLOBAL_LOADS:
            out.add(w.index)
        elif w.op in ADDRESS_OPS and depth > 0:
            out |= _index_loads(code, writers, w.index, w.srcs, depth - 1, seen)
    return out


def dependent_loads(code: list[Instr]) -> dict[int, set[int]]:
    """Global loads whose address is computed from another global load's result: load index -> the indices of
    the loads that produced its address (through at most ADDRESS_DEPTH integer instructions, walking back in
    program order and once around the loop, as `producers` does). An index table read and then used to
    address the data is two memory latencies in series per element."""
    out: dict[int, set[int]] = {}
    writers = register_writers(code)
    for i, ins in enumerate(code):
        if ins.op not in GLOBAL_LOADS:
            continue
        regs = {r for r in ins.srcs if not r.startswith(("P", "UP"))}
        found = _index_loads(code, writers, i, regs, ADDRESS_DEPTH, set()) - {i}
        if found:
            out[i] = found
    return out


#: Columns of blame().
BLAME_COLUMNS = ("reason", "producer_index", "producer_sass", "file", "line", "samples", "consumers")


def blame(code: list[Instr], reasons: tuple[str, ...] = PRODUCER_REASONS) -> pd.DataFrame:
    """Stall samples charged to their producers: one row per (reason, producing instruction), with the
    samples charged and how many stalled instructions they came from. A stall with no producer of its
    class found stays on the stalled instruction (row with itself as producer)."""
    agg: dict[tuple[str, int], float] = defaultdict(float)
    users: dict[tuple[str, int], set[int]] = defaultdict(set)
    for i, ins in enumerate(code):
        for reason, v in ins.samples.items():
            if v <= 0:
                continue
            prods = producers(code, i, reason) if reason in reasons else []
            targets = prods or [ins]
            for p in targets:
                agg[(reason, p.index)] += v / len(targets)
                users[(reason, p.index)].add(ins.index)
    rows = [{"reason": r, "producer_index": k, "producer_sass": code[k].sass, "file": code[k].file,
             "line": code[k].line, "samples": v, "consumers": len(users[(r, k)])} for (r, k), v in agg.items()]
    return pd.DataFrame(rows, columns=list(BLAME_COLUMNS)).sort_values("samples", ascending=False, ignore_index=True)


def top_producer(lines: pd.DataFrame, variant: str, shape_id: str, reason: str,
                 memo: dict[tuple[str, str, str], list[Instr]] | None = None) -> dict | None:
    """The instruction most of `reason`'s samples are charged to, for one call's source rows: file, line,
    sass, share of the reason's samples; None when the rows carry no per-instruction data. `memo`: parsed
    kernels by (variant, shape, kernel), kept by the caller across calls on the same rows (a diagnosis
    locates several causes, at several shapes, in one profiled kernel)."""
    if lines.empty or "pc" not in lines.columns:
        return None
    mine = lines[(lines["variant"] == variant) & (lines["shape_id"] == shape_id) & lines["pc"].notna()]
    if mine.empty:
        return None
    best = None
    for kernel, rows in mine.groupby("kernel", sort=False):
        key = (variant, shape_id, str(kernel))
        code = memo.get(key) if memo is not None else None
        if code is None:
            code = kernel_code(rows)
            if memo is not None:
                memo[key] = code
        b = blame(code, (reason,))
        b = b[b["reason"] == reason]
        total = float(b["samples"].sum())
        if b.empty or total <= 0:
            continue
        r = b.iloc[0]
        hit = {"file": r["file"], "line": int(r["line"]), "code": r["producer_sass"], "value": float(r["samples"]),
               "share": float(r["samples"]) / total}
        if best is None or hit["value"] > best["value"]:
            best = hit
    return best
