"""The Hopper backward steps (issue 28) without a GPU: kernels/fa3_bwd_a.cu, fa3_bwd_b.cu and
fa3_bwd_pre.cu compile for sm_80, sm_89 and sm_90(a) (empty, trapping bodies off sm_90a, like the fa3
forward), ptxas' sm_90a report of every instantiation (no spills, one block of 256 threads per SM,
the launch annotation's shared memory), the PTX holds the backward's instruction forms (the
transpose-A wgmma of dQ, v4 reductions, TMA and bulk copies in step b) only for sm_90a, the
single-wgmma test kernel has the backward's new forms, the registry refuses what the kernels cannot
run, and the Python side calls the ops with the schema's arguments and hands the gradients to the
right inputs (with the ops replaced by a float64 reference on the CPU).
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import nvcc_cache
import pytest

from faprof.model.problem import AttentionProblem
from faprof.variants import build
from faprof.variants import ptxas as build_report

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)
STEPS = ("fa3_bwd_a", "fa3_bwd_b")
FILES = ("fa3_bwd_a.cu", "fa3_bwd_b.cu", "fa3_bwd_pre.cu")
#: The test-only wgmma GEMM probe: its own extension (tests/kernels/), faprof's headers from kernels/.
WGMMA_TEST = Path(__file__).parent / "kernels" / "wgmma_test.cu"
#: Query rows per step of each head dim (BwdCfg in kernels/fa3_bwd.cuh).
BM = {64: 128, 128: 64}


def smem_bytes(D: int, BM: int, step: str) -> int:
    """The backward's shared memory, counted here from its parts: K, V (128 keys), two buffers of Q
    and dO (BM rows), dSᵀ (128 x BM), two buffers of lse2 and delta (BM floats each), 1 KiB to align
    the tiles, and step (b)'s 64 bytes of mbarriers."""
    tiles = 2 * 128 * D * 2 + 2 * 2 * BM * D * 2 + 128 * BM * 2 + 2 * 2 * BM * 4
    return tiles + 1024 + (64 if step == "fa3_bwd_b" else 0)


@pytest.fixture(scope="module")
def report():
    import pandas as pd

    archs = ("sm_80", "sm_89", "sm_90")
    bwd = build_report.resource_report(archs=archs, sources=[build.KERNELS_DIR / f for f in FILES])
    probe = build_report.resource_report(archs=archs, sources=[WGMMA_TEST], include_dirs=[build.KERNELS_DIR])
    return pd.concat([bwd, probe], ignore_index=True)


@needs_nvcc
def test_backward_steps_compile_everywhere_and_fit_on_sm90a(report):
    for step in STEPS:
        rows = report[report.name == f"faprof_fa3_bwd::{step}_kernel"]
        # fp16/bf16 x causal/not x D in {64, 128}, on each architecture
        for arch in ("sm_80", "sm_89", "sm_90a"):
            r = rows[rows.arch == arch]
            assert len(r) == 8 and sorted(set(r.D)) == [64, 128], (step, arch, r[["kernel", "D"]])
        hop = rows[rows.arch == "sm_90a"]
        assert (hop.spill_store_bytes == 0).all() and (hop.spill_load_bytes == 0).all(), hop
        assert (hop.stack_frame_bytes == 0).all(), hop.stack_frame_bytes
        assert (hop.registers <= 255).all() and (hop.registers >= 128).all(), hop.registers
        assert (hop.threads == 256).all() and (hop.blocks_per_sm == 1).all()
        for D in (64, 128):
            assert set(hop[hop.D == D].dyn_smem_bytes) == {smem_bytes(D, BM[D], step)}, (step, D)
        # Off sm_90a the bodies are empty (they trap): a handful of registers.
        assert (rows[rows.arch != "sm_90a"].registers < 32).all()
        assert rows.role_registers.isna().all()  # no setmaxnreg in steps a and b


