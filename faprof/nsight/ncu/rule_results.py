"""ncu's own rule results of one profiled launch, as rows of the ncu_rules table.

Part of the report reader (`faprof.nsight.ncu.read`): rule id and name,
section, message type, title, message (link markup removed), estimated speedup and its kind.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any

#: ncu_rules.parquet columns.
RULES_COLUMNS = (
    "variant",
    "shape_id",
    "kernel",
    "kernel_id",
    "launch",
    "rule",
    "name",
    "section",
    "type",
    "title",
    "message",
    "est_speedup_pct",
    "speedup_type",
    "focus_metrics",
)

#: ncu_report's MsgType values (IRuleResult.rule_message()['type']) by name.
MESSAGE_TYPES = {0: "none", 1: "ok", 2: "optimization", 3: "warning", 4: "error"}

#: ncu_report's SpeedupType values: 'local' (of the part of the kernel the rule looks at) or
#: 'global' (of the whole kernel's duration).
SPEEDUP_TYPES = {0: "unknown", 1: "local", 2: "global"}

#: Link markup in rule messages: @url:text:link@, @section:id:text@, @sass:addr:text@,
#: @source:file:line:text@ -> text.
_LINK_RE = re.compile(
    r"@(?:url:([^:@]*):[^@]*|section:[^:@]*:([^@]*)|sass:[^:@]*:([^@]*)|source:[^:@]*:[^:@]*:([^@]*))@"
)


def clean_message(text: str | None) -> str:
    """A rule message without ncu's link markup (the link's text is kept), whitespace collapsed."""
    if not text:
        return ""
    out = _LINK_RE.sub(lambda m: next((g for g in m.groups() if g is not None), ""), str(text))
    return " ".join(out.split())


def _enum_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def rule_rows(action: Any) -> list[dict[str, Any]]:
    """One dict per rule result of a launch that carries a message (ncu also lists empty ones)."""
    getter = getattr(action, "rule_results", None)
    if getter is None:
        return []
    out = []
    for r in getter():
        if not r.has_rule_message():
            continue
        msg = r.rule_message()
        speed = r.speedup_estimation() if r.has_speedup_estimation() else None
        focus = []
        with contextlib.suppress(Exception):  # an older reader without focus metrics
            focus = [f"{f['name']}={f['value']:.6g}" for f in r.focus_metrics()]
        mtype = _enum_int(msg.get("type"))
        stype = _enum_int(speed.get("type")) if speed else None
        out.append(
            {
                "rule": r.rule_identifier(),
                "name": r.name(),
                "section": r.section_identifier(),
                "type": MESSAGE_TYPES.get(mtype, str(msg.get("type"))) if mtype is not None else "none",
                "title": str(msg.get("title") or ""),
                "message": clean_message(msg.get("message")),
                "est_speedup_pct": float(speed["speedup"])
                if speed and speed.get("speedup") is not None
                else math.nan,
                "speedup_type": SPEEDUP_TYPES.get(stype, "unknown") if stype is not None else None,
                "focus_metrics": "; ".join(focus),
            }
        )
    return out
