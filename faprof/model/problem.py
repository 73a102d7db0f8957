"""The attention problem: shapes, dtype, mask and direction, with FLOP and byte counts.

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

import math
from dataclasses import asdict, dataclass, field

from faprof.errors import FaprofError

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


@dataclass(frozen=True)
class AttentionProblem:
    """One attention call: O = softmax(scale · Q Kᵀ [+ causal mask]) V, per batch and head.

    Tensors are laid out [B, H, S, D] (PyTorch SDPA's layout), contiguous.
    """

    B: int
    """Batch size."""
    H: int
    """Number of heads (query and key/value heads are equal: no GQA)."""
    Sq: int
    """Query sequence length."""
    Sk: int
    """Key/value sequence length."""
    D: int
    """Head dimension."""
    dtype: str = "fp16"
    """Element type of Q, K, V and O: one of DTYPE_BYTES' keys."""
    causal: bool = False
    """Causal mask, aligned to the top-left corner (query i sees keys 0..i), as in PyTorch SDPA's is_causal."""
    direction: str = "fwd"
    """'fwd', 'bwd' (gradients for a given upstream gradient) or 'fwd_bwd'."""
    scale: float | None = field(default=None, compare=True)
    """Softmax scale; None means 1/sqrt(D)."""

    def __post_init__(self) -> None:
        for name in ("B", "H", "Sq", "Sk", "D"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FaprofError(f"problem field {name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise FaprofError(f"problem dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.direction not in DIRECTIONS:
            raise FaprofError(f"problem direction must be one of {list(DIRECTIONS)}, got {self.direction!r}")
        if not isinstance(self.causal, bool):
            raise FaprofError(f"problem field causal must be true or false, got {self.causal!r}")

    # ----------------------------------------------------------------- identity
    @property
    def shape_id(self) -> str:
        """A stable, human-readable id: same problem, same id, in every run and on every machine."""
        mask = "causal" if self.causal else "full"
        sid = f"b{self.B}_h{self.H}_sq{self.Sq}_sk{self.Sk}_d{self.D}_{self.dtype}_{mask}_{self.direction}"
        if self.scale is not None:
            sid += f"_s{self.scale:g}"
        return sid

    @property
    def label(self) -> str:
        """A short label for tables: 'B=4 H=8 S=128 D=64' (or Sq/Sk when they differ)."""
        s = f"S={self.Sq}" if self.Sq == self.Sk else f"Sq={self.Sq} Sk={self.Sk}"
        return f"B={self.B} H={self.H} {s} D={self.D}"

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
        return AttentionProblem(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    # -------------------------------------------------------------- work counts
    def unmasked_pairs(self) -> int:
        """Query-key pairs per (batch, head) that the mask lets through (exact).

        Causal is top-left aligned: query i (0-based) sees keys 0..min(i, Sk - 1).
        """
        sq, sk = self.Sq, self.Sk
        if not self.causal:
            return sq * sk
        if sq <= sk:
            return sq * (sq + 1) // 2
        return sk * (sk + 1) // 2 + (sq - sk) * sk

    def fwd_flops(self) -> float:
        """Forward FLOPs: 4·B·H·D per unmasked query-key pair (exact for the mask; see the module doc)."""
        return 4.0 * self.B * self.H * self.unmasked_pairs() * self.D

    def flops(self) -> float:
        """FLOPs of this problem's direction: fwd x1, bwd x2.5, fwd_bwd x3.5 (FlashAttention's convention
        for the backward: five matmuls to the forward's two)."""
        return self.fwd_flops() * DIRECTION_FLOP_FACTOR[self.direction]

    def _io_elems(self) -> tuple[int, int]:
        bh = self.B * self.H
        return bh * self.Sq * self.D, bh * self.Sk * self.D

    def min_bytes(self) -> int:
        """The fewest bytes the direction must move through device memory.

        Each input read once and each output written once: forward reads Q, K, V and writes O
        (flash kernels also write the fp32 log-sum-exp, counted here since they need it for the
        backward); backward reads Q, K, V, O, dO and the LSE and writes dQ, dK, dV.
        """
        q, kv = self._io_elems()
        e = self.elt_bytes
        lse = self.B * self.H * self.Sq * LSE_BYTES
        fwd = e * (2 * q + 2 * kv) + lse
        bwd = e * (4 * q + 4 * kv) + lse
        return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[self.direction]

    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of the minimum traffic (the roofline's x axis for an ideal kernel)."""
        return self.flops() / self.min_bytes()

    # ---------------------------------------------------------- memory footprint
    def footprint_bytes(self, algorithm: str) -> int:
        """Device memory an algorithm needs for this problem, by construction (not measured).

        'standard' materializes the Sq x Sk score matrix S and the probabilities P in the
        element type (what an explicit matmul-softmax-matmul does); 'flash' keeps them on chip
        and stores only the fp32 LSE. Both hold Q, K, V and O (and for a backward, dO, dQ, dK,
        dV; standard attention's backward also needs dS/dP of the same Sq x Sk size).
        """
        q, kv = self._io_elems()
        e = self.elt_bytes
        io = e * (2 * q + 2 * kv)
        if self.direction != "fwd":
            io += e * (2 * q + 2 * kv)  # dO, dQ and dK, dV
        scores = self.B * self.H * self.Sq * self.Sk * e
        if algorithm == "standard":
            n_matrices = 2 if self.direction == "fwd" else 4  # S, P (+ dP, dS for the backward)
            return io + n_matrices * scores
        if algorithm == "flash":
            return io + self.B * self.H * self.Sq * LSE_BYTES
        raise FaprofError(f"footprint algorithm must be 'standard' or 'flash', got {algorithm!r}")

    def footprint_reduction(self) -> float:
        """Standard attention's footprint over flash attention's (the seeds' 'memory reduction')."""
        return self.footprint_bytes("standard") / self.footprint_bytes("flash")

    def tokens(self) -> int:
        """Query tokens processed per call (B·Sq), for tokens/s throughput as in report 001."""
        return self.B * self.Sq
