"""How a wrong row is told: its row fields, and the lines `faprof explain` and the report print.

The first line names the bug family of the best signature (faprof.correctness.signatures) and how well it
matches; then where it matched, where each output is wrong on each input that failed (the error
map's summary, faprof.correctness.errormap), the other signatures, and whether the output was stable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from faprof.correctness import errormap
from faprof.correctness.signatures import FAMILIES, Signature, rank


def _loads(x: Any) -> list[dict[str, Any]]:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return []
    if isinstance(x, str):
        return list(json.loads(x)) if x.strip() else []
    return list(x)


def _known(x: Any) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _shape_text(row: Mapping[str, Any]) -> str:
    """'B=2 H=2 S=128 D=64 fp16 causal' (with the KV heads, the mask's name and the layout of a row of
    today's problems: 'H=32/8kv', 'causal_br_w4096-0', 'varlen')."""
    s = f"S={row.get('Sq')}" if row.get("Sq") == row.get("Sk") else f"Sq={row.get('Sq')} Sk={row.get('Sk')}"
    mask = " causal" if bool(row.get("causal")) else ""
    if isinstance(row.get("mask"), str) and row["mask"] not in ("full", "causal"):
        mask = f" {row['mask']}"
    h = f"{row.get('H')}"
    if _known(row.get("Hkv")) and _known(row.get("H")) and int(row["Hkv"]) != int(row["H"]):
        h += f"/{int(row['Hkv'])}kv"
    layout = f" {row['layout']}" if row.get("layout") in ("varlen", "paged") else ""
    d = "" if row.get("direction") in (None, "fwd") else f" {row.get('direction')}"
    return f"B={row.get('B')} H={h} {s} D={row.get('D')} {row.get('dtype')}{mask}{layout}{d}"


def _inputs_text(names: str) -> str:
    xs = [x for x in names.split(", ") if x]
    return ", ".join(xs) if len(xs) <= 3 else f"{', '.join(xs[:2])} and {len(xs) - 2} more inputs"


def explain_wrong(row: Mapping[str, Any], maps: Any = None) -> list[str]:
    """What `faprof explain` says about one wrong row: the first line names the bug family.

    Args:
        row: a measurement row (variant, shape fields, status, signatures as JSON text or a list,
            check_input, repeatable, reason).
        maps: the row's error map records (a list of dicts or a DataFrame with MAP_COLUMNS), or None.

    Returns:
        Lines of text: '<variant> on <shape>: wrong: <family>: <title> (<how well>; <outputs> on
        <inputs>)', where it matched, where each output is wrong (error map; inputs with the same
        pattern on one line), the other signatures, and whether a repeated call gave the same output.
    """
    if maps is not None and hasattr(maps, "to_dict"):
        maps = maps.to_dict("records")
    maps = list(maps or [])
    sigs = [Signature(**{k: v for k, v in d.items() if k in Signature.__dataclass_fields__}) for d in _loads(row.get("signatures"))]
    head = f"{row.get('variant')} on {_shape_text(row)}: wrong"
    if sigs:
        top = sigs[0]
        lines = [f"{head}: {FAMILIES.get(top.family, top.family)}: {top.title} ({top.how_well()}; {top.output} on "
                 f"{_inputs_text(top.check_input)})"]
    else:
        lines = [f"{head}: no known bug signature matches; where it is wrong:"]
        if not maps and row.get("reason"):
            lines.append(f"  {row.get('reason')}")
    if sigs and sigs[0].detail:
        lines.append(f"  where: {sigs[0].detail}")
    shown: dict[tuple[str, str], list[str]] = {}  # (output, where-line) -> inputs with that pattern
    for ci in dict.fromkeys(m["check_input"] for m in maps):
        for out in dict.fromkeys(m["output"] for m in maps if m["check_input"] == ci):
            text = errormap.summarize([m for m in maps if m["check_input"] == ci and m["output"] == out])
            if not text:
                continue
            key = (out, text[-1])
            if key in shown:
                shown[key].append(ci)
                continue
            shown[key] = []
            lines.append(f"  on {ci}: {text[0]}")
            lines.extend(f"    {t}" for t in text[1:])
    same = [f"{out} on {', '.join(cis)}" for (out, _), cis in shown.items() if cis]
    if same:
        lines.append(f"  the same pattern: {'; '.join(same)}")
    for sg in sigs[1:]:
        lines.append(f"  also {FAMILIES.get(sg.family, sg.family)}: {sg.title} ({sg.how_well()}; {sg.output} on "
                     f"{_inputs_text(sg.check_input)})")
    rep = row.get("repeatable")
    if rep is True and not any(sg.family == "race" for sg in sigs):
        lines.append("  stable: a timed call gave the same output bit for bit (a deterministic bug, not a race)")
    return lines


def row_fields(wrong_on: Sequence[str], maps: Sequence[dict[str, Any]], sigs: Sequence[dict[str, Any] | Signature]) -> dict[str, Any]:
    """The measurement-row fields of a check: `check_input` (the inputs it failed on, comma-separated,
    or None), `error_map` and `signatures` (JSON text, None when empty; the store moves error maps
    to their own table), `bug_signature` (the best signature's family) and `signature_text` (a
    'looks like ...' clause for the row's reason)."""
    objs = rank([s if isinstance(s, Signature) else
                 Signature(**{k: v for k, v in s.items() if k in Signature.__dataclass_fields__}) for s in sigs])
    top = objs[0] if objs else None
    return {
        "check_input": ", ".join(wrong_on) if wrong_on else None,
        "error_map": json.dumps(list(maps)) if maps else None,
        "signatures": json.dumps([s.to_dict() for s in objs]) if objs else None,
        "bug_signature": top.family if top else None,
        "signature_text": (f"looks like {FAMILIES.get(top.family, top.family)}: {top.title} ({top.how_well()})"
                           if top else ""),
    }


def explain_wrong_rows(rows: Any, maps: Any = None, variant: str | None = None, shape: str | None = None) -> list[str]:
    """explain_wrong for every wrong row of a bundle's measurements (optionally one variant / shape).

    Args:
        rows: the measurements table (a DataFrame); maps: the bundle's error_maps table (or None).
        variant, shape: only this variant / shape_id.

    Returns:
        The lines of every wrong row, in table order; empty when no row is wrong.
    """
    if rows is None or len(rows) == 0 or "status" not in rows:
        return []
    sel = rows[rows["status"] == "wrong"]
    if variant:
        sel = sel[sel["variant"] == variant]
    if shape:
        sel = sel[sel["shape_id"] == shape]
    lines: list[str] = []
    for _, r in sel.iterrows():
        m = None
        if maps is not None and len(maps) and {"variant", "shape_id"} <= set(maps.columns):
            m = maps[(maps["variant"] == r["variant"]) & (maps["shape_id"] == r["shape_id"])]
            if "gpu_name" in maps.columns and "gpu_name" in r and isinstance(r["gpu_name"], str):
                m = m[m["gpu_name"].isna() | (m["gpu_name"] == r["gpu_name"])]
        lines += explain_wrong(r.to_dict(), m)
    return lines