@needs_nvcc
def test_pre_and_post_kernels_and_the_gemm_test_forms(report):
    for arch in ("sm_80", "sm_89", "sm_90a"):
        pre = report[(report.name == "faprof_fa3_bwd::fa3_bwd_preprocess_kernel") & (report.arch == arch)]
        assert len(pre) == 4 and sorted(set(pre.D)) == [64, 128], arch  # fp16/bf16 x D
        conv = report[(report.name == "faprof_fa3_bwd::fa3_bwd_convert_kernel") & (report.arch == arch)]
        assert len(conv) == 2 and (conv.threads == 256).all(), arch
    gemm = report[(report.name == "faprof_fa3::wgmma_gemm_test_kernel") & (report.arch == "sm_90a")]
    # fp16/bf16 x N {64, 128} x K {16, 64, 128} x B K-/MN-major x A {smem K-major, registers, smem MN-major}
    assert len(gemm) == 72 and (gemm.spill_store_bytes == 0).all()
    assert gemm.template_args.str.endswith("true").sum() == 24  # the transpose-A instantiations (A_MN last)


def _ptx(arch: str, file: str) -> str:
    """`nvcc -ptx` of a kernel file (cached by its sources and the compiler: tests/nvcc_cache.py)."""
    return nvcc_cache.ptx(arch, build.KERNELS_DIR / file)


@needs_nvcc
@pytest.mark.parametrize("step", STEPS)
def test_backward_instructions_only_in_sm90a_code(step):
    ptx = _ptx("sm_90a", f"{step}.cu")
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.(b?f16)\.b?f16 [^;]*?"
                       r"(p, 1, 1(?:, \d)?, \d);", ptx)
    forms = {(shape, dtype, tail) for shape, dtype, tail in wgmma}
    for dtype in ("f16", "bf16"):
        # Sᵀ/dPᵀ: SS, no transposes; dV/dK: RS with transpose-B; dQ: SS with transpose-A and -B (m64n64).
        assert ("m64n64k16", dtype, "p, 1, 1, 0, 0") in forms, forms
        assert ("m64n128k16", dtype, "p, 1, 1, 0, 0") in forms, forms
        assert ("m64n64k16", dtype, "p, 1, 1, 1") in forms and ("m64n128k16", dtype, "p, 1, 1, 1") in forms, forms
        assert ("m64n64k16", dtype, "p, 1, 1, 1, 1") in forms, forms
    for needed in ("red.global.add.v4.f32", "fence.proxy.async.shared::cta", "wgmma.fence.sync.aligned",
                   "wgmma.wait_group.sync.aligned 0;"):
        assert needed in ptx, needed
    if step == "fa3_bwd_a":
        assert "cp.async.cg.shared.global" in ptx and "cp.async.bulk" not in ptx
    else:
        for needed in ("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
                       "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                       "mbarrier.try_wait.parity.shared::cta.b64", "fence.mbarrier_init.release.cluster"):
            assert needed in ptx, needed
    for arch in ("sm_80", "sm_90"):  # plain sm_90 lacks the arch-specific features
        other = _ptx(arch, f"{step}.cu")
        assert "wgmma.mma_async" not in other and "cp.async.bulk" not in other and "trap" in other, arch


def test_launch_annotations_match_the_config():
    for step in STEPS:
        ann = build_report.parse_launch_annotations((build.KERNELS_DIR / f"{step}.cu").read_text())[f"{step}_kernel"]
        for D in (64, 128):  # template integers: D, BM, causal
            args = (D, BM[D], 1)
            assert build_report.eval_launch_expr(ann["dyn_smem"], None, args) == smem_bytes(D, BM[D], step)
            assert build_report.eval_launch_expr(ann["threads"], None, args) == 256
            assert build_report.eval_launch_expr(ann["D"], None, args) == D
    pre = build_report.parse_launch_annotations((build.KERNELS_DIR / "fa3_bwd_pre.cu").read_text())
    assert set(pre) == {"fa3_bwd_preprocess_kernel", "fa3_bwd_convert_kernel"}


def test_sequence_padding_agrees_with_the_kernels():
    from faprof.variants import fa3_backward as kernel_fa3_bwd

    header = (build.KERNELS_DIR / "faprof_kernels.h").read_text()
    (pad,) = re.findall(r"kFaprofFa3BwdSeqPad\s*=\s*(\d+);", header)
    assert int(pad) == kernel_fa3_bwd.FA3_BWD_SEQ_PAD
    assert max(BM.values()) <= int(pad) and all(int(pad) % bm == 0 for bm in BM.values())
    assert [kernel_fa3_bwd.padded_seq(s) for s in (1, 127, 128, 129, 1000)] == [128, 128, 128, 256, 1024]


def test_variants_refuse_what_the_kernels_cannot_run(monkeypatch):
    import torch

    from faprof import variants
    from faprof.variants import backward as kernel_bwd
    from faprof.variants.kernels import FA3_ARCH_REASON

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok = AttentionProblem(2, 3, 1000, 77, 128, "bf16", causal=True, direction="bwd")
    for name in STEPS:
        v = variants.get(name)
        assert (v.kind, v.dtypes, v.compute, v.needs_extension) == ("cuda", ("fp16", "bf16"), "tensor", True)
        assert v.directions == kernel_bwd.ALL_DIRECTIONS
        assert v.deterministic == ("fwd",), "dQ by atomics: the backward is not bit-reproducible"
        assert (build.KERNELS_DIR.parent / v.source).exists() and "sm90a" in v.tags and not v.hidden
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        for direction in kernel_bwd.ALL_DIRECTIONS:
            p = AttentionProblem(2, 3, 1000, 77, 64, "fp16", causal=False, direction=direction)
            assert v.supports(p, cuda_available=True) == (True, ""), direction
        assert v.supports(ok, cuda_available=True) == (True, "")
        assert v.supports(AttentionProblem(1, 1, 128, 128, 256, "fp16", direction="bwd"), cuda_available=True) == (
            False, f"D=256 not supported by {name} (supported: 64, 128)")
        assert not v.supports(AttentionProblem(1, 1, 128, 128, 64, "fp32", direction="bwd"), cuda_available=True)[0]
        assert not v.supports(AttentionProblem(1, 1, 8, 8, 64, "fp16", scale=-1.0, direction="bwd"),
                              cuda_available=True)[0]
        big = AttentionProblem(1024, 1024, 2049, 64, 64, "fp16", direction="bwd")  # B·H·Sq_pad > 2^31
        ok_big, why = v.supports(big, cuda_available=True)
        assert not ok_big and "32-bit" in why, why
        for cc in ((8, 0), (8, 9), (9, 1), (10, 0)):
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cc=cc: cc)
            assert v.supports(ok, cuda_available=True) == (False, FA3_ARCH_REASON), cc


