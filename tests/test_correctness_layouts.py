"""Correctness for GQA, masks, soft-cap, packed varlen and paged problems, on the CPU.

The reference (faprof.correctness.reference) is checked against an independent implementation written
here with Python loops over (sequence, head, query, key): the mask condition from the text of
faprof.model.mask's rule, the soft-cap, query head h reading KV head h // (H // Hkv), keys of a paged
cache gathered entry by entry through the block table, packed sequences cut by cu_seqlens, and the
backward from its closed form (dS = P ∘ (dP - rowsum(dO ∘ O)), soft-cap's chain rule). Then: inputs in
each layout, the old dense path unchanged, a planted wrong element named in the problem's terms,
error maps on a packed batch, and `attn=` going to the variants that declare features, only those.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from faprof.correctness import check as correctness
from faprof.correctness import errormap, layouts, positions, reference
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE
from faprof.model.variant import Variant
from faprof.variants.definition import AttnArgs, attend, sequence_kv, sequence_q
from faprof.variants.torch_variants import standard_attention

# Small problems of every layout and mask: (name, fields).
PROBLEMS = {
    "gqa_br_window_cap": dict(B=2, H=4, Hkv=2, Sq=5, Sk=7, D=4, causal=True, mask_align="bottom_right",
                              window=(2, 0), softcap=3.0),
    "mqa_topleft_sq_gt_sk": dict(B=1, H=3, Hkv=1, Sq=7, Sk=5, D=4, causal=True),
    "br_sq_gt_sk_empty_rows": dict(B=2, H=2, Sq=7, Sk=4, D=3, causal=True, mask_align="bottom_right"),
    "window_both_sides": dict(B=1, H=2, Sq=6, Sk=9, D=4, window=(1, 2), mask_align="bottom_right"),
    "varlen_gqa_causal_br": dict(B=3, H=4, Hkv=2, Sq=6, Sk=6, D=4, causal=True, mask_align="bottom_right",
                                 seqlens_q=(3, 6, 1), seqlens_k=(5, 6, 2)),
    "varlen_window": dict(B=2, H=2, Sq=5, Sk=5, D=3, causal=True, window=(1, 0), seqlens_q=(5, 2)),
    "paged_decode": dict(B=3, H=4, Hkv=2, Sq=2, Sk=8, D=4, causal=True, mask_align="bottom_right",
                         seqlens_k=(5, 8, 3), page_size=4),
    "paged_cap_full": dict(B=2, H=2, Sq=1, Sk=8, D=4, softcap=2.0, seqlens_k=(8, 3), page_size=2),
}


def _problem(name: str, **kw) -> AttentionProblem:
    return AttentionProblem(**{"dtype": "fp32", **PROBLEMS[name], **kw})


def _visible(p: AttentionProblem, i: int, j: int, sq: int, sk: int) -> bool:
    """The rule, as faprof.model.mask's docstring words it."""
    off = sk - sq if p.mask_align == "bottom_right" else 0
    left, right = p.window if p.window is not None else (-1, -1)
    ok = 0 <= j < sk
    if p.causal:
        ok = ok and j <= i + off
    if left >= 0:
        ok = ok and j >= i + off - left
    if right >= 0:
        ok = ok and j <= i + off + right
    return ok


