"""Finding bundles: every bundle under a folder, one run named by path or `latest`, several runs'
rows read together, and a bundle's tables exported as CSV."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from faprof.errors import FaprofError
from faprof.store.bundle import MANIFEST, TABLES, Bundle
from faprof.store.disk import jsonable, write_files


def find_bundles(root: str | Path) -> list[Bundle]:
    """Every bundle under `root` (the folder itself if it is one), newest first."""
    root = Path(root)
    if _is_bundle(root):
        return [Bundle(root)]
    if not root.is_dir():
        return []
    found = [Bundle(p.parent) for p in root.rglob(MANIFEST) if _is_bundle(p.parent)]
    return sorted(found, key=lambda b: b.run_id, reverse=True)


def _is_bundle(folder: Path) -> bool:
    """A folder with a faprof manifest (schema_version and run_id), not just any manifest.json."""
    p = folder / MANIFEST
    if not p.is_file():
        return False
    try:
        m = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return True  # a damaged bundle is still a bundle: opening it says what is wrong
    return isinstance(m, dict) and "schema_version" in m and "run_id" in m


def resolve_run(spec: str | Path, runs_dir: str | Path = "runs",
                notice: Callable[[str], None] | None = None) -> Bundle:
    """A bundle from a path, or a run id / unique prefix under `runs_dir`, or 'latest' (the newest
    complete run; `notice` is told when 'latest' passes over newer unfinished runs or falls back to one)."""
    p = Path(spec)
    if p.exists():
        return Bundle.open(p)
    candidates = find_bundles(runs_dir)
    if str(spec) == "latest":
        if not candidates:
            raise FaprofError(f"no run bundles under {runs_dir}; run `faprof profile` first")
        return _latest(candidates, runs_dir, notice or (lambda _m: None))
    matches = [b for b in candidates if b.run_id.startswith(str(spec))]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise FaprofError(f"no run bundle {spec!r} (not a folder, nor a run id under {runs_dir}/)")
    raise FaprofError(f"{spec!r} matches {len(matches)} runs under {runs_dir}/; give more of the name")


def _run_status(b: Bundle) -> str:
    """A bundle's manifest status ('damaged' when its manifest cannot be read)."""
    try:
        return str(b.manifest().get("status") or "unknown")
    except FaprofError:
        return "damaged"


def _latest(candidates: list[Bundle], runs_dir: str | Path, notice: Callable[[str], None]) -> Bundle:
    """The newest complete bundle of `candidates` (newest first), else the newest one, said in `notice`."""
    skipped: list[tuple[Bundle, str]] = []
    for b in candidates:
        status = _run_status(b)
        if status == "complete":
            if skipped:
                newer = ", ".join(f"{s.run_id} ({st})" for s, st in skipped[:3])
                more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
                notice(f"latest: {b.run_id}, the newest complete run; newer runs that did not finish: {newer}{more}")
            return b
        skipped.append((b, status))
    b, status = skipped[0]
    notice(f"latest: {b.run_id} is {status}, not complete (no run under {runs_dir} finished); its rows may be partial")
    return b


def device_of(manifest: dict[str, Any]) -> str:
    """The device a bundle ran on: its GPU model, or 'cpu'."""
    return str((manifest.get("env") or {}).get("gpu_name") or "cpu")


def complete_runs(root: str | Path, scenario: str, device: str,
                  exclude: Path | None = None) -> Iterator[tuple[Bundle, dict[str, Any]]]:
    """(bundle, manifest) of the complete bundles of `scenario` on `device` (GPU model or 'cpu',
    `device_of`) under `root`, newest first, as they are read (a caller wanting the newest stops at the
    first); damaged ones and `exclude` (the run being made) left out."""
    for b in find_bundles(root):
        if exclude is not None and b.path.resolve() == Path(exclude).resolve():
            continue
        try:
            m = b.manifest()
        except FaprofError:  # a damaged manifest is no earlier run
            continue
        if m.get("status") == "complete" and (m.get("scenario") or {}).get("name") == scenario \
                and device_of(m) == device:
            yield b, m


def load_many(paths: list[str | Path]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Merge the measurements of many bundles (each row tagged with run_id, gpu, scenario).

    `gpu` is the row's own `gpu_name` when it has one (a bundle of several GPU models splits per
    GPU), else the bundle's GPU."""
    frames, manifests = [], []
    for p in paths:
        for b in find_bundles(p):
            m = b.manifest()
            manifests.append({**m, "path": str(b.path)})
            df = b.measurements()
            if df.empty:
                continue
            gpu = m.get("env", {}).get("gpu_name", "cpu")
            if "gpu_name" in df.columns:  # rows of a --gpus run name their own GPU: one bundle, several models
                gpu = df["gpu_name"].where(df["gpu_name"].notna(), gpu)
            df = df.assign(run_id=b.run_id, gpu=gpu, scenario=m.get("scenario", {}).get("name", ""))
            frames.append(df)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), manifests


def export_csv(bundle: Bundle, dest: str | Path) -> list[Path]:
    """Write every table of the bundle as CSV (list columns as JSON text) plus the manifest."""
    files = csv_files(bundle)
    return write_files(dest, files)


def csv_files(bundle: Bundle) -> dict[str, str]:
    """Every table of the bundle as CSV text (list columns as JSON text) plus the manifest, by file
    name. Everything is read first, so a damaged file stops the export before anything is written."""
    out: dict[str, str] = {}
    for name in TABLES:
        if not bundle.has(name):  # not collected; a table that is there but empty (no findings) is written
            continue
        # the rows as every view reads them: an old bundle's impossible time is exported untrusted, not ok
        df = bundle.measurements() if name == "measurements" else bundle.read(name)
        df = df.copy()
        for c in df.columns:
            if df[c].map(lambda x: isinstance(x, list | tuple) or hasattr(x, "tolist")).any():
                df[c] = df[c].map(lambda x: json.dumps(jsonable(x.tolist() if hasattr(x, "tolist") else x)))
        out[f"{name}.csv"] = df.to_csv(index=False)
    # Not "manifest.json": a folder holding one would be taken for a run bundle by find_bundles.
    out["bundle_manifest.json"] = json.dumps(bundle.manifest(), indent=2)
    return out
