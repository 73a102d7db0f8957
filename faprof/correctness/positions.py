"""Where an element of an output sits, in the problem's terms, and every output on one per-sequence grid.

An output comes in the problem's layout (faprof.correctness.layouts): o and dQ like q, dK and dV like k,
the LSE [B, H, Sq] or, packed, [H, total_q]. Whatever the layout, an element is named by

- `b`: its sequence (the batch index of a dense or paged problem, the sequence of a packed batch);
- `h`: its head: the query head for o, dQ and the LSE (with GQA also the KV head h // (H // Hkv)
  it reads), the KV head for dK and dV;
- `row`: the query i within its sequence (o, dQ, LSE) or the key j within its sequence (dK, dV),
  and for a packed batch the token index in the packed tensor;
- `d`: the head-dim column (none for the LSE).

`canonical` puts an output on the grid [B, heads, rows, D'] (rows: the longest sequence's; D' = 1
for the LSE) with `valid` [B, rows] telling real rows from the padding of shorter sequences, so an
error map or a bug signature reads every layout as it reads 2022's [B, H, S, D]. For a dense or
paged problem the grid is the output itself (a view) and `valid` is None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from faprof.model.problem import AttentionProblem

#: Outputs whose rows are keys (the others' rows are queries).
KEY_OUTPUTS = ("dk", "dv")


def dims_of(output: str) -> tuple[str, ...]:
    """Axis letters of an output: (b, h, i, d) for O and dQ, (b, h, j, d) for dK and dV, (b, h, i) for the LSE."""
    if output == "lse":
        return ("b", "h", "i")
    return ("b", "h", "j" if output in KEY_OUTPUTS else "i", "d")


def position(shape: Sequence[int], flat: int) -> tuple[int, ...]:
    """The multi-index of flat index `flat` in a row-major tensor of `shape`."""
    idx = []
    for size in reversed(shape):
        idx.append(int(flat % size))
        flat //= size
    return tuple(reversed(idx))


def row_tile(output: str, tile: tuple[int, int] | None) -> int | None:
    """The tile size along the output's rows: query rows for O, dQ, LSE; keys for dK, dV."""
    if tile is None:
        return None
    return tile[1] if output in KEY_OUTPUTS else tile[0]


def lengths(problem: AttentionProblem | None, output: str) -> tuple[int, ...] | None:
    """Rows of each sequence along the output's rows (query lengths, or key lengths for dK/dV)."""
    if problem is None:
        return None
    return problem.k_lens() if output in KEY_OUTPUTS else problem.q_lens()


