"""Theoretical occupancy of a kernel launch from its registers, shared memory and block size, per architecture.

Computed as CUDA's cuda_occupancy.h does, from per-SM limits (ARCH_LIMITS), so that `faprof build`
can say what bounds a kernel without a GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from faprof.errors import FaprofError
from faprof.variants.build import normalize_arch


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM limits of one architecture that bound occupancy (CUDA programming guide, table
    'Technical Specifications per Compute Capability', and cuda_occupancy.h)."""

    max_warps: int
    """Resident warps per SM."""
    max_blocks: int
    """Resident blocks per SM."""
    smem_per_sm: int
    """Largest shared-memory carveout per SM, bytes (includes the per-block reserve)."""
    smem_per_block: int
    """Largest opt-in dynamic + static shared memory per block, bytes."""
    regs_per_sm: int = 65536
    """32-bit registers per SM."""
    regs_per_block: int = 65536
    """Registers one block may hold."""
    reg_alloc_unit: int = 256
    """Registers are allocated per warp in units of this many."""
    smem_alloc_unit: int = 128
    """Shared memory is allocated per block in units of this many bytes."""
    smem_reserved_per_block: int = 1024
    """Shared memory the driver reserves per block (sm_80 and later)."""
    sub_partitions: int = 4
    """Register files per SM: a warp's registers come from one of them."""
    max_threads_per_block: int = 1024
    """Threads per block."""


#: Per-architecture limits. sm_90a and friends share their base architecture's entry.
ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits(max_warps=64, max_blocks=32, smem_per_sm=164 * 1024, smem_per_block=163 * 1024),
    "sm_86": ArchLimits(max_warps=48, max_blocks=16, smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
    "sm_87": ArchLimits(max_warps=48, max_blocks=16, smem_per_sm=164 * 1024, smem_per_block=163 * 1024),
    "sm_89": ArchLimits(max_warps=48, max_blocks=24, smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
    "sm_90": ArchLimits(max_warps=64, max_blocks=32, smem_per_sm=228 * 1024, smem_per_block=227 * 1024),
    "sm_100": ArchLimits(max_warps=64, max_blocks=32, smem_per_sm=228 * 1024, smem_per_block=227 * 1024),
    "sm_120": ArchLimits(max_warps=48, max_blocks=24, smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
}

#: Order in which limiters are named when several allow the same number of blocks: the hardware
#: caps first (a kernel at 64 of 64 warps is limited by warps, whatever else would also allow it),
#: then the resources a kernel can change.
LIMITER_ORDER = ("warps", "blocks", "registers", "shared memory")


@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one kernel launch on one SM."""

    blocks_per_sm: int
    """Resident blocks per SM."""
    active_warps: int
    """Resident warps per SM (blocks x warps per block)."""
    occupancy_pct: float
    """active_warps / max warps per SM, in percent."""
    limiter: str
    """What bounds blocks_per_sm: 'registers', 'shared memory', 'warps', 'blocks' (or 'threads'
    when the block is larger than 1024 threads)."""


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def arch_limits(arch: str) -> ArchLimits:
    """Limits of `arch` ('sm_90a' uses sm_90's); FaprofError for an architecture not in the table."""
    base = re.sub(r"[af]$", "", normalize_arch(arch))
    if base not in ARCH_LIMITS:
        raise FaprofError(f"no occupancy limits known for {arch}; known: {', '.join(ARCH_LIMITS)}")
    return ARCH_LIMITS[base]


def occupancy(arch: str, threads: int, registers: int, smem_bytes: int) -> Occupancy:
    """Theoretical occupancy, computed as CUDA's cuda_occupancy.h does.

    Registers: each warp gets ceil(registers·32 / 256)·256 registers from one of the SM's four
    register files (16384 registers each); blocks = (warps that fit per file · 4) // warps per
    block. Shared memory: each block takes round_up(static + dynamic + 1 KB reserved, 128 B) of
    the SM's largest carveout. Warps and blocks: the per-SM maxima.

    Args:
        arch: 'sm_80', 'sm_89', 'sm_90a', ...
        threads: threads per block.
        registers: registers per thread (from ptxas).
        smem_bytes: static + dynamic shared memory per block, bytes.

    Returns:
        Occupancy with blocks per SM, active warps, percentage and the limiting resource.
    """
    lim = arch_limits(arch)
    if threads < 1 or threads > lim.max_threads_per_block:
        return Occupancy(0, 0, 0.0, "threads")
    warps = -(-threads // 32)
    by_warps = lim.max_warps // warps
    by_blocks = lim.max_blocks

    regs_per_warp = _round_up(registers * 32, lim.reg_alloc_unit)
    if regs_per_warp == 0:
        by_regs = by_blocks
    elif (
        regs_per_warp * _round_up(warps, lim.sub_partitions) > lim.regs_per_block
        or regs_per_warp * warps > lim.regs_per_block
        or registers > 255
    ):
        by_regs = 0
    else:
        warps_per_partition = (lim.regs_per_sm // lim.sub_partitions) // regs_per_warp
        by_regs = warps_per_partition * lim.sub_partitions // warps

    if smem_bytes > lim.smem_per_block:
        by_smem = 0
    else:
        per_block = _round_up(smem_bytes + lim.smem_reserved_per_block, lim.smem_alloc_unit)
        by_smem = lim.smem_per_sm // per_block

    limits = {"registers": by_regs, "shared memory": by_smem, "warps": by_warps, "blocks": by_blocks}
    blocks = min(limits.values())
    limiter = next(name for name in LIMITER_ORDER if limits[name] == blocks)
    return Occupancy(blocks, blocks * warps, 100.0 * blocks * warps / lim.max_warps, limiter)