def _schema_args(op: str) -> list[str]:
    """Argument names of torch.ops.faprof.<op> as binding.cpp declares them."""
    text = (build.KERNELS_DIR / "binding.cpp").read_text()
    (sig,) = re.findall(rf'm\.def\("{op}\((.*?)\) -> \(\)"\);', text)
    return [a.split()[-1].split("=")[0] for a in sig.split(",")]


def _cpu_attention(q, k, v, causal, scale):
    import torch

    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v, torch.logsumexp(s, -1)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autograd_wiring_with_a_cpu_stand_in_for_the_ops(monkeypatch, step, causal):
    """The variant's fn under autograd, with torch.ops.faprof replaced by a float64 CPU reference
    that takes the ops' schema arguments by name: the forward op gets out/lse to fill, the backward
    op the forward's out and lse, dout, and workspaces of the documented shapes; the gradients it
    writes come back as q.grad, k.grad, v.grad (not swapped, not re-scaled)."""
    torch = pytest.importorskip("torch")
    from faprof import variants
    from faprof.variants import fa3_backward as kernel_fa3_bwd

    fwd_names, bwd_names = _schema_args("fa3_wgmma_e_fwd"), _schema_args(step)
    seen: dict[str, object] = {}

    class FakeOps:
        def fa3_wgmma_e_fwd(self, *args):
            a = dict(zip(fwd_names, args, strict=True))
            o, lse = _cpu_attention(a["q"], a["k"], a["v"], a["causal"], a["scale"])
            a["out"].copy_(o)
            a["lse"].copy_(lse)

        def __getattr__(self, name):
            assert name == step, name

            def bwd(*args):
                a = dict(zip(bwd_names, args, strict=True))
                seen.update(a)
                q, k, v = (a[n].detach().double().requires_grad_(True) for n in ("q", "k", "v"))
                with torch.enable_grad():
                    o, _ = _cpu_attention(q, k, v, a["causal"], a["scale"])
                    grads = torch.autograd.grad(o, (q, k, v), a["dout"].double())
                for n, g in zip(("dq", "dk", "dv"), grads, strict=True):
                    a[n].copy_(g)
            return bwd

    monkeypatch.setattr(kernel_fa3_bwd, "_ops", lambda: FakeOps())
    kernel_fa3_bwd.attention_function.cache_clear()
    B, H, Sq, Sk, D = 2, 3, 130, 70, 64
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, n, D, generator=gen, dtype=torch.float64) for n in (Sq, Sk, Sk))
    dout = torch.randn(B, H, Sq, D, generator=gen, dtype=torch.float64)
    scale = 1 / math.sqrt(D)
    ts = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = variants.get(step).fn(*ts, causal, scale)
    out.backward(dout)
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, ref_lse = _cpu_attention(*ref, causal, scale)
    ref_out.backward(dout)
    assert torch.allclose(out, ref_out)
    for got, want in zip(ts, ref, strict=True):
        assert torch.allclose(got.grad, want.grad, rtol=1e-10, atol=1e-12)
    # What the backward op was handed: the forward's out and lse, workspaces of the documented shapes.
    assert torch.allclose(seen["out"], ref_out) and torch.allclose(seen["lse"].double(), ref_lse)
    assert seen["lse2"].shape == seen["delta"].shape == (B, H, kernel_fa3_bwd.padded_seq(Sq))
    assert seen["dq_accum"].shape == (B, H, Sq, D) and seen["dq_accum"].dtype == torch.float32
    assert seen["causal"] is causal and seen["scale"] == pytest.approx(scale)
    kernel_fa3_bwd.attention_function.cache_clear()


