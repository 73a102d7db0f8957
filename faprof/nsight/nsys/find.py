"""Finding Nsight Systems: the nsys binary, its version, and whether its QdstrmImporter can run.

Without the importer's libraries nsys leaves a multi-GB `.qdstrm` and no report, so `collect`
checks it before capturing and `faprof doctor` shows it (`doctor_checks`).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from faprof.checks import Check

#: Environment variable naming the nsys binary (or the folder holding it); it wins over PATH.
NSYS_ENV = "NSYS"

#: Where Nsight Systems lands when it is not on PATH, most specific first. A full Nsight Systems
#: install comes before the copy that ships inside Nsight Compute (`host/target-linux-x64/nsys`),
#: which is where the H100 test machine has it. Within a pattern the newest version wins.
NSYS_GLOBS: tuple[str, ...] = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys",
    "/usr/local/cuda*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    "/usr/local/cuda*/nsight-compute-*/host/target-linux-x64/nsys",
)

IMPORTER = "QdstrmImporter"

#: Shared libraries the importer is known to miss on slim images, and the Debian/Ubuntu package
#: that ships each (the H100 image lacks libdw1 and libelf1).
LIBRARY_PACKAGES: dict[str, str] = {
    "libdw.so.1": "libdw1",
    "libelf.so.1": "libelf1",
    "libz.so.1": "zlib1g",
    "liblzma.so.5": "liblzma5",
    "libbz2.so.1.0": "libbz2-1.0",
    "libzstd.so.1": "libzstd1",
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
}


def _version_key(path: str) -> tuple[int, ...]:
    """Sort key: the version numbers in a path (`.../2025.3.1/...` > `.../2024.4.2/...`)."""
    return tuple(int(n) for n in re.findall(r"\d+", path))


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_nsys(environ: dict[str, str] | None = None, globs: Sequence[str] | None = None) -> Path | None:
    """The nsys binary to use, or None.

    Looks, in order, at `$NSYS` (a binary, or a folder holding `nsys` or `bin/nsys`), at PATH, then
    under the usual installs (`NSYS_GLOBS`: Nsight Systems installs, CUDA toolkits, and the copy
    inside Nsight Compute at `/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys`).

    Args:
        environ: environment to read NSYS and PATH from (default: os.environ).
        globs: install patterns to search (default: NSYS_GLOBS).

    Returns:
        The path of an executable nsys, or None when there is none.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(NSYS_ENV)
    if explicit:
        p = Path(explicit).expanduser()
        for cand in (p, p / "nsys", p / "bin" / "nsys"):
            if _executable(cand):
                return cand
    on_path = shutil.which("nsys", path=env.get("PATH", ""))
    if on_path:
        return Path(on_path)
    for pattern in NSYS_GLOBS if globs is None else globs:
        for hit in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            if _executable(Path(hit)):
                return Path(hit)
    return None


def nsys_version(nsys: Path) -> str | None:
    """'2025.3.1.90-...' from `nsys --version`, or None when it does not answer."""
    try:
        r = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (r.stdout or "") + (r.stderr or "")
    m = re.search(r"version\s+(\S+)", text)
    return m.group(1) if m else (text.strip().splitlines()[0] if text.strip() else None)


def find_importer(nsys: Path) -> Path | None:
    """The QdstrmImporter that belongs to `nsys`: beside it, or in the install's host folder.

    Layouts: Nsight Systems has `target-linux-x64/nsys` (or `bin/nsys`, a link into it) beside
    `host-linux-x64/QdstrmImporter`; the copy inside Nsight Compute keeps both in
    `host/target-linux-x64/`; Debian splits them under /usr/lib.
    """
    starts = [Path(nsys)]
    real = Path(os.path.realpath(nsys))
    if real != Path(nsys):
        starts.append(real)
    candidates: list[Path] = []
    for n in starts:
        d = n.parent
        candidates += [d / IMPORTER, d.parent / "host-linux-x64" / IMPORTER]
        candidates += sorted(d.parent.glob(f"host-linux-*/{IMPORTER}"))
        candidates += sorted(d.parent.glob(f"*/{IMPORTER}"))
        candidates += sorted(d.parent.parent.glob(f"*/host-linux-*/{IMPORTER}"))
    candidates += [Path("/usr/lib/nsight-systems/host-linux-x64") / IMPORTER,
                   Path("/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64") / IMPORTER]
    for c in candidates:
        if _executable(c):
            return c
    return None


