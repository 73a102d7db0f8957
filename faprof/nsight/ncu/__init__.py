"""Nsight Compute: find ncu, build its command line, plan and run a session, read the report into tables.

One name for the four parts (import the parts directly where only one is needed):

- `faprof.nsight.ncu.find`: find_ncu, ncu_version, query_metrics, the permission hint
  (`faprof.nsight.ncu.doctor_lines`: the doctor's lines);
- `faprof.nsight.ncu.command`: the section sets (`faprof`, basic, detailed, full), ncu_command,
  NcuSettings;
- `faprof.nsight.ncu.session_plan`: the default targets, the shape/variant/kernel selectors, the cost
  cache and the estimate printed before replaying;
- `faprof.nsight.ncu.run`: run_ncu, `collect()` (the end of `faprof profile --ncu`) and `rerun()`
  (`faprof ncu RUN`);
- `faprof.nsight.ncu.parse`, `isolated`, `nvtx_ranges`, `rule_results`, `read`: read_report / read_rules,
  the isolated child reader and the bundle tables written from a report.

Tables a session writes into the bundle: `ncu_metrics.parquet` (long: variant, shape_id, iteration,
nvtx, kernel, kernel_demangled, kernel_id, launch, cc, gpu, metric, value, text, unit: the
catalogue's metrics, the per-reason stalls and the device attributes; a kernel's variant and
shape_id come from its own NVTX range stack, never from launch order), `ncu_summary`, `stalls`,
`roofline` (derived in `faprof.nsight.ncu.tables`) and `ncu_rules` (ncu's own rule results).

Settings: `--cache-control all` (caches flushed before each replay pass, so every kernel starts
cold, as the timing harness's L2 flush does) and `--clock-control none` (the GPU keeps its own
clocks: faprof never locks or changes them) by default. On top of the section set faprof asks for
the catalogue's extra metrics (FLOP counters, DRAM bytes, L2 hit rate, bank conflicts, spills,
coalescing, roofline peaks), filtered to those the GPU has (`ncu --query-metrics`).

Why torch's own kernels make huge reports: ncu stores in the report the whole CUDA module (cubin)
each profiled kernel was loaded from, so that the source/SASS views work offline, whatever the
set. Measured on the H100 with one metric and one kernel: a torch elementwise kernel gave a 5.8 MB
report holding its 5.7 MB module, a cuBLAS GEMM 14.0 MB holding 14.0 MB; the SDPA kernels' modules
make 60-75 MB. faprof's extension modules are 0.4-2 MB per .cu file (fa_basic: 12 kernels from 5
modules, 4.8 MB of which 4.1 MB cubins); besides, the full set stores ~1 MB per kernel, basic ~0.1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from faprof.nsight.ncu.command import (
    CACHE_CONTROLS,
    CLOCK_CONTROLS,
    DEFAULT_CACHE_CONTROL,
    DEFAULT_CLOCK_CONTROL,
    DEFAULT_SET,
    FAPROF_SECTIONS,
    NCU_SETS,
    WARMUP_RANGE,
    NcuSettings,
    ncu_command,
    nvtx_filter,
    set_args,
)
from faprof.nsight.ncu.doctor_lines import doctor_checks
from faprof.nsight.ncu.find import (
    _QUERY_CACHE,
    _VERSION_CACHE,
    IMPORT_SOURCE_MIN_VERSION,
    NOT_FOUND,
    PERMISSION_ERROR,
    PERMISSION_HINT,
    find_ncu,
    ncu_version,
    parse_query_metrics,
    query_metrics,
    supports_import_source,
)
from faprof.nsight.ncu.isolated import read_report_isolated
from faprof.nsight.ncu.nvtx_ranges import attribute, nvtx_stack
from faprof.nsight.ncu.parse import (
    METRICS_COLUMNS,
    TRACE_PREFIX,
    load_report_module,
    read_report,
    read_rules,
    read_tables,
)
from faprof.nsight.ncu.process import NcuRun, run_ncu
from faprof.nsight.ncu.read import derive_tables, load_plan, write_tables
from faprof.nsight.ncu.read import main as read_main
from faprof.nsight.ncu.rule_results import RULES_COLUMNS
from faprof.nsight.ncu.run import (
    LOG_FILE,
    PLAN_FILE,
    REPORT_STEM,
    SCENARIO_FILE,
    collect,
    rerun,
    toml_dumps,
)
from faprof.nsight.ncu.session_plan import NcuPlan, default_targets, make_plan

__all__ = [
    "CACHE_CONTROLS",
    "CLOCK_CONTROLS",
    "DEFAULT_CACHE_CONTROL",
    "DEFAULT_CLOCK_CONTROL",
    "DEFAULT_SET",
    "FAPROF_SECTIONS",
    "IMPORT_SOURCE_MIN_VERSION",
    "LOG_FILE",
    "METRICS_COLUMNS",
    "NCU_SETS",
    "NOT_FOUND",
    "PERMISSION_ERROR",
    "PERMISSION_HINT",
    "PLAN_FILE",
    "REPORT_STEM",
    "RULES_COLUMNS",
    "SCENARIO_FILE",
    "TRACE_PREFIX",
    "WARMUP_RANGE",
    "_QUERY_CACHE",
    "_VERSION_CACHE",
    "NcuPlan",
    "NcuRun",
    "NcuSettings",
    "attribute",
    "collect",
    "default_targets",
    "derive_tables",
    "doctor_checks",
    "find_ncu",
    "load_plan",
    "load_report_module",
    "make_plan",
    "ncu_command",
    "ncu_version",
    "nvtx_filter",
    "nvtx_stack",
    "parse_query_metrics",
    "query_metrics",
    "read_report",
    "read_report_isolated",
    "read_rules",
    "read_tables",
    "rerun",
    "run_ncu",
    "set_args",
    "supports_import_source",
    "toml_dumps",
    "write_tables",
]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m faprof.nsight.ncu read ...`: the child reader (`faprof.nsight.ncu.read.main`)."""

    return read_main(argv)


if __name__ == "__main__":
    sys.exit(main())
