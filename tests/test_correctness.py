"""Correctness rules against deliberately broken variants, emulated with torch on the CPU.

Each broken variant computes attention the way a kernel would (fp32 math on fp16 inputs, fp16
output) with one local bug, at S=4096 in fp16, where the old norm-wise rule (||out - ref|| /
||ref|| <= 5e-3) let such bugs pass: their averaged error stays under that bound (asserted below).
The same code without the bug must pass, so the check is not simply failing everything.
"""

from __future__ import annotations

import math

import pytest
import torch

from faprof.correctness import check as correctness
from faprof.correctness import reference
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE, TimingSettings
from faprof.timing import harness
from faprof.variants import Variant
from faprof.variants.torch_variants import masked_scores

TILE = 64
S = 4096


def _kernel_like(q, k, v, causal, scale, leak_edges=False, skip=None):
    """fp32 attention on fp16 inputs, fp16 output, with optional planted bugs:
    leak_edges: the last row of every 64-row tile also sees the next (future) key;
    skip: (b, h, row_tile, key_tile): that CTA of that head skips one K/V tile."""
    qf, kf, vf = q.float(), k.float(), v.float()
    s = (qf @ kf.transpose(-2, -1)) * scale
    sq, sk = s.shape[-2], s.shape[-1]
    allowed = torch.ones(sq, sk, dtype=torch.bool).tril() if causal else torch.ones(sq, sk, dtype=torch.bool)
    allowed = allowed.expand(*s.shape).clone()
    if leak_edges:
        rows = torch.arange(TILE - 1, min(sq, sk - 1), TILE)
        allowed[..., rows, rows + 1] = True
    if skip is not None:
        b, h, rt, kt = skip
        allowed[b, h, rt * TILE:(rt + 1) * TILE, kt * TILE:(kt + 1) * TILE] = False
    s = s.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(s, dim=-1) @ vf).to(q.dtype)


def _variant(name, fn, **kw) -> Variant:
    return Variant(name=name, kind="user", description=name, fn=fn, dtypes=("fp16", "bf16", "fp32"),
                   device="cpu", compute="tensor", **kw)


@pytest.fixture(scope="module")
def big():
    p = AttentionProblem(B=1, H=3, Sq=S, Sk=S, D=64, dtype="fp16", causal=True)
    inputs = correctness.make_inputs(p, "cpu", seed=1234)
    ref = compute_reference(p, inputs, cuda_ok=False)
    return p, inputs, ref


def _small_normwise(r) -> bool:
    """Norm-wise, both bugs look small: under the old fp16 bound on ||out - ref|| / ||ref|| (5e-3)."""
    return r["rel_err"] <= 5e-3


def _check(variant, problem, inputs, ref, tol=None):
    return correctness.check_correctness(variant, problem, inputs, ref, "cpu", tol or DEFAULT_TOLERANCE[problem.dtype])


def test_a_clean_kernel_like_variant_passes(big):
    p, inputs, ref = big
    r = _check(_variant("clean", lambda q, k, v, c, s, out=None: _kernel_like(q, k, v, c, s)), p, inputs, ref)
    assert r["correct"], r["check_reason"]
    assert ref.baseline_err["out"] > 0  # PyTorch's own fp16 error is the yardstick


def test_a_causal_mask_leaking_at_tile_edges_fails(big):
    p, inputs, ref = big
    bad = _variant("leak", lambda q, k, v, c, s, out=None: _kernel_like(q, k, v, c, s, leak_edges=True))
    r = _check(bad, p, inputs, ref)
    # norm-wise the leak is small (the old rule's averaged error passed it) ...
    assert _small_normwise(r)
    # ... but it is local: the per-element and FlashAttention rules catch it
    assert not r["correct"]
    assert "PyTorch" in r["check_reason"] or "elements over" in r["check_reason"]


