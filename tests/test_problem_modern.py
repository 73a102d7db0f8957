"""Today's attention problems: GQA/MQA, masks aligned to either corner, windows, soft-cap, packed
varlen batches and paged KV caches. Work and byte counts are checked against brute force (every
(query, key) pair tested with the mask condition written out), the baselines against the definition,
and every bad input the issue names gives one clear line and exit 2."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from click.testing import CliRunner

from faprof.cli import main
from faprof.correctness import layouts
from faprof.errors import FaprofError
from faprof.model.problem import AttentionProblem
from faprof.model.scenarios import load_scenario
from faprof.variants.definition import assemble_q, sequence_views
from faprof.variants.torch_variants import SDPA_FEATURES


def _brute_pairs(sq: int, sk: int, causal: bool, align: str, left: int, right: int) -> tuple[int, int]:
    """(pairs, keys some query sees), one pair at a time, the rule written as the docs state it."""
    off = sk - sq if align == "bottom_right" else 0
    pairs, seen = 0, set()
    for i in range(sq):
        for j in range(sk):
            if causal and j > i + off:
                continue
            if left >= 0 and j < i + off - left:
                continue
            if right >= 0 and j > i + off + right:
                continue
            pairs += 1
            seen.add(j)
    return pairs, len(seen)


MASKS = [(c, a, w) for c in (False, True) for a in ("top_left", "bottom_right")
         for w in (None, (0, 0), (3, 0), (2, 5), (-1, 4), (6, -1))]


@pytest.mark.parametrize(("sq", "sk"), [(1, 1), (1, 37), (4, 37), (37, 37), (37, 11), (16, 64), (64, 16)])
@pytest.mark.parametrize(("causal", "align", "window"), MASKS)
def test_pairs_and_visible_keys_match_a_brute_force_count(sq, sk, causal, align, window):
    p = AttentionProblem(B=2, H=4, Sq=sq, Sk=sk, D=8, causal=causal, mask_align=align, window=window)
    left, right = window if window is not None else (-1, -1)
    pairs, keys = _brute_pairs(sq, sk, causal, align, left, right)
    assert p.total_pairs() == 2 * pairs
    assert p.fwd_flops() == 4 * 4 * 8 * 2 * pairs
    assert p.mask.visible_keys(sq, sk) == keys


def test_varlen_counts_are_the_sum_over_sequences():
    lens = (5, 1, 17, 9)
    p = AttentionProblem(B=4, H=8, Sq=17, Sk=17, D=16, causal=True, Hkv=2, seqlens_q=lens)
    assert p.layout == "varlen" and p.total_q == p.total_k == 32
    assert p.total_pairs() == sum(_brute_pairs(n, n, True, "top_left", -1, -1)[0] for n in lens)
    q_elems, kv_elems = 32 * 8 * 16, 32 * 2 * 16
    lse, idx = 32 * 8 * 4, 2 * 5 * 4
    assert p.min_bytes() == 2 * (2 * q_elems + 2 * kv_elems) + lse + idx
    assert p.tokens() == 32


def test_decode_bytes_count_kv_once_per_kv_head_and_the_block_table():
    p = AttentionProblem(B=3, H=64, Sq=1, Sk=1000, D=128, dtype="bf16", Hkv=8, page_size=256,
                         seqlens_k=(1000, 1, 257))
    kv = (1000 + 1 + 257) * 8 * 128
    q = 3 * 64 * 128
    table = (4 + 1 + 2) * 4 + 3 * 4  # block-table entries in use and the cache lengths
    assert p.min_bytes() == 2 * (2 * q + 2 * kv) + 3 * 64 * 4 + table
    assert p.bound(295.0) == "memory"
    prefill = AttentionProblem(B=1, H=32, Sq=8192, Sk=8192, D=128, dtype="bf16", Hkv=8, causal=True)
    assert prefill.bound(295.0) == "compute"
    # GQA's point: 8 KV heads move an eighth of the K/V bytes of 64
    mha = p.with_(Hkv=None)
    assert mha.min_bytes() - p.min_bytes() == 2 * 2 * (1000 + 1 + 257) * (64 - 8) * 128


def test_a_window_reads_only_the_keys_some_query_sees():
    p = AttentionProblem(B=1, H=1, Sq=1, Sk=10000, D=64, causal=True, mask_align="bottom_right", window=(99, 0))
    q, kv = p._io_elems()
    assert kv == 100 * 64


def test_old_problems_keep_their_shape_ids_and_counts():
    p = AttentionProblem(B=4, H=16, Sq=4096, Sk=4096, D=128, causal=True)
    assert p.shape_id == "b4_h16_sq4096_sk4096_d128_fp16_causal_fwd"
    assert p.features() == frozenset()
    assert p.with_(mask_align="bottom_right") == p  # Sq == Sk: the same mask, one spelling
    assert p.with_(Hkv=16).shape_id == p.shape_id


def test_shape_ids_tell_the_new_fields_apart():
    base = AttentionProblem(B=2, H=8, Sq=5, Sk=9, D=64, causal=True)
    ids = {base.with_(**kw).shape_id for kw in (
        {}, {"Hkv": 2}, {"Hkv": 1}, {"mask_align": "bottom_right"}, {"window": (3, 0)},
        {"window": (3, 0), "mask_align": "bottom_right"}, {"softcap": 30.0}, {"page_size": 4, "Sq": 1},
    )}
    assert len(ids) == 8


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"H": 32, "Hkv": 5}, "not a multiple of Hkv=5"),
    ({"window": (-2, 0)}, "negative size"),
    ({"seqlens_q": (3, 9)}, "does not match B=2 and Sq=8"),
    ({"seqlens_q": (3, 8, 4), "causal": True}, "3 lengths"),  # checked before the mask reads the lengths
    ({"page_size": 4, "Sq": 1, "block_table": ((0, 1), (2, 9))}, "outside the pool"),
    ({"page_size": 4, "Sq": 1, "block_table": ((0, 1), (1, 2))}, "to two sequences"),
    ({"page_size": 4, "direction": "bwd"}, "forward pass only"),
    ({"softcap": -1.0}, "softcap must be a number >= 0"),
])
def test_bad_problems_say_what_is_wrong(kwargs, needle):
    base = {"B": 2, "H": 8, "Sq": 8, "Sk": 8, "D": 64, **kwargs}
    with pytest.raises(FaprofError, match=needle):
        AttentionProblem(**base)


BAD_SCENARIOS = {
    "gqa": ("H = 32\nHkv = 5\nS = 64", "H % Hkv == 0"),
    "window": ("H = 8\nS = 64\ncausal = true\nwindow = [-5, 0]", "negative size"),
    "totals": ("H = 8\nseqlens_q = [10, 20]\ntotal_q = 31", "the sum of seqlens_q (30 tokens in 2 sequences)"),
    "table": ("H = 8\nSq = 1\nSk = 40\nB = 2\npage_size = 16\nblock_table = [[0, 1, 2], [3, 4, 9]]",
              "outside the pool"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCENARIOS))
def test_bad_scenario_inputs_are_one_line_and_exit_2(tmp_path, case):
    body, needle = BAD_SCENARIOS[case]
    if "B =" not in body and "seqlens_q" not in body:
        body += "\nB = 1"
    f = tmp_path / "bad.toml"
    f.write_text(f'name = "bad"\nbaseline = "torch_standard"\nvariants = ["torch_standard"]\n'
                 f'[defaults]\nD = 16\n{body}\n[[groups]]\nname = "g"\nproblems = [{{}}]\n')
    r = CliRunner().invoke(main, ["profile", "--scenario", str(f), "--out", str(tmp_path / "runs")])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("name", ["llama3_8b_prefill", "llama3_70b_decode", "mistral_window", "varlen_packed"])
def test_the_modern_scenarios_load_and_cite_their_source(name):
    s = load_scenario(name)
    assert s.problems and s.source
    for p in s.problems:
        assert p.features(), p.shape_id  # each is beyond 2022's problem
    if name == "varlen_packed":
        assert {p.total_q for p in s.problems} == {16384}
    if name == "llama3_70b_decode":
        assert {p.Sq for p in s.problems} == {1, 4} and any(p.layout == "paged" for p in s.problems)
        assert all(p.bound(295.0) == "memory" for p in s.problems)


SMALL = [
    AttentionProblem(B=2, H=8, Sq=37, Sk=53, D=16, dtype="fp32", causal=True, Hkv=2, mask_align="bottom_right"),
    AttentionProblem(B=2, H=4, Sq=40, Sk=40, D=16, dtype="fp32", causal=True, Hkv=1, window=(6, 0), softcap=5.0),
    AttentionProblem(B=3, H=4, Sq=33, Sk=33, D=16, dtype="fp32", causal=True, seqlens_q=(33, 1, 20)),
    AttentionProblem(B=3, H=8, Sq=4, Sk=70, D=16, dtype="fp32", causal=True, mask_align="bottom_right", Hkv=2,
                     page_size=16, seqlens_k=(70, 1, 33)),
    AttentionProblem(B=2, H=4, Sq=20, Sk=9, D=16, dtype="fp32", causal=True, mask_align="bottom_right"),
]


def _loops(p: AttentionProblem, q, k, v, args) -> torch.Tensor:
    """Attention one (sequence, head, query) at a time in float64 with plain loops: an implementation
    that shares nothing with faprof's but the tensors' layout."""
    views = list(sequence_views(p, q, k, v, args))
    outs = []
    for sv in views:
        sq, sk = sv.q.shape[1], sv.k.shape[1]
        off = sk - sq if p.mask_align == "bottom_right" else 0
        left, right = p.window if p.window is not None else (-1, -1)
        o = torch.zeros(p.H, sq, p.D, dtype=torch.float64)
        for h, i in itertools.product(range(p.H), range(sq)):
            kh = h // (p.H // p.kv_heads)
            keys = [j for j in range(sk) if not (p.causal and j > i + off) and not (left >= 0 and j < i + off - left)
                    and not (right >= 0 and j > i + off + right)]
            if not keys:
                continue
            s = [float(sv.q[h, i].double() @ sv.k[kh, j].double()) * p.softmax_scale for j in keys]
            if p.softcap:
                s = [p.softcap * math.tanh(x / p.softcap) for x in s]
            m = max(s)
            w = [math.exp(x - m) for x in s]
            for wj, j in zip(w, keys, strict=True):
                o[h, i] += wj / sum(w) * sv.v[kh, j].double()
        outs.append(o)
    return assemble_q(p, outs)


@pytest.mark.parametrize("problem", SMALL, ids=lambda p: p.shape_id)
def test_baselines_match_an_independent_loop_implementation(problem):
    import faprof.variants  # noqa: F401  (registers the variants)
    from faprof.model import variant as registry

    g = torch.Generator().manual_seed(1)
    q, k, v, _, args = layouts.make_layout_inputs(problem, "cpu", g)
    want = _loops(problem, q, k, v, args)
    ref = layouts.reference_forward(problem, q, k, v, args, "cpu", torch.float64)
    assert (ref - want).abs().max() < 1e-10
    for name in ("torch_standard", "flex", "sdpa_math"):
        var = registry.get(name)
        ok, why = var.supports(problem, cuda_available=False)
        if not ok:
            assert name == "sdpa_math" and problem.features() - SDPA_FEATURES, why
            continue
        got = var.fn(q, k, v, problem.causal, problem.softmax_scale, attn=args)
        if name == "sdpa_math" and problem.Sq > problem.Sk and problem.mask_align == "bottom_right":
            # SDPA leaves queries that see no key NaN; the definition gives zeros there
            got = torch.nan_to_num(got)
        assert (got.double() - want).abs().max() < 1e-5, name
