"""Metric catalogue entries, part 1: time, launch configuration, occupancy, speed of light, memory.

Part of `faprof.nsight.ncu.catalogue` (import that, not this module), which joins this list and
`catalogue_accounting.CONCEPTS` in this order.
"""

from __future__ import annotations

from faprof.nsight.ncu.catalogue_core import _LIMITER_METRICS, Concept, _same

#: The catalogue's first entries, in catalogue order.
CONCEPTS: list[Concept] = [
    # ---- time and clocks
    Concept("duration", "kernel duration on the GPU", _same("gpu__time_duration.sum")),
    Concept(
        "sm_clock",
        "SM clock during the kernel (cycles per second)",
        _same("sm__cycles_elapsed.avg.per_second"),
        request=True,
    ),
    Concept(
        "dram_clock",
        "DRAM clock during the kernel",
        _same("dram__cycles_elapsed.avg.per_second"),
        request=True,
    ),
    Concept(
        "elapsed_cycles", "GPU cycles elapsed", _same("gpc__cycles_elapsed.max", "sm__cycles_elapsed.max")
    ),
    # ---- launch configuration (LaunchStats section; not hardware counters)
    Concept("grid_size", "blocks in the grid", _same("launch__grid_size")),
    Concept("block_size", "threads per block", _same("launch__block_size")),
    Concept("grid_dim_x", "grid x dimension", _same("launch__grid_dim_x")),
    Concept("grid_dim_y", "grid y dimension", _same("launch__grid_dim_y")),
    Concept("grid_dim_z", "grid z dimension", _same("launch__grid_dim_z")),
    Concept("block_dim_x", "block x dimension", _same("launch__block_dim_x")),
    Concept("block_dim_y", "block y dimension", _same("launch__block_dim_y")),
    Concept("block_dim_z", "block z dimension", _same("launch__block_dim_z")),
    Concept("registers_per_thread", "registers per thread", _same("launch__registers_per_thread")),
    Concept("smem_static", "static shared memory per block", _same("launch__shared_mem_per_block_static")),
    Concept("smem_dynamic", "dynamic shared memory per block", _same("launch__shared_mem_per_block_dynamic")),
    Concept(
        "smem_driver",
        "shared memory the driver reserves per block",
        _same("launch__shared_mem_per_block_driver"),
    ),
    Concept("smem_config", "shared memory carve-out per SM", _same("launch__shared_mem_config_size")),
    Concept("waves_per_sm", "waves of blocks per SM", _same("launch__waves_per_multiprocessor")),
    Concept(
        "sm_count", "SMs of the device", _same("device__attribute_multiprocessor_count", "launch__sm_count")
    ),
    # ---- occupancy (Occupancy section)
    Concept(
        "theoretical_occupancy",
        "theoretical occupancy, % of the SM's warps",
        _same("sm__maximum_warps_per_active_cycle_pct"),
    ),
    Concept(
        "achieved_occupancy",
        "achieved occupancy, % of the SM's warps",
        _same("sm__warps_active.avg.pct_of_peak_sustained_active"),
        request=True,
    ),
    *(
        Concept(f"occupancy_limit_{k}", f"blocks per SM allowed by {k.replace('_', ' ')}", _same(m))
        for k, m in _LIMITER_METRICS.items()
    ),
    # ---- speed of light (SpeedOfLight section)
    Concept(
        "sm_throughput",
        "compute (SM) throughput, % of peak",
        _same("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ),
    Concept(
        "memory_throughput",
        "memory throughput, % of peak (max over DRAM, L2, L1, shared)",
        _same("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    ),
    Concept(
        "dram_throughput",
        "DRAM throughput, % of peak",
        _same(
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        ),
    ),
    # ---- memory
    Concept("dram_bytes_read", "bytes read from DRAM", _same("dram__bytes_read.sum"), request=True),
    Concept("dram_bytes_write", "bytes written to DRAM", _same("dram__bytes_write.sum"), request=True),
    Concept("dram_bytes_per_second", "DRAM bandwidth achieved", _same("dram__bytes.sum.per_second")),
    Concept("l2_hit_rate", "L2 hit rate, % of sectors", _same("lts__t_sector_hit_rate.pct"), request=True),
    Concept("l1_hit_rate", "L1/TEX hit rate, % of sectors", _same("l1tex__t_sector_hit_rate.pct")),
    Concept(
        "smem_bank_conflicts_ld",
        "shared-memory bank conflicts of loads",
        _same("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
        request=True,
    ),
    Concept(
        "smem_bank_conflicts_st",
        "shared-memory bank conflicts of stores",
        _same("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
        request=True,
    ),
    Concept(
        "smem_bank_conflicts",
        "shared-memory bank conflicts (all shared-memory instructions)",
        _same("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),
    ),
    Concept(
        "smem_pipe_util",
        "shared-memory wavefronts of the LSU pipe, % of peak (how busy shared memory is)",
        _same("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed"),
        request=True,
    ),
    Concept(
        "ldsm_inst",
        "ldmatrix instructions executed (shared-memory loads besides LDS)",
        _same("smsp__inst_executed_op_ldsm.sum"),
        request=True,
    ),
    Concept(
        "l2_throughput",
        "L2 throughput, % of peak",
        _same("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        request=True,
    ),
    # ---- advisor: local memory (register spills), global coalescing, shared-memory wavefronts.
    # Hardware counters (in every chip's `--query-metrics`), so the `faprof` set asks for them: local
    # loads/stores only happen for spills and local arrays; sectors per request above 4 (32-bit words)
    # mean a warp's accesses are spread; wavefronts above one per shared instruction mean conflicts.
    *(
        Concept(key, text, _same(name), request=True)
        for key, text, name in (
            (
                "local_ld_sectors",
                "L1 sectors of local-memory loads",
                "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum",
            ),
            (
                "local_st_sectors",
                "L1 sectors of local-memory stores",
                "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
            ),
            (
                "local_ld_requests",
                "local-memory load requests",
                "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum",
            ),
            (
                "local_st_requests",
                "local-memory store requests",
                "l1tex__t_requests_pipe_lsu_mem_local_op_st.sum",
            ),
            (
                "global_ld_sectors",
                "L1 sectors of global loads",
                "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
            ),
            ("global_ld_requests", "global load requests", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
            (
                "global_st_sectors",
                "L1 sectors of global stores",
                "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
            ),
            (
                "global_st_requests",
                "global store requests",
                "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
            ),
            (
                "global_ld_sectors_per_request",
                "sectors per global load request (4 = 32-bit words fully coalesced)",
                "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio",
            ),
            (
                "smem_wavefronts_ld",
                "shared-memory load wavefronts",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
            ),
            (
                "smem_wavefronts_st",
                "shared-memory store wavefronts",
                "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
            ),
            (
                "smem_inst_ld",
                "shared-memory load instructions (warp level)",
                "smsp__sass_inst_executed_op_shared_ld.sum",
            ),
            (
                "smem_inst_st",
                "shared-memory store instructions (warp level)",
                "smsp__sass_inst_executed_op_shared_st.sum",
            ),
            (
                "fma_pipe_util",
                "FMA pipe active, % of peak",
                "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
            ),
            ("fma_inst", "warp instructions on the FMA pipe", "sm__inst_executed_pipe_fma.sum"),
        )
    ),
    # Advisor memory counters that are SASS/LSU counters (in every chip's `--query-metrics`).
    *(
        Concept(key, text, _same(name), request=True)
        for key, text, name in (
            ("local_ld_inst", "local-memory load instructions (warp level)", "smsp__sass_inst_executed_op_local_ld.sum"),
            ("local_st_inst", "local-memory store instructions (warp level)", "smsp__sass_inst_executed_op_local_st.sum"),
            ("global_ldgsts_requests", "cp.async (LDGSTS) global requests",
             "sm__sass_l1tex_t_requests_pipe_lsu_mem_global_op_ldgsts.sum"),
            ("global_ldgsts_sectors_bypass", "cp.async (LDGSTS) global sectors, L1 bypassed",
             "sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum"),
            ("global_ldgsts_sectors_access", "cp.async (LDGSTS) global sectors through L1",
             "sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum"),
            ("global_ld_bytes_per_sector", "bytes used per 32-byte sector of global loads",
             "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.ratio"),
            ("smem_wavefronts", "shared-memory wavefronts (loads, stores, ldmatrix, atomics)",
             "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"),
            ("hmma_pipe_util", "warp-level HMMA pipe active, % of peak",
             "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
        )
    ),
    # Bytes by memory level (faprof.advisor.traffic): L2 sectors the SMs' L1/TEX asked for, by
    # operation (reads, writes, atomics, reductions), and the peaks and clocks that turn bytes into time.
    *(
        Concept(key, text, _same(name), request=True)
        for key, text, name in (
            ("l2_sectors_read", "L2 sectors read by the SMs (L1/TEX requests)", "lts__t_sectors_srcunit_tex_op_read.sum"),
            ("l2_sectors_write", "L2 sectors written by the SMs", "lts__t_sectors_srcunit_tex_op_write.sum"),
            ("l2_sectors_atom", "L2 sectors of global atomics", "lts__t_sectors_srcunit_tex_op_atom.sum"),
            ("l2_sectors_red", "L2 sectors of global reductions", "lts__t_sectors_srcunit_tex_op_red.sum"),
            ("l2_bytes", "bytes through L2 (every source)", "lts__t_bytes.sum"),
            ("peak_l2_bytes_per_cycle", "L2 bytes per L2 cycle at peak", "lts__t_bytes.sum.peak_sustained"),
            ("l2_clock", "L2 clock during the kernel (cycles per second)", "lts__cycles_elapsed.avg.per_second"),
            ("peak_smem_wavefronts_per_cycle", "shared-memory wavefronts per SM cycle at peak, whole GPU",
             "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.peak_sustained"),
            ("global_red_inst", "global reduction instructions (RED, warp level)", "smsp__sass_inst_executed_op_global_red.sum"),
            ("global_atom_inst", "global atomic instructions (ATOM, warp level)", "smsp__sass_inst_executed_op_global_atom.sum"),
            ("global_atom_requests", "L1 requests of global atomics (one per warp instruction and address group)",
             "l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum"),
            ("global_red_requests", "L1 requests of global reductions", "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum"),
        )
    ),
]
