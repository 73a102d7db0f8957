"""The library variants' calls on the CPU against stand-ins for FlashInfer and FlashAttention-4.

The stand-ins take the libraries' documented arguments only (the same names and order as
flashinfer-python 0.6.18.post1 and flash-attn-4 4.0.0b40; an unknown keyword is a TypeError) and
compute attention the way their documentation states it: FlashInfer's NHD/HND page layouts, its page
table (kv_indptr, kv_indices, kv_last_page_len), ragged indptr, bottom-right causal mask and
window_left; FlashAttention's [B, S, H, D] and varlen layouts and (left, right) window. So these tests
check faprof's side of each call (layouts, index tensors, mask arguments, the plan made once per
problem) against faprof's reference, not the libraries' kernels, which have not run here.
"""

import sys
import types

import pytest
import torch

from faprof.correctness import layouts
from faprof.model.problem import AttentionProblem as P
from faprof.variants import lib_fa4, lib_flashinfer
from faprof.variants.definition import attention


def _attend(q, k, v, keep, scale, cap):
    """q [qo, Hq, D], k/v [kv, Hkv, D], keep [qo, kv] -> [qo, Hq, D] (GQA: query head h reads KV head h // group)."""
    group = q.shape[1] // k.shape[1]
    kx, vx = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("ihd,jhd->hij", q.float(), kx.float()) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), vx.float()).to(q.dtype)


def _fi_keep(qo, kv, causal, window_left):
    i, j = torch.arange(qo).unsqueeze(1), torch.arange(kv).unsqueeze(0)
    keep = torch.ones(qo, kv, dtype=torch.bool)
    if causal:
        keep &= j <= i + kv - qo
    if window_left >= 0:
        keep &= j + qo + window_left >= kv + i
    return keep


def _fi_seq(q, k, v, causal, window_left, logits_soft_cap, sm_scale):
    return _attend(q, k, v, _fi_keep(q.shape[0], k.shape[0], causal, window_left), sm_scale, logits_soft_cap or 0.0)


def _nhd(t, layout):
    return t if layout == "NHD" else t.transpose(0, 1)


def _pages(cache, layout, indptr, indices, last, b):
    """Sequence b's tokens [kv, Hkv, D] from a paged cache in FlashInfer's layout."""
    rows, s, e = [], int(indptr[b]), int(indptr[b + 1])
    for n, page in enumerate(indices[s:e].tolist()):
        tok = _nhd(cache[page], layout)
        rows.append(tok[: int(last[b])] if s + n == e - 1 else tok)
    return torch.cat(rows)


class _Wrapper:
    calls: list = []

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False):
        assert float_workspace_buffer.dtype == torch.uint8
        self.layout, self.tc = kv_layout, use_tensor_cores


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             window_left=-1, logits_soft_cap=None, sm_scale=None, q_data_type=None, kv_data_type=None):
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        _Wrapper.calls.append(("plan", type(self).__name__, self.tc))
        self.p = (indptr, indices, last_page_len, window_left, logits_soft_cap, sm_scale)

    def run(self, q, paged_kv_cache):
        indptr, indices, last, left, cap, scale = self.p
        k, v = paged_kv_cache
        return torch.stack([_fi_seq(q[b:b + 1], _pages(k, self.layout, indptr, indices, last, b),
                                    _pages(v, self.layout, indptr, indices, last, b), False, left, cap, scale)[0]
                            for b in range(len(last))])


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, *, causal=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, q_data_type=None, kv_data_type=None):
        _Wrapper.calls.append(("plan", type(self).__name__))
        self.p = (qo_indptr.tolist(), kv_indptr.tolist(), causal, window_left, logits_soft_cap, sm_scale)

    def run(self, q, k, v):
        qi, ki, *rest = self.p
        return torch.cat([_fi_seq(q[qi[b]:qi[b + 1]], k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]], *rest)
                          for b in range(len(qi) - 1)])


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, *, causal=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
             q_data_type=None, kv_data_type=None):
        _Wrapper.calls.append(("plan", type(self).__name__))
        self.p = (qo_indptr.tolist(), paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, causal, window_left,
                  logits_soft_cap, sm_scale)

    def run(self, q, paged_kv_cache):
        qi, indptr, indices, last, *rest = self.p
        k, v = paged_kv_cache
        return torch.cat([_fi_seq(q[qi[b]:qi[b + 1]], _pages(k, self.layout, indptr, indices, last, b),
                                  _pages(v, self.layout, indptr, indices, last, b), *rest) for b in range(len(qi) - 1)])


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False,
                                q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None):
    assert q.dim() == 2
    return _fi_seq(q.unsqueeze(0), _nhd(k, kv_layout), _nhd(v, kv_layout), False, window_left, logits_soft_cap,
                   sm_scale)[0]


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None,
                                 packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None):
    assert q.stride(-1) == 1  # FlashInfer reads q through its strides, the last one contiguous
    return _fi_seq(q, _nhd(k, kv_layout), _nhd(v, kv_layout), causal, window_left, logits_soft_cap, sm_scale)


def _fa_keep(qo, kv, causal, window_size):
    left, right = window_size
    i, j = torch.arange(qo).unsqueeze(1), torch.arange(kv).unsqueeze(0)
    keep, d = torch.ones(qo, kv, dtype=torch.bool), i + kv - qo
    if causal:
        keep &= j <= d
    if left is not None:
        keep &= j >= d - left
    if right is not None:
        keep &= j <= d + right
    return keep


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0):
    assert q.dim() == 4 and q.stride(-1) == 1  # [B, S, H, D], any aligned strides
    out = torch.stack([_attend(q[b], k[b], v[b], _fa_keep(q.shape[1], k.shape[1], causal, window_size), softmax_scale,
                               softcap) for b in range(q.shape[0])])
    return out, None


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                           softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0):
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert cu_seqlens_q.dtype == torch.int32 and max_seqlen_q == max(b - a for a, b in zip(cq, cq[1:], strict=False))
    out = torch.cat([_attend(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]],
                             _fa_keep(cq[b + 1] - cq[b], ck[b + 1] - ck[b], causal, window_size), softmax_scale, softcap)
                     for b in range(len(cq) - 1)])
    return out, None


