"""TEST ONLY: a planted wrong Triton kernel (tests/test_wrong_where_gpu.py): the row offset of Triton's
fused-attention tutorial's TMA path, `offset_y = off_z + off_h * N_CTX`, in a copy of
examples/kernels/triton_attn.py (a small, correct attention forward kernel). Q, K, V and O are addressed
as [Z·H·N, D] rows (the tutorial's tensor descriptors; rows past the end read as zeros and are not
stored, as TMA does), so at B = 1 it is right and at B > 1 batch z's programs read and write batch 0's
rows shifted by z: two programs write each of those rows and batch z's own rows are never written.

    faprof profile --kernel tests/wrong/kernels/wrong_triton_tma_offset.py:wrong_triton_tma_offset \\
        --scenario tests/wrong/wrong_where_gpu.toml
"""

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64


@triton.jit
def _attn_fwd(Q, K, V, Out, qk_scale, H, N, total_rows, CAUSAL: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    off_hz = tl.program_id(1).to(tl.int64)
    off_z = off_hz // H
    off_h = off_hz % H
    offset_y = off_z + off_h * N  # PLANTED BUG (the tutorial's): off_hz * N is the slice's first row
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols0 = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    q_ok = (rows < N) & (offset_y + rows < total_rows)
    q = tl.load(Q + (offset_y + rows[:, None]) * D + d[None, :], mask=q_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if CAUSAL:  # noqa: SIM108 (a constexpr branch, as the tutorial writes it)
        hi = tl.minimum(N, (pid_m + 1) * BLOCK_M)
    else:
        hi = N
    for start in range(0, hi, BLOCK_N):
        cols = start + cols0
        k_ok = (cols < N) & (offset_y + cols < total_rows)
        kt = tl.load(K + (offset_y + cols[None, :]) * D + d[:, None], mask=k_ok[None, :], other=0.0)
        s = tl.dot(q, kt) * qk_scale
        valid = cols[None, :] < N
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + (offset_y + cols[:, None]) * D + d[None, :], mask=k_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + (offset_y + rows[:, None]) * D + d[None, :], acc.to(Out.dtype.element_ty), mask=q_ok[:, None])


def wrong_triton_tma_offset(q, k, v, causal, scale, out=None):
    """faprof's variant signature: q, k, v [B, H, N, D] (one N for queries and keys) -> out [B, H, N, D]."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, N, D = q.shape
    if k.shape[2] != N:
        raise ValueError("this kernel takes one N_CTX for queries and keys (Sq == Sk)")
    if out is None:
        out = torch.empty_like(q)
    grid = (triton.cdiv(N, BLOCK_M), B * H)
    _attn_fwd[grid](q, k, v, out, scale * 1.4426950408889634, H, N, B * H * N, CAUSAL=bool(causal), D=D,
                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
    return out


wrong_triton_tma_offset.faprof_dtypes = ("fp16", "bf16")
wrong_triton_tma_offset.faprof_head_dims = (16, 32, 64, 128)
