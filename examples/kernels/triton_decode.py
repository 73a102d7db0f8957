"""A Triton split-KV decode kernel (GQA, dense or paged KV cache) for `faprof profile --kernel`:

    faprof profile --kernel examples/kernels/triton_decode.py:triton_decode --scenario examples/kernels/decode_small.toml

One program per (sequence, KV head, split of the keys): the group's query rows (Sq x H/Hkv, padded
to a power of two >= 16 for tl.dot) form one tile, so a K/V row is read once per KV head; the keys
are split so that about two programs run per SM; each split writes its partial output and its
log-sum-exp, and a combine in torch rescales and sums them. Causal masks aligned to either corner;
dense K/V [B, Hkv, Sk, D] or a paged pool [blocks, page_size, Hkv, D] read through the block table.
fp16 and bf16 in, fp32 accumulate; D a power of two from 16 to 128.

faprof calls it with `attn=` (faprof.variants.definition.AttnArgs: the problem, the block table and
the cache lengths) because it declares `faprof_features`; for 2022's problems attn is None.
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 64
LOG2E = 1.4426950408889634


@triton.jit
def _split(Q, K, V, OP, LP, BT, SEQK, qk_scale, H, Hkv, Sq, Sk, group, page, max_blocks, split_len, n_split,
           CAUSAL: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, PAGED: tl.constexpr, D: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bkv = tl.program_id(0)
    split = tl.program_id(1)
    b = bkv // Hkv
    kvh = bkv % Hkv
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < Sq * group
    i = rows // group
    h = kvh * group + rows % group
    d = tl.arange(0, D)
    q = tl.load(Q + ((b * H + h) * Sq + i).to(tl.int64)[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
    if PAGED:
        sk = tl.load(SEQK + b)
    else:
        sk = Sk
    off = sk - Sq if BOTTOM_RIGHT else 0
    start = split * split_len
    end = tl.minimum(start + split_len, sk)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < end
        if PAGED:
            blk = tl.load(BT + b * max_blocks + cols // page, mask=col_ok, other=0)
            kv_row = (blk.to(tl.int64) * page + cols % page) * Hkv + kvh
        else:
            kv_row = (b * Hkv + kvh).to(tl.int64) * Sk + cols
        kt = tl.load(K + kv_row[None, :] * D + d[:, None], mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, kt) * qk_scale
        valid = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            valid = valid & (cols[None, :] <= i[:, None] + off)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_row[:, None] * D + d[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    part = (bkv * n_split + split).to(tl.int64) * BLOCK_M + rows
    tl.store(OP + part[:, None] * D + d[None, :], acc / tl.where(l_i > 0, l_i, 1.0)[:, None])
    tl.store(LP + part, tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf")))


def _splits(bkv: int, sk: int) -> int:
    """Splits of the keys: about two programs per SM, each at least one BLOCK_N of keys."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return max(1, min(math.ceil(2 * sms / bkv), math.ceil(sk / BLOCK_N)))


def triton_decode(q, k, v, causal, scale, out=None, attn=None):
    """faprof's variant signature; q [B, H, Sq, D]; k, v [B, Hkv, Sk, D] or the paged pool."""
    problem = attn.problem if attn is not None else None
    B, H, Sq, D = q.shape
    paged = problem is not None and problem.layout == "paged"
    Hkv = problem.kv_heads if problem is not None else k.shape[1]
    Sk = problem.Sk if problem is not None else k.shape[2]
    group = H // Hkv
    block_m = max(16, triton.next_power_of_2(Sq * group))
    n_split = _splits(B * Hkv, Sk)
    split_len = triton.cdiv(triton.cdiv(Sk, n_split), BLOCK_N) * BLOCK_N
    n_split = triton.cdiv(Sk, split_len)
    o_part = torch.empty(B * Hkv * n_split * block_m, D, device=q.device, dtype=torch.float32)
    l_part = torch.empty(B * Hkv * n_split * block_m, device=q.device, dtype=torch.float32)
    bt = attn.block_table if paged else q  # any pointer when not paged (never read)
    seqk = attn.seqlens_k if paged else q
    _split[(B * Hkv, n_split)](
        q.contiguous(), k.contiguous(), v.contiguous(), o_part, l_part, bt, seqk, scale * LOG2E, H, Hkv, Sq, Sk,
        group, problem.page_size if paged else 1, bt.shape[1] if paged else 1, split_len, n_split,
        CAUSAL=bool(causal), BOTTOM_RIGHT=bool(problem is not None and problem.mask_align == "bottom_right"),
        PAGED=paged, D=D, BLOCK_M=block_m, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
    # combine the splits by log-sum-exp (base 2), then put the packed rows back as [B, H, Sq, D]
    lse = l_part.view(B * Hkv, n_split, block_m)
    w = torch.exp2(lse - lse.amax(dim=1, keepdim=True).clamp_min(-1e30))
    w = torch.where(torch.isfinite(lse), w, torch.zeros_like(w))
    o = (o_part.view(B * Hkv, n_split, block_m, D) * w[..., None]).sum(1) / w.sum(1).clamp_min(1e-30)[..., None]
    o = o[:, : Sq * group].view(B, Hkv, Sq, group, D).permute(0, 1, 3, 2, 4).reshape(B, H, Sq, D)
    if out is None:
        return o.to(q.dtype)
    out.copy_(o)
    return out


triton_decode.faprof_dtypes = ("fp16", "bf16")
triton_decode.faprof_head_dims = (16, 32, 64, 128)
triton_decode.faprof_features = ("gqa", "bottom_right", "paged")
