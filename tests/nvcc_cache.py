"""Compiler output that tests read (PTX text, cuobjdump's SASS), cached by everything that decides it.

The rule is the one of ptxas' logs in faprof.variants.ptxas: the key hashes the tools (`--version` and
the executable's bytes), the command's flags, the source file and every header beside it and in the
include folders, so a change to any of them compiles again; only a finished output is stored. The
cache lives under faprof's cache root (FAPROF_CACHE, else ~/.cache/faprof), in tests/<kind>/: a test
run on a machine that compiled the same sources with the same tools before reads the output back
instead of running nvcc again (CI runs on such a machine); a fresh cache compiles.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from faprof.variants import build
from faprof.variants.build import PTXAS_CACHE_FORMAT

#: Bumped when what a cached file holds changes meaning (invalidates every entry).
FORMAT = 1

#: Header suffixes a kernel file may include (hashed into the key), as faprof.variants.ptxas reads them.
HEADER_SUFFIXES = (".h", ".cuh", ".hpp")

#: nvcc on the largest kernel file takes a minute or two on a loaded 2-core machine.
COMPILE_TIMEOUT_S = 1200

#: Entries kept per kind: every (file, arch) the tests read (18 PTX, 2 SASS) a few times over, so that
#: switching between branches still hits. The SASS of planted_mma.cu is 42 MB of text (~3 MB gzipped).
KEEP_PER_KIND = 48

#: gzip's fastest level: SASS and PTX text shrink ~10x at it, in a fraction of the compile's time.
GZIP_LEVEL = 1


@cache
def tool_identity(exe: str) -> str:
    """What identifies a tool for the cache: its `--version` output and a hash of the executable, not its
    path (CI installs cuobjdump's wheel into a new virtualenv folder every run: the same tool)."""
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        version = ""
    try:
        digest = hashlib.sha256(Path(exe).resolve().read_bytes()).hexdigest()
    except OSError:
        digest = str(Path(exe).resolve())
    return f"{digest}\n{version}"


def _file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in HEADER_SUFFIXES}


def cache_key(kind: str, tools: Sequence[str], flags: Sequence[str], source: Path,
              include_dirs: Sequence[Path] = ()) -> str:
    """Hash of the tools, the flags (paths left out: the same sources in another clone hit), the source
    and the headers in its folder and in `include_dirs`."""
    payload = {
        "format": [FORMAT, PTXAS_CACHE_FORMAT],
        "kind": kind,
        "tools": [tool_identity(t) for t in tools],
        "flags": list(flags),
        "source": [source.name, hashlib.sha256(source.read_bytes()).hexdigest()],
        "headers": [_file_hashes(d) for d in (source.parent, *include_dirs)],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def cached(kind: str, key: str, produce: Callable[[], str]) -> str:
    """The text stored under `key`, else `produce()`'s, stored atomically and gzipped (an unwritable
    cache only costs the next run a compile); then all but the newest KEEP_PER_KIND entries of the kind
    are deleted."""
    folder = build.cache_root() / "tests" / kind
    path = folder / f"{key}.txt.gz"
    try:
        return gzip.decompress(path.read_bytes()).decode()
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
        pass
    text = produce()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(gzip.compress(text.encode(), compresslevel=GZIP_LEVEL))
        os.replace(tmp, path)
        _prune(folder)
    except OSError:
        pass
    return text


def _prune(folder: Path) -> None:
    """Delete all but the newest KEEP_PER_KIND entries (a reader that loses the race compiles again)."""
    entries = sorted(folder.glob("*.txt.gz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP_PER_KIND:]:
        old.unlink(missing_ok=True)


def ptx(arch: str, source: Path, include_dirs: Sequence[Path] = (build.KERNELS_DIR,)) -> str:
    """`nvcc -ptx` of one kernel file for `arch` with the extension's flags (the PTX the tests grep)."""
    nvcc = build.find_nvcc()
    flags = ["-ptx", *build.NVCC_OPT_FLAGS, *build.TORCH_NVCC_FLAGS, f"-arch={arch}"]
    includes = [a for d in include_dirs for a in ("-I", str(d))]

    def produce() -> str:
        cmd = [nvcc, *flags, *includes, "-o", "-", str(source)]
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=COMPILE_TIMEOUT_S).stdout

    return cached("ptx", cache_key("ptx", [nvcc], flags, source, include_dirs), produce)
