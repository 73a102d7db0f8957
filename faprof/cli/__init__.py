"""The `faprof` command line: a thin shell over the stages (parse, call one function, print with rich).

`group` holds the click group and the printing helpers; the commands live in modules by theme and
register themselves on the group when imported here: `profiling` (profile, ncu, sanitize), `inspect`
(show, export, report, explain, compare, gate), `machine` (list, doctor, build, dashboard). Every command
imports the stage it calls inside its function, so `faprof --help` does not load torch or pandas.
"""

from faprof.cli import inspect, machine, profiling  # noqa: F401  (registers the commands on `main`)
from faprof.cli.group import main
from faprof.cli.machine import build_table

__all__ = ["build_table", "main"]
