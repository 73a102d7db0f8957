"""faprof gate's test-only kernels (tests/gate): they build without a GPU; on a GPU the slowed copy
computes the same output bit for bit and the gate finds exactly its rows slower.

Method: gate_attn.cu and gate_attn_slow.cu launch one kernel that differs only in a runtime
argument (every 16th K/V tile processed a second time into a discarded accumulator), so the
outputs must agree bitwise and both must agree with SDPA within fp16 rounding; then the small
scenario tests/gate/gate_small.toml is profiled twice in worker processes, once with each file
under the one variant name `gk`, and gated: `gk`'s rows slower, sdpa_flash's not.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from faprof.gate import SLOWER, run_gate
from faprof.store import find_bundles
from faprof.variants import build, user_kernel

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "tests" / "gate"
BASE_SPEC = f"gk={GATE / 'gate_attn.cu'}"
SLOW_SPEC = f"gk={GATE / 'gate_attn_slow.cu'}:gate_attn"

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)


@pytest.fixture
def fresh_registry(tmp_path, monkeypatch):
    """A fresh build cache (conftest's autouse fixture removes the variants these tests register)."""
    monkeypatch.setenv("FAPROF_CACHE", str(tmp_path / "cache"))


@needs_nvcc
def test_both_kernels_build_and_declare_the_same_support(fresh_registry, monkeypatch):
    monkeypatch.setenv("FAPROF_CUDA_ARCH", "sm_80")  # no GPU here: build for one arch, load through ctypes
    base = user_kernel.load_kernel(f"gk_base={GATE / 'gate_attn.cu'}")
    slow = user_kernel.load_kernel(f"gk_slow={GATE / 'gate_attn_slow.cu'}:gate_attn")
    assert base.dtypes == slow.dtypes == ("fp16", "bf16")
    assert base.compute == slow.compute == "cuda_core"


@pytest.mark.gpu
def test_the_slowed_copy_computes_the_same_output(fresh_registry):
    import torch

    base = user_kernel.load_kernel(f"gk_base={GATE / 'gate_attn.cu'}")
    slow = user_kernel.load_kernel(f"gk_slow={GATE / 'gate_attn_slow.cu'}:gate_attn")
    g = torch.Generator(device="cuda").manual_seed(0)
    for causal in (False, True):
        # 1,100 keys: 35 tiles of 32, so the slow copy's extra pass runs (tiles 15 and 31) and a tail is masked
        q, k, v = (torch.randn(2, 3, 1100, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
        a = base.fn(q, k, v, causal, 0.125)
        b = slow.fn(q, k, v, causal, 0.125)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                               scale=0.125)
        assert torch.equal(a, b)
        assert (a.float() - ref).abs().max().item() < 4e-3


@pytest.mark.gpu
def test_the_gate_finds_exactly_the_slowed_kernels_rows(tmp_path):
    scenario = str(GATE / "gate_small.toml")
    for name, spec in (("base", BASE_SPEC), ("cand", SLOW_SPEC)):
        r = subprocess.run([sys.executable, "-m", "faprof", "profile", "--scenario", scenario, "--kernel", spec,
                            "--out", str(tmp_path / name)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    base, cand = find_bundles(tmp_path / "base")[0], find_bundles(tmp_path / "cand")[0]
    res = run_gate(base, cand)
    slower = res.rows[res.rows["verdict"] == SLOWER]
    gk = base.measurements().query("variant == 'gk' and status == 'ok'")
    assert len(gk) == 6 and set(slower["variant"]) == {"gk"} and len(slower) == len(gk), \
        res.rows[["variant", "shape_id", "verdict", "ratio", "reason"]]
    assert slower["ratio"].between(1.02, 1.15).all()  # a few percent: 1/16 more of the per-key work
    assert not res.rows[res.rows["variant"] == "sdpa_flash"]["regression"].any()
