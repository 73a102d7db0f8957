"""A Triton attention forward kernel for `faprof profile --kernel`:

    faprof profile --kernel examples/kernels/triton_attn.py:triton_attn --scenario smoke

One program per (query tile of 64 rows, b*h); the K/V loop runs over tiles of 64 keys with an
online softmax in fp32 (exp2 with log2(e) folded into the scale), causal (top-left, as SDPA's
is_causal) or not, any Sq and Sk (tails masked). fp16 and bf16 in, fp32 accumulate; D a power of
two from 16 to 128 (tl.arange needs a power of two). faprof reads what it supports from the
function's attributes below and marks other problems `unsupported`.
"""

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64


@triton.jit
def _attn_fwd(Q, K, V, O, qk_scale, Sq, Sk, CAUSAL: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols0 = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * Sq * D + rows[:, None] * D + d[None, :], mask=rows[:, None] < Sq, other=0.0)
    k_base = K + bh * Sk * D
    v_base = V + bh * Sk * D
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if CAUSAL:
        hi = tl.minimum(Sk, (pid_m + 1) * BLOCK_M)  # keys past the tile's last row are masked for all rows
    else:
        hi = Sk
    for start in range(0, hi, BLOCK_N):
        cols = start + cols0
        kt = tl.load(k_base + cols[None, :] * D + d[:, None], mask=cols[None, :] < Sk, other=0.0)  # [D, BLOCK_N]
        s = tl.dot(q, kt) * qk_scale  # fp32, in log2 units
        valid = cols[None, :] < Sk
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet: no NaN
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * D + d[None, :], mask=cols[:, None] < Sk, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + bh * Sq * D + rows[:, None] * D + d[None, :], acc.to(O.dtype.element_ty), mask=rows[:, None] < Sq)


def triton_attn(q, k, v, causal, scale, out=None):
    """faprof's variant signature: q [B, H, Sq, D], k and v [B, H, Sk, D] -> out [B, H, Sq, D]."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if out is None:
        out = torch.empty_like(q)
    grid = (triton.cdiv(Sq, BLOCK_M), B * H)
    _attn_fwd[grid](q, k, v, out, scale * 1.4426950408889634, Sq, Sk, CAUSAL=bool(causal), D=D,
                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
    return out


triton_attn.faprof_dtypes = ("fp16", "bf16")
triton_attn.faprof_head_dims = (16, 32, 64, 128)
