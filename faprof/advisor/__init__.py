"""The advisor: why each (variant, shape) is as fast as it is, ranked, with the evidence.

Public API (the report's "Why" section, the dashboard's Nsight page and `faprof explain` use it):

- `diagnose(bundle_or_tables) -> DataFrame`: one row per finding (variant, shape_id, rank,
  primary, cause, title, kind, kernel, estimated_gain_pct, evidence, fix, rule); rank 1 of each
  (variant, shape) is its primary cause.
- `summarize(diag) -> DataFrame`: one row per (variant, cause) across shapes, with the shapes it
  is primary on and the largest estimated gain.
- `render_text / render_markdown / rich_table(diag, summary=None, per_shape=False)`.
- `THRESHOLDS` (`thresholds_table()`): every number a rule decides with.
- `CAUSES` (`record(key)`): one `Cause` record per cause the advisor can name (`faprof.advisor.causes`);
  `DEFECT_CAUSES`.

Rules (rules_kernel: one kernel launch; rules_call: a whole call) rest on hardware counters and
measurements only, never on kernel or variant names; they were checked on planted-fault kernels
(tests/planted) whose single defect each must come out as the primary cause.
"""

from faprof.advisor.causes import CAUSES, DEFECT_CAUSES, KINDS, Cause, record
from faprof.advisor.diagnose import DIAG_COLUMNS, SUMMARY_COLUMNS, diagnose, primary_causes, summarize
from faprof.advisor.findings import LIMITER_ADVICE, STALL_ADVICE
from faprof.advisor.render import render_markdown, render_text, rich_table, select
from faprof.advisor.thresholds import THRESHOLDS, thresholds_table

__all__ = [
    "CAUSES", "DEFECT_CAUSES", "Cause", "DIAG_COLUMNS", "KINDS", "LIMITER_ADVICE", "STALL_ADVICE", "SUMMARY_COLUMNS",
    "THRESHOLDS", "diagnose", "primary_causes", "render_markdown", "render_text", "record", "rich_table",
    "select", "summarize", "thresholds_table",
]
