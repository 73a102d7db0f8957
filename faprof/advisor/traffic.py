"""Bytes by memory level: what a call moved through DRAM, L2 and L1/shared memory, against what the
problem needs and what the comparator moved.

For one call (its launches summed), per level:

- DRAM: bytes read and written (`dram__bytes_read/write`), and the L2 hit rate;
- L2: sectors the SMs asked L2 for, by operation (read, write, atomic, reduction: `lts__t_sectors_srcunit_tex_op_*`),
  x 32 bytes; bundles recorded before those counters fall back to the L1/TEX global and local sectors
  plus the cp.async (LDGSTS) ones, which is what L1 asked for (an upper bound of what reached L2);
- shared memory: wavefronts (each up to 128 bytes) without the bank-conflict replays, the traffic the
  kernel asked for.

Against (a) the compulsory bytes of the problem (`AttentionProblem.min_bytes()`: inputs read once,
outputs written once), which gives a re-read factor per level (bytes / compulsory), and (b) the
comparator's bytes, which gives the excess a level carries. Excess bytes become time at that level's
bandwidth: DRAM at the measured bandwidth of the timed row (`mem_bw_gbs`) when there is one, else at
ncu's peak; L2 and shared memory at ncu's peaks (a lower bound: a level rarely runs at its peak).

Every figure reads counters and the problem's shape, never a kernel's name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from faprof.advisor.evidence import Call, Launch, nansum, ok
from faprof.model.problem import AttentionProblem
from faprof.model.values import as_float

#: Bytes of one L1/L2 sector.
SECTOR_BYTES = 32
#: Bytes of one shared-memory wavefront at most (32 banks x 4 bytes).
WAVEFRONT_BYTES = 128

#: Levels, outermost first.
LEVELS = ("dram", "l2", "shared")

#: Catalogue keys this module reads (tests/test_advise_metrics.py checks each is requested).
METRIC_KEYS = ("dram_bytes_read", "dram_bytes_write", "l2_hit_rate", "l2_sectors_read", "l2_sectors_write",
               "l2_sectors_atom", "l2_sectors_red", "global_ld_sectors", "global_st_sectors", "local_ld_sectors",
               "local_st_sectors", "global_ldgsts_sectors_bypass", "global_ldgsts_sectors_access",
               "smem_wavefronts_ld", "smem_wavefronts_st", "smem_bank_conflicts_ld", "smem_bank_conflicts_st",
               "smem_wavefronts", "peak_dram_bytes_per_cycle", "dram_clock", "peak_l2_bytes_per_cycle", "l2_clock",
               "peak_smem_wavefronts_per_cycle", "sm_clock")


@dataclass
class Level:
    """Traffic at one memory level of one call."""

    name: str
    read: float = math.nan
    write: float = math.nan
    atomic: float = math.nan
    """Atomic and reduction bytes (read-modify-write done by the memory system)."""
    bandwidth: float = math.nan
    """Bytes per second that turn this level's bytes into time."""
    bandwidth_source: str = ""
    source: str = ""
    """Which counters gave the bytes."""

    @property
    def total(self) -> float:
        return nansum(self.read, self.write, self.atomic)


@dataclass
class Traffic:
    """A call's bytes by level, and the problem's compulsory bytes."""

    variant: str
    shape_id: str
    compulsory: float
    levels: dict[str, Level] = field(default_factory=dict)
    l2_hit_rate: float = math.nan
    """% of L2 sectors that hit (weighted by the launches' L2 sectors or durations)."""
    flops: float = math.nan
    """The problem's model FLOPs (for bytes per FLOP)."""

    def reread(self, level: str) -> float:
        """The level's bytes over the compulsory bytes (1 = every input read once, every output written once)."""
        lv = self.levels.get(level)
        if lv is None or not ok(lv.total) or not ok(self.compulsory) or self.compulsory <= 0:
            return math.nan
        return lv.total / self.compulsory


def _sum(launches: list[Launch], key: str) -> float:
    return nansum(*(lz.metric(key) for lz in launches))


def _l2_level(lzs: list[Launch]) -> Level:
    sectors = {k: _sum(lzs, f"l2_sectors_{k}") for k in ("read", "write", "atom", "red")}
    if ok(sectors["read"]):
        return Level("l2", SECTOR_BYTES * sectors["read"], SECTOR_BYTES * nansum(sectors["write"]),
                     SECTOR_BYTES * nansum(sectors["atom"], sectors["red"]),
                     source="lts__t_sectors_srcunit_tex_op_{read,write,atom,red}")
    read = nansum(_sum(lzs, "global_ld_sectors"), _sum(lzs, "local_ld_sectors"),
                  _sum(lzs, "global_ldgsts_sectors_bypass"), _sum(lzs, "global_ldgsts_sectors_access"))
    write = nansum(_sum(lzs, "global_st_sectors"), _sum(lzs, "local_st_sectors"))
    return Level("l2", SECTOR_BYTES * read if ok(read) else math.nan, SECTOR_BYTES * write if ok(write) else math.nan,
                 source="L1/TEX global, local and cp.async sectors (what L1 asked for: an upper bound of L2's)")


