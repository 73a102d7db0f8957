"""Attention from its definition for every problem faprof models, and the per-sequence views it needs.

The one statement of what attention computes, for the oracle (faprof.correctness) and for the torch
baselines alike: query head h reads KV head h // (H // Hkv), the scores (scale, soft-cap c·tanh(s / c),
the mask: faprof.model.mask's rule) are faprof.model.scores', and a query that sees no key gets zeros
(LSE -inf), as FlashAttention defines it. `sequence_views` gives every sequence of a dense, packed
(varlen) or paged problem as plain [heads, tokens, D] tensors; `attention` runs the definition one
sequence at a time and puts the result back in the problem's layout (differentiable: autograd gives
the backward).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from faprof.model.mask import allowed
from faprof.model.problem import AttentionProblem
from faprof.model.scores import masked, scores


@dataclass
class AttnArgs:
    """What a kernel needs beyond q, k, v for a problem that is not 2022's (passed as `attn=`)."""

    problem: AttentionProblem
    cu_seqlens_q: Any = None
    """int32 [B + 1]: start of each sequence's queries in the packed q (varlen), else None."""
    cu_seqlens_k: Any = None
    """int32 [B + 1]: start of each sequence's keys in the packed k and v (varlen), else None."""
    seqlens_k: Any = None
    """int32 [B]: tokens in each sequence's cache (paged), else None."""
    block_table: Any = None
    """int32 [B, max_blocks]: pool block of each sequence's j-th block (paged; unused entries -1), else None."""

    @property
    def max_seqlen_q(self) -> int:
        return self.problem.Sq

    @property
    def max_seqlen_k(self) -> int:
        return self.problem.Sk

    @property
    def window(self) -> tuple[int, int]:
        """(left, right), -1 for unbounded: FlashAttention's window_size."""
        return self.problem.window if self.problem.window is not None else (-1, -1)

    @property
    def bottom_right(self) -> bool:
        return self.problem.mask_align == "bottom_right"

    @property
    def softcap(self) -> float:
        return self.problem.softcap

    @property
    def kv_heads(self) -> int:
        return self.problem.kv_heads

    def to(self, device) -> AttnArgs:
        """The same arguments with every tensor on `device`."""
        def mv(t):
            return t.to(device) if t is not None else None

        return AttnArgs(self.problem, mv(self.cu_seqlens_q), mv(self.cu_seqlens_k), mv(self.seqlens_k),
                        mv(self.block_table))


# ------------------------------------------------------------------ per-sequence views
@dataclass
class SeqView:
    """One sequence's tensors as [heads, tokens, D] (views or gathered copies)."""

    b: int
    q: Any
    k: Any
    v: Any


def sequence_q(problem: AttentionProblem, t, b: int):
    """Sequence b of a tensor in q's layout (q, o, dO, dQ) as [H, sq_b, D] (a view)."""
    if problem.layout == "varlen":
        start = sum(problem.q_lens()[:b])
        return t[start:start + problem.q_lens()[b]].transpose(0, 1)
    return t[b]


def sequence_kv(problem: AttentionProblem, t, b: int, block_table=None):
    """Sequence b of a tensor in k's layout as [Hkv, sk_b, D] (a view, or a gather for a paged pool)."""
    if problem.layout == "varlen":
        start = sum(problem.k_lens()[:b])
        return t[start:start + problem.k_lens()[b]].transpose(0, 1)
    if problem.layout == "paged":
        n = problem.blocks_per_seq()[b]
        idx = block_table[b, :n].long().to(t.device)
        flat = t[idx].reshape(n * problem.page_size, problem.kv_heads, problem.D)
        return flat[: problem.k_lens()[b]].transpose(0, 1)
    return t[b]


def sequence_views(problem: AttentionProblem, q, k, v, args: AttnArgs | None) -> Iterator[SeqView]:
    """Every sequence's q [H, sq, D], k and v [Hkv, sk, D], whatever the layout."""
    table = args.block_table if args is not None else None
    for b in range(problem.B):
        yield SeqView(b, sequence_q(problem, q, b), sequence_kv(problem, k, b, table),
                      sequence_kv(problem, v, b, table))


# ------------------------------------------------------------------ the definition
def attend(problem: AttentionProblem, q, k, v, b: int = 0, with_lse: bool = False):
    """Attention of one sequence from the definition: q [H, sq, D], k and v [Hkv, sk, D] -> o [H, sq, D]
    (and the natural-log LSE [H, sq], -inf where a query sees no key). Differentiable (autograd)."""
    import torch

    sq, sk = q.shape[-2], k.shape[-2]
    group = q.shape[0] // k.shape[0]
    kx = k.repeat_interleave(group, dim=0) if group > 1 else k   # query head h reads KV head h // group
    vx = v.repeat_interleave(group, dim=0) if group > 1 else v
    s = scores(q, kx, problem.softmax_scale, softcap=problem.softcap)
    ok = allowed(problem.mask, sq, sk).to(s.device)  # built on the CPU while the GPU computes s
    s = masked(s, ok)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.where(ok.any(dim=-1, keepdim=True), p, torch.zeros_like(p))  # empty rows: zeros, not NaN
    o = torch.matmul(p, vx)
    return (o, lse) if with_lse else o


def assemble_q(problem: AttentionProblem, parts: list, like=None):
    """Per-sequence [H, sq_b, D] tensors back into q's layout."""
    import torch

    if problem.layout == "varlen":
        return torch.cat([p.transpose(0, 1) for p in parts], dim=0)
    return torch.stack(parts)


def assemble_lse(problem: AttentionProblem, parts: list):
    """Per-sequence LSE [H, sq_b] into the LSE layout: [B, H, Sq] (dense, paged) or [H, total_q] (varlen,
    FlashAttention's)."""
    import torch

    if problem.layout == "varlen":
        return torch.cat(parts, dim=1)
    return torch.stack(parts)


def attention(problem: AttentionProblem, q, k, v, args: AttnArgs | None):
    """Attention of `problem` in its layout, from the definition, in q's dtype and device (differentiable)."""
    parts = [attend(problem, sv.q, sv.k, sv.v, sv.b) for sv in sequence_views(problem, q, k, v, args)]
    return assemble_q(problem, parts)