@pytest.fixture
def fakes(monkeypatch):
    fi = types.ModuleType("flashinfer")
    for f in (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
              single_decode_with_kv_cache, single_prefill_with_kv_cache):
        setattr(fi, f.__name__, f)
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_func, cute.flash_attn_varlen_func = flash_attn_func, flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setattr(lib_flashinfer, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(lib_flashinfer, "_STATES", type(lib_flashinfer._STATES)())
    monkeypatch.setattr(lib_flashinfer, "_WORKSPACES", {})
    _Wrapper.calls = []
    return _Wrapper.calls


def _run(fn, problem, seed=0, grad=False, args=None):
    """fn on fresh inputs (with `args`: new values under the same index tensors, as the timed calls get them),
    checked against faprof's reference."""
    q, k, v, dout, drawn = layouts.make_layout_inputs(problem, "cpu", torch.Generator().manual_seed(seed))
    args = args if args is not None else drawn
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    got = fn(q, k, v, problem.causal, problem.softmax_scale, attn=args)
    want = layouts.reference_forward(problem, q, k, v, args, "cpu", torch.float64).to(got.dtype)
    assert got.shape == want.shape
    torch.testing.assert_close(got.detach(), want, atol=2e-5, rtol=2e-5)
    return q, k, v, dout, args, got


BR = {"causal": True, "mask_align": "bottom_right", "dtype": "fp32"}


@pytest.mark.parametrize("problem,plans", [
    (P(B=3, H=8, Hkv=2, Sq=1, Sk=40, D=64, seqlens_k=(40, 17, 33), page_size=16, window=(9, 0), softcap=5.0, **BR),
     [("plan", "BatchDecodeWithPagedKVCacheWrapper", False)]),
    (P(B=2, H=16, Hkv=2, Sq=1, Sk=30, D=64, seqlens_k=(30, 7), page_size=4, **BR),
     [("plan", "BatchDecodeWithPagedKVCacheWrapper", True)]),  # 8 query heads per KV head: tensor cores
    (P(B=3, H=4, Hkv=1, Sq=1, Sk=25, D=64, **BR), [("plan", "BatchDecodeWithPagedKVCacheWrapper", False)]),
    (P(B=1, H=4, Sq=1, Sk=25, D=64, window=(5, -1), mask_align="bottom_right", dtype="fp32"), []),
])
def test_flashinfer_decode_computes_faprofs_attention(fakes, problem, plans):
    args = _run(lib_flashinfer.decode_fn, problem)[4]
    _run(lib_flashinfer.decode_fn, problem, seed=1, args=args)  # new values, same index tensors: the plan is kept
    assert fakes == plans


@pytest.mark.parametrize("problem", [
    P(B=3, H=4, Hkv=2, Sq=20, Sk=20, D=64, seqlens_q=(20, 3, 11), window=(4, 0), dtype="fp32"),
    P(B=2, H=4, Sq=9, Sk=30, D=64, seqlens_q=(9, 5), seqlens_k=(30, 12), softcap=3.0, **BR),
    P(B=2, H=4, Hkv=1, Sq=4, Sk=37, D=64, seqlens_k=(37, 6), page_size=8, **BR),
    P(B=1, H=4, Hkv=2, Sq=12, Sk=40, D=64, window=(7, 0), **BR),
    P(B=1, H=2, Sq=16, Sk=16, D=64, dtype="fp32"),
])
def test_flashinfer_prefill_computes_faprofs_attention(fakes, problem):
    args = _run(lib_flashinfer.prefill_fn, problem)[4]
    _run(lib_flashinfer.prefill_fn, problem, seed=1, args=args)
    assert len(fakes) == (0 if problem.layout == "dense" else 1)


def test_a_new_block_table_is_planned_anew(fakes):
    problem = P(B=2, H=4, Sq=1, Sk=20, D=64, seqlens_k=(20, 9), page_size=4, **BR)
    _run(lib_flashinfer.decode_fn, problem, seed=0)
    _run(lib_flashinfer.decode_fn, problem, seed=5)  # another draw: another shuffled block table tensor
    assert len(fakes) == 2


@pytest.mark.parametrize("problem", [
    P(B=2, H=4, Hkv=2, Sq=12, Sk=30, D=64, window=(6, 2), softcap=4.0, direction="fwd_bwd", **BR),
    P(B=2, H=4, Sq=16, Sk=16, D=64, dtype="fp32", direction="fwd_bwd"),
    P(B=3, H=4, Hkv=1, Sq=20, Sk=20, D=64, seqlens_q=(20, 3, 11), causal=True, dtype="fp32", direction="fwd_bwd"),
])
def test_fa4_computes_faprofs_attention_and_its_gradients(fakes, problem):
    q, k, v, dout, args, got = _run(lib_fa4.fa4_fn, problem, grad=True)
    grads = torch.autograd.grad(got, (q, k, v), dout)
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = attention(problem, qd, kd, vd, args)
    for g, w in zip(grads, torch.autograd.grad(want, (qd, kd, vd), dout.double()), strict=True):
        torch.testing.assert_close(g, w.float(), atol=1e-4, rtol=1e-4)
