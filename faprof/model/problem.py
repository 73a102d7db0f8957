"""The attention problem: shapes, heads, mask, sequence layout and direction, with exact FLOP and byte counts.

Today's attention, each field defaulting to 2022's problem so old scenarios and bundles read
unchanged: grouped-query heads (`Hkv` key/value heads shared by `H // Hkv` query heads; MQA is
Hkv = 1), masks aligned to either corner with an optional sliding window and logit soft-cap
(faprof.model.mask states the rule), packed variable-length batches (`seqlens_q`/`seqlens_k`: the
[tokens, H, D] layout with cumulative offsets, as FlashAttention's varlen functions take it), and
paged KV caches (`page_size`: K/V in a pool of fixed-size blocks, a block table per sequence).

Work counts are exact for the mask used: forward FLOPs are 4·B·H·D per unmasked query-key pair
(two matmuls, 2 FLOPs per multiply-add). Without a mask every Sq·Sk pair counts; with the causal
mask, which is aligned to the top-left corner as in PyTorch SDPA's `is_causal` (query i sees keys
0..i), query i sees min(i + 1, Sk) keys. For Sq = Sk = S that is S(S+1)/2 pairs: FlashAttention's
papers count S²/2, which is lower by a factor S/(S+1) (0.8% at S = 128, 0.02% at S = 4096), so
faprof's causal TFLOP/s read that much higher than the same time counted their way. The backward
pass is labelled with FlashAttention's convention, 2.5x the forward (five matmuls instead of two);
fwd_bwd is 3.5x.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from faprof.errors import FaprofError
from faprof.model.mask import ALIGNS, MaskSpec

#: dtype name -> bytes per element. Names are the ones used in scenario files and tables.
DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}

DIRECTIONS = ("fwd", "bwd", "fwd_bwd")

#: FLOP multiplier of each direction relative to the forward pass (FlashAttention's convention).
DIRECTION_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}

#: The log-sum-exp saved by flash kernels for the backward pass is fp32, one per query row.
LSE_BYTES = 4


def torch_dtype(name: str):  # -> torch.dtype, imported lazily so the model stays torch-free
    """Map a dtype name ('fp16', 'bf16', 'fp32', 'fp64') to the torch dtype."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}[name]


#: Bytes of one index entry: cu_seqlens, per-sequence cache lengths and block tables are int32.
INDEX_BYTES = 4

#: Layouts of the tensors a problem is given in (AttentionProblem.layout).
LAYOUTS = ("dense", "varlen", "paged")

#: Features beyond 2022's problem (equal heads, top-left causal or none, one length per batch,
#: contiguous K/V); a variant declares which it supports (`Variant.features`).
FEATURES = ("gqa", "bottom_right", "window", "softcap", "varlen", "paged")


#: Problem fields stored as integers (parquet may hand them back as floats or numpy scalars) ...
_INT_FIELDS = ("B", "H", "Sq", "Sk", "D", "Hkv", "page_size", "pool_blocks")

#: ... and as JSON lists in table rows (`to_row`).
_JSON_FIELDS = ("window", "seqlens_q", "seqlens_k", "block_table")


