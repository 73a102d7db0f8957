"""Bug signatures of packed (varlen) and paged problems, tested on the whole output in the problem's layout.

Each alternative is the definition (faprof.variants.definition.attention) run on what a buggy kernel
reads, so one code path serves every layout:

- sequence (varlen): sequence b's keys taken from the sequence before it (cu_seqlens_k read one entry
  early: "sequence 3 reads the keys of sequence 2"), its key loop running on to max_seqlen_k into the
  next sequence's keys, or the packed batch attended as one sequence (cu_seqlens ignored);
- paging (paged KV cache): the block table ignored, blocks read in pool order (sequence b's j-th block
  taken as the pool's block (blocks of the sequences before b) + j) or in logical order (pool block j),
  or the cache length ignored (the last, partial block read whole);
- the problem's own fields changed (any layout): the mask aligned to the other corner, a window off by
  one on either side or ignored, the causal mask missing, the soft-cap missing or misapplied (refs.CAP_BUGS),
  a query head reading KV head h % Hkv for K and V, for K only or for V only;
- a sequence's key range crossing into the previous or the next sequence by a few keys, k fitted from
  the data (faprof.correctness.signatures.crossing).

A row is one (token, head) of the output; it is explained by match.explain's rules (wrong, right
against the alternative by the check's own rules, nearer to it, the alternative itself wrong there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from faprof.correctness import errormap, positions
from faprof.correctness.signatures import refs
from faprof.correctness.signatures.case import MIN_SHARE, Signature
from faprof.correctness.signatures.crossing import crossing_signatures
from faprof.correctness.signatures.match import Tol, explain
from faprof.variants.definition import (
    AttnArgs,
    assemble_q,
    attend,
    attention,
    sequence_kv,
    sequence_q,
    sequence_views,
)


def layout_signatures(problem: Any, q: Any, k: Any, v: Any, args: AttnArgs | None, result: Any, ref: Any,
                      atol: float, rtol: float, bound: float = math.nan, check_input: str = "randn",
                      unwritten: Any = None) -> list[Signature]:
    """Every alternative that explains at least MIN_SHARE of the wrong (sequence, head, row) rows of `result`.

    Args:
        problem: the problem (any layout); q, k, v, args: its inputs as the kernel got them.
        result, ref: the kernel's output (poison visible, or give `unwritten`) and the reference, both
            in q's layout or both on the per-sequence grid [B, H, rows, D] (faprof.correctness.positions).
        atol, rtol, bound: the check's per-element rule (bound: FlashAttention's, nan where none).
        unwritten: bool, result's elements still holding the poison (None: read from result's bits).

    Returns:
        Signatures, unranked (faprof.correctness.signatures.rank orders them).
    """
    import torch

    def grid(t: Any) -> tuple[Any, Any]:
        if tuple(t.shape) == tuple(q.shape):  # in the layout: onto the grid (padding rows invalid)
            return positions.canonical(problem, "out", t)
        return t, (None if problem.layout != "varlen" else positions.gather_index(problem, "out", t.device)[1])

    dev, dt = ref.device, ref.dtype
    unw = errormap.unwritten_mask(result) if unwritten is None else unwritten
    r, valid = grid(result.detach().to(dev, dt))
    rf, _ = grid(ref)
    unw, _ = grid(unw.to(dev))
    thr = atol + rtol * rf.abs()
    if math.isfinite(bound):
        thr = thr.clamp(max=bound)
    bad = ~(torch.nan_to_num((r - rf).abs(), nan=math.inf) <= thr)
    if valid is not None:
        bad &= valid.to(dev)[:, None, :, None]
    n_w = int(bad.any(dim=-1).sum())
    if not n_w:
        return []
    qq, kk, vv = (t.detach().to(dev, dt) for t in (q, k, v))
    a = args.to(dev) if args is not None else None
    tol = Tol(atol, rtol, bound if math.isfinite(bound) else math.nan)
    found = []
    for family, kind, title, fn in alternatives(problem, a):
        alt = fn(qq, kk, vv)
        if alt is None:
            continue
        alt_g, _ = positions.canonical(problem, "out", alt)
        st = explain(r, rf, thr, bad, unw.bool(), alt_g, tol)
        if st[1] / n_w < MIN_SHARE:
            continue
        where = _where(st[2])
        found.append(Signature(family, kind, title.format(where=where), "out", check_input, st[1] / n_w, n_w, st[1],
                               st[3], st[4], f"rows of {where}"))
    if problem.layout == "varlen":
        found += crossing_signatures(problem, qq, kk, vv, (r, rf, thr, bad, unw.bool()), tol, _where, check_input)
    return found


Alternative = tuple[str, str, str, Callable[[Any, Any, Any], Any]]


def alternatives(problem: Any, args: AttnArgs | None) -> list[Alternative]:
    """(family, kind, title with {where}, fn(q, k, v) -> the output a kernel with that bug gives)."""
    out: list[Alternative] = []
    if problem.layout == "varlen":
        out += _varlen(problem)
    if problem.layout == "paged" and args is not None and args.block_table is not None:
        out += _paged(problem, args)
    out += _fields(problem, args)
    return out


def _per_sequence(problem: Any, keys: Callable[[Any, int], Any]) -> Callable[[Any, Any, Any], Any]:
    """fn(q, k, v): each sequence's queries against the key/value rows keys(t, b) picks from k and v."""
    def fn(q: Any, k: Any, v: Any) -> Any:
        parts = [attend(problem, sequence_q(problem, q, b), keys(k, b), keys(v, b)) for b in range(problem.B)]
        return assemble_q(problem, parts)
    return fn


