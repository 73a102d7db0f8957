"""The problem model: FLOPs and bytes against hand-computed values, ids, validation."""

import pytest

from faprof.errors import FaprofError
from faprof.model.problem import AttentionProblem


def test_forward_flops_match_flashattention_convention():
    # 4 * B * H * Sq * Sk * D = 4 * 4 * 16 * 4096 * 4096 * 128
    p = AttentionProblem(B=4, H=16, Sq=4096, Sk=4096, D=128, dtype="fp16")
    assert p.flops() == 4 * 4 * 16 * 4096 * 4096 * 128 == 549_755_813_888
    # causal: exact pairs S(S+1)/2, i.e. FlashAttention's S^2/2 times (S+1)/S
    assert p.with_(causal=True).flops() == 4 * 4 * 16 * (4096 * 4097 // 2) * 128
    assert p.with_(causal=True).flops() / (549_755_813_888 / 2) == pytest.approx(4097 / 4096)


def _brute_force_pairs(sq: int, sk: int, causal: bool) -> int:
    """Count unmasked pairs the way torch builds the mask: ones(sq, sk).tril() (top-left aligned)."""
    import torch

    if not causal:
        return sq * sk
    return int(torch.ones(sq, sk, dtype=torch.bool).tril().sum())


@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 7), (7, 1), (17, 113), (113, 17), (128, 128), (129, 64),
                                   (64, 129), (1000, 1), (203, 1000), (4096, 4096), (4097, 333)])
@pytest.mark.parametrize("causal", [False, True])
def test_unmasked_pairs_match_a_brute_force_count(sq, sk, causal):
    p = AttentionProblem(B=2, H=3, Sq=sq, Sk=sk, D=8, causal=causal)
    assert p.unmasked_pairs() == _brute_force_pairs(sq, sk, causal)
    assert p.fwd_flops() == 4 * 2 * 3 * 8 * p.unmasked_pairs()


def test_smoke_odd_causal_shape_counts_153_pairs():
    # Sq=17 queries over Sk=113 keys, top-left causal: query i sees i+1 keys -> 1+...+17 = 153
    # (the old Sq*Sk/2 count said 960.5 and overstated TFLOP/s 6.3x).
    p = AttentionProblem(B=1, H=1, Sq=17, Sk=113, D=64, causal=True)
    assert p.unmasked_pairs() == 153


def test_backward_is_2_5x_and_fwd_bwd_3_5x():
    p = AttentionProblem(B=1, H=2, Sq=128, Sk=64, D=32, dtype="fp32")
    f = 4 * 1 * 2 * 128 * 64 * 32
    assert p.flops() == f
    assert p.with_(direction="bwd").flops() == 2.5 * f
    assert p.with_(direction="fwd_bwd").flops() == 3.5 * f


def test_report_004_tflops_reproduce_from_its_own_times():
    # Report 004: B=32 H=16 L=512 D=128, 1.677 ms -> 40.98 TFLOP/s (non-causal, same convention).
    p = AttentionProblem(B=32, H=16, Sq=512, Sk=512, D=128)
    assert p.flops() / 1.677e-3 / 1e12 == pytest.approx(40.98, abs=0.01)


def test_min_bytes_by_hand():
    p = AttentionProblem(B=2, H=3, Sq=5, Sk=7, D=8, dtype="fp16")
    q = 2 * 3 * 5 * 8  # elements of Q (and O, dO, dQ)
    kv = 2 * 3 * 7 * 8  # elements of K (and V, dK, dV)
    lse = 2 * 3 * 5 * 4
    assert p.min_bytes() == 2 * (2 * q + 2 * kv) + lse == 2424
    assert p.with_(direction="bwd").min_bytes() == 2 * (4 * q + 4 * kv) + lse
    assert p.with_(direction="fwd_bwd").min_bytes() == 2424 + 2 * (4 * q + 4 * kv) + lse


def test_footprints_standard_vs_flash():
    # B=4 H=16 S=2048 fp16: one score matrix is 4*16*2048*2048*2 bytes = 512 MiB (report 002's figure)
    p = AttentionProblem(B=4, H=16, Sq=2048, Sk=2048, D=64, dtype="fp16")
    io = 2 * (4 * 4 * 16 * 2048 * 64)
    scores = 4 * 16 * 2048 * 2048 * 2
    assert scores == 512 * 2**20
    assert p.footprint_bytes("standard") == io + 2 * scores
    assert p.footprint_bytes("flash") == io + 4 * 16 * 2048 * 4
    assert p.footprint_reduction() > 10
    with pytest.raises(FaprofError):
        p.footprint_bytes("bogus")


def test_shape_id_is_stable_and_distinguishes_fields():
    p = AttentionProblem(B=4, H=8, Sq=128, Sk=128, D=64, dtype="fp16", causal=True)
    assert p.shape_id == "b4_h8_sq128_sk128_d64_fp16_causal_fwd"
    ids = {p.shape_id, p.with_(causal=False).shape_id, p.with_(dtype="bf16").shape_id,
           p.with_(direction="bwd").shape_id, p.with_(Sk=129).shape_id, p.with_(scale=0.5).shape_id}
    assert len(ids) == 6


@pytest.mark.parametrize("field,value", [("B", 0), ("H", -1), ("D", 1.5), ("Sq", True), ("dtype", "fp8"),
                                          ("direction", "sideways"), ("causal", "yes")])
def test_validation(field, value):
    kw = dict(B=1, H=1, Sq=1, Sk=1, D=8)
    kw[field] = value
    with pytest.raises(FaprofError, match=field if field not in ("dtype", "direction") else field):
        AttentionProblem(**kw)
