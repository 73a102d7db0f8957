"""Files around the dashboard: tables as CSV, bundle archives unpacked safely, sanitize runs listed."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path, PurePosixPath

import numpy as np
import pandas as pd

from faprof.analysis.load import LIST_COLUMNS, RunSet
from faprof.errors import FaprofError
from faprof.run import sanitize
from faprof.store import MANIFEST, Bundle, find_bundles

MAX_ARCHIVE_MEMBERS = 20_000
"""An uploaded archive with more members than this is refused (a bundle has tens of files)."""

MAX_ARCHIVE_BYTES = 4 * 1024**3
"""Unpacked size limit of an uploaded archive: raw .ncu-rep files reach hundreds of MB, a
decompression bomb reaches this first."""

# ---------------------------------------------------------------------------------- CSV, files
def for_display(df: pd.DataFrame) -> pd.DataFrame:
    """A table without the array columns (raw samples), which are heavy and unreadable as cells."""
    if df.empty:
        return df
    return df.drop(columns=[c for c in LIST_COLUMNS if c in df.columns])


def csv_bytes(df: pd.DataFrame) -> bytes:
    """A table as CSV (UTF-8); array cells become JSON lists, as `faprof export` writes them."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda x: isinstance(x, list | tuple | np.ndarray)).any():
            out[c] = out[c].map(lambda x: json.dumps(np.asarray(x).tolist()) if isinstance(x, list | tuple | np.ndarray) else x)
        elif isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(str)
    buf = io.StringIO()
    out.to_csv(buf, index=False)
    return buf.getvalue().encode("utf-8")


def _member_ok(member: tarfile.TarInfo) -> str | None:
    """Why an archive member may not be unpacked (None when it may)."""
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts or "\\" in name:
        return f"unsafe path {name!r}"
    if not (member.isfile() or member.isdir()):
        return f"{name!r} is a link or a special file"
    return None


def safe_extract(data: bytes, dest: str | Path) -> list[Path]:
    """Unpack a bundle archive (.tar.gz from `Bundle.archive`) under `dest`, refusing anything unsafe.

    Every member must be a regular file or folder with a relative path that stays under `dest`
    (no absolute paths, no '..', no links or devices); the archive may not exceed
    MAX_ARCHIVE_MEMBERS members or MAX_ARCHIVE_BYTES unpacked.

    Returns:
        The bundle folders found in what was unpacked.

    Raises:
        FaprofError: the data is not a tar archive, a member is unsafe, a limit is exceeded, or the
            archive holds no run bundle.
    """
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed by the `with` below)
    except (tarfile.TarError, OSError) as e:
        raise FaprofError(f"not a bundle archive (.tar.gz made by Bundle.archive): {e}") from None
    with tar:
        members = []
        total = 0
        for member in tar:
            why = _member_ok(member)
            if why:
                raise FaprofError(f"refused the archive: {why}")
            target = (dest / member.name).resolve()
            if dest != target and dest not in target.parents:
                raise FaprofError(f"refused the archive: {member.name!r} would land outside the folder")
            members.append(member)
            total += member.size
            if len(members) > MAX_ARCHIVE_MEMBERS:
                raise FaprofError(f"refused the archive: more than {MAX_ARCHIVE_MEMBERS} members")
            if total > MAX_ARCHIVE_BYTES:
                raise FaprofError(f"refused the archive: more than {MAX_ARCHIVE_BYTES / 2**30:.0f} GiB unpacked")
        for member in members:
            target = dest / member.name
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:
                continue
            with src, open(target, "wb") as f:
                while chunk := src.read(1 << 20):
                    f.write(chunk)
    bundles = [b.path for b in find_bundles(dest)]
    if not bundles:
        raise FaprofError(f"the archive holds no run bundle (no {MANIFEST} inside)")
    return bundles


def nsight_hint(scenario: str | None, tool: str) -> str:
    """What to run to get a page's data: `faprof profile --scenario X --ncu full` or `--nsys`."""
    flag = "--ncu full" if tool == "ncu" else "--nsys"
    return f"faprof profile --scenario {scenario or 'NAME'} {flag}"


def sanitizer_table(runs: RunSet) -> pd.DataFrame:
    """One row per (sanitize run, tool): variants, shapes, hazards and status (faprof.sanitize.tool_totals),
    for `faprof sanitize` bundles among the loaded runs; empty when there are none."""

    frames = []
    for run_id, m in runs.manifests.items():
        if m.get("kind") != "sanitize" or not m.get("path"):
            continue
        try:
            t = sanitize.tool_totals(Bundle.open(m["path"]))
        except FaprofError:
            continue
        st_ = m.get("settings") or {}
        frames.append(t.assign(run_id=run_id, variants=", ".join(st_.get("variants") or []),
                               shapes=", ".join(st_.get("shapes") or []), gpu=(m.get("env") or {}).get("gpu_name")))
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)[["run_id", "gpu", "variants", "shapes", "tool", "hazards", "findings", "status"]]
