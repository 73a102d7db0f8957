"""The one schema of run bundles: measurement row columns, row statuses and bundle table names.

Everything that writes a row or a table names its columns from here, and writing or deriving a
column this module does not know is an error (`check_columns`), never a silent drop.
"""

from __future__ import annotations

from collections.abc import Iterable

# The problem columns every row carries (PROBLEM_COLUMNS: AttentionProblem's fields, lists as JSON text) are
# derived from the dataclass beside it. Bundles written before GQA/varlen/paged problems lack the ones after
# `scale`: readers take them as the defaults.
from faprof.model.problem import PROBLEM_COLUMNS as PROBLEM_COLUMNS

#: Row statuses: ok (checked and timed), wrong (timed, failed the check), untrusted (checked and timed,
#: but its time is not a result: above what the GPU can do, or not the call's cost; faprof.rows.limits),
#: failed (crashed, hung or raised), unsupported (the variant cannot run the problem), skipped (needs a
#: GPU this machine lacks).
STATUSES = ("ok", "wrong", "untrusted", "failed", "unsupported", "skipped")

#: Statuses of rows whose timings are results (tables, speedups, rankings, the gate). An untrusted
#: row keeps its figures for the record, but none of them counts.
TIMED = ("ok", "wrong")

#: Every measurement row has these columns (None when not measured), so tables keep one schema.
ROW_COLUMNS = (
    "run_id", "scenario", "group", "variant", "variant_kind", "compute", "shape_id", "label",
    *PROBLEM_COLUMNS,
    "status", "reason", "path", "device", "reference", "correct", "max_abs_err", "rel_err", "rtol", "atol", "tol_factor",
    "tol_eps", "baseline_max_err", "check_reason", "lse_checked", "repeatable", "errors",
    "check_input", "bug_signature", "signatures", "probes", "error_map",
    "timer", "timer_note", "stop", "n", "median_ms", "ci95_low_ms", "ci95_high_ms", "rel_ci", "q1_ms", "q3_ms",
    "iqr_ms", "outliers", "mean_ms", "std_ms", "min_ms", "rel_sem", "unstable", "unstable_reason",
    "timing_flagged", "timing_flag_reason", "drained_ms", "l2_flushed", "input_sets", "timed_checked",
    "host_ms", "kernel_sig",
    "samples_ms", "event_ms", "span_ms", "kernels_per_call", "e2e_ms", "graph_ms", "host_enqueue_ms",
    "peak_mem_bytes", "extra_mem_bytes",
    "sm_clock_mhz", "nvml", "nvml_sm_clock_mhz_min", "nvml_sm_clock_mhz_max", "temp_c_before", "temp_c_after",
    "power_w_max", "throttle_reasons", "throttled",
    "flops", "tflops", "min_bytes", "gbps", "tokens", "tokens_per_s", "peak_tflops", "peak_label", "peak_clock_mhz",
    "pct_peak", "pct_peak_at_clock",
    "mem_bw_gbs", "pct_bw", "measured_ceiling_tflops", "pct_measured_ceiling",
    "bound", "copy_gbs", "pct_copy",
    "footprint_standard_bytes", "footprint_flash_bytes", "out_sample", "ref_sample", "seed",
    "build_s", "build_cold", "reference_s", "wall_s", "finished_utc",
    "gpu_index", "gpu_name", "gpu_uuid", "attempts", "aliases",
)

#: `aliases` holds the variants a row's kernels also stand for (declared aliases a run did not time
#: twice), as names joined by ALIAS_SEP; None when none. faprof.analysis.aliases adds detected ones.
ALIAS_SEP = ","


#: What limits an ideal kernel on the row's GPU (`bound`): 'compute' rows lead with TFLOP/s,
#: 'memory' rows (decode) with GB/s against the measured copy ceiling.
BOUNDS = ("compute", "memory")

#: Tables a bundle can hold (parquet files named after them), in the order exports list them.
TABLES = ("measurements", "ncu_metrics", "ncu_summary", "stalls", "roofline", "ncu_rules", "nsys_kernels",
          "nsys_summary", "error_maps", "source_lines", "sanitizer")

#: The tables a Nsight Compute session writes (`faprof.nsight.ncu`; source_lines by its source-line pass).
NCU_TABLES = ("ncu_metrics", "ncu_summary", "stalls", "roofline", "ncu_rules", "source_lines")

#: The tables a Nsight Systems capture writes (`faprof.nsight.nsys`).
NSYS_TABLES = ("nsys_kernels", "nsys_summary")


def new_row() -> dict[str, object]:
    """A measurement row with every column, each None (not measured)."""
    return dict.fromkeys(ROW_COLUMNS)


def check_columns(keys: Iterable[str], where: str) -> None:
    """Raise ValueError naming any key that is not a measurement column (`where`: who produced it)."""
    unknown = sorted(set(keys) - set(ROW_COLUMNS))
    if unknown:
        raise ValueError(f"{where} produced columns the row schema does not have: {', '.join(unknown)} "
                         "(add them to faprof.model.schema.ROW_COLUMNS)")


def check_table(name: str) -> str:
    """`name` if it is a bundle table, else ValueError listing the known ones."""
    if name not in TABLES:
        raise ValueError(f"no bundle table {name!r}; known: {', '.join(TABLES)}")
    return name
