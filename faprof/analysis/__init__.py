"""The analysis stage: every DataFrame-returning analysis of run bundles, shared by the CLI, reports and app.

This package is a facade: `from faprof import analysis` (or `from faprof.analysis import X`) gives
every public name of its modules, one per topic:

- `speedups`: throughput, % of peak, bandwidth, speedups over a scenario's baselines, rankings, scaling, fwd/bwd and memory tables;
- `labels`: column labels with units, run titles, problem labels, short chart ticks;
- `load`: run bundles loaded into a RunSet (the dashboard), filters, the order runs are offered in;
- `colors`: one colour per variant for every chart of a session;
- `speed`: timed/flagged rows, rankings over common problems, fwd/bwd, memory, timing rooflines;
- `published`: the seed reports' published figures beside measurements;
- `ncu_views`: occupancy, throughput, stall shares and rooflines from the Nsight Compute tables;
- `timeline`: the Nsight Systems timeline of one problem;
- `comparison`: the one two-run comparison (pairing, ratio, tests, verdicts with noise floors);
- `diff`: two runs row by row with faprof's one significance test (the Diff page's words);
- `files`: CSV, bundle archives, sanitize runs;
- `wrong`: wrong rows' error maps as heatmap grids;
- `leaderboard`: every kernel of a scenario on a GPU as % of the measured ceiling (import the module itself:
  `from faprof.analysis import leaderboard`).

Modules inside the package import each other directly, never this facade (no import circles).
"""

from faprof.analysis import comparison as comparison
from faprof.analysis import speedups as speedups
from faprof.analysis.colors import (  # noqa: F401
    KNOWN_ORDER,
    PALETTE,
    variant_colors,
)
from faprof.analysis.diff import (  # noqa: F401
    MIN_SAMPLES_FOR_TEST,
    SIGNIFICANCE_LEVEL,
    UNSTABLE_VERDICT,
    diff_runs,
)
from faprof.analysis.files import (  # noqa: F401
    MAX_ARCHIVE_BYTES,
    MAX_ARCHIVE_MEMBERS,
    csv_bytes,
    for_display,
    nsight_hint,
    safe_extract,
    sanitizer_table,
)
from faprof.analysis.labels import (  # noqa: F401
    CPU_LABEL,
    LABELS,
    config_label,
    gpu_label,
    label,
    machine_count,
    machines_phrase,
    parse_stamp,
    problem_label,
    problem_order,
    run_title,
    short_labels,
)
from faprof.analysis.load import (  # noqa: F401
    APP_PATH,
    EXAMPLES_DIR,
    FILTER_COLUMNS,
    LIST_COLUMNS,
    NSIGHT_TABLES,
    ORIGINS,
    SCENARIO_DIR,
    RunSet,
    apply_filters,
    filter_options,
    fingerprint,
    load_runs,
    run_order,
)
from faprof.analysis.ncu_views import (  # noqa: F401
    ALL_KERNELS,
    KERNEL_LABEL_CHARS,
    LAUNCH_KEY,
    PREFERRED_CEILING_SOURCE,
    PREFERRED_STALL_SOURCE,
    Roofline,
    ceiling_sources,
    clip,
    find_column,
    main_launches,
    ncu_key,
    occupancy,
    only_launches,
    roofline,
    roofline_curve,
    short_kernel,
    stall_shares,
    stall_sources,
    throughput,
)
from faprof.analysis.published import (  # noqa: F401
    gpu_comparison,
    measured_label,
    published_figures,
    published_label,
    report_number,
)
from faprof.analysis.speed import (  # noqa: F401
    COMMON_MIN_SHARE,
    MAX_CONFIGS_FOR_SEQ_AXIS,
    X_AXES,
    bound_of,
    common_problems,
    default_x_axis,
    error_ratio,
    flagged,
    fwd_bwd_tables,
    gpu_ceilings,
    line_series,
    memory_tables,
    not_run,
    ranking_table,
    roofline_from_timing,
    timed,
)
from faprof.analysis.timeline import (  # noqa: F401
    MAX_TIMELINE_BARS,
    timeline,
)
from faprof.analysis.wrong import (  # noqa: F401
    AXIS_LABELS,
    MAP_KEY,
    map_grid,
    maps_index,
)