def _varlen(p: Any) -> list[Alternative]:
    lens = p.k_lens()
    starts = [sum(lens[:b]) for b in range(p.B)]

    def previous(t: Any, b: int) -> Any:
        return sequence_kv(p, t, max(b - 1, 0))

    def run_on(t: Any, b: int) -> Any:
        return t[starts[b]:starts[b] + p.Sk].transpose(0, 1)

    def whole(q: Any, k: Any, v: Any) -> Any:
        one = p.with_(B=1, Sq=p.total_q, Sk=p.total_k, seqlens_q=(p.total_q,), seqlens_k=(p.total_k,))
        return attention(one, q, k, v, None)

    out: list[Alternative] = []
    if p.B > 1:
        out.append(("sequence", "keys_of_previous", "{where} read the keys of the sequence before them "
                    "(cu_seqlens_k read one entry early: sequence b attends to sequence b-1's keys)", _per_sequence(p, previous)))
        out.append(("sequence", "keys_run_on", f"{{where}} read on into the next sequence's keys (the key loop runs to "
                    f"max_seqlen_k = {p.Sk}, not the sequence's own length)", _per_sequence(p, run_on)))
        out.append(("sequence", "one_sequence", "the packed batch attended as one sequence (cu_seqlens ignored): "
                    "{where} see the keys of the sequences packed before them", whole))
    return out


def _paged(p: Any, args: AttnArgs) -> list[Alternative]:
    import torch

    blocks = p.blocks_per_seq()
    table = args.block_table
    pool_order = torch.full_like(table, -1)
    logical = torch.full_like(table, -1)
    start = 0
    for b, n in enumerate(blocks):
        pool_order[b, :n] = torch.arange(start, start + n, dtype=table.dtype)
        logical[b, :n] = torch.arange(n, dtype=table.dtype)
        start += n

    def with_table(t: Any, prob: Any = p) -> Callable[[Any, Any, Any], Any]:
        def fn(q: Any, k: Any, v: Any) -> Any:
            if torch.equal(t, table) and prob is p:
                return None
            return attention(prob, q, k, v, AttnArgs(prob, seqlens_k=args.seqlens_k, block_table=t))
        return fn

    full = tuple(n * p.page_size for n in blocks)
    out: list[Alternative] = [
        ("paging", "pool_order", "block table ignored: {where} read their blocks in pool order (the sequences' blocks "
         "taken as laid out one after another) instead of through the table", with_table(pool_order)),
        ("paging", "logical_order", "block table ignored: {where} read pool blocks 0, 1, ... (the logical block index "
         "used as the pool block)", with_table(logical)),
    ]
    if full != p.k_lens():
        longer = p.with_(seqlens_k=full, Sk=max(full))
        out.append(("paging", "last_block_whole", f"cache length ignored: {{where}} read their last block whole "
                    f"({p.page_size} keys, past the cache length)", with_table(table, longer)))
    return out


