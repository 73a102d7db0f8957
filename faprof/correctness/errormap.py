"""Where a wrong output is wrong: positions as (b, h, i, d), the NaN poison, and the error map.

- Positions (faprof.correctness.positions): an element of O or dQ is (b, h, i, d) (sequence b, query
  head h, query row i within its sequence), of dK or dV (b, h, j, d) (key j; h the KV head), of the
  LSE (b, h, i), whatever the layout (a packed batch's token index is named beside); with the
  variant's tile known, the query (or key) tile it falls in.
- Poison: outputs are filled before the checked call with a NaN whose bit pattern (POISON_16 in
  every 16-bit half) no arithmetic produces, so an element still holding it was never written,
  and a NaN the variant computed (0/0, inf - inf) is told apart from it exactly.
- An element is wrong when it breaks either of correctness' rules: |out - ref| > atol + rtol·|ref|,
  or |out - ref| > the FlashAttention bound (factor x PyTorch's error + eps x max(1, max |ref|)); NaN and inf always are.
- The error map of one wrong output is a long table: for each axis (batch or sequence, head, KV head
  and head within its group, query tile or key tile, head-dim column, position against the mask
  and the window, last partial tile, packed tiles shared by two sequences, a paged cache's last
  partial block: AXES) and each bin along it, the elements, the wrong ones, their share, the max
  error and the unwritten ones. Computed with torch reductions on the per-sequence grid
  (positions.canonical), only for outputs that are wrong. Maps of 2022's problems have the axes
  and bins they always had, so old bundles and new ones read alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from faprof.correctness import errormap_axes as axes
from faprof.correctness import positions
from faprof.correctness.positions import KEY_OUTPUTS, dims_of, position, row_tile
from faprof.model.problem import AttentionProblem

__all__ = ["AXES", "KEY_OUTPUTS", "MAP_COLUMNS", "OutputErrors", "describe_position", "dims_of", "element_errors",
           "error_map", "poison_", "poison_like", "poison_words", "position", "ranges", "row_tile", "summarize",
           "unwritten_mask"]

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

#: Axis names of the map, in the order they are reported ('sequence' replaces 'batch' for a packed
#: batch; 'kv_head' and 'head_in_group' come with GQA; 'window', 'boundary' and 'cache_block' with a
#: window, a packed batch and a paged cache: maps of 2022's problems have only the others).
AXES = ("all", "batch", "sequence", "head", "kv_head", "head_in_group", "query_tile", "key_tile", "d", "mask",
        "window", "diag_in_tile", "tail", "boundary", "cache_block")

#: Axes whose bins are categories of rows; the summary names those holding the wrong elements when
#: they narrow things down (NARROW_SHARE).
CATEGORY_AXES = ("mask", "window", "diag_in_tile", "tail", "boundary", "cache_block")

MAP_COLUMNS = ("check_input", "output", "axis", "bin", "lo", "hi", "n", "n_bad", "share_bad", "max_err", "n_unwritten")



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
def describe_position(output: str, shape: Sequence[int], flat: int, tile: tuple[int, int] | None,
                      problem: AttentionProblem | None = None) -> str:
    """'out[b=1, h=0, i=37, d=5] (query tile 0: rows 0-63)' for flat index `flat` of `output`, in the
    problem's terms when given (faprof.correctness.positions.describe)."""
    return positions.describe(problem, output, shape, flat, tile)


