"""The planted wrong GPU kernels (tests/wrong/kernels) without a GPU: nvcc builds them for sm_80 and
sm_90 as user kernels (the path `faprof profile --kernel` takes), and each differs from the correct
kernel it copies (examples/kernels/simple_attn.cu) only in the lines marked PLANTED BUG."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from faprof.variants import build, user_kernel

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "tests" / "wrong" / "kernels"
SIMPLE = ROOT / "examples" / "kernels" / "simple_attn.cu"
NAMES = ("wrong_batch_offset", "wrong_causal_shift")

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))  # a real compile, not a cached library
    return tmp_path / "cache"


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", NAMES)
def test_planted_kernel_compiles(cache, name, arch):
    lib = user_kernel.build_cu(KERNELS / f"{name}.cu", name, arch)
    assert lib.is_file() and cache in lib.parents
    (_, _), info = user_kernel.open_library(lib, KERNELS / f"{name}.cu", name)
    assert info.dtypes == ("fp16", "bf16", "fp32")


def _code(path: Path, name: str) -> list[str]:
    """Code lines without comments, with the kernel's names mapped back to simple_attn's."""
    lines = []
    for ln in path.read_text().splitlines():
        code = ln.split("//")[0].rstrip()
        if code.strip():
            lines.append(re.sub(r"\s+", " ", code.replace(name, "simple_attn")).strip())
    return lines


@pytest.mark.parametrize("name", NAMES)
def test_each_kernel_is_the_correct_one_with_one_marked_bug(name):
    import difflib

    src = (KERNELS / f"{name}.cu").read_text()
    marked = {re.sub(r"\s+", " ", ln.split("//")[0]).strip() for ln in src.splitlines()
              if "PLANTED BUG" in ln and ln.split("//")[0].strip()}
    diff = [d for d in difflib.ndiff(_code(SIMPLE, "simple_attn"), _code(KERNELS / f"{name}.cu", name))
            if d.startswith("+ ")]
    # the batch-offset kernel also passes H down to the kernel (the launch and the parameter list)
    allowed_extra = {"wrong_batch_offset": 2}.get(name, 0)
    unmarked = [d[2:] for d in diff if d[2:] not in marked]
    assert marked and len(unmarked) <= allowed_extra, unmarked
