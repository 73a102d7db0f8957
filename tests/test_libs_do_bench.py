"""scripts/gpu/libs_do_bench.py on the CPU: it imports and answers --help and --list without a GPU, reads its
shapes from the scenario files (the leaderboard's decode and prefill problems), and counts the work it
divides by as faprof's problem model does (so its % of the ceiling compares with the leaderboard's)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from faprof.model.problem import AttentionProblem

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("libs_do_bench", ROOT / "scripts" / "gpu" / "libs_do_bench.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_help_and_list_without_a_gpu(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code == 0 and "do_bench" in capsys.readouterr().out
    assert bench.main(["--list", "--kind", "decode"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 14 and all(line.startswith("llama3_70b_decode") for line in out)
    if not torch.cuda.is_available():
        assert bench.main(["--quick"]) == 2


def test_shapes_are_the_scenarios(bench):
    shapes = bench.scenario_shapes()
    by = {n: [s for s in shapes if s.scenario == n] for n in ("llama3_70b_decode", "h100_headline", "llama3_8b_prefill")}
    assert [len(v) for v in by.values()] == [14, 8, 3] and len(shapes) == 25
    dec = by["llama3_70b_decode"]
    assert {(s.H, s.Hkv, s.D, s.dtype) for s in dec} == {(64, 8, 128, "bf16")} and {s.Sq for s in dec} == {1, 4}
    assert sorted({s.page_size for s in dec}, key=str) == [256, None] and sum(s.page_size == 256 for s in dec) == 4
    assert all(s.kind == "decode" for s in dec) and all(s.kind == "prefill" for s in by["h100_headline"])
    assert {(s.B, s.Sq) for s in by["llama3_8b_prefill"]} == {(8, 1024), (2, 4096), (1, 8192)}
    assert {(s.dtype, s.D, s.causal) for s in by["h100_headline"]} == {
        (dt, d, c) for dt in ("fp16", "bf16") for d in (64, 128) for c in (False, True)}
    assert bench.main(["--list", "--quick"]) == 0


@pytest.mark.parametrize("B,H,Hkv,Sq,Sk,causal", [(4, 16, 16, 4096, 4096, True), (4, 16, 16, 256, 256, False),
                                                  (16, 64, 8, 4, 8192, True), (1, 64, 8, 1, 32768, True)])
def test_work_counted_as_faprof_counts_it(bench, B, H, Hkv, Sq, Sk, causal):
    s = bench.BenchShape("x", "prefill", B, H, Hkv, Sq, Sk, 128, "bf16", causal)
    p = AttentionProblem(B=B, H=H, Hkv=Hkv, Sq=Sq, Sk=Sk, D=128, dtype="bf16", causal=causal, mask_align="bottom_right")
    assert s.flops() == pytest.approx(p.flops())
    # faprof's minimum bytes add q, o (16-bit) and the log-sum-exp (fp32) to the K/V read once per KV head
    rest = 2 * B * H * Sq * 128 * 2 + 4 * B * H * Sq
    assert s.kv_bytes() + rest == p.min_bytes()
