"""The advisor on the planted-fault kernels (tests/planted), offline, from a bundle recorded on an
H100 by scripts/record_planted.sh and committed under tests/data/planted/.

For each planted kernel the primary finding must name its defect on every shape where the defect
exists, and the clean control's primary finding must not be a defect. The fixture is required: a
missing one FAILS this test (it is how the advisor is validated), it does not skip.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from faprof import advisor
from faprof.store import Bundle, find_bundles

ROOT = Path(__file__).parent
PLANTED_DATA = ROOT / "data" / "planted"
RECORD = "scripts/record_planted.sh (on an H100; unpack its planted_bundle.tgz under tests/data/planted/)"


def _expected() -> dict[str, str | None]:
    spec = importlib.util.spec_from_file_location("faprof_planted_variants_for_test", ROOT / "planted" / "planted_variants.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(mod.EXPECTED_CAUSE)


EXPECTED = _expected()


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
def diag(bundle):
    return advisor.diagnose(bundle)


def test_every_planted_kernel_ran_and_passed_the_correctness_check(bundle):
    m = bundle.measurements()
    for variant in EXPECTED:
        rows = m[m["variant"] == variant]
        assert not rows.empty, f"{variant} missing from {bundle.path.name}"
        assert set(rows["status"]) == {"ok"}, rows[["shape_id", "status", "reason"]]


def _primary(diag, variant, shape):
    p = diag[(diag["variant"] == variant) & (diag["shape_id"] == shape) & diag["primary"]]
    return None if p.empty else p.iloc[0]


@pytest.mark.parametrize("variant", [v for v, c in EXPECTED.items() if c is not None])
def test_the_primary_finding_names_the_planted_defect(bundle, diag, variant):
    m = bundle.measurements()
    rows = m[m["variant"] == variant]
    checked = 0
    for _, r in rows.iterrows():
        p = _primary(diag, variant, r["shape_id"])
        if variant == "planted_no_causal_skip" and not r["causal"]:
            # without a causal mask there is nothing to skip: it is the control there
            assert p is None or p["cause"] not in advisor.DEFECT_CAUSES, p
            continue
        assert p is not None, f"{variant} {r['shape_id']}: no primary finding"
        assert p["cause"] == EXPECTED[variant], (
            f"{variant} {r['shape_id']}: primary {p['cause']} ({p['estimated_gain_pct']:.0f}%: {p['evidence']}); "
            f"all: {diag[(diag['variant'] == variant) & (diag['shape_id'] == r['shape_id'])][['cause', 'estimated_gain_pct']].values.tolist()}")
        checked += 1
    assert checked >= 1


def test_the_control_has_no_defect_as_its_primary_finding(bundle, diag):
    m = bundle.measurements()
    for sid in m[m["variant"] == "planted_clean"]["shape_id"]:
        p = _primary(diag, "planted_clean", sid)
        assert p is None or p["cause"] not in advisor.DEFECT_CAUSES, (sid, p["cause"], p["evidence"])


@pytest.fixture(scope="module")
def diag_without_mwa_rules(bundle, tmp_path_factory):
    """The same recording as the `faprof` set records it now: the memory-workload tables left the
    set, so ncu's rules of that section (SharedMemoryConflicts, MemoryCacheAccessPattern) are gone;
    the counters they read are still requested by the catalogue. Built by deleting that section's
    rows from a copy of the recorded rule table."""
    import shutil

    dest = tmp_path_factory.mktemp("planted_no_mwa") / bundle.path.name
    shutil.copytree(bundle.path, dest, ignore=shutil.ignore_patterns("raw"))
    b = Bundle.open(dest)
    rules = b.read("ncu_rules")
    kept = rules[rules["section"] != "MemoryWorkloadAnalysis_Tables"]
    assert len(kept) < len(rules), "the recording has no memory-workload rules to take away"
    b.write("ncu_rules", kept)
    return advisor.diagnose(b)


@pytest.mark.parametrize("variant", [v for v, c in EXPECTED.items() if c is not None])
def test_the_primary_finding_needs_no_memory_workload_rules(bundle, diag_without_mwa_rules, variant):
    test_the_primary_finding_names_the_planted_defect(bundle, diag_without_mwa_rules, variant)


def test_the_control_stays_clean_without_memory_workload_rules(bundle, diag_without_mwa_rules):
    test_the_control_has_no_defect_as_its_primary_finding(bundle, diag_without_mwa_rules)
