"""Stand-in executables for the tests: a Python script that runs under this interpreter wherever it lives.

A `#!/path/to/python` line cannot hold a path with spaces (the kernel splits it at the first space), and
a virtualenv under such a path is where users run the tests. So the script starts as a shell script whose
first command execs this interpreter on the file itself; Python reads that line as a string literal.
"""

from __future__ import annotations

import shlex
import sys

#: The first two lines of a stand-in written in Python (follow with the code; no `from __future__`).
PY_HEADER = f"#!/bin/sh\n''''exec {shlex.quote(sys.executable)} \"$0\" \"$@\" #'''\n"