def _fields(p: Any, args: AttnArgs | None) -> list[Alternative]:
    """The problem's own fields changed: mask corner, window sides, causal, soft-cap, the GQA head mapping."""
    import torch

    out: list[Alternative] = []

    def changed(prob: Any) -> Callable[[Any, Any, Any], Any]:
        def fn(q: Any, k: Any, v: Any) -> Any:
            a = None if args is None else AttnArgs(prob, args.cu_seqlens_q, args.cu_seqlens_k, args.seqlens_k,
                                                   args.block_table)
            return attention(prob, q, k, v, a)
        return fn

    other = "top_left" if p.mask_align == "bottom_right" else "bottom_right"
    if (p.causal or p.window is not None) and any(a != b for a, b in zip(p.q_lens(), p.k_lens(), strict=True)):
        out.append(("causal_mask" if p.causal else "window", f"mask_{other}", f"mask aligned {other.replace('_', '-')} "
                    f"instead of {p.mask_align.replace('_', '-')} in {{where}}", changed(p.with_(mask_align=other))))
    if p.causal:
        out.append(("causal_mask", "mask_missing", "causal mask missing in {where}", changed(p.with_(causal=False))))
    if p.window is not None:
        left, right = p.window
        for side, val in (("left", left), ("right", right)):
            for d, word in ((1, "plus"), (-1, "minus")):
                if val < 0 or val + d < 0:
                    continue
                w = (val + d, right) if side == "left" else (left, val + d)
                out.append(("window", f"window_{side}_{word}", f"window off by one on the {side} ({w[0]}, {w[1]} instead "
                            f"of {left}, {right}) in {{where}}", changed(p.with_(window=w))))
        out.append(("window", "window_ignored", "sliding window ignored in {where}", changed(p.with_(window=None))))
    if p.softcap:
        out.append(("softcap", "softcap_missing", "logit soft-cap missing in {where}", changed(p.with_(softcap=0.0))))
        out += _softcap(p, args)
    if p.group > 1:
        heads = torch.tensor([h % p.kv_heads for h in range(p.H)])
        mine = torch.tensor([h // p.group for h in range(p.H)])
        axis = 2 if p.layout == "paged" else 1
        mha = p.with_(Hkv=None)

        def modulo(k_wrong: bool, v_wrong: bool) -> Callable[[Any, Any, Any], Any]:
            def fn(q: Any, k: Any, v: Any) -> Any:
                kx, vx = (t.index_select(axis, (heads if wrong else mine).to(t.device))
                          for t, wrong in ((k, k_wrong), (v, v_wrong)))
                return changed(mha)(q, kx, vx)
            return fn

        out.append(("kv_head", "kv_head_modulo", f"query head h reads KV head h % Hkv instead of h // {p.group} "
                    "in {where}", modulo(True, True)))
        out.append(("kv_head", "k_head_modulo", f"query head h reads its K from KV head h % Hkv instead of h // {p.group} "
                    "in {where}; its V from the right one", modulo(True, False)))
        out.append(("kv_head", "v_head_modulo", f"query head h reads its V from KV head h % Hkv instead of h // {p.group} "
                    "in {where}; its K from the right one", modulo(False, True)))
    return out


def _softcap(p: Any, args: AttnArgs | None) -> list[Alternative]:
    """The soft-cap misapplied (refs.CAP_BUGS) in any layout: the definition, one sequence at a time, with the
    scores capped the way the bug caps them."""
    import torch

    from faprof.model.mask import allowed

    def capped(bug: str) -> Callable[[Any, Any, Any], Any]:
        def fn(q: Any, k: Any, v: Any) -> Any:
            parts = []
            for sv in sequence_views(p, q, k, v, args):
                sq, sk = sv.q.shape[-2], sv.k.shape[-2]
                ok = allowed(p.mask, sq, sk).to(q.device)
                kx, vx = (t.repeat_interleave(p.group, dim=0) for t in (sv.k, sv.v))
                o = refs.attend(sv.q, kx, vx, p.softmax_scale, ok, softcap=p.softcap, cap_bug=bug)["out"]
                parts.append(torch.nan_to_num(o, nan=0.0))  # a query that sees no key: zeros
            return assemble_q(p, parts)
        return fn

    masked = p.causal or p.window is not None
    out: list[Alternative] = [
        ("softcap", "softcap_unscaled", "logit soft-cap applied before the softmax scale (c·tanh(q·k / c)·scale) in "
         "{where}", capped("unscaled")),
        ("softcap", "softcap_scaled_twice", "softmax scale applied inside and outside the soft-cap "
         "(c·tanh(scale·q·k / c)·scale) in {where}", capped("scaled_twice")),
        ("softcap", "softcap_on_probs", "logit soft-cap applied to the probabilities instead of the scores in {where}",
         capped("on_probs")),
    ]
    if masked:
        out.append(("softcap", "softcap_after_mask", "logit soft-cap applied after the mask in {where}: masked keys "
                    "score -c instead of -inf and get weight", capped("after_mask")))
    return out


def _where(expl: Any) -> str:
    """'sequences 1-3' (the sequences whose rows the alternative explains: expl [B, H, rows]), or 'every sequence'."""
    got = expl.any(dim=(1, 2)).nonzero().flatten().tolist()
    if len(got) == expl.shape[0] and expl.shape[0] > 1:
        return "every sequence"
    return f"sequence{'s' if len(got) != 1 else ''} {errormap.ranges(got)}"
