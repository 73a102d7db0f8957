"""Bug signatures of stride/offset bugs: slices holding another slice's answer, or computed with its Q or K/V."""

from __future__ import annotations

import math
from collections import Counter

from faprof.correctness import errormap
from faprof.correctness.errormap import KEY_OUTPUTS, OutputErrors
from faprof.correctness.signatures.case import MIN_SHARE, Case, Signature, Slices, err_sliced, sliced
from faprof.correctness.signatures.match import close_to, differs, explain, nearer_rows, rows_text, tol_of
from faprof.correctness.signatures.refs import attend, true_mask

#: Stride/offset tests run only where at least this share of the examined slices' rows is wrong: an
#: offset bug moves or reads whole slices, it does not leave most rows right.
STRIDE_MIN_ROWS = 0.5


def wrong_row_share(oe: OutputErrors, s: Slices) -> float:
    """Share of the examined slices' rows (all of them, not only the examined ones) that are wrong."""
    return float(oe.bad.any(dim=-1)[s.b.to(oe.bad.device), s.h.to(oe.bad.device)].float().mean())


def stride_signatures(case: Case, s: Slices) -> list[Signature]:
    """Slices holding another slice's answer, or (where none does) computed with another slice's Q or K/V.

    Args:
        case: the wrong outputs under test; s: the wrong (b, h) slices examined.

    Returns:
        The 'stride' signatures found (empty for a single slice: there is no other one).
    """
    p = case.problem
    if p.B * p.H < 2:
        return []
    found = slice_copy_signatures(case, s)
    if found or "out" not in case.errors or case.errors["out"].n_bad == 0:
        return found
    return other_input_signatures(case, s)


