"""Bug signatures of a packed (varlen) batch whose key range crosses a sequence boundary by a few keys.

A kernel that locates a sequence's keys a few tokens off (an offset off by k, a start rounded down to
an aligned address and not masked, an end past the sequence's last key) reads some keys of the sequence
before or after it. Four key ranges, for sequence b with keys [start, end) in the packed k and v:

- its range starts k keys early and ends right: it also reads the previous sequence's last k keys,
  at positions -k..-1 (before every query's diagonal: a causal bound lets them through, a window's
  left bound only where it reaches them);
- it starts right and ends k keys late: it also reads the next sequence's first k keys, at positions
  past its last one (seen only where the mask reaches past the last key);
- its key offset is k tokens early (or late): [start - k, end - k) at positions 0..len-1, the
  neighbour's k keys in place of its own last (first) k.

k is fitted per sequence on a few wrong rows (FIT_ROWS, of at most MAX_SLICES sequences, CROSS_MAX
tried), then the k of every sequence is taken from the pattern the fitted ones follow (one k for all;
the start rounded down to a multiple of t, k = start mod t) and the whole output is tested against
that alternative by match.explain's rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faprof.correctness.signatures.case import MAX_SLICES, MIN_SHARE, Signature
from faprof.correctness.signatures.match import Tol, close_to
from faprof.model.mask import allowed_rows
from faprof.model.scores import scores
from faprof.variants.definition import assemble_q, attend, sequence_kv, sequence_q

#: The largest k (keys across the boundary) fitted.
CROSS_MAX = 64

#: k is fitted on this many wrong rows of each examined sequence (spread over them), in the heads wrong there.
FIT_ROWS = 4

#: ... in at most this many of those heads.
FIT_HEADS = 2

#: Alignments a kernel may round a sequence's key start down to (k = start mod t, the keys before the start masked off
#: by nobody).
ALIGNMENTS = (8, 16, 32, 64, 128)

#: Key ranges: name -> fn(start, end, k) -> (first packed key, end, position of the first key).
RANGES: dict[str, Callable[[int, int, int], tuple[int, int, int]]] = {
    "crosses_into_previous": lambda s, e, k: (s - k, e, -k),
    "crosses_into_next": lambda s, e, k: (s, e + k, 0),
    "offset_early": lambda s, e, k: (s - k, e - k, 0),
    "offset_late": lambda s, e, k: (s + k, e + k, 0),
}


def crossing_signatures(problem: Any, q: Any, k: Any, v: Any, grid: tuple[Any, Any, Any, Any, Any], tol: Tol,
                        where: Callable[[Any], str], check_input: str = "randn") -> list[Signature]:
    """The key ranges crossing a sequence boundary by k keys that explain the wrong rows of a packed forward.

    Args:
        problem: a varlen problem with B > 1; q, k, v: its packed inputs at the reference's precision.
        grid: (r, ref, thr, bad, unwritten) of the output on the per-sequence grid [B, H, rows, D].
        tol: the check's rule; where: expl [B, H, rows] -> 'sequences 1-3'.

    Returns:
        A 'sequence' signature per key range (RANGES) explaining at least MIN_SHARE of the wrong rows.
    """
    from faprof.correctness.signatures.match import explain

    if problem.layout != "varlen" or problem.B < 2 or problem.direction != "fwd":
        return []
    r, ref, thr, bad, unw = grid
    wrong = bad.any(dim=-1)
    n_w = int(wrong.sum())
    if not n_w:
        return []
    seqs = wrong.any(dim=(1, 2)).nonzero().flatten()
    if seqs.numel() > MAX_SLICES:
        seqs = seqs[_spread(seqs.numel(), MAX_SLICES)]
    starts = _starts(problem.k_lens())
    found = []
    for name, (family, kind, title) in _titles().items():
        fitted = {}
        for b in seqs.tolist():
            kb = _fit(problem, q, k, v, b, name, r[b], wrong[b], tol, ref[b], starts)
            if kb:
                fitted[b] = kb
        if not fitted:
            continue
        ks, pattern = _pattern(fitted, starts, problem.B, name)
        alt, _ = _grid_of(problem, _alternative(problem, q, k, v, name, ks, starts))
        st = explain(r, ref, thr, bad, unw, alt, tol)
        if st[1] / n_w < MIN_SHARE:
            continue
        text = title.format(where=where(st[2]), k=_k_text(ks, st[2]), pattern=pattern)
        found.append(Signature(family, kind, text, "out", check_input, st[1] / n_w, n_w, st[1], st[3], st[4],
                               f"rows of {where(st[2])}; keys crossed per sequence (sequence: k): {_k_list(ks)}"))
    return found


def _titles() -> dict[str, tuple[str, str, str]]:
    """The key ranges (RANGES) a kernel crossing a sequence boundary reads, each as (family, kind, title): {where}
    is filled with the sequences explained, {k} with the keys crossed, {pattern} with how k follows the start."""
    return {
        "crosses_into_previous": ("sequence", "crosses_into_previous", "{where} also read the last {k} of the sequence before them "
                                  "(the key range starts {k} early{pattern})"),
        "crosses_into_next": ("sequence", "crosses_into_next", "{where} also read the first {k} of the sequence after them (the key "
                              "range ends {k} late{pattern})"),
        "offset_early": ("sequence", "offset_early", "{where} read their keys from {k} early (the key offset is {k} before the "
                         "sequence's start{pattern}: the previous sequence's last keys in place of their own last ones)"),
        "offset_late": ("sequence", "offset_late", "{where} read their keys from {k} late (the key offset is {k} past the "
                        "sequence's start{pattern}: the next sequence's first keys in place of their own first ones)"),
    }


def _starts(lens: Any) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _spread(n: int, m: int) -> Any:
    import torch

    return torch.linspace(0, n - 1, m).round().long()


def _keys(problem: Any, name: str, b: int, k: int, starts: list[int]) -> tuple[int, int, int]:
    """(first packed key, end, position of the first key) sequence b reads under key range `name`, clipped
    to the packed keys (a read before the first or past the last token reads nothing)."""
    lo, hi, pos = RANGES[name](starts[b], starts[b + 1], k)
    cut = max(0, -lo)
    lo, pos = lo + cut, pos + cut
    return lo, max(lo, min(hi, starts[-1])), pos


def _attend_range(problem: Any, qb: Any, k: Any, v: Any, lo: int, hi: int, pos0: int, rows: Any, sq: int, sk: int,
                  heads: Any = None) -> Any:
    """[heads, rows, D]: query rows `rows` of a sequence (qb [H, rows, D]) attending to packed keys lo..hi-1 at
    positions pos0.. under the problem's mask, scale and soft-cap (the definition's rule; no key: zeros)."""
    import torch

    H = problem.H
    group = H // problem.kv_heads
    h = torch.arange(H, device=qb.device) if heads is None else heads
    kk = k[lo:hi].transpose(0, 1)[h // group]  # [heads, n, D]: each query head's KV head
    vv = v[lo:hi].transpose(0, 1)[h // group]
    pos = torch.arange(pos0, pos0 + (hi - lo), device=qb.device)  # the keys' positions in sequence b
    ok = allowed_rows(problem.mask, rows.to(qb.device), sq, sk, keys=pos)
    s = scores(qb, kk, problem.softmax_scale, softcap=problem.softcap, allowed=ok)
    p = torch.softmax(s, dim=-1)
    p = torch.where(ok.any(dim=-1, keepdim=True), p, torch.zeros_like(p))
    return torch.matmul(p, vv)


def _fit(problem: Any, q: Any, k: Any, v: Any, b: int, name: str, r: Any, wrong: Any, tol: Tol, ref: Any,
         starts: list[int]) -> int:
    """The smallest k (1..CROSS_MAX) under which sequence b's fit rows are right against key range `name`, or 0."""
    sq, sk = problem.q_lens()[b], problem.k_lens()[b]
    rows = wrong[:, :sq].any(dim=0).nonzero().flatten()
    if rows.numel() == 0:
        return 0
    rows = rows[_spread(rows.numel(), min(FIT_ROWS, rows.numel()))]
    heads = wrong[:, rows].any(dim=1).nonzero().flatten()[:FIT_HEADS]
    qb = sequence_q(problem, q, b)[heads][:, rows]
    rr, rf = r[heads][:, rows], ref[heads][:, rows]
    limit = starts[b] if name in ("crosses_into_previous", "offset_early") else starts[-1] - starts[b + 1]
    for kk in range(1, min(CROSS_MAX, limit) + 1):
        lo, hi, pos0 = _keys(problem, name, b, kk, starts)
        alt = _attend_range(problem, qb, k, v, lo, hi, pos0, rows, sq, sk, heads)
        if bool(close_to(rr, alt, rf, tol).all()):
            return kk
    return 0