# ----------------------------------------------------------------------------- element errors
@dataclass
class OutputErrors:
    """One output compared element by element with its reference on the per-sequence grid
    [B, heads, N, D'] (faprof.correctness.positions.canonical: N query rows, or keys for dK/dV, of the
    longest sequence; heads are KV heads for dK/dV; D' = 1 for the LSE), on the reference's device.
    For a packed batch the rows past a shorter sequence's end are padding: `valid` says which rows
    are real, and padding is never bad (err 0)."""

    name: str
    r: Any
    """The result in the reference's dtype (NaN where it is NaN)."""
    ref: Any
    err: Any
    """|r - ref|, inf where r is not finite (0 where r equals an infinite ref: an empty row's LSE)."""
    thr: Any
    """The per-element bound: min(atol + rtol·|ref|, FlashAttention bound)."""
    bad: Any
    """err > thr (NaN and inf included)."""
    unwritten: Any
    """Elements still holding the poison."""
    bound: float = math.inf
    """The FlashAttention bound (inf where none): an absolute error scale for this output."""
    valid: Any = None
    """[B, N] bool: real rows of each sequence (packed batches), or None (every row is real)."""
    problem: AttentionProblem | None = None
    """The problem, when known (the map's per-sequence axes need it)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.r.shape)

    @property
    def n_bad(self) -> int:
        return int(self.bad.sum())

    def row_valid(self) -> Any:
        """[B, N] bool: the real rows (all True without padding)."""
        import torch

        if self.valid is not None:
            return self.valid
        return torch.ones(self.shape[0], self.shape[2], dtype=torch.bool, device=self.bad.device)


def element_errors(name: str, result: Any, ref: Any, atol: float, rtol: float, bound: float,
                   problem: AttentionProblem | None = None) -> OutputErrors | None:
    """Compare `result` (as the variant returned it, so the poison is visible) with `ref`.

    Args:
        name: 'out', 'dq', 'dk', 'dv' or 'lse'.
        result: the variant's output; must have ref's number of elements.
        ref: the reference output in the problem's layout ([B, H, N, D] or [B, H, N] for the LSE of a
            dense problem; [total, heads, D] and [H, total_q] for a packed batch).
        atol, rtol: the per-element rule; bound: the FlashAttention bound (inf or nan: none).
        problem: the problem (needed for a packed batch's layout; None reads ref as dense).

    Returns:
        OutputErrors on the per-sequence grid on ref's device, or None when the shapes cannot be compared.
    """
    import torch

    if result.numel() != ref.numel():
        return None
    unw = unwritten_mask(result).reshape(ref.shape).to(ref.device)
    r = result.detach().reshape(ref.shape).to(ref.device, ref.dtype)
    if name == "lse":  # FlashAttention's +inf for a query seeing no key is the definition's -inf
        r = torch.where(torch.isposinf(r) & torch.isneginf(ref), torch.full_like(r, -math.inf), r)
    r, valid = positions.canonical(problem, name, r)
    refv, _ = positions.canonical(problem, name, ref)
    unw, _ = positions.canonical(problem, name, unw)
    err = torch.nan_to_num((r - refv).abs(), nan=math.inf)
    err = torch.where(r == refv, torch.zeros_like(err), err)  # equal infinities (an empty row's LSE): no error
    thr = atol + rtol * torch.nan_to_num(refv.abs(), posinf=0.0)
    if bound is not None and math.isfinite(bound):
        thr = thr.clamp(max=bound)
    bad = ~(err <= thr)
    if valid is not None:
        bad &= valid[:, None, :, None]
    return OutputErrors(name, r, refv, err, thr, bad, unw, bound if bound is not None and math.isfinite(bound) else math.inf,
                        valid, problem)


# ------------------------------------------------------------------------------------ the map
def _record(check_input: str, output: str, axis: str, label: str, lo: int, hi: int, n: int, n_bad: int,
            max_err: float, n_unw: int) -> dict[str, Any]:
    return {"check_input": check_input, "output": output, "axis": axis, "bin": label, "lo": int(lo), "hi": int(hi),
            "n": int(n), "n_bad": int(n_bad), "share_bad": (n_bad / n) if n else 0.0, "max_err": float(max_err),
            "n_unwritten": int(n_unw)}


@dataclass
class _Rows:
    """Per (sequence, row) sums of one output: wrong and unwritten elements, max error; elements per row."""

    nb: Any
    me: Any
    nu: Any
    valid: Any
    per_row: int


def _rows(oe: OutputErrors) -> _Rows:
    valid = oe.row_valid().cpu()
    return _Rows(oe.bad.sum(dim=(1, 3)).cpu(), oe.err.amax(dim=(1, 3)).cpu(), oe.unwritten.sum(dim=(1, 3)).cpu(),
                 valid, oe.shape[1] * oe.shape[3])


def _bins(labels: Any, rs: _Rows, names: Sequence[str]) -> list[tuple[str, int, int, int, int, float, int]]:
    """Group per-(sequence, row) values into labelled categories: (name, lo, hi, n, n_bad, max_err, n_unw),
    lo and hi the first and last row (within its sequence) of the category."""
    import torch

    out = []
    r = torch.arange(labels.shape[1]).expand_as(labels)
    for c, name in enumerate(names):
        sel = (labels == c) & rs.valid
        if not bool(sel.any()):
            continue
        rows = r[sel]
        out.append((name, int(rows.min()), int(rows.max()), int(sel.sum()) * rs.per_row, int(rs.nb[sel].sum()),
                    float(rs.me[sel].max()), int(rs.nu[sel].sum())))
    return out


def _index_axis(check_input: str, oe: OutputErrors, axis: str, dim: int, groups: int = 0, mod: bool = False) -> list[dict[str, Any]]:
    """Records of a plain index axis (sequence, head, d); with `groups`, heads folded into groups of
    that many (h // groups: the KV head), or with `mod` their place in the group (h % groups)."""
    other = tuple(d for d in range(4) if d != dim)
    nb, me, nu = oe.bad.sum(dim=other).cpu(), oe.err.amax(dim=other).cpu(), oe.unwritten.sum(dim=other).cpu()
    valid = oe.row_valid().cpu()
    B, H, _, Dp = oe.shape
    per = {0: valid.sum(dim=1) * H * Dp, 1: valid.sum().expand(H) * Dp, 3: valid.sum().expand(Dp) * H}[dim]
    if groups:
        keys = [(h % groups) if mod else (h // groups) for h in range(H)]
        out = []
        for g in sorted(set(keys)):
            hs = [h for h in range(H) if keys[h] == g]
            out.append(_record(check_input, oe.name, axis, str(g), g, g, int(sum(per[h] for h in hs)),
                               int(sum(nb[h] for h in hs)), float(max(me[h] for h in hs)), int(sum(nu[h] for h in hs))))
        return out
    return [_record(check_input, oe.name, axis, str(i), i, i, int(per[i]), int(nb[i]), float(me[i]), int(nu[i]))
            for i in range(nb.numel())]


def _legacy_problem(causal: bool, Sq: int, Sk: int, B: int, H: int, D: int) -> AttentionProblem:
    """The 2022 problem a caller without one describes (causal, Sq, Sk): the map's categories of old."""
    return AttentionProblem(B=B, H=H, Sq=Sq, Sk=Sk, D=D, dtype="fp32", causal=causal)


def error_map(oe: OutputErrors, check_input: str, causal: bool, Sq: int, Sk: int,
              tile: tuple[int, int] | None, problem: AttentionProblem | None = None) -> list[dict[str, Any]]:
    """The long-format error map of one output (empty when nothing is wrong).

    Args:
        oe: the output's element errors (element_errors).
        check_input: name of the inputs it was computed on ('randn', or an adversarial input).
        causal, Sq, Sk: the problem's mask and lengths (used when `problem` is not given).
        tile: the variant's (query rows, keys) tile, or None (bins of DEFAULT_TILE rows then).
        problem: the problem (oe.problem when not given); needed for GQA, windows, packed and paged.

    Returns:
        Records with MAP_COLUMNS. Axes: 'all' (one bin; lo/hi = first and last wrong row), 'batch'
        ('sequence' for a packed batch), 'head' (query heads; 'kv_head' for dK/dV under GQA), with
        GQA for query outputs also 'kv_head' (the KV head read) and 'head_in_group', 'query_tile'
        (or 'key_tile' for dK/dV: bins of the variant's tile within each sequence), 'd' (not for the
        LSE), 'mask' and 'diag_in_tile' (masked problems: where the row sits against the mask, and
        where its diagonal falls inside the other side's tile), 'window' (windowed problems: where
        the window's edges fall), 'tail' (whole tiles vs each sequence's last partial tile),
        'boundary' (packed batches: tiles of the packed axis shared by two sequences),
        'cache_block' (paged caches: sequences whose cache ends in a partial block).
    """
    import torch

    if oe.n_bad == 0:
        return []
    B, H, N, Dp = oe.shape
    p = problem or oe.problem or _legacy_problem(causal, Sq, Sk, B, H, max(Dp, 1))
    name = oe.name
    key = name in KEY_OUTPUTS
    rs = _rows(oe)
    rec = []
    rows_bad = (rs.nb > 0).any(dim=0).nonzero().flatten()
    first, last = (int(rows_bad.min()), int(rows_bad.max())) if rows_bad.numel() else (-1, -1)
    rec.append(_record(check_input, name, "all", "all", first, last, int(rs.valid.sum()) * rs.per_row, oe.n_bad,
                       float(oe.err.max()), int(oe.unwritten.sum())))
    rec += _index_axis(check_input, oe, "sequence" if p.layout == "varlen" else "batch", 0)
    rec += _index_axis(check_input, oe, "kv_head" if key and p.group > 1 else "head", 1)
    if p.group > 1 and not key:
        rec += _index_axis(check_input, oe, "kv_head", 1, groups=p.group)
        rec += _index_axis(check_input, oe, "head_in_group", 1, groups=p.group, mod=True)
    t = row_tile(name, tile) or DEFAULT_TILE
    tiles = torch.arange(N).expand(B, N) // t
    for lab, lo, hi, n, nbad, mx, nunw in _bins(tiles, rs, [str(k) for k in range((N + t - 1) // t)]):
        rec.append(_record(check_input, name, "key_tile" if key else "query_tile", lab, lo, hi, n, nbad, mx, nunw))
    if name != "lse":
        rec += _index_axis(check_input, oe, "d", 3)
    cats: list[tuple[str, tuple[Any, tuple[str, ...]] | None]] = []
    masked = p.causal or p.window is not None
    if masked:
        cats.append(("mask", axes.mask_labels(p, name, N)))
    if p.window is not None:
        cats.append(("window", axes.window_labels(p, name, N)))
    if masked:
        other = (tile[0] if key else tile[1]) if tile else DEFAULT_TILE
        cats.append(("diag_in_tile", axes.diag_labels(p, name, N, other)))
    cats.append(("tail", axes.tail_labels(p, name, N, t)))
    if p.layout == "varlen":
        cats.append(("boundary", axes.boundary_labels(p, name, N, t)))
    if p.layout == "paged":
        cats.append(("cache_block", axes.cache_labels(p, name, N)))
    for axis, lab_names in cats:
        if lab_names is not None:
            for c in _bins(lab_names[0], rs, lab_names[1]):
                rec.append(_record(check_input, name, axis, *c))
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
    b_axis, b_noun = ("sequence", "sequence") if "sequence" in by else ("batch", "batch")
    h_axis, h_noun = ("head", "head") if "head" in by else ("kv_head", "KV head")
    b_ok, b_bad = split(b_axis)
    h_ok, h_bad = split(h_axis)
    who = ""
    if b_ok:
        segs.append(f"{_label(b_noun, b_ok)} correct")
        who = f"{_label(b_noun, b_bad)} wrong"
    else:
        who = f"every {b_noun} wrong" if len(b_bad) > 1 else "wrong"
    if h_ok:
        who += f" in {_label(h_noun, h_bad)} only"
    elif len(h_bad) > 1:
        who += f" in every {h_noun}"
    if h_axis == "head" and h_ok:
        for axis, text in (("kv_head", "the query heads of KV {}"), ("head_in_group", "head {} of each KV head's group")):
            g_ok, g_bad = split(axis)
            if g_ok and g_bad:
                who += f" ({text.format(_label('head', g_bad) if axis == 'kv_head' else ranges(g_bad))})"
                break
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
    for axis in CATEGORY_AXES:
        recs = by.get(axis, [])
        bad = [r for r in recs if r["n_bad"] > 0]
        # said only where it narrows things down: the categories holding wrong elements are a minority
        narrow = sum(r["n"] for r in bad) <= NARROW_SHARE * sum(r["n"] for r in recs) if recs else False
        if recs and bad and len(bad) < len(recs) and narrow:
            names = ", ".join(f"{row_noun}s with the {r['bin']}" if axis == "diag_in_tile" else
                              f"{row_noun}s {r['bin']}" if axis == "boundary" else
                              str(r["bin"]) if axis == "cache_block" else
                              f"{r['bin']} ({row_noun}s {r['lo']}-{r['hi']})" for r in bad)
            segs.append(f"only in {'the ' if axis == 'tail' else ''}{names}")
    n_unw = int(tot["n_unwritten"])
    if n_unw == 0:
        segs.append("no unwritten elements")
    else:
        where = [int(r["lo"]) for r in by.get(b_axis, []) if r["n_unwritten"] > 0]
        segs.append(f"{n_unw} unwritten elements (NaN poison still there) in {_label(b_noun, where)}")
    return [head, "; ".join(segs)]
