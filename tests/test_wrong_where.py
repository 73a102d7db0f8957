"""Bugs that depend on where the work sits (issue 34 item 4): the Triton fused-attention tutorial's TMA row offset.

Method: tests/wrong/cpu_wrong_where.py plants the tutorial's bug (offset_y = off_z + off_h·N_CTX: at
B > 1 batch z's programs read and write batch 0's rows shifted by z, two programs write each of those
rows, the order they land in changes between calls) in a CPU kernel written as that kernel runs, beside
the same code with the offset right. The runner checks both on one B=3 shape with every probe (the
randn inputs cut to B=1 and H=1 among them) into a bundle; the row must read "correct at B=1, wrong when
B>1, and batch b's output lands in batch 0's rows" with no signature above or beside it on the randn
inputs (the race and the unwritten rows are what that statement already explains). Then the pieces:
the offset test on its own (store-only offsets, a head offset), and the ranking's folding and dropping.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from faprof.correctness import check as correctness
from faprof.correctness import wrong_text
from faprof.correctness.reference import compute_reference
from faprof.correctness.signatures import Signature, rank
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE
from faprof.model.variant import Variant
from faprof.run import ProfileOptions, profile

WRONG = Path(__file__).parent / "wrong"
sys.path.insert(0, str(WRONG))
import cpu_wrong_where as planted  # noqa: E402

SHAPE = "b3_h2_sq64_sk64_d32_fp16_causal_fwd"
LEAD = "correct at B=1, wrong when B>1, and batch b's output lands in batch 0's rows"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    options = ProfileOptions(out_dir=tmp_path_factory.mktemp("runs"), isolate=False, ceilings=False,
                             user_variants=[str(WRONG / "cpu_wrong_where.py")])
    bundle = profile(WRONG / "wrong_where.toml", options)
    return bundle, bundle.measurements().set_index(["variant", "shape_id"]), bundle.read("error_maps")


def test_the_tutorial_bug_reads_batch_b_lands_in_batch_0_with_nothing_above_it(run):
    bundle, df, maps = run
    r = df.loc[("wrong_batch_rows", SHAPE)]
    assert r["status"] == "wrong" and r["bug_signature"] == "placement", r["reason"]
    sigs = json.loads(r["signatures"])
    top = sigs[0]
    assert top["title"].startswith(LEAD + ", shifted by b rows"), top["title"]
    assert top["kind"] == "offset_batch_unscaled_both_overlap" and top["share"] >= 0.99
    assert "b + h·S instead of (b·H + h)·S" in top["title"] and "two CTAs write the same rows" in top["title"]
    assert "batches 1-2 never written" in top["title"]
    # the race (a timed call differed) and the unwritten rows are what the statement explains: not repeated
    assert not bool(r["repeatable"])
    assert all(s["family"] not in ("race", "normalisation", "stride") for s in sigs), sigs
    assert not [s for s in sigs[1:] if "randn" in s["check_input"].split(", ")], sigs
    probes = {p["name"]: p["status"] for p in json.loads(r["probes"])}
    assert probes["slice_b1"] == "ok" and probes["slice_h1"] == "wrong"  # B=1 right; H=1 with B=3 still wrong
    lines = wrong_text.explain_wrong_rows(bundle.measurements(), maps, "wrong_batch_rows", SHAPE)
    assert LEAD in lines[0] and "depends on where the work sits" in lines[0]


def test_the_same_kernel_with_the_offset_right_passes_every_probe(run):
    _, df, _ = run
    for v in ("wrong_where_control", "torch_standard"):
        r = df.loc[(v, SHAPE)]
        assert r["status"] == "ok" and not isinstance(r["signatures"], str), (v, r["reason"])
        probes = {p["name"]: p["status"] for p in json.loads(r["probes"])}
        assert probes["slice_b1"] == probes["slice_h1"] == "ok"
        assert set(probes.values()) <= {"ok", "skipped"}, probes  # Sq != Sk probes: the kernel declines them


def _variant(name, fn):
    return Variant(name, "user", "test", fn, dtypes=("fp16", "fp32"), device="cpu", hidden=True)


def _check(fn, p, seed=4):
    inputs = correctness.make_inputs(p, "cpu", seed=seed)
    ref = compute_reference(p, inputs, cuda_ok=False)
    return correctness.check_correctness(_variant("x", fn), p, inputs, ref, "cpu", DEFAULT_TOLERANCE[p.dtype])


def test_right_answers_stored_at_the_head_0_rows_are_named():
    """A kernel that computes every slice right and stores it at offset b·H·S (the head dropped)."""
    p = AttentionProblem(B=2, H=3, Sq=64, Sk=64, D=32, dtype="fp32", causal=False)

    def head_dropped_store(q, k, v, causal, scale, out=None):
        o = torch.softmax(q.float() @ k.float().transpose(-2, -1) * scale, dim=-1) @ v.float()
        dst = out if out is not None else torch.full_like(q, math.nan)
        for h in (2, 0, 1):  # the last writer of head 0's rows is head 1
            dst[:, 0] = o[:, h]
        return dst

    r = _check(head_dropped_store, p)
    top = r["signatures"][0]
    assert top["family"] == "placement" and top["kind"] == "offset_head_dropped_store_overlap", top
    assert top["title"].startswith("head h's output lands in head 0's rows (the row offset drops the head index")
    assert "the rows of heads 1-2 never written" in top["title"] and top["share"] == 1.0


def test_the_batch_offset_read_bug_stays_a_stride_bug():
    """Reading batch 0's inputs and writing its own rows is not a placement bug (nothing lands elsewhere)."""
    p = AttentionProblem(B=2, H=2, Sq=64, Sk=64, D=32, dtype="fp32", causal=True)
    r = _check(lambda q, k, v, c, s, out=None: planted.control(q[:1].expand_as(q).contiguous(), k[:1].expand_as(k)
                                                              .contiguous(), v[:1].expand_as(v).contiguous(), c, s, out), p)
    assert [s["family"] for s in r["signatures"]][:1] == ["stride"], r["signatures"]
    assert all(s["family"] != "placement" for s in r["signatures"])


