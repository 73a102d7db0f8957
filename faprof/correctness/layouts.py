"""Tensors in a problem's layout (dense, packed varlen, paged KV), and attention computed from the definition.

(The definition itself, `attend` and the per-sequence views, lives in faprof.variants.definition so
the torch baselines share it; import those names from there.)

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

from typing import Any

from faprof.errors import FaprofError
from faprof.model.problem import AttentionProblem, torch_dtype
from faprof.variants.definition import AttnArgs, assemble_lse, assemble_q, attend, sequence_views

#: Spare blocks in a paged pool, as a fraction of the blocks in use: a kernel that ignores the block
#: table (reads blocks in pool order) then reads other sequences' or unused blocks, and is wrong.
SPARE_BLOCK_FRACTION = 0.25


def shapes(problem: AttentionProblem) -> dict[str, tuple[int, ...]]:
    """Shapes of q (and o), k and v in the problem's layout (k/v: the pool for a paged cache)."""
    H, Hkv, D = problem.H, problem.kv_heads, problem.D
    if problem.layout == "varlen":
        return {"q": (problem.total_q, H, D), "k": (problem.total_k, Hkv, D)}
    if problem.layout == "paged":
        return {"q": (problem.B, H, problem.Sq, D), "k": (pool_blocks(problem), problem.page_size, Hkv, D)}
    return {"q": (problem.B, H, problem.Sq, D), "k": (problem.B, Hkv, problem.Sk, D)}


def pool_blocks(problem: AttentionProblem) -> int:
    """Blocks in a paged pool: the problem's pool_blocks, else those in use plus SPARE_BLOCK_FRACTION spare
    ones (at least one)."""
    if problem.pool_blocks:
        return problem.pool_blocks
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
        table = torch.full((problem.B, max(blocks)), -1, dtype=torch.int32)
        if problem.block_table is not None:  # the user's table, as a serving system left it
            for b, n in enumerate(blocks):
                table[b, :n] = torch.tensor(problem.block_table[b][:n], dtype=torch.int32)
        else:
            order = torch.randperm(pool_blocks(problem), generator=generator)[: sum(blocks)].tolist()
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
