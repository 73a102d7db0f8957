"""No cause claims more of a call's time than lies above its measured ceiling; a call at its ceiling
gets the at_bound note (a decode kernel at 99% of the copy bandwidth was told 'long scoreboard: up to
40%; prefetch the next tile', H100 llama3_70b_decode bundle of 2026-11-27)."""

import math
from types import SimpleNamespace

from faprof.advisor.diagnose import _within_headroom, headroom
from faprof.advisor.findings import Finding


def call(**m):
    return SimpleNamespace(variant="k", shape_id="s", measurement=m)


def stall(gain):
    return Finding("k", "s", "stall:long_scoreboard", gain, "46% of warp cycles", "prefetch", "kernel:stall")


def test_memory_bound_call_at_the_copy_ceiling():
    c = call(bound="memory", pct_copy=99.0)
    room, where = headroom(c)
    assert math.isclose(room, 0.01) and "copy bandwidth" in where
    out = _within_headroom(c, [stall(0.40)])
    assert math.isclose(out[0].gain, 0.01) and "above its ceiling" in out[0].evidence
    assert [f.cause for f in out] == ["stall:long_scoreboard", "at_bound"]


def test_far_from_the_ceiling_nothing_changes():
    c = call(bound="compute", pct_measured_ceiling=55.0)
    out = _within_headroom(c, [stall(0.30)])
    assert [f.cause for f in out] == ["stall:long_scoreboard"] and math.isclose(out[0].gain, 0.30)


def test_over_100_percent_and_unknown_position():
    assert headroom(call(bound="memory", pct_copy=104.0))[0] == 0.0  # CUPTI time against an events copy
    assert math.isnan(headroom(call(bound="memory"))[0])
    assert _within_headroom(call(), [stall(0.5)])[0].gain == 0.5
