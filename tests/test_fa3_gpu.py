"""GPU tests of the Hopper wgmma kernels (kernels/fa3_wgmma.cu) and of their building blocks.

Two layers, so that a failure says where it is:

1. test_wgmma_gemm: one warpgroup's wgmma GEMM (tests/kernels/wgmma_test.cu, TEST ONLY) against float64
   torch.matmul of the same rounded inputs, in every form the attention kernel uses: SS (A and B
   from shared-memory descriptors) and RS (A from registers, as P), B K-major (as K in Q·Kᵀ) and
   MN-major (transpose-B, as V in P·V), K = 16 (one instruction) and 128 (eight steps over two
   128-byte swizzle blocks), N = 64 and 128, fp16 and bf16. A wrong descriptor, swizzle or fragment
   layout gives errors of order 1 here (scripts/gpu/wgmma_diag.py says which offsets would pass).
2. The awkward-shape attention grid of tests/test_tc_kernels_gpu.py (its `check`: NaN-poisoned
   outputs with guard tails, a float64 reference, the same tolerances) on each fa3 step, D = 64
   and 128 (the head dims the steps support). Each test's id names its step (fa3_wgmma_a ... _e),
   so `-k fa3_wgmma_c` runs one step; scripts/gpu/gpu_wgmma_check.sh runs one pytest per step under a
   timeout, so that a hang in a barrier names the step.

On a GPU that is not compute capability 9.0 these skip, and test_refuses_other_archs checks the
op's clear refusal instead (the variant is `unsupported` there).
"""

from __future__ import annotations

import pytest
from attention_reference import reference
from test_tc_kernels_gpu import DTYPES, REL_TOL, SEQ_LENS, SEQ_PAIRS, check

torch = pytest.importorskip("torch")


def _sm90() -> bool:
    return torch.cuda.is_available() and tuple(torch.cuda.get_device_capability()) == (9, 0)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]
sm90_only = pytest.mark.skipif(not _sm90(), reason="wgmma needs a compute capability 9.0 GPU (H100/H200)")

#: Every fa3 step registered so far (variant name = op name without _fwd).
STEPS = ("fa3_wgmma_a", "fa3_wgmma_b", "fa3_wgmma_c", "fa3_wgmma_d", "fa3_wgmma_e")
HEAD_DIMS = (64, 128)


# ------------------------------------------------------------------------- wgmma building blocks
@sm90_only
@pytest.mark.parametrize("rs", [False, True], ids=["SS", "RS"])
@pytest.mark.parametrize("mn_major", [False, True], ids=["Bkmajor", "Bmnmajor"])
@pytest.mark.parametrize("K", [16, 128])
@pytest.mark.parametrize("N", [64, 128])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_wgmma_gemm(testonly_ops, dtype, N, K, mn_major, rs):
    dt = DTYPES[dtype]
    a = torch.randn(64, K, device="cuda", dtype=dt)
    b = torch.randn(K, N, device="cuda", dtype=dt) if mn_major else torch.randn(N, K, device="cuda", dtype=dt)
    c = torch.full((64, N), float("nan"), device="cuda")
    testonly_ops.wgmma_gemm_test(a, b, c, mn_major, rs, -1, -1)
    torch.cuda.synchronize()
    ref = a.double() @ (b.double() if mn_major else b.double().t())
    # fp32 accumulation of K <= 128 exact products: ~1e-6; a layout bug is of order 1.
    err = float(((c.double() - ref).abs() / (1 + ref.abs())).max())
    assert not torch.isnan(c).any(), "accumulator elements left unwritten"
    assert err <= 1e-3, f"max error {err:.2e} (run scripts/gpu/wgmma_diag.py for where)"


