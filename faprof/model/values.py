"""Cell values as numbers: the one "float or NaN" for row and table cells (None, NA, text: NaN).

Bundle cells come back from parquet as floats, ints, numpy scalars, None or pandas' NA, and rows
written by older versions may hold text; every reader that needs a number asks `as_float`.
"""

from __future__ import annotations

import math
from typing import Any


def as_float(x: Any) -> float:
    """`x` as a float; NaN for None, pandas' NA, text and anything else that is not a number."""
    try:
        return float(x)
    except (TypeError, ValueError):  # None, text, a list, pandas' NA (its float() raises TypeError)
        return math.nan
