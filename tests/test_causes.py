"""One record per cause (`faprof.advisor.causes`): every cause the advisor's code names has one, with the
parts its kind needs, and a lookup of a key with no record raises instead of returning an empty default.

Method: (1) `problems()` finds nothing missing in the committed records, and finds each part taken away
from a copy of them (so the check is not a tautology); (2) the cause keys the advisor's source writes as
a finding's cause (`Finding(...)`, `rules_kernel._f(...)`) or as a term of the accounting
(`differential.Term(...)`), and those of the rule tables, all have records, terms of kind 'term' with a
fix; (3) the partition, the source lines and findings raise on an unknown cause.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from faprof.advisor import partition, rules_call, rules_pair, sources
from faprof.advisor.causes import CAUSES, MECHANISMS, problems, record
from faprof.advisor.findings import Finding
from faprof.advisor.partition import RESIDUAL
from faprof.nsight.ncu.catalogue_stalls import PIPE_ADVICE, STALL_ADVICE

ADVISOR = Path(__file__).resolve().parents[1] / "faprof" / "advisor"


def _without(key: str, **parts: object) -> dict:
    """A copy of CAUSES with `key`'s record changed."""
    recs = dict(CAUSES)
    recs[key] = dataclasses.replace(recs[key], **parts)
    return recs


def test_every_record_has_the_parts_its_kind_needs():
    assert problems() == []


@pytest.mark.parametrize(("key", "parts", "said"), [
    ("register_spills", {"claims": ()}, "a defect that claims no gap term"),
    ("register_spills", {"metrics": ()}, "no source metric"),
    ("register_spills", {"metrics": ("stall:mio_throttle",)}, "which it does not claim"),
    ("register_spills", {"absorbs": ("level",)}, "not a mechanism"),
    ("fp64_arithmetic", {"claims": ("pipe:fp64", "stall:no_such_stall")}, "not a term of the accounting"),
    ("lanes:inactive", {"fix": ""}, "a term of the accounting with no fix"),
    ("stall:membar", {"fix": ""}, "a term of the accounting with no fix"),
    ("launch_overhead", {"claims": ("idle",)}, "is not in MECHANISMS"),
    ("wave_tail", {"kind": "cause"}, "kind"),
])
def test_a_missing_part_is_found(key, parts, said):
    found = problems(_without(key, **parts))
    assert any(key in p and said in p for p in found), found


def test_a_mechanism_order_naming_no_record_is_found():
    assert any("no record" in p for p in problems(order=(*MECHANISMS, "gone_cause")))


def _named(fn_names: tuple[str, ...], index: int, kw: str | None) -> dict[str, list[str]]:
    """String constants passed as argument `index` (or keyword `kw`) to calls of `fn_names` in the advisor's
    source -> where ('module.py:line')."""
    out: dict[str, list[str]] = {}
    for path in sorted(ADVISOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in fn_names):
                continue
            args = [*node.args[index:index + 1], *(k.value for k in node.keywords if k.arg == kw)]
            for a in args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    out.setdefault(a.value, []).append(f"{path.name}:{node.lineno}")
    return out


def test_the_source_scan_sees_the_findings_and_terms():
    finding_causes = _named(("Finding", "_f"), 2, "cause")
    assert {"register_spills", "slower_math_path", "ahead", "missing_counters"} <= set(finding_causes)
    assert len(finding_causes) >= 20
    assert {"lanes:inactive", "idle", "clock", "residual"} <= set(_named(("Term",), 0, "key"))


def test_every_cause_the_advisor_names_has_a_record():
    named = _named(("Finding", "_f"), 2, "cause")
    tables = {c for _, c in rules_call.NCU_RULE_CAUSES} | {c for _, c in rules_call.ACCESS_PATTERN_SPACES}
    tables |= set(rules_call.STAND_IN_CAUSES) | set(rules_pair.PATH_CAUSES)
    missing = {k: w for k, w in named.items() if k not in CAUSES} | {k: ["rules table"] for k in tables - set(CAUSES)}
    assert not missing, f"causes named with no record in faprof.advisor.causes: {missing}"


def test_every_term_of_the_accounting_is_a_term_cause_with_a_fix():
    """A term with no record would be left out of the gap's causes (`gap_findings._term_finding`) unnamed."""
    terms = set(_named(("Term",), 0, "key")) - {RESIDUAL}
    terms |= {f"stall:{r}" for r in STALL_ADVICE if r != "selected"}
    terms |= {f"pipe:{p}" for p in PIPE_ADVICE}
    bad = sorted(k for k in terms if k not in CAUSES or CAUSES[k].kind != "term" or not CAUSES[k].fix)
    assert bad == []


def test_unknown_causes_raise_instead_of_reading_as_empty():
    with pytest.raises(KeyError, match="no_such_cause"):
        record("no_such_cause")
    with pytest.raises(KeyError):
        partition.claims("no_such_cause", "pipe:fma")
    with pytest.raises(KeyError):
        partition.claims("register_spills", "pipe:fma", absorbed=("no_such_cause",))
    with pytest.raises(KeyError):
        sources._metrics_for("no_such_cause")
    with pytest.raises(KeyError):
        Finding("v", "s", "no_such_cause", 0.1, "", "", "rule")
