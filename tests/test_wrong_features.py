"""Wrong-result families of today's features: each bug built twice, named first, and ranked above a generic reading.

Method: every bug is built twice on the CPU: by a hand-written kernel in tests/wrong/cpu_wrong_features.py
(written from the definition, not with faprof's code) and from the family's own alternative reference
(faprof.correctness.signatures.refs / crossing). Both outputs go through the check's diagnosis
(signatures.diagnose_wrong, the reference the definition in float64) and the planted family and kind
must come first, explaining >= 90% of the wrong rows; the kernels without a bug must be right. The
families: the soft-cap misapplied (the scale outside tanh, inside and outside, the cap after the mask,
on the probabilities), K or V alone read from KV head h % Hkv (dense and packed), a packed sequence
whose key range crosses into the previous or the next sequence by k keys (k fitted from the data;
a start rounded down to a multiple of 16). The ranking: a window off by one whose wrong rows all sit in
the last partial query tile is named as the window, on one input and over the probes, and the generic
last-tile reading leads only when no specific signature explains as much.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from faprof.correctness import adversarial, errormap, layouts, signatures, wrong_text
from faprof.correctness.signatures import Signature, crossing, rank, refs
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE

sys.path.insert(0, str(Path(__file__).parent / "wrong"))
import cpu_wrong_features as planted  # noqa: E402
import cpu_wrong_modern as modern  # noqa: E402

CAPPED = AttentionProblem(B=2, H=2, Sq=64, Sk=64, D=32, dtype="fp32", causal=True, softcap=2.0)
GQA = AttentionProblem(B=2, H=8, Sq=64, Sk=64, D=32, dtype="fp16", causal=True, Hkv=2)
PACKED = AttentionProblem(B=4, H=2, Sq=38, Sk=51, D=32, dtype="fp32", causal=True, mask_align="bottom_right",
                          seqlens_q=(20, 38, 11, 27), seqlens_k=(45, 38, 29, 51))
PACKED_FULL = AttentionProblem(B=3, H=4, Sq=30, Sk=30, D=32, dtype="fp16", seqlens_q=(12, 30, 21), Hkv=2)
PACKED_CAP = AttentionProblem(B=3, H=4, Sq=40, Sk=40, D=32, dtype="fp32", causal=True, mask_align="bottom_right",
                              seqlens_q=(9, 40, 17), seqlens_k=(33, 40, 25), softcap=2.0, Hkv=2)
#: A window of 63 keys on sequences of 72: a window one key too wide changes only rows 64-71, the last
#: partial query tile (72 = 4 x 16 + 8).
TAIL_WINDOW = AttentionProblem(B=2, H=2, Sq=72, Sk=72, D=32, dtype="fp32", causal=True, window=(63, 0))


def _inputs(p: AttentionProblem, seed: int = 3) -> SimpleNamespace:
    q, k, v, dout, args = layouts.make_layout_inputs(p, "cpu", torch.Generator().manual_seed(seed))
    return SimpleNamespace(q=q, k=k, v=v, dout=dout, args=args if p.layout != "dense" else None)


def _diagnose(p: AttentionProblem, inputs: SimpleNamespace, out: torch.Tensor, check_input: str = "randn"):
    """(whether out is right, the signatures best first), as the check diagnoses a wrong output."""
    ref = layouts.reference_forward(p, inputs.q, inputs.k, inputs.v, inputs.args, "cpu", torch.float64)
    tol = DEFAULT_TOLERANCE[p.dtype]
    _, sigs = signatures.diagnose_wrong(p, inputs, ["out"], [out], {"out": ref}, tol.atol, tol.rtol,
                                        {"out": math.nan}, lambda name: None, check_input)
    oe = errormap.element_errors("out", out, ref, tol.atol, tol.rtol, math.nan, p)
    return oe is None or oe.n_bad == 0, sigs


def _kernel(p: AttentionProblem, inp: SimpleNamespace, bug: str | None, **kw) -> torch.Tensor:
    if p.layout == "varlen":
        return planted.varlen(inp.q, inp.k, inp.v, p, inp.args.cu_seqlens_q.tolist(), inp.args.cu_seqlens_k.tolist(),
                              bug, **kw)
    return planted.dense(inp.q, inp.k, inp.v, p, bug)


def _named_first(p: AttentionProblem, inp: SimpleNamespace, out: torch.Tensor, family: str, kind: str) -> Signature:
    right, sigs = _diagnose(p, inp, out)
    assert not right and sigs, (family, kind)
    assert (sigs[0].family, sigs[0].kind) == (family, kind), [(s.family, s.kind, round(s.share, 2)) for s in sigs]
    assert sigs[0].share >= 0.9, sigs[0]
    return sigs[0]


@pytest.mark.parametrize("p", [CAPPED, GQA, PACKED, PACKED_FULL, PACKED_CAP], ids=lambda p: p.shape_id[:24])
def test_the_kernels_without_a_bug_are_right(p):
    inp = _inputs(p)
    right, sigs = _diagnose(p, inp, _kernel(p, inp, None))
    assert right and sigs == []


# ----------------------------------------------------------------------------------------------- soft-cap
CAP_BUGS = ["unscaled", "scaled_twice", "after_mask", "on_probs"]


@pytest.mark.parametrize("bug", CAP_BUGS)
def test_a_softcap_bug_is_named_softcap_first(bug):
    inp = _inputs(CAPPED)
    top = _named_first(CAPPED, inp, _kernel(CAPPED, inp, f"cap_{bug}"), "softcap", f"softcap_{bug}")
    assert "soft-cap" in top.title


@pytest.mark.parametrize("bug", CAP_BUGS)
def test_a_softcap_bug_from_its_definition_is_named_softcap_first(bug):
    p, inp = CAPPED, _inputs(CAPPED)
    B, H, S, D = inp.q.shape
    mask = refs.true_mask(p)
    q, k, v = (t.double().reshape(B * H, S, D) for t in (inp.q, inp.k, inp.v))
    out = refs.attend(q, k, v, p.softmax_scale, mask, softcap=p.softcap, cap_bug=bug)["out"]
    _named_first(p, inp, out.reshape(B, H, S, D).float(), "softcap", f"softcap_{bug}")


@pytest.mark.parametrize("bug", CAP_BUGS)
def test_a_softcap_bug_in_a_packed_batch_is_named_softcap_first(bug):
    inp = _inputs(PACKED_CAP)
    _named_first(PACKED_CAP, inp, _kernel(PACKED_CAP, inp, f"cap_{bug}"), "softcap", f"softcap_{bug}")


# ------------------------------------------------------------------------------------ K or V from a wrong head
@pytest.mark.parametrize("which", ["k", "v"])
def test_k_or_v_alone_from_the_wrong_kv_head_is_said(which):
    inp = _inputs(GQA)
    top = _named_first(GQA, inp, _kernel(GQA, inp, f"{which}_head_modulo"), "kv_head", f"{which}_head_modulo")
    other = "V" if which == "k" else "K"
    assert top.title.startswith(f"query head h reads its {which.upper()} from KV head h % Hkv (heads interleaved "
                                f"instead of grouped) instead of h // 4"), top.title
    assert top.title.endswith(f"its {other} from the right one"), top.title


def test_both_k_and_v_from_the_wrong_kv_head_stay_one_signature():
    inp = _inputs(GQA)
    _, sigs = _diagnose(GQA, inp, modern.PLANTED["gqa_modulo"][0](inp.q, inp.k, inp.v, GQA))
    assert [(s.family, s.kind) for s in sigs][:1] == [("kv_head", "kv_head_modulo")]
    assert not any(s.kind in ("k_head_modulo", "v_head_modulo") for s in sigs)


def test_k_alone_from_the_wrong_kv_head_in_a_packed_batch_is_said():
    inp = _inputs(PACKED_FULL)
    top = _named_first(PACKED_FULL, inp, _kernel(PACKED_FULL, inp, "k_head_modulo"), "kv_head", "k_head_modulo")
    assert "reads its K from KV head h % Hkv" in top.title


# ------------------------------------------------------------------------- a packed sequence crossing a boundary
CROSSINGS = [("previous_keys", 3, PACKED, "crosses_into_previous"), ("previous_keys", 1, PACKED, "crosses_into_previous"),
             ("aligned_start", 0, PACKED, "crosses_into_previous"), ("offset_early", 5, PACKED, "offset_early"),
             ("next_keys", 4, PACKED_FULL, "crosses_into_next")]


@pytest.mark.parametrize("bug,n,p,kind", CROSSINGS, ids=[f"{c[0]}{c[1]}" for c in CROSSINGS])
def test_a_key_range_crossing_a_sequence_boundary_is_named(bug, n, p, kind):
    inp = _inputs(p)
    top = _named_first(p, inp, _kernel(p, inp, bug, n=n), "sequence", kind)
    if bug == "previous_keys":
        keys = "key" if n == 1 else "keys"
        assert f"also read the last {n} {keys} of the sequence before them (the key range starts {n} {keys} early)" \
            in top.title, top.title
    if bug == "aligned_start":
        assert "the start rounded down to a multiple of 16" in top.title, top.title


@pytest.mark.parametrize("name,k", [("crosses_into_previous", 2), ("offset_late", 3), ("offset_early", 7)])
def test_a_crossing_from_its_definition_is_named(name, k):
    p, inp = PACKED, _inputs(PACKED)
    starts = [0, *torch.tensor(p.k_lens()).cumsum(0).tolist()]
    out = crossing._alternative(p, inp.q.double(), inp.k.double(), inp.v.double(), name, [k] * p.B, starts)
    _named_first(p, inp, out.float(), "sequence", name)


# --------------------------------------------------------------------------------------- specific over generic
def test_a_window_off_by_one_in_the_last_tile_is_named_as_the_window():
    """The window one key too wide changes rows 64-71 only, all in the last partial query tile: the window
    explains them as fully as the last-tile reading does, and is the one named."""
    p, inp = TAIL_WINDOW, _inputs(TAIL_WINDOW)
    for out in (modern.kernel(inp.q, inp.k, inp.v, p, left=64),
                _window_definition(p, inp, 64)):
        right, sigs = _diagnose(p, inp, out)
        assert not right
        assert (sigs[0].family, sigs[0].kind) == ("window", "window_left_plus"), [(s.family, s.kind) for s in sigs]
        assert min(_wrong_rows(p, inp, out)) >= 64  # every wrong row is in the last partial tile


def _window_definition(p: AttentionProblem, inp: SimpleNamespace, left: int) -> torch.Tensor:
    B, H, S, D = inp.q.shape
    mask = refs.mask_rows(S, S, causal=True, left=left, right=0)
    q, k, v = (t.double().reshape(B * H, S, D) for t in (inp.q, inp.k, inp.v))
    return refs.attend(q, k, v, p.softmax_scale, mask)["out"].reshape(B, H, S, D).float()


def test_over_the_probes_the_window_is_named_not_the_last_tile():
    """randn and every probe, diagnosed as the harness does and ranked into the row's fields: the window off by
    one is the row's family whatever the probes whose wrong rows sit in a last partial tile say."""
    p = TAIL_WINDOW
    sigs, wrong_on, in_tail = [], [], []
    runs = [("randn", p, _inputs(p))] + [(pr.name, pr.problem, adversarial.make_inputs(pr, "cpu", seed=5))
                                         for pr in adversarial.probes(p)]
    for name, pp, inp in runs:
        inp = SimpleNamespace(q=inp.q, k=inp.k, v=inp.v, dout=None, args=None)
        out = modern.kernel(inp.q, inp.k, inp.v, pp, left=pp.window[0] + 1)
        right, found = _diagnose(pp, inp, out, name)
        if right:
            continue
        wrong_on.append(name)
        sigs += [s.to_dict() for s in found]
        if pp.Sq % 16 and min(_wrong_rows(pp, inp, out)) >= pp.Sq // 16 * 16:
            in_tail.append(name)
    # the inputs where the last-tile reading fits every wrong row (and, before the ranking rule, led)
    assert {"randn", "tile_plus"} <= set(in_tail) and len(wrong_on) > len(in_tail), (wrong_on, in_tail)
    fields = wrong_text.row_fields(wrong_on, [], sigs)
    assert fields["bug_signature"] == "window", fields["signature_text"]
    assert "partial_tile" not in {s["family"] for s in json.loads(fields["signatures"])}


