"""Between-run noise floors of kernel times, per GPU model: the recorded figures and how to read them.

How much a kernel's time moves between two runs of the same code (`row_sd`, `offset_sd`; on log
times, 0.01 is about 1%) is estimated by the regression gate from runs of one commit
(faprof.gate.noise, `scripts/analysis/gate_noise_floor.py`) and recorded as package data
(`faprof/data/gate_noise.toml`). Two readers use it: the gate, as the prior of a row's noise, and
the alias judgement (faprof.analysis.aliases), for whether two variants' medians can be told apart.
This module is the data and its reader; the estimation stays with the gate.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faprof import resources
from faprof.errors import FaprofError

#: The shipped floors, package data.
FLOORS_FILE = "gate_noise.toml"

#: Keys every [[floor]] table must have, with their types (a hand-edited file is checked, not trusted).
_FLOOR_KEYS: dict[str, type | tuple[type, ...]] = {
    "gpu_name": str, "row_sd": (int, float), "offset_sd": (int, float), "prior_df": (int, float, str),
    "row_max_move": (int, float), "residual_df": int, "offset_df": int, "row_runs": int, "runs": list,
}


@dataclass(frozen=True)
class RunSource:
    """One set of runs of the same code a floor was estimated from, as recorded."""

    bundles: tuple[str, ...]
    """The bundles' paths (relative to the repository for faprof's own floors)."""
    variants: tuple[str, ...] | None = None
    """The variants that ran unchanged in all of them (None: every variant they share)."""


@dataclass(frozen=True)
class NoiseFloor:
    """The between-run noise of kernel times on one GPU model (all figures on log times: 0.01 is about 1%)."""

    gpu_name: str
    """The GPU model (as NVML names it) the runs were on."""
    row_sd: float
    """Standard deviation of one row's log time from run to run of the same code (per run)."""
    offset_sd: float
    """Standard deviation of the offset all rows of one variant share in a run (per run)."""
    prior_df: float
    """How many rows' worth of evidence `row_sd` is for a variant it has not seen (inf: exactly it)."""
    row_max_move: float = 0.0
    """The largest move of one row away from the other rows of its variant between two of the runs
    (|d_i - Hodges-Lehmann of the others' d|): how far a row moves alone with no code change."""
    residual_df: int = 0
    """Degrees of freedom behind `row_sd`."""
    offset_df: int = 0
    """Degrees of freedom behind `offset_sd` (runs beyond the first, summed over variants)."""
    row_runs: int = 0
    """Row measurements (rows x runs) the floor was estimated from."""
    sources: tuple[RunSource, ...] = ()
    """Where it came from: the run sets."""
    note: str = ""
    """What the runs were (scenario, shapes, date, machine)."""
    variants: dict[str, float] = field(default_factory=dict)
    """Each variant's own row_sd in the runs, for information (the gate uses the pooled figure)."""

    @property
    def is_zero(self) -> bool:
        return self.row_sd == 0 and self.offset_sd == 0


#: No floor: the gate judges on the rows' own samples and their spread only (host-clock rows, `--noise-floor none`).
NO_FLOOR = NoiseFloor("none", 0.0, 0.0, 0.0)


# ----------------------------------------------------------------------------- the recorded floors
def _check_floor(t: dict[str, Any], where: str) -> NoiseFloor:
    for key, typ in _FLOOR_KEYS.items():
        if key not in t:
            raise FaprofError(f"{where}: key '{key}' is missing (re-write the file with scripts/analysis/gate_noise_floor.py)")
        if not isinstance(t[key], typ) or isinstance(t[key], bool):
            raise FaprofError(f"{where}: key '{key}' has the wrong type ({type(t[key]).__name__})")
    d0 = t["prior_df"]
    if isinstance(d0, str):
        if d0 != "inf":
            raise FaprofError(f"{where}: key 'prior_df': expected a number or \"inf\", got {d0!r}")
        d0 = math.inf
    if not (t["row_sd"] >= 0 and t["offset_sd"] >= 0 and d0 > 0):
        raise FaprofError(f"{where}: row_sd and offset_sd must be >= 0 and prior_df > 0")
    sources = []
    for j, run in enumerate(t["runs"]):
        if not isinstance(run, dict) or not isinstance(run.get("bundles"), list) or len(run["bundles"]) < 2:
            raise FaprofError(f"{where} runs {j + 1}: expected a table with bundles = [two or more paths]")
        names = run.get("variants")
        sources.append(RunSource(tuple(str(b) for b in run["bundles"]),
                                 tuple(str(v) for v in names) if isinstance(names, list) else None))
    return NoiseFloor(t["gpu_name"], float(t["row_sd"]), float(t["offset_sd"]), float(d0), float(t["row_max_move"]),
                      t["residual_df"],
                      t["offset_df"], t["row_runs"], tuple(sources), str(t.get("note", "")),
                      {str(k): float(v) for k, v in (t.get("variants") or {}).items()})


