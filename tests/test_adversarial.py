"""The adversarial inputs, and bug signatures on the local bugs of tests/test_correctness.py.

Method: the probes derived from a scenario shape are checked for size (B, H <= 2, lengths capped,
64k +- 1) and for what each is meant to hold (the winning scores of large_scores, the dominant key,
uniform scores), with values finite in fp16 and bf16. PyTorch's own attention (cpu_ref,
torch_standard, sdpa_math) must pass every probe in every dtype, mask and direction here (a probe
that flags a correct implementation would be a bug of faprof's). Then the two local bugs that the
norm-wise rule missed (a mask leaking at 64-row tile edges, one CTA skipping a K/V tile) go through
the check: the leak is named (causal mask shifted by one, in exactly the tile-edge rows), the skip
is not given a family it does not have, and its map points at its head and query tile.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_correctness import _kernel_like, _variant

from faprof import variants
from faprof.correctness import adversarial
from faprof.correctness import check as correctness
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE


def test_probes_are_small_versions_of_the_problem():
    p = AttentionProblem(B=16, H=8, Sq=512, Sk=512, D=64, dtype="fp16", causal=True)
    probes = {pr.name: pr.problem for pr in adversarial.probes(p)}
    assert list(probes) == [*adversarial.NAMES, "sq_lt_sk"]  # causal: Sq < Sk under its corner too
    for q in probes.values():
        assert (q.B, q.H, q.D, q.dtype, q.causal, q.direction) == (2, 2, 64, "fp16", True, "fwd")
        assert q.Sq <= adversarial.PROBE_MAX_S + 1 and q.Sk <= adversarial.PROBE_MAX_S + 1
    assert (probes["tile_minus"].Sq, probes["tile_plus"].Sq) == (255, 257)
    assert probes["sq_gt_sk"].Sq > probes["sq_gt_sk"].Sk == 127
    assert probes["sq_lt_sk"].Sq < probes["sq_lt_sk"].Sk == 256
    small = {pr.name: pr.problem for pr in adversarial.probes(AttentionProblem(1, 1, 17, 113, 32))}
    assert (small["tile_minus"].Sq, small["tile_minus"].Sk) == (63, 127) and small["large_scores"].B == 1


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_probe_inputs_hold_what_they_are_for(dtype):
    p = AttentionProblem(B=2, H=2, Sq=200, Sk=200, D=64, dtype=dtype, causal=True)
    by = {pr.name: pr for pr in adversarial.probes(p)}
    for pr in by.values():
        inp = adversarial.make_inputs(pr, "cpu", seed=7)
        for t in (inp.q, inp.k, inp.v):
            assert torch.isfinite(t).all() and float(t.abs().max()) < 64, pr.name
    ls = adversarial.make_inputs(by["large_scores"], "cpu", seed=7)
    s = torch.matmul(ls.q.double(), ls.k.double().transpose(-2, -1)) * p.softmax_scale
    s = s.masked_fill(~torch.ones(200, 200, dtype=torch.bool).tril(), -math.inf)
    top, second = s.topk(2, dim=-1).values.unbind(-1)
    levels = torch.tensor(adversarial.LARGE_SCORES, dtype=torch.float64)
    nearest = (top[..., None] - levels).abs().min(dim=-1)
    assert float(nearest.values.max()) < 0.05 * 128  # every winning score is one of the levels (bf16 rounding)
    for lv in adversarial.LARGE_SCORES:  # each level is there, and overflow levels win by a wide margin
        rows = nearest.indices == adversarial.LARGE_SCORES.index(lv)
        assert rows.sum() > 20
        if lv > 11.1:
            assert float((top - second)[rows].min()) > 10
    dk = adversarial.make_inputs(by["dominant_key"], "cpu", seed=7)
    s = torch.matmul(dk.q.double(), dk.k.double().transpose(-2, -1)) * p.softmax_scale
    s = s.masked_fill(~torch.ones(200, 200, dtype=torch.bool).tril(), -math.inf)
    assert (s.argmax(dim=-1) == 0).all()
    c = adversarial.make_inputs(by["constant"], "cpu", seed=7)
    s = torch.matmul(c.q.double(), c.k.double().transpose(-2, -1)) * p.softmax_scale
    assert float(s.max() - s.min()) < 1e-2


CORRECT = ("cpu_ref", "torch_standard", "sdpa_math")


@pytest.mark.parametrize("dtype,causal,direction", [("fp16", True, "fwd"), ("bf16", False, "fwd"),
                                                     ("fp32", True, "fwd"), ("fp32", True, "bwd")])
def test_pytorch_attention_passes_every_probe(dtype, causal, direction):
    p = AttentionProblem(B=2, H=3, Sq=96, Sk=96, D=32, dtype=dtype, causal=causal, direction=direction)
    inputs = correctness.make_inputs(p, "cpu", seed=11)
    ps = adversarial.ProbeSet(p, "cpu", lambda q, i: compute_reference(q, i, cuda_ok=False), inputs.seed)
    tol = DEFAULT_TOLERANCE[dtype]
    for name in CORRECT:
        v = variants.get(name)
        res = adversarial.run(ps, lambda q, v=v: v.supports(q, cuda_available=False),
                              lambda pr, inp, rf, v=v: correctness.check_correctness(v, pr.problem, inp, rf, "cpu", tol,
                                                                                     check_input=pr.name))
        assert [r["status"] for r in res["probes"]] == ["ok"] * len(adversarial.probes(p)), (name, res["probes"])
        assert res["signatures"] == [] and res["error_map"] == []


@pytest.fixture(scope="module")
def edge():
    p = AttentionProblem(B=1, H=3, Sq=1024, Sk=1024, D=64, dtype="fp16", causal=True)
    inputs = correctness.make_inputs(p, "cpu", seed=1234)
    return p, inputs, compute_reference(p, inputs, cuda_ok=False)


def test_a_mask_leaking_at_tile_edges_is_named_where_it_leaks(edge):
    p, inputs, ref = edge
    bad = _variant("leak", lambda q, k, v, c, s, out=None: _kernel_like(q, k, v, c, s, leak_edges=True))
    r = correctness.check_correctness(bad, p, inputs, ref, "cpu", DEFAULT_TOLERANCE["fp16"])
    assert not r["correct"]
    top = r["signatures"][0]
    assert (top["family"], top["kind"]) == ("causal_mask", "mask_shift_plus") and top["share"] == 1.0
    rows = [int(x) for x in top["detail"].split(" in ")[0].removeprefix("rows ").split(", ") if x.isdigit()]
    assert rows and all(i % 64 == 63 for i in rows)  # the last row of a 64-row tile, nothing else
    diag = {x["bin"]: x["n_bad"] for x in r["error_map"] if x["axis"] == "diag_in_tile"}
    assert diag["diagonal inside a key tile"] == 0 and diag["diagonal on a key tile's first key"] == 0


def test_a_skipped_kv_tile_gets_no_family_but_a_map_that_finds_it(edge):
    p, inputs, ref = edge
    bad = _variant("skip", lambda q, k, v, c, s, out=None: _kernel_like(q, k, v, c, s, skip=(0, 1, 14, 3)))
    r = correctness.check_correctness(bad, p, inputs, ref, "cpu", DEFAULT_TOLERANCE["fp16"])
    assert not r["correct"] and r["signatures"] == []
    m = {(x["axis"], x["bin"]): x for x in r["error_map"]}
    assert m[("head", "1")]["n_bad"] > 0 and m[("head", "0")]["n_bad"] == 0 and m[("head", "2")]["n_bad"] == 0
    wrong_tiles = [x["bin"] for x in r["error_map"] if x["axis"] == "query_tile" and x["n_bad"]]
    assert wrong_tiles == ["14"]  # rows 896-959: the CTA that skipped (64-row bins: the tile is not declared)


def test_garbage_is_not_given_a_family():
    p = AttentionProblem(B=2, H=2, Sq=128, Sk=128, D=32, dtype="fp32", causal=True)
    inputs = correctness.make_inputs(p, "cpu", seed=5)
    ref = compute_reference(p, inputs, cuda_ok=False)
    g = torch.Generator().manual_seed(9)

    def noisy(q, k, v, c, s, out=None):
        o = _kernel_like(q, k, v, c, s)
        return o + 0.01 * torch.randn(o.shape, generator=g)

    r = correctness.check_correctness(_variant("noisy", noisy), p, inputs, ref, "cpu", DEFAULT_TOLERANCE["fp32"])
    assert not r["correct"] and r["signatures"] == []


def test_a_scale_no_candidate_names_is_fitted():
    p = AttentionProblem(B=2, H=2, Sq=128, Sk=128, D=32, dtype="fp16", causal=True)
    inputs = correctness.make_inputs(p, "cpu", seed=21)
    ref = compute_reference(p, inputs, cuda_ok=False)
    off = _variant("off", lambda q, k, v, c, s, out=None: _kernel_like(q, k, v, c, 0.8 * s))
    r = correctness.check_correctness(off, p, inputs, ref, "cpu", DEFAULT_TOLERANCE["fp16"])
    assert not r["correct"]
    top = r["signatures"][0]
    assert (top["family"], top["kind"]) == ("softmax_scale", "scale_fitted") and top["share"] >= 0.9
    assert "0.8 x the scale" in top["title"]


def test_q_read_from_batch_0_with_the_right_k_and_v_is_a_stride_bug():
    # the Triton kernel of issue 25: Q's row offset ignores the batch index, K and V are read right
    p = AttentionProblem(B=3, H=2, Sq=64, Sk=64, D=32, dtype="fp16", causal=False)
    inputs = correctness.make_inputs(p, "cpu", seed=8)
    ref = compute_reference(p, inputs, cuda_ok=False)

    def q_offset(q, k, v, c, s, out=None):
        return _kernel_like(q[:1].expand_as(q), k, v, c, s)

    r = correctness.check_correctness(_variant("qoff", q_offset), p, inputs, ref, "cpu", DEFAULT_TOLERANCE["fp16"])
    top = r["signatures"][0]
    assert (top["family"], top["kind"]) == ("stride", "q_from_other_slice") and top["share"] == 1.0
    assert top["title"].startswith("batches 1-2 get batch 0's Q: the batch offset is ignored")
    batch = {x["bin"]: x["n_bad"] for x in r["error_map"] if x["axis"] == "batch"}
    assert batch["0"] == 0 and batch["1"] > 0 and batch["2"] > 0


def _rounded_exp2_attention(q, k, v, causal, scale, out=None):
    """An exact fp32 kernel's softmax: exponent arguments a = s·scale·log2(e) carry a relative error of
    a few fp32 roundings (fixed, as a kernel's rounding is), max subtraction, exp2; autograd does the
    backward from the same arguments (as a kernel recomputing P from its saved statistics)."""
    qf, kf, vf = q.float(), k.float(), v.float()
    a = (qf @ kf.transpose(-2, -1)) * (scale * math.log2(math.e))
    g = torch.Generator().manual_seed(0)
    a = a * (1 + 2.0**-24 * adversarial.EXP_ARGUMENT_ROUNDINGS * torch.randint(0, 2, a.shape, generator=g).mul(2).sub(1))
    if causal:
        a = a.masked_fill(~torch.ones(a.shape[-2], a.shape[-1], dtype=torch.bool).tril(), -math.inf)
    p = torch.exp2(a - a.amax(dim=-1, keepdim=True).detach())
    return ((p / p.sum(dim=-1, keepdim=True)) @ vf).to(q.dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_an_exact_kernel_passes_every_backward_probe(causal):
    """A kernel whose only error is its exponent arguments' fp32 rounding passes every probe under the
    probe checker (`rounding_slack` added per output)."""
    from faprof.timing.harness import probe_checker

    p = AttentionProblem(B=2, H=2, Sq=128, Sk=128, D=64, dtype="fp32", causal=causal, direction="bwd")
    inputs = correctness.make_inputs(p, "cpu", seed=2025)
    ps = adversarial.ProbeSet(p, "cpu", lambda q, i: compute_reference(q, i, cuda_ok=False), inputs.seed)
    v = _variant("rounded_exp2", _rounded_exp2_attention)
    res = adversarial.run(ps, lambda q: (True, ""), probe_checker(v, "cpu", DEFAULT_TOLERANCE["fp32"]))
    assert [r["status"] for r in res["probes"]] == ["ok"] * len(adversarial.probes(p)), res["probes"]


#: Gradient errors of a correct kernel on probes, recorded on the H100 (2026-11-25, tests/test_wrong_gpu.py,
#: sdpa_auto = PyTorch's memory-efficient backend, B=2 H=3 S=128 D=64 fp32 non-causal backward, seed
#: 2025) that failed FlashAttention's rule (3x PyTorch's error + 1e-6) before gradients had a slack:
#: (probe, output, max abs error).
RECORDED_H100 = [("large_scores", "dk", 7.64e-06), ("dominant_key", "dk", 2.13e-05), ("dominant_key", "dv", 3.48e-05)]


def test_the_slack_covers_the_gradient_errors_a_correct_kernel_had_on_the_h100():
    p = AttentionProblem(B=2, H=3, Sq=128, Sk=128, D=64, dtype="fp32", causal=False, direction="bwd")
    ps = adversarial.ProbeSet(p, "cpu", lambda q, i: None, 2025)  # the test's inputs (drawn on the CPU)
    slack = {pr.name: adversarial.rounding_slack(pr.problem, inp) for pr, inp, _ in ps}
    for probe, output, err in RECORDED_H100:
        assert slack[probe][output] >= err, (probe, output, slack[probe][output], err)
    # the slack follows the probe's conditioning: far less where nothing cancels or scores are small
    assert slack["constant"]["dq"] < slack["large_scores"]["dq"] / 10
    assert slack["tile_plus"]["out"] < slack["large_scores"]["out"] / 10


def test_a_refused_probe_is_not_a_bug_and_a_cuda_fault_is():
    p = AttentionProblem(B=2, H=2, Sq=128, Sk=128, D=64, dtype="fp32", causal=True)
    inputs = correctness.make_inputs(p, "cpu", seed=3)
    ps = adversarial.ProbeSet(p, "cpu", lambda q, i: compute_reference(q, i, cuda_ok=False), inputs.seed)
    ok = variants.get("torch_standard")

    def refuses(pr, inp, rf):
        if pr.problem.Sq != pr.problem.Sk:
            raise RuntimeError("No available kernel. Aborting execution.")
        return correctness.check_correctness(ok, pr.problem, inp, rf, "cpu", DEFAULT_TOLERANCE["fp32"])

    res = adversarial.run(ps, lambda q: (True, ""), refuses)
    status = {r["name"]: r["status"] for r in res["probes"]}
    assert status["sq_gt_sk"] == status["sq_lt_sk"] == "refused" and res["failed"] == []
    assert {s for n, s in status.items() if n not in ("sq_gt_sk", "sq_lt_sk")} == {"ok"}

    def faults(pr, inp, rf):
        if pr.name == "tile_minus":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return correctness.check_correctness(ok, pr.problem, inp, rf, "cpu", DEFAULT_TOLERANCE["fp32"])

    res = adversarial.run(ps, lambda q: (True, ""), faults)
    status = {r["name"]: r["status"] for r in res["probes"]}
    assert res["failed"] == ["tile_minus"] and status["tile_minus"] == "error"
    assert "CUDA fault" in res["reasons"][0]
    assert status["tile_plus"] == status["sq_lt_sk"] == "skipped"  # after a fault the context is gone: nothing more runs