def _starts(lens: Sequence[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


@dataclass(frozen=True)
class Place:
    """One element of an output, in the problem's terms."""

    output: str
    b: int
    """Sequence."""
    h: int
    """Query head (o, dq, lse) or KV head (dk, dv)."""
    row: int
    """Query i (o, dq, lse) or key j (dk, dv) within sequence b."""
    d: int | None
    """Head-dim column; None for the LSE."""
    token: int | None = None
    """Index in the packed tensor (varlen), else None."""
    kv_head: int | None = None
    """The KV head query head h reads (GQA query outputs), else None."""


def locate(problem: AttentionProblem, output: str, shape: Sequence[int], flat: int) -> Place | None:
    """The Place of flat index `flat` of `output` (shaped `shape`, the problem's layout); None when the
    shape is not one the layout gives that output."""
    packed = problem.layout == "varlen"
    want = 2 if output == "lse" else (3 if packed else 4)
    if output == "lse" and not packed:
        want = 3
    if len(shape) != want:
        return None
    pos = position(shape, flat)
    d: int | None = None
    token: int | None = None
    if packed:
        if output == "lse":
            h, token = pos
        else:
            token, h, d = pos
        starts = _starts(lengths(problem, output) or ())
        b = max(i for i in range(problem.B) if starts[i] <= token)
        row = token - starts[b]
    else:
        b, h, row = pos[0], pos[1], pos[2]
        d = pos[3] if output != "lse" else None
    kvh = h // problem.group if problem.group > 1 and output not in KEY_OUTPUTS else None
    return Place(output, b, h, row, d, token, kvh)


def describe(problem: AttentionProblem | None, output: str, shape: Sequence[int], flat: int,
             tile: tuple[int, int] | None) -> str:
    """'out[b=1, h=0, i=37, d=5] (query tile 0: rows 0-63)' for flat index `flat` of `output`.

    For a packed batch b is the sequence and i the row within it ('(token 301)' gives the packed
    index); with GQA a query head names its KV head ('h=5 (kv head 1)') and dK/dV name the KV head
    ('kvh=1'). Without a problem (or for 2022's problems) the text is what it always was."""
    if problem is None or not problem.features():
        return _describe_dense(output, shape, flat, tile)
    pl = locate(problem, output, shape, flat)
    if pl is None:
        return f"{output} flat index {flat}"
    head = (f"kvh={pl.h}" if output in KEY_OUTPUTS and problem.group > 1 else
            f"h={pl.h}" + (f" (kv head {pl.kv_head})" if pl.kv_head is not None else ""))
    row = f"{'j' if output in KEY_OUTPUTS else 'i'}={pl.row}"
    parts = [f"b={pl.b}", head, row] + ([f"d={pl.d}"] if pl.d is not None else [])
    text = f"{output}[" + ", ".join(parts) + "]"
    extra = []
    if pl.token is not None:
        extra.append(f"sequence {pl.b}, packed token {pl.token}")
    t = row_tile(output, tile)
    n = (lengths(problem, output) or ())[pl.b]
    if t:
        k = pl.row // t
        noun = "key" if output in KEY_OUTPUTS else "query"
        extra.append(f"{noun} tile {k}: {'keys' if noun == 'key' else 'rows'} {k * t}-{min((k + 1) * t, n) - 1}")
    return text + (f" ({'; '.join(extra)})" if extra else "")


def _describe_dense(output: str, shape: Sequence[int], flat: int, tile: tuple[int, int] | None) -> str:
    dims = dims_of(output)
    if len(shape) != len(dims):
        return f"{output} flat index {flat}"
    pos = position(shape, flat)
    text = f"{output}[" + ", ".join(f"{n}={p}" for n, p in zip(dims, pos, strict=True)) + "]"
    t = row_tile(output, tile)
    if t:
        r = pos[2]
        k = r // t
        noun = "key" if output in KEY_OUTPUTS else "query"
        text += f" ({noun} tile {k}: {'keys' if noun == 'key' else 'rows'} {k * t}-{min((k + 1) * t, shape[2]) - 1})"
    return text


# ------------------------------------------------------------------ the per-sequence grid
def gather_index(problem: AttentionProblem, output: str, device: Any = "cpu") -> tuple[Any, Any]:
    """(index [B, rows] into the packed token axis, valid [B, rows]) of a packed batch's output: row r of
    sequence b is token starts[b] + r where r < its length (index 0 on padding)."""
    import torch

    lens = lengths(problem, output) or ()
    n = max(lens)
    r = torch.arange(n, device=device).unsqueeze(0)
    ln = torch.tensor(lens, device=device).unsqueeze(1)
    st = torch.tensor(_starts(lens)[:-1], device=device).unsqueeze(1)
    valid = r < ln
    return torch.where(valid, st + r, torch.zeros_like(r)), valid


def canonical(problem: AttentionProblem | None, output: str, t: Any, fill: float = 0.0) -> tuple[Any, Any]:
    """(grid [B, heads, rows, D'], valid [B, rows] or None) of an output in the problem's layout.

    D' is 1 for the LSE. Padding rows (past a shorter sequence's end) hold `fill`. Dense and paged
    outputs (and any output without a problem) are returned as views with valid None."""
    import torch

    if problem is None or problem.layout != "varlen":
        return (t.unsqueeze(-1) if t.dim() == 3 else t), None
    idx, valid = gather_index(problem, output, t.device)
    B, n = idx.shape
    if output == "lse":                                   # [H, total_q] -> [B, H, rows, 1]
        g = t[:, idx.reshape(-1)].reshape(t.shape[0], B, n).permute(1, 0, 2).unsqueeze(-1)
    else:                                                 # [total, heads, D] -> [B, heads, rows, D]
        g = t[idx.reshape(-1)].reshape(B, n, t.shape[1], t.shape[2]).permute(0, 2, 1, 3)
    fill_t = torch.full((), fill, dtype=g.dtype, device=g.device) if g.dtype != torch.bool else torch.tensor(bool(fill))
    g = torch.where(valid[:, None, :, None], g, fill_t.to(g.device))
    return g.contiguous(), valid


def output_shape(problem: AttentionProblem, output: str) -> tuple[int, ...]:
    """The shape of `output` in the problem's layout (what a correct variant returns)."""
    H, Hkv, D = problem.H, problem.kv_heads, problem.D
    packed = problem.layout == "varlen"
    if output == "lse":
        return (H, problem.total_q) if packed else (problem.B, H, problem.Sq)
    if output in KEY_OUTPUTS:
        return (problem.total_k, Hkv, D) if packed else (problem.B, Hkv, problem.Sk, D)
    return (problem.total_q, H, D) if packed else (problem.B, H, problem.Sq, D)
