"""FlashInfer (the package flashinfer-python) as two baselines: `flashinfer_decode` and `flashinfer_prefill`.

What runs which problem (faprof's layouts, faprof.correctness.layouts, mapped onto FlashInfer's without
copying K or V):

- `flashinfer_decode`, one query per sequence (Sq = 1): a paged cache through
  `BatchDecodeWithPagedKVCacheWrapper` on faprof's pool as it is ([blocks, page_size, Hkv, D] is
  FlashInfer's "NHD" page layout; the page table is `paged_kv_layout` of faprof's block table); a
  dense batch of B > 1 through the same wrapper with its K/V [B, Hkv, Sk, D] read as "HND" pages of
  Sk tokens, one page per sequence (`dense_kv_pages`); one dense sequence through
  `single_decode_with_kv_cache` (K/V [Hkv, Sk, D]: "HND"). Tensor-core decode (FlashInfer's
  `use_tensor_cores`) where a KV head serves more than 4 query heads, as vLLM chooses it (FlashInfer's
  CUDA-core decode kernel is instantiated for 1, 2, 3, 4, 6 and 8 query heads per KV head only).
- `flashinfer_prefill`: a packed (varlen) batch through `BatchPrefillWithRaggedKVCacheWrapper` (faprof's
  [tokens, H, D] with cu_seqlens is FlashInfer's ragged layout with qo_indptr/kv_indptr); a paged
  cache through `BatchPrefillWithPagedKVCacheWrapper` (q copied to FlashInfer's packed [B·Sq, H, D]
  inside the call when Sq > 1, which the row's path says); one dense sequence through
  `single_prefill_with_kv_cache` (q read through a strided view: FlashInfer takes q's strides).

The wrappers split planning (`plan`: the work partition, copied from host, with a device sync) from
running (`run`). faprof's variant signature has no set-up step outside the timed call, so the planned
wrapper is kept per problem (and per index tensor, so a new draw of a paged problem is planned anew),
made by the problem's first call: the harness never times that call (its correctness check comes
first), and the timed calls only `run`. The kernels are compiled by FlashInfer's JIT (nvcc) on their
first use, also in that call. One workspace buffer of WORKSPACE_BYTES per device serves every wrapper.

Masks: FlashInfer's causal mask and window are aligned to the bottom-right corner (its documentation's
example builds the causal mask as `tril(ones(qo_len, kv_len), diagonal=kv_len - qo_len)`; its
DefaultAttention keeps key j for query i when j + qo_len + window_left >= kv_len + i), and its
window has a left side only (`window_left`): `flashinfer_mask` maps faprof's mask onto that or says
why it cannot. A soft-cap is `logits_soft_cap` (c·tanh(s / c) of the scaled scores, as faprof's).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.model.variant import Variant
from faprof.variants.definition import AttnArgs
from faprof.variants.libraries import FLASHINFER, mask_alignment_reason

#: Head dimensions faprof runs FlashInfer at: those its Hopper (FA3) backend instantiates
#: (flashinfer.utils.is_fa3_prefill_head_dim_supported) and its documented set.
HEAD_DIMS = (64, 128, 256)

#: Query heads per KV head above which decode runs FlashInfer's tensor-core (prefill) kernel.
TENSOR_CORE_GROUP = 4

#: The float workspace every wrapper shares (FlashInfer recommends 128 MB; zeroed before first use).
WORKSPACE_BYTES = 128 * 2**20

#: Planned problems kept (least recently used dropped first): a task plans its own and its probes'.
KEEP_PROBLEMS = 16

FEATURES_DECODE = frozenset({"gqa", "bottom_right", "window", "softcap", "paged"})
FEATURES_PREFILL = FEATURES_DECODE | {"varlen"}

_STATES: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
_WORKSPACES: dict[str, Any] = {}


# ------------------------------------------------------------------ layouts (pure, CPU-testable)
def paged_kv_layout(block_table, seqlens_k: Sequence[int], page_size: int) -> tuple[Any, Any, Any]:
    """FlashInfer's page table of faprof's paged cache: (kv_indptr [B + 1], kv_indices [pages in use],
    kv_last_page_len [B]), int32 on block_table's device.

    faprof's block_table [B, max_blocks] (int32, unused entries -1) gives sequence b's j-th block of
    `page_size` tokens; `seqlens_k` (host integers) its cache length. FlashInfer's sequence b owns pages
    kv_indices[kv_indptr[b]:kv_indptr[b + 1]] in order, the last one holding kv_last_page_len[b] tokens
    (1 to page_size)."""
    import torch

    lens = [int(n) for n in seqlens_k]
    if page_size < 1 or any(n < 1 for n in lens):
        raise ValueError(f"paged_kv_layout needs page_size >= 1 and cache lengths >= 1, got {page_size}, {lens}")
    pages = [-(-n // page_size) for n in lens]
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + p)
    table = torch.as_tensor(block_table)
    indices = torch.cat([table[b, :p] for b, p in enumerate(pages)]).to(torch.int32)
    last = [n - (p - 1) * page_size for n, p in zip(lens, pages, strict=True)]
    dev = table.device
    return (torch.tensor(indptr, dtype=torch.int32, device=dev), indices,
            torch.tensor(last, dtype=torch.int32, device=dev))


def dense_kv_pages(batch: int, seqlen_k: int, device=None) -> tuple[Any, Any, Any]:
    """A dense K or V [B, Hkv, Sk, D] read as FlashInfer's "HND" paged cache [pages, Hkv, page_size, D] with
    pages of Sk tokens, sequence b owning page b: (kv_indptr, kv_indices, kv_last_page_len), int32."""
    import torch

    return (torch.arange(batch + 1, dtype=torch.int32, device=device),
            torch.arange(batch, dtype=torch.int32, device=device),
            torch.full((batch,), seqlen_k, dtype=torch.int32, device=device))


def flashinfer_mask(problem: AttentionProblem) -> tuple[bool, int] | str:
    """(causal, window_left) of `problem`'s mask in FlashInfer's terms, or why FlashInfer cannot express it."""
    reason = mask_alignment_reason(problem, "FlashInfer")
    if reason:
        return reason
    m = problem.mask
    causal, left, right = m.causal, m.left, m.right
    if (causal or m.windowed) and any(q > k for q, k in zip(problem.q_lens(), problem.k_lens(), strict=True)):
        return ("FlashInfer's causal mask and window need each sequence's queries at most its keys (qo_len <= kv_len); "
                "here the first Sq - Sk queries would see no key")
    single_query = all(q == 1 for q in problem.q_lens())
    if right >= 0 and not causal and not single_query:  # one bottom-right query: nothing lies right of it
        if right != 0:
            return (f"FlashInfer's window has a left side only (window_left); a right side of {right} key(s) past "
                    f"the diagonal without a causal mask cannot be expressed")
        causal = True  # a window ending on the diagonal is the causal mask
    return causal, left


# ------------------------------------------------------------------ support
def _common_check(problem: AttentionProblem) -> str | None:
    """The library's own limits first (they hold on every machine), then whether it is installed here."""
    if problem.D not in HEAD_DIMS:
        return (f"FlashInfer's attention kernels are instantiated for head dims {', '.join(map(str, HEAD_DIMS))} "
                f"(its Hopper backend's set); got D={problem.D}")
    mask = flashinfer_mask(problem)
    if isinstance(mask, str):
        return mask
    return FLASHINFER.missing()


