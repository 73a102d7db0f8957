"""A bundle's measurement files checked for the columns every reader of them needs.

A `measurements.parquet` (or a pending row file) can be a valid parquet table that is not faprof's:
written by another tool, or replaced by hand. Without this check each reader fails its own way (a
KeyError traceback, "no timed rows", "No findings"); with it every command says the same one line,
naming the file and the columns it lacks.
"""

from __future__ import annotations

from typing import Any

from faprof.errors import FaprofError

#: The columns a measurement row must have for any reader (tables, reports, the advisor, the gate).
REQUIRED = ("variant", "shape_id", "status")


def check(bundle: Any) -> None:
    """Raise a FaprofError naming the first measurement file of `bundle` that holds rows but lacks a
    REQUIRED column. Reads only the files' footers; an unreadable file is left to the reader, whose
    error names it."""
    import pyarrow.parquet as pq

    table = bundle.table_path("measurements")
    for path in [*([table] if table.exists() else []), *bundle.pending_rows()]:
        try:
            meta = pq.read_metadata(path)
        except (OSError, ValueError):
            continue
        names = set(meta.schema.to_arrow_schema().names)
        missing = [c for c in REQUIRED if c not in names]
        if meta.num_rows and missing:
            cols = ", ".join(missing)
            raise FaprofError(f"{path} has no {cols} column{'s' if len(missing) > 1 else ''}: it is not a table of "
                              "faprof measurement rows; the bundle is damaged: restore the file or re-run the scenario")
