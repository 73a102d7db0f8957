"""Reference values for the parser tests: selected columns of `ncu --import R --page raw --csv --print-units base`.

    python3 scripts/record/ncu_reference_csv.py RAW.csv OUT.csv

Keeps, for every profiled kernel, the columns below that the report has (as ncu itself prints them,
in the units it stores) plus up to 200 stall columns; tests/test_ncu.py compares faprof's reading of
the same report with them. Used by scripts/record/record_ncu_fixtures.sh and scripts/record/record_ncu_faprof_fixture.sh.
"""

import csv
import sys

keep_exact = ["ID", "Kernel Name", "gpu__time_duration.sum", "launch__grid_size", "launch__block_size",
              "launch__registers_per_thread", "launch__shared_mem_per_block_static",
              "launch__shared_mem_per_block_dynamic", "launch__occupancy_limit_registers",
              "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks",
              "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct",
              "sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum", "dram__bytes_write.sum",
              "lts__t_sector_hit_rate.pct", "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
              "sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
              "sm__inst_executed_pipe_tensor_op_hmma.sum", "sm__ops_path_tensor_src_fp16.sum",
              "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
              "sm__sass_thread_inst_executed_op_hfma_pred_on.sum", "launch__occupancy_limit_barriers",
              "l1tex__t_sector_hit_rate.pct", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
              "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained", "dram__bytes.sum.peak_sustained",
              "sm__cycles_elapsed.avg.per_second", "dram__cycles_elapsed.avg.per_second",
              # the advisor's counters (faprof set)
              "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
              "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
              "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio",
              "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "smsp__sass_inst_executed_op_shared_ld.sum",
              "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "sm__inst_executed_pipe_fma.sum",
              "lts__throughput.avg.pct_of_peak_sustained_elapsed", "profiler__replayer_passes"]
with open(sys.argv[1], newline="") as src:
    rows = list(csv.reader(src))
start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
head, body = rows[start], rows[start + 1:]
idx = [head.index(c) for c in keep_exact if c in head]
idx += [i for i, c in enumerate(head) if "issue_stalled" in c and i not in idx][:200]
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    for r in [head, *body]:
        w.writerow([r[i] if i < len(r) else "" for i in idx])
print(f"{sys.argv[2]}: {len(body) - 1} kernel rows, {len(idx)} columns")
