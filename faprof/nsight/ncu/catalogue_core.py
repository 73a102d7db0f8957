"""The metric catalogue's building blocks: the compute capabilities it knows and the Concept type.

`faprof.nsight.ncu.catalogue` is the joined catalogue and its lookups; the names here (known CCs, the
Concept type, key columns) are imported from this module. The catalogue's entries are written
with the helpers here (`_same`, `_per_cc`) in `catalogue_memory` and `catalogue_accounting`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# ----------------------------------------------------------------------------------- identities

#: Compute capabilities the catalogue has names for (Ampere A100, GA10x, Ada, Hopper).
KNOWN_CCS = ("8.0", "8.6", "8.9", "9.0")

#: Chip names `ncu --query-metrics --chip` takes for each CC (one representative chip each).
CC_CHIPS = {"8.0": "ga100", "8.6": "ga102", "8.9": "ad102", "9.0": "gh100"}

#: Range name and label of the per-(variant, shape_id) aggregate rows of ncu_summary and roofline.
ALL_KERNELS = "(all)"

#: Columns that identify one profiled kernel launch in every ncu table.
KEY_COLUMNS = ("variant", "shape_id", "kernel", "kernel_id", "launch")

#: Values `occupancy_limiter` can take: what bounds the blocks that fit on one SM.
OCCUPANCY_LIMITERS = ("registers", "shared_memory", "warps", "blocks", "barriers")

#: Order used to break ties between equal occupancy limits: a resource the kernel's author can
#: change (registers, shared memory) is named before a shape limit (warps, blocks).
_LIMITER_METRICS = {
    "registers": "launch__occupancy_limit_registers",
    "shared_memory": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
    "barriers": "launch__occupancy_limit_barriers",
}


def cc_key(cc: str | tuple[int, int] | None) -> str:
    """The catalogue column for a compute capability: itself when known, else the nearest older one.

    Args:
        cc: "8.6", (8, 6), or None (treated as the newest known CC).

    Returns:
        One of KNOWN_CCS. A newer chip (sm_100, sm_120) maps to "9.0" and an older Turing-class one
        to "8.0": names mostly carry over, and a name a chip lacks is simply absent from its report.
    """
    if cc is None:
        return KNOWN_CCS[-1]
    if isinstance(cc, tuple):
        cc = f"{cc[0]}.{cc[1]}"
    if cc in KNOWN_CCS:
        return cc
    try:
        major, minor = (int(x) for x in str(cc).split(".")[:2])
    except ValueError:
        return KNOWN_CCS[-1]
    older = [k for k in KNOWN_CCS if tuple(int(x) for x in k.split(".")) <= (major, minor)]
    return older[-1] if older else KNOWN_CCS[0]


# ----------------------------------------------------------------------------------- catalogue


@dataclass(frozen=True)
class Concept:
    """One quantity faprof reads from ncu, with its metric names per compute capability."""

    key: str
    """Catalogue key, e.g. "achieved_occupancy"."""
    description: str
    """What it measures, in a line."""
    names: Mapping[str, tuple[str, ...]]
    """CC ("8.0", ...) -> metric names in order of preference (the first one a report holds wins)."""
    request: bool = False
    """Whether faprof asks ncu for it on top of the section set (`--metrics`), so that even
    `--set basic` yields FLOPs, DRAM bytes, the L2 hit rate, bank conflicts and the roofline peaks."""
    provided_by: str = ""
    """For a concept faprof does not request: which set provides it (a rule reading it has a
    fallback where it is absent, and says which metric it lacks)."""

    def for_cc(self, cc: str | tuple[int, int] | None) -> tuple[str, ...]:
        """Metric names of this concept on a compute capability (possibly empty)."""
        return self.names.get(cc_key(cc), ())


def _same(*names: str) -> dict[str, tuple[str, ...]]:
    """The same names on every known CC (for metrics whose name did not change since sm_80)."""
    return {cc: tuple(names) for cc in KNOWN_CCS}


def _per_cc(common: Sequence[str] = (), **by_cc: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Names per CC: keyword sm80=..., sm86=..., sm89=..., sm90=... first, then the common ones."""
    out = {}
    for cc in KNOWN_CCS:
        out[cc] = tuple(by_cc.get("sm" + cc.replace(".", ""), ())) + tuple(common)
    return out