def test_one_cta_of_one_head_skipping_a_kv_tile_fails(big):
    p, inputs, ref = big
    # the CTA of rows 3968..4031 (tile 62) of head 1 skips key tile 10 (one of its 63 tiles)
    bad = _variant("skip", lambda q, k, v, c, s, out=None: _kernel_like(q, k, v, c, s, skip=(0, 1, 62, 10)))
    r = _check(bad, p, inputs, ref)
    assert _small_normwise(r)
    assert not r["correct"], r


def test_a_race_that_shows_only_in_timed_calls_fails():
    p = AttentionProblem(B=1, H=2, Sq=200, Sk=200, D=32, dtype="fp16", causal=False)
    inputs = correctness.make_inputs(p, "cpu", seed=5)
    ref = compute_reference(p, inputs, cuda_ok=False)
    calls = {"n": 0}

    def racy(q, k, v, c, s, out=None):
        calls["n"] += 1
        o = _kernel_like(q, k, v, c, s)
        if calls["n"] > 1:  # later calls lose one block's update, as a race under load would
            o[0, 1, 64:128] = o[0, 1, 64:128] * 0.5
        return o

    settings = TimingSettings(warmup_ms=0, budget_s=0.05, min_repeats=3, max_repeats=5)
    row = harness.measure(_variant("racy", racy), p, inputs, ref, "cpu", settings)
    assert row["correct"] is False and row["repeatable"] is False
    assert "timed call" in row["check_reason"]
    clean = harness.measure(_variant("clean", lambda q, k, v, c, s, out=None: _kernel_like(q, k, v, c, s)),
                            p, inputs, ref, "cpu", settings)
    assert clean["correct"] is True and clean["repeatable"] is True


def test_nondeterministic_but_correct_repeats_pass_only_where_declared():
    p = AttentionProblem(B=1, H=1, Sq=64, Sk=64, D=16, dtype="fp32")
    inputs = correctness.make_inputs(p, "cpu", seed=9)
    ref = compute_reference(p, inputs, cuda_ok=False)
    calls = {"n": 0}

    def jitter(q, k, v, c, s, out=None):
        calls["n"] += 1
        o = _kernel_like(q, k, v, c, s)
        return o + (1e-7 if calls["n"] == 1 else 0.0)  # the checked (first) call differs at rounding level

    settings = TimingSettings(warmup_ms=0, budget_s=0.02, min_repeats=2, max_repeats=4)
    det = harness.measure(_variant("det", jitter), p, inputs, ref, "cpu", settings)
    assert det["correct"] is False and "bitwise" in det["check_reason"]
    calls["n"] = 0
    nondet = harness.measure(_variant("nondet", jitter, deterministic=()), p, inputs, ref, "cpu", settings)
    assert nondet["correct"] is True and nondet["repeatable"] is False


def test_lse_is_checked_when_a_variant_returns_it():
    p = AttentionProblem(B=2, H=2, Sq=77, Sk=130, D=32, dtype="fp16", causal=True)
    inputs = correctness.make_inputs(p, "cpu", seed=11)
    ref = compute_reference(p, inputs, cuda_ok=False)

    def with_lse(shift: float):
        def fn(q, k, v, c, s, out=None):
            sc = masked_scores(q.float(), k.float(), c, s)
            lse = torch.logsumexp(sc, dim=-1)
            lse[0, 0, 5] += shift
            return _kernel_like(q, k, v, c, s), lse
        return fn

    good = _check(_variant("good", with_lse(0.0)), p, inputs, ref)
    assert good["correct"] and good["lse_checked"] and "lse" in good["errors"]
    bad = _check(_variant("bad", with_lse(0.05)), p, inputs, ref)
    assert not bad["correct"] and "lse" in bad["check_reason"]


def test_nan_and_wrong_shapes_never_pass():
    ref = torch.zeros(2, 3, dtype=torch.float64)
    tol = DEFAULT_TOLERANCE["fp32"]
    nan = torch.zeros(2, 3)
    nan[1, 2] = float("nan")
    assert not correctness.compare(nan, ref, tol, 1e-6)["ok"]
    assert not correctness.compare(torch.zeros(3, 2), ref, tol, 1e-6)["ok"]
    ok = correctness.compare(torch.zeros(2, 3), ref, tol, 1e-6)
    assert ok["ok"] and ok["max_abs"] == 0 and ok["bad_elems"] == 0