def _decode_check(problem: AttentionProblem) -> str | None:
    if problem.Sq != 1:
        return (f"FlashInfer's decode kernels take one query per sequence, got Sq={problem.Sq}; "
                "flashinfer_prefill runs several")
    return _common_check(problem)


def _prefill_check(problem: AttentionProblem) -> str | None:
    if problem.layout == "dense" and problem.B > 1:
        return (f"FlashInfer takes one dense sequence (single_prefill_with_kv_cache) or a packed batch "
                f"([tokens, H, D] with indptr); a dense batch of B={problem.B} would be copied into the packed "
                f"layout inside the timed call: give the problem as a packed batch (seqlens_q) instead")
    return _common_check(problem)


# ------------------------------------------------------------------ the calls
def _workspace(device) -> Any:
    import torch

    key = str(device)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[key]


def _problem_of(q, k, causal: bool, scale: float, attn: AttnArgs | None) -> AttentionProblem:
    if attn is not None:
        return attn.problem
    dtype = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(str(q.dtype), "fp32")
    return AttentionProblem(B=q.shape[0], H=q.shape[1], Sq=q.shape[2], Sk=k.shape[2], D=q.shape[3], dtype=dtype,
                            causal=causal, scale=scale, Hkv=k.shape[1])


def _mask_kw(problem: AttentionProblem, scale: float) -> dict[str, Any]:
    mask = flashinfer_mask(problem)
    if isinstance(mask, str):
        raise ValueError(mask)
    causal, left = mask
    return {"causal": causal, "window_left": left, "logits_soft_cap": problem.softcap or None, "sm_scale": scale}


