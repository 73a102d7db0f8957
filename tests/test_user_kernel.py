"""`faprof profile --kernel`: spec parsing, FAPROF_KERNEL_INFO, and every error path with real nvcc
builds (no GPU needed: a library is built for sm_80 and loaded through ctypes, which does not touch
the GPU); the example kernel compiles for sm_80/89/90; a Python function end to end on the CPU.
GPU tests run the examples against SDPA."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakes import TORCH_ATTN_KERNEL

from faprof import variants
from faprof.cli import main
from faprof.errors import FaprofError
from faprof.store import find_bundles
from faprof.variants import build, user_kernel

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "kernels"

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh build cache and sm_80 as the target (no GPU here); registry entries are removed
    afterwards by conftest's autouse fixture."""
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAPROF_CUDA_ARCH", "sm_80")
    return tmp_path / "cache"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("a.cu", ("a.cu", None, None)),
        ("dir/a.cu:launch", ("dir/a.cu", "launch", None)),
        ("mine=dir/a.cu:launch", ("dir/a.cu", "launch", "mine")),
        ("k.py:fn", ("k.py", "fn", None)),
        ("x.y=k.py:fn", ("k.py", "fn", "x.y")),
        ("/abs/with:colon/a.cu", ("/abs/with:colon/a.cu", None, None)),
    ],
)
def test_parse_spec(spec, expected):
    ks = user_kernel.parse_spec(spec)
    assert ks is not None
    assert (str(ks.path), ks.symbol, ks.name) == expected
    assert user_kernel.parse_spec(ks.text()) == ks


@pytest.mark.parametrize("spec", ["mod.py", "some.module", "file.txt", "a.cu.bak", "k.py:not-an-ident"])
def test_parse_spec_leaves_user_variant_specs_alone(spec):
    assert user_kernel.parse_spec(spec) is None


def test_make_spec_errors(tmp_path):
    with pytest.raises(FaprofError, match="does not exist"):
        user_kernel.make_spec(str(tmp_path / "nope.cu"))
    with pytest.raises(FaprofError, match="--user-variants"):
        user_kernel.make_spec(str(tmp_path / "plain.py"))
    f = _write(tmp_path, "a.cu", "")
    with pytest.raises(FaprofError, match="--name"):
        user_kernel.make_spec(str(f), "bad name")
    assert user_kernel.make_spec(str(f), "ok") == f"ok={f.resolve()}"


def test_parse_kernel_info():
    info = user_kernel.parse_kernel_info("dtypes=fp16,bf16; head_dims=64,128;compute=cuda_core", "f.cu")
    assert info == user_kernel.KernelInfo(("fp16", "bf16"), (64, 128), "cuda_core")
    assert user_kernel.parse_kernel_info("dtypes=fp32", "f.cu").head_dims is None
    for bad, match in [("", "declares no dtypes"), ("head_dims=64", "declares no dtypes"),
                       ("dtypes=fp8", "not faprof dtypes"), ("dtypes=fp16;head_dims=x", "integers"),
                       ("dtypes=fp16;compute=fast", "compute"), ("dtypes=fp16;tiles=4", "cannot read")]:
        with pytest.raises(FaprofError, match=match):
            user_kernel.parse_kernel_info(bad, "f.cu")


def test_header_installs_with_the_package():
    assert user_kernel.HEADER.is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"data/*.h"' in pyproject


# ------------------------------------------------------------------- real nvcc builds
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_example_cu_compiles(cache, arch):
    lib = user_kernel.build_cu(EXAMPLES / "simple_attn.cu", "simple_attn", arch)
    assert lib.is_file()
    (launch, _), info = user_kernel.open_library(lib, EXAMPLES / "simple_attn.cu", "simple_attn")
    assert info.dtypes == ("fp16", "bf16", "fp32") and info.compute == "cuda_core"
    assert launch.restype is not None


@needs_nvcc
def test_build_is_cached(cache):
    src = EXAMPLES / "simple_attn.cu"
    lib = user_kernel.build_cu(src, "simple_attn", "sm_80")
    mtime = lib.stat().st_mtime_ns
    assert user_kernel.build_cu(src, "simple_attn", "sm_80") == lib and lib.stat().st_mtime_ns == mtime
    assert list(lib.parent.glob("tmp-*")) == []  # the temporary build folder is gone