# ---------------------------------------------------------------------------------- attention
@sm90_only
@pytest.mark.parametrize("S", SEQ_LENS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernel", STEPS)
def test_square(ops, kernel, dtype, D, causal, S):
    check(ops, kernel, dtype, 1, 1, S, S, D, causal)


@sm90_only
@pytest.mark.parametrize("Sq,Sk", SEQ_PAIRS, ids=[f"{a}x{b}" for a, b in SEQ_PAIRS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernel", STEPS)
def test_sq_ne_sk(ops, kernel, dtype, D, causal, Sq, Sk):
    check(ops, kernel, dtype, 1, 5, Sq, Sk, D, causal)


@sm90_only
@pytest.mark.parametrize(
    "Sq,Sk,D", [(113, 113, 64), (203, 128, 128), (128, 203, 64), (1000, 1000, 128), (4096, 4096, 128)],
    ids=lambda x: str(x),
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernel", STEPS)
def test_batch_and_heads(ops, kernel, dtype, causal, Sq, Sk, D):
    check(ops, kernel, dtype, 3, 5, Sq, Sk, D, causal)


@sm90_only
@pytest.mark.parametrize("kernel", STEPS)
def test_sharp_softmax(ops, kernel):
    """Large scores (scale 1): the running max moves often and exp2 sees big offsets."""
    q = torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.float16) * 3
    k = torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.float16)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((1, 2, 300), float("nan"), device="cuda")
    getattr(ops, f"{kernel}_fwd")(q, k, v, o, lse, True, 1.0)
    ref, ref_lse = reference(q, k, v, True, 1.0)[:2]
    assert float((o.double() - ref).norm() / ref.norm()) <= REL_TOL["fp16"]
    assert float(((lse.double() - ref_lse).abs() / (1 + ref_lse.abs())).max()) <= 1e-4


@sm90_only
@pytest.mark.parametrize("kernel", STEPS)
def test_repeatable(ops, kernel):
    """The same inputs give bit-identical outputs (a race would make them drift)."""
    q, k, v = (torch.randn(2, 3, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    outs = []
    for _ in range(3):
        o = torch.full_like(q, float("nan"))
        lse = torch.full((2, 3, 1000), float("nan"), device="cuda")
        getattr(ops, f"{kernel}_fwd")(q, k, v, o, lse, True, 0.125)
        outs.append((o, lse))
    for o, lse in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])


@sm90_only
@pytest.mark.parametrize("kernel", STEPS)
def test_registry_variant(kernel):
    """The registry's callable writes into `out` and returns it (what the harness relies on)."""
    from faprof import variants

    v = variants.get(kernel)
    q, k, vv = (torch.randn(2, 2, 77, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    assert v.fn(q, k, vv, True, 0.125, out=out) is out
    ref = reference(q, k, vv, True, 0.125)[0]
    assert float((out.double() - ref).norm() / ref.norm()) <= REL_TOL["fp16"]


@sm90_only
@pytest.mark.parametrize("kernel", STEPS)
def test_rejects_unsupported_head_dim(ops, kernel):
    q, k, v = (torch.randn(1, 2, 16, 256, device="cuda", dtype=torch.float16) for _ in range(3))
    with pytest.raises(RuntimeError, match="D=256 not supported"):
        getattr(ops, f"{kernel}_fwd")(q, k, v, torch.empty_like(q), torch.empty(1, 2, 16, device="cuda"), False, 0.1)


@pytest.mark.skipif(_sm90(), reason="checks the refusal on GPUs other than compute capability 9.0")
@pytest.mark.parametrize("kernel", STEPS)
def test_refuses_other_archs(ops, kernel):
    from faprof import variants
    from faprof.model.problem import AttentionProblem
    from faprof.variants.kernels import FA3_ARCH_REASON

    q, k, v = (torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    with pytest.raises(RuntimeError, match="needs sm_90a"):
        getattr(ops, f"{kernel}_fwd")(q, k, v, torch.empty_like(q), torch.empty(1, 2, 16, device="cuda"), False, 0.1)
    assert variants.get(kernel).supports(AttentionProblem(1, 2, 16, 16, 64, "fp16")) == (False, FA3_ARCH_REASON)