@dataclass(frozen=True)
class AttentionProblem:
    """One attention call: O = softmax(scale · Q Kᵀ [soft-capped, masked]) V, per sequence and head.

    Layouts (see `layout`): 'dense' — q [B, H, Sq, D], k and v [B, Hkv, Sk, D] (PyTorch SDPA's);
    'varlen' — q [total_q, H, D], k and v [total_k, Hkv, D] with int32 cu_seqlens_q/k [B + 1]
    (FlashAttention's varlen layout); 'paged' — q [B, H, Sq, D], k and v caches
    [num_blocks, page_size, Hkv, D], an int32 block table [B, max_blocks] and int32 cache lengths [B].
    """

    B: int
    """Batch size (number of sequences)."""
    H: int
    """Number of query heads."""
    Sq: int
    """Query sequence length (with seqlens_q: the longest sequence's)."""
    Sk: int
    """Key/value sequence length (with seqlens_k: the longest sequence's)."""
    D: int
    """Head dimension."""
    dtype: str = "fp16"
    """Element type of Q, K, V and O: one of DTYPE_BYTES' keys."""
    causal: bool = False
    """Causal mask, aligned as `mask_align` says (top-left: query i sees keys 0..i, SDPA's is_causal)."""
    direction: str = "fwd"
    """'fwd', 'bwd' (gradients for a given upstream gradient) or 'fwd_bwd'."""
    scale: float | None = field(default=None, compare=True)
    """Softmax scale; None means 1/sqrt(D)."""
    Hkv: int | None = None
    """Key/value heads (GQA: H % Hkv == 0, query head h reads KV head h // (H // Hkv); MQA: 1). None: H."""
    mask_align: str = "top_left"
    """Corner the causal mask and the window are aligned to: 'top_left' or 'bottom_right' (FlashAttention's)."""
    window: tuple[int, int] | None = None
    """Sliding window (left, right): keys before / after the diagonal a query sees; -1 is unbounded. None: no window."""
    softcap: float = 0.0
    """Logit soft-cap c > 0: scores become c·tanh(scores / c) after scaling (Gemma 2, Grok). 0: none."""
    seqlens_q: tuple[int, ...] | None = None
    """Per-sequence query lengths of a packed (varlen) batch; len == B, max == Sq. None: every sequence Sq."""
    seqlens_k: tuple[int, ...] | None = None
    """Per-sequence key lengths (packed batch or paged cache); len == B, max == Sk. None: every sequence Sk
    (or seqlens_q's, for a packed batch)."""
    page_size: int = 0
    """Tokens per block of a paged KV cache; 0: K/V contiguous."""
    pool_blocks: int = 0
    """Blocks in a paged pool; 0: those in use plus a quarter spare (faprof.correctness.layouts)."""
    block_table: tuple[tuple[int, ...], ...] | None = None
    """A paged cache's block table as a serving system left it (pool block of each sequence's j-th
    block); None: faprof shuffles the blocks in the pool from the run's seed."""

    def __post_init__(self) -> None:
        for name in ("B", "H", "Sq", "Sk", "D"):
            _positive(name, getattr(self, name))
        if self.dtype not in DTYPE_BYTES:
            raise FaprofError(f"problem dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.direction not in DIRECTIONS:
            raise FaprofError(f"problem direction must be one of {list(DIRECTIONS)}, got {self.direction!r}")
        if not isinstance(self.causal, bool):
            raise FaprofError(f"problem field causal must be true or false, got {self.causal!r}")
        self._check_heads()
        self._check_lengths()  # before the mask: whether its corner matters depends on the lengths
        self._check_mask()

    def _check_heads(self) -> None:
        if self.Hkv is None:
            return
        _positive("Hkv", self.Hkv)
        if self.H % self.Hkv:
            raise FaprofError(f"problem H={self.H} is not a multiple of Hkv={self.Hkv}: each key/value head "
                              "must serve the same number of query heads (H % Hkv == 0)")
        if self.Hkv == self.H:
            object.__setattr__(self, "Hkv", None)  # one spelling of 'as many KV heads as query heads'

    def _check_mask(self) -> None:
        if self.mask_align not in ALIGNS:
            raise FaprofError(f"problem mask_align must be one of {list(ALIGNS)}, got {self.mask_align!r}")
        if self.window is not None:
            w = tuple(self.window)
            if len(w) != 2 or any(not isinstance(x, int) or isinstance(x, bool) for x in w):
                raise FaprofError(f"problem window must be two integers [left, right], got {self.window!r}")
            if min(w) < -1:
                raise FaprofError(f"problem window {list(w)} has a negative size: each side is >= 0 keys, "
                                  "or -1 for unbounded")
            object.__setattr__(self, "window", None if w == (-1, -1) else w)
        if not isinstance(self.softcap, int | float) or isinstance(self.softcap, bool) or self.softcap < 0 \
                or math.isnan(self.softcap):
            raise FaprofError(f"problem softcap must be a number >= 0 (0: no cap), got {self.softcap!r}")
        object.__setattr__(self, "softcap", float(self.softcap))
        if self.mask_align == "bottom_right" and not self._align_matters():
            object.__setattr__(self, "mask_align", "top_left")  # the same mask: one spelling, one shape id

    def _align_matters(self) -> bool:
        if not self.causal and self.window is None:
            return False
        return any(q != k for q, k in zip(self.q_lens(), self.k_lens(), strict=True))

    def _check_lengths(self) -> None:
        _positive("page_size", self.page_size, zero_ok=True)
        for name, total in (("seqlens_q", self.Sq), ("seqlens_k", self.Sk)):
            lens = getattr(self, name)
            if lens is None:
                continue
            lens = tuple(lens)
            if not lens or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in lens):
                raise FaprofError(f"problem {name} must be a list of positive integers, got {list(lens)!r}")
            if len(lens) != self.B or max(lens) != total:
                which = "Sq" if name == "seqlens_q" else "Sk"
                raise FaprofError(f"problem {name} has {len(lens)} lengths with longest {max(lens)}, which does not "
                                  f"match B={self.B} and {which}={total}: B is the number of sequences and "
                                  f"{which} the longest one")
            object.__setattr__(self, name, lens)
        if self.seqlens_q is not None and self.seqlens_k is None:
            if self.Sk != self.Sq:
                raise FaprofError("a packed batch with seqlens_q and Sk != Sq needs seqlens_k too")
            object.__setattr__(self, "seqlens_k", self.seqlens_q)
        if self.page_size and self.direction != "fwd":
            raise FaprofError("a paged KV cache is an inference layout: faprof models its forward pass only "
                              f"(direction 'fwd'), got {self.direction!r}")
        if self.page_size and self.seqlens_q is not None:
            raise FaprofError("a paged KV cache takes queries as [B, H, Sq, D]: give seqlens_k (cache lengths), "
                              "not seqlens_q")
        self._check_block_table()
        if self.seqlens_k is not None and self.seqlens_q is None and not self.page_size:
            raise FaprofError("per-sequence key lengths without packed queries need a paged cache (page_size > 0); "
                              "for a packed batch give seqlens_q too")

    def _check_block_table(self) -> None:
        _positive("pool_blocks", self.pool_blocks, zero_ok=True)
        if not self.page_size:
            if self.pool_blocks or self.block_table is not None:
                raise FaprofError("pool_blocks and block_table describe a paged KV cache: set page_size too")
            return
        need = self.blocks_per_seq()
        if self.pool_blocks and self.pool_blocks < sum(need):
            raise FaprofError(f"a pool of {self.pool_blocks} blocks cannot hold the {sum(need)} blocks of "
                              f"{self.page_size} tokens the sequences need")
        if self.block_table is None:
            return
        table = tuple(tuple(row) for row in self.block_table)
        if len(table) != self.B:
            raise FaprofError(f"block_table has {len(table)} rows for B={self.B} sequences: one row per sequence")
        pool = self.pool_blocks or sum(need)
        seen: set[int] = set()
        for b, (row, n) in enumerate(zip(table, need, strict=True)):
            if len(row) < n:
                raise FaprofError(f"block_table row {b} has {len(row)} blocks; sequence {b} needs {n} "
                                  f"({self.k_lens()[b]} tokens in blocks of {self.page_size})")
            for blk in row[:n]:
                if not isinstance(blk, int) or isinstance(blk, bool) or not 0 <= blk < pool:
                    raise FaprofError(f"block_table row {b} points to block {blk!r}, outside the pool of {pool} "
                                      f"blocks (0..{pool - 1}); set pool_blocks if the pool is larger")
                if blk in seen:
                    raise FaprofError(f"block_table gives block {blk} to two sequences (or twice to one)")
                seen.add(blk)
        object.__setattr__(self, "block_table", table)

    # ----------------------------------------------------------------- identity
    @property
    def kv_heads(self) -> int:
        """Key/value heads (H unless GQA/MQA)."""
        return self.Hkv if self.Hkv is not None else self.H

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.H // self.kv_heads

    @property
    def mask(self) -> MaskSpec:
        left, right = self.window if self.window is not None else (-1, -1)
        return MaskSpec(causal=self.causal, align=self.mask_align, left=left, right=right)

    @property
    def layout(self) -> str:
        """'dense', 'varlen' (packed with cu_seqlens) or 'paged' (see the class docstring)."""
        if self.page_size:
            return "paged"
        return "varlen" if self.seqlens_q is not None else "dense"

    def features(self) -> frozenset[str]:
        """What this problem needs beyond 2022's attention (FEATURES); empty for the old problems."""
        f = set()
        if self.Hkv is not None:
            f.add("gqa")
        if self.mask_align == "bottom_right":
            f.add("bottom_right")
        if self.window is not None:
            f.add("window")
        if self.softcap:
            f.add("softcap")
        if self.layout != "dense":
            f.add(self.layout)
        return frozenset(f)

    @property
    def mask_name(self) -> str:
        """'full', 'causal' or 'causal_br', with '_w{left}-{right}' for a window (tables and shape ids)."""
        name = ("causal_br" if self.mask_align == "bottom_right" else "causal") if self.causal else "full"
        if self.window is not None:
            name += f"_w{self.window[0]}-{self.window[1]}" + ("_br" if self.mask_align == "bottom_right"
                                                               and not self.causal else "")
        return name

    @property
    def shape_id(self) -> str:
        """A stable, human-readable id: same problem, same id, in every run and on every machine.

        Fields at their defaults add nothing, so 2022's problems keep the ids of older bundles."""
        head = f"b{self.B}_h{self.H}" + (f"kv{self.Hkv}" if self.Hkv is not None else "")
        sid = f"{head}_sq{self.Sq}_sk{self.Sk}_d{self.D}_{self.dtype}_{self.mask_name}_{self.direction}"
        if self.scale is not None:
            sid += f"_s{self.scale:g}"
        if self.softcap:
            sid += f"_cap{self.softcap:g}"
        if self.layout == "varlen":
            sid += f"_varlen{self.B}x{_digest(self.seqlens_q, self.seqlens_k)}"
        if self.page_size:
            sid += f"_paged{self.page_size}" + (f"x{_digest(self.seqlens_k)}" if self.seqlens_k is not None else "")
            if self.block_table is not None or self.pool_blocks:
                sid += f"_bt{_digest(self.pool_blocks, self.block_table)}"
        return sid

    @property
    def label(self) -> str:
        """A short label for tables: 'B=4 H=8 S=128 D=64' (Sq/Sk when they differ, Hkv, the layout)."""
        s = f"S={self.Sq}" if self.Sq == self.Sk else f"Sq={self.Sq} Sk={self.Sk}"
        h = f"H={self.H}" if self.Hkv is None else f"H={self.H}/{self.Hkv}kv"
        extra = ""
        if self.layout == "varlen":
            extra = f" varlen {self.total_q} tok"
        elif self.layout == "paged":
            extra = f" paged/{self.page_size}"
        if self.window is not None:
            extra += f" win {self.window[0]},{self.window[1]}"
        return f"B={self.B} {h} {s} D={self.D}{extra}"

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.D)

    @property
    def elt_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def with_(self, **changes) -> AttentionProblem:
        """A copy with some fields changed."""
        d = asdict(self)
        d.update(changes)
        return AttentionProblem.from_dict(d)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> AttentionProblem:
        """The problem `to_dict` gave (after a JSON or parquet round trip: lists become tuples again)."""
        d = dict(d)
        for key in ("window", "seqlens_q", "seqlens_k"):
            if d.get(key) is not None:
                d[key] = tuple(int(x) for x in d[key])
        if d.get("block_table") is not None:
            d["block_table"] = tuple(tuple(int(x) for x in row) for row in d["block_table"])
        return cls(**d)

    def to_row(self) -> dict[str, Any]:
        """The problem as a table row's columns (PROBLEM_COLUMNS, in order): the fields, the mask's name and
        the layout; sequences as JSON lists (parquet columns of one type). `from_row` inverts it."""
        def value(column: str) -> Any:
            v = getattr(self, _ROW_ATTRIBUTE.get(column, column))
            if column in _JSON_FIELDS:
                return json.dumps([list(x) if isinstance(x, tuple) else x for x in v]) if v else None
            return v

        return {c: value(c) for c in PROBLEM_COLUMNS}

    @classmethod
    def from_row(cls, row: Any) -> AttentionProblem | None:
        """The problem a table row describes (`to_row`'s columns, parquet's numpy values included; rows
        of older bundles without the newer columns give their defaults); None when the row lacks fields
        or they do not form one."""
        d: dict[str, Any] = {}
        try:
            for f in fields(cls):
                v = row.get(f.name)
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue
                if f.name in _INT_FIELDS:
                    v = int(v)
                elif f.name == "causal":
                    v = bool(v)
                elif isinstance(v, str) and f.name in _JSON_FIELDS:
                    v = json.loads(v)
                elif hasattr(v, "tolist"):  # numpy arrays and scalars from parquet
                    v = v.tolist()
                d[f.name] = v
            mask = row.get("mask")
            if "mask_align" not in d and isinstance(mask, str) and mask.startswith("causal_br"):
                d["mask_align"] = "bottom_right"  # the mask's name carries the alignment
            return cls.from_dict(d)
        except (TypeError, ValueError, FaprofError):
            return None

    # ------------------------------------------------------------- sequences
    def q_lens(self) -> tuple[int, ...]:
        """Query length of each sequence."""
        return self.seqlens_q if self.seqlens_q is not None else (self.Sq,) * self.B

    def k_lens(self) -> tuple[int, ...]:
        """Key length of each sequence."""
        return self.seqlens_k if self.seqlens_k is not None else (self.Sk,) * self.B

    @property
    def total_q(self) -> int:
        return sum(self.q_lens())

    @property
    def total_k(self) -> int:
        return sum(self.k_lens())

    def blocks_per_seq(self) -> tuple[int, ...]:
        """Blocks of a paged cache each sequence holds (the last one partly filled)."""
        if not self.page_size:
            return ()
        return tuple(-(-k // self.page_size) for k in self.k_lens())

    # -------------------------------------------------------------- work counts
    def unmasked_pairs(self) -> float:
        """Query-key pairs per (sequence, head) that the mask lets through: exact (an integer) for a
        batch of equal sequences, the mean over the sequences otherwise (faprof.model.mask's rule)."""
        total = self.total_pairs()
        return total // self.B if total % self.B == 0 else total / self.B

    def total_pairs(self) -> int:
        """Query-key pairs per head that the mask lets through, summed over every sequence (exact)."""
        m = self.mask
        return sum(m.pairs(q, k) for q, k in zip(self.q_lens(), self.k_lens(), strict=True))

    def fwd_flops(self) -> float:
        """Forward FLOPs: 4·H·D per unmasked query-key pair of every sequence (exact for the mask)."""
        return 4.0 * self.H * self.total_pairs() * self.D

    def flops(self) -> float:
        """FLOPs of this problem's direction: fwd x1, bwd x2.5, fwd_bwd x3.5 (FlashAttention's convention
        for the backward: five matmuls to the forward's two)."""
        return self.fwd_flops() * DIRECTION_FLOP_FACTOR[self.direction]

    def _io_elems(self) -> tuple[int, int]:
        """(Q or O elements, K or V elements a kernel must read): K/V once per KV head; with a window,
        or a top-left causal mask over more keys than queries, only the keys some query sees."""
        q = self.total_q * self.H * self.D
        if self.window is not None or self.causal:
            m = self.mask
            keys = sum(m.visible_keys(a, b) for a, b in zip(self.q_lens(), self.k_lens(), strict=True))
        else:
            keys = self.total_k
        return q, keys * self.kv_heads * self.D

    def index_bytes(self) -> int:
        """Bytes of the index tensors a kernel reads: cu_seqlens (varlen), cache lengths and the block
        table entries in use (paged)."""
        if self.layout == "varlen":
            return 2 * (self.B + 1) * INDEX_BYTES
        if self.layout == "paged":
            return (self.B + sum(self.blocks_per_seq())) * INDEX_BYTES
        return 0

    def min_bytes(self) -> int:
        """The fewest bytes the direction must move through device memory.

        Each input read once and each output written once: forward reads Q, K, V (K/V once per KV
        head) and writes O (flash kernels also write the fp32 log-sum-exp, counted here since they
        need it for the backward); backward reads Q, K, V, O, dO and the LSE and writes dQ, dK, dV.
        Index tensors (cu_seqlens, block tables) count once per pass.
        """
        q, kv = self._io_elems()
        e = self.elt_bytes
        lse = self.total_q * self.H * LSE_BYTES
        idx = self.index_bytes()
        fwd = e * (2 * q + 2 * kv) + lse + idx
        bwd = e * (4 * q + 4 * kv) + lse + idx
        return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[self.direction]

    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of the minimum traffic (the roofline's x axis for an ideal kernel)."""
        return self.flops() / self.min_bytes()

    def bound(self, ridge_flop_per_byte: float | None) -> str:
        """'memory' when an ideal kernel is limited by DRAM bandwidth on a GPU whose ridge point
        (peak FLOP/s over peak bytes/s) is given, else 'compute'. Decode (a few queries against a
        long cache) is memory-bound on every GPU; prefill is compute-bound. Unknown ridge: 'compute'."""
        if not ridge_flop_per_byte:
            return "compute"
        return "memory" if self.arithmetic_intensity() < ridge_flop_per_byte else "compute"

    # ---------------------------------------------------------- memory footprint
    def footprint_bytes(self, algorithm: str) -> int:
        """Device memory an algorithm needs for this problem, by construction (not measured).

        'standard' materializes the Sq x Sk score matrix S and the probabilities P in the
        element type (what an explicit matmul-softmax-matmul does); 'flash' keeps them on chip
        and stores only the fp32 LSE. Both hold Q, K, V and O (and for a backward, dO, dQ, dK,
        dV; standard attention's backward also needs dS/dP of the same Sq x Sk size).
        """
        q = self.total_q * self.H * self.D
        kv = self.total_k * self.kv_heads * self.D
        e = self.elt_bytes
        io = e * (2 * q + 2 * kv)
        if self.direction != "fwd":
            io += e * (2 * q + 2 * kv)  # dO, dQ and dK, dV
        scores = self.H * e * sum(a * b for a, b in zip(self.q_lens(), self.k_lens(), strict=True))
        if algorithm == "standard":
            n_matrices = 2 if self.direction == "fwd" else 4  # S, P (+ dP, dS for the backward)
            return io + n_matrices * scores
        if algorithm == "flash":
            return io + self.total_q * self.H * LSE_BYTES + self.index_bytes()
        raise FaprofError(f"footprint algorithm must be 'standard' or 'flash', got {algorithm!r}")

    def footprint_reduction(self) -> float:
        """Standard attention's footprint over flash attention's (the seeds' 'memory reduction')."""
        return self.footprint_bytes("standard") / self.footprint_bytes("flash")

    def tokens(self) -> int:
        """Query tokens processed per call (every sequence's), for tokens/s throughput as in report 001."""
        return self.total_q


#: Fields a table row shows through other columns (`to_row`): the mask's corner through the mask's name
#: ('causal_br', ...), with the layout beside it.
ROW_SHOWN_AS: dict[str, tuple[str, ...]] = {"mask_align": ("mask", "layout")}

#: Columns a row derives from the fields, last: the per-sequence lengths' totals ...
ROW_DERIVED = ("total_q", "total_k")

#: ... after the per-sequence lengths themselves (the order bundles have).
_ROW_LAST = ("seqlens_q", "seqlens_k")

#: The problem's columns in a table row, in order (faprof.model.schema puts them in ROW_COLUMNS): every
#: field of AttentionProblem, as itself or as ROW_SHOWN_AS says, the per-sequence lengths and their totals last.
PROBLEM_COLUMNS: tuple[str, ...] = (
    tuple(c for f in fields(AttentionProblem) if f.name not in _ROW_LAST for c in ROW_SHOWN_AS.get(f.name, (f.name,)))
    + _ROW_LAST + ROW_DERIVED)

#: The attribute a column's value comes from where it is not the column's name.
_ROW_ATTRIBUTE = {"Hkv": "kv_heads", "mask": "mask_name"}


def _positive(name: str, value, zero_ok: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero_ok else 1):
        what = "a non-negative" if zero_ok else "a positive"
        raise FaprofError(f"problem field {name} must be {what} integer, got {value!r}")


def _digest(*parts) -> str:
    """8 hex digits naming a list of lengths in a shape id (the full lists are in the row)."""
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:8]
