"""The planted-fault kernels (tests/planted) without a GPU: nvcc compiles them for sm_80, sm_89 and
sm_90 in their own files (never part of faprof's extension), each fault is instantiated, the
spill fault spills and the others do not more than fa2_mma itself; the row-thread family runs one
block per SM; the variants stay hidden, and each has an expected cause and a control twin."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from faprof import variants
from faprof.advisor import CAUSES
from faprof.variants import build
from faprof.variants import ptxas as build_report

PLANTED = Path(__file__).parent / "planted"
ARCHS = ("sm_80", "sm_89", "sm_90")
#: Faults of planted_mma.cu (its Fault enum) and of planted_rowthread.cu.
MMA_FAULTS = 14
ROWTHREAD_FAULTS = 6
#: Spill bytes ptxas may report for a fault that is not the spill fault: fa2_mma itself spills a few
#: dozen bytes at 255 registers; the fp64 softmax's double temporaries a few more (<= 11 local
#: accesses per key tile in its SASS against ~2,400-4,000 instructions: tests/test_planted_sass.py).
SPILL_BYTES_OK = {9: 256}
SPILL_BYTES_OK_DEFAULT = 64

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)


@pytest.fixture(scope="module")
def report():
    return build_report.resource_report(archs=ARCHS, sources=sorted((PLANTED / "kernels").glob("*.cu")),
                                        include_dirs=[build.KERNELS_DIR])  # mma_ptx.cuh: in the ptxas cache key


@needs_nvcc
def test_every_fault_compiles_for_every_arch(report):
    mma = report[report["name"] == "faprof_planted_mma::planted_mma_fwd_kernel"]
    rt = report[report["name"] == "faprof_planted_rt::planted_rt_fwd_kernel"]
    # fp16 x causal/not x faults x D in {64, 128}, per arch
    for arch in {build.normalize_arch(a) for a in ARCHS}:
        rows = mma[mma["arch"] == arch]
        assert len(rows) == 2 * MMA_FAULTS * 2, rows["template_args"].tolist()
        faults = {int(t.rsplit(",", 1)[1]) for t in rows["template_args"]}
        assert faults == set(range(MMA_FAULTS))
        rows = rt[rt["arch"] == arch]
        assert len(rows) == 2 * ROWTHREAD_FAULTS * 2, rows["template_args"].tolist()
        assert {int(t.rsplit(",", 1)[1]) for t in rows["template_args"]} == set(range(ROWTHREAD_FAULTS))
        assert sorted(set(rows["D"])) == [64, 128]
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
    allowed = others["fault"].map(lambda f: SPILL_BYTES_OK.get(f, SPILL_BYTES_OK_DEFAULT))
    assert (others["spill_store_bytes"] <= allowed).all(), others[["template_args", "arch", "spill_store_bytes"]]
    rt = report[report["name"] == "faprof_planted_rt::planted_rt_fwd_kernel"]
    assert (rt["spill_store_bytes"] <= SPILL_BYTES_OK_DEFAULT).all(), rt[["template_args", "arch", "spill_store_bytes"]]


@needs_nvcc
def test_the_rowthread_family_runs_one_block_of_eight_warps_per_sm(report):
    # the control and every defect at the same occupancy, so that they differ in instructions only
    # (the launcher also pads shared memory to more than half an SM's; here registers decide)
    rt = report[report["name"] == "faprof_planted_rt::planted_rt_fwd_kernel"]
    assert not rt.empty
    assert (rt["threads"] == 256).all() and (rt["blocks_per_sm"] == 1).all(), rt[["template_args", "arch", "registers"]]


def test_planted_sources_stay_out_of_the_faprof_extension():
    names = {p.name for p in build.kernel_sources()}
    assert not any(n.startswith("planted") for n in names)
    assert all(p.parent == build.KERNELS_DIR for p in build.kernel_sources())


def test_planted_variants_are_hidden_and_registered_only_on_request():
    variants.load_user_variants(str(PLANTED / "planted_variants.py"))
    planted = [v for v in variants.all_variants(include_hidden=True) if v.name.startswith("planted_")]
    assert len(planted) == 23 and all(v.hidden for v in planted)
    assert not any(v.name.startswith("planted_") for v in variants.all_variants())
    from faprof.model.scenarios import load_scenario

    prefill = [v for v in planted if v.name != "planted_kv_repeat"]
    assert all(v.dtypes in (("fp16",), ("fp32",)) for v in prefill)
    s = load_scenario(str(PLANTED / "planted.toml"))
    assert sorted(s.variants) == sorted(v.name for v in prefill)
    assert {p.causal for p in s.problems} == {False, True}
    # every variant meets every shape of its dtype (the other dtype's rows are `unsupported`)
    for v in prefill:
        assert {(p.D, p.causal) for p in s.problems if p.dtype in v.dtypes} == {(64, False), (128, False), (64, True)}
    # the decode plant runs beside its twin on GQA decode problems only, which the prefill kernels refuse
    d = load_scenario(str(PLANTED / "planted_decode.toml"))
    assert sorted(d.variants) == ["decode_splitkv", "planted_kv_repeat"]
    kv_repeat = variants.get("planted_kv_repeat")
    for p in d.problems:
        assert p.Hkv < p.H and p.Sq == 1
        assert kv_repeat.supports(p, cuda_available=True) == (True, "")
        assert not any(v.supports(p, cuda_available=True)[0] for v in prefill)


def _planted_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("faprof_planted_variants_for_build", PLANTED / "planted_variants.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_planted_kernel_has_an_expected_cause_and_a_control_of_its_own_design():
    mod = _planted_module()
    planted = {v.name: v for v in variants.all_variants(include_hidden=True) if v.name.startswith("planted_")}
    # the decode plant's control is faprof's own decode kernel (a kernel of the same design, not a planted one)
    assert set(mod.EXPECTED_CAUSE) == set(planted) | {"decode_splitkv"} == set(mod.CONTROL_OF)
    controls = set(mod.CONTROL_OF.values())
    assert controls == {"planted_clean", "planted_rowthread_clean", "decode_splitkv"}
    for name, control in mod.CONTROL_OF.items():
        assert mod.EXPECTED_CAUSE[control] is None and mod.CONTROL_OF[control] == control, (name, control)
        if name != "planted_no_tensor_cores":  # its defect is its design: compared with the tensor-core control
            a, b = variants.get(name), variants.get(control)
            assert a.dtypes == b.dtypes and a.compute == b.compute
    # a planted kernel with no expected cause besides the controls is one measured to cost nothing
    # (planted_barrier's first version, planted_l2_thrash on the H100); the planted test then requires no
    # cause for it
    assert {n for n, c in mod.EXPECTED_CAUSE.items() if c is None} - controls <= {"planted_barrier", "planted_l2_thrash"}
    for name, cause in mod.EXPECTED_CAUSE.items():
        assert cause is None or cause in CAUSES, f"{name}: {cause!r} is not a cause the advisor can name"
    # the kinds added for the accounting each exercise a different part of it: a stall reason, a pipe,
    # lanes, or a mechanism read from its own counters (fp64, special functions)
    new = [c for n, c in mod.EXPECTED_CAUSE.items() if c is not None and CONTROL_OF_NEW(mod, n)]
    assert len(new) >= 6 and len(set(new)) == len(new), new


def CONTROL_OF_NEW(mod, name: str) -> bool:  # noqa: N802  (reads like the mapping it checks)
    """The kinds issue 24 added: the fa2_mma family's new faults and the row-thread family."""
    return name in ("planted_fence", "planted_transcendental", "planted_fp64") or (
        mod.CONTROL_OF[name] == "planted_rowthread_clean" and name != "planted_rowthread_clean")


