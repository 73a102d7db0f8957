"""Bug signatures for today's problems (issue 32 item 3): each planted in a small CPU kernel, named first.

Method: tests/wrong/cpu_wrong_modern.py holds one kernel per bug these problems invite (a query head
reading the wrong KV head, a mask aligned to the wrong corner, a window off by one on either side or
ignored, the soft-cap missing), written from the mask rule by hand. Each runs on a small dense problem
that has the feature (GQA H=8/Hkv=2, a bottom-right causal mask with Sq < Sk, a causal sliding window,
a two-sided window, a soft-cap of 2) on randn inputs from faprof.correctness.layouts; the reference is the
definition in float64 (layouts.reference_forward) and the signatures are faprof's, run as the check runs
them (signatures.diagnose_wrong). The planted family and kind must come first, explaining >= 90% of the
wrong rows, and the same kernel without the bug must be right (so nothing is named). Then the probes
that expose these bugs hold what they are for: window_edges puts a third of a row's weight on the keys
at and just past the window's edges, kv_heads makes the KV head a query head reads show in its output.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from faprof.correctness import adversarial, errormap, layouts, signatures
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE

sys.path.insert(0, str(Path(__file__).parent / "wrong"))
import cpu_wrong_modern as planted  # noqa: E402

GQA = AttentionProblem(B=2, H=8, Sq=64, Sk=64, D=32, dtype="fp16", causal=True, Hkv=2)
CORNER = AttentionProblem(B=2, H=2, Sq=48, Sk=96, D=32, dtype="fp16", causal=True, mask_align="bottom_right")
WIN_CORNER = AttentionProblem(B=1, H=2, Sq=40, Sk=100, D=32, dtype="fp32", window=(8, 8), mask_align="bottom_right")
SLIDING = AttentionProblem(B=2, H=2, Sq=128, Sk=128, D=32, dtype="fp16", causal=True, window=(16, 0))
TWO_SIDED = AttentionProblem(B=1, H=2, Sq=96, Sk=96, D=32, dtype="fp32", window=(8, 8))
CAPPED = AttentionProblem(B=2, H=2, Sq=64, Sk=64, D=32, dtype="fp32", causal=True, softcap=1.0, scale=1.0)

CASES = [("gqa_modulo", GQA), ("gqa_first", GQA), ("corner_top_left", CORNER), ("window_corner", WIN_CORNER),
         ("window_left_plus", SLIDING), ("window_left_minus", SLIDING), ("window_right_plus", TWO_SIDED),
         ("window_right_minus", TWO_SIDED), ("window_ignored", SLIDING), ("softcap_missing", CAPPED)]


def _inputs(p: AttentionProblem, seed: int = 3) -> SimpleNamespace:
    q, k, v, dout, _ = layouts.make_layout_inputs(p, "cpu", torch.Generator().manual_seed(seed))
    return SimpleNamespace(q=q, k=k, v=v, dout=dout)


def _diagnose(p: AttentionProblem, inputs: SimpleNamespace, out: torch.Tensor) -> tuple[bool, list]:
    ref = layouts.reference_forward(p, inputs.q, inputs.k, inputs.v, None, "cpu", torch.float64)
    tol = DEFAULT_TOLERANCE[p.dtype]
    _, sigs = signatures.diagnose_wrong(p, inputs, ["out"], [out], {"out": ref}, tol.atol, tol.rtol,
                                        {"out": math.nan}, lambda name: None)
    oe = errormap.element_errors("out", out, ref, tol.atol, tol.rtol, math.nan)
    assert oe is not None
    return oe.n_bad == 0, sigs


@pytest.mark.parametrize("name,p", CASES, ids=[c[0] for c in CASES])
def test_each_planted_bug_is_named_first(name, p):
    fn, family, kind = planted.PLANTED[name]
    inputs = _inputs(p)
    right, sigs = _diagnose(p, inputs, fn(inputs.q, inputs.k, inputs.v, p))
    assert not right and sigs, name
    top = sigs[0]
    assert (top.family, top.kind) == (family, kind), [(s.family, s.kind, round(s.share, 2)) for s in sigs]
    assert top.share >= 0.9, top


@pytest.mark.parametrize("p", [GQA, CORNER, WIN_CORNER, SLIDING, TWO_SIDED, CAPPED], ids=lambda p: p.shape_id)
def test_the_kernel_without_a_bug_is_right(p):
    inputs = _inputs(p)
    right, sigs = _diagnose(p, inputs, planted.kernel(inputs.q, inputs.k, inputs.v, p))
    assert right and sigs == []


def test_the_head_mapping_is_said_as_a_formula():
    inputs = _inputs(GQA)
    _, sigs = _diagnose(GQA, inputs, planted.PLANTED["gqa_modulo"][0](inputs.q, inputs.k, inputs.v, GQA))
    assert sigs[0].title.startswith("query head h reads KV head h % Hkv (heads interleaved instead of grouped) "
                                    "instead of h // 4"), sigs[0].title


def _probe(p: AttentionProblem, name: str) -> tuple[adversarial.Probe, adversarial.ProbeInputs]:
    pr = next(x for x in adversarial.probes(p) if x.name == name)
    return pr, adversarial.make_inputs(pr, "cpu", seed=11)


def test_window_edges_moves_a_third_of_the_weight_when_the_window_is_off_by_one():
    pr, inp = _probe(SLIDING, "window_edges")
    p = pr.problem
    assert (p.B, p.window) == (1, (16, 0)) and p.Sq == p.Sk >= 16 + adversarial.PROBE_TILE
    ref = layouts.reference_forward(p, inp.q, inp.k, inp.v, None, "cpu", torch.float64)
    assert float((planted.kernel(inp.q, inp.k, inp.v, p).double() - ref).abs().max()) < 0.01
    for side, delta in (("left", 1), ("left", -1)):
        bad = planted.kernel(inp.q, inp.k, inp.v, p, **{side: 16 + delta}).double()
        rows_off = (bad - ref).abs().amax(dim=-1)[0, :, 17:]  # rows whose left edge (i - 16, i - 17) exists
        assert float(rows_off.min()) > 0.1, (side, delta, float(rows_off.min()))


def test_kv_heads_shows_which_kv_head_each_query_head_reads():
    pr, inp = _probe(GQA, "kv_heads")
    assert pr.problem.kv_heads == 2 and pr.problem.H == 8
    out = planted.PLANTED["gqa_modulo"][0](inp.q, inp.k, inp.v, pr.problem).float()
    read = out.mean(dim=(0, 2, 3)).round().long() - 1
    assert read.tolist() == [h % 2 for h in range(8)]


def test_problems_with_a_corner_or_window_get_sq_lt_sk_and_gqa_probes_keep_the_kv_heads():
    names = {pr.name: pr.problem for pr in adversarial.probes(CORNER)}
    assert names["sq_lt_sk"].Sq < names["sq_lt_sk"].Sk and names["sq_lt_sk"].mask_align == "bottom_right"
    for pr in adversarial.probes(GQA):
        inp = adversarial.make_inputs(pr, "cpu", seed=1)
        assert inp.k.shape[1] == pr.problem.kv_heads and inp.q.shape[1] == pr.problem.H, pr.name
