"""The progress callback every way of running `faprof profile` reports through (ProfileOptions itself is
faprof.model.options: the Nsight stages below the run stage read it too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Progress = Callable[[str, dict[str, Any]], None]
"""progress(event, info): 'status', 'bundle', 'start', 'row', 'warning', ... (the CLI draws them)."""


def noop(event: str, info: dict[str, Any]) -> None:
    """A progress callback that shows nothing."""
