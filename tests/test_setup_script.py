"""scripts/setup.sh's chromium step: installed as root without a terminal (CI), never silently otherwise.

The script runs against stubs: a python that installs nothing, an apt-get and a sudo that only log their
arguments, an `id` that says which user runs it; chromium is not on the PATH."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "scripts" / "setup.sh"


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _run(tmp_path: Path, uid: int, env: dict[str, str] | None = None, sudo: bool = False) -> tuple[str, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "log"
    for tool in ("bash", "dirname", "cat"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    _stub(bin_dir / "python3", "exit 0\n")  # pip installs nothing; `import torch` succeeds; no CUDA version
    _stub(bin_dir / "id", f'[ "$1" = "-u" ] && echo {uid}\n')
    _stub(bin_dir / "apt-get", f'echo "apt-get $*" >> {log}\n')
    if sudo:
        _stub(bin_dir / "sudo", f'echo "sudo $*" >> {log}\nexec "$@"\n')
    r = subprocess.run(["bash", str(SETUP)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                       env={"PATH": str(bin_dir), **(env or {})})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_root_without_a_terminal_installs_chromium_and_says_so(tmp_path):
    out, calls = _run(tmp_path, uid=0)
    assert "setup: installing faprof (editable, extras app, report, dev)" in out
    assert "setup: installing Debian's chromium with apt-get (for the browser tests" in out
    assert calls == ["apt-get install -y -q chromium"]


@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_a_user_without_a_terminal_is_told_how_and_nothing_is_installed(tmp_path):
    out, calls = _run(tmp_path, uid=1000, sudo=True)
    assert calls == [] and "chromium not installed (apt-get needs root)" in out and "FAPROF_INSTALL_BROWSER=1" in out


@pytest.mark.skipif(os.name != "posix", reason="a bash script")
def test_install_browser_0_never_installs_and_1_goes_through_sudo(tmp_path):
    out, calls = _run(tmp_path, uid=0, env={"FAPROF_INSTALL_BROWSER": "0"})
    assert calls == [] and "not installing chromium" in out
    (tmp_path / "user").mkdir()
    out, calls = _run(tmp_path / "user", uid=1000, env={"FAPROF_INSTALL_BROWSER": "1"}, sudo=True)
    assert calls == ["sudo apt-get install -y -q chromium", "apt-get install -y -q chromium"], out
    assert "with sudo apt-get" in out
