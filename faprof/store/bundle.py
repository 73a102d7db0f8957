"""Run bundles: the one storage format. Write as you go, read, list, merge, export.

A bundle is a folder `runs/<UTC timestamp>_<gpu-slug>_<scenario>/` holding:

- `manifest.json`: environment, settings, the scenario as run, status, and the run's log;
- `measurements.parquet`: one row per (variant, problem);
- Nsight tables when collected: `ncu_metrics.parquet`, `ncu_summary.parquet`, `stalls.parquet`,
  `roofline.parquet`, `ncu_rules.parquet`, `nsys_kernels.parquet`, `nsys_summary.parquet`, and raw files
  under `raw/`; a `faprof sanitize` bundle holds `sanitizer.parquet` instead of measurements.

Rows are written as they finish, each as its own small file `rows/<seq>.parquet` (written to a
temporary name and renamed, so never torn): an append costs the same at row 10 and at row 10,000.
Reading `measurements` merges `measurements.parquet` with the pending row files; `compact()` folds
them into `measurements.parquet` (at the end of a run, on Ctrl-C and on `--resume`). Every row
carries `row_seq`, increasing with each append, and a newer row of the same (variant, shape_id,
gpu_name) replaces an older one, so a crash between writing the compacted table and deleting the
row files leaves the same rows, never duplicates. Bundles written before row files (only
`measurements.parquet`) read as they always did. A new run never writes into an existing folder;
`--resume` adds the missing rows to an unfinished one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tarfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.errors import FaprofError
from faprof.model import schema
from faprof.store import error_maps
from faprof.store.disk import (
    _atomic_write_bytes,
    _atomic_write_parquet,
    _one_line,
    jsonable,
    read_table_file,
    slugify,
    utc_stamp,
)
from faprof.store.upgrade import upgraded

MANIFEST = "manifest.json"

#: The columns every reader of measurement rows needs (tables, reports, the advisor, the gate): a table
#: without them is not faprof's (written by another tool, or replaced by hand) and is refused when read.
REQUIRED_COLUMNS = ("variant", "shape_id", "status")
MEASUREMENTS = "measurements.parquet"
ROWS_DIR = "rows"
#: A measurement row's identity: one row per variant and shape on each GPU model.
ROW_KEY = ("variant", "shape_id", "gpu_name")

_SEQ_LOCK = threading.Lock()
#: Manifest read-modify-writes of one process (several GPU threads log into one bundle).
_MANIFEST_LOCK = threading.RLock()
_SEQ_LAST = [0]


def next_row_seq() -> str:
    """A sortable, strictly increasing sequence string for this process (time in ns, then pid)."""
    with _SEQ_LOCK:
        t = max(time.time_ns(), _SEQ_LAST[0] + 1)
        _SEQ_LAST[0] = t
    return f"{t:020d}-{os.getpid():07d}"
SCHEMA_VERSION = 1

#: Tables a bundle may hold, by file stem (one list: the schema's, so exports miss none).
TABLES = schema.TABLES


@dataclass
class Bundle:
    """A run bundle on disk."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    # ------------------------------------------------------------ creation
    @classmethod
    def create(cls, out_dir: Path, scenario: str, gpu_name: str, manifest: dict[str, Any],
               now: datetime | None = None) -> Bundle:
        """Make a new bundle folder (never reusing an existing one) and write its manifest."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        base = f"{utc_stamp(now)}_{slugify(gpu_name)}_{slugify(scenario)}"
        path = out_dir / base
        i = 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                i += 1
                path = out_dir / f"{base}-{i}"
        b = cls(path)
        manifest = {"schema_version": SCHEMA_VERSION, "run_id": path.name, "status": "running",
                    "created_utc": utc_stamp(now), **manifest}
        b.write_manifest(manifest)
        return b

    @classmethod
    def open(cls, path: str | Path) -> Bundle:
        """Open an existing bundle; a FaprofError says what is wrong if it is not one."""
        p = Path(path)
        if p.is_file() and p.suffix in (".gz", ".tgz", ".tar"):
            raise FaprofError(f"{p} is an archive; unpack it first (tar xf) or load it in the dashboard")
        if not p.is_dir():
            raise FaprofError(f"run bundle {p} does not exist (give the folder printed by `faprof profile`)")
        if not (p / MANIFEST).exists():
            raise FaprofError(f"{p} is not a faprof run bundle: it has no {MANIFEST}")
        return cls(p)

    # ------------------------------------------------------------ manifest
    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def manifest(self) -> dict[str, Any]:
        try:
            m = json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError as e:
            raise FaprofError(f"{self.manifest_path} is not valid JSON ({e}); the bundle is damaged") from None
        except (OSError, UnicodeDecodeError) as e:
            raise FaprofError(f"{self.manifest_path} cannot be read ({_one_line(e)}); the bundle is damaged") from None
        if not isinstance(m, dict):
            raise FaprofError(f"{self.manifest_path} is not a faprof manifest (not a JSON object); the bundle is damaged")
        return m

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        _atomic_write_bytes(self.manifest_path, json.dumps(jsonable(manifest), indent=2, sort_keys=False).encode())

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        with _MANIFEST_LOCK:
            m = self.manifest()
            m.update(changes)
            self.write_manifest(m)
        return m

    def log(self, message: str) -> None:
        """Append a timestamped line to the manifest's log (what happened, for the record)."""
        with _MANIFEST_LOCK:
            m = self.manifest()
            m.setdefault("log", []).append(f"{utc_stamp()} {message}")
            self.write_manifest(m)

    @property
    def run_id(self) -> str:
        return self.path.name

    # -------------------------------------------------------------- tables
    def table_path(self, name: str) -> Path:
        return self.path / f"{name}.parquet"

    def has(self, name: str) -> bool:
        if name in ("measurements", "error_maps") and self.pending_rows():
            return name == "measurements" or not self.read(name).empty
        return self.table_path(name).exists()

    def read(self, name: str) -> pd.DataFrame:
        """A table of the bundle; an empty frame when it was not collected. `measurements` includes
        the rows appended since the last compaction."""
        if name == "measurements":
            return error_maps.without_maps(self._merged_measurements()[0])
        if name == "error_maps":  # wrong rows' maps: the table, plus those pending rows still carry
            p = self.table_path(name)
            return error_maps.merge(read_table_file(p) if p.exists() else pd.DataFrame(),
                                          self._merged_measurements()[0])
        p = self.table_path(name)
        if not p.exists():
            return pd.DataFrame()
        return read_table_file(p)

    def write(self, name: str, df: pd.DataFrame) -> None:
        """Write table `name` (one of the schema's TABLES: an unknown name is an error)."""
        _atomic_write_parquet(df, self.table_path(schema.check_table(name)))

    def measurements(self) -> pd.DataFrame:
        """The measurement rows as this faprof reads them: a table that is not faprof's is refused (one
        line naming the file), old rows upgraded, and every row judged against the GPU's limits."""
        raw = self.read("measurements")
        if not raw.empty and not set(REQUIRED_COLUMNS) <= set(raw.columns):
            raise FaprofError(self._foreign_table())
        return upgraded(raw, self.manifest())

    def _foreign_table(self) -> str:
        """Why the measurement rows cannot be read: the first file (the table or a pending row file, read
        by its footer only) that holds rows but lacks a REQUIRED_COLUMNS column."""
        import pyarrow.parquet as pq

        table = self.table_path("measurements")
        for path in [*([table] if table.exists() else []), *self.pending_rows()]:
            try:
                meta = pq.read_metadata(path)
            except (OSError, ValueError):
                continue
            missing = [c for c in REQUIRED_COLUMNS if c not in set(meta.schema.to_arrow_schema().names)]
            if meta.num_rows and missing:
                return (f"{path} has no {', '.join(missing)} column{'s' if len(missing) > 1 else ''}: it is not a "
                        "table of faprof measurement rows; the bundle is damaged: restore the file or re-run the scenario")
        return f"{self.path}: its measurement rows lack the columns {', '.join(REQUIRED_COLUMNS)}; the bundle is damaged"

    def append_measurement(self, row: dict[str, Any]) -> None:
        """Add one finished row as its own file (constant time: nothing else is read or rewritten).

        A newer row of the same variant, shape_id and gpu_name replaces an older one when read."""
        seq = next_row_seq()
        d = self.path / ROWS_DIR
        d.mkdir(exist_ok=True)
        flat = _flatten_row({**row, "row_seq": seq})
        _atomic_write_parquet(pd.DataFrame([flat]), d / f"{seq}.parquet")

    def pending_rows(self) -> list[Path]:
        """Row files appended since the last compaction, oldest first."""
        d = self.path / ROWS_DIR
        if not d.is_dir():
            return []
        return sorted(p for p in d.iterdir() if p.suffix == ".parquet" and not p.name.startswith("."))

    def _merged_measurements(self) -> tuple[pd.DataFrame, list[Path]]:
        for attempt in range(3):
            files = self.pending_rows()
            base = read_table_file(self.table_path("measurements")) if self.table_path("measurements").exists() else None
            if not files:
                return (base if base is not None else pd.DataFrame()), files
            try:
                return merge_rows([*([base] if base is not None else []), *(read_table_file(f) for f in files)]), files
            except FaprofError:
                # another process (the run) compacted while this one read: its rows are in the table now
                if attempt == 2 or all(f.exists() for f in files):
                    raise
        raise AssertionError("unreachable")

    def compact(self) -> int:
        """Fold the pending row files into `measurements.parquet` (atomic), then delete them.

        Returns the number of row files folded in. Crash-safe: until the files are deleted, reading
        merges them again and the newer `row_seq` of each row key wins, so no row is doubled."""
        df, files = self._merged_measurements()
        if not files:
            return 0
        maps = self.read("error_maps")  # before the rows lose their maps: the table first, then the rows
        if not maps.empty or self.table_path("error_maps").exists():
            self.write("error_maps", maps)
        self.write("measurements", error_maps.without_maps(df))
        for f in files:
            f.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (self.path / ROWS_DIR).rmdir()
        return len(files)

    def done_keys(self, gpu_name: str | None = None) -> set[tuple[str, str]]:
        """(variant, shape_id) pairs that have a final row (anything but an interrupted one).

        With `gpu_name`, only rows of that GPU model count (rows without a gpu_name, written before
        faprof recorded it per row, count for every model)."""
        df = self.measurements()
        if df.empty:
            return set()
        if gpu_name is not None and "gpu_name" in df.columns:
            df = df[df["gpu_name"].isna() | (df["gpu_name"] == gpu_name)]
        return set(zip(df["variant"], df["shape_id"], strict=True))

    def raw_dir(self) -> Path:
        d = self.path / "raw"
        d.mkdir(exist_ok=True)
        return d

    def archive(self, dest: Path, include_raw: bool = True) -> Path:
        """Pack the bundle into a .tar.gz (for upload in the dashboard or sharing)."""
        dest = Path(dest)
        with tarfile.open(dest, "w:gz") as tar:
            for p in sorted(self.path.rglob("*")):
                if p.is_file() and (include_raw or "raw" not in p.relative_to(self.path).parts):
                    tar.add(p, arcname=str(Path(self.run_id) / p.relative_to(self.path)))
        return dest


