"""Which (variant, shape_id, iteration) a profiled kernel belongs to, from the NVTX ranges open at launch.

Part of the report reader (`faprof.nsight.ncu.read`); the source-line
reader (`faprof.nsight.ncu.source`) places its kernels the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_ITER_RE = re.compile(r"^iter(\d+)$")


def nvtx_stack(action: Any, kind: str = "push_pop") -> list[str]:
    """The names of the NVTX ranges open when the kernel launched (all domains): the launching
    thread's push/pop ranges outermost first, or with kind='start_end' the process-wide start/end
    ranges in the order they were started."""
    state = action.nvtx_state()
    if state is None:
        return []
    names: list[str] = []
    for dom_id in state.domains():
        dom = state.domain_by_id(dom_id)
        if dom is None:
            continue
        listed, get = ((dom.push_pop_ranges, dom.push_pop_range) if kind == "push_pop"
                       else (dom.start_end_ranges, dom.start_end_range))
        for i in range(len(listed())):
            r = get(i)
            if r is not None:
                names.append(r.name())
    return names


def kernel_ranges(action: Any, pairs: set[tuple[str, str]] | None) -> tuple[list[str], tuple[str | None, str | None, int | None]]:
    """(the range names that place the kernel, attribute() of them): the launching thread's
    push/pop stack, else the start/end ranges (a backward launched by autograd's thread has no
    push/pop ranges of faprof's; the target opens the same names as start/end ranges)."""
    stack = nvtx_stack(action)
    found = attribute(stack, pairs)
    if found[0] is None or found[1] is None:
        try:
            process = nvtx_stack(action, "start_end")
        except Exception:  # a report module without start/end ranges: push/pop only
            process = []
        alt = attribute(process, pairs)
        if alt[0] is not None and alt[1] is not None:
            return process, alt
    return stack, found


def attribute(
    stack: Sequence[str], pairs: set[tuple[str, str]] | None = None
) -> tuple[str | None, str | None, int | None]:
    """(variant, shape_id, iteration) of a kernel from its NVTX stack; Nones when outside faprof's ranges.

    With the plan's pairs, a variant range directly enclosing a shape_id range of the plan wins,
    then any plan pair both of whose ranges are open. Without a plan, the two ranges enclosing an
    `iter<i>` range are taken as variant and shape_id.
    """
    iteration = None
    for name in stack:
        m = _ITER_RE.match(name)
        if m:
            iteration = int(m.group(1))
    if pairs:
        for a, b in zip(stack, stack[1:], strict=False):
            if (a, b) in pairs:
                return a, b, iteration
        open_ = set(stack)
        hits = [(v, s) for v, s in pairs if v in open_ and s in open_]
        if len(hits) == 1:
            return hits[0][0], hits[0][1], iteration
        return None, None, iteration
    for i, name in enumerate(stack):
        if _ITER_RE.match(name) and i >= 2:
            return stack[i - 2], stack[i - 1], iteration
    return None, None, iteration
