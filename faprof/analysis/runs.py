"""The dashboard's data layer under its old name: every name of the `faprof.analysis` facade.

Kept so that code written against `faprof.analysis.runs` (the advisor's dashboard view, older
scripts) keeps working; new code imports `faprof.analysis` (or one of its topic modules).
"""

from faprof.analysis import *  # noqa: F403
from faprof.analysis import labels, load  # noqa: F401
from faprof.analysis.load import RunSet  # noqa: F401  (named for type checkers)
