"""Nsight Systems: run the profiled target under nsys, export SQLite, join kernels to NVTX ranges -> tables.

The harness says how long a variant takes; nsys says where the time goes: how many kernels a call
launches, how long each runs, how long the host takes to get each one started and how long the GPU
sits idle between them. One name for the parts (import a part directly where only it is needed),
in the order `collect` (what `faprof profile --nsys` calls, in `stage`) runs them:

1. `find`: `find_nsys` / `check_importer`: nsys and the QdstrmImporter it needs to turn a capture
   into a report (without its libraries nsys leaves a multi-GB `.qdstrm` and no report: checked
   first); `doctor_checks` for `faprof doctor`.
2. `command`: `nsys_command`, one argv, `nsys profile ... python -m faprof.nsight.target ...`; the
   target runs every (variant, problem) in NVTX ranges `<variant>` > `<shape_id>` > `iter<i>`
   between cudaProfilerStart/Stop; `export_command`: `nsys export --type sqlite`.
3. `capture`: `run_capture` runs the capture with a timeout and a watchdog for an nsys that has
   written its report but does not exit; `run_export` exports it.
4. `read`: `load_sqlite` reads the tables whatever the nsys version calls their columns;
   `attribute_kernels` -> `nsys_kernels.parquet`: every kernel joined to its launching API call
   (correlationId) and through the call's time and thread to the innermost `iter<i>` range and its
   parents `<shape_id>` and `<variant>`.
5. `tables`: one function per analysis, each returning a DataFrame (HolisticTraceAnalysis' style):
   `per_call`, `kernels_per_call`, `launch_overhead`, `idle_gaps`, `harness_agreement`; `summarize`
   joins them into `nsys_summary.parquet`. Nothing here plots.

`python -m faprof.nsight.nsys capture|parse` (`__main__`) runs the pieces by hand.

Times in `nsys_kernels` are nanoseconds on nsys' session clock (`*_ns`); the summary is in
microseconds (`*_us`) except the two figures compared with the harness (`harness_ms`, `nsys_gpu_ms`).
"""

from faprof.nsight.nsys.capture import (
    EXIT_GRACE_S,
    EXPORT_TIMEOUT_S,
    POLL_S,
    PROFILE_TIMEOUT_S,
    REPORT_SETTLE_S,
    TERM_GRACE_S,
    CaptureResult,
    env_for_target,
    leftover_qdstrm,
    run_capture,
    run_export,
)
from faprof.nsight.nsys.command import (
    DEFAULT_ITERS,
    PROFILE_OPTIONS,
    export_command,
    nsys_command,
    report_path,
)
from faprof.nsight.nsys.find import (
    IMPORTER,
    LIBRARY_PACKAGES,
    NSYS_ENV,
    NSYS_GLOBS,
    PACKAGE_NEEDS,
    check_importer,
    doctor_checks,
    find_importer,
    find_nsys,
    importer_problem,
    missing_libraries,
    nsys_version,
)
from faprof.nsight.nsys.read import (
    ITER_RANGE,
    KERNEL_COLUMNS,
    NVTX_RANGE_EVENT_TYPES,
    NsysTrace,
    attribute_kernels,
    load_sqlite,
    read_kernels,
)
from faprof.nsight.nsys.stage import Progress, collect
from faprof.nsight.nsys.tables import (
    SUMMARY_COLUMNS,
    harness_agreement,
    idle_gaps,
    kernels_per_call,
    launch_overhead,
    per_call,
    summarize,
)

__all__ = [
    "DEFAULT_ITERS", "EXIT_GRACE_S", "EXPORT_TIMEOUT_S", "IMPORTER", "ITER_RANGE", "KERNEL_COLUMNS",
    "LIBRARY_PACKAGES", "NSYS_ENV", "NSYS_GLOBS", "NVTX_RANGE_EVENT_TYPES", "PACKAGE_NEEDS", "POLL_S",
    "PROFILE_OPTIONS", "PROFILE_TIMEOUT_S", "REPORT_SETTLE_S", "SUMMARY_COLUMNS", "TERM_GRACE_S",
    "CaptureResult", "NsysTrace", "Progress", "attribute_kernels", "check_importer", "collect", "doctor_checks",
    "env_for_target", "export_command", "find_importer", "find_nsys", "harness_agreement", "idle_gaps",
    "importer_problem", "kernels_per_call", "launch_overhead", "leftover_qdstrm", "load_sqlite",
    "missing_libraries", "nsys_command", "nsys_version", "per_call", "read_kernels", "report_path",
    "run_capture", "run_export", "summarize",
]
