"""The CI gate: is a candidate run slower than a baseline run, kernel by kernel (see core.py).

Modules: core (run_gate, options, exit codes), stats (one-sample shift and verdicts), noise
(between-run noise floors), pool (pooling rows into a kernel's decision), verdicts (per-row
verdicts), provenance (are the two runs comparable), why (the counters that moved), render
(terminal, Markdown, JSON, JUnit).
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
