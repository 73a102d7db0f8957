"""Run bundles: the one storage format. Write as you go, read, list, merge, export.

The bundle itself and its rows (bundle: `Bundle`, written as rows finish, compacted at the end),
safe file writes (disk), how an older bundle's rows are read by this faprof (upgrade: recomputed
statistics, stability, the physical-limits judgement; pure functions of faprof.rows, so reading a
bundle never imports the timing harness), wrong rows' error maps (error_maps) and finding bundles
(locate: a folder's bundles, `latest`, several runs at once, CSV export). The names below are the
package's API; callers import them from `faprof.store`.
"""

from faprof.store.bundle import (
    MANIFEST,
    MEASUREMENTS,
    REQUIRED_COLUMNS,
    ROW_KEY,
    ROWS_DIR,
    SCHEMA_VERSION,
    TABLES,
    Bundle,
    merge_rows,
    next_row_seq,
)
from faprof.store.disk import read_table_file, slugify, utc_stamp, write_files
from faprof.store.locate import (
    complete_runs,
    csv_files,
    device_of,
    export_csv,
    find_bundles,
    load_many,
    resolve_run,
)
from faprof.store.upgrade import upgrade_statistics

__all__ = [
    "MANIFEST", "MEASUREMENTS", "REQUIRED_COLUMNS", "ROWS_DIR", "ROW_KEY", "SCHEMA_VERSION", "TABLES", "Bundle",
    "complete_runs", "csv_files", "device_of", "export_csv", "find_bundles", "load_many", "merge_rows", "next_row_seq", "read_table_file",
    "resolve_run", "slugify", "upgrade_statistics", "utc_stamp", "write_files",
]
