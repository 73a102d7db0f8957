"""Bug signatures of grouped-query attention: a query head that reads another KV head than h // group.

Each examined wrong (b, h) slice is recomputed with every other KV head of its batch (the K and V a
kernel reads when its head mapping is wrong); the KV head that explains a slice's rows is recorded, and
the mapping seen over the slices is named when one formula a kernel might have written fits every one
(h % Hkv: heads interleaved instead of grouped; h // Hkv: divided by the KV heads instead of the group
size; 0: every head reads the first), else listed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from faprof.measure.signatures.case import MIN_SHARE, Case, Signature, Slices, err_sliced, sliced
from faprof.measure.signatures.match import explain, rows_text, tol_of
from faprof.measure.signatures.refs import attend, true_mask

#: Head mappings a GQA kernel may compute instead of h // group: name -> (KV head of query head h, words).
MAPPINGS: dict[str, tuple[Any, str]] = {
    "modulo": (lambda h, H, Hkv: h % Hkv, "h % Hkv (heads interleaved instead of grouped)"),
    "by_kv_heads": (lambda h, H, Hkv: min(h // Hkv, Hkv - 1), "h // Hkv (divided by the KV heads, not the group size)"),
    "first": (lambda h, H, Hkv: 0, "0 (every query head reads the first KV head)"),
}


def kv_head_signatures(case: Case, s: Slices) -> list[Signature]:
    """The wrong KV head each examined query head reads, when that explains its wrong rows.

    Args:
        case: the wrong outputs under test; s: the wrong (b, h) slices examined.

    Returns:
        One 'kv_head' signature (or none: no GQA, one KV head, or no other KV head explains the rows).
    """
    import torch

    p = case.problem
    Hkv, group = p.kv_heads, p.group
    oe = case.errors.get("out")
    if group == 1 or Hkv < 2 or oe is None or oe.n_bad == 0 or case.k is None:
        return []
    r, ref, thr, bad, unw = sliced(oe, s)
    tol = tol_of(case, oe)
    dev, dt = ref.device, ref.dtype
    mask = true_mask(p, dev, s.rows)
    expl = torch.zeros(bad.shape[:-1], dtype=torch.bool, device=dev)
    seen: dict[int, int] = {}
    err_alt = 0.0
    for i, (b, h) in enumerate(s.pairs()):
        best: tuple[int, Any, float] | None = None
        for g in range(Hkv):
            if g == h // group:
                continue
            kk, vv = (t.detach()[b, g].to(dev, dt)[None] for t in (case.k, case.v))
            alt = attend(s.q[i:i + 1], kk, vv, p.softmax_scale, mask, softcap=p.softcap)["out"]
            st = explain(r[i:i + 1], ref[i:i + 1], thr[i:i + 1], bad[i:i + 1], unw[i:i + 1], alt, tol)
            if st[1] and (best is None or st[1] > int(best[1].sum())):
                best = (g, st[2][0], st[4])
        if best is not None:
            seen[h] = best[0]
            expl[i] = best[1]
            err_alt = max(err_alt, best[2])
    n_w, n_e = int(bad.any(dim=-1).sum()), int(expl.sum())
    if not n_w or n_e / n_w < MIN_SHARE:
        return []
    title = _mapping_title(seen, p.H, Hkv, group)
    e_ref = float(err_sliced(oe, s)[expl].max())
    return [Signature("kv_head", "kv_head_" + _mapping_name(seen, p.H, Hkv), title, "out", case.check_input, n_e / n_w,
                      n_w, n_e, e_ref, err_alt, rows_text(expl, s, "out"))]


def _mapping_name(seen: dict[int, int], H: int, Hkv: int) -> str:
    for name, (fn, _) in MAPPINGS.items():
        if seen and all(fn(h, H, Hkv) == g for h, g in seen.items()):
            return name
    return "other"


def _mapping_title(seen: dict[int, int], H: int, Hkv: int, group: int) -> str:
    """'query head h reads KV head h % Hkv (...) instead of h // 4', or the heads seen."""
    name = _mapping_name(seen, H, Hkv)
    right = f"h // {group} (H={H} query heads, Hkv={Hkv} KV heads)"
    if name != "other":
        return f"query head h reads KV head {MAPPINGS[name][1]} instead of {right}"
    pairs = ", ".join(f"head {h} reads KV head {g}" for h, g in sorted(seen.items())[:6])
    common = Counter(seen.values()).most_common(1)
    more = f" (KV head {common[0][0]} most often)" if common and len(seen) > 1 else ""
    return f"query heads read the wrong KV head{more}: {pairs} instead of {right}"

