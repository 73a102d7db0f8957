"""The Hopper wgmma kernels without a GPU: they compile for sm_80, sm_89 and sm_90(a) (empty,
trapping bodies off sm_90a), ptxas' report of the sm_90a build (registers, no spills, the launch
annotation's shared memory and occupancy), the PTX really holds wgmma/fence instructions only for
sm_90a, and the registry entry refuses what the kernels cannot run with a reason.
"""

from __future__ import annotations

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
FILES = ("fa3_wgmma.cu", "fa3_wgmma_ws.cu")
#: The test-only wgmma GEMM probe: its own extension (tests/kernels/), fa3_common.cuh from kernels/.
WGMMA_TEST = Path(__file__).parent / "kernels" / "wgmma_test.cu"
WS_STEPS = ("fa3_wgmma_c", "fa3_wgmma_d", "fa3_wgmma_e")
ARCHS = ("sm_80", "sm_89", "sm_90")


@pytest.fixture(scope="module")
def report():
    import pandas as pd

    fa3 = build_report.resource_report(archs=ARCHS, sources=[build.KERNELS_DIR / f for f in FILES])
    probe = build_report.resource_report(archs=ARCHS, sources=[WGMMA_TEST], include_dirs=[build.KERNELS_DIR])
    return pd.concat([fa3, probe], ignore_index=True)


@needs_nvcc
def test_fa3_compiles_everywhere_and_fits_on_sm90a(report):
    fa3 = report[report.name.isin(["faprof_fa3::fa3_wgmma_a_kernel", "faprof_fa3::fa3_wgmma_b_kernel"])]
    # Two steps x fp16/bf16 x causal/not x D in {64, 128}, on each of the three architectures.
    for arch in ("sm_80", "sm_89", "sm_90a"):
        rows = fa3[fa3.arch == arch]
        assert len(rows) == 16 and sorted(set(rows.D)) == [64, 128], (arch, rows[["kernel", "D"]])
    hop = fa3[fa3.arch == "sm_90a"]
    assert (hop.spill_store_bytes == 0).all() and (hop.spill_load_bytes == 0).all(), hop
    assert (hop.registers <= 255).all() and (hop.registers >= 128).all(), hop.registers
    assert (hop.threads == 256).all()
    # Q 128xD + 2 stages of K and V (128xD each) in 16-bit elements, + 1 KiB to align to 1024 bytes;
    # step (b) adds 64 bytes of mbarriers.
    for D in (64, 128):
        tiles = 2 * D * (128 + 4 * 128) + 1024
        assert set(hop[(hop.D == D) & hop.name.str.endswith("_a_kernel")].dyn_smem_bytes) == {tiles}
        assert set(hop[(hop.D == D) & hop.name.str.endswith("_b_kernel")].dyn_smem_bytes) == {tiles + 64}
    assert (hop.blocks_per_sm == 1).all()
    # Off sm_90a the bodies are empty (they trap): a handful of registers, no shared memory use.
    assert (fa3[fa3.arch != "sm_90a"].registers < 32).all()
    gemm = report[(report.name == "faprof_fa3::wgmma_gemm_test_kernel") & (report.arch == "sm_90a")]
    # fp16/bf16 x N {64, 128} x K {16, 64, 128} x B K-/MN-major x A {K-major smem, registers, MN-major smem}
    assert len(gemm) == 72 and (gemm.spill_store_bytes == 0).all()
    assert fa3.role_registers.isna().all()  # no setmaxnreg in steps a and b