def test_per_element_rule_is_atol_plus_rtol_times_ref():
    tol = DEFAULT_TOLERANCE["fp16"]
    ref = torch.tensor([1.0, 10.0], dtype=torch.float64)
    edge = tol.atol + tol.rtol * 10.0
    assert correctness.compare(torch.tensor([1.0, 10.0 + 0.99 * edge]), ref, tol, None)["ok"]
    r = correctness.compare(torch.tensor([1.0 + 1.01 * (tol.atol + tol.rtol), 10.0]), ref, tol, None)
    assert not r["ok"] and r["bad_elems"] == 1 and r["worst_elem"] == 0


def test_flashattention_rule_bounds_by_pytorchs_error():
    tol = DEFAULT_TOLERANCE["fp16"]
    ref = torch.zeros(100, dtype=torch.float64)
    res = torch.zeros(100)
    res[3] = 2e-3  # within the per-element bound (4e-3) ...
    # ... but 3 x PyTorch's 4e-4 + 5e-4 = 1.7e-3 < 2e-3: fails
    r = correctness.compare(res, ref, tol, baseline_err=4e-4)
    assert not r["ok"] and math.isclose(r["bound"], 3 * 4e-4 + 5e-4)
    assert correctness.compare(res, ref, tol, baseline_err=6e-4)["ok"]


def test_flashattention_rule_slack_grows_with_the_outputs_magnitude():
    # Seen on the H100: fa2's fp32 dQ (B1 H1 S113 D128 causal) off by 1.76e-6, 8 ulps at its scale,
    # failed 3 x PyTorch's 2.19e-7 + 1e-6 on one seed in a few hundred. Rounding grows with the
    # values rounded, so the same relative error passes on a large output and fails on a unit one.
    tol = DEFAULT_TOLERANCE["fp32"]
    big = torch.full((64,), 8.0, dtype=torch.float64)
    res = big.float().clone()
    res[5] += 4e-6  # 0.5 ppm of 8: within 3 x 2e-7 + 1e-6 x 8
    r = correctness.compare(res, big, tol, baseline_err=2e-7)
    assert r["ok"] and math.isclose(r["bound"], 3 * 2e-7 + 1e-6 * 8.0, rel_tol=1e-9)
    unit = torch.full((64,), 0.5, dtype=torch.float64)
    res = unit.float().clone()
    res[5] += 4e-6  # the same absolute error on an output below 1: 8 ppm, fails
    r = correctness.compare(res, unit, tol, baseline_err=2e-7)
    assert not r["ok"] and math.isclose(r["bound"], 3 * 2e-7 + 1e-6, rel_tol=1e-9)
    assert "+ 1e-06" in r["reason"]


@pytest.mark.parametrize("extra", [{}, {"Hkv": 1, "mask_align": "bottom_right", "causal": True, "Sk": 12}])
def test_reference_forces_full_fp32_precision(monkeypatch, extra):
    seen = []
    name = "layout_attention" if extra else "_attention_pass"
    real = getattr(reference, name)

    def spy(*a, **kw):
        seen.append((torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32))
        return real(*a, **kw)

    monkeypatch.setattr(reference, name, spy)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # what a user module might do
    try:
        p = AttentionProblem(B=1, H=2, Sq=8, Sk=8, D=8, dtype="fp16").with_(**extra)
        compute_reference(p, correctness.make_inputs(p, "cpu", seed=1), cuda_ok=False)
        assert seen and all(prec == "highest" and not tf32 for prec, tf32 in seen)
        assert torch.get_float32_matmul_precision() == "high"  # restored for the user
    finally:
        torch.set_float32_matmul_precision(old)