def test_planted_kernels_share_the_ptx_wrappers_instead_of_copying_them():
    """planted_mma.cu includes kernels/mma_ptx.cuh (as fa2_mma.cu does) and defines none of its wrappers."""
    import re

    text = (PLANTED / "kernels" / "planted_mma.cu").read_text()
    shared = re.findall(r"__device__ __forceinline__ \S+ (\w+)\(", (build.KERNELS_DIR / "mma_ptx.cuh").read_text())
    assert {"ldmatrix_x4", "mma_16816", "pack2", "fast_exp2"} <= set(shared)
    assert re.search(r'#include "[./]*(kernels/)?mma_ptx\.cuh"', text)
    defined = set(re.findall(r"__device__ __forceinline__ \S+ (\w+)\(", text))
    assert not defined & set(shared), defined & set(shared)
    assert "mma.sync.aligned" not in text and "ldmatrix.sync.aligned" not in text
    # the planted faults' own wrappers (the TF32 MMA of kTf32Mma) live apart and copy none of the shared ones
    extra = (PLANTED / "kernels" / "planted_ptx.cuh").read_text()
    assert '#include "planted_ptx.cuh"' in text
    assert not set(re.findall(r"__device__ __forceinline__ \S+ (\w+)\(", extra)) & set(shared)
