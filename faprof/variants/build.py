"""JIT build of kernels/ as one torch extension, and the CUDA toolchain faprof uses.

`load()` compiles `kernels/binding.cpp` and every `kernels/*.cu` into one shared library with
`torch.utils.cpp_extension.load` (ninja compiles the .cu files in parallel) and loads it, so that
the ops are `torch.ops.faprof.<name>`. The build directory is keyed by a hash of the sources, the
flags, torch and the target architecture, and reused while none of them changes. ptxas' resource
report of every kernel (`faprof build`) is in faprof.build_report, on the same toolchain and flags.

Compiler flags (one list for the build and the resource report, so that the report describes the
code that runs):
``-O3 -lineinfo -std=c++17`` plus the half/bfloat16 macros torch passes to nvcc. No
``--use_fast_math``: it would flush denormals and swap division, sqrt and expf for their
approximate forms; the kernels call exp2f/log2f explicitly where a fast exponential is wanted,
and fp32 results then match a float64 reference to about 1e-6.

"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faprof import resources
from faprof.errors import FaprofError

#: Where the CUDA sources live: the repository's kernels/ folder beside the package.
KERNELS_DIR = resources.kernels_dir()

#: Name of the shared library (and of torch's extension); ops live in the `faprof` namespace.
EXTENSION_NAME = "faprof_ext"

#: Bump to invalidate every cached build (e.g. when the way the build is done changes).
BUILD_FORMAT = 1

#: nvcc flags common to the extension build and the resource report.
NVCC_OPT_FLAGS = ("-O3", "-lineinfo", "-std=c++17")

#: What torch.utils.cpp_extension adds to every nvcc command line (COMMON_NVCC_FLAGS); repeated
#: here so that resource_report compiles the same device code without importing torch.
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)

#: Host compiler flags for binding.cpp (torch chooses the C++ standard its headers need).
HOST_CFLAGS = ("-O3",)

#: Architectures resource_report compiles for by default: Ampere, Ada and Hopper.
DEFAULT_REPORT_ARCHS = ("sm_80", "sm_89", "sm_90")

#: File extensions whose contents go into the build hash.
_SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp")

#: The oldest architecture the kernels build for: they use cp.async, bf16 and mma.sync.m16n8k16,
#: which Ampere (sm_80) introduced. normalize_arch still reads older names (sm_75, the T4).
MIN_KERNEL_ARCH = 80

#: Bump to invalidate every cached ptxas log (when the way logs are made or keyed changes).
PTXAS_CACHE_FORMAT = 1

_MARKER = "faprof_build.json"


@dataclass(frozen=True)
class BuildInfo:
    """What `load()` did."""

    build_dir: Path
    """Build directory (ninja file, objects, the shared library)."""
    arch: str
    """Target architecture, e.g. 'sm_90a' or 'sm_89'."""
    seconds: float
    """Wall time of this load: compile + link when cold, loading the library when warm."""
    cold: bool
    """True when something was compiled; False when a cached library was reused."""
    library: Path
    """The shared library that was loaded into the process."""
    nvcc_flags: tuple[str, ...] = field(default_factory=tuple)
    """Flags passed to nvcc for the .cu files (besides torch's own)."""

    def summary(self) -> str:
        """One line for the CLI: 'cold build for sm_90a in 41.2 s (…/build/ab12…)'."""
        kind = "cold build" if self.cold else "warm load (cached build)"
        return f"{kind} for {self.arch} in {self.seconds:.1f} s ({self.build_dir})"


_LOCK = threading.Lock()
_LOADED: BuildInfo | None = None


# ----------------------------------------------------------------------------- toolchain
def find_cuda_home() -> Path | None:
    """The CUDA toolkit's root (the folder holding bin/nvcc and include/), or None.

    Looks at $CUDA_HOME, $CUDA_PATH, the nvcc on PATH (also when PATH holds a wrapper script,
    as in some images, by checking which candidate has include/cuda_runtime.h), then
    /usr/local/cuda.
    """
    candidates: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]))
    which = shutil.which("nvcc")
    if which:
        candidates.append(Path(which).parent.parent)
        candidates.append(Path(which).resolve().parent.parent)
    candidates.append(Path("/usr/local/cuda"))
    for c in candidates:
        if (c / "bin" / "nvcc").exists() and (c / "include" / "cuda_runtime.h").exists():
            return c
    return None


