"""The planted-fault kernels (tests/planted) without a GPU: nvcc compiles them for sm_80, sm_89 and
sm_90 in their own files (never part of faprof's extension), each fault is instantiated, the
spill fault spills and the others do not more than fa2_mma itself; the variants stay hidden."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from faprof import variants
from faprof.variants import build
from faprof.variants import ptxas as build_report

PLANTED = Path(__file__).parent / "planted"
ARCHS = ("sm_80", "sm_89", "sm_90")

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)


@pytest.fixture(scope="module")
def report():
    return build_report.resource_report(archs=ARCHS, sources=sorted((PLANTED / "kernels").glob("*.cu")),
                                        include_dirs=[build.KERNELS_DIR])  # mma_ptx.cuh


@needs_nvcc
def test_every_fault_compiles_for_every_arch(report):
    mma = report[report["name"] == "faprof_planted_mma::planted_mma_fwd_kernel"]
    # fp16 x causal/not x 6 faults x D in {64, 128}, per arch
    for arch in {build.normalize_arch(a) for a in ARCHS}:
        rows = mma[mma["arch"] == arch]
        assert len(rows) == 2 * 6 * 2, rows["template_args"].tolist()
        faults = {int(t.rsplit(",", 1)[1]) for t in rows["template_args"]}
        assert faults == set(range(6))
        cc = report[(report["name"] == "planted_cuda_core_fwd_kernel") & (report["arch"] == arch)]
        assert sorted(cc["D"].tolist()) == [64, 128]
    assert report["threads"].notna().all() and (report["blocks_per_sm"] >= 1).all()


@needs_nvcc
def test_only_the_spill_fault_spills(report):
    mma = report[report["name"] == "faprof_planted_mma::planted_mma_fwd_kernel"].copy()
    mma["fault"] = [int(t.rsplit(",", 1)[1]) for t in mma["template_args"]]
    spills = mma[mma["fault"] == 2]
    assert (spills["registers"] <= 128).all() and (spills["spill_store_bytes"] >= 512).all()
    others = mma[mma["fault"] != 2]
    # fa2_mma itself spills up to a few dozen bytes at 255 registers; nothing more here
    assert (others["spill_store_bytes"] <= 64).all(), others[["template_args", "arch", "spill_store_bytes"]]


def test_planted_sources_stay_out_of_the_faprof_extension():
    names = {p.name for p in build.kernel_sources()}
    assert not any(n.startswith("planted") for n in names)
    assert all(p.parent == build.KERNELS_DIR for p in build.kernel_sources())


def test_planted_variants_are_hidden_and_registered_only_on_request():
    variants.load_user_variants(str(PLANTED / "planted_variants.py"))
    planted = [v for v in variants.all_variants(include_hidden=True) if v.name.startswith("planted_")]
    assert len(planted) == 8 and all(v.hidden and v.dtypes == ("fp16",) for v in planted)
    assert not any(v.name.startswith("planted_") for v in variants.all_variants())
    from faprof.model.scenarios import load_scenario

    s = load_scenario(str(PLANTED / "planted.toml"))
    assert sorted(s.variants) == sorted(v.name for v in planted)
    assert {p.causal for p in s.problems} == {False, True}


def test_planted_kernels_share_the_ptx_wrappers_instead_of_copying_them():
    """planted_mma.cu includes kernels/mma_ptx.cuh (as fa2_mma.cu does) and defines none of its wrappers."""
    import re

    text = (PLANTED / "kernels" / "planted_mma.cu").read_text()
    shared = re.findall(r"__device__ __forceinline__ \S+ (\w+)\(", (build.KERNELS_DIR / "mma_ptx.cuh").read_text())
    assert {"ldmatrix_x4", "mma_16816", "pack2", "fast_exp2"} <= set(shared)
    assert '#include "mma_ptx.cuh"' in text and "using namespace faprof_ptx;" in text
    defined = set(re.findall(r"__device__ __forceinline__ \S+ (\w+)\(", text))
    assert not defined & set(shared), defined & set(shared)
    assert "mma.sync.aligned" not in text and "ldmatrix.sync.aligned" not in text
