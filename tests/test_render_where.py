"""A finding without a source line shows as a dash, never as pandas' 'nan' (seen in `faprof explain`'s
table on the 2026-11-27 H100 decode bundle)."""

import math

from faprof.advisor.render import _where


def test_missing_source_is_a_dash_not_nan():
    assert _where({"source": math.nan}) == "—"
    assert _where({"source": None}, "") == ""
    assert _where({}) == "—"
    assert _where({"source": "decode_splitkv.cu:312"}) == "decode_splitkv.cu:312"