def _sig(family, kind, share, inputs="randn", unit="rows"):
    return Signature(family, kind, f"{family} {kind}", "out", inputs, share, 100, int(100 * share), 1.0, 0.0, "d", unit)


def test_rank_folds_the_slice_statement_and_drops_what_the_lead_explains():
    got = rank([_sig("race", "race", 1.0), _sig("unwritten", "unwritten", 0.6),
                _sig("normalisation", "norm_twice", 0.52),
                _sig("placement", "offset_batch_unscaled_both_overlap", 1.0),
                Signature("placement", "batch_dependent", "correct at B=1, wrong when B>1", "out", "randn, slice_b1", 1.0,
                          10, 10, math.nan, math.nan, "alone", "elements"),
                _sig("overflow", "no_max_subtraction_fp16", 0.9, "large_scores")])
    assert [(s.family, s.kind) for s in got] == [("placement", "offset_batch_unscaled_both_overlap"),
                                                ("overflow", "no_max_subtraction_fp16")]
    assert got[0].title == "correct at B=1, wrong when B>1, and placement offset_batch_unscaled_both_overlap"
    assert got[0].check_input == "randn, slice_b1"


def test_rank_keeps_a_race_beside_a_bug_that_has_no_overlap():
    got = rank([_sig("causal_mask", "mask_shift_plus", 1.0), _sig("race", "race", 1.0), _sig("unwritten", "u", 0.6)])
    assert [s.family for s in got] == ["race", "causal_mask"]
    alone = rank([Signature("placement", "batch_dependent", "correct at B=1, wrong when B>1", "out", "randn, slice_b1",
                            1.0, 10, 10, math.nan, math.nan, "alone", "elements"), _sig("causal_mask", "mask_missing", 0.7),
                   _sig("propagated", "from_forward_o", 1.0, "large_scores")])
    # no host: said on its own, below a mechanism that explains every wrong row, above one that explains less
    assert [s.kind for s in alone] == ["from_forward_o", "batch_dependent", "mask_missing"]
