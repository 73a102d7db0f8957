"""Every metric the advisor reads is one faprof asks Nsight Compute for (or says which set provides it),
on every architecture it supports, and the recorded faprof-set report holds them.

Method: the metric keys are read from the advisor's source (every `.metric("key")` call, and the
accounting's per-state and per-pipe keys); each must be a catalogue concept that the faprof set requests
on sm_80, sm_89 and sm_90, or one that names the set providing it (`Concept.provided_by`). The faprof-set
fixture (tests/data/ncu/faprof_set.ncu-rep.gz, recorded on the H100) must contain the sm_90 name of
every requested concept that has one.
"""

from __future__ import annotations

import ast
import gzip
import shutil
from pathlib import Path

import pytest

from faprof.advisor import accounting, traffic
from faprof.nsight.ncu import catalogue

ADVISOR = Path(__file__).parent.parent / "faprof" / "advisor"
FIXTURE = Path(__file__).parent / "data" / "ncu" / "faprof_set.ncu-rep.gz"
#: Concepts the faprof set requests since the fixture was recorded (issue 33: bytes by memory level),
#: checked against ncu's --query-metrics lists by tests/test_ncu.py; the lead's next H100 recording of
#: the fixture (scripts/record/record_ncu_faprof_fixture.sh) holds them, and then this set empties.
NOT_IN_FIXTURE_YET = {"l2_sectors_read", "l2_sectors_write", "l2_sectors_atom", "l2_sectors_red",
                      "peak_l2_bytes_per_cycle", "l2_clock", "peak_smem_wavefronts_per_cycle", "global_atom_inst",
                      "global_red_inst"}
#: Concepts requested since every committed recording (issue 44: global atomics' L1 requests, read by
#: `faprof.advisor.rules_code.global_atomics`, which words its evidence without them); the next H100 recording
#: (scripts/record/record_planted.sh) holds them, and then this set empties.
NOT_RECORDED_YET = {"global_atom_requests", "global_red_requests"}
CCS = ("8.0", "8.9", "9.0")


def metric_keys() -> set[str]:
    keys: set[str] = set()
    for path in ADVISOR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "metric"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                keys.add(str(node.args[0].value))
    keys |= set(accounting.MODEL_KEYS) | set(traffic.METRIC_KEYS)
    keys |= {f"warp_state_{s}" for s in accounting.STATES}
    keys |= {f"pipe_inst_{p}" for p in accounting.PIPES}
    return keys


def test_the_scan_finds_the_rules_metrics():
    keys = metric_keys()
    assert {"spill_requests", "smem_wavefronts", "issue_active", "thread_inst_xu", "warp_state_barrier"} <= keys


@pytest.mark.parametrize("key", sorted(metric_keys()))
def test_every_metric_a_rule_reads_is_requested_or_says_where_it_comes_from(key):
    assert key in catalogue.CATALOGUE, f"the advisor reads {key!r}, which the catalogue does not know"
    c = catalogue.CATALOGUE[key]
    if c.provided_by:
        assert not c.request
        return
    assert c.request, f"{key!r} is read by a rule but not requested by the faprof set"
    for cc in CCS:
        if c.for_cc(cc):
            assert c.for_cc(cc)[0] in catalogue.requested_metrics(cc) or any(
                n in catalogue.requested_metrics(cc) for n in c.for_cc(cc)), (key, cc)
    assert any(c.for_cc(cc) for cc in CCS), f"{key!r} has no metric name on any supported architecture"


def test_the_recorded_faprof_set_report_holds_every_requested_sm90_metric(tmp_path):
    ncu_report = pytest.importorskip("ncu_report")
    rep = tmp_path / "faprof_set.ncu-rep"
    with gzip.open(FIXTURE) as src, open(rep, "wb") as dst:
        shutil.copyfileobj(src, dst)
    ctx = ncu_report.load_report(str(rep))
    action = ctx.range_by_idx(0).action_by_idx(0)
    names = set(action.metric_names())
    missing = []
    for key in sorted(metric_keys() - NOT_IN_FIXTURE_YET - NOT_RECORDED_YET):
        c = catalogue.CATALOGUE[key]
        if c.request and c.for_cc("9.0") and not any(n in names for n in c.for_cc("9.0")):
            missing.append(f"{key}: {c.for_cc('9.0')}")
    assert not missing, "requested but absent from the H100 recording: " + "; ".join(missing)


def test_the_metrics_the_rules_read_are_in_a_recording_made_after_they_were_added():
    """tests/data/decode_bundle (H100, 2026-11-27, faprof set) was recorded after the accounting's L2 and
    shared-memory counters joined the catalogue: every metric a rule reads that the faprof set requests on
    sm_90 is in its ncu_metrics table, NOT_IN_FIXTURE_YET's included."""
    import pandas as pd

    bundle = next((Path(__file__).parent / "data" / "decode_bundle").glob("*decode-small"))
    names = set(pd.read_parquet(bundle / "ncu_metrics.parquet")["metric"])
    missing = [key for key in sorted(metric_keys() - NOT_RECORDED_YET) if (c := catalogue.CATALOGUE[key]).request and c.for_cc("9.0")
               and not any(n in names for n in c.for_cc("9.0"))]
    assert not missing, "requested but absent from the 2026-11-27 H100 recording: " + ", ".join(missing)
