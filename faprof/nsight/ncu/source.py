"""Source lines: a second, bounded Nsight Compute pass that puts stall samples and instructions on lines.

The faprof set says how a kernel's time splits over stall reasons and pipes; it does not say where in
the code. Nsight Compute's SourceCounters section does, per program counter: warp-state samples by
reason (PC sampling) and executed instructions (SASS patching), and with line info in the binary
(`-lineinfo`: faprof's kernels, `--kernel` .cu files; Triton emits it) each PC maps to a file and a
line. That section costs extra replay passes per kernel, so this pass profiles only the kernels that
dominate each variant's time: per variant, its longest kernel at its largest profiled shape (`auto`),
or every kernel the faprof-set pass profiled (`all`).

`read_source` turns a report into the long `source_lines` table: one row per (variant, shape_id,
kernel, file, line, metric) with metric 'samples' (all warp-state samples on the line), 'stall:<reason>'
(samples of one reason; 'stall:selected' is issuing), 'inst_executed' (warp instructions executed, when
the SourceCounters section collected them) and 'pipe:<pipe>' (the line's instructions whose SASS opcode
runs on that pipe: executed instructions when counted, else issuing samples, for pointing a pipe's cause
at a line); `code` holds the line's text when ncu imported the source.

Per instruction too (`pc` set, NaN on line rows): metric 'sass' (one row per sampled instruction: its
SASS in `code`, its file and line, its samples in `value`) and 'sass:stall:<reason>' (its samples of one
reason), from which `faprof.advisor.producers` charges each dependency stall to the instruction that
produced what the stalled one waits for. Instructions never sampled have no row.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.nsight.ncu.catalogue_core import ALL_KERNELS
from faprof.nsight.ncu.launch_metrics import plan_index
from faprof.nsight.ncu.nvtx_ranges import kernel_ranges
from faprof.nsight.ncu.parse import load_report_module
from faprof.nsight.ncu.read import load_plan

#: Modes of the source pass: 'auto' (each variant's dominant kernel), 'all' (every profiled kernel), 'off'.
SOURCE_MODES = ("auto", "all", "off")

#: The mode `faprof profile --ncu` uses unless told otherwise.
DEFAULT_SOURCE_MODE = "auto"

#: What the source pass collects: warp-state sampling per program counter (one replay pass per kernel).
#: 'stall:selected' samples (a warp issuing that PC) stand for the instruction mix per line, so the
#: SASS-patching counters of the SourceCounters section (5 passes per kernel on the H100: 43 s for 17
#: kernels against 148 s for the faprof set's 243, 2026-11-25) are not needed.
SOURCE_METRICS = ("group:smsp__pcsamp_warp_stall_reasons",)

#: The section used instead when this ncu does not take the metric group.
SOURCE_SECTIONS = ("SourceCounters",)

#: Columns of the source_lines table.
SOURCE_COLUMNS = ("variant", "shape_id", "kernel", "file", "line", "code", "metric", "value", "pc")

#: Most lines kept per (kernel, metric): the ranking only ever quotes the top few.
MAX_LINES_PER_METRIC = 40

#: SASS opcode (the mnemonic before the first '.') -> the accounting's pipe, for pointing a pipe's
#: cause at the lines that issue it. Opcodes not listed count only in 'inst_executed'.
OPCODE_PIPES: dict[str, str] = {
    **dict.fromkeys(("HMMA", "IMMA"), "tensor_hmma"),
    **dict.fromkeys(("HGMMA", "QGMMA", "IGMMA", "BGMMA", "WARPGROUP"), "tensor_gmma"),
    "DMMA": "tensor_dmma",
    **dict.fromkeys(("FFMA", "FADD", "FMUL", "FMNMX", "FSWZADD", "FCHK"), "fma"),
    # integer multiply-adds issue on the FMA pipe; the accounting counts them apart (its `fma_int`)
    **dict.fromkeys(("IMAD", "IMUL", "IDP"), "fma_int"),
    **dict.fromkeys(("HFMA2", "HADD2", "HMUL2", "HMNMX2", "HSETP2", "HSET2"), "fp16"),
    **dict.fromkeys(("DFMA", "DADD", "DMUL", "DSETP", "DMNMX"), "fp64"),
    **dict.fromkeys(("MUFU",), "xu"),
    **dict.fromkeys(("IADD3", "LOP3", "ISETP", "SHF", "LEA", "SEL", "PRMT", "FSETP", "FSEL", "IABS", "IMNMX",
                     "F2F", "F2I", "I2F", "I2FP", "F2FP", "FRND", "POPC", "FLO", "BREV", "SGXT", "VIMNMX",
                     "PLOP3", "P2R", "R2P", "MOV", "SHFL", "VOTE"), "alu"),
    **dict.fromkeys(("LDS", "STS", "LDSM", "STSM", "LDG", "STG", "LDL", "STL", "LDGSTS", "ATOM", "ATOMS", "ATOMG",
                     "RED", "LD", "ST", "LDC", "LDGDEPBAR", "MEMBAR", "CCTL", "ERRBAR", "FENCE"), "lsu"),
    **dict.fromkeys(("BAR", "BRA", "BRX", "BSSY", "BSYNC", "WARPSYNC", "EXIT", "CALL", "RET", "YIELD", "NANOSLEEP",
                     "BPT", "BMOV", "JMP"), "cbu"),
    **dict.fromkeys(("UIADD3", "ULOP3", "UISETP", "USHF", "ULEA", "USEL", "UMOV", "UPRMT", "UIMAD", "ULDC",
                     "UBMSK", "UFLO", "UPOPC", "S2UR", "R2UR", "UPLOP3"), "uniform"),
    **dict.fromkeys(("UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF", "UTMACCTL", "UBLKRED", "UTMAREDG"), "tma"),
}

_OPCODE_RE = re.compile(r"^\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def opcode_pipe(sass: str | None) -> str | None:
    """The accounting pipe of one SASS instruction ('@P0 FFMA R1, ...' -> 'fma'); None when unknown."""
    if not sass:
        return None
    m = _OPCODE_RE.match(sass)
    if not m:
        return None
    return OPCODE_PIPES.get(m.group(1).split(".")[0])


# ------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class SourceTarget:
    """One kernel the source pass profiles."""

    variant: str
    shape_id: str
    kernel: str
    also: tuple[str, ...] = ()
    """Other variants whose dominant kernel at this shape is the same code (one profile serves them)."""


def plan_source(summary: pd.DataFrame, mode: str = DEFAULT_SOURCE_MODE,
                flops: Mapping[tuple[str, str], float] | None = None,
                only: set[str] | None = None) -> list[SourceTarget]:
    """The kernels of the source pass, from the faprof-set pass's ncu_summary.

    Args:
        summary: ncu_summary of the bundle.
        mode: 'auto' (per variant, at its largest profiled shape (the shape with the most FLOPs, ties by the
            longest call) the kernel that executed the most FLOPs: the one doing the problem's math, not a
            library copy or cast beside it, which carries no line info; the longest kernel where FLOPs were
            not counted), 'all' (every profiled kernel at every shape), 'off'.
        flops: (variant, shape_id) -> the problem's FLOPs, to rank shapes (default: the summary's
            analytic_flops).
        only: variants to consider (None: all): faprof's and users' kernels, whose binaries carry line
            info (library kernels such as cuDNN's have none, and their modules make huge reports).
    """
    if mode == "off" or summary.empty:
        return []
    if mode not in SOURCE_MODES:
        raise ValueError(f"source mode must be one of {SOURCE_MODES}, got {mode!r}")
    launches = summary[summary["kernel"] != ALL_KERNELS]
    if only is not None:
        launches = launches[launches["variant"].isin(sorted(only))]
    out: list[SourceTarget] = []
    for variant, g in launches.groupby("variant", sort=False):
        if mode == "all":
            out += [SourceTarget(str(variant), str(s), str(k)) for (s, k), _ in g.groupby(["shape_id", "kernel"], sort=False)]
            continue
        per_shape = g.groupby("shape_id", sort=False).agg(ms=("duration_ms", "sum"), fl=("analytic_flops", "max"))
        if flops:
            per_shape["fl"] = [flops.get((str(variant), str(s)), f) for s, f in zip(per_shape.index, per_shape["fl"], strict=True)]
        shape = per_shape.sort_values(["fl", "ms"], ascending=False, na_position="last").index[0]
        kernel = _math_kernel(g[g["shape_id"] == shape])
        code = _code_id(g, shape, kernel)
        twin = next((i for i, t in enumerate(out) if t.shape_id == shape and _code_id(launches, shape, t.kernel, t.variant) == code), None)
        if twin is not None:  # the same kernel code at the same shape (a variant reusing another's forward)
            t = out[twin]
            out[twin] = SourceTarget(t.variant, t.shape_id, t.kernel, (*t.also, str(variant)))
            continue
        out.append(SourceTarget(str(variant), str(shape), kernel))
    return out


def _math_kernel(at: pd.DataFrame) -> str:
    """Of one call's launches, the kernel that executed the most FLOPs (`hw_flops`), else the longest."""
    time = at.groupby("kernel", sort=False)["duration_ms"].sum()
    if "hw_flops" in at.columns:
        flops = pd.to_numeric(at["hw_flops"], errors="coerce").groupby(at["kernel"], sort=False).sum(min_count=1)
        if flops.notna().any() and float(flops.max()) > 0:
            return str(flops.idxmax())
    return str(time.idxmax())


def _code_id(launches: pd.DataFrame, shape: str, kernel: str, variant: str | None = None) -> str:
    """The kernel's full (demangled) name at a shape: the same name is the same code."""
    sel = launches[(launches["shape_id"] == shape) & (launches["kernel"] == kernel)]
    if variant is not None:
        sel = sel[sel["variant"] == variant]
    if "kernel_demangled" in sel and not sel.empty and isinstance(sel["kernel_demangled"].iloc[0], str):
        return str(sel["kernel_demangled"].iloc[0])
    return kernel


def with_aliases(lines: pd.DataFrame, targets: Sequence[SourceTarget]) -> pd.DataFrame:
    """The source lines of each target copied to the variants it also serves (`SourceTarget.also`)."""
    extra = [lines[(lines["variant"] == t.variant) & (lines["shape_id"] == t.shape_id)].assign(variant=v)
             for t in targets for v in t.also]
    return pd.concat([lines, *extra], ignore_index=True) if extra else lines


def kernel_regex(targets: Sequence[SourceTarget]) -> str:
    """One `--kernel-name regex:` for the targets' kernels (exact function names)."""
    names = sorted({t.kernel for t in targets})
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


# ------------------------------------------------------------------------------------ read
def _line_code(action: Any, files: dict[str, list[str]], path: str, line: int) -> str:
    if path not in files:
        text = ""
        try:
            found = action.source_files()
            for k in found:
                if k == path:
                    text = found[k]
        except Exception:  # an older report module: no imported source
            text = ""
        files[path] = text.splitlines() if text else []
    lines = files[path]
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _per_pc(action: Any, name: str) -> dict[int, float]:
    """A source-level metric of an action as {pc: value} (empty when absent)."""
    m = action.metric_by_name(name)
    if m is None or not m.has_correlation_ids():
        return {}
    ids = m.correlation_ids()
    out: dict[int, float] = {}
    for i in range(m.num_instances()):
        try:
            out[int(ids.as_uint64(i))] = float(m.as_double(i))
        except Exception:  # an instance the module cannot convert: skip it, keep the others
            continue
    return out


def read_actions(ctx: Any, plan: Mapping[str, Any] | None,
                 targets: Sequence[SourceTarget] | None = None) -> pd.DataFrame:
    """The source_lines table of an opened report (see the module docstring)."""
    pairs = set(plan_index(plan)) if plan else None
    wanted = {(t.variant, t.shape_id, t.kernel) for t in targets} if targets else None
    rows: list[tuple] = []
    seen: set[tuple[str, str, str]] = set()
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            action = rng.action_by_idx(ai)
            _, (variant, shape_id, _) = kernel_ranges(action, pairs)
            kernel = action.name(action.NameBase_FUNCTION)
            if variant is None or shape_id is None:
                continue
            key = (variant, shape_id, kernel)
            if (wanted is not None and key not in wanted) or key in seen:
                continue
            seen.add(key)
            rows += _action_rows(action, key)
    return pd.DataFrame(rows, columns=list(SOURCE_COLUMNS))


def _action_rows(action: Any, key: tuple[str, str, str]) -> list[tuple]:
    names = sorted(set(action.metric_names()))  # sorted: the same rows in the same order every read
    per_metric: dict[str, dict[int, float]] = {}
    for name in names:
        if name.startswith("smsp__pcsamp_warps_issue_stalled_") and not name.endswith("_not_issued"):
            reason = name.removeprefix("smsp__pcsamp_warps_issue_stalled_")
            reason = {"no_instruction": "no_instructions"}.get(reason, reason)
            per_metric[f"stall:{reason}"] = _per_pc(action, name)
    if "inst_executed" in names:
        per_metric["inst_executed"] = _per_pc(action, "inst_executed")
    pcs = {pc for d in per_metric.values() for pc in d}
    where: dict[int, tuple[str, int]] = {}
    pipe: dict[int, str | None] = {}
    sass: dict[int, str] = {}
    for pc in sorted(pcs):
        info = action.source_info(pc)
        if info is None:
            continue
        where[pc] = (str(info.file_name()), int(info.line()))
        try:
            sass[pc] = str(action.sass_by_pc(pc))
            pipe[pc] = opcode_pipe(sass[pc])
        except Exception:
            pipe[pc] = None
    agg: dict[tuple[str, int, str], float] = defaultdict(float)
    for metric, values in per_metric.items():
        for pc, v in values.items():
            if pc in where and v:
                agg[(*where[pc], metric)] += v
                if metric.startswith("stall:"):
                    agg[(*where[pc], "samples")] += v
    # the instruction mix per line: executed instructions where counted, else the issuing samples
    issued = per_metric.get("inst_executed") or per_metric.get("stall:selected", {})
    for pc, v in issued.items():
        if pc in where and v and pipe.get(pc):
            agg[(*where[pc], f"pipe:{pipe[pc]}")] += v
    by_metric: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
    for (f, line, metric), v in agg.items():
        by_metric[metric].append((f, line, v))
    files: dict[str, list[str]] = {}
    out = []
    for metric, items in by_metric.items():
        for f, line, v in sorted(items, key=lambda x: (-x[2], x[0], x[1]))[:MAX_LINES_PER_METRIC]:
            out.append((*key[:2], key[2], f, line, _line_code(action, files, f, line), metric, v, math.nan))
    return out + _instruction_rows(key, per_metric, where, sass)


def _instruction_rows(key: tuple[str, str, str], per_metric: dict[str, dict[int, float]],
                      where: dict[int, tuple[str, int]], sass: dict[int, str]) -> list[tuple]:
    """Per sampled instruction: a 'sass' row (its SASS, its samples) and its 'sass:stall:<reason>' rows."""
    out = []
    for pc in sorted(where):
        if pc not in sass:
            continue
        f, line = where[pc]
        total = sum(v.get(pc, 0.0) for m, v in per_metric.items() if m.startswith("stall:"))
        out.append((*key, f, line, sass[pc], "sass", total, float(pc)))
        for metric, values in per_metric.items():
            v = values.get(pc, 0.0)
            if metric.startswith("stall:") and v:
                out.append((*key, f, line, sass[pc], f"sass:{metric}", v, float(pc)))
    return out


def read_source(report: str | Path, plan_path: str | Path | None = None, ncu: str | Path | None = None,
                targets: Sequence[SourceTarget] | None = None) -> pd.DataFrame:
    """The source_lines table of a report (in this process; `main` runs it as a child)."""
    mod, _ = load_report_module(ncu)
    ctx = mod.load_report(str(report))
    return read_actions(ctx, load_plan(plan_path), targets)


# ------------------------------------------------------------------------------- queries
def top_lines(lines: pd.DataFrame, variant: str, shape_id: str, metric: str, n: int = 3,
              kernel: str | None = None) -> list[dict[str, Any]]:
    """The lines with the most of `metric` for one call (and kernel): file, line, code, value, share
    (of the metric's total over the kernel's lines)."""
    if lines.empty:
        return []
    sel = lines[(lines["variant"] == variant) & (lines["shape_id"] == shape_id) & (lines["metric"] == metric)]
    if kernel:
        sel = sel[sel["kernel"] == kernel]
    total = float(sel["value"].sum())
    if sel.empty or total <= 0:
        return []
    top = sel.sort_values("value", ascending=False).head(n)
    return [{"file": r.file, "line": int(r.line), "code": r.code, "value": float(r.value),
             "share": float(r.value) / total} for r in top.itertuples(index=False)]


def describe_line(hit: dict[str, Any], what: str) -> str:
    """'52% of barrier stall samples at my_attn.cu:48 (`__syncthreads();`)'."""
    code = f" (`{hit['code'][:80]}`)" if hit.get("code") else ""
    share = hit["share"]
    pct = f"{100 * share:.0f}%" if not math.isnan(share) else "n/a"
    return f"{pct} of {what} at {Path(hit['file']).name}:{hit['line']}{code}"


# --------------------------------------------------------------------------------- child
def main(argv: Sequence[str] | None = None) -> int:
    """`python -m faprof.nsight.ncu.source read REPORT --out OUT [--plan P] [--ncu NCU]`: the reader
    as a child process (a crash of the native reader cannot end the run)."""
    ap = argparse.ArgumentParser(prog="python -m faprof.nsight.ncu.source")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rd = sub.add_parser("read")
    rd.add_argument("report")
    rd.add_argument("--out", required=True)
    rd.add_argument("--plan")
    rd.add_argument("--ncu")
    args = ap.parse_args(argv)
    df = read_source(args.report, args.plan, args.ncu)
    df.to_parquet(args.out, index=False)
    print(f"source lines: {len(df)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
