"""Stand-ins for the tests: a Python script that runs under this interpreter wherever it lives, and a user kernel.

A `#!/path/to/python` line cannot hold a path with spaces (the kernel splits it at the first space), and
a virtualenv under such a path is where users run the tests. So the script starts as a shell script whose
first command execs this interpreter on the file itself; Python reads that line as a string literal.
"""

from __future__ import annotations

import shlex
import sys

#: The first two lines of a stand-in written in Python (follow with the code; no `from __future__`).
PY_HEADER = f"#!/bin/sh\n''''exec {shlex.quote(sys.executable)} \"$0\" \"$@\" #'''\n"


#: A user kernel as a Python file (`--kernel FILE.py:attn`): plain torch attention, fp32, on any device;
#: tests add their own `attn.faprof_*` lines.
TORCH_ATTN_KERNEL = """
import torch

def attn(q, k, v, causal, scale, out=None):
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        m = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~m, float("-inf"))
    return torch.softmax(s, -1) @ v

attn.faprof_dtypes = ("fp32",)
attn.faprof_device = "auto"
"""