@needs_nvcc
def test_kernel_registers_with_declared_support(cache):
    from faprof.model.problem import AttentionProblem

    names = variants.load_user_variants(f"ex_simple={EXAMPLES / 'simple_attn.cu'}:simple_attn")
    assert names == ["ex_simple"]
    v = variants.get("ex_simple")
    assert v.kind == "user" and v.compute == "cuda_core" and v.dtypes == ("fp16", "bf16", "fp32")
    ok, _ = v.supports(AttentionProblem(1, 1, 8, 8, 64, "fp16"), cuda_available=True)
    assert ok
    ok, why = v.supports(AttentionProblem(1, 1, 8, 8, 48, "fp16"), cuda_available=True)
    assert not ok and "D=48" in why
    ok, why = v.supports(AttentionProblem(1, 1, 8, 8, 64, "fp64"), cuda_available=True)
    assert not ok and "fp64" in why
    # loading the same spec again is a no-op, not a name clash
    assert variants.load_user_variants(f"ex_simple={EXAMPLES / 'simple_attn.cu'}:simple_attn") == ["ex_simple"]


BAD_KERNELS = {
    "noexport.cu": ('FAPROF_KERNEL_INFO("dtypes=fp16");\nFAPROF_LAUNCHER(noexport) { return 0; }\n',
                    "noexport is not exported with C linkage"),
    "wrongsig.cu": ('FAPROF_KERNEL_INFO("dtypes=fp16");\nextern "C" int wrongsig(const void* q, int B) { return 0; }\n',
                    "does not have faprof's launcher signature"),
    "noinfo.cu": ('extern "C" FAPROF_LAUNCHER(noinfo) { return 0; }\n', "noinfo.cu declares no dtypes"),
    "emptyinfo.cu": ('FAPROF_KERNEL_INFO("head_dims=64");\nextern "C" FAPROF_LAUNCHER(emptyinfo) { return 0; }\n',
                     "emptyinfo.cu declares no dtypes"),
    "nolaunch.cu": ('FAPROF_KERNEL_INFO("dtypes=fp16");\nextern "C" FAPROF_LAUNCHER(other) { return 0; }\n',
                    "defines no function 'nolaunch'"),
}


