"""Where in the source a cause happens: the source-line pass's lines attached to findings.

A dependency stall (long or short scoreboard, wait) points at the instruction that produced what the
stalled ones wait for (`faprof.advisor.producers`) when the source pass kept per-instruction rows; at the
line the warps wait on otherwise (bundles recorded before those rows).

Each cause points at the lines that carry its samples or instructions (its record's `metrics`,
`faprof.advisor.causes`): a stall reason at the lines whose warps were sampled stalled for it, a pipe at
the lines issuing that pipe's instructions, a mechanism at the lines of the stalls or pipe it produces. Causes with no line of their own (warps
resident, idle SMs) point at the line where the kernel's warps spend most samples. Lines come from the
call's own shape when the source pass profiled it, else from the variant's profiled shape (the same
code), else from another variant's profile of the same kernel code at the shape (`borrow`), and the
text says which.
"""

from __future__ import annotations

import pandas as pd

from faprof.advisor.causes import record
from faprof.advisor.evidence import Call, Launch
from faprof.advisor.findings import Finding
from faprof.advisor.producers import PRODUCER_REASONS, top_producer
from faprof.nsight.ncu.source import describe_line, top_lines


def _what(metric: str) -> str:
    """What a metric's samples or instructions are called in the text."""
    kind, _, name = metric.partition(":")
    if kind == "stall":
        return f"{name.replace('_', ' ')} stall samples"
    if kind == "pipe":
        return f"{name.replace('_', ' ')} instructions"
    return "warp samples"


def _metrics_for(cause: str) -> tuple[str, ...]:
    """The cause's source metrics (its record's `metrics`), then the lines with the most warp samples."""
    return (*record(cause).metrics, "samples")


#: Column of borrowed source rows (`borrow`): the variant whose run of the same kernel code they come from.
BORROWED = "borrowed_from"


def _code(lz: Launch) -> str:
    return str(lz.row.get("kernel_demangled") or lz.kernel)


def borrow(lines: pd.DataFrame, calls: list[Call]) -> pd.DataFrame:
    """Source rows for calls the source pass did not profile, from another variant's profile of the same
    kernel code at the same shape (the same full demangled name: the same SASS, so the same lines; the
    samples are that variant's run). The source pass profiles one kernel per variant and shares a profile
    between variants running the same code (`faprof.nsight.ncu.source.with_aliases`); a variant whose
    profiled kernel carried no line info (a library copy kernel) still runs, beside it, a kernel another
    variant's profile covers. Borrowed rows carry the donor in BORROWED."""
    if lines.empty or not {"variant", "shape_id", "kernel"} <= set(lines.columns):
        return lines
    have = set(lines["variant"])
    codes: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (shape, code) -> [(variant, kernel)] with rows
    keyed = set(zip(lines["variant"], lines["shape_id"], lines["kernel"], strict=True))
    for c in calls:
        for lz in c.launches:
            if (c.variant, c.shape_id, lz.kernel) in keyed:
                codes.setdefault((c.shape_id, _code(lz)), []).append((c.variant, lz.kernel))
    extra = []
    for c in calls:
        if c.variant in have:
            continue
        for lz in c.launches:
            donors = [d for d in codes.get((c.shape_id, _code(lz)), []) if d[0] != c.variant]
            if donors:
                v, k = donors[0]
                rows = lines[(lines["variant"] == v) & (lines["shape_id"] == c.shape_id) & (lines["kernel"] == k)]
                extra.append(rows.assign(variant=c.variant, **{BORROWED: v}))
    return pd.concat([lines, *extra], ignore_index=True) if extra else lines


def locate(f: Finding, lines: pd.DataFrame, variant: str, shape_id: str, memo: dict | None = None) -> str:
    """'52% of barrier stall samples at fa.cu:48 (`__syncthreads();`)' for a finding, or ''. `memo`: parsed
    kernels kept across calls on the same `lines` (`faprof.advisor.producers.top_producer`)."""
    if lines.empty:
        return ""
    mine = lines[lines["variant"] == variant]
    if mine.empty:
        return ""
    shape = shape_id if (mine["shape_id"] == shape_id).any() else str(mine["shape_id"].iloc[0])
    note = "" if shape == shape_id else f" (source lines of {shape})"
    if BORROWED in mine.columns and mine[BORROWED].notna().any():
        note += f" (from {mine[BORROWED].dropna().iloc[0]}'s profile of the same kernel code)"
    for metric in _metrics_for(f.cause):
        kind, _, reason = metric.partition(":")
        if kind == "stall" and reason in PRODUCER_REASONS:
            hit = top_producer(mine, variant, shape, reason, memo)
            if hit is not None:  # the instruction the stalled ones wait for, not where they wait
                return describe_line(hit, f"{reason.replace('_', ' ')} stall samples charged to their producer,") + note
        hits = top_lines(mine, variant, shape, metric, n=1)
        if hits:
            return describe_line(hits[0], _what(metric)) + note
    return ""


def attach(found: list[Finding], lines: pd.DataFrame, variant: str, shape_id: str, top: int = 3,
           memo: dict | None = None) -> None:
    """Set `source` on the first `top` causes of a ranked list (notes and ncu rules left out); `memo` as for
    `locate`, one per `lines`."""
    n = 0
    for f in found:
        if n >= top:
            break
        if f.kind in ("note", "ncu", "correctness"):
            continue
        f.source = locate(f, lines, variant, shape_id, memo)
        n += 1