def find_nvcc() -> str:
    """Path of nvcc; FaprofError saying what to install when there is none."""
    home = find_cuda_home()
    if home is not None:
        return str(home / "bin" / "nvcc")
    which = shutil.which("nvcc")
    if which:
        return which
    raise FaprofError(
        "nvcc (the CUDA compiler) was not found on PATH, in $CUDA_HOME/bin or in /usr/local/cuda/bin. "
        "Install the CUDA toolkit matching your torch build (e.g. `apt install cuda-toolkit-13-0`, or "
        "`pip install nvidia-cuda-nvcc` and set CUDA_HOME), or set CUDA_HOME to its folder."
    )


def normalize_arch(arch: str) -> str:
    """'sm_89', '89', '8.9', 'compute_89' -> 'sm_89'. Compute capability 9.0 becomes 'sm_90a'.

    Hopper builds use the arch-specific target sm_90a, which every CC 9.0 device runs, so that a
    kernel may use Hopper-only instructions (wgmma, TMA); the report does the same so its numbers
    describe the code that runs.
    """
    s = arch.strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)\.?(\d)?([af]?)", s)
    if not m:
        raise FaprofError(f"cannot read CUDA architecture {arch!r}; write it like 'sm_89' or 'sm_90a'")
    digits = m.group(1) + (m.group(2) or "")
    suffix = m.group(3)
    if digits == "90":
        suffix = "a"
    if int(digits) < 75:
        raise FaprofError(f"CUDA architecture {arch!r} is older than sm_75, which CUDA 13 does not target")
    return f"sm_{digits}{suffix}"


def require_kernel_arch(arch: str) -> str:
    """normalize_arch, and a one-line FaprofError for an architecture the kernels cannot be built for."""
    a = normalize_arch(arch)
    if int(re.sub(r"\D", "", a)) < MIN_KERNEL_ARCH:
        raise FaprofError(f"the kernels need sm_{MIN_KERNEL_ARCH} or newer (cp.async, bf16, mma.sync); "
                          f"{arch.strip()} is older")
    return a


def gencode_flag(arch: str) -> str:
    """nvcc's -gencode flag for one architecture: SASS only, no PTX."""
    a = normalize_arch(arch)[3:]
    return f"-gencode=arch=compute_{a},code=sm_{a}"


def target_arch() -> str:
    """The architecture to build for: $FAPROF_CUDA_ARCH, else the current GPU's."""
    env = os.environ.get("FAPROF_CUDA_ARCH")
    if env:
        return require_kernel_arch(env)
    import torch

    if not torch.cuda.is_available():
        raise FaprofError(
            "no CUDA GPU is visible, so faprof cannot tell which architecture to build for; run on a GPU "
            "machine, or set FAPROF_CUDA_ARCH (e.g. sm_89) to build anyway"
        )
    major, minor = torch.cuda.get_device_capability()
    return require_kernel_arch(f"{major}{minor}")


def extension_nvcc_flags(arch: str) -> list[str]:
    """nvcc flags for the extension's .cu files (torch adds its include paths and macros)."""
    return [*NVCC_OPT_FLAGS, gencode_flag(arch)]


def shared_libstdcxx_ldflags() -> list[str]:
    """Link flags that make the extension use the C++ runtime torch already loaded.

    Some toolchains link libstdc++ statically into shared objects (seen with a g++ wrapper whose
    -B directory holds only libstdc++.a). The extension then carries its own copy of the C++
    runtime beside torch's, and the first iostream call that formats a number (TORCH_CHECK's
    message with a tensor's sizes) crashes on the two copies' locale facets. Naming the
    libstdc++.so that this process loaded (torch brings it in) on the link line makes the linker
    resolve every C++ runtime symbol against it, whatever the toolchain's default. Empty off
    Linux or when no shared libstdc++ is loaded.
    """
    if not sys.platform.startswith("linux"):
        return []
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and re.search(r"/libstdc\+\+\.so[.\d]*$", fields[-1]):
            return [fields[-1]]
    return []