def _shared_level(lzs: list[Launch]) -> Level:
    ld = _sum(lzs, "smem_wavefronts_ld")
    st = _sum(lzs, "smem_wavefronts_st")
    c_ld = nansum(_sum(lzs, "smem_bank_conflicts_ld"))
    c_st = nansum(_sum(lzs, "smem_bank_conflicts_st"))
    if not ok(ld):
        total = _sum(lzs, "smem_wavefronts")
        return Level("shared", WAVEFRONT_BYTES * total if ok(total) else math.nan,
                     source="shared wavefronts x 128 B (bank conflicts not separable)")
    return Level("shared", WAVEFRONT_BYTES * max(0.0, ld - c_ld), WAVEFRONT_BYTES * max(0.0, nansum(st) - c_st),
                 source="shared wavefronts less bank-conflict replays, x 128 B (an upper bound per wavefront)")


def _peak(lz: Launch, per_cycle: str, clock: str) -> float:
    p, c = lz.metric(per_cycle), lz.metric(clock)
    return p * c if ok(p) and ok(c) and p > 0 and c > 0 else math.nan


def _bandwidths(call: Call, levels: dict[str, Level], launches: list[Launch]) -> None:
    """Bytes per second per level: DRAM measured on the timed row when present, else ncu's peaks."""
    lz = max(launches, key=lambda x: x.duration_ms if ok(x.duration_ms) else 0.0)
    measured = as_float(call.measurement.get("mem_bw_gbs"))
    dram = levels["dram"]
    if ok(measured) and measured > 0:
        dram.bandwidth, dram.bandwidth_source = measured * 1e9, "mem_bw_gbs of the timed row"
    else:
        dram.bandwidth, dram.bandwidth_source = _peak(lz, "peak_dram_bytes_per_cycle", "dram_clock"), "ncu peak"
    levels["l2"].bandwidth = _peak(lz, "peak_l2_bytes_per_cycle", "l2_clock")
    levels["l2"].bandwidth_source = "ncu peak"
    wf = lz.metric("peak_smem_wavefronts_per_cycle")
    clk = lz.metric("sm_clock")
    levels["shared"].bandwidth = WAVEFRONT_BYTES * wf * clk if ok(wf) and ok(clk) else math.nan
    levels["shared"].bandwidth_source = "ncu peak"


def traffic(call: Call, launches: list[Launch] | None = None) -> Traffic | None:
    """A call's bytes by level (`launches`: those of its launches to count, default all); None when it has
    no profiled launch."""
    lzs = call.launches if launches is None else launches
    if not lzs:
        return None
    prob = AttentionProblem.from_row(call.measurement)
    compulsory = float(prob.min_bytes()) if prob is not None else as_float(call.measurement.get("min_bytes"))
    flops = float(prob.flops()) if prob is not None else call.analytic_flops
    levels = {
        "dram": Level("dram", _sum(lzs, "dram_bytes_read"), _sum(lzs, "dram_bytes_write"),
                      source="dram__bytes_read/write"),
        "l2": _l2_level(lzs),
        "shared": _shared_level(lzs),
    }
    _bandwidths(call, levels, lzs)
    hits = [(lz.metric("l2_hit_rate"), lz.duration_ms) for lz in lzs]
    hits = [(h, w) for h, w in hits if ok(h) and ok(w) and w > 0]
    hit = sum(h * w for h, w in hits) / sum(w for _, w in hits) if hits else math.nan
    return Traffic(call.variant, call.shape_id, compulsory, levels, hit, flops)


def excess_seconds(a: Traffic, b: Traffic, level: str, part: str = "total") -> tuple[float, float]:
    """(excess bytes of `a` over `b` at a level, their time at the level's bandwidth in seconds)."""
    la, lb = a.levels[level], b.levels[level]
    xa, xb = getattr(la, part), getattr(lb, part)
    if not (ok(xa) and ok(xb)):
        return math.nan, math.nan
    extra = xa - xb
    t = extra / la.bandwidth if ok(la.bandwidth) and la.bandwidth > 0 else math.nan
    return extra, t
