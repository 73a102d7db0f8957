"""GPU correctness of the planted-fault kernels (tests/planted) against a float64 reference: a
planted fault is a performance defect, never a wrong result. Awkward shapes (tails of every tile
size, Sq != Sk), D 64 and 128, causal and not, fp16; O and lse poisoned with NaN first."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from attention_reference import reference

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]

PLANTED = Path(__file__).parent / "planted" / "planted_variants.py"
#: as for fa2_mma in test_tc_kernels_gpu.py (fp16 P and O on fp32 accumulation ~3e-4 relative)
REL_TOL = 1e-3
SHAPES = [(1, 2, 128, 128), (1, 2, 203, 203), (2, 3, 17, 113), (1, 2, 300, 129), (2, 2, 1000, 1000)]


@pytest.fixture(scope="module")
def planted():
    from faprof import variants

    variants.load_user_variants(str(PLANTED))
    # the fp16 ones (the row-thread family is fp32: tests/test_planted_kinds_gpu.py checks every kernel)
    return [v for v in variants.all_variants(include_hidden=True) if v.name.startswith("planted_") and "fp16" in v.dtypes]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_planted_kernels_are_correct(planted, D, causal):
    torch.manual_seed(0)
    for B, H, Sq, Sk in SHAPES:
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.float16)
        k = torch.randn(B, H, Sk, D, device="cuda", dtype=torch.float16)
        v = torch.randn(B, H, Sk, D, device="cuda", dtype=torch.float16)
        scale = 1 / math.sqrt(D)
        ref, _, _, _ = reference(q, k, v, causal, scale)
        for var in planted:
            out = torch.full_like(q, float("nan"))
            res = var.fn(q, k, v, causal, scale, out)
            torch.cuda.synchronize()
            assert not torch.isnan(res).any(), f"{var.name} B{B} H{H} Sq{Sq} Sk{Sk} D{D} causal={causal}: NaN left"
            err = ((res.double() - ref).norm() / ref.norm()).item()
            assert err < REL_TOL, f"{var.name} B{B} H{H} Sq{Sq} Sk{Sk} D{D} causal={causal}: rel err {err:.2e}"