@needs_nvcc
def test_warp_specialized_steps_fit_and_report_their_role_registers(report):
    ws = report[report.name.isin([f"faprof_fa3::{s}_kernel" for s in WS_STEPS])]
    for arch in ("sm_80", "sm_89", "sm_90a"):
        rows = ws[ws.arch == arch]  # three steps x fp16/bf16 x causal/not x D in {64, 128}, plus step e's
        gen = rows.template_args.str.endswith(", true")  # GEN instantiations (GQA, masks, varlen: issue 36)
        assert len(rows[~gen]) == 24 and sorted(set(rows.D)) == [64, 128], (arch, rows[["kernel", "D"]])
        assert len(rows[gen]) == 8 and set(rows[gen].name) == {"faprof_fa3::fa3_wgmma_e_kernel"}, rows[gen]
    hop = ws[ws.arch == "sm_90a"]
    assert (hop.spill_store_bytes == 0).all() and (hop.spill_load_bytes == 0).all(), hop
    # 384 threads at one block per SM: ptxas may give at most 65536 / 384 -> 168 registers at launch;
    # setmaxnreg then moves them from the producer to the consumers.
    assert (hop.threads == 384).all() and (hop.registers <= 168).all(), hop.registers
    assert set(hop.role_registers) == {"producer 24, consumer 240"}
    assert ws[ws.arch != "sm_90a"].role_registers.isna().all()
    for D in (64, 128):  # Q, 2 stages of K and V, alignment slack, 128 bytes of mbarriers
        assert set(hop[hop.D == D].dyn_smem_bytes) == {2 * D * (128 + 4 * 128) + 1024 + 128}
    assert (hop.blocks_per_sm == 1).all()
    assert (ws[ws.arch != "sm_90a"].registers < 32).all()


def _ptx(arch: str, file: str = "fa3_wgmma.cu") -> str:
    """`nvcc -ptx` of a kernel file (cached by its sources and the compiler: tests/nvcc_cache.py)."""
    return nvcc_cache.ptx(arch, build.KERNELS_DIR / file)


@needs_nvcc
def test_wgmma_only_in_sm90a_code():
    ptx = _ptx("sm_90a")
    # 8 instantiations, each with one SS loop (QKᵀ, D/16 steps) and one RS loop (PV, BC/16 = 8 steps).
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16") > 0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") > 0
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in ptx  # PV at D = 64
    for needed in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned",
                   "fence.proxy.async.shared::cta", "cp.async.cg.shared.global",  # step (a)
                   "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",  # step (b)
                   "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64"):
        assert needed in ptx, needed
    for arch in ("sm_80", "sm_90"):  # plain sm_90 lacks the arch-specific features: no wgmma
        other = _ptx(arch)
        assert "wgmma.mma_async" not in other and "cp.async.bulk.tensor" not in other and "trap" in other, arch