@needs_nvcc
@pytest.mark.parametrize("fname", sorted(BAD_KERNELS))
def test_bad_kernel_is_one_clear_error(cache, tmp_path, fname):
    text, message = BAD_KERNELS[fname]
    src = _write(tmp_path, fname, text)
    out = tmp_path / "runs"
    r = CliRunner().invoke(main, ["profile", "--kernel", str(src), "--scenario", "smoke", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not out.exists()  # nothing ran, nothing was written


@needs_nvcc
def test_compile_error_shows_nvcc_file_line(cache, tmp_path):
    src = _write(tmp_path, "broken.cu", 'FAPROF_KERNEL_INFO("dtypes=fp16");\n'
                 "__global__ void k(float* x) { x[0] = undefined_thing; }\n"
                 'extern "C" FAPROF_LAUNCHER(broken) { return 0; }\n')
    out = tmp_path / "runs"
    r = CliRunner().invoke(main, ["profile", "--kernel", f"{src}:broken", "--scenario", "smoke", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert f"{src}(2): error" in r.output and "undefined_thing" in r.output
    assert "faprof_wrap" not in r.output  # faprof's wrapper stays out of the user's diagnostics
    assert not out.exists()
    assert not list((cache / "user").glob("*/*.so"))  # no library cached from a failed build


def test_missing_kernel_file(tmp_path):
    r = CliRunner().invoke(main, ["profile", "--kernel", str(tmp_path / "gone.cu"), "--scenario", "smoke"])
    assert r.exit_code == 2 and "gone.cu does not exist" in r.output


def test_name_needs_exactly_one_kernel(tmp_path):
    a = _write(tmp_path, "a.cu", "")
    r = CliRunner().invoke(main, ["profile", "--kernel", str(a), "--kernel", str(a), "--name", "x",
                                  "--scenario", "smoke"])
    assert r.exit_code == 2 and "--name names the one --kernel" in r.output


# --------------------------------------------------------------------- Python functions
PY_KERNEL = TORCH_ATTN_KERNEL + """attn.faprof_head_dims = (32,)

def two_args(q, k):
    return q
"""


def test_python_function_end_to_end_on_the_cpu(cache, tmp_path):
    src = _write(tmp_path, "my_attn.py", PY_KERNEL)
    out = tmp_path / "runs"
    r = CliRunner().invoke(main, ["profile", "--kernel", f"{src}:attn", "--name", "mine", "--scenario", "smoke",
                                  "--variants", "torch_standard", "--out", str(out), "--budget", "0.05"])
    assert r.exit_code == 0, r.output
    (bundle,) = find_bundles(out)
    rows = bundle.measurements()
    mine = rows[rows.variant == "mine"].set_index("shape_id")
    assert set(rows.variant) == {"torch_standard", "mine"}
    assert (mine.variant_kind == "user").all()
    # smoke: two fp32 D=32 forward problems run and are correct; fp16 (dtype) and bwd are unsupported
    assert sorted(mine.status) == ["ok", "ok", "unsupported", "unsupported"]
    assert bundle.manifest()["settings"]["user_variants"] == [f"mine={src.resolve()}:attn"]


@pytest.mark.parametrize(("symbol", "message"), [("two_args", "does not take faprof's variant arguments"),
                                                  ("absent", "has no function 'absent'")])
def test_python_function_errors(cache, tmp_path, symbol, message):
    src = _write(tmp_path, "my_attn.py", PY_KERNEL)
    r = CliRunner().invoke(main, ["profile", "--kernel", f"{src}:{symbol}", "--scenario", "smoke",
                                  "--out", str(tmp_path / "runs")])
    assert r.exit_code == 2 and message in r.output, r.output
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("causal", [False, True])
def test_example_cu_matches_sdpa(monkeypatch, tmp_path, dtype, causal):
    import torch
    import torch.nn.functional as F

    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))
    lib = user_kernel.build_cu(EXAMPLES / "simple_attn.cu", "simple_attn")
    (launch, err), info = user_kernel.open_library(lib, EXAMPLES / "simple_attn.cu", "simple_attn")
    fn = user_kernel.cu_callable(launch, err, "simple_attn", info.dtypes)
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    for sq, sk, d in [(37, 37, 64), (17, 113, 32), (128, 64, 128)]:
        q = torch.randn(2, 3, sq, d, device="cuda", dtype=tdt)
        k = torch.randn(2, 3, sk, d, device="cuda", dtype=tdt)
        v = torch.randn(2, 3, sk, d, device="cuda", dtype=tdt)
        o = fn(q, k, v, causal, d ** -0.5, out=torch.full_like(q, float("nan")))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal, scale=d ** -0.5)
        tol = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}[dtype]
        torch.testing.assert_close(o.double(), ref, atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_example_triton_matches_sdpa(cache, dtype, causal):
    pytest.importorskip("triton")
    import torch
    import torch.nn.functional as F

    v = user_kernel.load_kernel(f"ex_triton={EXAMPLES / 'triton_attn.py'}:triton_attn")
    assert v.dtypes == ("fp16", "bf16")
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    for sq, sk, d in [(37, 37, 64), (17, 113, 32), (200, 130, 128)]:
        q = torch.randn(2, 3, sq, d, device="cuda", dtype=tdt)
        k = torch.randn(2, 3, sk, d, device="cuda", dtype=tdt)
        vv = torch.randn(2, 3, sk, d, device="cuda", dtype=tdt)
        o = v.fn(q, k, vv, causal, d ** -0.5, out=torch.full_like(q, float("nan")))
        ref = F.scaled_dot_product_attention(q.double(), k.double(), vv.double(), is_causal=causal, scale=d ** -0.5)
        tol = {"fp16": 4e-3, "bf16": 2.4e-2}[dtype]
        torch.testing.assert_close(o.double(), ref, atol=tol, rtol=tol)


FAULT_CU = '''FAPROF_KERNEL_INFO("dtypes=fp16,fp32");
// TEST ONLY: writes to an unmapped address (the device's null page) -> illegal memory access.
__global__ void user_fault_kernel(float* bad) { bad[threadIdx.x] = 1.f; }
extern "C" FAPROF_LAUNCHER(user_fault) {
    user_fault_kernel<<<1, 32, 0, stream>>>(reinterpret_cast<float*>(0x100));
    return (int)cudaGetLastError();
}
'''


@pytest.mark.gpu
def test_a_faulting_user_kernel_is_one_failed_row(tmp_path, monkeypatch):
    """A user .cu kernel that corrupts the CUDA context is contained like faprof's own: one failed
    row, the worker replaced, the variants after it run."""
    from faprof import run as runner
    from faprof.model.scenarios import parse_scenario

    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))
    src = _write(tmp_path, "user_fault.cu", FAULT_CU)
    spec = f"user_fault={src}"
    variants.load_user_variants(spec)  # the scenario names it (as `faprof profile --kernel` adds it)
    scen = parse_scenario({
        "name": "user_fault", "baseline": "sdpa_flash", "variants": ["sdpa_flash", "user_fault", "fa2_mma"],
        "problems": [{"B": 1, "H": 2, "S": 128, "D": 64, "dtype": "fp16"}],
        "timing": {"budget_s": 0.2, "min_repeats": 5, "warmup_ms": 5, "e2e_repeats": 3},
    }, "test")
    bundle = runner.profile(scen, runner.ProfileOptions(out_dir=tmp_path / "runs", task_timeout_s=300, ceilings=False,
                                                        user_variants=[spec]))
    df = bundle.measurements().set_index("variant")
    assert df.loc["user_fault", "status"] == "failed"
    assert "illegal" in df.loc["user_fault", "reason"]
    assert df.loc["fa2_mma", "status"] == "ok" and df.loc["sdpa_flash", "status"] == "ok"


