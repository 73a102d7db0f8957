"""Number formats for people (reports, CLI tables): units in headers, no `nan`, no `e+0` notation.

Every formatter takes anything (None, NaN, numpy scalars, strings) and returns a string; a missing
value is MISSING, never 'nan'. Large numbers get thousands separators instead of exponents; small
error magnitudes (below 1e-3) keep a short negative exponent (`4.7e-07`), the way the seed
reports print them.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from faprof.model.values import as_float

#: What a table cell shows when there is no value.
MISSING = "–"


def missing(x: Any) -> bool:
    v = as_float(x)
    return v != v or math.isinf(v)


def sig(x: Any, digits: int = 3, sep: bool = True) -> str:
    """`digits` significant digits in plain notation: 0.00822, 0.582, 12.4, 13,300 (never 1.33e+04)."""
    v = as_float(x)
    if v != v or math.isinf(v):
        return MISSING
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    if abs(round(v, digits - 1 - mag)) >= 10 ** (mag + 1):  # 0.0999 -> 0.10, not 0.100
        mag += 1
    decimals = max(0, digits - 1 - mag)
    rounded = round(v, decimals if decimals > 0 else -(mag - digits + 1))
    if decimals == 0:
        return f"{rounded:,.0f}" if sep else f"{rounded:.0f}"
    return f"{rounded:,.{decimals}f}" if sep else f"{rounded:.{decimals}f}"


def ms(x: Any) -> str:
    """A time in milliseconds (the unit goes in the header): 3 significant digits, at least 2 decimals."""
    v = as_float(x)
    if v != v:
        return MISSING
    return sig(v, 3) if abs(v) < 100 else f"{v:,.1f}"


def pct(x: Any, decimals: int = 1) -> str:
    """A percentage (header says %): 16.2, 0.03 for tiny shares."""
    v = as_float(x)
    if v != v:
        return MISSING
    if 0 < abs(v) < 0.1:
        return sig(v, 1)
    return f"{v:.{decimals}f}"


def ratio(x: Any) -> str:
    """A speed ratio with its 'x': 1.31x, 0.58x, 12x, 0.0047x, 335x."""
    v = as_float(x)
    if v != v or math.isinf(v) or v <= 0:
        return MISSING
    if v >= 100:
        return f"{v:,.0f}x"
    if v >= 10:
        return f"{v:.1f}x"
    if v >= 0.1:
        return f"{v:.2f}x"
    return f"{sig(v, 2)}x"


def err(x: Any) -> str:
    """An error magnitude: 0.00195 down to 1e-3, then 4.7e-07 (never a positive exponent)."""
    v = as_float(x)
    if v != v:
        return MISSING
    if v == 0:
        return "0"
    if abs(v) >= 1e-3:
        return sig(v, 3)
    return f"{v:.1e}"


def as_written(x: Any) -> str:
    """A quoted figure as its source wrote it (0.579, 26312.6, 0.001953), without exponents."""
    v = as_float(x)
    if v != v:
        return text(x)
    return f"{v:g}" if 1e-4 <= abs(v) < 1e6 or v == 0 else (f"{v:,.0f}" if abs(v) >= 1e6 else f"{v:.2e}")


def integer(x: Any) -> str:
    """A count or seed as a whole number: 2723400785, never 2723400785.0 or 2.7e+09."""
    v = as_float(x)
    if v != v or math.isinf(v):
        return MISSING
    return f"{int(round(v))}"


def count(x: Any) -> str:
    v = as_float(x)
    return MISSING if v != v else f"{int(round(v)):,}"


def mib(x: Any) -> str:
    """Bytes as MiB (header says MiB)."""
    v = as_float(x)
    return MISSING if v != v else sig(v / 2**20, 3)


def text(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA:
        return MISSING
    s = str(x)
    return MISSING if s.lower() in ("nan", "none", "<na>", "") else s


_BAD = re.compile(r"(?<![A-Za-z_])(nan|NAN|<NA>)(?![A-Za-z_])|\|\s*NaN\s*\||\d[eE]\+\d")


def problems_in(rendered: str) -> list[str]:
    """Lines of a rendered report that show 'nan' or positive-exponent notation (for tests and checks)."""
    return [line for line in rendered.splitlines() if _BAD.search(line)]


#: Characters of data-derived text that Markdown would read as markup: emphasis, HTML, table cells.
#: (Brackets stay: without a following '(url)' they are not a link; backticks stay: faprof's own texts
#: quote commands in them, and a code span shows its content literally.)
_MD_SPECIAL = re.compile(r"([\\*<>|])")
#: An underscore at a word's edge opens or closes emphasis (`__launch_bounds__` reads as bold); inside a
#: word (`fa2_mma`) it does not, and stays as written.
_MD_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md(x: Any) -> str:
    """Text from the data (advisor evidence, kernel names, reasons) as Markdown that renders as written:
    '__launch_bounds__' stays literal, '<...>' template arguments are not taken for HTML tags."""
    s = text(x)
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return _MD_EDGE_UNDERSCORE.sub(r"\\_", s)
