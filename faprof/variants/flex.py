"""FlexAttention (`torch.nn.attention.flex_attention`) as a baseline: every mask, GQA, packed and paged batches.

The problem's mask becomes a `mask_mod` (faprof.model.mask's rule: causal and window, either corner),
a soft-cap a `score_mod`, GQA flex's own `enable_gqa`. A packed (varlen) batch runs as one sequence
of all tokens with document masking (a query sees keys of its own sequence only, positions counted
within the sequence). A paged cache runs over the whole pool viewed as one long KV sequence
[1, Hkv, blocks x page_size, D] (a strided view, no copy): the mask maps each physical slot through
the inverse of the block table to its sequence and position, so the block mask skips every block
another sequence owns and flex reads only the sequence's own pages, in any order.

On the GPU flex runs compiled (`torch.compile`, one Triton kernel); the block mask and the compiled
kernel are built on the first call of a problem, which the harness never times (its correctness
check and warm-up come first), and the time it took is said once in the row's `path`. On the CPU it
runs eagerly (unfused), which the path says too.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.variants.definition import AttnArgs

#: Flex's default sparse block size (tokens per block of the block mask).
FLEX_BLOCK = 128

_COMPILED: dict[str, Any] = {}
_STATE: dict[tuple, dict[str, Any]] = {}


def available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _mask_mod(problem: AttentionProblem, sq_of, sk_of, local_q, local_k, same_seq):
    """mask_mod(b, h, q_idx, kv_idx) of the problem's mask, with positions and lengths given as functions
    (dense: identities; packed/paged: looked up per token)."""
    m = problem.mask
    br = m.align == "bottom_right"

    def mask_mod(b, h, q_idx, kv_idx):
        qi, kj = local_q(b, q_idx), local_k(b, kv_idx)
        off = (sk_of(b, kv_idx) - sq_of(b, q_idx)) if br else 0
        ok = same_seq(b, q_idx, kv_idx)
        if m.causal:
            ok = ok & (kj <= qi + off)
        if m.left >= 0:
            ok = ok & (kj >= qi + off - m.left)
        if m.right >= 0:
            ok = ok & (kj <= qi + off + m.right)
        return ok

    return mask_mod


def _dense_mods(problem: AttentionProblem, device):
    import torch

    sq = torch.tensor(problem.Sq, device=device)
    sk = torch.tensor(problem.Sk, device=device)
    return _mask_mod(problem, lambda b, q: sq, lambda b, k: sk, lambda b, q: q, lambda b, k: k,
                     lambda b, q, k: q >= 0)  # one sequence: every key is the query's


def _varlen_mods(problem: AttentionProblem, args: AttnArgs, device):
    import torch

    cu_q, cu_k = args.cu_seqlens_q.to(device).long(), args.cu_seqlens_k.to(device).long()
    doc_q = torch.repeat_interleave(torch.arange(problem.B, device=device), cu_q.diff())
    doc_k = torch.repeat_interleave(torch.arange(problem.B, device=device), cu_k.diff())
    len_q, len_k = cu_q.diff(), cu_k.diff()
    return _mask_mod(
        problem, lambda b, q: len_q[doc_q[q]], lambda b, k: len_k[doc_k[k]],
        lambda b, q: q - cu_q[doc_q[q]], lambda b, k: k - cu_k[doc_k[k]],
        lambda b, q, k: doc_q[q] == doc_k[k],
    )


def _paged_mods(problem: AttentionProblem, args: AttnArgs, n_blocks: int, device):
    import torch

    page = problem.page_size
    table = args.block_table.to(device).long()
    owner = torch.full((n_blocks,), -1, dtype=torch.long, device=device)
    slot = torch.zeros(n_blocks, dtype=torch.long, device=device)
    for b, n in enumerate(problem.blocks_per_seq()):
        owner[table[b, :n]] = b
        slot[table[b, :n]] = torch.arange(n, device=device)
    lens = args.seqlens_k.to(device).long()
    sq = torch.tensor(problem.Sq, device=device)

    def local_k(b, k):
        return slot[k // page] * page + k % page

    def same(b, q, k):
        return (owner[k // page] == b) & (local_k(b, k) < lens[b])

    return _mask_mod(problem, lambda b, q: sq, lambda b, k: lens[b], lambda b, q: q, local_k, same)


def _score_mod(problem: AttentionProblem):
    if not problem.softcap:
        return None
    import torch

    cap = problem.softcap

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return score_mod


def _views(problem: AttentionProblem, q, k, v):
    """q, k, v as flex takes them: [B, H, S, D] (packed: one sequence of all tokens; paged: the pool)."""
    if problem.layout == "varlen":
        return q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    if problem.layout == "paged":
        n = k.shape[0] * k.shape[1]
        return q, k.reshape(n, problem.kv_heads, problem.D).permute(1, 0, 2).unsqueeze(0), \
            v.reshape(n, problem.kv_heads, problem.D).permute(1, 0, 2).unsqueeze(0)
    return q, k, v


def _state(problem: AttentionProblem, q, kv_len: int, args: AttnArgs | None) -> dict[str, Any]:
    """The block mask and mods of a problem on q's device, built once (the first, untimed call)."""
    # The index tensor itself (held by the state, so its identity cannot be reused) tells a new draw of the
    # problem from the same one: no copy of the table to the host, no sync, inside a timed call.
    key = (problem.shape_id, str(q.device))
    table = _index_tensor(args)
    if key in _STATE and _STATE[key]["table"] is table:
        return _STATE[key]
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    if q.device.type == "cuda":
        # Each problem compiles flex anew (its mask and shapes); past dynamo's recompile limit (8) it would
        # silently run flex eagerly, unfused (seen on the H100: 40x slower, out of memory on long
        # sequences). One problem at a time: forget the last one's compiled graphs.
        torch._dynamo.reset()
        _COMPILED.clear()
    t0 = time.perf_counter()
    device = q.device
    if problem.layout == "varlen" and args is not None:
        mods, B, qlen = _varlen_mods(problem, args, device), 1, problem.total_q
    elif problem.layout == "paged" and args is not None:
        mods, B, qlen = _paged_mods(problem, args, kv_len // problem.page_size, device), problem.B, problem.Sq
    else:
        mods, B, qlen = _dense_mods(problem, device), problem.B, problem.Sq
    trivial = not problem.causal and problem.window is None and problem.layout == "dense"
    block_mask = None if trivial else create_block_mask(mods, B, None, qlen, kv_len, device=str(device))
    _STATE.clear()  # one problem at a time: the harness runs a problem's rows together
    _STATE[key] = {"block_mask": block_mask, "mask_s": time.perf_counter() - t0, "first_call_s": None, "table": table}
    return _STATE[key]


def _index_tensor(args: AttnArgs | None):
    """The tensor a packed or paged problem's block mask is built from (block table, else cu_seqlens_q)."""
    if args is None:
        return None
    return args.block_table if args.block_table is not None else args.cu_seqlens_q


def _flex(device_type: str):
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        return flex_attention
    if "cuda" not in _COMPILED:
        import torch
        import torch._inductor.config as inductor_config

        # Compile in this process: inductor's pool of compile workers did not come back inside faprof's
        # worker processes on the H100 (a smoke row sat until its stage's time limit).
        inductor_config.compile_threads = 1
        _COMPILED["cuda"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["cuda"]


def flex_fn(q, k, v, causal: bool, scale: float, out=None, attn: AttnArgs | None = None):
    """The flex baseline's call (the variant signature; `attn` for problems beyond 2022's)."""
    problem = attn.problem if attn is not None else AttentionProblem(
        B=q.shape[0], H=q.shape[1], Sq=q.shape[2], Sk=k.shape[2], D=q.shape[3], causal=causal, scale=scale,
        dtype={"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}.get(str(q.dtype), "fp64"))
    fq, fk, fv = _views(problem, q, k, v)
    st = _state(problem, q, fk.shape[2], attn)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        # eager flex on the CPU warns that it is unfused on every call; the row's path says so once
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        o = _flex(q.device.type)(fq, fk, fv, score_mod=_score_mod(problem), block_mask=st["block_mask"],
                                 scale=scale, enable_gqa=problem.kv_heads != problem.H)
    if st["first_call_s"] is None:
        if q.device.type == "cuda":
            import torch

            torch.cuda.synchronize()
        st["first_call_s"] = time.perf_counter() - t0
    if problem.layout == "varlen":
        return o.squeeze(0).transpose(0, 1)
    return o


def flex_path(problem: AttentionProblem, q, k, v, attn: AttnArgs | None) -> str:
    """What the flex row ran: compiled or eager, and the one-off costs kept out of its timing."""
    st = next(iter(_STATE.values()), None)
    costs = ""
    if st is not None and st["first_call_s"] is not None:
        costs = f"; first call {st['first_call_s']:.1f} s (compile), block mask {st['mask_s']:.2f} s, neither timed"
    if q.device.type == "cuda":
        return "fused: flex_attention compiled to one Triton kernel" + costs
    return "eager flex_attention on the CPU (unfused reference path)" + costs