def _seq_tensors(p: AttentionProblem, inp) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per sequence (q [H, sq, D], k and v [Hkv, sk, D], dout [H, sq, D]) as float64 numpy, gathered with
    loops from the layout's index tensors."""
    q, k, v, do = (t.double().numpy() for t in (inp.q, inp.k, inp.v, inp.dout))
    a = inp.args
    out = []
    for b in range(p.B):
        if p.layout == "varlen":
            cq, ck = a.cu_seqlens_q.tolist(), a.cu_seqlens_k.tolist()
            qs, dos = q[cq[b]:cq[b + 1]].transpose(1, 0, 2), do[cq[b]:cq[b + 1]].transpose(1, 0, 2)
            ks, vs = k[ck[b]:ck[b + 1]].transpose(1, 0, 2), v[ck[b]:ck[b + 1]].transpose(1, 0, 2)
        elif p.layout == "paged":
            n = int(a.seqlens_k[b])
            ks = np.zeros((p.kv_heads, n, p.D))
            vs = np.zeros((p.kv_heads, n, p.D))
            for t in range(n):
                blk = int(a.block_table[b, t // p.page_size])
                ks[:, t] = k[blk, t % p.page_size]
                vs[:, t] = v[blk, t % p.page_size]
            qs, dos = q[b], do[b]
        else:
            qs, ks, vs, dos = q[b], k[b], v[b], do[b]
        out.append((qs, ks, vs, dos))
    return out


def _loops(p: AttentionProblem, inp, grads: bool = False) -> list[dict[str, np.ndarray]]:
    """Per sequence: o [H, sq, D], lse [H, sq] (and dq, dk, dv) by loops over (h, i, j)."""
    res = []
    c = p.softcap
    for qs, ks, vs, dos in _seq_tensors(p, inp):
        H, sq, D = qs.shape
        sk = ks.shape[1]
        o, lse = np.zeros((H, sq, D)), np.full((H, sq), -math.inf)
        dq, dk, dv = np.zeros_like(qs), np.zeros_like(ks), np.zeros_like(vs)
        for h in range(H):
            g = h // (p.H // p.kv_heads)
            for i in range(sq):
                keys = [j for j in range(sk) if _visible(p, i, j, sq, sk)]
                if not keys:
                    continue
                raw = {j: p.softmax_scale * float(qs[h, i] @ ks[g, j]) for j in keys}
                s = {j: (c * math.tanh(x / c) if c else x) for j, x in raw.items()}
                m = max(s.values())
                z = sum(math.exp(x - m) for x in s.values())
                pr = {j: math.exp(s[j] - m) / z for j in keys}
                lse[h, i] = m + math.log(z)
                o[h, i] = sum(pr[j] * vs[g, j] for j in keys)
                if grads:
                    dp = {j: float(dos[h, i] @ vs[g, j]) for j in keys}
                    delta = float(dos[h, i] @ o[h, i])
                    for j in keys:
                        ds = pr[j] * (dp[j] - delta)
                        if c:
                            ds *= 1.0 - math.tanh(raw[j] / c) ** 2
                        dq[h, i] += p.softmax_scale * ds * ks[g, j]
                        dk[g, j] += p.softmax_scale * ds * qs[h, i]
                        dv[g, j] += pr[j] * dos[h, i]
        res.append({"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv})
    return res


def _per_seq(p: AttentionProblem, name: str, t: torch.Tensor, b: int) -> np.ndarray:
    if name == "lse":
        return reference._lse_view(p, t, b).numpy()
    if name in ("dk", "dv"):
        return sequence_kv(p, t, b).numpy()
    return sequence_q(p, t, b).numpy()


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_forward_and_lse_match_loops_over_the_definition(name):
    p = _problem(name)
    inp = correctness.make_inputs(p, "cpu", seed=7)
    ref = compute_reference(p, inp, cuda_ok=False)
    assert ref.kind == "cpu_ref fp64"
    assert tuple(ref.out.shape) == positions.output_shape(p, "out")
    assert tuple(ref.lse.shape) == positions.output_shape(p, "lse")
    want = _loops(p, inp)
    for b in range(p.B):
        np.testing.assert_allclose(_per_seq(p, "out", ref.out, b), want[b]["o"], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(_per_seq(p, "lse", ref.lse, b)), np.isneginf(want[b]["lse"]))
        fin = np.isfinite(want[b]["lse"])
        np.testing.assert_allclose(_per_seq(p, "lse", ref.lse, b)[fin], want[b]["lse"][fin], rtol=0, atol=1e-12)


def test_a_row_seeing_no_key_has_zero_output_and_minus_inf_lse():
    p = _problem("br_sq_gt_sk_empty_rows")  # bottom-right, Sq = 7 > Sk = 4: rows 0-2 see nothing
    inp = correctness.make_inputs(p, "cpu", seed=3)
    ref = compute_reference(p, inp, cuda_ok=False)
    assert bool((ref.out[:, :, :3] == 0).all()) and bool(torch.isneginf(ref.lse[:, :, :3]).all())
    assert bool(torch.isfinite(ref.lse[:, :, 3:]).all())


@pytest.mark.parametrize("name", ["gqa_br_window_cap", "mqa_topleft_sq_gt_sk", "varlen_gqa_causal_br", "varlen_window",
                                  "br_sq_gt_sk_empty_rows"])
def test_backward_matches_the_closed_form(name):
    p = _problem(name, direction="bwd")
    inp = correctness.make_inputs(p, "cpu", seed=11)
    ref = compute_reference(p, inp, cuda_ok=False)
    dq, dk, dv = ref.grads
    assert tuple(dk.shape) == positions.output_shape(p, "dk") and tuple(dq.shape) == positions.output_shape(p, "dq")
    want = _loops(p, inp, grads=True)
    for b in range(p.B):
        for n, t in (("dq", dq), ("dk", dk), ("dv", dv)):
            np.testing.assert_allclose(_per_seq(p, n, t, b), want[b][n], rtol=0, atol=1e-11, err_msg=f"{n} b={b}")


def test_row_blocks_give_the_same_reference(monkeypatch):
    """Blocks of a few query rows (what a long sequence gets on the GPU) add up to the whole."""
    p = _problem("varlen_gqa_causal_br", direction="bwd")
    inp = correctness.make_inputs(p, "cpu", seed=5)
    whole = reference.layout_attention(p, inp.q, inp.k, inp.v, inp.args, "cpu", torch.float64, inp.dout)
    monkeypatch.setattr(reference, "REF_BLOCK_ELEMENTS", 2 * 6)  # two heads x 6 keys: one row per block
    assert len(reference._row_blocks(p, 6, 6)) == 6
    part = reference.layout_attention(p, inp.q, inp.k, inp.v, inp.args, "cpu", torch.float64, inp.dout)
    for a, b in zip((whole.out, whole.lse, *whole.grads), (part.out, part.lse, *part.grads), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_the_baseline_is_pytorch_in_the_problems_dtype():
    p = _problem("varlen_gqa_causal_br").with_(dtype="fp16")
    inp = correctness.make_inputs(p, "cpu", seed=2)
    ref = compute_reference(p, inp, cuda_ok=False)
    assert 0 < ref.baseline_err["out"] < 1e-2 and 0 < ref.baseline_err["lse"] < 1e-2
    assert "lse" in ref.baseline_err  # computed with the forward: no second pass


# ------------------------------------------------------------------------------- inputs per layout
def test_inputs_in_each_layout():
    p = _problem("varlen_gqa_causal_br")
    inp = correctness.make_inputs(p, "cpu", seed=1)
    assert inp.q.shape == (10, 4, 4) and inp.k.shape == (13, 2, 4) and inp.dout.shape == inp.q.shape
    assert inp.args.cu_seqlens_q.tolist() == [0, 3, 9, 10] and inp.args.cu_seqlens_k.tolist() == [0, 5, 11, 13]
    assert inp.args.cu_seqlens_q.dtype == torch.int32 and inp.args.block_table is None

    p = _problem("paged_decode")
    inp = correctness.make_inputs(p, "cpu", seed=1)
    pool = layouts.pool_blocks(p)
    assert inp.q.shape == (3, 4, 2, 4) and inp.k.shape == (pool, 4, 2, 4) and pool > 2 + 2 + 1
    table = inp.args.block_table
    assert table.dtype == torch.int32 and table.shape == (3, 2)
    used = [int(x) for b, n in enumerate(p.blocks_per_seq()) for x in table[b, :n]]
    assert len(set(used)) == len(used) and all(0 <= x < pool for x in used)   # a permutation within the pool
    assert [int(x) for b, n in enumerate(p.blocks_per_seq()) for x in table[b, n:]] == [-1]
    assert inp.args.seqlens_k.tolist() == [5, 8, 3]
    assert used != sorted(used)  # shuffled, as a serving system leaves them (seed 1)

    p = _problem("gqa_br_window_cap")
    inp = correctness.make_inputs(p, "cpu", seed=1)
    assert inp.q.shape == (2, 4, 5, 4) and inp.k.shape == (2, 2, 7, 4)


def test_old_dense_problems_draw_the_same_tensors_and_reference():
    """The seeds recorded in old bundles reproduce: the draw as it was written before layouts, and
    the reference from explicit float64 attention, bit for bit."""
    p = AttentionProblem(B=2, H=3, Sq=9, Sk=11, D=8, dtype="fp16", causal=True, direction="bwd")
    inp = correctness.make_inputs(p, "cpu", seed=4242)
    g = torch.Generator(device="cpu").manual_seed(4242)
    old = [torch.randn(s, generator=g, dtype=torch.float32).to(torch.float16)
           for s in ((2, 3, 9, 8), (2, 3, 11, 8), (2, 3, 11, 8), (2, 3, 9, 8))]
    for a, b in zip((inp.q, inp.k, inp.v, inp.dout), old, strict=True):
        assert torch.equal(a, b)
    ref = compute_reference(p, inp, cuda_ok=False)
    q, k, v = (t.double().requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    o = standard_attention(q, k, v, True, p.softmax_scale)
    grads = torch.autograd.grad(o, (q, k, v), inp.dout.double())
    assert torch.equal(ref.out, o.detach()) and all(torch.equal(a, b) for a, b in zip(ref.grads, grads, strict=True))


# ------------------------------------------------------------------------------- the check
def test_a_planted_wrong_element_is_named_in_sequence_terms():
    p = _problem("varlen_gqa_causal_br")
    inp = correctness.make_inputs(p, "cpu", seed=9)
    ref = compute_reference(p, inp, cuda_ok=False)
    out = ref.out.clone().float()
    out[3 + 4, 3, 2] += 1.0                 # sequence 1 starts at token 3: its query 4, head 3, column 2
    res = correctness.check_outputs(p, out, ref, DEFAULT_TOLERANCE["fp32"], lambda n: (2, 4))
    assert not res["correct"]
    assert "out[b=1, h=3 (kv head 1), i=4, d=2] (sequence 1, packed token 7; query tile 2: rows 4-5)" \
        in res["check_reason"]
    p2 = _problem("gqa_br_window_cap", direction="bwd")
    inp2 = correctness.make_inputs(p2, "cpu", seed=9)
    ref2 = compute_reference(p2, inp2, cuda_ok=False)
    dk = ref2.grads[1].clone().float()
    dk[1, 1, 3, 0] += 1.0
    res2 = correctness.check_outputs(p2, (ref2.out.float(), ref2.grads[0].float(), dk, ref2.grads[2].float()),
                                     ref2, DEFAULT_TOLERANCE["fp32"])
    assert "dk[b=1, kvh=1, j=3, d=0]" in res2["check_reason"]


def test_flashattentions_plus_inf_lse_of_an_empty_row_passes():
    p = _problem("br_sq_gt_sk_empty_rows")
    inp = correctness.make_inputs(p, "cpu", seed=3)
    ref = compute_reference(p, inp, cuda_ok=False)
    lse = ref.lse.clone().float()
    lse[torch.isneginf(lse)] = math.inf
    res = correctness.check_outputs(p, (ref.out.float(), lse), ref, DEFAULT_TOLERANCE["fp32"])
    assert res["correct"], res["check_reason"]
    lse[0, 0, 4] = math.inf  # a row that sees keys: wrong
    assert not correctness.check_outputs(p, (ref.out.float(), lse), ref, DEFAULT_TOLERANCE["fp32"])["correct"]


def _features_variant(fn, features=frozenset({"gqa", "bottom_right", "varlen"})) -> Variant:
    return Variant("t_layout", "user", "test", fn, dtypes=("fp32",), device="cpu", features=features)


def _definition_fn(calls):
    def fn(q, k, v, causal, scale, out=None, attn=None):
        calls.append(attn)
        return layouts.reference_forward(attn.problem, q, k, v, attn, q.device, torch.float32)
    return fn


def test_a_variant_declaring_features_gets_attn_and_passes():
    p = _problem("varlen_gqa_causal_br")
    inp = correctness.make_inputs(p, "cpu", seed=13)
    ref = compute_reference(p, inp, cuda_ok=False)
    calls: list = []
    res = correctness.check_correctness(_features_variant(_definition_fn(calls)), p, inp, ref, "cpu",
                                        DEFAULT_TOLERANCE["fp32"])
    assert res["correct"], res["check_reason"]
    assert calls and isinstance(calls[0], AttnArgs) and calls[0].cu_seqlens_q.tolist() == [0, 3, 9, 10]
    seen: list = []

    def old_style(q, k, v, causal, scale, out=None, **kw):
        seen.append(kw)
        return standard_attention(q, k, v, causal, scale)

    p0 = AttentionProblem(B=1, H=2, Sq=8, Sk=8, D=4, dtype="fp32", causal=True)
    inp0 = correctness.make_inputs(p0, "cpu", seed=1)
    ref0 = compute_reference(p0, inp0, cuda_ok=False)
    v0 = Variant("t_old", "user", "test", old_style, dtypes=("fp32",), device="cpu")
    assert correctness.check_correctness(v0, p0, inp0, ref0, "cpu", DEFAULT_TOLERANCE["fp32"])["correct"]
    assert seen == [{}]  # no attn= for a variant without features


def test_a_kernel_crossing_sequence_boundaries_is_mapped_per_sequence():
    """A 'varlen' kernel that attends over the whole packed batch as one sequence: sequence 0's rows
    are right only where they see no later token; the map says which sequences, in sequence terms."""
    p = _problem("varlen_gqa_causal_br").with_(mask_align="top_left", seqlens_k=(3, 6, 1))
    inp = correctness.make_inputs(p, "cpu", seed=21)
    ref = compute_reference(p, inp, cuda_ok=False)

    def one_sequence(q, k, v, causal, scale, out=None, attn=None):
        whole = AttentionProblem(B=1, H=4, Hkv=2, Sq=10, Sk=10, D=4, dtype="fp32", causal=True)
        o = attend(whole, q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        return o.transpose(0, 1).contiguous()

    res = correctness.check_correctness(_features_variant(one_sequence), p, inp, ref, "cpu", DEFAULT_TOLERANCE["fp32"])
    assert not res["correct"]
    maps = res["error_map"]
    seq = {r["bin"]: r for r in maps if r["axis"] == "sequence"}
    assert set(seq) == {"0", "1", "2"} and seq["0"]["n_bad"] == 0 and seq["1"]["n_bad"] > 0
    assert sum(r["n"] for r in seq.values()) == ref.out.numel()  # padding of shorter sequences not counted
    assert {"kv_head", "head_in_group", "boundary", "mask"} <= {r["axis"] for r in maps}
    lines = errormap.summarize([r for r in maps if r["output"] == "out"])
    assert lines[1].startswith("sequence 0 correct; sequences 1-2 wrong"), lines


def test_map_counts_on_a_packed_batch_match_a_loop():
    p = _problem("varlen_gqa_causal_br")
    inp = correctness.make_inputs(p, "cpu", seed=8)
    ref = compute_reference(p, inp, cuda_ok=False)
    out = ref.out.clone().float()
    out[4:6, 1] += 1.0       # sequence 1 (tokens 3-8), query rows 1-2, head 1 (KV head 0)
    out[9, 2:, 0] += 1.0     # sequence 2 (token 9), heads 2-3 (KV head 1), column 0
    oe = errormap.element_errors("out", out, ref.out, 1e-6, 1e-6, math.inf, p)
    recs = errormap.error_map(oe, "randn", p.causal, p.Sq, p.Sk, (2, 4), p)
    by = {(r["axis"], r["bin"]): r for r in recs}
    cu = [0, 3, 9, 10]
    want_seq = {0: 0, 1: 0, 2: 0}
    want_kv = {0: 0, 1: 0}
    for t in range(10):
        b = max(i for i in range(3) if cu[i] <= t)
        for h in range(4):
            for d in range(4):
                bad = abs(float(out[t, h, d]) - float(ref.out[t, h, d])) > 1e-6 + 1e-6 * abs(float(ref.out[t, h, d]))
                want_seq[b] += bad
                want_kv[h // 2] += bad
    assert {b: by[("sequence", str(b))]["n_bad"] for b in range(3)} == want_seq
    assert {g: by[("kv_head", str(g))]["n_bad"] for g in range(2)} == want_kv
    assert by[("all", "all")]["n"] == out.numel() and by[("sequence", "1")]["n"] == 6 * 4 * 4


def test_paged_and_window_maps_have_their_axes():
    p = _problem("paged_decode")
    inp = correctness.make_inputs(p, "cpu", seed=8)
    ref = compute_reference(p, inp, cuda_ok=False)
    out = ref.out.clone().float()
    out[0] += 1.0  # sequence 0: 5 keys in blocks of 4, a partial last block (sequence 1: 8 keys, two whole)
    oe = errormap.element_errors("out", out, ref.out, 1e-6, 1e-6, math.inf, p)
    cache = {r["bin"]: r for r in errormap.error_map(oe, "randn", True, p.Sq, p.Sk, None, p) if r["axis"] == "cache_block"}
    assert cache["sequences whose cache ends in a partial block"]["n_bad"] == out[0].numel()
    assert cache["sequences whose cache fills whole blocks"]["n_bad"] == 0
    pw = _problem("window_both_sides")
    inp = correctness.make_inputs(pw, "cpu", seed=8)
    ref = compute_reference(pw, inp, cuda_ok=False)
    out = ref.out.clone().float()
    out[:, :, 0] += 1.0
    oe = errormap.element_errors("out", out, ref.out, 1e-6, 1e-6, math.inf, pw)
    axes = {r["axis"] for r in errormap.error_map(oe, "randn", False, pw.Sq, pw.Sk, None, pw)}
    assert {"window", "mask", "diag_in_tile"} <= axes


# ------------------------------------------------------------------------------- probes and harness
def test_probe_inputs_follow_the_problems_layout():
    from faprof.correctness import adversarial

    old = AttentionProblem(B=3, H=4, Sq=300, Sk=300, D=8, dtype="fp16", causal=True)
    assert [pr.problem for pr in adversarial.probes(old)][0] == old.with_(B=2, H=2, Sq=256, Sk=256)
    for name in ("paged_decode", "varlen_gqa_causal_br"):
        p = _problem(name)
        for i, pr in enumerate(adversarial.probes(p)):
            q = pr.problem
            assert q.layout == p.layout and q.group == min(p.group, adversarial.PROBE_BH), pr.name
            inp = adversarial.make_inputs(pr, "cpu", seed=i)
            sh = layouts.shapes(q)
            assert tuple(inp.q.shape) == sh["q"] and tuple(inp.k.shape) == sh["k"] and inp.dout.shape == inp.q.shape
            assert all(math.isfinite(x) for x in adversarial.rounding_slack(q, inp).values())
    # a paged probe's pool holds each sequence's keys where its block table says
    pr = adversarial.probes(_problem("paged_decode"))[2]  # constant: every key equal
    inp = adversarial.make_inputs(pr, "cpu", seed=0)
    for b in range(pr.problem.B):
        keys = sequence_kv(pr.problem, inp.k, b, inp.args.block_table)
        assert bool((keys == keys[0, 0, 0]).all())


def test_the_harness_checks_a_new_problem_with_its_probes():
    from faprof.correctness import adversarial
    from faprof.model.settings import TimingSettings
    from faprof.timing import harness

    p = _problem("varlen_gqa_causal_br")
    inp = correctness.make_inputs(p, "cpu", seed=31)
    ref = compute_reference(p, inp, cuda_ok=False)
    probes = adversarial.ProbeSet(p, "cpu", lambda q, i: compute_reference(q, i, False), inp.seed)
    calls: list = []
    row = harness.measure(_features_variant(_definition_fn(calls)), p, inp, ref, "cpu", TimingSettings(),
                          do_timing=False, probes=probes)
    assert row["correct"], row["check_reason"]
    # every probe the problem has a use for ran and passed (2022's, and its corner's, GQA's and the pack's)
    assert {r["name"] for r in json.loads(row["probes"]) if r["status"] == "ok"} == {pr.name for pr in adversarial.probes(p)}
    assert set(adversarial.NAMES) | {"sq_lt_sk", "kv_heads"} <= {pr.name for pr in adversarial.probes(p)}


def test_an_old_bundles_error_maps_still_read():
    """The recorded H100 bundle (tests/data/wrong_bundle): its maps are explained as before."""
    from pathlib import Path

    from faprof.correctness.wrong_text import explain_wrong_rows
    from faprof.store import Bundle

    root = Path(__file__).resolve().parent / "data" / "wrong_bundle" / "20261125T044351Z_nvidia-h100-80gb-hbm3_wrong-gpu"
    b = Bundle.open(root)
    lines = explain_wrong_rows(b.measurements(), b.read("error_maps"), variant="wrong_batch_offset")
    assert lines[0].startswith("wrong_batch_offset on B=2 H=2 S=128 D=64 fp16 causal: wrong: stride/offset bug")
    assert "    batch 0 correct; batch 1 wrong in every head from row 0; no unwritten elements" in lines


def test_a_wrong_rows_shape_names_kv_heads_mask_and_layout():
    from faprof.correctness.wrong_text import explain_wrong

    row = {"variant": "k", "B": 3, "H": 4, "Hkv": 2, "Sq": 6, "Sk": 6, "D": 4, "dtype": "fp16", "causal": True,
           "mask": "causal_br", "layout": "varlen", "direction": "fwd"}
    assert explain_wrong(row)[0].startswith("k on B=3 H=4/2kv S=6 D=4 fp16 causal_br varlen: wrong")


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_torch_standard_passes_on_every_layout(name):
    from faprof import variants

    v = variants.get("torch_standard")
    p = _problem(name, dtype="fp16")
    ok, why = v.supports(p, cuda_available=False)
    assert ok, why
    inp = correctness.make_inputs(p, "cpu", seed=17)
    ref = compute_reference(p, inp, cuda_ok=False)
    res = correctness.check_correctness(v, p, inp, ref, "cpu", DEFAULT_TOLERANCE["fp16"])
    assert res["correct"], res["check_reason"]


def test_a_kernel_ignoring_the_block_table_fails_with_a_paged_map():
    p = _problem("paged_decode")
    inp = correctness.make_inputs(p, "cpu", seed=23)
    ref = compute_reference(p, inp, cuda_ok=False)

    def pool_order(q, k, v, causal, scale, out=None, attn=None):
        table = torch.full_like(attn.block_table, -1)
        start = 0
        for b, n in enumerate(attn.problem.blocks_per_seq()):  # blocks read in pool order, not the table's
            table[b, :n] = torch.arange(start, start + n, dtype=table.dtype)
            start += n
        bad = AttnArgs(attn.problem, seqlens_k=attn.seqlens_k, block_table=table)
        return layouts.reference_forward(attn.problem, q, k, v, bad, q.device, torch.float32)

    var = _features_variant(pool_order, frozenset({"gqa", "bottom_right", "paged"}))
    res = correctness.check_correctness(var, p, inp, ref, "cpu", DEFAULT_TOLERANCE["fp32"])
    assert not res["correct"] and "out[b=" in res["check_reason"]
    assert "cache_block" in {r["axis"] for r in res["error_map"]}
