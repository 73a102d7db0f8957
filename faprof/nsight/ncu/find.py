"""Finding Nsight Compute: the ncu executable, its version, the metrics a chip has, and `faprof doctor`'s checks.

Order of the search: `$NCU` (a file, or a folder holding ncu), PATH, CUDA toolkits
(`$CUDA_HOME/bin`, `$CUDA_PATH/bin`, /usr/local/cuda*/bin), then Nsight Compute installs
(/opt/nvidia/nsight-compute/<version>/ncu, newest version first).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from faprof import resources

#: Oldest ncu with `--import-source` (added in Nsight Compute 2020.3); older versions get no flag.
IMPORT_SOURCE_MIN_VERSION = (2020, 3)

#: The doctor's counter-permission probe profiles one tiny torch op; torch's import and CUDA
#: start-up under ncu take most of it.
DOCTOR_PROBE_TIMEOUT_S = 30.0

#: `ncu --version` and `--query-metrics` answer in a second or two; past this ncu is stuck.
QUICK_COMMAND_TIMEOUT_S = 60.0

#: Where Nsight Compute installs live besides PATH and $NCU (newest version first).
CUDA_NCU_GLOBS = ("/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu")
NSIGHT_NCU_GLOBS = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/nsight-compute-*/ncu")

PERMISSION_ERROR = "ERR_NVGPUCTRPERM"
PERMISSION_HINT = (
    "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): the driver restricts "
    "them to administrators. Either run faprof as root (sudo -E env PATH=$PATH faprof ...), or allow "
    "every user: put `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in "
    "/etc/modprobe.d/nvidia-profiling.conf and reload the nvidia module (or reboot); in a container, "
    "start it with --cap-add=SYS_ADMIN. See https://developer.nvidia.com/ERR_NVGPUCTRPERM. "
    "Timing results are unaffected; the Nsight Compute tables are skipped."
)


#: What `faprof` says when no ncu is found (one line).
NOT_FOUND = (
    "Nsight Compute (ncu) not found on PATH, in $NCU, under $CUDA_HOME/bin or /opt/nvidia/nsight-compute: "
    "install Nsight Compute or set NCU=/path/to/ncu"
)

_VERSION_RE = re.compile(r"Version\s+(\d+)\.(\d+)(?:\.(\d+))?")
_METRIC_NAME_RE = re.compile(r"^[a-z0-9]+__[a-z0-9_]+$")


def _version_key(path: Path) -> tuple[int, ...]:
    nums = re.findall(r"\d+", str(path))
    return tuple(int(n) for n in nums)


def _glob_newest(patterns: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for pattern in patterns:
        p = Path(pattern)
        if "*" not in pattern:
            found.append(p)
            continue
        anchor = Path(p.anchor)
        found.extend(sorted(anchor.glob(str(p.relative_to(anchor))), key=_version_key, reverse=True))
    return found


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_ncu(env: Mapping[str, str] | None = None) -> Path | None:
    """Locate the ncu executable.

    Order: `$NCU` (a file, or a folder holding ncu: an explicit setting wins), then PATH, then CUDA
    toolkits (`$CUDA_HOME/bin`, `$CUDA_PATH/bin`, /usr/local/cuda*/bin), then Nsight Compute
    installs (/opt/nvidia/nsight-compute/<version>/ncu, newest version first).

    Args:
        env: environment to read NCU, PATH, CUDA_HOME and CUDA_PATH from (default: os.environ).

    Returns:
        The path, or None when no ncu is found.
    """
    env = os.environ if env is None else env
    explicit = env.get("NCU")
    if explicit:
        p = Path(explicit).expanduser()
        for cand in (p, p / "ncu"):
            if _executable(cand):
                return cand
    on_path = shutil.which("ncu", path=env.get("PATH", ""))
    if on_path:
        return Path(on_path)
    candidates: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            candidates.append(Path(env[var]) / "bin" / "ncu")
    candidates += _glob_newest(CUDA_NCU_GLOBS) + _glob_newest(NSIGHT_NCU_GLOBS)
    for cand in candidates:
        if _executable(cand):
            return cand
    return None


def _run_quick(
    cmd: Sequence[str], timeout: float = QUICK_COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


_VERSION_CACHE: dict[str, tuple[str | None, tuple[int, ...] | None]] = {}


def ncu_version(ncu: str | Path) -> tuple[str | None, tuple[int, ...] | None]:
    """(version text such as '2025.3.1.0', parsed (year, minor, patch)) of an ncu; (None, None) if it does not answer."""
    key = str(ncu)
    if key not in _VERSION_CACHE:
        r = _run_quick([key, "--version"])
        text = (r.stdout + r.stderr) if r is not None else ""
        m = _VERSION_RE.search(text)
        if m is None:
            _VERSION_CACHE[key] = (None, None)
        else:
            full = re.search(r"Version\s+(\S+)", text)
            _VERSION_CACHE[key] = (
                full.group(1) if full else m.group(0),
                tuple(int(g) for g in m.groups() if g is not None),
            )
    return _VERSION_CACHE[key]


def supports_import_source(version: tuple[int, ...] | None) -> bool:
    """Whether this ncu version has `--import-source`."""
    return version is not None and tuple(version[:2]) >= IMPORT_SOURCE_MIN_VERSION


def parse_query_metrics(text: str) -> set[str]:
    """Base metric names from `ncu --query-metrics` output (the first word of each table row)."""
    names = set()
    for line in text.splitlines():
        words = line.replace(",", " ").replace('"', " ").split()
        if words and _METRIC_NAME_RE.match(words[0]):
            names.add(words[0])
    return names


_QUERY_CACHE: dict[tuple[str, str | None], set[str] | None] = {}


def query_metrics(ncu: str | Path, chip: str | None = None) -> set[str] | None:
    """The base metric names the GPU (or `chip`, e.g. 'gh100') has, from `ncu --query-metrics`.

    Needs no counter permission. None when ncu does not answer (no GPU and no chip given, ...).
    """
    key = (str(ncu), chip)
    if key not in _QUERY_CACHE:
        cmd = [str(ncu), "--query-metrics"] + (["--chip", chip] if chip else [])
        r = _run_quick(cmd)
        names = parse_query_metrics(r.stdout) if r is not None and r.returncode == 0 else set()
        _QUERY_CACHE[key] = names or None
    return _QUERY_CACHE[key]


def faprof_root() -> Path:
    """The folder holding the faprof package (a source tree's root, or site-packages)."""
    return resources.package_parent()


def child_env() -> dict[str, str]:
    """The environment of faprof's child processes: unbuffered, with faprof's root on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    root = str(faprof_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