def _pattern(fitted: dict[int, int], starts: list[int], B: int, name: str) -> tuple[list[int], str]:
    """(k of every sequence, words for the pattern): one k for all, or the start rounded down to a multiple of t
    (the early ranges), else the fitted sequences' k (0 for the others)."""
    early = name in ("crosses_into_previous", "offset_early")
    # the keys there are to cross into: reading more past the packed keys reads nothing more (an offset moves the
    # positions too, so it is kept whole)
    room = [starts[b] if early else starts[-1] - starts[b + 1] for b in range(B)]
    ks = set(fitted.values())
    if len(ks) == 1:
        k = ks.pop()
        return [min(k, room[b]) if name.startswith("crosses") else k for b in range(B)], ""
    if early:
        for t in ALIGNMENTS:
            if all(starts[b] % t == kb for b, kb in fitted.items()):
                return [starts[b] % t for b in range(B)], (f": the start rounded down to a multiple of {t}, "
                                                          f"k = cu_seqlens_k[b] mod {t}")
    return [fitted.get(b, 0) for b in range(B)], ""


def _alternative(problem: Any, q: Any, k: Any, v: Any, name: str, ks: list[int], starts: list[int]) -> Any:
    """The output in q's layout with sequence b reading key range `name` moved by ks[b] keys (0: its own)."""
    import torch

    parts = []
    for b in range(problem.B):
        sq, sk = problem.q_lens()[b], problem.k_lens()[b]
        qb = sequence_q(problem, q, b)
        if not ks[b]:
            parts.append(attend(problem, qb, sequence_kv(problem, k, b), sequence_kv(problem, v, b)))
            continue
        lo, hi, pos0 = _keys(problem, name, b, ks[b], starts)
        parts.append(_attend_range(problem, qb, k, v, lo, hi, pos0, torch.arange(sq), sq, sk))
    return assemble_q(problem, parts)


def _grid_of(problem: Any, t: Any) -> tuple[Any, Any]:
    from faprof.correctness import positions

    return positions.canonical(problem, "out", t)


def _k_text(ks: list[int], expl: Any) -> str:
    """'3 keys', or '1-7 keys' over the sequences the alternative explains rows of."""
    got = sorted({ks[b] for b in expl.any(dim=(1, 2)).nonzero().flatten().tolist() if ks[b]})
    if not got:
        got = sorted({x for x in ks if x})
    if len(got) == 1:
        return f"{got[0]} key{'s' if got[0] != 1 else ''}"
    return f"{got[0]}-{got[-1]} keys"


def _k_list(ks: list[int]) -> str:
    """'0: 0, 1: 3, 2: 3' (sequence: k), the first 8."""
    return ", ".join(f"{b}: {x}" for b, x in enumerate(ks[:8])) + (", ..." if len(ks) > 8 else "")