def _wrong_rows(p: AttentionProblem, inp: SimpleNamespace, out: torch.Tensor) -> list[int]:
    ref = layouts.reference_forward(p, inp.q, inp.k, inp.v, None, "cpu", torch.float64)
    tol = DEFAULT_TOLERANCE[p.dtype]
    oe = errormap.element_errors("out", out, ref, tol.atol, tol.rtol, math.nan)
    return oe.bad.any(dim=-1).nonzero()[:, 2].tolist()


def _sig(family: str, kind: str, share: float, inputs: str, generic: bool = False) -> Signature:
    return Signature(family, kind, kind, "out", inputs, share, 100, round(100 * share), 1.0, 0.001, generic=generic)


PROBES = "randn, large_scores, dominant_key, constant, sq_gt_sk, tile_minus, tile_plus, sq_lt_sk, window_edges, kv_heads"


def test_a_specific_signature_outranks_a_generic_one_that_explains_no_more():
    tail = _sig("partial_tile", "tail_wrong", 1.0, "tile_plus", generic=True)
    # the window explains every wrong row on every probe, the last-tile probe included: the reading is dropped
    got = rank([tail, _sig("window", "window_left_plus", 1.0, PROBES)])
    assert [s.kind for s in got] == ["window_left_plus"]
    # a little less than all of them on each, but on eleven inputs against one: the window first, the reading kept
    got = rank([tail, *(_sig("window", "window_left_plus", 0.97, x) for x in PROBES.split(", "))])
    assert [s.kind for s in got] == ["window_left_plus", "tail_wrong"]
    # on the one input both match, equally: the specific one
    got = rank([_sig("partial_tile", "tail_wrong", 1.0, "randn", generic=True), _sig("window", "window_left_plus", 1.0,
                                                                                     "randn")])
    assert got[0].kind == "window_left_plus"


def test_the_generic_reading_leads_when_nothing_specific_explains_as_much():
    got = rank([_sig("window", "window_left_plus", 0.6, "randn"), _sig("partial_tile", "tail_wrong", 1.0, "randn",
                                                                       generic=True)])
    assert [s.kind for s in got] == ["tail_wrong", "window_left_plus"]
    got = rank([_sig("window", "window_left_plus", 0.9, "randn"),
                _sig("partial_tile", "tail_wrong", 1.0, "randn, tile_minus", generic=True)])
    assert got[0].kind == "tail_wrong"
