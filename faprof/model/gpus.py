"""GPU spec database: peak rates, bandwidth, SMs and shared memory used for "% of peak" and rooflines.

The rows live in ``faprof/data/gpus.toml`` (one ``[[gpu]]`` table per product, every figure dense,
each row with its source and notes). This module loads and validates that file once, matches the
name torch reports (``torch.cuda.get_device_name()``) to a row, and says which peak a measured
TFLOP/s figure should be compared with.

A GPU that is not in the database has no spec (``lookup`` returns None) and is shown with what the device
reports; its peaks are ``None`` and every view shows measured figures only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faprof import resources
from faprof.errors import FaprofError

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_DATA_PATH = resources.data_path("gpus.toml")
"""The database shipped with the package (pyproject ships ``data/*.toml`` as package data)."""

FAMILIES = ("geforce", "datacenter", "workstation")
"""Product families; GeForce matters because it runs fp32-accumulate tensor math at half rate."""

DTYPES = ("fp16", "bf16", "fp32", "fp64")
"""Data types ``peak_tflops`` knows a peak for (the dtypes faprof's kernels run in)."""

COMPUTES = ("tensor", "cuda_core")
"""Execution units a variant can use; decides between the tensor and the non-tensor peak."""

UNKNOWN_GPU_LABEL = "unknown GPU: measured figures only"
"""Label for every peak of a GPU not in the database, so no view invents a percentage."""

_NAME_PREFIXES = ("nvidia", "geforce", "tesla")
"""Leading brand words torch's names carry inconsistently ("Tesla T4", "NVIDIA GeForce ...")."""

_VARIANT_MARKERS = frozenset({"ti", "super", "nvl", "laptop", "mobile", "max", "q", "mig", "d"})
"""Tokens naming a different product (or a MIG slice) when they follow a known name, e.g. the
"Ti" in "RTX 4070 Ti" or "NVL" in "H100 NVL": a loose match must never cross them."""

_CC_PATTERN = re.compile(r"^\d+\.\d+$")
"""Compute capability as torch prints it, "major.minor" (e.g. "8.6")."""

_PEAK_FIELDS = (  # the rate fields; a row may leave any of them out when no source gives it
    "fp32_tflops",
    "fp64_tflops",
    "fp16_tensor_tflops",
    "bf16_tensor_tflops",
    "fp16_tensor_fp16acc_tflops",
    "tf32_tensor_tflops",
)
_OPTIONAL_NUMBER_FIELDS = (  # numeric keys a row may omit ("don't invent": absent means unsourced)
    "boost_clock_mhz",
    "tensor_clock_mhz",
    "memory_gb",
    "mem_bw_gbs",
    "l2_mb",
    "smem_per_sm_kb",
    *_PEAK_FIELDS,
)
_REQUIRED_KEYS = ("name", "family", "match", "cc", "sms", "source")
"""Keys every row needs: identity, matching, and where its figures come from."""

_ALLOWED_KEYS = frozenset((*_REQUIRED_KEYS, *_OPTIONAL_NUMBER_FIELDS, "notes", "derived"))
"""Every key a row may carry; anything else is a typo that would silently drop a figure."""

_TOP_LEVEL_KEYS = frozenset({"schema", "gpu"})
"""Keys the data file may have outside its [[gpu]] tables."""

_SCHEMA_VERSION = 1
"""Version of the data file layout this loader reads; bump both together."""


@dataclass(frozen=True)
class GPUSpec:
    """One GPU product: identity, memory system and dense peak rates (None where not sourced)."""

    name: str
    """Canonical product name, e.g. "H100 SXM5" or "GeForce RTX 3090"."""

    match: tuple[str, ...]
    """Exact strings ``torch.cuda.get_device_name()`` returns for this product."""

    cc: str
    """Compute capability "major.minor", e.g. "8.6"."""

    sms: int
    """Number of streaming multiprocessors."""

    boost_clock_mhz: float | None = None
    """Boost clock the datasheet peaks assume (MHz); see ``notes`` where tensor peaks use another."""

    tensor_clock_mhz: float | None = None
    """Clock the tensor-core peaks are computed at, where the vendor uses another than the boost
    clock (H100 SXM5: tensor peaks at 1830 MHz, max boost 1980 MHz). None: `boost_clock_mhz`."""

    def peak_clock_mhz(self, compute: str, dtype: str) -> float | None:
        """The clock behind the peak `peak_tflops(self, dtype, compute)` returns."""
        tensor = compute == "tensor" and dtype in ("fp16", "bf16")
        return (self.tensor_clock_mhz or self.boost_clock_mhz) if tensor else self.boost_clock_mhz

    memory_gb: float | None = None
    """Device memory size (GB, as marketed)."""

    mem_bw_gbs: float | None = None
    """Peak DRAM bandwidth (GB/s, 10^9 bytes per second)."""

    l2_mb: float | None = None
    """L2 cache size (MB); the timing harness flushes 2x this between repeats."""

    smem_per_sm_kb: float | None = None
    """Largest configurable shared-memory carve-out per SM (KB): 228 sm_90, 164 sm_80, 100 sm_86/89."""

    fp32_tflops: float | None = None
    """Non-tensor fp32 peak (TFLOP/s, FMA = 2 flops)."""

    fp64_tflops: float | None = None
    """Non-tensor fp64 peak (TFLOP/s)."""

    fp16_tensor_tflops: float | None = None
    """Dense fp16 tensor-core peak with fp32 accumulate (TFLOP/s): the fp16 "% of peak" denominator."""

    bf16_tensor_tflops: float | None = None
    """Dense bf16 tensor-core peak with fp32 accumulate (TFLOP/s)."""

    fp16_tensor_fp16acc_tflops: float | None = None
    """Dense fp16 tensor-core peak with fp16 accumulate (TFLOP/s); twice the fp32-acc rate on GeForce."""

    tf32_tensor_tflops: float | None = None
    """Dense tf32 tensor-core peak (TFLOP/s)."""

    source: str = ""
    """Datasheet or whitepaper the figures come from, and where in it."""

    notes: str = ""
    """How derived figures were computed, caveats, fields that could not be sourced."""

    family: str = "datacenter"
    """Product family: 'geforce', 'datacenter' or 'workstation'."""

    known: bool = True
    """False for a GPU not in the database: no peaks, measured figures only."""

    derived: tuple[str, ...] = ()
    """Names of the numeric fields computed (SMs x per-SM rate x clock, ratios) rather than quoted."""


# ----------------------------------------------------------------------------------------- loading


def all_gpus(path: str | Path | None = None) -> list[GPUSpec]:
    """Return every row of the GPU database, validated.

    Args:
        path: a database file to read instead of the shipped one (tests, user overrides). The
            shipped file is read once and cached; an explicit path is read on every call.

    Returns:
        The rows in file order.

    Raises:
        FaprofError: the file is missing, is not valid TOML, or a row is malformed (the message
            names the file, the row and the key).
    """
    if path is None:
        return list(_load_default())
    return list(_load(Path(path)))


@functools.lru_cache(maxsize=1)
def _load_default() -> tuple[GPUSpec, ...]:
    return _load(DEFAULT_DATA_PATH)


def _load(path: Path) -> tuple[GPUSpec, ...]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as exc:
        raise FaprofError(
            f"GPU database {path} not found: reinstall faprof or pass an existing file"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise FaprofError(f"GPU database {path} is not valid TOML: {exc}") from exc

    unknown = sorted(set(data) - _TOP_LEVEL_KEYS)
    if unknown:
        raise FaprofError(
            f"GPU database {path}: unknown top-level key(s) {unknown}; expected 'schema' and [[gpu]] tables"
        )
    schema = data.get("schema", _SCHEMA_VERSION)
    if schema != _SCHEMA_VERSION:
        raise FaprofError(
            f"GPU database {path}: schema {schema!r} not supported (this faprof reads schema {_SCHEMA_VERSION})"
        )
    rows = data.get("gpu")
    if not isinstance(rows, list) or not rows:
        raise FaprofError(f"GPU database {path}: expected at least one [[gpu]] table")

    specs = tuple(_parse_row(path, i, row) for i, row in enumerate(rows, start=1))
    _check_unique(path, specs)
    return specs


#: Relative slack when comparing two rates read from the file (rounding in the datasheet's figures).
_RATE_SLACK = 1e-6

_Fail = Callable[[str, str, Any], FaprofError]


def _parse_row(path: Path, index: int, row: Any) -> GPUSpec:
    """One [[gpu]] table, checked key by key: identity, numbers, the derived list, the rates' order."""
    name, fail = _checked_keys(path, index, row)
    family, match, cc, sms = _identity(row, fail)
    numbers = _numbers(row, fail)
    derived = _derived(row, numbers, fail)
    fp32acc, fp16acc = numbers["fp16_tensor_tflops"], numbers["fp16_tensor_fp16acc_tflops"]
    if fp32acc is not None and fp16acc is not None and fp32acc > fp16acc * (1 + _RATE_SLACK):
        raise fail(
            "fp16_tensor_tflops",
            f"at most the fp16-accumulate rate {fp16acc} (fp32 accumulate is never faster)",
            fp32acc,
        )
    return GPUSpec(
        name=name.strip(),
        match=tuple(m.strip() for m in match),
        cc=cc,
        sms=sms,
        source=row["source"].strip(),
        notes=row.get("notes", "").strip(),
        family=family,
        known=True,
        derived=tuple(derived),
        **numbers,  # type: ignore[arg-type]
    )


def _checked_keys(path: Path, index: int, row: Any) -> tuple[str, _Fail]:
    """The row's name, and an error maker that names the row; every required key present, none unknown."""

    def failer(label: str) -> _Fail:
        def fail(key: str, expected: str, got: Any) -> FaprofError:
            return FaprofError(f"GPU database {path}: {label}: key {key!r}: expected {expected}, got {got!r}")

        return fail

    if not isinstance(row, dict):
        raise FaprofError(f"GPU database {path}: row {index}: expected a [[gpu]] table, got {row!r}")
    name = row.get("name")
    if not isinstance(name, str) or not name.strip():
        raise failer(f"row {index}")("name", "a non-empty string", name)
    label = f"row {index} ({name!r})"
    for key in _REQUIRED_KEYS:
        if key not in row:
            raise FaprofError(f"GPU database {path}: {label}: missing required key {key!r}")
    unknown = sorted(set(row) - _ALLOWED_KEYS)
    if unknown:
        raise FaprofError(
            f"GPU database {path}: {label}: unknown key(s) {unknown}; allowed keys: {sorted(_ALLOWED_KEYS)}"
        )
    return name, failer(label)


def _identity(row: dict[str, Any], fail: _Fail) -> tuple[str, list[str], str, int]:
    """family, match, cc and sms, checked; source and notes checked as strings."""
    family = row["family"]
    if family not in FAMILIES:
        raise fail("family", f"one of {list(FAMILIES)}", family)
    match = row["match"]
    if not isinstance(match, list) or not match or not all(isinstance(m, str) and m.strip() for m in match):
        raise fail("match", "a non-empty list of device-name strings", match)
    cc = row["cc"]
    if not isinstance(cc, str) or not _CC_PATTERN.match(cc):
        raise fail("cc", 'a "major.minor" string such as "8.6"', cc)
    sms = row["sms"]
    if isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0:
        raise fail("sms", "a positive integer", sms)
    for key in ("source", "notes"):
        value = row.get(key, "")
        if not isinstance(value, str) or (key == "source" and not value.strip()):
            raise fail(key, "a non-empty string" if key == "source" else "a string", value)
    return family, match, cc, sms


def _numbers(row: dict[str, Any], fail: _Fail) -> dict[str, float | None]:
    """Every optional numeric field as a float (None when the row leaves it out)."""
    numbers: dict[str, float | None] = {}
    for key in _OPTIONAL_NUMBER_FIELDS:
        value = row.get(key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise fail(key, "a positive number (leave the key out when it cannot be sourced)", value)
        numbers[key] = None if value is None else float(value)
    return numbers


def _derived(row: dict[str, Any], numbers: dict[str, float | None], fail: _Fail) -> list[str]:
    """The `derived` list: names of numeric fields this row has a value for."""
    derived = row.get("derived", [])
    if not isinstance(derived, list) or not all(isinstance(d, str) for d in derived):
        raise fail("derived", "a list of field names", derived)
    for field_name in derived:
        if field_name not in numbers:
            raise fail(
                "derived", f"names of numeric fields ({', '.join(_OPTIONAL_NUMBER_FIELDS)})", field_name
            )
        if numbers[field_name] is None:
            raise fail("derived", "fields that have a value in this row", field_name)
    return derived


def _check_unique(path: Path, specs: tuple[GPUSpec, ...]) -> None:
    names: dict[str, int] = {}
    patterns: dict[tuple[str, ...], str] = {}
    for i, spec in enumerate(specs, start=1):
        if spec.name.lower() in names:
            raise FaprofError(
                f"GPU database {path}: row {i} ({spec.name!r}): key 'name': duplicate of row {names[spec.name.lower()]}"
            )
        names[spec.name.lower()] = i
        for pattern in spec.match:
            key = _tokens(pattern)
            if not key:
                raise FaprofError(
                    f"GPU database {path}: row {i} ({spec.name!r}): key 'match': {pattern!r} is only brand words"
                )
            owner = patterns.get(key)
            if owner is not None and owner != spec.name:
                raise FaprofError(
                    f"GPU database {path}: row {i} ({spec.name!r}): key 'match': {pattern!r} also matches {owner!r}"
                )
            patterns[key] = spec.name


# ---------------------------------------------------------------------------------------- matching


def _tokens(device_name: str) -> tuple[str, ...]:
    """Lower-case words of a device name without the leading brand words; '-' and '_' split words."""
    words = re.sub(r"[-_/,()]+", " ", device_name.lower()).split()
    while words and words[0] in _NAME_PREFIXES:
        words.pop(0)
    return tuple(words)


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> int | None:
    """Start index of ``needle`` as a contiguous run of whole words in ``haystack``, else None."""
    n = len(needle)
    for start in range(len(haystack) - n + 1):
        if haystack[start : start + n] == needle:
            return start
    return None


def lookup(device_name: str, specs: list[GPUSpec] | None = None) -> GPUSpec | None:
    """Find the database row for the name torch reports, or None.

    Matching ignores case, the leading "NVIDIA" / "GeForce" / "Tesla" words and '-' vs ' '. An exact
    match of a row's pattern wins. Otherwise a pattern matches when its words appear, whole and in
    order, inside the device name and none of the extra words names another product ("Ti", "SUPER",
    "NVL", "Laptop", "MIG", ...): "RTX 4070 Ti" never matches "RTX 4070", "H100 NVL" never matches
    the H100 SXM, and a bare "H100" matches nothing rather than guessing. Ties between rows give None.

    Args:
        device_name: ``torch.cuda.get_device_name()``, e.g. "NVIDIA H100 80GB HBM3".
        specs: rows to search; the shipped database by default.

    Returns:
        The matching spec, or None when the GPU is not in the database.
    """
    words = _tokens(device_name)
    if not words:
        return None
    rows = all_gpus() if specs is None else specs

    exact = {spec.name: spec for spec in rows if any(_tokens(p) == words for p in spec.match)}
    if len(exact) == 1:
        return next(iter(exact.values()))
    if len(exact) > 1:
        return None

    best_len = 0
    best: dict[str, GPUSpec] = {}
    for spec in rows:
        for pattern in spec.match:
            needle = _tokens(pattern)
            start = _contains(words, needle)
            if start is None:
                continue
            extra = words[:start] + words[start + len(needle) :]
            if any(w in _VARIANT_MARKERS for w in extra):
                continue
            if len(needle) > best_len:
                best_len, best = len(needle), {spec.name: spec}
            elif len(needle) == best_len:
                best[spec.name] = spec
    return next(iter(best.values())) if len(best) == 1 else None


# ------------------------------------------------------------------------------------------- peaks


def peak_tflops(spec: GPUSpec, dtype: str, compute: str) -> tuple[float | None, str]:
    """The peak a measured TFLOP/s figure is compared with for "% of peak".

    fp16/bf16 on tensor cores use the dense tensor rate with fp32 accumulate (what FlashAttention
    kernels accumulate in). CUDA-core variants and fp32 use the non-tensor fp32 rate; fp64 uses the
    non-tensor fp64 rate.

    Args:
        spec: a row from ``lookup`` / ``all_gpus``.
        dtype: 'fp16', 'bf16', 'fp32' or 'fp64'.
        compute: 'tensor' or 'cuda_core'.

    Returns:
        (peak in TFLOP/s or None, a short label saying which peak and where it came from).

    Raises:
        FaprofError: dtype or compute is not one of the accepted values.
    """
    if dtype not in DTYPES:
        raise FaprofError(f"peak_tflops: dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if compute not in COMPUTES:
        raise FaprofError(f"peak_tflops: compute must be one of {list(COMPUTES)}, got {compute!r}")
    if not spec.known:
        return None, UNKNOWN_GPU_LABEL

    if dtype == "fp64":
        field_name, label = "fp64_tflops", "fp64 non-tensor"
    elif dtype == "fp32":
        field_name, label = "fp32_tflops", "fp32 non-tensor"
    elif compute == "cuda_core":
        field_name, label = "fp32_tflops", f"fp32 non-tensor, used for {dtype} on CUDA cores"
    else:
        field_name = "fp16_tensor_tflops" if dtype == "fp16" else "bf16_tensor_tflops"
        label = f"dense {dtype} tensor, fp32 acc"

    value = getattr(spec, field_name)
    if value is None:
        return None, f"{label}: not available for {spec.name} (see notes)"
    origin = "derived, see notes" if field_name in spec.derived else "datasheet"
    return value, f"{label} ({origin})"


# ------------------------------------------------------------------------------------------- views


def slug(name: str) -> str:
    """Directory-safe short name: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    text = re.sub(r"[^a-z0-9]+", "-", " ".join(_tokens(name))).strip("-")
    return text or "unknown-gpu"


def as_dataframe(specs: list[GPUSpec] | None = None) -> pd.DataFrame:
    """All rows as a table (one row per GPU, one column per GPUSpec field) for ``faprof list gpus``.

    Args:
        specs: rows to show; the shipped database by default.

    Returns:
        A DataFrame; ``match`` and ``derived`` are joined with "; " so the table prints flat.
    """
    import pandas as pd

    rows = all_gpus() if specs is None else specs
    records = []
    for spec in rows:
        record = dataclasses.asdict(spec)
        record["match"] = "; ".join(spec.match)
        record["derived"] = "; ".join(spec.derived)
        records.append(record)
    columns = [f.name for f in dataclasses.fields(GPUSpec)]
    return pd.DataFrame.from_records(records, columns=columns)
