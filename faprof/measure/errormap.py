"""Where a wrong output is wrong: positions as (b, h, i, d), the NaN poison, and the error map.

- Positions: an element of O or dQ is (b, h, i, d) (query row i), of dK or dV (b, h, j, d) (key j),
  of the LSE (b, h, i); with the variant's tile known, the query (or key) tile it falls in.
- Poison: outputs are filled before the checked call with a NaN whose bit pattern (POISON_16 in
  every 16-bit half) no arithmetic produces, so an element still holding it was never written,
  and a NaN the variant computed (0/0, inf - inf) is told apart from it exactly.
- An element is wrong when it breaks either of correctness' rules: |out - ref| > atol + rtol·|ref|,
  or |out - ref| > the FlashAttention bound (factor x PyTorch's error + eps x max(1, max |ref|)); NaN and inf always are.
- The error map of one wrong output is a long table: for each axis (batch, head, query tile or key
  tile, head-dim column, position against the causal mask, last partial tile) and each bin along
  it, the elements, the wrong ones, their share, the max error and the unwritten ones. Computed
  with torch reductions on the device the reference lives on, only for outputs that are wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: A NaN in fp16 (exponent all ones, mantissa 0x3E5 != 0) and in bf16 (mantissa 0x65 != 0), quiet in
#: both: the poison of 16-bit outputs. GPUs produce 0x7FFF and CPUs 0x7E00 / 0x7FC0 for a computed NaN.
POISON_16 = 0x7FE5

#: Two POISON_16 halves: a quiet fp32 NaN (0x7FE57FE5), so memory poisoned as 32-bit words reads as
#: poison in fp32 and, at any 2-byte alignment, in fp16 and bf16 (the caching allocator's reuse).
POISON_32 = 0x7FE57FE5

#: Row-axis bin size when the variant's tile is not known: 64 rows is the most common query tile
#: of FlashAttention kernels (and divides the others: 16, 32, 128 are multiples or divisors).
DEFAULT_TILE = 64

#: The summary says "only in <categories>" (mask, diagonal, tail axes) only when the categories with
#: wrong elements hold at most this share of the output: otherwise it narrows nothing down.
NARROW_SHARE = 0.5

#: Axis names of the map, in the order they are reported.
AXES = ("all", "batch", "head", "query_tile", "key_tile", "d", "mask", "diag_in_tile", "tail")

MAP_COLUMNS = ("check_input", "output", "axis", "bin", "lo", "hi", "n", "n_bad", "share_bad", "max_err", "n_unwritten")

#: Outputs whose rows are keys (the others' rows are queries).
KEY_OUTPUTS = ("dk", "dv")


# ------------------------------------------------------------------------------------ poison
def _int_dtype(dtype: Any) -> tuple[Any, int] | None:
    import torch

    if dtype in (torch.float16, torch.bfloat16):
        return torch.int16, POISON_16
    if dtype == torch.float32:
        return torch.int32, POISON_32
    return None


def poison_like(t: Any) -> Any:
    """A tensor like `t` (shape, dtype, device) filled with the poison NaN (plain NaN for fp64)."""
    import torch

    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    poison_(out)
    return out


def poison_(t: Any) -> Any:
    """Fill `t` in place with the poison NaN (plain NaN for dtypes without a poison pattern)."""
    spec = _int_dtype(t.dtype)
    if spec is None:
        return t.fill_(float("nan"))
    int_dtype, bits = spec
    t.view(int_dtype).fill_(bits)
    return t


def poison_words(nbytes: int, device: str) -> Any:
    """`nbytes` (rounded up to 4) of 32-bit poison words on `device`: allocate, fill, free, and the
    caching allocator hands that memory to the next op, which then starts from poison."""
    import torch

    return torch.full((nbytes // 4 + 1,), POISON_32, dtype=torch.int32, device=device)


def unwritten_mask(t: Any) -> Any:
    """Elements of `t` that still hold the poison (bool, t's shape); all False for untagged dtypes
    (fp64: cpu_ref's own outputs, which nothing poisons)."""
    import torch

    spec = _int_dtype(t.dtype)
    if spec is None:
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    int_dtype, bits = spec
    return t.detach().contiguous().view(int_dtype) == bits


# --------------------------------------------------------------------------------- positions
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


def describe_position(output: str, shape: Sequence[int], flat: int, tile: tuple[int, int] | None) -> str:
    """'out[b=1, h=0, i=37, d=5] (query tile 0: rows 0-63)' for flat index `flat` of `output`."""
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


# ----------------------------------------------------------------------------- element errors
@dataclass
class OutputErrors:
    """One output compared element by element with its reference, as [B, H, N, D'] tensors
    (N: query rows, or keys for dK/dV; D' = 1 for the LSE), on the reference's device."""

    name: str
    r: Any
    """The result in the reference's dtype (NaN where it is NaN)."""
    ref: Any
    err: Any
    """|r - ref|, inf where r is not finite."""
    thr: Any
    """The per-element bound: min(atol + rtol·|ref|, FlashAttention bound)."""
    bad: Any
    """err > thr (NaN and inf included)."""
    unwritten: Any
    """Elements still holding the poison."""
    bound: float = math.inf
    """The FlashAttention bound (inf where none): an absolute error scale for this output."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.r.shape)

    @property
    def n_bad(self) -> int:
        return int(self.bad.sum())

    def row_bad(self) -> Any:
        """[B, H, N]: rows with a wrong element."""
        return self.bad.any(dim=-1)


def element_errors(name: str, result: Any, ref: Any, atol: float, rtol: float, bound: float) -> OutputErrors | None:
    """Compare `result` (as the variant returned it, so the poison is visible) with `ref`.

    Args:
        name: 'out', 'dq', 'dk', 'dv' or 'lse'.
        result: the variant's output; must have ref's number of elements.
        ref: the reference output ([B, H, N, D] or [B, H, N] for the LSE).
        atol, rtol: the per-element rule; bound: the FlashAttention bound (inf or nan: none).

    Returns:
        OutputErrors shaped [B, H, N, D'] on ref's device, or None when the shapes cannot be compared.
    """
    import torch

    if result.numel() != ref.numel():
        return None
    unw = unwritten_mask(result).reshape(ref.shape).to(ref.device)
    r = result.detach().reshape(ref.shape).to(ref.device, ref.dtype)
    if ref.dim() == 3:
        r, refv, unw = r.unsqueeze(-1), ref.unsqueeze(-1), unw.unsqueeze(-1)
    else:
        refv = ref
    err = torch.nan_to_num((r - refv).abs(), nan=math.inf)
    thr = atol + rtol * refv.abs()
    if bound is not None and math.isfinite(bound):
        thr = thr.clamp(max=bound)
    bad = ~(err <= thr)
    return OutputErrors(name, r, refv, err, thr, bad, unw, bound if bound is not None and math.isfinite(bound) else math.inf)


# ------------------------------------------------------------------------------------ the map
def _record(check_input: str, output: str, axis: str, label: str, lo: int, hi: int, n: int, n_bad: int,
            max_err: float, n_unw: int) -> dict[str, Any]:
    return {"check_input": check_input, "output": output, "axis": axis, "bin": label, "lo": int(lo), "hi": int(hi),
            "n": int(n), "n_bad": int(n_bad), "share_bad": (n_bad / n) if n else 0.0, "max_err": float(max_err),
            "n_unwritten": int(n_unw)}


def _reduce(oe: OutputErrors, keep: int) -> tuple[Any, Any, Any, int]:
    """(wrong count, max error, unwritten count) along axis `keep`, and elements per index."""
    other = tuple(d for d in range(4) if d != keep)
    n_per = math.prod(oe.shape[d] for d in other)
    return oe.bad.sum(dim=other), oe.err.amax(dim=other), oe.unwritten.sum(dim=other), n_per


def _bins(labels: Any, nb: Any, me: Any, nu: Any, n_per: int, names: Sequence[str]) -> list[tuple[str, int, int, int, int, float, int]]:
    """Group per-row values into labelled categories: (name, lo, hi, n, n_bad, max_err, n_unw)."""
    import torch

    out = []
    idx = torch.arange(labels.numel(), device=labels.device)
    for c, name in enumerate(names):
        sel = labels == c
        if not bool(sel.any()):
            continue
        rows = idx[sel]
        out.append((name, int(rows.min()), int(rows.max()), int(sel.sum()) * n_per, int(nb[sel].sum()),
                    float(me[sel].max()), int(nu[sel].sum())))
    return out


def mask_categories(output: str, n: int, Sq: int, Sk: int) -> tuple[Any, tuple[str, ...]]:
    """Per row (query rows, or keys for dK/dV): its place under the top-left causal mask.

    Query row i sees min(i + 1, Sk) keys: 'rows seeing one key' (i = 0), 'rows the mask cuts'
    (1 < i + 1 < Sk), 'rows seeing every key' (i >= Sk - 1). Key j is seen by max(Sq - j, 0) rows:
    'keys every row sees' (j = 0), 'keys some rows see', 'keys no row sees' (j >= Sq)."""
    import torch

    i = torch.arange(n)
    if output in KEY_OUTPUTS:
        names = ("keys every row sees", "keys some rows see", "keys no row sees")
        lab = torch.where(i == 0, 0, torch.where(i < Sq, 1, 2))
    else:
        names = ("rows seeing one key", "rows the mask cuts", "rows seeing every key")
        seen = torch.clamp(i + 1, max=Sk)
        lab = torch.where(seen == Sk, 2, torch.where(seen == 1, 0, 1))
    return lab, names


def error_map(oe: OutputErrors, check_input: str, causal: bool, Sq: int, Sk: int,
              tile: tuple[int, int] | None) -> list[dict[str, Any]]:
    """The long-format error map of one output (empty when nothing is wrong).

    Args:
        oe: the output's element errors (element_errors).
        check_input: name of the inputs it was computed on ('randn', or an adversarial input).
        causal, Sq, Sk: the problem's mask and lengths (for the mask and diagonal axes).
        tile: the variant's (query rows, keys) tile, or None (bins of DEFAULT_TILE rows then).

    Returns:
        Records with MAP_COLUMNS. Axes: 'all' (one bin; lo/hi = first and last wrong row), 'batch',
        'head', 'query_tile' (or 'key_tile' for dK/dV: bins of the variant's tile), 'd' (not for
        the LSE), 'mask' and 'diag_in_tile' (causal problems: where the row sits against the mask,
        and where its diagonal falls inside the other side's tile), 'tail' (rows of whole tiles vs
        the last partial tile, when the rows do not fill whole tiles).
    """
    import torch

    if oe.n_bad == 0:
        return []
    B, H, N, Dp = oe.shape
    name = oe.name
    rec = []
    rows_bad = oe.bad.any(dim=(0, 1, 3)).nonzero().flatten()
    first, last = (int(rows_bad.min()), int(rows_bad.max())) if rows_bad.numel() else (-1, -1)
    rec.append(_record(check_input, name, "all", "all", first, last, oe.bad.numel(), oe.n_bad,
                       float(oe.err.max()), int(oe.unwritten.sum())))
    for axis, dim in (("batch", 0), ("head", 1)):
        nb, me, nu, n_per = _reduce(oe, dim)
        for b in range(nb.numel()):
            rec.append(_record(check_input, name, axis, str(b), b, b, n_per, int(nb[b]), float(me[b]), int(nu[b])))
    nb, me, nu, n_per = _reduce(oe, 2)
    nb, me, nu = nb.cpu(), me.cpu(), nu.cpu()
    t = row_tile(name, tile) or DEFAULT_TILE
    tiles = torch.arange(N) // t
    tile_axis = "key_tile" if name in KEY_OUTPUTS else "query_tile"
    n_tiles = (N + t - 1) // t
    for lab, lo, hi, n, nbad, mx, nunw in _bins(tiles, nb, me, nu, n_per, [str(k) for k in range(n_tiles)]):
        rec.append(_record(check_input, name, tile_axis, lab, lo, hi, n, nbad, mx, nunw))
    if name != "lse":
        dnb, dme, dnu, dn = _reduce(oe, 3)
        for d in range(Dp):
            rec.append(_record(check_input, name, "d", str(d), d, d, dn, int(dnb[d]), float(dme[d]), int(dnu[d])))
    if causal:
        cat, names = mask_categories(name, N, Sq, Sk)
        for c in _bins(cat, nb, me, nu, n_per, names):
            rec.append(_record(check_input, name, "mask", *c))
        # where the row's diagonal (query i -> key i, key j -> query j) falls in the other side's tile
        other = (tile[0] if name in KEY_OUTPUTS else tile[1]) if tile else DEFAULT_TILE
        pos = torch.arange(N) % other
        cat = torch.where(pos == 0, 0, torch.where(pos == other - 1, 2, 1))
        noun = "query" if name in KEY_OUTPUTS else "key"
        unit = "row" if noun == "query" else "key"
        names = (f"diagonal on a {noun} tile's first {unit}", f"diagonal inside a {noun} tile",
                 f"diagonal on a {noun} tile's last {unit}")
        for c in _bins(cat, nb, me, nu, n_per, names):
            rec.append(_record(check_input, name, "diag_in_tile", *c))
    if N % t and t < N:
        whole = (N // t) * t
        cat = (torch.arange(N) >= whole).long()
        for c in _bins(cat, nb, me, nu, n_per, ("whole tiles", "last partial tile")):
            rec.append(_record(check_input, name, "tail", *c))
    return rec


# ----------------------------------------------------------------------------------- summary
def ranges(values: Iterable[int]) -> str:
    """'0-3, 5, 7-8' for [0, 1, 2, 3, 5, 7, 8]."""
    vs = sorted(set(int(v) for v in values))
    parts: list[str] = []
    i = 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    if len(parts) > 8:
        return ", ".join(parts[:8]) + f", ... ({len(vs)} in all)"
    return ", ".join(parts)


def _label(noun: str, idx: list[int]) -> str:
    plural = noun + ("es" if noun.endswith("ch") else "s")
    return f"{noun if len(idx) == 1 else plural} {ranges(idx)}"


def summarize(records: Sequence[dict[str, Any]]) -> list[str]:
    """A few lines saying where one output is wrong, from its error map records (one output, one input).

    E.g. ['out: 98304 of 131072 elements wrong (75%), max error 4.15',
          'batch 0 correct; batches 1-3 wrong in every head from row 0; no unwritten elements'].
    """
    if not records:
        return []
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["axis"], []).append(r)
    tot = by["all"][0]
    out = tot["output"]
    head = (f"{out}: {tot['n_bad']} of {tot['n']} elements wrong ({tot['share_bad']:.0%}), "
            f"max error {tot['max_err']:.3g}")

    def split(axis: str) -> tuple[list[int], list[int]]:
        recs = by.get(axis, [])
        return [int(r["bin"]) for r in recs if r["n_bad"] == 0], [int(r["bin"]) for r in recs if r["n_bad"] > 0]

    segs = []
    b_ok, b_bad = split("batch")
    h_ok, h_bad = split("head")
    who = ""
    if b_ok:
        segs.append(f"{_label('batch', b_ok)} correct")
        who = f"{_label('batch', b_bad)} wrong"
    else:
        who = "every batch wrong" if len(b_bad) > 1 else "wrong"
    if h_ok:
        who += f" in {_label('head', h_bad)} only"
    elif len(h_bad) > 1:
        who += " in every head"
    row_noun = "key" if out in KEY_OUTPUTS else "row"
    tile_axis = "key_tile" if out in KEY_OUTPUTS else "query_tile"
    t_ok, t_bad = split(tile_axis)
    first, last = int(tot["lo"]), int(tot["hi"])
    n_rows = max(int(r["hi"]) for r in by.get(tile_axis, [tot])) + 1
    if t_ok and t_bad:
        spans = [f"{r['lo']}-{r['hi']}" for r in by[tile_axis] if r["n_bad"] > 0][:6]
        noun = tile_axis.replace("_", " ") + ("s" if len(t_bad) > 1 else "")
        who += f" in {noun} {ranges(t_bad)} ({row_noun}s {', '.join(spans)}{', ...' if len(t_bad) > 6 else ''})"
    elif first >= 0:
        who += f" from {row_noun} {first}" + (f" to {last}" if last < n_rows - 1 else "")
    segs.append(who)
    d_ok, d_bad = split("d")
    if d_ok and d_bad:
        segs.append(f"only in columns d={ranges(d_bad)}")
    for axis in ("mask", "diag_in_tile", "tail"):
        recs = by.get(axis, [])
        bad = [r for r in recs if r["n_bad"] > 0]
        # said only where it narrows things down: the categories holding wrong elements are a minority
        narrow = sum(r["n"] for r in bad) <= NARROW_SHARE * sum(r["n"] for r in recs) if recs else False
        if recs and bad and len(bad) < len(recs) and narrow:
            names = ", ".join(f"{r['bin']} ({row_noun}s {r['lo']}-{r['hi']})" if axis != "diag_in_tile" else
                              f"{row_noun}s with the {r['bin']}" for r in bad)
            segs.append(f"only in {'the ' if axis == 'tail' else ''}{names}")
    n_unw = int(tot["n_unwritten"])
    if n_unw == 0:
        segs.append("no unwritten elements")
    else:
        where = [int(r["lo"]) for r in by.get("batch", []) if r["n_unwritten"] > 0]
        segs.append(f"{n_unw} unwritten elements (NaN poison still there) in {_label('batch', where)}")
    return [head, "; ".join(segs)]
