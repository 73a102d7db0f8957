"""The backward kernels (issue 13) without a GPU: nvcc compiles kernels/fa2_bwd.cu and
kernels/fa2_mma_bwd.cu for sm_80, sm_89 and sm_90, ptxas' report lists every instantiation with its
launch annotation (so `faprof build` shows their registers, shared memory and spills), and the
registry declares the backward directions and which of them are deterministic.
"""

from __future__ import annotations

import shutil

import pytest

from faprof.variants import build
from faprof.variants import ptxas as build_report

REPORT_ARCHS = ("sm_80", "sm_89", "sm_90")
FILES = ("fa2_bwd.cu", "fa2_mma_bwd.cu")

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)


@pytest.fixture(scope="module")
def report():
    return build_report.resource_report(archs=REPORT_ARCHS, sources=[build.KERNELS_DIR / f for f in FILES])


def _rows(report, name, arch):
    return report[(report.name == name) & (report.arch == arch)]


@needs_nvcc
def test_fa2_bwd_instantiations(report):
    for arch in ("sm_80", "sm_89", "sm_90a"):
        for name in ("fa2_bwd_preprocess_kernel", "fa2_bwd_dq_kernel"):
            assert sorted(_rows(report, name, arch).D) == [32, 64, 128], (name, arch)
        # dK/dV kernel: with and without atomic dQ for each D
        assert sorted(_rows(report, "fa2_bwd_kernel", arch).D) == [32, 32, 64, 64, 128, 128], arch
    fp32 = report[report.file == "fa2_bwd.cu"]
    # 75264 B at D = 128: Q, dO (32x128), K, V (32x132), P, dS (32x33) fp32 and lse, delta.
    d128 = fp32[(fp32.name == "fa2_bwd_kernel") & (fp32.D == 128)]
    assert set(d128.dyn_smem_bytes) == {4 * (2 * 32 * 128 + 2 * 32 * 132 + 2 * 32 * 33 + 64)}


@needs_nvcc
def test_fa2_mma_bwd_instantiations(report):
    for arch in ("sm_80", "sm_89", "sm_90a"):
        main = _rows(report, "fa2_mma_bwd_kernel", arch)
        # D=64, D=128 and D=128's small-smem config, plus the double-buffered D=64 and D=128 configs
        # (QBUF = 2); x fp16/bf16 x causal x (atomic dQ or not)
        assert len(main) == 5 * 2 * 2 * 2, arch
        assert sorted(set(main.D)) == [64, 128]
        dq = _rows(report, "fa2_mma_bwd_dq_kernel", arch)
        assert len(dq) == 2 * 2 * 2 and sorted(set(dq.D)) == [64, 128]
        assert len(_rows(report, "fa2_mma_bwd_preprocess_kernel", arch)) == 4
        assert len(_rows(report, "fa2_mma_bwd_convert_kernel", arch)) == 2
    mma = report[report.file == "fa2_mma_bwd.cu"]
    assert mma.threads.notna().all() and (mma.registers <= 255).all()
    # D=128 main config: K, V (128 rows) and Q, dO (64 rows) of 256 B plus dSᵀ 128x64 fp16 = 112 KiB,
    # more than sm_89's 99 KB: there the launcher takes the 64-key config, which fits.
    # The double-buffered D=128 config (QBUF = 2) adds a second Q/dO buffer and 2 x 2 x 64 floats of
    # lse/delta: 145 KiB, launched only where it fits (sm_80, sm_90), like the default one.
    main = mma[mma.name == "fa2_mma_bwd_kernel"]
    big_all = main[(main.D == 128) & (main.threads == 256)]  # not the 4-warp small-smem config
    big = big_all[big_all.dyn_smem_bytes == 2 * 128 * (2 * 128 + 2 * 64) + 2 * 128 * 64]
    exp = big_all[big_all.dyn_smem_bytes == 2 * 128 * (2 * 128 + 4 * 64) + 2 * 128 * 64 + 16 * 64]
    assert len(big) == 8 * 3 and len(exp) == 8 * 3 and len(big_all) == 16 * 3
    assert set(big_all[big_all.arch == "sm_89"].blocks_per_sm) == {0}
    rest = mma.drop(big_all[big_all.arch == "sm_89"].index)
    assert (rest.blocks_per_sm >= 1).all(), rest[rest.blocks_per_sm < 1]


def test_backward_directions_are_registered():
    from faprof import variants
    from faprof.model.problem import AttentionProblem

    for name in ("fa2", "fa2_mma"):
        v = variants.get(name)
        assert v.directions == ("fwd", "bwd", "fwd_bwd")
        assert v.deterministic == ("fwd",), "atomic dQ: the backward is not bit-reproducible"
        det = variants.get(f"{name}_det")
        assert det.directions == ("bwd", "fwd_bwd")
        assert set(det.deterministic) == {"fwd", "bwd", "fwd_bwd"}
        assert (build.KERNELS_DIR.parent / det.source).exists()
    p256 = AttentionProblem(1, 1, 128, 128, 256, "fp16", direction="bwd")
    ok, why = variants.get("fa2_mma").supports(p256, cuda_available=True)
    assert not ok and why == "D=256 not supported by fa2_mma's backward (supported: 64, 128)"
    fwd256 = AttentionProblem(1, 1, 128, 128, 256, "fp16", direction="fwd")
    assert variants.get("fa2_mma").supports(fwd256, cuda_available=True) == (True, "")
    ok, why = variants.get("fa2_mma_det").supports(fwd256, cuda_available=True)
    assert not ok and "directions" in why


def test_forward_stays_the_plain_op(monkeypatch):
    """Without a gradient to track, a variant's fn calls the forward op directly (no autograd
    Function); with one, the autograd Function."""
    torch = pytest.importorskip("torch")
    from faprof.variants import backward as kernel_bwd

    calls = []

    def plain(q, k, v, causal, scale, out=None, return_lse=False):
        calls.append("plain")
        return q

    class Fake:
        @staticmethod
        def apply(*args):
            calls.append("autograd")
            return args[0]

    monkeypatch.setattr(kernel_bwd, "attention_function", lambda kernel: Fake)
    fn = kernel_bwd.differentiable("fa2", plain)
    q = torch.zeros(1, 1, 2, 4)
    with torch.no_grad():
        fn(q.requires_grad_(True), q, q, False, 0.5)
    fn(torch.zeros(1, 1, 2, 4), q.detach(), q.detach(), False, 0.5)
    assert calls == ["plain", "plain"]
    fn(torch.zeros(1, 1, 2, 4, requires_grad=True), q.detach(), q.detach(), False, 0.5)
    assert calls[-1] == "autograd"
