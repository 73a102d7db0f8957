"""Bug signatures of where the work sits: slices written at another slice's rows, results that depend on the index.

Two tests, both of relationships a kernel's output has with its position rather than its data:

- offsets (on the whole run's output): a kernel computes the first row of its (b, h) slice in the
  flattened [B·H·S, D] tensors with a formula other than (b·H + h)·S (OFFSETS: the batch index added
  unscaled, as the TMA path of Triton's fused-attention tutorial does; dropped; the head's likewise;
  a batch stride of S). Under each formula, used for the loads and the store (the CTA computes a
  shifted virtual slice and writes it there) or for the store only (a right answer written at the
  wrong rows), every examined output row has the CTAs that write it and the value each writes. A wrong
  row is explained when it holds one of them (two writers: the order they land in decides, so either
  is consistent), or when no CTA writes it and it still holds the poison. The rows two CTAs write
  (the overlap) and the rows nobody writes are named with the formula.
- slices (from the probes that run the same inputs at B=1 and at H=1, faprof.correctness.adversarial): a
  batch (head) wrong in the whole run and right when run alone depends on the batch (head) index or on
  other slices' work, not on its data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from faprof.correctness import errormap
from faprof.correctness.signatures.case import MIN_SHARE, Case, Signature, Slices, err_sliced, sliced
from faprof.correctness.signatures.match import explain, rows_text, tol_of
from faprof.correctness.signatures.refs import attend, true_mask
from faprof.correctness.signatures.stride import STRIDE_MIN_ROWS, wrong_row_share

#: Row offsets a kernel may compute for slice (b, h) of a [B, H, S, D] tensor seen as [B·H·S, D], besides
#: (b·H + h)·S: name -> (offset(b, h, H, S), what the formula does).
OFFSETS: dict[str, tuple[Callable[[int, int, int, int], int], str]] = {
    "batch_unscaled": (lambda b, h, H, S: b + h * S,
                       "the row offset adds the batch index unscaled: b + h·S instead of (b·H + h)·S"),
    "batch_dropped": (lambda b, h, H, S: h * S, "the row offset drops the batch index: h·S instead of (b·H + h)·S"),
    "head_unscaled": (lambda b, h, H, S: b * H * S + h,
                      "the row offset adds the head index unscaled: b·H·S + h instead of (b·H + h)·S"),
    "head_dropped": (lambda b, h, H, S: b * H * S, "the row offset drops the head index: b·H·S instead of (b·H + h)·S"),
    "batch_stride": (lambda b, h, H, S: (b + h) * S, "the batch stride is S instead of H·S: (b + h)·S instead of (b·H + h)·S"),
}

#: How a wrong offset is used: for the loads and the store, or for the store only.
MODES = {"both": "for its loads and its store", "store": "for its store only (the answer is right, its rows are not)"}

#: An offset signature must explain at least this share of its rows by a value some CTA writes there: rows
#: explained only by being unwritten are the 'unwritten' signature's, whatever moved the work.
MIN_WRITTEN_SHARE = 0.1

#: The probes that run the randn inputs sliced (faprof.correctness.adversarial): probe -> (axis, letter).
SLICE_PROBES = {"slice_b1": ("batch", "B"), "slice_h1": ("head", "H")}


def placement_signatures(case: Case, s: Slices) -> list[Signature]:
    """The offset formula that explains the wrong output rows best, if any explains MIN_SHARE of them.

    Args:
        case: the wrong outputs under test (a dense forward problem with B·H >= 2); s: the slices examined.

    Returns:
        One 'placement' signature, or none.
    """
    import torch

    p = case.problem
    oe = case.errors.get("out")
    if (p.direction != "fwd" or oe is None or oe.n_bad == 0 or p.B * p.H < 2 or p.layout != "dense"
            or case.q is None or wrong_row_share(oe, s) < STRIDE_MIN_ROWS):
        return []
    B, H, Sq = p.B, p.H, p.Sq
    ctas = [(b, h) for b in range(B) for h in range(H)]
    truth = torch.tensor([(b * H + h) * Sq for b, h in ctas])
    best: tuple[int, str, str, Any, Any] | None = None
    for name, (fn, _) in OFFSETS.items():
        o_store = torch.tensor([fn(b, h, H, Sq) for b, h in ctas])
        if torch.equal(o_store, truth):
            continue
        for mode in MODES:
            expl, n_written = _test(case, s, oe, ctas, o_store, mode, fn)
            n_e = int(expl.sum())
            if n_e and n_written >= MIN_WRITTEN_SHARE * n_e and (best is None or n_e > best[0]):
                best = (n_e, name, mode, expl, o_store)
    if best is None:
        return []
    n_e, name, mode, expl, o_store = best
    n_w = int(sliced(oe, s)[3].any(dim=-1).sum())
    if n_e / n_w < MIN_SHARE:
        return []
    overlap = _overlap(o_store, Sq)
    title = f"{_landing(ctas, o_store, B, H, Sq)} ({OFFSETS[name][1]}, {MODES[mode]})"
    if overlap:
        title += "; two CTAs write the same rows (which lands last can change from call to call)"
    lost = _never_written(o_store, B, H, Sq)
    if lost:
        title += f"; {lost} never written"
    kind = f"offset_{name}_{mode}" + ("_overlap" if overlap else "")
    return [Signature("placement", kind, title, "out", case.check_input, n_e / n_w, n_w, n_e,
                      float(err_sliced(oe, s)[expl].max()), math.nan, rows_text(expl, s, "out"))]


def _test(case: Case, s: Slices, oe: Any, ctas: list[tuple[int, int]], o_store: Any, mode: str,
          fn: Callable[[int, int, int, int], int]) -> tuple[Any, int]:
    """(rows explained [n, R], how many of them by a written value) under one offset formula and mode."""
    import torch

    p = case.problem
    r, ref, thr, bad, unw = sliced(oe, s)
    dev = ref.device
    Sq, H = p.Sq, p.H
    rows = s.rows.to(dev) if s.rows is not None else torch.arange(Sq, device=dev)
    flat = ((s.b.to(dev) * H + s.h.to(dev)) * Sq)[:, None] + rows[None, :]  # [n, R] flat rows examined
    local = flat[None] - o_store.to(dev)[:, None, None]  # [C, n, R]: the CTA's row writing there
    writes = (local >= 0) & (local < Sq)
    wrong = bad.any(dim=-1)
    expl = torch.zeros_like(wrong)
    written = torch.zeros_like(wrong)
    idx = writes.nonzero()  # (cta, slice, row) of every write into an examined row
    if idx.numel():
        vals = _values(case, oe, ctas, idx, local, mode, fn)
        # the k-th writer of each examined row: slot = how many writers of that row come before it
        key = idx[:, 1] * wrong.shape[1] + idx[:, 2]
        order = torch.argsort(key, stable=True)
        key_s = key[order]
        first = torch.ones_like(key_s, dtype=torch.bool)
        first[1:] = key_s[1:] != key_s[:-1]
        pos = torch.arange(key_s.numel(), device=dev)
        start = torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), dim=0).values
        slot = torch.empty_like(pos)
        slot[order] = pos - start
        tol = tol_of(case, oe)
        for k in range(int(slot.max()) + 1):
            alt = ref.clone()  # rows without a k-th writer: the truth, which explains nothing
            sel = slot == k
            alt[idx[sel, 1], idx[sel, 2]] = vals[sel]
            written |= explain(r, ref, thr, bad, unw, alt, tol)[2]
        expl |= written
    expl |= ~writes.any(dim=0) & wrong & unw.all(dim=-1)
    return expl, int(written.sum())


def _values(case: Case, oe: Any, ctas: list[tuple[int, int]], idx: Any, local: Any, mode: str,
            fn: Callable[[int, int, int, int], int]) -> Any:
    """[P, D]: the value each write (cta, slice, row) of `idx` puts there: the CTA's true answer at its local
    row (store only), or attention of the virtual slice its wrong offset reads (Q, K, V past the end: zeros)."""
    import torch

    p = case.problem
    ref_all = oe.ref.reshape(-1, oe.ref.shape[-1])
    dev, dt = ref_all.device, ref_all.dtype
    loc = local[idx[:, 0], idx[:, 1], idx[:, 2]]
    out = torch.empty(idx.shape[0], ref_all.shape[-1], dtype=dt, device=dev)
    for c in idx[:, 0].unique().tolist():
        sel = (idx[:, 0] == c).nonzero().flatten()
        ls = loc[sel]
        b, h = ctas[c]
        if mode == "store":
            out[sel] = ref_all[(b * p.H + h) * p.Sq + ls]
            continue
        q = _rows(case.q, fn(b, h, p.H, p.Sq) + ls, dev, dt)
        kv_rows = fn(b, h // p.group, p.kv_heads, p.Sk) + torch.arange(p.Sk, device=dev)
        k, v = _rows(case.k, kv_rows, dev, dt), _rows(case.v, kv_rows, dev, dt)
        o = attend(q[None], k[None], v[None], p.softmax_scale, true_mask(p, dev, ls), softcap=p.softcap)["out"][0]
        out[sel] = torch.nan_to_num(o, nan=0.0)  # a virtual row that sees no key: a kernel writes zeros
    return out


def _rows(t: Any, rows: Any, dev: Any, dt: Any) -> Any:
    """Rows `rows` of `t` seen as [-1, D], zeros past its end (TMA and masked loads return zeros there)."""
    import torch

    flat = t.detach().reshape(-1, t.shape[-1])
    n = flat.shape[0]
    inside = (rows >= 0) & (rows < n)
    got = flat[rows.clamp(0, n - 1).to(flat.device)].to(dev, dt)
    return torch.where(inside[:, None], got, torch.zeros_like(got))


def _overlap(o_store: Any, S: int) -> bool:
    """Whether two CTAs' row ranges [o, o + S) intersect."""
    o = o_store.sort().values
    return bool((o[1:] < o[:-1] + S).any()) if o.numel() > 1 else False


