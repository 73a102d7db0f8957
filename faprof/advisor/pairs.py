"""Query-key pairs a problem needs and a tiled kernel computes (causal masks, whole tiles)."""

from __future__ import annotations


def causal_pairs(sq: int, sk: int) -> int:
    """Unmasked (query, key) pairs under top-left causal masking: row i sees keys 0..i."""
    n = min(sq, sk)
    return n * (n + 1) // 2 + max(0, sq - sk) * sk


def tile_pairs(sq: int, sk: int, causal: bool, tile: int) -> int:
    """Pairs a kernel with square tiles of `tile` rows must compute: whole tiles, causal tiles up to
    the one holding each query tile's last row's diagonal."""
    n_kt = -(-sk // tile)
    total = 0
    for i in range(-(-sq // tile)):
        last = min((i + 1) * tile, sq) - 1
        kt = min(n_kt, last // tile + 1) if causal else n_kt
        total += tile * kt * tile
    return total
