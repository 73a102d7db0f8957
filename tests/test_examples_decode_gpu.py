"""The decode kernels in examples/kernels (a CUDA one without split-KV, a Triton split-KV one), as a user
would bring them: correct against the definition on GQA decode problems, dense and paged."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from faprof.correctness import layouts
from faprof.model.problem import AttentionProblem
from faprof.variants import user_kernel

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "kernels"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

PROBLEMS = [
    AttentionProblem(B=2, H=32, Sq=1, Sk=1000, D=128, dtype="bf16", Hkv=8, causal=True, mask_align="bottom_right"),
    AttentionProblem(B=3, H=16, Sq=4, Sk=333, D=64, dtype="fp16", Hkv=2, causal=True, mask_align="bottom_right"),
    AttentionProblem(B=3, H=32, Sq=1, Sk=700, D=128, dtype="bf16", Hkv=8, page_size=256, seqlens_k=(700, 1, 257),
                     causal=True, mask_align="bottom_right"),
    AttentionProblem(B=2, H=8, Sq=4, Sk=520, D=128, dtype="fp16", Hkv=1, page_size=256, causal=True,
                     mask_align="bottom_right"),
    AttentionProblem(B=2, H=8, Sq=3, Sk=90, D=64, dtype="fp16"),  # 2022's problem: MHA, no mask
]


def _triton():
    spec = importlib.util.spec_from_file_location("triton_decode_example", EXAMPLES / "triton_decode.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.triton_decode


def _cuda():
    lib = user_kernel.build_cu(EXAMPLES / "gqa_decode.cu", "gqa_decode")
    (launch, err), info = user_kernel.open_library(lib, EXAMPLES / "gqa_decode.cu", "gqa_decode")
    return user_kernel.cu_callable(launch, err, "gqa_decode", info.dtypes, info.problem_launcher)


@needs_cuda
@pytest.mark.parametrize("which", ["cuda", "triton"])
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.shape_id)
def test_decode_examples_match_the_definition(which, problem):
    if which == "cuda" and problem.D not in (64, 128):
        pytest.skip("the CUDA example handles D 64 and 128")
    fn = _cuda() if which == "cuda" else _triton()
    q, k, v, _, args = layouts.make_layout_inputs(problem, "cuda", torch.Generator().manual_seed(3))
    ref = layouts.reference_forward(problem, q, k, v, args, "cuda", torch.float32)
    out = torch.full_like(q, float("nan"))
    got = fn(q, k, v, problem.causal, problem.softmax_scale, out=out, attn=args if problem.features() else None)
    torch.cuda.synchronize()
    err = (got.float() - ref).abs().max().item()
    assert err < (2e-2 if problem.dtype == "bf16" else 4e-3), err