def test_forward_stays_the_plain_op():
    """Without a gradient to track, fn calls the forward's registry callable directly, so the
    variant's forward rows time exactly fa3_wgmma_e's forward."""
    torch = pytest.importorskip("torch")
    from faprof.variants import fa3_backward as kernel_fa3_bwd

    calls = []

    def plain(q, k, v, causal, scale, out=None, return_lse=False):
        calls.append(("plain", return_lse))
        return q

    fn = kernel_fa3_bwd.differentiable("fa3_bwd_a", plain, "fa3_wgmma_e_fwd")
    q = torch.zeros(1, 1, 2, 64)
    with torch.no_grad():
        fn(q.clone().requires_grad_(True), q, q, False, 0.5)
    fn(q, q, q, False, 0.5, None, True)
    assert calls == [("plain", False), ("plain", True)]
    with pytest.raises(ValueError, match="forward-only"):
        fn(q.clone().requires_grad_(True), q, q, False, 0.5, None, True)


@needs_nvcc
def test_faprof_build_lists_the_backward_kernels(report):
    """`faprof build`'s table has a row per backward instantiation with its registers and shared memory."""
    from rich.console import Console

    from faprof.cli import build_table

    rows = report[report.name.str.startswith("faprof_fa3_bwd::") & (report.arch == "sm_90a")]
    console = Console(width=250, record=True)
    console.print(build_table(rows))
    text = console.export_text()
    for kernel in ("fa3_bwd_a_kernel", "fa3_bwd_b_kernel", "fa3_bwd_preprocess_kernel", "fa3_bwd_convert_kernel"):
        assert kernel in text, kernel
    for step in STEPS:
        for D in (64, 128):
            kib = f"{smem_bytes(D, BM[D], step) / 1024:.1f}"
            line = next(ln for ln in text.splitlines() if f"BwdConfig<{D}, {BM[D]}>" in ln and kib in ln)
            assert " 256 " in line and "sm_90a" in line, line
