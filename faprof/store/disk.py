"""Writing and reading a bundle's files safely: atomic writes (a temporary name beside the file,
then a rename, so a reader never sees half a file), the folder-name stamps, JSON-safe values,
plain file trees (`write_files`) and one table file read with a one-line error."""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.errors import FaprofError


def utc_stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def slugify(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "unknown"


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file beside `path` (an open descriptor and its name), made as open() makes a
    file: mode 0666 less the umask, so a bundle's files are as readable as any other file the user
    writes (tempfile.mkstemp's are 0600, private to the user)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _atomic_write_parquet(df: pd.DataFrame, path: Path) -> None:
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        with open(tmp, "rb") as f:  # on disk before the rename, so a power loss leaves no empty file
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def jsonable(x: Any) -> Any:
    """`x` as plain JSON data: dict keys as text, tuples as lists, paths as text, numpy scalars as Python
    numbers, NaN, infinities and pandas' NA/NaT as null (JSON has no NaN: json.dumps would write invalid
    JSON). Used for manifests and every JSON faprof writes (the gate's `--json` too)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if hasattr(x, "item") and not isinstance(x, str | bytes):  # numpy scalars
        return jsonable(x.item())
    if x is pd.NA or x is pd.NaT:
        return None
    return x


def _one_line(e: BaseException, limit: int = 160) -> str:
    """An exception's message on one line, shortened: for one-line error messages."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_table_file(path: Path) -> pd.DataFrame:
    """Read one parquet table; a damaged file is a FaprofError naming it (never a traceback).

    pyarrow says ArrowInvalid (a ValueError) for a truncated or foreign file, OSError for an
    unreadable one; both mean the same to a user: this file of the bundle is damaged.
    """
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:
        raise FaprofError(f"{path} cannot be read as a parquet table ({_one_line(e, 100)}); "
                          f"the bundle is damaged: restore the file or re-run the scenario") from None


def write_files(dest: str | Path, files: Mapping[str, str | bytes]) -> list[Path]:
    """Write already-rendered files under `dest` (names may hold one sub-folder, e.g. 'csv/x.csv').

    Each file is written to a temporary name and renamed, so none is ever half written; folders
    this call created are removed again when a write fails, so a failed export leaves nothing.
    """
    dest = Path(dest)
    created = [p for p in (dest, *dest.parents) if not p.exists()]
    written: list[Path] = []
    try:
        for rel, data in files.items():
            p = dest / rel
            for d in reversed([p.parent, *p.parent.parents]):
                if not d.exists():
                    created.append(d)
            p.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write_bytes(p, data.encode("utf-8") if isinstance(data, str) else data)
            written.append(p)
    except OSError as e:
        for p in written:
            p.unlink(missing_ok=True)
        for d in sorted(set(created), key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        raise FaprofError(f"could not write under {dest}: {_one_line(e)}") from None
    return written
