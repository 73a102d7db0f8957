"""Five variants of one Triton attention kernel that differ only in constexprs and launch options.

    faprof profile --user-variants examples/kernels/triton_variants.py \
        --scenario examples/kernels/triton_variants.toml --ncu

This is how an autotune-style sweep looks to a profiler: every variant launches the same
`@triton.jit` function, so every kernel has the same name, and most have the same grid and block.
faprof shows each as its own row with its own median (two variants are folded into one row only
when every record proves them the same binary run alike, faprof.analysis.aliases), and `faprof
explain RUN --variant V --against W` compares any two of them.

| variant | what differs from `tv_good` |
| --- | --- |
| `tv_good` | (BLOCK_M 128, BLOCK_N 64, 3 stages, query tiles on grid axis 0) |
| `tv_f32dot` | QK^T as an fp32 (TF32) dot of upcast q and k: the precision switch |
| `tv_nopipe` | num_stages 1: no software pipelining of the K/V loads |
| `tv_headmajor` | the grid's axes swapped: (b*h, query tiles), another block order |
| `tv_smalltile` | BLOCK_M 64, BLOCK_N 32 |

One program per (query tile, b*h); an online softmax in fp32 with exp2 (log2(e) folded into the
scale); causal (top-left, as SDPA's is_causal) or not; any Sq and Sk (tails masked); fp16 and bf16
in, fp32 accumulate; D of 64 or 128.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from faprof.variants import Variant, register


@triton.jit
def _attn_fwd(Q, K, V, O, qk_scale, Sq, Sk, CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    if HEAD_MAJOR:
        pid_m = tl.program_id(1)
        bh = tl.program_id(0).to(tl.int64)
    else:
        pid_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols0 = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * Sq * D + rows[:, None] * D + d[None, :], mask=rows[:, None] < Sq, other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    k_base = K + bh * Sk * D
    v_base = V + bh * Sk * D
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if CAUSAL:
        hi = tl.minimum(Sk, (pid_m + 1) * BLOCK_M)
    else:
        hi = Sk
    for start in range(0, hi, BLOCK_N):
        cols = start + cols0
        kt = tl.load(k_base + cols[None, :] * D + d[:, None], mask=cols[None, :] < Sk, other=0.0)  # [D, BLOCK_N]
        if DOT_FP32:
            s = tl.dot(q, kt.to(tl.float32), input_precision="tf32") * qk_scale
        else:
            s = tl.dot(q, kt) * qk_scale
        valid = cols[None, :] < Sk
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * D + d[None, :], mask=cols[:, None] < Sk, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + bh * Sq * D + rows[:, None] * D + d[None, :], acc.to(O.dtype.element_ty), mask=rows[:, None] < Sq)


#: name -> (BLOCK_M, BLOCK_N, num_stages, DOT_FP32, HEAD_MAJOR, what it changes)
CONFIGS = {
    "tv_good": (128, 64, 3, False, False, "the reference configuration"),
    "tv_f32dot": (128, 64, 3, True, False, "QK^T as an fp32 (TF32) dot: the precision switch"),
    "tv_nopipe": (128, 64, 1, False, False, "num_stages=1: no software pipelining"),
    "tv_headmajor": (128, 64, 3, False, True, "grid axes swapped: (b*h, query tiles)"),
    "tv_smalltile": (64, 32, 3, False, False, "BLOCK_M=64, BLOCK_N=32"),
}


def _make(name: str):
    bm, bn, stages, f32, head_major, _ = CONFIGS[name]

    def call(q, k, v, causal, scale, out=None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, Sq, D = q.shape
        Sk = k.shape[2]
        if out is None:
            out = torch.empty_like(q)
        tiles = triton.cdiv(Sq, bm)
        grid = (B * H, tiles) if head_major else (tiles, B * H)
        _attn_fwd[grid](q, k, v, out, scale * 1.4426950408889634, Sq, Sk, CAUSAL=bool(causal), D=D, BLOCK_M=bm,
                        BLOCK_N=bn, DOT_FP32=f32, HEAD_MAJOR=head_major, num_warps=4 if bm <= 64 else 8,
                        num_stages=stages)
        return out

    return call


def _supports(problem) -> str | None:
    return None if problem.D in (64, 128) else f"head dim {problem.D}: this example takes 64 or 128"


for _name, _cfg in CONFIGS.items():
    register(Variant(_name, "user", f"Triton constexpr variant: {_cfg[5]}", _make(_name), dtypes=("fp16", "bf16"),
                     directions=("fwd",), device="cuda", compute="tensor", check=_supports,
                     source="examples/kernels/triton_variants.py", tags=("example", "triton")), replace=True)
