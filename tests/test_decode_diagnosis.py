"""A decode kernel that does not split the KV sequence, diagnosed from a recorded H100 bundle
(tests/data/decode_bundle: examples/kernels/gqa_decode.cu against SDPA and decode_splitkv on GQA
decode problems): the diagnosis says to split the KV sequence, with the grid against the SMs and the
bandwidth achieved against the measured copy ceiling; the report leads with GB/s."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from faprof import advisor
from faprof.report import answer
from faprof.report.blocks import blocks
from faprof.store import Bundle

BUNDLE = next((Path(__file__).parent / "data" / "decode_bundle").glob("*decode-small"))


@pytest.fixture(scope="module")
def diag() -> pd.DataFrame:
    return advisor.diagnose(Bundle.open(BUNDLE), against="sdpa_flash")


def test_the_rows_are_memory_bound_decode():
    m = pd.read_parquet(BUNDLE / "measurements.parquet")
    ok = m[m["status"] == "ok"]
    assert set(ok["bound"]) == {"memory"}
    assert ok["pct_copy"].notna().all() and (ok["Hkv"] == 8).all()


def test_the_unsplit_kernel_is_told_to_split_the_kv_sequence(diag):
    mine = diag[diag["variant"] == "gqa_decode"]
    fixes = " ".join(mine["fix"].astype(str))
    assert "split the KV sequence" in fixes
    text = mine[mine["fix"].astype(str).str.contains("split the KV sequence")].iloc[0]["fix"]
    assert "blocks on 132 SMs" in text and "of the measured copy bandwidth" in text


def test_a_kernel_with_enough_blocks_is_not_told_to_split(diag):
    """At B=16 with 4 new tokens decode_splitkv fills the SMs: no split advice there."""
    rows = diag[(diag["variant"] == "decode_splitkv") & diag["shape_id"].str.startswith("b16_h32kv8_sq4_sk8192")]
    assert not rows.empty
    assert not rows["fix"].astype(str).str.contains("split the KV sequence").any()


def test_memory_bound_blocks_lead_with_gbps():
    m = pd.read_parquet(BUNDLE / "measurements.parquet")
    bl = blocks(m)
    assert bl and all(answer.memory_bound(b) for b in bl)
    cells = answer.rate_cells(m[m["status"] == "ok"].iloc[0], True)
    assert set(cells) == {"GB/s", "% of copy"}
