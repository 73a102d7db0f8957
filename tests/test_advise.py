"""The bottleneck advisor on real tables: an ncu report recorded on the H100 and a real bundle."""

from pathlib import Path

import pandas as pd
import pytest

from faprof import analysis

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def ncu_tables():
    pytest.importorskip("ncu_report", reason="the ncu-report package reads the recorded .ncu-rep")
    from faprof.nsight import ncu

    plan = ncu.load_plan(DATA / "ncu" / "tiny_full_plan.json")
    return ncu.derive_tables(ncu.read_report(DATA / "ncu" / "tiny_full.ncu-rep", plan), plan)


def test_advisor_names_the_bottlenecks_the_fixture_kernels_were_built_to_show(ncu_tables):
    adv = analysis.advise(pd.DataFrame(), ncu_tables["ncu_summary"], ncu_tables["stalls"])
    cats = set(zip(adv["variant"], adv["shape_id"], adv["category"], strict=True))
    # one block on 132 SMs: the parallelism problem of report 003 ("2 CTAs on 58 SMs")
    assert ("tiny_ffma", "blocks1_t128_it256", "parallelism") in cats
    one = adv[(adv["shape_id"] == "blocks1_t128_it256") & (adv["category"] == "parallelism")].iloc[0]
    assert "131 SMs have nothing to do" in one["finding"]
    # the strided shared-memory kernel: bank conflicts and an MIO-throttle stall
    assert ("tiny_smem", "blocks132_stride32_it64", "bank conflicts") in cats
    stall = adv[(adv["variant"] == "tiny_smem") & (adv["category"] == "stalls")].iloc[0]
    assert "mio_throttle" in stall["finding"]
    assert (adv["finding"].str.len() > 0).all() and (adv["suggestion"].str.len() > 0).all()


def test_advisor_flags_launch_bound_and_wrong_rows():
    m = pd.DataFrame([
        {"variant": "a", "shape_id": "s", "status": "ok", "median_ms": 0.01, "graph_ms": 0.02, "host_enqueue_ms": 0.05},
        {"variant": "b", "shape_id": "s", "status": "wrong", "median_ms": 1.0, "graph_ms": 0.9, "reference": "cpu_ref fp64",
         "max_abs_err": 0.5, "rel_err": 0.2},
        {"variant": "c", "shape_id": "s", "status": "ok", "median_ms": 1.0, "graph_ms": 0.95, "host_enqueue_ms": 0.05},
    ])
    adv = analysis.advise(m)
    assert list(zip(adv["variant"], adv["category"], strict=True)) == [("a", "launch overhead"), ("b", "correctness")]
    assert "0.05 ms to enqueue a call whose GPU work takes 0.01 ms" in adv.iloc[0]["finding"]
