"""Bug signatures of packed and paged problems (issue 32 item 3): each bug planted in a small CPU kernel.

Method: tests/wrong/cpu_wrong_layouts.py holds a hand-written varlen kernel (cu_seqlens) and a paged one
(block table, cache lengths) with a switch per bug: sequence b reading sequence b-1's keys, a key loop
running on to max_seqlen_k, cu_seqlens ignored; the block table ignored (pool order, logical order), the
cache length ignored (the last partial block read whole). On randn inputs from faprof.correctness.layouts
(a shuffled pool with spare blocks) the reference is the definition in float64; faprof's layout
signatures (signatures.layout) must name the planted bug first after ranking, explaining >= 90% of the
wrong rows, and the kernel without a bug must be right.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from faprof.correctness import layouts
from faprof.correctness.signatures import rank
from faprof.correctness.signatures.layout import layout_signatures
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE

sys.path.insert(0, str(Path(__file__).parent / "wrong"))
import cpu_wrong_layouts as planted  # noqa: E402

from faprof.correctness.reference import compute_reference

VARLEN = AttentionProblem(B=4, H=2, Sq=40, Sk=40, D=32, dtype="fp32", causal=True, seqlens_q=(17, 40, 9, 26),
                          mask_align="bottom_right")
VARLEN_FULL = AttentionProblem(B=3, H=4, Sq=30, Sk=30, D=32, dtype="fp16", seqlens_q=(12, 30, 21), Hkv=2)
PAGED = AttentionProblem(B=3, H=4, Sq=2, Sk=45, D=32, dtype="fp16", causal=True, mask_align="bottom_right", Hkv=2,
                         seqlens_k=(45, 21, 33), page_size=16)


def _run(p, bug):
    q, k, v, _, args = layouts.make_layout_inputs(p, "cpu", torch.Generator().manual_seed(5))
    if p.layout == "varlen":
        out = planted.varlen(q, k, v, p, args.cu_seqlens_q.tolist(), args.cu_seqlens_k.tolist(), bug)
    else:
        out = planted.paged(q, k, v, p, args.block_table, args.seqlens_k.tolist(), bug)
    ref = layouts.reference_forward(p, q, k, v, args, "cpu", torch.float64)
    tol = DEFAULT_TOLERANCE[p.dtype]
    wrong = bool(((out.double() - ref).abs() > tol.atol + tol.rtol * ref.abs()).any())
    return wrong, rank(layout_signatures(p, q, k, v, args, out, ref, tol.atol, tol.rtol, math.nan))


CASES = [(VARLEN, "keys_of_previous", "sequence"), (VARLEN_FULL, "keys_of_previous", "sequence"),
         (VARLEN_FULL, "keys_run_on", "sequence"), (VARLEN, "one_sequence", "sequence"),
         (VARLEN_FULL, "one_sequence", "sequence"), (PAGED, "pool_order", "paging"),
         (PAGED, "logical_order", "paging"), (PAGED, "last_block_whole", "paging")]


@pytest.mark.parametrize("p,bug,family", CASES, ids=[f"{c[1]}-{c[0].shape_id[:12]}" for c in CASES])
def test_each_layout_bug_is_named_first(p, bug, family):
    wrong, sigs = _run(p, bug)
    assert wrong and sigs, bug
    assert (sigs[0].family, sigs[0].kind) == (family, bug), [(s.family, s.kind, round(s.share, 2)) for s in sigs]
    assert sigs[0].share >= 0.9


def test_sequence_3_reads_the_keys_of_sequence_2():
    _, sigs = _run(VARLEN_FULL, "keys_of_previous")
    assert sigs[0].title.startswith("sequences 1-2 read the keys of the sequence before them"), sigs[0].title


@pytest.mark.parametrize("p", [VARLEN, VARLEN_FULL, PAGED], ids=lambda p: p.layout + p.mask_name)
def test_the_kernels_without_a_bug_are_right(p):
    wrong, sigs = _run(p, None)
    assert not wrong and sigs == []


@pytest.mark.parametrize("p,bug,family", [(VARLEN_FULL, "keys_of_previous", "sequence"), (PAGED, "pool_order", "paging")],
                         ids=["varlen", "paged"])
def test_the_check_names_a_layout_bug_first(p, bug, family):
    """Through the check itself (faprof.correctness.check: inputs and reference in the layout, the
    variant called with attn=), as `faprof profile` runs a user kernel that declares these features."""
    from faprof.correctness import check as correctness
    from faprof.model.variant import Variant

    def fn(q, k, v, causal, scale, out=None, attn=None):
        if p.layout == "varlen":
            return planted.varlen(q, k, v, p, attn.cu_seqlens_q.tolist(), attn.cu_seqlens_k.tolist(), bug)
        return planted.paged(q, k, v, p, attn.block_table, attn.seqlens_k.tolist(), bug)

    var = Variant("t_planted", "user", "test", fn, dtypes=("fp16", "fp32"), device="cpu", features=p.features())
    inputs = correctness.make_inputs(p, "cpu", seed=9)
    ref = compute_reference(p, inputs, cuda_ok=False)
    r = correctness.check_correctness(var, p, inputs, ref, "cpu", DEFAULT_TOLERANCE[p.dtype])
    assert not r["correct"] and r["signatures"], r["check_reason"]
    assert (r["signatures"][0]["family"], r["signatures"][0]["kind"]) == (family, bug), r["signatures"]
def _probe_run(p, name, bug):
    from faprof.correctness import adversarial

    pr = next(x for x in adversarial.probes(p) if x.name == name)
    inp = adversarial.make_inputs(pr, "cpu", seed=7)
    pp, a = pr.problem, inp.args
    if pp.layout == "varlen":
        out = planted.varlen(inp.q, inp.k, inp.v, pp, a.cu_seqlens_q.tolist(), a.cu_seqlens_k.tolist(), bug)
    else:
        out = planted.paged(inp.q, inp.k, inp.v, pp, a.block_table, a.seqlens_k.tolist(), bug)
    ref = layouts.reference_forward(pp, inp.q, inp.k, inp.v, a, "cpu", torch.float64)
    return pr, float((out.double() - ref).abs().max())


def test_the_layout_probes_expose_a_boundary_crossed_and_a_last_block_read_whole():
    pr, right = _probe_run(VARLEN_FULL, "seq_boundary", None)
    assert pr.problem.B == 3 and right < 0.01
    assert _probe_run(VARLEN_FULL, "seq_boundary", "keys_of_previous")[1] > 0.5  # another sequence's V level
    pr, right = _probe_run(PAGED, "paged_partial", None)
    assert all(n % PAGED.page_size == 1 for n in pr.problem.k_lens()) and right < 0.01
    assert _probe_run(PAGED, "paged_partial", "last_block_whole")[1] > 5  # the pool's tail rows (V + 10) win
