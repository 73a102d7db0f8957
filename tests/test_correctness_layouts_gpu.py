"""The fp32 GPU reference (one sequence, KV head group and row block at a time) against the float64 CPU
one on mid-size GQA, windowed, packed and paged problems; its memory on a 32k-key decode and a
16k-token packed batch; and torch_standard checked against it where it runs these problems."""

from __future__ import annotations

import pytest

from faprof import variants
from faprof.correctness import check as correctness
from faprof.correctness import reference
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE

pytestmark = pytest.mark.gpu

#: fp32 (GPU, blocked) against float64 (CPU) on outputs of magnitude ~1 and LSEs of ~10: rounding of
#: D = 128 dot products and sums over up to 4k keys stays near 1e-6; a mask or head-map slip is ~0.1.
GPU_VS_CPU_ATOL = 1e-4

#: Extra device memory the reference may take beyond its inputs on the long problems: its blocks hold
#: REF_BLOCK_ELEMENTS scores (64 MiB in fp32) a few times over, plus fp32 copies of one sequence's K/V.
REF_EXTRA_BYTES = 2 * 2**30

MID = {
    "gqa_prefill": AttentionProblem(B=2, H=16, Hkv=4, Sq=1024, Sk=1024, D=128, dtype="bf16", causal=True),
    "paged_decode": AttentionProblem(B=4, H=32, Hkv=8, Sq=2, Sk=4096, D=128, dtype="bf16", causal=True,
                                     mask_align="bottom_right", seqlens_k=(4096, 1000, 2049, 17), page_size=16),
    "varlen_window_bwd": AttentionProblem(B=4, H=8, Hkv=2, Sq=1500, Sk=1500, D=64, dtype="fp16", causal=True,
                                          window=(256, 0), seqlens_q=(1500, 17, 300, 1200), direction="bwd"),
    "br_softcap": AttentionProblem(B=1, H=8, Hkv=8, Sq=700, Sk=300, D=64, dtype="fp16", causal=True,
                                   mask_align="bottom_right", softcap=30.0),
}


def _close(a, b, what):
    import torch

    a, b = a.double().cpu(), b.double().cpu()
    same_inf = torch.isinf(a) & (a == b)
    d = torch.where(same_inf, torch.zeros_like(a), (a - b).abs())
    assert float(d.max()) < GPU_VS_CPU_ATOL, f"{what}: GPU fp32 differs from CPU fp64 by {float(d.max()):.3g}"


@pytest.mark.parametrize("name", list(MID))
def test_gpu_reference_matches_the_cpu_one(name, monkeypatch):
    p = MID[name]
    inputs = correctness.make_inputs(p, "cuda", seed=123)
    cpu = compute_reference(p, inputs, cuda_ok=False, baseline=False)
    monkeypatch.setattr(reference, "CPU_REFERENCE_MAX_FLOPS", 0.0)  # force the GPU path
    gpu = compute_reference(p, inputs, cuda_ok=True)
    assert cpu.kind == "cpu_ref fp64" and gpu.kind == "gpu fp32" and gpu.out.is_cuda
    _close(gpu.out, cpu.out, "out")
    _close(gpu.lse, cpu.lse, "lse")
    if p.direction != "fwd":
        for n, a, b in zip(("dq", "dk", "dv"), gpu.grads, cpu.grads, strict=True):
            _close(a, b, n)
    assert gpu.baseline_err["out"] > 0  # PyTorch in the problem's dtype, on the GPU


@pytest.mark.parametrize("problem", [
    AttentionProblem(B=8, H=64, Hkv=8, Sq=1, Sk=32768, D=128, dtype="bf16", causal=True, mask_align="bottom_right"),
    AttentionProblem(B=4, H=32, Hkv=8, Sq=8192, Sk=8192, D=128, dtype="bf16", causal=True,
                     seqlens_q=(8192, 4096, 2048, 2048)),
], ids=["decode_32k", "varlen_16k"])
def test_gpu_reference_memory_stays_bounded(problem, monkeypatch):
    import torch

    monkeypatch.setattr(reference, "CPU_REFERENCE_MAX_FLOPS", 0.0)  # the decode is small enough for the CPU
    inputs = correctness.make_inputs(problem, "cuda", seed=1)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ref = compute_reference(problem, inputs, cuda_ok=True)
    torch.cuda.synchronize()
    assert ref.kind == "gpu fp32"
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < REF_EXTRA_BYTES + 2 * ref.out.numel() * 4, f"reference took {extra / 2**30:.2f} GiB beyond its inputs"


def test_torch_standard_passes_where_it_runs_the_new_problems():
    v = variants.get("torch_standard")
    ran = []
    for name, p in MID.items():
        ok, _ = v.supports(p, cuda_available=True)
        if not ok:
            continue
        inputs = correctness.make_inputs(p, "cuda", seed=7)
        ref = compute_reference(p, inputs, cuda_ok=True)
        res = correctness.check_correctness(v, p, inputs, ref, "cuda", DEFAULT_TOLERANCE[p.dtype])
        assert res["correct"], f"{name}: {res['check_reason']}"
        ran.append(name)
    if not ran:
        pytest.skip("torch_standard declares none of these problems' features yet")
