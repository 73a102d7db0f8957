"""Nsight Compute metric catalogue: which ncu metric measures a concept on each compute capability.

The catalogue maps a *concept* (achieved occupancy, DRAM bytes read, tensor-pipe utilization...)
to the ncu metric names that measure it on each compute capability faprof knows (sm_80, sm_86,
sm_89, sm_90). Metric names differ between chips (Ada has corrected `_v2` HMMA counters, Hopper
adds the warp-group GMMA path and counts fp16 tensor FLOPs without a destination type, FP8 exists
from Ada on), so nothing in faprof hard-codes one name for all GPUs: code asks the catalogue for a
concept's names on the report's CC and takes the first one the report holds. Every name faprof asks
ncu for was checked against `ncu --query-metrics --chip <chip>` of Nsight Compute 2025.3.1 (ga100,
ga102, ad102, gh100; the lists are in tests/data/ncu/) and the values against reports recorded on
an H100 with kernels of known work (tests/data/ncu/tiny_kernels.cu). Also here: the unit
conversions (the warp stall reasons are in `catalogue_stalls`).

One home in five files, each name imported from the file that defines it: this module (the joined
catalogue, the lookups, the units), `catalogue_core` (known CCs, the Concept type, key columns),
`catalogue_stalls` (stall reasons, stall and pipe advice), and the entries of `catalogue_memory` and
`catalogue_accounting` that this module joins.
"""

from __future__ import annotations

from collections.abc import Iterable

from faprof.nsight.ncu import catalogue_accounting, catalogue_memory
from faprof.nsight.ncu.catalogue_core import Concept

#: Every concept, in catalogue order (time, launch, occupancy, speed of light, memory; then the
#: accounting, source counters, tensor pipes, FLOP counters, roofline peaks).
_CONCEPTS: list[Concept] = [*catalogue_memory.CONCEPTS, *catalogue_accounting.CONCEPTS]

#: Concept key -> Concept, every entry of the catalogue.
CATALOGUE: dict[str, Concept] = {c.key: c for c in _CONCEPTS}

#: FLOPs per SASS thread instruction when counting hardware FLOPs: an FMA is a multiply and an add.
FLOPS_PER_INST = {
    "fadd": 1,
    "fmul": 1,
    "ffma": 2,
    "hadd": 1,
    "hmul": 1,
    "hfma": 2,
    "dadd": 1,
    "dmul": 1,
    "dfma": 2,
}

#: Instruction families of each CUDA-core precision.
PRECISION_OPS = {
    "fp32": ("fadd", "fmul", "ffma"),
    "fp16": ("hadd", "hmul", "hfma"),
    "fp64": ("dadd", "dmul", "dfma"),
}

#: Dense FLOPs of one warp-level HMMA instruction of shape m16n8k16 (2*16*8*16), the shape
#: `mma.sync` and fp16/bf16 `wmma` 16x16x16 compile to on sm_80..sm_90 (one wmma = 2 HMMA).
#: Used only when a report has no tensor FLOP counter (see `hardware_flops`).
HMMA_16816_FLOPS = 2 * 16 * 8 * 16


def concept(key: str) -> Concept:
    """A catalogue entry by key (KeyError names the known keys)."""
    try:
        return CATALOGUE[key]
    except KeyError:
        raise KeyError(f"no metric concept {key!r}; known: {', '.join(sorted(CATALOGUE))}") from None


def names_for(key: str, cc: str | tuple[int, int] | None) -> tuple[str, ...]:
    """Metric names of a concept on a compute capability, in order of preference."""
    return concept(key).for_cc(cc)


def requested_metrics(cc: str | tuple[int, int] | None, available: Iterable[str] | None = None) -> list[str]:
    """Metrics faprof adds to ncu's section set (`--metrics`) on a compute capability.

    Args:
        cc: the GPU's compute capability.
        available: base metric names the chip has (`ncu --query-metrics`), to drop names it lacks;
            None keeps every catalogue name (ncu fails on a name the chip does not have).

    Returns:
        Full metric names (with rollup and suffix), sorted, without duplicates.
    """
    base = set(available) if available is not None else None
    out = set()
    for c in _CONCEPTS:
        if not c.request:
            continue
        for name in c.for_cc(cc):
            if base is None or base_name(name) in base:
                out.add(name)
                break
    return sorted(out)


_CATALOGUE_NAMES: frozenset[str] | None = None


def catalogue_metric_names() -> frozenset[str]:
    """Every metric name the catalogue knows, on every compute capability (what the reader keeps)."""
    global _CATALOGUE_NAMES
    if _CATALOGUE_NAMES is None:
        _CATALOGUE_NAMES = frozenset(n for c in _CONCEPTS for names in c.names.values() for n in names)
    return _CATALOGUE_NAMES


def base_name(metric: str) -> str:
    """The base metric name `ncu --query-metrics` lists: the part before the first '.'."""
    return metric.split(".", 1)[0]



# ----------------------------------------------------------------------------------------- units

_PREFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_PREFIXABLE = ("second", "byte", "hz", "Hz", "cycle", "inst", "sector", "warp")
#: Short spellings ncu_report uses ("ns" for gpu__time_duration, "byte/s", "hz").
_ALIASES = {
    "ns": (1e-9, "second"),
    "us": (1e-6, "second"),
    "ms": (1e-3, "second"),
    "s": (1.0, "second"),
    "Hz": (1.0, "hz"),
    "KHz": (1e3, "hz"),
    "MHz": (1e6, "hz"),
    "GHz": (1e9, "hz"),
}


def _unit_part(part: str) -> tuple[float, str]:
    if part in _ALIASES:
        return _ALIASES[part]
    if part in _PREFIXABLE:
        return 1.0, part
    if len(part) > 1 and part[0] in _PREFIXES and part[1:] in _PREFIXABLE:
        return _PREFIXES[part[0]], part[1:]
    return 1.0, part


def unit_scale(unit: str | None) -> tuple[float, str]:
    """Factor to multiply a value by to express it in base units, and the base unit.

    "ns" and "nsecond" -> (1e-9, "second"); "Gbyte/second" -> (1e9, "byte/second"); "byte/s" ->
    (1, "byte/second"); "cycle/nsecond" -> (1e9, "cycle/second"); "Kbyte/block" -> (1e3,
    "byte/block"); "%" -> (1, "%"). Decimal prefixes, as ncu uses them.
    """
    if not unit:
        return 1.0, ""
    parts = unit.split("/")
    factor, base = _unit_part(parts[0])
    names = [base]
    for p in parts[1:]:
        f, b = _unit_part(p)
        factor /= f
        names.append(b)
    return factor, "/".join(names)