def missing_libraries(ldd_output: str) -> list[str]:
    """Library names `ldd` reports as 'not found', in its order."""
    missing = []
    for line in ldd_output.splitlines():
        m = re.match(r"\s*(\S+)\s*=>\s*not found", line)
        if m and m.group(1) not in missing:
            missing.append(m.group(1))
    return missing


#: Packages a missing library's package needs in turn: ldd cannot see them while the first one is
#: missing, and `dpkg -x` (unlike apt) does not pull them in. libdw1 links libelf.so.1.
PACKAGE_NEEDS: dict[str, tuple[str, ...]] = {"libdw1": ("libelf1",)}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def importer_problem(missing: list[str]) -> str:
    """What to say when the importer cannot load `missing` (names from `missing_libraries`)."""
    direct = list(dict.fromkeys(LIBRARY_PACKAGES[m] for m in missing if m in LIBRARY_PACKAGES))
    extra = [n for p in direct for n in PACKAGE_NEEDS.get(p, ()) if n not in direct]
    pkgs = direct + extra
    where = ""
    if direct:
        where = f" (Debian/Ubuntu package{'s' if len(direct) > 1 else ''} {_and(direct)}"
        where += f", which need{'' if len(direct) > 1 else 's'} {_and(extra)})" if extra else ")"
    what = _and(pkgs) if pkgs else "the package that provides it"
    return (f"{_and(missing)}{where} — install {what} or unpack {'them' if len(pkgs) != 1 else 'it'} with dpkg -x "
            f"into a folder on LD_LIBRARY_PATH (e.g. apt-get download {' '.join(pkgs) or '<package>'}; "
            "dpkg -x each .deb into /opt/nsys-libs; "
            "export LD_LIBRARY_PATH=/opt/nsys-libs/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH)")


def check_importer(nsys: Path, environ: dict[str, str] | None = None) -> tuple[bool, str]:
    """Whether nsys can turn a capture into a report: its QdstrmImporter's libraries all resolve.

    Args:
        nsys: the nsys binary (`find_nsys`).
        environ: environment for `ldd` (LD_LIBRARY_PATH matters; default os.environ).

    Returns:
        (ok, message): the message names the importer, or exactly what is missing and what to do.
    """
    importer = find_importer(nsys)
    if importer is None:
        return False, (f"no {IMPORTER} found beside {nsys}: nsys would leave a raw .qdstrm capture and no "
                       "report; install the complete Nsight Systems (or point NSYS at one)")
    ldd = shutil.which("ldd")
    if ldd is None:
        return True, f"{importer} (its libraries were not checked: no ldd on this machine)"
    try:
        r = subprocess.run([ldd, str(importer)], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ if environ is None else environ))
    except (OSError, subprocess.TimeoutExpired) as e:
        return True, f"{importer} (its libraries were not checked: ldd failed: {e})"
    missing = missing_libraries(r.stdout + r.stderr)
    if missing:
        return False, f"nsys' importer {importer} cannot load " + importer_problem(missing)
    return True, str(importer)


def doctor_checks() -> list:
    """`faprof doctor`'s lines for Nsight Systems: nsys found (with its version), importer usable."""

    nsys = find_nsys()
    if nsys is None:
        return [Check("nsys", "warn", "not found (PATH, $NSYS, Nsight Systems / Nsight Compute installs)",
                      "install Nsight Systems, or set NSYS=/path/to/nsys; `faprof profile --nsys` needs it")]
    version = nsys_version(nsys)
    checks = [Check("nsys", "ok" if version else "warn", f"{nsys} ({version or 'no answer to --version'})")]
    ok, message = check_importer(nsys)
    checks.append(Check("nsys importer", "ok" if ok else "fail", message,
                        "" if ok else "without it nsys writes a multi-GB .qdstrm and no report"))
    return checks
