"""One line of `faprof doctor`: a check's name, status, what was found and what to do about it.

Lives below every stage so that each stage can describe its own tools (ncu, nsys, the GPU timer)
without importing the doctor, which sits above them all and gathers the lines.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    """One doctor line."""

    name: str
    """What was checked (e.g. 'ncu', 'gpu timer')."""
    status: str
    """'ok', 'warn', 'fail' or 'info'."""
    detail: str
    """What was found."""
    hint: str = ""
    """What to do when it is not ok."""
