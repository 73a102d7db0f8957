"""GPU correctness of every planted kernel (tests/planted) under faprof's own correctness rules, as
`faprof profile` checks a variant before it times it: fresh randn inputs, O poisoned with NaN, per
element |out - ref| <= atol + rtol |ref| and max error <= 3x PyTorch's own error in the dtype + eps
(faprof.correctness.check, the default tolerances). A planted fault is a performance defect, never a
wrong result. Each kernel in its own dtype (fp16 for the fa2_mma family and
planted_no_tensor_cores, fp32 for the row-thread family), causal and not, D 64 and 128, on awkward
shapes (tails of every tile size, Sq != Sk) and on the planted scenario's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from faprof.correctness.reference import compute_reference

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA"),
]

PLANTED = Path(__file__).parent / "planted" / "planted_variants.py"
#: (B, H, Sq, Sk): every tile size's tail (16, 32, 64, 128 rows/keys), Sq != Sk both ways, and the
#: planted scenario's shape (B=4 H=16 S=2048).
SHAPES = [
    (1, 2, 128, 128),
    (1, 2, 203, 203),
    (2, 3, 17, 113),
    (1, 2, 300, 129),
    (2, 2, 1000, 1000),
    (4, 16, 2048, 2048),
]


@pytest.fixture(scope="module")
def planted():
    from faprof import variants

    variants.load_user_variants(str(PLANTED))
    return [v for v in variants.all_variants(include_hidden=True) if v.name.startswith("planted_")]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_every_planted_kernel_passes_faprofs_correctness_check(planted, dtype, causal, D):
    from faprof.correctness import check as correctness
    from faprof.model.problem import AttentionProblem
    from faprof.model.settings import DEFAULT_TOLERANCE

    kernels = [v for v in planted if dtype in v.dtypes]
    assert kernels, f"no planted kernel takes {dtype}"
    failures = []
    for B, H, Sq, Sk in SHAPES:
        problem = AttentionProblem(B=B, H=H, Sq=Sq, Sk=Sk, D=D, dtype=dtype, causal=causal)
        inputs = correctness.make_inputs(problem, "cuda", seed=Sq * 1000 + Sk)
        ref = compute_reference(problem, inputs, cuda_ok=True)
        for var in kernels:
            ok, why = var.supports(problem, cuda_available=True)
            assert ok, f"{var.name} refuses {problem}: {why}"
            res = correctness.check_correctness(var, problem, inputs, ref, "cuda", DEFAULT_TOLERANCE[dtype])
            if not res["correct"]:
                failures.append(
                    f"{var.name} B{B} H{H} Sq{Sq} Sk{Sk}: max err {res['max_abs_err']:.3g} "
                    f"({res['check_reason']})"
                )
    assert not failures, "\n".join(failures)


#: Row-thread fault codes (planted_kernels.h's kRowThread*; 0 is the control).
ROWTHREAD_FAULT_CODES = range(6)
#: fp32 lse = m * scale + log2(l) ln 2: ex2.approx's ~2 ulp per weight and the row sum's rounding
#: keep it within ~1e-5 of float64; a row sum missing a thread's share is off by ln 2 or more.
LSE_ATOL = 1e-4


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_rowthread_lse_matches_the_reference(planted, causal, D):
    # Each of a row's TPR threads sums the weights of its own keys and the row sum is their total;
    # faprof's check reads O only, so the lse (m and that total) is checked here, every fault.
    from attention_reference import reference

    clean = next(v for v in planted if v.name == "planted_rowthread_clean")
    failures = []
    for B, H, Sq, Sk in SHAPES[:-1]:
        gen = torch.Generator(device="cuda").manual_seed(Sq * 1000 + Sk)
        q, k, v = (torch.randn(B, H, s, D, device="cuda", generator=gen) for s in (Sq, Sk, Sk))
        scale = D**-0.5
        clean.fn(q, k, v, causal, scale)  # builds and loads the planted extension
        _, ref_lse, _, _ = reference(q, k, v, causal, scale)
        for code in ROWTHREAD_FAULT_CODES:
            out = torch.full_like(q, float("nan"))
            lse = torch.full((B, H, Sq), float("nan"), device="cuda")
            torch.ops.faprof_planted.rowthread_fwd(q, k, v, out, lse, causal, scale, code)
            err = (lse.double() - ref_lse).abs().max().item()
            if not err <= LSE_ATOL:  # also NaN
                failures.append(f"fault {code} B{B} H{H} Sq{Sq} Sk{Sk}: lse max err {err:.3g}")
    assert not failures, "\n".join(failures)
