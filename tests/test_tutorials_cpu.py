"""The tutorials' CPU steps, run as their pages write them (scripts/docs_tutorials_cpu.sh), in CI.

The script types each command as a user would, in a scratch folder, with the files a page tells the
user to write taken from the page itself, and prints one row per step: the exit code the page says,
the one it gave, ok or FAIL. On a machine with a GPU the pages' steps take the GPU path (other rows,
other exit codes): there scripts/gpu/docs_tutorials_gpu.sh runs them instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "docs_tutorials_cpu.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine runs scripts/gpu/docs_tutorials_gpu.sh"),
]


def _expected_steps(dask: bool) -> list[str]:
    """The step names the script runs here: every `step NAME`, less the nvcc-gated ones without
    nvcc and the Dask one without `dask`."""
    text = SCRIPT.read_text()
    gated = set()
    for block in re.findall(r"^if command -v nvcc.*?^fi$", text, re.S | re.M):
        gated |= set(re.findall(r"^\s*step ([\w-]+) ", block, re.M))
    names = re.findall(r"^\s*step ([\w-]+) ", text, re.M)
    return [n for n in names
            if not (n in gated and shutil.which("nvcc") is None) and not (n == "dask-cluster" and not dask)]


def test_every_tutorial_cpu_step_gives_the_exit_code_its_page_says(tmp_path):
    # as from an activated virtualenv: this Python's scripts (`dask`) first on PATH
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    dask = importlib.util.find_spec("distributed") is not None and shutil.which("dask", path=path) is not None
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHON=sys.executable, PATH=path)
    p = subprocess.run(["bash", str(SCRIPT), *(["dask"] if dask else [])], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=1200)
    out = p.stdout + p.stderr
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^([\w-]+)\s+-?\d+\s+-?\d+\s+\d+s (ok|FAIL)$", out, re.M)}
    expected = _expected_steps(dask)
    assert len(expected) >= 25, "the script's steps were not found: the parser is out of date"
    missing = [n for n in expected if n not in rows]
    failed = [n for n, r in rows.items() if r != "ok"]
    assert p.returncode == 0 and not missing and not failed, (
        f"rc {p.returncode}; missing rows {missing}; failed {failed}\n{out[-6000:]}")