# ---------------------------------------------------------- today's problems (FAPROF_PROBLEM_LAUNCHER)
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_gqa_decode_example_compiles_as_a_problem_launcher(cache, arch):
    lib = user_kernel.build_cu(EXAMPLES / "gqa_decode.cu", "gqa_decode", arch)
    (launch, _), info = user_kernel.open_library(lib, EXAMPLES / "gqa_decode.cu", "gqa_decode")
    assert info.problem_launcher and info.features == {"gqa", "bottom_right", "window", "softcap", "paged"}
    assert launch.argtypes[5]._type_ is user_kernel.ProblemStruct


@needs_nvcc
def test_problem_struct_matches_the_header_field_for_field(tmp_path):
    """ctypes' faprof_attention_problem has the C struct's size and every field's offset (nvcc builds a
    host program that prints them; it runs without a GPU)."""
    fields = [name for name, _ in user_kernel.ProblemStruct._fields_]
    prints = "".join(f'printf("{f} %zu\\n", offsetof(faprof_attention_problem, {f}));' for f in fields)
    src = tmp_path / "offsets.cu"
    src.write_text('#include <cstdio>\n#include <cstddef>\n#include "faprof_attention.h"\n'
                   f'int main() {{ printf("size %zu\\n", sizeof(faprof_attention_problem)); {prints} return 0; }}\n')
    exe = tmp_path / "offsets"
    subprocess.run([shutil.which("nvcc") or "nvcc", f"-I{user_kernel.HEADER_DIR}", "-o", str(exe), str(src)],
                   check=True, capture_output=True)
    got = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                        check=True).stdout.splitlines())
    assert int(got["size"]) == ctypes.sizeof(user_kernel.ProblemStruct)
    for f in fields:
        assert int(got[f]) == getattr(user_kernel.ProblemStruct, f).offset, f


def test_a_kernel_declaring_features_needs_the_problem_launcher_and_known_names():
    with pytest.raises(FaprofError, match="not faprof problem features"):
        user_kernel.parse_kernel_info("dtypes=fp16;features=gqa,flash", "f.cu")
    info = user_kernel.parse_kernel_info("dtypes=fp16;features=gqa,paged", "f.cu")
    assert info.features == {"gqa", "paged"}


def test_problem_struct_from_a_paged_call():
    import torch

    from faprof.correctness import layouts
    from faprof.model.problem import AttentionProblem

    p = AttentionProblem(B=2, H=8, Sq=1, Sk=40, D=64, Hkv=2, page_size=16, seqlens_k=(40, 3), causal=True,
                         mask_align="bottom_right", window=(31, 0))
    q, k, _, _, args = layouts.make_layout_inputs(p, "cpu", torch.Generator().manual_seed(0))
    s = user_kernel.problem_struct(q, k, True, 0.125, "fp16", args)
    assert (s.B, s.H, s.Hkv, s.Sq, s.Sk, s.D) == (2, 8, 2, 1, 40, 64)
    assert (s.causal, s.bottom_right, s.window_left, s.window_right) == (1, 1, 31, 0)
    assert s.page_size == 16 and s.max_blocks == 3 and s.num_blocks == k.shape[0]
    assert s.block_table == args.block_table.data_ptr() and s.cu_seqlens_q is None
