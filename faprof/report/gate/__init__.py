"""The CI gate: is a candidate run slower than a baseline run, kernel by kernel (see core.py).

The statistics are the one two-run comparison's (`faprof.analysis.comparison`: the rows' pairing,
the Hodges-Lehmann shift and its verdict, each kernel pooled with the between-run noise floor); the
gate adds its policy on top. Modules: core (run_gate, options, exit codes), noise (estimating the
between-run noise floors), verdicts (per-row verdicts: which rows gate, wrong and failed rows,
undecided ones, re-timed rows), provenance (are the two runs comparable), why (the counters that
moved), render (terminal, Markdown, JSON, JUnit).
"""

from faprof.report.gate.core import (
    DEFAULT_THRESHOLD,
    EXIT_AMBIGUOUS,
    EXIT_OK,
    EXIT_REGRESSION,
    SLOWER,
    GateOptions,
    GateResult,
    Retime,
    cudnn_version,
    parse_threshold,
    resolve_threshold,
    run_gate,
)

__all__ = ["DEFAULT_THRESHOLD", "EXIT_AMBIGUOUS", "EXIT_OK", "EXIT_REGRESSION", "SLOWER", "GateOptions",
           "GateResult", "Retime", "cudnn_version", "parse_threshold", "resolve_threshold", "run_gate"]