def slice_copy_signatures(case: Case, s: Slices) -> list[Signature]:
    """Per output, (b, h) slices whose rows hold another slice's true answer (an offset or stride ignored
    on the store): each wrong row is matched against every slice's reference, in chunks."""
    import torch

    p = case.problem
    B, H = p.B, p.H
    found = []
    for name, oe in case.errors.items():
        if oe.n_bad == 0 or not s.covers(name):
            continue
        if wrong_row_share(oe, s) < STRIDE_MIN_ROWS:
            continue
        r, ref, thr, bad, unw = sliced(oe, s)
        tol = tol_of(case, oe)
        wrong = bad.any(dim=-1)
        allref = oe.ref.reshape(B * H, *oe.ref.shape[2:])
        if s.rows is not None and name not in KEY_OUTPUTS:
            allref = allref[:, s.rows]
        src = torch.full(wrong.shape, -1, dtype=torch.long, device=wrong.device)
        for i in range(s.n):
            own = int(s.b[i]) * H + int(s.h[i])
            for c0 in range(0, B * H, 16):  # candidates in chunks: bounded memory at any B·H
                cand = allref[c0:c0 + 16]
                ok = close_to(r[i][None], cand, ref[i][None], tol).all(dim=-1)
                ok &= differs(cand, ref[i][None], thr[i][None]).any(dim=-1)
                ok &= nearer_rows(torch.nan_to_num((r[i][None] - cand).abs(), nan=math.inf), r[i][None], ref[i][None])
                ids = torch.arange(c0, c0 + cand.shape[0], device=ok.device)
                ok[ids == own] = False
                first = torch.where(ok.any(dim=0), ids[ok.long().argmax(dim=0)], torch.full_like(src[i], -1))
                src[i] = torch.where(src[i] >= 0, src[i], first)
        expl = wrong & (src >= 0)
        n_w, n_e = int(wrong.sum()), int(expl.sum())
        if n_w and n_e / n_w >= MIN_SHARE:
            pairs = []
            for i, (b, h) in enumerate(s.pairs()):
                got = src[i][expl[i]].tolist()
                if got:
                    c = Counter(got).most_common(1)[0][0]
                    pairs.append(((b, h), (c // H, c % H)))
            title = _stride_title(pairs, "answer")
            e_ref = float(err_sliced(oe, s)[expl].max())
            found.append(Signature("stride", "slice_copy", title, name, case.check_input, n_e / n_w, n_w, n_e, e_ref,
                                   math.nan, rows_text(expl, s, name)))
    return found


def other_input_signatures(case: Case, s: Slices) -> list[Signature]:
    """'out' computed with the right K/V and another slice's Q, or the reverse (an offset ignored in one
    load): each examined slice against the neighbouring and first slices' inputs."""
    import torch

    p = case.problem
    found: list[Signature] = []
    oe = case.errors["out"]
    if wrong_row_share(oe, s) < STRIDE_MIN_ROWS:
        return found
    r, ref, thr, bad, unw = sliced(oe, s)
    tol = tol_of(case, oe)
    qall, kall, vall = case.q, case.k, case.v
    dev, dt = ref.device, ref.dtype
    for which in ("q", "kv"):
        expl = torch.zeros(bad.shape[:-1], dtype=torch.bool, device=dev)
        pairs = []
        err_alt = 0.0
        for i, (b, h) in enumerate(s.pairs()):
            for cb, ch in dict.fromkeys([(0, h), (b, 0), (b - 1, h), (b, h - 1)]):
                if (cb, ch) == (b, h) or cb < 0 or ch < 0:
                    continue
                if which == "kv" and p.group > 1 and cb == b:
                    continue  # another KV head of the same batch: the head mapping's family (heads.py)
                if which == "q":
                    qq, kk, vv = qall[cb, ch] if s.rows is None else qall[cb, ch][s.rows.to(qall.device)], s.k[i], s.v[i]
                else:
                    qq, kk, vv = s.q[i], kall[cb, ch // p.group], vall[cb, ch // p.group]
                qq, kk, vv = (t.detach().to(dev, dt)[None] for t in (qq, kk, vv))
                alt = attend(qq, kk, vv, p.softmax_scale, true_mask(p, dev, s.rows), softcap=p.softcap)["out"]
                st = explain(r[i:i + 1], ref[i:i + 1], thr[i:i + 1], bad[i:i + 1], unw[i:i + 1], alt, tol)
                if st[1]:
                    new = st[2][0] & ~expl[i]
                    if bool(new.any()):
                        pairs.append(((b, h), (cb, ch)))
                        err_alt = max(err_alt, st[4])
                    expl[i] |= st[2][0]
        n_w, n_e = int(bad.any(dim=-1).sum()), int(expl.sum())
        if n_w and n_e / n_w >= MIN_SHARE:
            what = "Q" if which == "q" else "K and V"
            title = _stride_title(pairs, f"{what}")
            e_ref = float(err_sliced(oe, s)[expl].max())
            found.append(Signature("stride", f"{which}_from_other_slice", title, "out", case.check_input, n_e / n_w,
                                   n_w, n_e, e_ref, err_alt, rows_text(expl, s, "out")))
    return found


def _stride_title(pairs: list[tuple[tuple[int, int], tuple[int, int]]], what: str) -> str:
    """'every batch gets batch 0's answer (the batch offset is ignored)', or the slices' sources."""
    if not pairs:
        return f"(b, h) slices hold another slice's {what}"
    thing = "answer" if what == "answer" else f"{what}"
    tail = "" if what == "answer" else f" (computed with another slice's {what})"
    if all(src[1] == dst[1] and src[0] == 0 and dst[0] != 0 for dst, src in pairs):
        bs = sorted({d[0] for d, _ in pairs})
        who = f"batch {bs[0]} gets" if len(bs) == 1 else f"batches {errormap.ranges(bs)} get"
        return f"{who} batch 0's {thing}: the batch offset is ignored{tail}"
    if all(src[0] == dst[0] and src[1] == 0 and dst[1] != 0 for dst, src in pairs):
        hs = sorted({d[1] for d, _ in pairs})
        who = f"head {hs[0]} gets" if len(hs) == 1 else f"heads {errormap.ranges(hs)} get"
        return f"{who} head 0's {thing}: the head offset is ignored{tail}"
    text = ", ".join(f"({d[0]},{d[1]}) has ({s[0]},{s[1]})'s" for d, s in pairs[:4])
    return f"(b, h) slices hold another slice's {thing}: {text}{', ...' if len(pairs) > 4 else ''}{tail}"

