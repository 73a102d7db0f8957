"""Error maps and positions against brute-force references; the poison; the error_maps table.

Each map count is checked against a Python loop over the elements of a small tensor with wrong
elements planted at known places; positions against torch.unravel_index; the summary against the
sentence issue 25 asks for; the poison against NaNs that arithmetic makes.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from faprof.correctness import errormap as em
from faprof.correctness.signatures import race_signature
from faprof.store.error_maps import COLUMN, from_rows, merge, without_maps

TOL = dict(atol=1e-3, rtol=1e-3)


# --------------------------------------------------------------------------------------- poison
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_poison_is_told_apart_from_computed_nans(dtype):
    t = em.poison_like(torch.zeros(3, 5, dtype=dtype))
    assert torch.isnan(t).all() and em.unwritten_mask(t).all()
    computed = torch.zeros(4, dtype=dtype) / torch.zeros(4, dtype=dtype)  # 0/0: a NaN the variant made
    assert torch.isnan(computed).all() and not em.unwritten_mask(computed).any()
    t[1, 2] = 1.0
    assert em.unwritten_mask(t).sum() == 14 and not em.unwritten_mask(t)[1, 2]


def test_allocator_poison_reads_as_poison_in_every_dtype():
    words = em.poison_words(64, "cpu")
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        view = words.view(dt)
        assert torch.isnan(view).all() and em.unwritten_mask(view).all(), dt


# ------------------------------------------------------------------------------------ positions
def test_positions_match_unravel_index():
    shape = (3, 4, 37, 16)
    for flat in (0, 1, 16 * 37, 2 * 4 * 37 * 16 + 3 * 37 * 16 + 5 * 16 + 7, math.prod(shape) - 1):
        assert em.position(shape, flat) == tuple(int(x) for x in torch.unravel_index(torch.tensor(flat), shape))
    assert em.describe_position("out", shape, 2 * 4 * 37 * 16 + 3 * 37 * 16 + 35 * 16 + 7, (32, 64)) == \
        "out[b=2, h=3, i=35, d=7] (query tile 1: rows 32-36)"
    assert em.describe_position("dk", shape, 5 * 16, (32, 16)).startswith("dk[b=0, h=0, j=5, d=0] (key tile 0: keys 0-15)")
    assert em.describe_position("lse", (2, 2, 9), 10, None) == "lse[b=0, h=1, i=1]"


# ----------------------------------------------------------------------------------------- maps
def _planted(B=4, H=2, N=100, D=8):
    ref = torch.randn(B, H, N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    r = ref.clone().float()
    r[1:, :, :, :] += 1.0            # batches 1-3 wrong everywhere
    r[0, 1, 70:, 2] += 0.5           # batch 0, head 1: rows 70.., column 2
    r[2, 0, 96:] = em.poison_like(r[2, 0, 96:])  # never written
    return r, ref


def _brute(r, ref, axis_of, bins) -> dict:
    """n_bad per bin by looping over elements."""
    out = {b: 0 for b in bins}
    unw = em.unwritten_mask(r)
    rr = r.double()
    B, H, N, D = r.shape
    for b in range(B):
        for h in range(H):
            for i in range(N):
                for d in range(D):
                    x, y = rr[b, h, i, d], ref[b, h, i, d]
                    bad = bool(unw[b, h, i, d]) or not (abs(x - y) <= TOL["atol"] + TOL["rtol"] * abs(y))
                    out[axis_of(b, h, i, d)] += bad
    return out


def test_map_counts_match_a_loop_over_the_elements():
    r, ref = _planted()
    oe = em.element_errors("out", r, ref, TOL["atol"], TOL["rtol"], math.inf)
    recs = em.error_map(oe, "randn", causal=True, Sq=100, Sk=100, tile=(32, 64))
    by = {}
    for x in recs:
        by.setdefault(x["axis"], {})[x["bin"]] = x
    for axis, fn, bins in (("batch", lambda b, h, i, d: str(b), [str(b) for b in range(4)]),
                           ("head", lambda b, h, i, d: str(h), ["0", "1"]),
                           ("query_tile", lambda b, h, i, d: str(i // 32), ["0", "1", "2", "3"]),
                           ("d", lambda b, h, i, d: str(d), [str(d) for d in range(8)]),
                           ("tail", lambda b, h, i, d: "last partial tile" if i >= 96 else "whole tiles",
                            ["whole tiles", "last partial tile"])):
        want = _brute(r, ref, fn, bins)
        assert {k: v["n_bad"] for k, v in by[axis].items()} == want, axis
    assert by["all"]["all"]["n_unwritten"] == 2 * 4 * 8 // 2 and by["batch"]["2"]["n_unwritten"] == 32
    assert by["query_tile"]["3"]["lo"] == 96 and by["query_tile"]["3"]["hi"] == 99
    mask = by["mask"]
    assert mask["rows seeing one key"]["hi"] == 0 and mask["rows seeing every key"]["lo"] == 99
    assert sum(x["n"] for x in mask.values()) == r.numel()


def test_a_right_output_has_an_empty_map():
    ref = torch.randn(2, 2, 10, 4, dtype=torch.float64)
    oe = em.element_errors("out", ref.float(), ref, TOL["atol"], TOL["rtol"], 1e-3)
    assert oe.n_bad == 0 and em.error_map(oe, "randn", False, 10, 10, None) == []


def test_summary_says_where_in_the_words_of_the_issue():
    ref = torch.randn(4, 3, 64, 8, dtype=torch.float64)
    r = ref.clone().float()
    r[1:] += 1.0  # a batch offset ignored: batch 0 right, batches 1-3 wrong everywhere
    oe = em.element_errors("out", r, ref, TOL["atol"], TOL["rtol"], math.inf)
    lines = em.summarize(em.error_map(oe, "randn", False, 64, 64, None))
    assert lines[0] == "out: 4608 of 6144 elements wrong (75%), max error 1"
    assert lines[1] == "batch 0 correct; batches 1-3 wrong in every head from row 0; no unwritten elements"
    r2 = ref.clone().float()
    r2[:, 2, 40:, 5] = em.poison_like(r2[:, 2, 40:, 5])
    oe2 = em.element_errors("out", r2, ref, TOL["atol"], TOL["rtol"], math.inf)
    assert em.summarize(em.error_map(oe2, "randn", False, 64, 64, None))[1] == \
        ("every batch wrong in head 2 only from row 40; only in columns d=5; "
         "96 unwritten elements (NaN poison still there) in batches 0-3")


# ------------------------------------------------------------------------------------------ race
def test_race_signature_ignores_elements_the_checked_call_left_unwritten():
    a = torch.randn(1, 2, 8, 4)
    a[0, 1] = em.poison_like(a[0, 1])
    b = a.clone()
    b[0, 1] = 0.0  # the timed call's buffer held zeros there: a difference, not a race
    assert race_signature(["out"], [a], [b]) is None
    b[0, 0, 3, 1] += 1.0
    sig = race_signature(["out"], [a], [b])
    assert sig is not None and sig.family == "race" and "1 of 64 elements" in sig.title and "rows 3" in sig.detail


# -------------------------------------------------------------------------------- the table
def _rows(seqs: list[str], maps: list[list[dict] | None]) -> pd.DataFrame:
    import json

    return pd.DataFrame([{"variant": "v", "shape_id": f"s{i}", "gpu_name": "G", "row_seq": q,
                          COLUMN: json.dumps(m) if m else None} for i, (q, m) in enumerate(zip(seqs, maps, strict=True))])


def test_maps_follow_their_rows():
    rec = {"check_input": "randn", "output": "out", "axis": "all", "bin": "all", "lo": 0, "hi": 3, "n": 8,
           "n_bad": 4, "share_bad": 0.5, "max_err": 1.0, "n_unwritten": 0}
    rows = _rows(["1", "2"], [[rec], None])
    table = from_rows(rows)
    assert list(table["row_seq"]) == ["1"] and table.iloc[0]["n_bad"] == 4
    # the row is measured again (resume): its new row carries no map, the old map goes with the old row
    again = _rows(["3", "2"], [None, None])
    assert merge(table, again).empty
    # a crash after the table was written but before the row files were deleted: nothing doubles
    assert len(merge(table, rows)) == 1
    assert COLUMN not in without_maps(rows).columns