def cache_root() -> Path:
    """$FAPROF_CACHE, else ~/.cache/faprof; builds go under <root>/build/<hash>."""
    env = os.environ.get("FAPROF_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "faprof"


def kernel_sources(kernels_dir: Path = KERNELS_DIR) -> list[Path]:
    """binding.cpp first, then every .cu file, sorted: what the extension is built from."""
    binding = kernels_dir / "binding.cpp"
    if not binding.exists():
        raise FaprofError(
            f"{binding} is missing: faprof's kernels/ folder is incomplete (is this a full checkout?)"
        )
    return [binding, *sorted(kernels_dir.glob("*.cu"))]


def _source_hashes(folder: Path) -> dict[str, str]:
    files = sorted(p for p in folder.iterdir() if p.suffix in _SOURCE_SUFFIXES and p.is_file())
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def build_hash(
    arch: str,
    nvcc_flags: Sequence[str],
    torch_version: str,
    torch_cuda: str | None,
    kernels_dir: Path = KERNELS_DIR,
    ldflags: Sequence[str] = (),
    extra_dirs: Sequence[Path] = (),
    name: str = EXTENSION_NAME,
) -> str:
    """16 hex digits over the sources' contents, the flags, torch, the arch and the platform.

    Args:
        arch, nvcc_flags, torch_version, torch_cuda, ldflags: what the build is made with.
        kernels_dir: the folder whose .cu/.cuh/.h/.hpp/.cpp files go into the hash.
        extra_dirs: more such folders (a test extension's kernels include faprof's headers).
        name: the extension's name.
    """
    payload: dict[str, Any] = {
        "format": BUILD_FORMAT,
        "name": name,
        "sources": _source_hashes(kernels_dir),
        "nvcc_flags": list(nvcc_flags),
        "cflags": list(HOST_CFLAGS),
        "ldflags": list(ldflags),
        "torch": torch_version,
        "torch_cuda": torch_cuda,
        "arch": arch,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
    }
    if extra_dirs:  # only then, so that faprof's own hash keeps its payload's shape
        payload["extra_sources"] = [_source_hashes(d) for d in extra_dirs]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------- load
def load(verbose: bool = False, on_status: Callable[[str], None] | None = None) -> BuildInfo:
    """Build (if needed) and load the faprof extension; afterwards ops are torch.ops.faprof.*.

    Cheap after the first call in a process (it returns the first call's BuildInfo: a library
    registering the `faprof` op namespace can be loaded only once per process, so source edits
    need a new process). Across processes, an unchanged build directory is reused without
    running the compiler.

    Args:
        verbose: show torch's and ninja's build output.
        on_status: called with a short message before a cold build starts (the CLI prints it).

    Returns:
        BuildInfo with the build directory, architecture, time taken and whether it compiled.

    Raises:
        FaprofError: torch without CUDA, no nvcc, no GPU and no FAPROF_CUDA_ARCH, or a failed build.
    """
    global _LOADED
    with _LOCK:
        if _LOADED is not None:
            return _LOADED
        _LOADED = _load_locked(verbose, on_status)
        return _LOADED


@dataclass(frozen=True)
class ExtensionSpec:
    """A torch extension built from CUDA files with faprof's toolchain and flags: faprof's own, or a test's."""

    name: str
    """The shared library's name (and torch's extension name)."""
    sources: tuple[Path, ...]
    """The binding .cpp and the .cu files."""
    include_dirs: tuple[Path, ...]
    """Include paths for nvcc and the host compiler."""
    hashed_dirs: tuple[Path, ...]
    """Folders whose source files go into the build hash (the sources' and every included header's)."""
    build_prefix: str = ""
    """The build directory is <cache>/build/<prefix><hash>."""
    what: str = "the faprof extension"
    """How messages name it."""


def faprof_extension() -> ExtensionSpec:
    """faprof's own extension: kernels/binding.cpp and every kernels/*.cu."""
    return ExtensionSpec(EXTENSION_NAME, tuple(kernel_sources()), (KERNELS_DIR,), (KERNELS_DIR,))


def _load_locked(verbose: bool, on_status: Callable[[str], None] | None) -> BuildInfo:
    return build_extension(faprof_extension(), verbose, on_status)


def build_extension(spec: ExtensionSpec, verbose: bool = False,
                    on_status: Callable[[str], None] | None = None) -> BuildInfo:
    """Build `spec` (unless an unchanged build is cached) and load it into this process.

    faprof's own extension goes through `load()` (once per process); tests build their own
    test-only kernels with this, under the same flags and cache (see tests/kernels/).

    Args:
        spec: what to build.
        verbose: show torch's and ninja's build output.
        on_status: called with a short message before a cold build starts.

    Returns:
        BuildInfo with the build directory, architecture, time taken and whether it compiled.

    Raises:
        FaprofError: torch without CUDA, no nvcc, no GPU and no FAPROF_CUDA_ARCH, or a failed build.
    """
    t0 = time.perf_counter()
    import torch

    if torch.version.cuda is None:
        raise FaprofError(
            f"torch {torch.__version__} is a CPU-only build, so faprof's CUDA kernels cannot be built; install a "
            "CUDA build of torch (see https://pytorch.org/get-started/locally/)"
        )
    arch = target_arch()
    flags = extension_nvcc_flags(arch)
    ldflags = shared_libstdcxx_ldflags()  # after `import torch`, which loads libstdc++
    key = build_hash(arch, flags, torch.__version__, torch.version.cuda, kernels_dir=spec.hashed_dirs[0],
                     ldflags=ldflags, extra_dirs=spec.hashed_dirs[1:], name=spec.name)
    build_dir = cache_root() / "build" / f"{spec.build_prefix}{key}"
    library = build_dir / f"{spec.name}.so"
    if (build_dir / _MARKER).exists() and library.exists():
        try:
            torch.ops.load_library(str(library))
        except OSError as e:
            raise FaprofError(
                f"could not load the cached {spec.what.removeprefix('the ')} {library}: {e}; delete {build_dir} and try again"
            ) from e
        return BuildInfo(build_dir, arch, time.perf_counter() - t0, False, library, tuple(flags))
    nvcc = _prepare_toolchain()
    before = library.stat().st_mtime_ns if library.exists() else None
    _compile(spec, build_dir, arch, flags, ldflags, nvcc, verbose, on_status)
    after = library.stat().st_mtime_ns if library.exists() else None
    seconds = time.perf_counter() - t0
    _write_marker(build_dir / _MARKER, arch, flags, ldflags, nvcc, seconds)
    return BuildInfo(build_dir, arch, seconds, before is None or before != after, library, tuple(flags))


def _prepare_toolchain() -> str:
    """nvcc's path, with CUDA_HOME and MAX_JOBS set for torch.utils.cpp_extension."""
    home = find_cuda_home()
    nvcc = find_nvcc()  # raises with install advice
    if home is not None and not os.environ.get("CUDA_HOME"):
        # torch.utils.cpp_extension reads CUDA_HOME when first imported; a wrapper nvcc on PATH
        # would otherwise make it guess the wrong toolkit root.
        os.environ["CUDA_HOME"] = str(home)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None and home is not None:
        cpp_extension.CUDA_HOME = str(home)
    return nvcc


def _compile(spec: ExtensionSpec, build_dir: Path, arch: str, flags: list[str], ldflags: list[str], nvcc: str,
             verbose: bool, on_status: Callable[[str], None] | None) -> None:
    """Compile and load `spec` with torch.utils.cpp_extension (ninja compiles the .cu files in parallel)."""
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    if on_status is not None:
        on_status(
            f"building {spec.what} for {arch} with {nvcc} "
            f"({len(spec.sources)} sources, {os.environ['MAX_JOBS']} jobs) in {build_dir}"
        )
    try:
        cpp_extension.load(
            name=spec.name,
            sources=[str(s) for s in spec.sources],
            extra_cflags=list(HOST_CFLAGS),
            extra_cuda_cflags=flags,
            extra_ldflags=ldflags,
            extra_include_paths=[str(d) for d in spec.include_dirs],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=verbose,
        )
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        again = ("`faprof build --load --verbose` shows the whole build" if spec.name == EXTENSION_NAME else
                 "`faprof build --arch sm_XX` compiles faprof's own kernels alone, to tell them apart")
        raise FaprofError(f"building {spec.what} in {build_dir} failed: {e}\n({again})") from e


def _write_marker(marker: Path, arch: str, flags: list[str], ldflags: list[str], nvcc: str, seconds: float) -> None:
    """What the build was made with; a build directory without it is not reused."""
    import torch

    marker.write_text(
        json.dumps(
            {
                "arch": arch,
                "nvcc_flags": flags,
                "ldflags": ldflags,
                "torch": torch.__version__,
                "torch_cuda": torch.version.cuda,
                "nvcc": nvcc,
                "seconds": round(seconds, 2),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
    )