def merge_rows(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate measurement frames (the compacted table first, then row files in order) and keep
    the newest row of each (variant, shape_id, gpu_name) by `row_seq` (rows without one are oldest).

    Concatenated through Arrow, which promotes an all-null column of a one-row file to the type of
    the others (so a float column stays float, a list column a list); pandas when types clash."""
    import pyarrow as pa

    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    try:
        tables = [pa.Table.from_pandas(f, preserve_index=False) for f in frames]
        df = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        df = pd.concat(frames, ignore_index=True)
    if "row_seq" not in df.columns:
        df["row_seq"] = None
    seq = df["row_seq"].where(df["row_seq"].notna(), "")
    key = [c for c in ROW_KEY if c in df.columns]
    if not key:
        return df.reset_index(drop=True)
    order = seq.sort_values(kind="stable").index  # stable: equal seqs keep file order
    df = df.loc[order]
    out = df[~df.duplicated(subset=key, keep="last")]
    # rows keep the order they were first written in (sorted by seq; old rows without one first)
    return out.reset_index(drop=True)


def _flatten_row(row: dict[str, Any]) -> dict[str, Any]:
    """Nested fields (per-tensor errors) are stored as JSON text; lists stay lists."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out[k] = json.dumps(jsonable(v))
        else:
            out[k] = v
    return out