def _state(what: str, problem: AttentionProblem, q, k, scale: float, attn: AttnArgs | None) -> dict[str, Any]:
    """The planned wrapper of `problem` on q's device, planned on its first call (untimed), then kept."""
    with FLASHINFER.imported():
        import flashinfer

    index = None if attn is None else (attn.block_table if attn.block_table is not None else attn.cu_seqlens_q)
    key = (what, problem.shape_id, str(q.device), float(scale))
    st = _STATES.get(key)
    if st is not None and st["index"] is index:
        _STATES.move_to_end(key)
        return st
    kw = _mask_kw(problem, scale)
    causal = kw.pop("causal")
    types = {"q_data_type": q.dtype, "kv_data_type": k.dtype}
    tc = problem.group > TENSOR_CORE_GROUP
    st = {"index": index, "tc": tc, "wrapper": None, "call": "", "kw": kw, "causal": causal}
    ws = _workspace(q.device)
    if what == "decode" and problem.layout == "dense" and problem.B == 1:
        st["call"] = "single_decode_with_kv_cache (K/V as HND)"
    elif what == "decode":
        paged = problem.layout == "paged"
        if paged:
            pages = paged_kv_layout(attn.block_table, problem.k_lens(), problem.page_size)  # type: ignore[union-attr]
            layout, page = "NHD", problem.page_size
        else:
            pages, layout, page = dense_kv_pages(problem.B, problem.Sk, q.device), "HND", problem.Sk
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=tc)
        w.plan(*pages, problem.H, problem.kv_heads, problem.D, page, **kw, **types)
        st.update(wrapper=w, call=f"BatchDecodeWithPagedKVCacheWrapper ({layout} pages of {page} tokens"
                                  f"{'' if paged else ', one per sequence'})")
    elif problem.layout == "dense":
        st["call"] = "single_prefill_with_kv_cache (q as a strided [Sq, H, D] view, K/V as HND)"
    elif problem.layout == "varlen":
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        w.plan(attn.cu_seqlens_q, attn.cu_seqlens_k, problem.H, problem.kv_heads, problem.D,  # type: ignore[union-attr]
               causal=causal, **kw, **types)
        st.update(wrapper=w, call="BatchPrefillWithRaggedKVCacheWrapper (NHD, cu_seqlens as indptr)")
    else:
        import torch

        qo_indptr = torch.arange(0, (problem.B + 1) * problem.Sq, problem.Sq, dtype=torch.int32, device=q.device)
        pages = paged_kv_layout(attn.block_table, problem.k_lens(), problem.page_size)  # type: ignore[union-attr]
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(qo_indptr, *pages, problem.H, problem.kv_heads, problem.D, problem.page_size, causal=causal, **kw, **types)
        copy = "; q copied to [B·Sq, H, D] inside the call" if problem.Sq > 1 else ""
        st.update(wrapper=w, call=f"BatchPrefillWithPagedKVCacheWrapper (NHD pages of {problem.page_size}{copy})")
    _STATES[key] = st
    while len(_STATES) > KEEP_PROBLEMS:
        _STATES.popitem(last=False)
    return st


