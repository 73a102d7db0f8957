"""Query-key pairs a problem needs and a tiled kernel computes (every mask, every sequence, whole tiles)."""

from __future__ import annotations

import functools
import math
from typing import Any

from faprof.model.mask import MaskSpec
from faprof.model.problem import AttentionProblem


@functools.lru_cache(maxsize=4096)  # pure in its arguments; rules ask it again for every kernel of a call
def tile_pairs(sq: int, sk: int, causal: bool, tile: int, mask: MaskSpec | None = None) -> int:
    """Pairs a kernel with square tiles of `tile` rows must compute for one sequence: for each query tile,
    whole key tiles from the one holding the first key any of its rows sees to the one holding the last
    (`mask`: the problem's mask, any alignment and window; default: `causal` top-left or none)."""
    mask = mask if mask is not None else MaskSpec(causal=causal)
    n_kt = -(-sk // tile)
    total = 0
    for i in range(-(-sq // tile)):
        if not mask.causal and not mask.windowed:
            kt = n_kt
        else:
            # consecutive rows' key intervals move by one, so a query tile's keys are one interval from its
            # first row's lowest key to its last row's highest (rows that see nothing skipped)
            rows = range(i * tile, min((i + 1) * tile, sq))
            spans = [mask.key_range(r, sq, sk) for r in rows]
            spans = [(lo, hi) for lo, hi in spans if hi >= lo]
            kt = (max(h for _, h in spans) // tile - min(lo for lo, _ in spans) // tile + 1) if spans else 0
        total += tile * kt * tile
    return total


def problem_pairs(problem: AttentionProblem, tile: int) -> tuple[int, int]:
    """(exact pairs, pairs of whole `tile`-row tiles) of one head over every sequence of the problem."""
    mask = problem.mask
    lens = list(zip(problem.q_lens(), problem.k_lens(), strict=True))
    exact = sum(mask.pairs(q, k) for q, k in lens)
    tiled = sum(tile_pairs(q, k, mask.causal, tile, mask) for q, k in lens)
    return exact, tiled


def row_pairs(row: dict[str, Any], tile: int) -> tuple[int, int, str] | None:
    """problem_pairs (one head, every sequence) of the problem a measurement row describes, and how its tiles are bounded ('up to the
    diagonal', "over each query tile's window" or ''); a row without every problem field (older bundles)
    falls back to its B, Sq, Sk and causal flag (B top-left sequences); None without Sq, Sk, causal."""
    problem = AttentionProblem.from_row(row)
    if problem is not None:
        exact, tiled = problem_pairs(problem, tile)
        over = (" over each query tile's window" if problem.window is not None
                else " up to the diagonal" if problem.causal else "")
        return exact, tiled, over
    try:
        sq, sk, causal = float(row["Sq"]), float(row["Sk"]), row["causal"]
    except (KeyError, TypeError, ValueError):
        return None
    if causal is None or not (math.isfinite(sq) and math.isfinite(sk)):
        return None
    try:
        b = int(row.get("B") or 1)
    except (TypeError, ValueError):
        b = 1
    mask = MaskSpec(causal=bool(causal))
    exact = b * mask.pairs(int(sq), int(sk))
    return exact, b * tile_pairs(int(sq), int(sk), bool(causal), tile), " up to the diagonal" if causal else ""