@needs_nvcc
def test_warp_specialized_ptx_has_the_annotated_register_budgets_and_barriers():
    import re

    ptx = _ptx("sm_90a", "fa3_wgmma_ws.cu")
    anns = build_report.parse_setmaxnreg_annotations((build.KERNELS_DIR / "fa3_wgmma_ws.cu").read_text())
    assert set(anns) == {f"{s}_kernel" for s in WS_STEPS}
    # What the report says is what the code sets: every annotated value is in the PTX, and nothing else.
    dec = set(map(int, re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+);", ptx)))
    inc = set(map(int, re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+);", ptx)))
    assert dec == {a["producer"] for a in anns.values()} and inc == {a["consumer"] for a in anns.values()}
    for needed in ("mbarrier.arrive.shared::cta.b64", "mbarrier.arrive.expect_tx.shared::cta.b64",
                   "mbarrier.try_wait.parity.shared::cta.b64", "cp.async.bulk.tensor.3d", "bar.sync", "bar.arrive",
                   "wgmma.wait_group.sync.aligned 1;"):  # step e waits for S_j while PV_{j-1} runs
        assert needed in ptx, needed
    for arch in ("sm_80", "sm_90"):
        other = _ptx(arch, "fa3_wgmma_ws.cu")
        assert "setmaxnreg" not in other and "wgmma.mma_async" not in other and "trap" in other, arch


def test_setmaxnreg_annotation_parser():
    text = ("// faprof:setmaxnreg kernel=k1 producer=24 consumer=240\n"
            "//faprof:setmaxnreg   kernel=k2 producer=40 consumer=232 extra=8  \n"
            "// faprof:setmaxnreg kernel=k3 producer=lots\n// faprof:setmaxnreg producer=24\n")
    assert build_report.parse_setmaxnreg_annotations(text) == {
        "k1": {"producer": 24, "consumer": 240}, "k2": {"producer": 40, "consumer": 232, "extra": 8}}


def test_variant_refuses_what_it_cannot_run(monkeypatch):
    import torch

    from faprof import variants
    from faprof.variants.kernels import FA3_ARCH_REASON

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok = AttentionProblem(2, 3, 1000, 77, 128, "bf16", causal=True)
    for name in ("fa3_wgmma_a", "fa3_wgmma_b", *WS_STEPS):
        v = variants.get(name)
        assert (v.kind, v.dtypes, v.compute, v.needs_extension) == ("cuda", ("fp16", "bf16"), "tensor", True)
        assert (build.KERNELS_DIR.parent / v.source).exists()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        assert v.supports(ok, cuda_available=True) == (True, "")
        assert v.supports(AttentionProblem(1, 1, 128, 128, 256, "fp16"), cuda_available=True) == (
            False, f"D=256 not supported by {name} (supported: 64, 128)")
        assert not v.supports(AttentionProblem(1, 1, 128, 128, 64, "fp32"), cuda_available=True)[0]
        assert not v.supports(AttentionProblem(1, 1, 8, 8, 64, "fp16", scale=-1.0), cuda_available=True)[0]
        for cc in ((8, 9), (9, 1), (10, 0)):
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cc=cc: cc)
            assert v.supports(ok, cuda_available=True) == (False, FA3_ARCH_REASON)
    assert "sm_90a" in FA3_ARCH_REASON


def test_launch_annotation_matches_the_config():
    anns = build_report.parse_launch_annotations((build.KERNELS_DIR / "fa3_wgmma.cu").read_text())
    # Config<D, BC, NWG, STAGES>: template integers (D, BC, NWG, STAGES, causal).
    for name, extra in (("fa3_wgmma_a_kernel", 0), ("fa3_wgmma_b_kernel", 64)):
        ann = anns[name]
        assert build_report.eval_launch_expr(ann["threads"], 128, (128, 128, 2, 2, 1)) == 256
        assert build_report.eval_launch_expr(ann["dyn_smem"], 128, (128, 128, 2, 2, 1)) == 2 * 128 * 640 + 1024 + extra
        assert build_report.eval_launch_expr(ann["dyn_smem"], 64, (64, 128, 2, 3, 1)) == 2 * 64 * (128 + 768) + 1024 + extra
        assert build_report.eval_launch_expr(ann["D"], None, (64, 128, 2, 2, 0)) == 64
    ws = build_report.parse_launch_annotations((build.KERNELS_DIR / "fa3_wgmma_ws.cu").read_text())
    for step in WS_STEPS:  # the producer warpgroup on top; 128 bytes of mbarriers
        ann = ws[f"{step}_kernel"]
        assert build_report.eval_launch_expr(ann["threads"], 128, (128, 128, 2, 2, 1)) == 384
        assert build_report.eval_launch_expr(ann["dyn_smem"], 128, (128, 128, 2, 2, 1)) == 2 * 128 * 640 + 1024 + 128
        assert build_report.eval_launch_expr(ann["D"], None, (64, 128, 2, 2, 0)) == 64
    assert Path(build.KERNELS_DIR / "fa3_common.cuh").exists()


@needs_nvcc
def test_build_table_shows_the_role_registers(report):
    from rich.console import Console

    from faprof.cli import build_table

    ws = report[report.name.isin([f"faprof_fa3::{s}_kernel" for s in WS_STEPS]) & (report.arch == "sm_90a")]
    console = Console(width=250, record=True)
    console.print(build_table(ws.head(2)))
    text = console.export_text()
    assert text.count("168 (producer 24, consumer 240)") == 2, text
