"""Bug signatures of grouped-query attention: a query head that reads another KV head than h // group.

Each examined wrong (b, h) slice is recomputed with every other KV head of its batch (the K and V a
kernel reads when its head mapping is wrong); the KV head that explains a slice's rows is recorded, and
the mapping seen over the slices is named when one formula a kernel might have written fits every one
(h % Hkv: heads interleaved instead of grouped; h // Hkv: divided by the KV heads instead of the group
size; 0: every head reads the first), else listed. K and V are also tried one at a time (the other from
the right KV head): a kernel that computes their head offsets apart can get only one of them wrong, and
the signature says which.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from faprof.correctness.signatures.case import MIN_SHARE, Case, Signature, Slices, err_sliced, sliced
from faprof.correctness.signatures.match import explain, rows_text, tol_of
from faprof.correctness.signatures.refs import attend, true_mask

#: Head mappings a GQA kernel may compute instead of h // group: name -> (KV head of query head h, words).
MAPPINGS: dict[str, tuple[Any, str]] = {
    "modulo": (lambda h, H, Hkv: h % Hkv, "h % Hkv (heads interleaved instead of grouped)"),
    "by_kv_heads": (lambda h, H, Hkv: min(h // Hkv, Hkv - 1), "h // Hkv (divided by the KV heads, not the group size)"),
    "first": (lambda h, H, Hkv: 0, "0 (every query head reads the first KV head)"),
}


#: Which of K and V a query head reads from the wrong KV head: name -> (K wrong, V wrong, words).
READS: dict[str, tuple[bool, bool, str]] = {
    "kv": (True, True, "K and V"),
    "k": (True, False, "K"),
    "v": (False, True, "V"),
}


def kv_head_signatures(case: Case, s: Slices) -> list[Signature]:
    """The wrong KV head each examined query head reads, when that explains its wrong rows.

    Each slice is recomputed with every other KV head's K and V, with its K only (V from the right head)
    and with its V only: a kernel that indexes K and V with separate formulas gets one of them wrong.

    Args:
        case: the wrong outputs under test; s: the wrong (b, h) slices examined.

    Returns:
        One 'kv_head' signature per tensor read wrong (READS: K and V, K only, V only) whose KV heads
        explain at least MIN_SHARE of the wrong rows (none: no GQA, one KV head, or no other KV head
        explains them); its kind says which ('kv_head_modulo', 'k_head_modulo', 'v_head_modulo').
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
    expl = {name: torch.zeros(bad.shape[:-1], dtype=torch.bool, device=dev) for name in READS}
    seen: dict[str, dict[int, int]] = {name: {} for name in READS}
    err_alt = dict.fromkeys(READS, 0.0)
    for i, (b, h) in enumerate(s.pairs()):
        own = h // group
        k0, v0 = s.k[i:i + 1], s.v[i:i + 1]
        for name, (k_wrong, v_wrong, _) in READS.items():
            best: tuple[int, Any, float] | None = None
            for g in range(Hkv):
                if g == own:
                    continue
                kk = case.k.detach()[b, g].to(dev, dt)[None] if k_wrong else k0
                vv = case.v.detach()[b, g].to(dev, dt)[None] if v_wrong else v0
                alt = attend(s.q[i:i + 1], kk, vv, p.softmax_scale, mask, softcap=p.softcap)["out"]
                st = explain(r[i:i + 1], ref[i:i + 1], thr[i:i + 1], bad[i:i + 1], unw[i:i + 1], alt, tol)
                if st[1] and (best is None or st[1] > int(best[1].sum())):
                    best = (g, st[2][0], st[4])
            if best is not None:
                seen[name][h] = best[0]
                expl[name][i] = best[1]
                err_alt[name] = max(err_alt[name], best[2])
    n_w = int(bad.any(dim=-1).sum())
    found = []
    for name, (_, _, words) in READS.items():
        n_e = int(expl[name].sum())
        if not n_w or n_e / n_w < MIN_SHARE:
            continue
        title = _mapping_title(seen[name], p.H, Hkv, group, "" if name == "kv" else words)
        e_ref = float(err_sliced(oe, s)[expl[name]].max())
        found.append(Signature("kv_head", f"{name}_head_" + _mapping_name(seen[name], p.H, Hkv), title, "out",
                               case.check_input, n_e / n_w, n_w, n_e, e_ref, err_alt[name],
                               rows_text(expl[name], s, "out")))
    return found


def _mapping_name(seen: dict[int, int], H: int, Hkv: int) -> str:
    for name, (fn, _) in MAPPINGS.items():
        if seen and all(fn(h, H, Hkv) == g for h, g in seen.items()):
            return name
    return "other"


def _mapping_title(seen: dict[int, int], H: int, Hkv: int, group: int, what: str = "") -> str:
    """'query head h reads KV head h % Hkv (...) instead of h // 4', or the heads seen; `what` ('K' or 'V')
    names the one tensor read from the wrong KV head when the other is read from the right one."""
    name = _mapping_name(seen, H, Hkv)
    right = f"h // {group} (H={H} query heads, Hkv={Hkv} KV heads)"
    other = {"K": "V", "V": "K"}.get(what)
    tail = f"; its {other} from the right one" if other else ""
    reads = f"reads its {what} from" if what else "reads"
    if name != "other":
        return f"query head h {reads} KV head {MAPPINGS[name][1]} instead of {right}{tail}"
    pairs = ", ".join(f"head {h} reads KV head {g}" for h, g in sorted(seen.items())[:6])
    common = Counter(seen.values()).most_common(1)
    more = f" (KV head {common[0][0]} most often)" if common and len(seen) > 1 else ""
    what_text = f" for its {what}" if what else ""
    return f"query heads read the wrong KV head{what_text}{more}: {pairs} instead of {right}{tail}"
