"""fa2_mma and fa3_wgmma_e on the problems beyond 2022's (issue 36), without a GPU: which features each
declares and why it refuses the others, and the Python wrapper's call of the *_fwd_ex op (every
argument by its schema name, read back by a CPU stand-in that rebuilds the problem from them alone
and computes it from the definition). The kernels themselves: tests/test_gqa_kernels_gpu.py."""

from __future__ import annotations

import re

import pytest

import faprof.variants  # noqa: F401  (registers the variants)
from faprof.model.problem import AttentionProblem
from faprof.model.variant import get
from faprof.variants import build
from faprof.variants import kernels as kmod


def _schema_args(op: str) -> list[str]:
    text = (build.KERNELS_DIR / "binding.cpp").read_text()
    (sig,) = re.findall(rf'm\.def\("{op}\((.*?)\) -> \(\)"\);', text)
    return [a.split()[-1].split("=")[0] for a in sig.split(",")]


def test_declared_features():
    assert get("fa2_mma").features == {"gqa", "bottom_right", "window", "softcap", "varlen"}
    assert get("fa3_wgmma_e").features == {"gqa", "bottom_right", "window", "varlen"}
    for name in ("fa3_wgmma_a", "fa3_wgmma_d", "fa2_mma_det", "fa2_wmma"):
        assert not get(name).features, name


@pytest.mark.parametrize("name,problem,reason", [
    ("fa2_mma", AttentionProblem(2, 8, 100, 200, 64, Hkv=2, page_size=16), "paged KV cache"),
    ("fa2_mma", AttentionProblem(2, 8, 100, 100, 64, "bf16", True, direction="bwd", Hkv=2), "forward only"),
    ("fa3_wgmma_e", AttentionProblem(2, 8, 100, 200, 64, seqlens_q=(100, 3), seqlens_k=(200, 7), page_size=0,
                                     softcap=5.0), "soft-cap"),
    ("fa3_wgmma_e", AttentionProblem(2, 8, 100, 100, 64, softcap=30.0), "soft-cap"),
    ("fa3_wgmma_d", AttentionProblem(2, 8, 100, 100, 64, Hkv=2), "grouped-query"),
])
def test_refusals_say_why(name, problem, reason):
    ok, why = get(name).supports(problem, cuda_available=True)
    assert not ok and reason in why, why


@pytest.mark.parametrize("name", ["fa2_mma", "fa3_wgmma_e"])
def test_supported_problems(monkeypatch, name):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for p in (AttentionProblem(2, 32, 4096, 4096, 128, "bf16", True, Hkv=8),
              AttentionProblem(1, 8, 100, 300, 64, "fp16", True, Hkv=1, mask_align="bottom_right", window=(16, 0))):
        ok, why = get(name).supports(p, cuda_available=True)
        assert ok, why


def _problem_from_op_args(a: dict, dtype: str) -> AttentionProblem:
    """What the op's arguments alone say the problem is (the stand-in must not see the original)."""
    q, k = a["q"], a["k"]
    window = (a["window_left"], a["window_right"])
    common = dict(Hkv=a["kv_heads"], mask_align="bottom_right" if a["bottom_right"] else "top_left",
                  window=None if window == (-1, -1) else window, softcap=a["softcap"])
    if a["cu_seqlens_q"] is not None:
        cq, ck = a["cu_seqlens_q"].tolist(), a["cu_seqlens_k"].tolist()
        lq = tuple(cq[i + 1] - cq[i] for i in range(len(cq) - 1))
        lk = tuple(ck[i + 1] - ck[i] for i in range(len(ck) - 1))
        assert max(lq) == a["max_seqlen_q"] and max(lk) == a["max_seqlen_k"]
        return AttentionProblem(len(lq), q.shape[1], max(lq), max(lk), q.shape[2], dtype, a["causal"],
                                seqlens_q=lq, seqlens_k=lk, **common)
    assert k.shape[1] == a["kv_heads"]
    return AttentionProblem(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], dtype, a["causal"],
                            **common)


PROBLEMS = [
    AttentionProblem(2, 8, 37, 53, 64, "fp16", True, Hkv=2, mask_align="bottom_right", window=(5, 0)),
    AttentionProblem(1, 4, 20, 20, 64, "bf16", False, Hkv=1, window=(3, 2), softcap=7.0),
    AttentionProblem(3, 4, 30, 41, 64, "fp16", True, Hkv=2, mask_align="bottom_right",
                     seqlens_q=(1, 30, 9), seqlens_k=(41, 2, 9)),
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.shape_id)
@pytest.mark.parametrize("name,op", [("fa2_mma", "fa2_mma_fwd_ex"), ("fa3_wgmma_e", "fa3_wgmma_e_fwd_ex")])
def test_wrapper_passes_the_problem_to_the_ex_op(monkeypatch, name, op, problem):
    torch = pytest.importorskip("torch")
    from faprof.correctness.layouts import make_layout_inputs, reference_forward
    from faprof.variants.definition import AttnArgs

    if not get(name).supports(problem, cuda_available=True)[0] and "does not run" in \
            get(name).supports(problem, cuda_available=True)[1]:
        pytest.skip(f"{name} does not declare this problem's features")
    names = _schema_args(op)
    calls = []

    class FakeOps:
        def __getattr__(self, attr):
            assert attr == op, f"the wrapper called {attr}, not {op}"

            def run(*args):
                a = dict(zip(names, args, strict=True))
                p = _problem_from_op_args(a, problem.dtype)
                o, lse = reference_forward(p, a["q"], a["k"], a["v"], AttnArgs(p, a["cu_seqlens_q"], a["cu_seqlens_k"]),
                                           "cpu", torch.float64, with_lse=True)
                assert tuple(a["lse"].shape) == tuple(lse.shape), (a["lse"].shape, lse.shape)
                a["out"].copy_(o)
                a["lse"].copy_(lse)
                calls.append(p)

            return run

    monkeypatch.setattr(kmod, "_ops", lambda: FakeOps())
    q, k, v, _, args = make_layout_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    o, lse = get(name).fn(q, k, v, problem.causal, problem.softmax_scale, return_lse=True, attn=args)
    assert len(calls) == 1 and calls[0].mask == problem.mask and calls[0].kv_heads == problem.kv_heads
    ref, ref_lse = reference_forward(problem, q, k, v, args, "cpu", torch.float64, with_lse=True)
    assert torch.allclose(o.double(), ref, atol=1e-2), float((o.double() - ref).abs().max())
    assert tuple(lse.shape) == kmod.ex_lse_shape(problem)


def test_problems_without_features_keep_the_classic_op(monkeypatch):
    """2022's problems go to fa2_mma_fwd (the unchanged fast path) even when attn= is given."""
    torch = pytest.importorskip("torch")
    from faprof.correctness.layouts import make_layout_inputs

    called = []

    class FakeOps:
        def fa2_mma_fwd(self, q, k, v, out, lse, causal, scale):
            called.append("fa2_mma_fwd")

        def __getattr__(self, attr):
            raise AssertionError(f"the wrapper called {attr}")

    monkeypatch.setattr(kmod, "_ops", lambda: FakeOps())
    p = AttentionProblem(1, 4, 16, 16, 64, "fp16", True)
    q, k, v, _, args = make_layout_inputs(p, "cpu", torch.Generator().manual_seed(0))
    get("fa2_mma").fn(q, k, v, True, p.softmax_scale, attn=args)
    get("fa2_mma").fn(q, k, v, True, p.softmax_scale)
    assert called == ["fa2_mma_fwd", "fa2_mma_fwd"]
