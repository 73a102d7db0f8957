"""TEST ONLY: planted CPU kernels for packed (varlen) and paged problems, one bug each.

Written by hand from the layouts (q [total_q, H, D] with cu_seqlens, or q [B, H, Sq, D] against a
pool [blocks, page, Hkv, D] through a block table) and faprof.model.mask's rule, not with faprof's
code; tests/test_wrong_layouts.py checks them against the definition and runs faprof's layout
signatures on what they return.

=====================  ===========================================================  =================================
bug                    what the kernel does                                         expected (family, kind)
=====================  ===========================================================  =================================
keys_of_previous       sequence b reads keys cu_seqlens_k[b-1]..cu_seqlens_k[b]     sequence, keys_of_previous
keys_run_on            sequence b's key loop runs to max_seqlen_k (into b+1's)      sequence, keys_run_on
one_sequence           cu_seqlens ignored: the pack is one sequence                 sequence, one_sequence
pool_order             block table ignored: blocks in pool order                    paging, pool_order
logical_order          block table ignored: pool block j for block j                paging, logical_order
last_block_whole       cache length ignored: the last block read whole              paging, last_block_whole
=====================  ===========================================================  =================================
"""

from __future__ import annotations

import math


def _attend(q, k, v, p):
    """q [sq, H, D], k and v [sk, Hkv, D] -> [sq, H, D] under the problem's mask (hand-written)."""
    import torch

    sq, H, _ = q.shape
    sk, Hkv, _ = k.shape
    g = H // Hkv
    qh = q.float().transpose(0, 1)
    kh = k.float().transpose(0, 1).repeat_interleave(g, dim=0)
    vh = v.float().transpose(0, 1).repeat_interleave(g, dim=0)
    s = qh @ kh.transpose(-2, -1) * p.softmax_scale
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
    d = i + (sk - sq if p.mask_align == "bottom_right" else 0)
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if p.causal:
        ok &= j <= d
    s = s.masked_fill(~ok, -math.inf)
    w = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    return (w @ vh).transpose(0, 1)


def varlen(q, k, v, p, cu_q, cu_k, bug: str | None = None):
    """A packed batch: q [total_q, H, D], k and v [total_k, Hkv, D], cu_seqlens as lists."""
    import torch

    if bug == "one_sequence":
        return _attend(q, k, v, p).to(q.dtype)
    out = torch.empty_like(q)
    for b in range(p.B):
        lo, hi = cu_k[b], cu_k[b + 1]
        if bug == "keys_of_previous" and b > 0:
            lo, hi = cu_k[b - 1], cu_k[b]  # PLANTED BUG: cu_seqlens_k indexed one entry early
        elif bug == "keys_run_on":
            hi = min(lo + p.Sk, cu_k[-1])  # PLANTED BUG: the key loop runs to max_seqlen_k
        out[cu_q[b]:cu_q[b + 1]] = _attend(q[cu_q[b]:cu_q[b + 1]], k[lo:hi], v[lo:hi], p).to(q.dtype)
    return out


def paged(q, k_pool, v_pool, p, table, lens, bug: str | None = None):
    """A paged cache: q [B, H, Sq, D], pools [blocks, page, Hkv, D], table [B, max_blocks], lens [B]."""
    import torch

    out = torch.empty_like(q)
    ps = p.page_size
    start = 0
    for b in range(p.B):
        n = -(-int(lens[b]) // ps)
        idx = [int(x) for x in table[b, :n]]
        if bug == "pool_order":
            idx = list(range(start, start + n))  # PLANTED BUG: the table is not read
        elif bug == "logical_order":
            idx = list(range(n))  # PLANTED BUG: the logical block index used as the pool's
        start += n
        keep = n * ps if bug == "last_block_whole" else int(lens[b])  # PLANTED BUG (last_block_whole)
        kb = k_pool[idx].reshape(n * ps, *k_pool.shape[2:])[:keep]
        vb = v_pool[idx].reshape(n * ps, *v_pool.shape[2:])[:keep]
        out[b] = _attend(q[b].transpose(0, 1), kb, vb, p).transpose(0, 1).to(q.dtype)
    return out