def load_floors(path: str | Path | None = None) -> list[NoiseFloor]:
    """The recorded noise floors: faprof's (`faprof/data/gate_noise.toml`) or those of `path`.

    Raises:
        FaprofError: the file is missing, not TOML, or a [[floor]] table lacks a key.
    """
    p = Path(path) if path is not None else resources.data_path(FLOORS_FILE)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as e:
        raise FaprofError(f"noise floor file {p}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise FaprofError(f"noise floor file {p} is not TOML: {e}") from None
    tables = data.get("floor")
    if not isinstance(tables, list) or not tables:
        raise FaprofError(f"{p}: expected one or more [[floor]] tables (write them with scripts/analysis/gate_noise_floor.py)")
    return [_check_floor(t, f"{p} [[floor]] {i + 1}") for i, t in enumerate(tables)]


def floor_for(gpu_name: str, floors: Sequence[NoiseFloor]) -> tuple[NoiseFloor, str]:
    """The floor of a GPU model, and a note when it is borrowed.

    Args:
        gpu_name: the GPU model of the rows.
        floors: the recorded floors.

    Returns:
        (floor, note): the model's own floor and '' when recorded; else the noisiest recorded floor
        (the gate then flags fewer changes, never more) and a note that says how to record one.
    """
    for f in floors:
        if f.gpu_name == gpu_name:
            return f, ""
    if not floors:
        return NO_FLOOR, f"no noise floor recorded for {gpu_name}: judged on the runs' own samples and rows only"
    worst = max(floors, key=lambda f: math.hypot(f.row_sd, f.offset_sd))
    return worst, (f"no between-run noise floor recorded for {gpu_name}: using {worst.gpu_name}'s "
                   f"(row {worst.row_sd:.2%}, offset {worst.offset_sd:.2%}), the noisiest recorded; record yours "
                   "from two or more runs of one commit with scripts/analysis/gate_noise_floor.py and pass --noise-floor")


def to_toml(floors: Sequence[NoiseFloor], header: str = "") -> str:
    """Floors as the TOML `load_floors` reads (the data file `scripts/analysis/gate_noise_floor.py` writes)."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"# {h}" if h else "#" for h in header.splitlines()] if header else []
    for f in floors:
        d0 = '"inf"' if math.isinf(f.prior_df) else f"{f.prior_df:.4f}"
        lines += ["", "[[floor]]", f"gpu_name = {q(f.gpu_name)}",
                  f"row_sd = {f.row_sd:.6f}", f"offset_sd = {f.offset_sd:.6f}", f"prior_df = {d0}",
                  f"row_max_move = {f.row_max_move:.6f}",
                  f"residual_df = {f.residual_df}", f"offset_df = {f.offset_df}", f"row_runs = {f.row_runs}",
                  f"note = {q(f.note)}"]
        lines += ["[floor.variants]  # each variant's own row_sd in these runs (information; the gate pools them)"]
        lines += [f"{q(v)} = {sd:.6f}" for v, sd in f.variants.items()]
        for src in f.sources:
            lines += ["[[floor.runs]]", "bundles = ["] + [f"    {q(b)}," for b in src.bundles] + ["]"]
            if src.variants is not None:
                lines.append("variants = [" + ", ".join(q(v) for v in src.variants) + "]")
    return "\n".join(lines) + "\n"
