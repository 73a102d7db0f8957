"""The advisor on the planted-fault kernels (tests/planted), offline, from a bundle recorded on an
H100 by scripts/record_planted.sh and committed under tests/data/planted/.

Each planted kernel is compared with its clean twin (`CONTROL_OF`), as a user asks "why is mine slower
than that one": on every shape where the defect costs time (the kernel is slower than its twin by more
than the advisor's LEVEL_RATIO), the primary finding must name the planted defect, as a cause of the
gap. Where it costs nothing measurable the kernel is level with its twin and must get no gap cause and
no defect. Each control's primary finding must not be a defect. The fixture is required: a missing one
FAILS this test (it is how the advisor is validated), it does not skip.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from faprof import advisor
from faprof.advisor.thresholds import value as threshold
from faprof.store import Bundle, find_bundles

ROOT = Path(__file__).parent
PLANTED_DATA = ROOT / "data" / "planted"
RECORD = "scripts/record_planted.sh (on an H100; unpack its planted_bundle.tgz under tests/data/planted/)"


def _planted():
    spec = importlib.util.spec_from_file_location("faprof_planted_variants_for_test", ROOT / "planted" / "planted_variants.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_MOD = _planted()
EXPECTED: dict[str, str | None] = dict(_MOD.EXPECTED_CAUSE)
CONTROL_OF: dict[str, str] = dict(_MOD.CONTROL_OF)
DEFECTS = [v for v, c in EXPECTED.items() if c is not None]
CONTROLS = [v for v, c in EXPECTED.items() if c is None]


def test_every_expected_cause_is_a_cause_the_advisor_names():
    assert {c for c in EXPECTED.values() if c} <= set(advisor.CAUSES)


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    found = find_bundles(PLANTED_DATA) if PLANTED_DATA.is_dir() else []
    if not found:
        pytest.fail(f"no recorded planted-fault bundle under {PLANTED_DATA}: record it with {RECORD}")
    assert len(found) == 1, f"expected one planted bundle under {PLANTED_DATA}, found {[b.path.name for b in found]}"
    b = found[0]
    assert b.has("ncu_summary") and not b.read("ncu_summary").empty, f"{b.path} has no ncu tables"
    return b


@pytest.fixture(scope="module")
def diags(bundle):
    """The diagnosis against each control, and the default one (against the fastest call per shape)."""
    out = {c: advisor.diagnose(bundle, against=c) for c in sorted(set(CONTROL_OF.values()))}
    out[None] = advisor.diagnose(bundle)
    return out


def _rows(bundle, variant):
    """The variant's rows on the shapes of its dtype (other dtypes' rows are `unsupported`)."""
    m = bundle.measurements()
    rows = m[m["variant"] == variant]
    return rows[~((rows["status"] == "unsupported") & rows["reason"].str.contains("supports dtypes", na=False))]


@pytest.mark.parametrize("variant", list(EXPECTED))
def test_every_planted_kernel_ran_and_passed_the_correctness_check(bundle, variant):
    rows = _rows(bundle, variant)
    assert not rows.empty, f"{variant} missing from {bundle.path.name}"
    assert set(rows["status"]) == {"ok"}, rows[["shape_id", "status", "reason", "check_reason"]]


def _primary(diag, variant, shape):
    p = diag[(diag["variant"] == variant) & (diag["shape_id"] == shape) & diag["primary"]]
    return None if p.empty else p.iloc[0]


def _ratio(bundle, variant, shape) -> float:
    m = bundle.measurements().set_index(["variant", "shape_id"])
    return float(m.loc[(variant, shape), "median_ms"] / m.loc[(CONTROL_OF[variant], shape), "median_ms"])


def check_defect(bundle, diags, variant):
    rows = _rows(bundle, variant)
    diag = diags[CONTROL_OF[variant]]
    costly = 0
    for _, r in rows.iterrows():
        p = _primary(diag, variant, r["shape_id"])
        level = _ratio(bundle, variant, r["shape_id"]) < threshold("LEVEL_RATIO")
        if level or (variant == "planted_no_causal_skip" and not r["causal"]):
            # no time to explain (or, without a causal mask, nothing to skip): it is its control there
            assert p is None or (p["unit"] != "gap" and p["cause"] not in advisor.DEFECT_CAUSES), p
            continue
        assert p is not None, f"{variant} {r['shape_id']}: no primary finding"
        assert p["cause"] == EXPECTED[variant] and p["unit"] == "gap", (
            f"{variant} {r['shape_id']} ({_ratio(bundle, variant, r['shape_id']):.2f}x its control): primary "
            f"{p['cause']} ({p['estimated_gain_pct']:.0f}%: {p['evidence']}); all: "
            f"{diag[(diag['variant'] == variant) & (diag['shape_id'] == r['shape_id'])][['cause', 'estimated_gain_pct']].values.tolist()}")
        costly += 1
    return costly


@pytest.mark.parametrize("variant", DEFECTS)
def test_the_primary_finding_names_the_planted_defect(bundle, diags, variant):
    assert check_defect(bundle, diags, variant) >= 1, f"{variant} costs no time on any shape"


@pytest.mark.parametrize("control", CONTROLS)
def test_the_control_has_no_defect_as_its_primary_finding(bundle, diags, control):
    sids = _rows(bundle, control)["shape_id"]
    assert not sids.empty, f"{control} missing from {bundle.path.name}"
    for sid in sids:
        p = _primary(diags[None], control, sid)
        assert p is None or p["cause"] not in advisor.DEFECT_CAUSES, (sid, p["cause"], p["evidence"])


def test_a_defect_found_is_placed_on_a_source_line(bundle, diags):
    """The source-line pass profiled each planted kernel at its largest shape: the primary finding there
    names a line of the planted kernel's sources."""
    lines = bundle.read("source_lines")
    assert not lines.empty
    named = 0
    for variant in DEFECTS:
        shapes = set(lines.loc[lines["variant"] == variant, "shape_id"])
        for sid in shapes:
            p = _primary(diags[CONTROL_OF[variant]], variant, sid)
            if p is not None and p["unit"] == "gap":
                assert ".cu:" in str(p["source"]) or ".cuh:" in str(p["source"]), (variant, p["cause"], p["source"])
                named += 1
    assert named >= 5
