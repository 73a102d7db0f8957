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

One (flex, shape) task calls flex on several problems: its own, then each adversarial probe (smaller
derived problems, faprof.correctness.adversarial), then its own again for timing. Each problem keeps its
own compiled function and block mask (the last FLEX_KEEP_PROBLEMS problems), so the timed problem is
compiled once, a probe shape that recurs in the next task is not compiled again, and no problem's
graphs count against another's recompile limit (resetting dynamo for each new problem instead cost
nine cold compiles per decode task, the timed problem's twice).
"""

from __future__ import annotations

import itertools
import time
import types
import warnings
from collections import OrderedDict
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.model.scores import capped
from faprof.variants.definition import AttnArgs

#: Flex's default sparse block size (tokens per block of the block mask).
FLEX_BLOCK = 128

#: Problems whose compiled flex and block mask are kept, least recently used dropped first: a task
#: calls about ten (its own and its probes'), and the next task's probes mostly have the same shapes.
FLEX_KEEP_PROBLEMS = 24

#: Device types flex runs compiled on. The CPU runs eagerly: inductor's C++ build of one flex shape
#: (B1 H4 Sq4 Sk1024 D128 fp32, torch 2.13) took 44 s cold on a 2-core host, far more than eager flex.
COMPILED_ON = ("cuda",)

#: Inductor's compile_threads while flex compiles. 1 compiles in this process, with no pool of compile
#: subprocesses: one flex graph is one or two Triton kernels, little for a pool to share out, and a
#: worker that stays one process is dumped whole when it hangs. None leaves inductor's own choice.
COMPILE_THREADS: int | None = 1

_PROBLEMS: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
_UNSAID = {"n": 0, "s": 0.0}  # compiles (and their first calls' seconds) no row's path has counted yet
_NAMES = itertools.count(1)  # each problem's compiled copy of _call gets a name of its own


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
    cap = problem.softcap

    def score_mod(score, b, h, q_idx, kv_idx):
        return capped(score, cap)

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
    """The block mask and compiled flex of a problem on q's device, built on its first call (untimed)."""
    # The index tensor itself (held by the state, so its identity cannot be reused) tells a new draw of the
    # problem from the same one: no copy of the table to the host, no sync, inside a timed call.
    key = (problem.shape_id, str(q.device))
    table = _index_tensor(args)
    st = _PROBLEMS.get(key)
    if st is not None:
        _PROBLEMS.move_to_end(key)
        if st["table"] is table:
            return st
    from torch.nn.attention.flex_attention import create_block_mask

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
    if st is not None:  # a new draw of a problem kept: its mask anew, its compiled kernel kept (same shapes)
        st.update(block_mask=block_mask, table=table)
        return st
    st = {"block_mask": block_mask, "mask_s": time.perf_counter() - t0, "first_call_s": None, "table": table,
          "fn": _compiled(q.device.type), "score_mod": _score_mod(problem)}
    _PROBLEMS[key] = st
    while len(_PROBLEMS) > FLEX_KEEP_PROBLEMS:
        _PROBLEMS.popitem(last=False)
    return st


def _index_tensor(args: AttnArgs | None):
    """The tensor a packed or paged problem's block mask is built from (block table, else cu_seqlens_q)."""
    if args is None:
        return None
    return args.block_table if args.block_table is not None else args.cu_seqlens_q


def _call(attend, q, k, v, **kw):
    """The unit torch.compile compiles: flex_attention's call (a copy per problem, see _compiled)."""
    return attend(q, k, v, **kw)


def _compiled(device_type: str):
    """flex_attention compiled for one problem (eager where COMPILED_ON leaves the device out).

    Dynamo keeps compiled graphs per code object, checks them in turn on every call, and past its
    recompile limit (8) runs that code eagerly, unfused, without failing (seen on the H100: 40x
    slower, out of memory on long sequences). So each problem gets a copy of `_call` with a code
    object of its own: one graph per code object, nothing to reset between problems."""
    from torch.nn.attention.flex_attention import flex_attention

    if device_type not in COMPILED_ON:
        return lambda q, k, v, **kw: flex_attention(q, k, v, **kw)
    import torch
    import torch._inductor.config as inductor_config

    if COMPILE_THREADS is not None:
        inductor_config.compile_threads = COMPILE_THREADS
    code = _call.__code__.replace(co_name=f"flex_problem_{next(_NAMES)}")
    fn = types.FunctionType(code, _call.__globals__, code.co_name)
    compiled = torch.compile(fn, dynamic=False)
    return lambda q, k, v, **kw: compiled(flex_attention, q, k, v, **kw)


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
        o = st["fn"](fq, fk, fv, score_mod=st["score_mod"], block_mask=st["block_mask"], scale=scale,
                     enable_gqa=problem.kv_heads != problem.H)
    if st["first_call_s"] is None:
        if q.device.type == "cuda":
            import torch

            torch.cuda.synchronize()
        st["first_call_s"] = first = time.perf_counter() - t0
        if q.device.type in COMPILED_ON:
            _UNSAID["n"] += 1
            _UNSAID["s"] += first
    if problem.layout == "varlen":
        return o.squeeze(0).transpose(0, 1)
    return o


def flex_path(problem: AttentionProblem, q, k, v, attn: AttnArgs | None) -> str:
    """What the flex row ran: compiled or eager, and the one-off costs kept out of its timing."""
    st = _PROBLEMS.get((problem.shape_id, str(q.device)))
    costs = ""
    if st is not None and st["first_call_s"] is not None:
        what = "compile" if q.device.type in COMPILED_ON else "eager"
        costs = f"; first call {st['first_call_s']:.1f} s ({what}), block mask {st['mask_s']:.2f} s, neither timed"
    if _UNSAID["n"]:  # the harness asks once per row, after the row's checks: these are its compiles
        n = _UNSAID["n"]
        costs += (f"; {n} compile{'s' if n != 1 else ''} since the previous flex row (this row's problem and "
                  f"probe shapes not compiled before), {_UNSAID['s']:.1f} s in all")
        _UNSAID.update(n=0, s=0.0)
    if q.device.type == "cuda":
        return "fused: flex_attention compiled to one Triton kernel" + costs
    if q.device.type in COMPILED_ON:
        return f"flex_attention compiled for the {q.device.type} (inductor)" + costs
    return "eager flex_attention on the CPU (unfused reference path)" + costs