def decode_fn(q, k, v, causal: bool, scale: float, out=None, attn: AttnArgs | None = None):
    """flashinfer_decode's call (the variant signature): q [B, H, 1, D]; K/V dense [B, Hkv, Sk, D] or a paged pool."""
    with FLASHINFER.imported():
        import flashinfer

    problem = _problem_of(q, k, causal, scale, attn)
    st = _state("decode", problem, q, k, scale, attn)
    if st["wrapper"] is None:
        o = flashinfer.single_decode_with_kv_cache(q[0, :, 0], k[0], v[0], kv_layout="HND", use_tensor_cores=st["tc"],
                                                   **st["kw"])
        return o.view(1, problem.H, 1, problem.D)
    return st["wrapper"].run(q.squeeze(2), (k, v)).unsqueeze(2)


def prefill_fn(q, k, v, causal: bool, scale: float, out=None, attn: AttnArgs | None = None):
    """flashinfer_prefill's call: one dense sequence, a packed batch, or queries against a paged pool."""
    with FLASHINFER.imported():
        import flashinfer

    problem = _problem_of(q, k, causal, scale, attn)
    st = _state("prefill", problem, q, k, scale, attn)
    if problem.layout == "dense":
        o = flashinfer.single_prefill_with_kv_cache(q[0].transpose(0, 1), k[0], v[0], causal=st["causal"],
                                                    kv_layout="HND", **st["kw"])
        return o.transpose(0, 1).unsqueeze(0)
    if problem.layout == "varlen":
        return st["wrapper"].run(q, k, v)
    B, H, Sq, D = q.shape
    o = st["wrapper"].run(q.transpose(1, 2).reshape(B * Sq, H, D), (k, v))
    return o.view(B, Sq, H, D).transpose(1, 2)


def _path(what: str):
    def path(problem: AttentionProblem, q, k, v, attn: AttnArgs | None) -> str:
        st = _STATES.get((what, problem.shape_id, str(q.device), float(problem.softmax_scale)))
        head = f"fused: FlashInfer {FLASHINFER.version() or '?'}"
        if st is None:
            return f"{head} {what} (not called yet)"
        w = st["wrapper"]
        backend = getattr(w, "_backend", None) if w is not None else _single_backend(problem, q, k)
        cores = f", tensor cores: {'yes' if st['tc'] else 'no'}" if what == "decode" else ""
        planned = "; planned on the problem's first call (untimed)" if w is not None else ""
        return f"{head} {st['call']}, backend {backend or 'auto'}{cores}{planned}; kernels JIT-compiled on first use"

    return path


def _single_backend(problem: AttentionProblem, q, k) -> str | None:
    """The backend FlashInfer's single-request prefill picks (its own rule), or None when it cannot be read."""
    try:
        from flashinfer.utils import determine_attention_backend

        return str(determine_attention_backend(q.device, 0, False, False, q.dtype, k.dtype,
                                               head_dim_qk=problem.D, head_dim_vo=problem.D))
    except Exception:  # a private helper of the library: leave the backend unsaid rather than guess
        return None


def variants() -> list[Variant]:
    """The FlashInfer variants (registered whether or not the package is installed)."""
    src = f"FlashInfer ({FLASHINFER.dist}=={FLASHINFER.pin}, optional: {FLASHINFER.install})"
    common: dict[str, Any] = dict(dtypes=("fp16", "bf16"), directions=("fwd",), device="cuda", in_all=False,
                                  deterministic=(), source=src)
    return [
        Variant("flashinfer_decode", "torch",
                "FlashInfer decode: batch decode on a paged KV cache (its page table from faprof's block table), "
                "dense batches as one page per sequence, single decode for one sequence",
                decode_fn, check=_decode_check, features=FEATURES_DECODE, path_of=_path("decode"),
                tags=("library", "flashinfer", "decode"), **common),
        Variant("flashinfer_prefill", "torch",
                "FlashInfer prefill: batch prefill on packed (varlen) batches and on a paged KV cache, "
                "single prefill for one dense sequence",
                prefill_fn, check=_prefill_check, features=FEATURES_PREFILL, path_of=_path("prefill"),
                tags=("library", "flashinfer", "prefill"), **common),
    ]