def _never_written(o_store: Any, B: int, H: int, S: int) -> str:
    """'the rows of batches 1-3' (or heads, or slices) no CTA writes, or '' (a sweep over the CTAs' sorted
    row ranges: no tensor of B·H·S)."""
    total = B * H * S
    gaps, reach = [], 0
    for o in sorted(o_store.tolist()):
        lo, hi = max(0, o), min(total, o + S)
        if lo > reach:
            gaps.append((reach, lo))
        reach = max(reach, hi)
    if reach < total:
        gaps.append((reach, total))
    lost = sorted({t for lo, hi in gaps for t in range(lo // S, (hi - 1) // S + 1)})
    if not lost:
        return ""
    bs = sorted({t // H for t in lost})
    if len(lost) == len(bs) * H:
        return f"the rows of {_noun('batch', bs)}"
    hs = sorted({t % H for t in lost})
    if len(lost) == len(hs) * B:
        return f"the rows of {_noun('head', hs)}"
    return f"rows of {len(lost)} (b, h) slices"


def _noun(noun: str, idx: list[int]) -> str:
    plural = noun + ("es" if noun.endswith("ch") else "s")
    return f"{noun if len(idx) == 1 else plural} {errormap.ranges(idx)}"


def _landing(ctas: list[tuple[int, int]], o_store: Any, B: int, H: int, S: int) -> str:
    """Where the moved slices' outputs land: 'batch b's output lands in batch 0's rows, shifted by b rows'."""
    land = []
    for (b, h), o in zip(ctas, o_store.tolist(), strict=True):
        t = o // S
        land.append((b, h, t // H, t % H, o - t * S))
    moved = [x for x in land if (x[2], x[3], x[4]) != (x[0], x[1], 0)]
    if not moved:
        return "every slice at its own rows"
    for axis, i_src, i_dst in (("batch", 0, 2), ("head", 1, 3)):
        if all(x[i_src] == 0 or x[i_dst] == 0 for x in moved) and any(x[i_src] > 0 for x in moved) \
                and all(x[i_dst] == 0 for x in moved if x[i_src] > 0):
            shifts = {x[4] for x in moved if x[i_src] > 0}
            letter = "b" if axis == "batch" else "h"
            text = f"{axis} {letter}'s output lands in {axis} 0's rows"
            if all(x[4] == x[i_src] for x in moved if x[i_src] > 0):
                return text + f", shifted by {letter} rows"
            if shifts == {0}:
                return text
            return text + f", shifted by {errormap.ranges(sorted(shifts))} rows"
    few = ", ".join(f"({b}, {h})'s at ({tb}, {th}) row {sh}" for b, h, tb, th, sh in moved[:3])
    return f"(b, h) slices' outputs land at other slices' rows: {few}{', ...' if len(moved) > 3 else ''}"


def slice_signatures(problem: Any, probes: Sequence[Mapping[str, Any]], maps: Sequence[Mapping[str, Any]]) -> list[Signature]:
    """'correct at B=1 (batch 3 run alone), wrong when B>1' (and H), from the slicing probes' records.

    Args:
        problem: the problem checked; probes: the probe records of the row (name, status);
        maps: the row's error map records (the randn check's say which batches and heads are wrong).

    Returns:
        One 'placement' signature per axis whose sliced index is wrong in the whole run and right alone.
    """
    status = {r["name"]: r["status"] for r in probes}
    whole = [m for m in maps if m["check_input"] == "randn" and m["output"] == "out"]
    total = next((int(m["n_bad"]) for m in whole if m["axis"] == "all"), 0)
    out = []
    for probe, (axis, letter) in SLICE_PROBES.items():
        n = problem.B if axis == "batch" else problem.H
        if status.get(probe) != "ok" or n < 2 or not total:
            continue
        if not any(m["axis"] == axis and m["bin"] == str(n - 1) and m["n_bad"] > 0 for m in whole):
            continue  # the sliced index was right in the whole run too: its passing alone says nothing
        title = f"correct at {letter}=1, wrong when {letter}>1"
        detail = (f"{axis} {n - 1} is wrong in the whole run and right run alone on the same inputs: the result depends "
                  f"on the {axis} index (or on other {axis}{'es' if axis == 'batch' else 's'}' work), not on the data")
        out.append(Signature("placement", f"{axis}_dependent", title, "out", f"randn, {probe}", 1.0, total, total,
                             math.nan, math.nan, detail, unit="elements", generic=True))
    return out
