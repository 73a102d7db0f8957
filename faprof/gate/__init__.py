"""The CI gate, a stage of its own: is a candidate run slower than a baseline run, kernel by kernel.

The statistics are the one two-run comparison's (`faprof.analysis.comparison`: the rows' pairing,
the Hodges-Lehmann shift and its verdict, each kernel pooled with the between-run noise floor); the
gate adds its policy on top. Modules: judge (run_gate, options, exit codes), noise (estimating the
between-run noise floors), verdicts (per-row verdicts: which rows gate, wrong and failed rows,
undecided ones, re-timed rows), provenance (are the two runs comparable), why_moved (the counters that
moved), outputs (terminal, Markdown, JSON, JUnit) and quick_delta (`faprof profile --quick`: a kernel's
run against its previous quick run, with the same statistics). It reads bundles only: the runs it
starts (a candidate scenario profiled now, ambiguous rows re-timed) are faprof.run.gate_runs, which
the command line wires to it.
"""

from faprof.analysis.comparison.shift import SLOWER
from faprof.gate.judge import (
    DEFAULT_THRESHOLD,
    EXIT_AMBIGUOUS,
    EXIT_OK,
    EXIT_REGRESSION,
    GateResult,
    Retime,
    parse_threshold,
    resolve_threshold,
    run_gate,
)
from faprof.gate.provenance import cudnn_version
from faprof.gate.verdicts import GateOptions

__all__ = ["DEFAULT_THRESHOLD", "EXIT_AMBIGUOUS", "EXIT_OK", "EXIT_REGRESSION", "SLOWER", "GateOptions",
           "GateResult", "Retime", "cudnn_version", "parse_threshold", "resolve_threshold", "run_gate"]
