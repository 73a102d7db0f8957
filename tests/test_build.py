"""The kernel build without a GPU: nvcc compiles every kernel for sm_80, sm_89 and sm_90 and
ptxas' report parses; the parser on a recorded ptxas log (tests/data/ptxas_sample.txt, real nvcc
13.0 output); the occupancy calculator against cases worked by hand from the rules in CUDA's
cuda_occupancy.h; the launch annotations and the registry entries of the CUDA-core variants.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from faprof.errors import FaprofError
from faprof.variants import build, occupancy
from faprof.variants import ptxas as build_report

DATA = Path(__file__).parent / "data"
REPORT_ARCHS = ("sm_80", "sm_89", "sm_90")

#: Kernels faprof's CUDA-core variants launch, by file, with the D instantiations of each.
EXPECTED_KERNELS = {
    "naive.cu": {"naive_scores_kernel": [None], "naive_softmax_kernel": [None], "naive_pv_kernel": [None]},
    "fa1.cu": {"fa1_fwd_kernel": [32, 64, 128]},
    "fa2.cu": {"fa2_fwd_kernel": [32, 64, 128]},
}

#: The test-only kernels (tests/kernels/, their own extension), compiled like faprof's.
TESTONLY = Path(__file__).parent / "kernels"
TESTONLY_KERNELS = {
    "fault.cu": {"fault_oob_kernel": [None]},
    "race.cu": {"race_lse_kernel": [None], "race_accum_kernel": [None]},
}

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)


# ------------------------------------------------------------------ real nvcc compile
@pytest.fixture(scope="module")
def report():
    sources = [build.KERNELS_DIR / f for f in EXPECTED_KERNELS]
    return build_report.resource_report(archs=REPORT_ARCHS, sources=sources)


@pytest.fixture(scope="module")
def testonly_report():
    sources = [TESTONLY / f for f in TESTONLY_KERNELS]
    return build_report.resource_report(archs=REPORT_ARCHS, sources=sources, include_dirs=[build.KERNELS_DIR])


@needs_nvcc
@pytest.mark.parametrize("which", ["faprof", "testonly"])
def test_every_kernel_compiles_for_every_arch(which, request):
    report = request.getfixturevalue("report" if which == "faprof" else "testonly_report")
    expected = EXPECTED_KERNELS if which == "faprof" else TESTONLY_KERNELS
    archs = {build.normalize_arch(a) for a in REPORT_ARCHS}
    assert archs == {"sm_80", "sm_89", "sm_90a"}
    for file, kernels in expected.items():
        for name, dims in kernels.items():
            for D in dims:
                for arch in archs:
                    rows = report[(report.file == file) & (report.name == name) & (report.arch == arch)]
                    rows = rows[rows.D.isna()] if D is None else rows[rows.D == D]
                    assert len(rows) == 1, f"{file}:{name} D={D} {arch}: {len(rows)} rows"


@pytest.fixture(scope="module")
def every_file_report():
    """Every kernels/*.cu file (what `faprof build` compiles): the report above covers the CUDA-core ones;
    the other build tests read their own kernels from the same ptxas cache."""
    return build_report.resource_report(archs=REPORT_ARCHS)


@needs_nvcc
def test_every_kernel_file_compiles_for_every_arch(every_file_report):
    """No kernel file is left out on an arch: each of kernels/*.cu gives ptxas entries on sm_80, sm_89
    and sm_90a (fa2_mma.cu and fa2_wmma.cu have no build test of their own)."""
    report = every_file_report
    files = {p.name for p in build.KERNELS_DIR.glob("*.cu")}
    assert {"fa2_mma.cu", "fa2_wmma.cu"} <= files
    assert report.attrs["pairs"] == len(files) * len(REPORT_ARCHS)
    for arch in ("sm_80", "sm_89", "sm_90a"):
        assert set(report[report.arch == arch].file) == files, arch
    assert (report.registers > 0).all() and (report.registers <= 255).all()


@needs_nvcc
def test_report_values_are_sane(report):
    assert (report.registers > 0).all()
    assert (report.registers <= 255).all()
    assert report.kernel.str.contains(r"\(").all(), "kernel names should be demangled signatures"
    # Every kernel here carries a faprof:launch annotation, so occupancy is known for each row.
    assert report.threads.notna().all() and report.blocks_per_sm.notna().all()
    assert (report.blocks_per_sm >= 1).all(), report[report.blocks_per_sm < 1]
    assert set(report.limiter) <= set(occupancy.LIMITER_ORDER)
    # The naive matmul kernels use two static 32x33 fp32 tiles, everything else dynamic smem only.
    mm = report[report.name.isin(["naive_scores_kernel", "naive_pv_kernel"])]
    assert (mm.smem_static_bytes == 2 * 32 * 33 * 4).all()
    assert (report[report.file.isin(["fa1.cu", "fa2.cu"])].smem_static_bytes == 0).all()
    # fa2 keeps O in registers: at D = 64 it must not spill (a spill there is a performance bug).
    fa2_64 = report[(report.name == "fa2_fwd_kernel") & (report.D == 64)]
    assert (fa2_64.spill_store_bytes == 0).all() and (fa2_64.spill_load_bytes == 0).all()
    # Dynamic shared memory comes from the annotations: fa2 at D = 128 needs 89 KiB (> 48 KiB opt-in).
    assert set(report[(report.name == "fa2_fwd_kernel") & (report.D == 128)].dyn_smem_bytes) == {91136}


@needs_nvcc
def test_nvcc_error_is_a_faprof_error(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k() { this is not cuda; }\n")
    with pytest.raises(FaprofError, match="nvcc failed on bad.cu for sm_80"):
        build_report.resource_report(archs=("sm_80",), sources=[bad])


def test_nvcc_command_line():
    cmd = build_report.nvcc_resource_command("/cuda/bin/nvcc", Path("/k/fa2.cu"), "sm_90", Path("/t/o.cubin"))
    assert cmd == [
        "/cuda/bin/nvcc",
        "-cubin",
        "-O3",
        "-lineinfo",
        "-std=c++17",
        "-D__CUDA_NO_HALF_OPERATORS__",
        "-D__CUDA_NO_HALF_CONVERSIONS__",
        "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-D__CUDA_NO_HALF2_OPERATORS__",
        "--expt-relaxed-constexpr",
        "-Xptxas",
        "-v",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-I",
        "/k",
        "-o",
        "/t/o.cubin",
        "/k/fa2.cu",
    ]


@pytest.mark.parametrize(
    "given,expected",
    [
        ("sm_89", "sm_89"),
        ("89", "sm_89"),
        ("8.9", "sm_89"),
        ("compute_80", "sm_80"),
        ("sm_90", "sm_90a"),
        ("9.0", "sm_90a"),
        ("sm_90a", "sm_90a"),
        ("sm_100a", "sm_100a"),
        ("SM_86", "sm_86"),
    ],
)
def test_normalize_arch(given, expected):
    assert build.normalize_arch(given) == expected


@pytest.mark.parametrize("bad", ["sm_70", "ampere", ""])
def test_normalize_arch_rejects(bad):
    with pytest.raises(FaprofError):
        build.normalize_arch(bad)


def test_gencode_flags():
    assert build.gencode_flag("sm_90") == "-gencode=arch=compute_90a,code=sm_90a"
    assert build.gencode_flag("sm_89") == "-gencode=arch=compute_89,code=sm_89"
    assert build.extension_nvcc_flags("sm_80") == [
        "-O3",
        "-lineinfo",
        "-std=c++17",
        "-gencode=arch=compute_80,code=sm_80",
    ]


def test_build_hash_tracks_sources_flags_and_arch(tmp_path):
    (tmp_path / "binding.cpp").write_text("// binding\n")
    (tmp_path / "a.cu").write_text("__global__ void a() {}\n")
    h = build.build_hash("sm_90a", ["-O3"], "2.11.0", "13.0", tmp_path)
    assert h == build.build_hash("sm_90a", ["-O3"], "2.11.0", "13.0", tmp_path)
    assert h != build.build_hash("sm_89", ["-O3"], "2.11.0", "13.0", tmp_path)
    assert h != build.build_hash("sm_90a", ["-O2"], "2.11.0", "13.0", tmp_path)
    assert h != build.build_hash("sm_90a", ["-O3"], "2.12.0", "13.0", tmp_path)
    (tmp_path / "a.cu").write_text("__global__ void a() { }\n")
    assert h != build.build_hash("sm_90a", ["-O3"], "2.11.0", "13.0", tmp_path)


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path))
    assert build.cache_root() == tmp_path
    monkeypatch.delenv("FAPROF_CACHE")
    assert build.cache_root() == Path.home() / ".cache" / "faprof"


def test_target_arch_from_env(monkeypatch):
    monkeypatch.setenv("FAPROF_CUDA_ARCH", "sm_89")
    assert build.target_arch() == "sm_89"


# -------------------------------------------------------------- ptxas log parsing
def test_ptxas_parse_recorded_log():
    rows = build_report.ptxas_parse((DATA / "ptxas_sample.txt").read_text())
    by_name = {r["kernel"]: r for r in rows}
    assert len(rows) == 6
    pv = by_name["_Z15naive_pv_kernelPKfS0_Pfiiiib"]
    assert pv == {
        "kernel": "_Z15naive_pv_kernelPKfS0_Pfiiiib",
        "arch": "sm_80",
        "registers": 48,
        "smem_static_bytes": 8448,
        "stack_frame_bytes": 0,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "cmem_bytes": 393,
        "barriers": 1,
    }
    softmax = by_name["_Z20naive_softmax_kernelPfxi"]
    assert (softmax["registers"], softmax["barriers"], softmax["smem_static_bytes"]) == (21, 0, 0)
    # CUDA 13 prints no cmem line for sm_90a; a spilling kernel reports its stack frame.
    fa1_32 = by_name["_Z14fa1_fwd_kernelILi32EEvPKfS1_S1_PfS2_S2_iifb"]
    assert fa1_32["arch"] == "sm_90a" and fa1_32["cmem_bytes"] is None
    assert (
        fa1_32["registers"],
        fa1_32["stack_frame_bytes"],
        fa1_32["spill_store_bytes"],
        fa1_32["spill_load_bytes"],
    ) == (80, 8, 4, 4)
    assert by_name["_Z14fa1_fwd_kernelILi128EEvPKfS1_S1_PfS2_S2_iifb"]["registers"] == 125


def test_ptxas_parse_ignores_device_functions_and_warnings():
    text = (
        'kernels/x.cu(3): warning #177-D: variable "y" was declared but never referenced\n'
        "ptxas info    : Function properties for _Z6helperv\n"
        "    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Compiling entry function '_Z1kv' for 'sm_89'\n"
        "ptxas info    : Function properties for _Z1kv\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem, 360 bytes cmem[0], 8 bytes cmem[2]\n"
    )
    (row,) = build_report.ptxas_parse(text)
    assert row["kernel"] == "_Z1kv" and row["registers"] == 10 and row["smem_static_bytes"] == 1024
    assert row["cmem_bytes"] == 368 and row["stack_frame_bytes"] == 0


# ------------------------------------------------------------------ occupancy by hand
@pytest.mark.parametrize(
    "arch,threads,regs,smem,blocks,warps,pct,limiter",
    [
        # 64 regs: 2048 per warp; a 16384-register partition holds 8 warps, 4 partitions 32 warps
        # = 8 blocks of 4 warps (warps alone would allow 16, smem 164 KB / 1 KB reserve = 164).
        ("sm_80", 128, 64, 0, 8, 32, 50.0, "registers"),
        # 41 regs: 1312 per warp rounds up to 1536; 16384 // 1536 = 10 warps per partition,
        # 40 per SM = 10 blocks (without the 256-register granularity it would be 12).
        ("sm_90", 128, 41, 0, 10, 40, 62.5, "registers"),
        # 90 KB dynamic + 1 KB reserve = 93184 B per block; 228 KB // 93184 = 2 blocks.
        ("sm_90", 128, 32, 92160, 2, 8, 12.5, "shared memory"),
        # 48 KB + 1 KB = 50176 B; 164 KB // 50176 = 3 blocks of 8 warps.
        ("sm_80", 256, 32, 49152, 3, 24, 37.5, "shared memory"),
        # 8 warps per block, 48 warps per SM on Ada: 6 blocks, full occupancy.
        ("sm_89", 256, 32, 0, 6, 48, 100.0, "warps"),
        # A tie: 40 registers (1280 per warp, 12 warps per partition) and Ada's 48-warp cap both
        # allow 6 blocks of 8 warps; the hardware cap is named.
        ("sm_89", 256, 40, 0, 6, 48, 100.0, "warps"),
        # 1-warp blocks of 16 registers: 32 blocks per SM cap at 32 warps of 64.
        ("sm_90", 32, 16, 0, 32, 32, 50.0, "blocks"),
        # 99 KB per block is Ada's opt-in maximum: 110000 B cannot launch.
        ("sm_89", 128, 32, 110000, 0, 0, 0.0, "shared memory"),
        # 255 registers: 8192 per warp (8160 rounded), 2 warps per partition, 8 per SM = 2 blocks.
        ("sm_90a", 128, 255, 0, 2, 8, 12.5, "registers"),
    ],
)
def test_occupancy_hand_computed(arch, threads, regs, smem, blocks, warps, pct, limiter):
    occ = build_report.occupancy(arch, threads, regs, smem)
    assert (occ.blocks_per_sm, occ.active_warps, occ.limiter) == (blocks, warps, limiter)
    assert occ.occupancy_pct == pytest.approx(pct)


def test_occupancy_rejects_oversized_block_and_unknown_arch():
    assert build_report.occupancy("sm_80", 2048, 32, 0).limiter == "threads"
    with pytest.raises(FaprofError, match="no occupancy limits known"):
        build_report.occupancy("sm_75", 128, 32, 0)


# --------------------------------------------------------------- launch annotations
def test_launch_annotations_of_the_kernel_files():
    ann = build_report.parse_launch_annotations((build.KERNELS_DIR / "fa2.cu").read_text())
    fa2 = ann["fa2_fwd_kernel"]
    assert build_report.eval_launch_expr(fa2["threads"], 64) == 128
    # Q 32xD + K 64x(D+4) + V 64xD + P 4x8x64 floats.
    assert build_report.eval_launch_expr(fa2["dyn_smem"], 64) == 4 * (32 * 64 + 64 * 68 + 64 * 64 + 4 * 8 * 64)
    naive = build_report.parse_launch_annotations((build.KERNELS_DIR / "naive.cu").read_text())
    assert set(naive) == {"naive_scores_kernel", "naive_softmax_kernel", "naive_pv_kernel"}


def test_launch_expr_evaluation():
    assert build_report.eval_launch_expr("4*(D+4)//2", 60) == 128
    assert build_report.eval_launch_expr("A0*32+A2", None, (4, 9, 7)) == 135
    with pytest.raises(ValueError, match="uses D"):
        build_report.eval_launch_expr("D*2", None)
    with pytest.raises(ValueError, match="unsupported"):
        build_report.eval_launch_expr("__import__('os')", 1)


@pytest.mark.parametrize(
    "text,name,targs,ints,D",
    [
        ("void fa2_fwd_kernel<64>(float const*, float*, int, bool)", "fa2_fwd_kernel", "64", (64,), 64),
        ("_Z14fa2_fwd_kernelILi128EEvPKfS1_S1_PfS2_iiifb", "fa2_fwd_kernel", "128", (128,), 128),
        (
            "void naive_pv_kernel(float const*, float const*, float*, int, int, int, int, bool)",
            "naive_pv_kernel",
            "",
            (),
            None,
        ),
        (
            "void ns::k<__nv_bfloat16, ns::Cfg<64, 128, true>, false>(__nv_bfloat16 const*)",
            "ns::k",
            "__nv_bfloat16, ns::Cfg<64, 128, true>, false",
            (64, 128, 1, 0),
            None,
        ),
    ],
)
def test_parse_kernel_name(text, name, targs, ints, D):
    kn = build_report.parse_kernel_name(text)
    assert (kn.name, kn.template_args, kn.int_args, kn.D) == (name, targs, ints, D)


# ------------------------------------------------------------------- registry entries
def test_cuda_core_variants_are_registered():
    from faprof import variants
    from faprof.model.problem import AttentionProblem

    names = [v.name for v in variants.all_variants()]
    assert {"naive", "fa1", "fa2"} <= set(names)
    hidden = {v.name for v in variants.all_variants(include_hidden=True)}
    assert not {"_fault_oob", "_race_atomic", "_race_plain"} & hidden  # test-only: not in faprof's registry
    for name in ("naive", "fa1", "fa2"):
        v = variants.get(name)
        assert (v.kind, v.dtypes, v.compute, v.needs_extension) == ("cuda", ("fp32",), "cuda_core", True)
        assert (build.KERNELS_DIR.parent / v.source).exists()
        ok, why = v.supports(AttentionProblem(1, 1, 128, 128, 64, "fp16"), cuda_available=True)
        assert not ok and "fp32" in why
    p48 = AttentionProblem(1, 1, 128, 128, 48, "fp32")
    for name in ("fa1", "fa2"):
        assert variants.get(name).supports(p48, cuda_available=True) == (
            False,
            f"D=48 not supported by {name} (supported: 32, 64, 128)",
        )
    assert variants.get("naive").supports(p48, cuda_available=True) == (True, "")
    huge = AttentionProblem(16, 32, 8192, 8192, 64, "fp32")  # 128 GiB of fp32 scores
    ok, why = variants.get("naive").supports(huge, cuda_available=True)
    assert not ok and "128.0 GiB" in why


def test_extension_links_the_loaded_libstdcxx():
    """The extension must share torch's C++ runtime (a static copy crashes on the first error
    message that formats a number): the link names the libstdc++.so this process loaded."""
    pytest.importorskip("torch")
    import sys

    flags = build.shared_libstdcxx_ldflags()
    if not sys.platform.startswith("linux"):
        assert flags == []
    else:
        assert len(flags) == 1 and "libstdc++.so" in flags[0] and Path(flags[0]).exists()


def test_test_only_kernels_stay_out_of_the_faprof_extension():
    """fault/race/wgmma_test live in tests/kernels/ with their own binding; faprof's kernels/ and
    binding.cpp hold none of them, and loading the tests' variants file registers them hidden."""
    from faprof import variants

    names = {p.name for p in build.kernel_sources()}
    assert not names & {"fault.cu", "race.cu", "wgmma_test.cu"}
    assert all(p.parent == build.KERNELS_DIR for p in build.kernel_sources())
    faprof_code = "".join(p.read_text() for p in build.KERNELS_DIR.iterdir() if p.suffix in (".cpp", ".h", ".cu"))
    for op in ("fault_oob", "race_fwd", "wgmma_gemm_test"):
        assert op not in faprof_code, op
    added = variants.load_user_variants(str(TESTONLY / "testonly_variants.py"))
    assert set(added) == {"_fault_oob", "_race_atomic", "_race_plain"}
    assert all(variants.get(n).hidden for n in added)
    assert not set(added) & {v.name for v in variants.all_variants()}  # hidden from `faprof list`
    for n in added:
        assert (TESTONLY.parent.parent / variants.get(n).source).exists()


@pytest.mark.parametrize("own", [True, False])
def test_a_failed_build_names_a_command_that_exists(monkeypatch, tmp_path, own):
    """The message of a failed build points at a `faprof build` invocation the CLI accepts."""
    import shlex

    from click.testing import CliRunner
    from torch.utils import cpp_extension

    from faprof import cli
    from faprof.errors import FaprofError
    from faprof.variants import build as b

    def fail(**kw):
        raise RuntimeError("Error building extension: nvcc exited with 2")

    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setenv("MAX_JOBS", "1")
    spec = b.faprof_extension() if own else b.ExtensionSpec("user_ext", (), (tmp_path,), (tmp_path,), what="user kernel x")
    with pytest.raises(FaprofError) as e:
        b._compile(spec, tmp_path / "build", "sm_90", [], [], "nvcc", False, None)
    command = str(e.value).split("`")[1]
    assert command.startswith("faprof build")
    args = shlex.split(command)[2:]
    res = CliRunner().invoke(cli.main, ["build", *[a.replace("sm_XX", "sm_90") for a in args], "--help"])
    assert res.exit_code == 0, res.output  # every option it names exists
