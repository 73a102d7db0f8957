"""Tensors in a problem's layout (dense, packed varlen, paged KV), and attention computed from the definition.

`make_layout_inputs` draws Q, K, V (and dO) in the layout AttentionProblem's docstring gives, with
the index tensors a kernel needs (`AttnArgs`: cu_seqlens, cache lengths, a block table whose blocks
are shuffled in a pool with spare blocks, as a serving system leaves them). `sequence_views` gives
every sequence as plain [heads, tokens, D] tensors whatever the layout, so a reference, a probe or
an error map works on one shape. `reference_forward` is attention straight from the definition,
one sequence and one KV head group at a time: query head h reads KV head h // (H // Hkv), the mask
is faprof.model.mask's rule, a soft-cap c maps scores s to c·tanh(s / c), and a query that sees no
key gets zeros (LSE -inf).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from faprof.errors import FaprofError
from faprof.model.mask import allowed
from faprof.model.problem import AttentionProblem, torch_dtype

#: Spare blocks in a paged pool, as a fraction of the blocks in use: a kernel that ignores the block
#: table (reads blocks in pool order) then reads other sequences' or unused blocks, and is wrong.
SPARE_BLOCK_FRACTION = 0.25


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


def shapes(problem: AttentionProblem) -> dict[str, tuple[int, ...]]:
    """Shapes of q (and o), k and v in the problem's layout (k/v: the pool for a paged cache)."""
    H, Hkv, D = problem.H, problem.kv_heads, problem.D
    if problem.layout == "varlen":
        return {"q": (problem.total_q, H, D), "k": (problem.total_k, Hkv, D)}
    if problem.layout == "paged":
        return {"q": (problem.B, H, problem.Sq, D), "k": (pool_blocks(problem), problem.page_size, Hkv, D)}
    return {"q": (problem.B, H, problem.Sq, D), "k": (problem.B, Hkv, problem.Sk, D)}


def pool_blocks(problem: AttentionProblem) -> int:
    """Blocks in a paged pool: those in use plus SPARE_BLOCK_FRACTION spare ones (at least one)."""
    used = sum(problem.blocks_per_seq())
    return used + max(1, int(used * SPARE_BLOCK_FRACTION))


def index_tensors(problem: AttentionProblem, generator, device) -> AttnArgs:
    """The AttnArgs of `problem`: cu_seqlens for varlen, cache lengths and a shuffled block table for paged."""
    import torch

    args = AttnArgs(problem)

    def i32(values) -> Any:
        return torch.tensor(list(values), dtype=torch.int32).to(device)

    if problem.layout == "varlen":
        args.cu_seqlens_q = i32(_cumsum(problem.q_lens()))
        args.cu_seqlens_k = i32(_cumsum(problem.k_lens()))
    elif problem.layout == "paged":
        blocks = problem.blocks_per_seq()
        order = torch.randperm(pool_blocks(problem), generator=generator)[: sum(blocks)].tolist()
        table = torch.full((problem.B, max(blocks)), -1, dtype=torch.int32)
        start = 0
        for b, n in enumerate(blocks):
            table[b, :n] = torch.tensor(order[start:start + n], dtype=torch.int32)
            start += n
        args.seqlens_k = i32(problem.k_lens())
        args.block_table = table.to(device)
    return args


def _cumsum(lens) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def make_layout_inputs(problem: AttentionProblem, device, generator) -> tuple[Any, Any, Any, Any, AttnArgs]:
    """(q, k, v, dout, args): fresh randn tensors in the problem's layout, drawn in fp32 on the CPU from
    `generator` (reproducible from its seed on any device), then cast and moved."""
    import torch

    if problem.layout == "paged" and problem.direction != "fwd":
        raise FaprofError("a paged KV cache is an inference layout: faprof models its forward pass only "
                          f"(direction 'fwd'), got {problem.direction!r}")
    dt = torch_dtype(problem.dtype)
    sh = shapes(problem)

    def draw(shape):
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dt)

    q, k, v, dout = draw(sh["q"]), draw(sh["k"]), draw(sh["k"]), draw(sh["q"])
    return q, k, v, dout, index_tensors(problem, generator, device)


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
    s = torch.matmul(q, kx.transpose(-2, -1)) * problem.softmax_scale
    if problem.softcap:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    ok = allowed(problem.mask, sq, sk).to(s.device)
    s = s.masked_fill(~ok, float("-inf"))
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


def assemble_kv(problem: AttentionProblem, parts: list):
    """Per-sequence [Hkv, sk_b, D] tensors back into k's layout (dense or varlen; a paged pool has no
    backward in faprof's model)."""
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


def reference_forward(problem: AttentionProblem, q, k, v, args: AttnArgs | None, dev, dt, with_lse: bool = False):
    """Forward of `problem` from the definition on `dev` in `dt`: o in q's layout (and the LSE)."""
    import torch

    outs, lses = [], []
    with torch.no_grad():
        for sv in sequence_views(problem, q, k, v, args):
            o, lse = attend(problem, sv.q.to(dev, dt), sv.k.to(dev, dt), sv.v.to(dev, dt), sv.b, with_lse=True)
            outs.append(o)
            lses.append(lse)
    out = assemble_q(problem, outs)
    return (out, assemble_lse(problem, lses)) if with_lse else out


def reference_backward(problem: AttentionProblem, q, k, v, dout, args: AttnArgs | None, dev, dt):
    """(o, dq, dk, dv) of `problem` from the definition, gradients in q's and k's layouts."""
    import torch

    if problem.layout == "paged":
        raise FaprofError("faprof models the forward pass only for a paged KV cache")
    outs, gq, gk, gv = [], [], [], []
    for sv in sequence_views(problem, q, k, v, args):
        qs, ks, vs = (t.detach().to(dev, dt).requires_grad_(True) for t in (sv.q, sv.k, sv.v))
        with torch.enable_grad():
            o = attend(problem, qs, ks, vs, sv.b)
            dq, dk, dv = torch.autograd.grad(o, (qs, ks, vs), sequence_q(problem, dout, sv.b).to(dev, dt))
        outs.append(o.detach())
        gq.append(dq)
        gk.append(dk)
        gv.append(dv)
    return (assemble_q(problem, outs), assemble_q(problem, gq), assemble_kv(problem, gk),
            assemble_kv(problem, gv))
