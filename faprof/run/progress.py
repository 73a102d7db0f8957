"""The progress callback every way of running `faprof profile` reports through (ProfileOptions itself is
faprof.model.options: the Nsight stages below the run stage read it too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Progress = Callable[[str, dict[str, Any]], None]
"""progress(event, info): 'status', 'bundle', 'start', 'row', 'warning', ... (the CLI draws them)."""


def noop(event: str, info: dict[str, Any]) -> None:
    """A progress callback that shows nothing."""


def duration_text(s: float) -> str:
    """A time the user waits for, as a plan says it: '40 s', '12 min', '1.5 h'."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
