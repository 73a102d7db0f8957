"""What a run's rows stage leaves for the bundle epilogue (and for marking an interrupted run)."""

from __future__ import annotations

from dataclasses import dataclass, field

from faprof.run.progress import Progress, noop
from faprof.store import Bundle


@dataclass
class RunState:
    """Filled by a backend (local or cluster) as its rows stage goes."""

    progress: Progress = noop
    bundle: Bundle | None = None
    """The run's bundle, from the moment it exists (None before, and after a refused resume)."""
    cuda_ok: bool = False
    """Whether the workers see a GPU (the Nsight stages need one)."""
    gpu_indices: list[int] = field(default_factory=list)
    """The GPUs of a `--gpus` run (the Nsight stages fan out over them); empty for one worker."""
    worker_restarts: int | None = None
    """Workers replaced after a crash or hang (None where the backend cannot tell: Dask)."""
    timing_wall_s: float | None = None
    """This session's wall time of the rows stage."""
