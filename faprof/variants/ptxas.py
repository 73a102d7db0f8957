"""ptxas' resource report of every kernel, without a GPU: `resource_report()` compiles each kernel
file with nvcc for a list of architectures and turns ptxas' `-v` output into a table (registers,
shared memory, spills, barriers per kernel instantiation) with the launch configuration and the
theoretical occupancy they imply. The toolchain (nvcc, flags, architectures, cache) is
faprof.variants.build's, so the report describes the code the extension runs.

Parts: this module parses ptxas' output and the kernels' names and runs the compiles (cached by
source hash); `faprof.variants.annotations` reads the launch/setmaxnreg annotations of the .cu
files; `faprof.variants.occupancy` turns registers, shared memory and threads into occupancy.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from faprof.errors import FaprofError
from faprof.variants.annotations import (
    eval_launch_expr,
    parse_launch_annotations,
    parse_setmaxnreg_annotations,
)
from faprof.variants.build import (
    DEFAULT_REPORT_ARCHS,
    KERNELS_DIR,
    NVCC_OPT_FLAGS,
    PTXAS_CACHE_FORMAT,
    TORCH_NVCC_FLAGS,
    cache_root,
    find_cuda_home,
    find_nvcc,
    gencode_flag,
    require_kernel_arch,
)
from faprof.variants.occupancy import occupancy

__all__ = [
    "REPORT_COLUMNS", "KernelName", "demangle", "eval_launch_expr", "nvcc_resource_command", "occupancy",
    "parse_kernel_name", "parse_launch_annotations", "parse_setmaxnreg_annotations", "ptxas_cache_key",
    "ptxas_parse", "resource_report",
]

# ------------------------------------------------------------------------ ptxas parsing
_RE_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_RE_PROPS = re.compile(r"Function properties for (?P<name>\S+)")
_RE_STACK = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<ss>\d+) bytes spill stores, (?P<sl>\d+) bytes spill loads"
)
_RE_USED = re.compile(r"Used (?P<regs>\d+) registers(?P<rest>.*)$")
_RE_BARRIERS = re.compile(r"used (\d+) barriers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")
_RE_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


def ptxas_parse(text: str) -> list[dict[str, Any]]:
    """Parse `ptxas -v` output (as printed by `nvcc -Xptxas -v`) into one dict per kernel.

    Only entry functions (kernels) are returned, in the order ptxas compiled them. Keys:
    kernel (mangled name), arch, registers, smem_static_bytes, stack_frame_bytes,
    spill_store_bytes, spill_load_bytes, cmem_bytes (sum over constant banks; None when ptxas
    does not print it, as CUDA 13 does not for sm_90), barriers.

    Args:
        text: ptxas' informational output; other lines (nvcc warnings) are ignored.

    Returns:
        A list of dicts as above.
    """
    kernels: dict[str, dict[str, Any]] = {}
    stack: dict[str, tuple[int, int, int]] = {}
    entry: str | None = None
    props: str | None = None
    for line in text.splitlines():
        if m := _RE_ENTRY.search(line):
            entry = m.group("name")
            kernels[entry] = {
                "kernel": entry,
                "arch": m.group("arch"),
                "registers": None,
                "smem_static_bytes": 0,
                "stack_frame_bytes": None,
                "spill_store_bytes": None,
                "spill_load_bytes": None,
                "cmem_bytes": None,
                "barriers": 0,
            }
            continue
        if m := _RE_PROPS.search(line):
            props = m.group("name")
            continue
        if (m := _RE_STACK.search(line)) and props is not None:
            stack[props] = (int(m.group("stack")), int(m.group("ss")), int(m.group("sl")))
            continue
        if (m := _RE_USED.search(line)) and entry is not None:
            rec = kernels[entry]
            rec["registers"] = int(m.group("regs"))
            rest = m.group("rest")
            if b := _RE_BARRIERS.search(rest):
                rec["barriers"] = int(b.group(1))
            if s := _RE_SMEM.search(rest):
                rec["smem_static_bytes"] = int(s.group(1))
            cmem = [int(c) for c in _RE_CMEM.findall(rest)]
            rec["cmem_bytes"] = sum(cmem) if cmem else None
    for name, rec in kernels.items():
        if name in stack:
            rec["stack_frame_bytes"], rec["spill_store_bytes"], rec["spill_load_bytes"] = stack[name]
    return list(kernels.values())


# ------------------------------------------------------------------------------ demangling
def _demangler() -> str | None:
    home = find_cuda_home()
    for cand in ([str(home / "bin" / "cu++filt")] if home else []) + ["cu++filt", "c++filt"]:
        path = shutil.which(cand) if os.sep not in cand else (cand if os.path.exists(cand) else None)
        if path:
            return path
    return None


def demangle(names: Iterable[str]) -> dict[str, str]:
    """Mangled -> demangled C++ names with cu++filt (CUDA's), else c++filt; identity without either."""
    names = list(dict.fromkeys(names))
    tool = _demangler()
    if not names or tool is None:
        return {n: n for n in names}
    try:
        res = subprocess.run(
            [tool], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=60, check=True
        )
        lines = res.stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {n: n for n in names}
    if len(lines) != len(names):
        return {n: n for n in names}
    return dict(zip(names, lines, strict=True))


_RE_MANGLED = re.compile(r"^_Z(?P<len>\d+)")
_RE_TEMPLATE_INT = re.compile(r"\b(true|false|\d+)\b")


@dataclass(frozen=True)
class KernelName:
    """The parts of a kernel's (demangled) name that the report uses."""

    name: str
    """Qualified name without template arguments: 'fa2_fwd_kernel', 'ns::k'."""
    template_args: str
    """The template argument list as written, without the outer <>: '64', '__half, Cfg<64, 4>, true'."""
    int_args: tuple[int, ...]
    """Integer (and bool, as 0/1) template arguments in order, nested ones included."""

    @property
    def base(self) -> str:
        """The name without namespaces."""
        return self.name.rsplit("::", 1)[-1]

    @property
    def D(self) -> int | None:
        """The head dimension when the kernel has exactly one integer template argument."""
        return self.int_args[0] if len(self.int_args) == 1 else None


def parse_kernel_name(kernel: str) -> KernelName:
    """Split 'void ns::k<__half, Cfg<64, 4>, true>(float const*, ...)' (or, without a demangler,
    a simple mangled name '_Z14fa2_fwd_kernelILi64EEv...') into name and template arguments."""
    s = kernel.strip()
    if s.startswith("_Z"):
        m = _RE_MANGLED.match(s)
        if m:
            n = int(m.group("len"))
            name = s[m.end() : m.end() + n]
            t = re.match(r"IL[ij](\d+)EE", s[m.end() + n :])
            return KernelName(name, t.group(1) if t else "", (int(t.group(1)),) if t else ())
        return KernelName(s, "", ())
    if s.startswith("void "):
        s = s[5:]
    # The name runs to the first '<' or '(' at depth 0; template arguments are the balanced <...>.
    i = 0
    while i < len(s) and s[i] not in "<(":
        i += 1
    name = s[:i].strip()
    targs = ""
    if i < len(s) and s[i] == "<":
        depth, j = 0, i
        while j < len(s):
            depth += {"<": 1, ">": -1}.get(s[j], 0)
            if depth == 0:
                break
            j += 1
        targs = s[i + 1 : j].strip()
    ints = tuple(1 if t == "true" else 0 if t == "false" else int(t) for t in _RE_TEMPLATE_INT.findall(targs))
    return KernelName(name, targs, ints)


# ------------------------------------------------------------------------ resource report
def nvcc_resource_command(nvcc: str, source: Path, arch: str, output: Path,
                          include_dirs: Sequence[Path] = ()) -> list[str]:
    """The nvcc command line that compiles one kernel file for one arch and prints ptxas' usage.

    Args:
        nvcc: the compiler.
        source: the .cu file; its own folder is the first include path.
        arch: the architecture ('sm_90' compiles as sm_90a).
        output: where the cubin goes.
        include_dirs: further include paths, after the file's folder (test-only kernels include
            faprof's headers from kernels/).

    Returns:
        The argv list.
    """
    includes = [flag for d in (source.parent, *include_dirs) for flag in ("-I", str(d))]
    return [
        nvcc,
        "-cubin",
        *NVCC_OPT_FLAGS,
        *TORCH_NVCC_FLAGS,
        "-Xptxas",
        "-v",
        gencode_flag(arch),
        *includes,
        "-o",
        str(output),
        str(source),
    ]


def _nvcc_identity(nvcc: str) -> str:
    """What identifies the compiler for the ptxas cache: its resolved path and `nvcc --version`."""
    try:
        res = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
        version = res.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    return f"{Path(nvcc).resolve()}\n{version}"


def _headers(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".h", ".cuh", ".hpp") and p.is_file())


def ptxas_cache_key(nvcc_id: str, source: Path, arch: str, include_dirs: Sequence[Path] = ()) -> str:
    """Hash of the compiler, the command's flags, the arch, the file and every header beside it
    and in `include_dirs` (the kernels include faprof_kernels.h), so a change to any of them
    compiles again."""
    cmd = nvcc_resource_command("nvcc", Path(source.name), arch, Path("out.cubin"))
    payload: dict[str, Any] = {
        "format": PTXAS_CACHE_FORMAT,
        "nvcc": nvcc_id,
        "command": cmd[1:],
        "source": hashlib.sha256(source.read_bytes()).hexdigest(),
        "headers": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in _headers(source.parent)},
    }
    if include_dirs:  # only then, so that the keys of faprof's own files stay as they were
        payload["include_dirs"] = [{p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in _headers(d)}
                                   for d in include_dirs]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _cached_ptxas_log(nvcc: str, nvcc_id: str, source: Path, arch: str,
                      include_dirs: Sequence[Path] = ()) -> tuple[str, bool]:
    """ptxas' output for (source, arch), from the cache under cache_root()/ptxas when the sources,
    flags and compiler are unchanged; else compiled and stored. Returns (log, compiled)."""
    path = cache_root() / "ptxas" / f"{ptxas_cache_key(nvcc_id, source, arch, include_dirs)}.log"
    try:
        return path.read_text(), False
    except (OSError, UnicodeDecodeError):
        pass
    log = _ptxas_log(nvcc, source, arch, include_dirs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(log)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs the next run a compile
    return log, True


def _ptxas_log(nvcc: str, source: Path, arch: str, include_dirs: Sequence[Path] = ()) -> str:
    with tempfile.TemporaryDirectory(prefix="faprof_ptxas_") as tmp:
        cmd = nvcc_resource_command(nvcc, source, arch, Path(tmp) / "out.cubin", include_dirs)
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FaprofError(f"could not run nvcc on {source.name} for {arch}: {e}") from e
    if res.returncode != 0:
        raise FaprofError(
            f"nvcc failed on {source.name} for {arch} (exit {res.returncode}):\n{res.stderr.strip()}"
        )
    return res.stdout + res.stderr


#: Column order of resource_report's table.
REPORT_COLUMNS = (
    "file",
    "kernel",
    "name",
    "template_args",
    "D",
    "arch",
    "registers",
    "role_registers",
    "smem_static_bytes",
    "dyn_smem_bytes",
    "threads",
    "stack_frame_bytes",
    "spill_store_bytes",
    "spill_load_bytes",
    "cmem_bytes",
    "barriers",
    "blocks_per_sm",
    "active_warps",
    "occupancy_pct",
    "limiter",
    "mangled",
)

#: Integer columns of the report (nullable: a kernel without an annotation has no threads).
_INT_COLUMNS = ("D", "registers", "smem_static_bytes", "dyn_smem_bytes", "threads", "stack_frame_bytes",
                "spill_store_bytes", "spill_load_bytes", "cmem_bytes", "barriers", "blocks_per_sm", "active_warps")


def resource_report(
    archs: Sequence[str] = DEFAULT_REPORT_ARCHS,
    sources: Sequence[str | Path] | None = None,
    jobs: int | None = None,
    use_cache: bool = True,
    include_dirs: Sequence[str | Path] = (),
):
    """Compile kernel files with nvcc (no GPU needed) and tabulate ptxas' resource usage.

    One row per kernel instantiation and architecture, with its launch configuration (from the
    `faprof:launch` annotations), the theoretical occupancy that implies, and for warp-specialized
    kernels the registers each warpgroup role sets with setmaxnreg (`role_registers`, from the
    `faprof:setmaxnreg` annotations; `registers` is ptxas' count at launch).

    Args:
        archs: architectures, e.g. ('sm_80', 'sm_89', 'sm_90'); sm_90 compiles as sm_90a.
        sources: .cu files to compile; default every kernels/*.cu (binding.cpp has no kernels).
        jobs: parallel nvcc processes; default the number of CPU cores.
        use_cache: reuse ptxas' output cached by source hash (see _cached_ptxas_log); the table's
            attribute `compiled` (df.attrs) counts the (file, arch) pairs that were compiled.
        include_dirs: include paths after each file's own folder (files outside kernels/ that
            include faprof's headers pass kernels/ here).

    Returns:
        A pandas DataFrame with REPORT_COLUMNS.

    Raises:
        FaprofError: nvcc missing or failing (with its stderr), a malformed annotation.
    """
    import pandas as pd

    nvcc = find_nvcc()
    files = [Path(s) for s in sources] if sources is not None else sorted(KERNELS_DIR.glob("*.cu"))
    if not files:
        raise FaprofError(f"no .cu files to compile in {KERNELS_DIR}")
    tasks = [(f, a) for f in files for a in [require_kernel_arch(a) for a in archs]]
    logs, compiled = _compile_all(nvcc, tasks, jobs, use_cache, [Path(d) for d in include_dirs])
    parsed = [(f, a, rec) for (f, a), log in zip(tasks, logs, strict=True) for rec in ptxas_parse(log)]
    names = demangle(rec["kernel"] for _, _, rec in parsed)
    annotations = {f: parse_launch_annotations(f.read_text()) for f in files}
    role_regs = {f: parse_setmaxnreg_annotations(f.read_text()) for f in files}
    rows = [_report_row(f, arch, rec, names.get(rec["kernel"], rec["kernel"]), annotations[f], role_regs[f])
            for f, arch, rec in parsed]
    df = pd.DataFrame(rows, columns=list(REPORT_COLUMNS))
    for col in _INT_COLUMNS:
        df[col] = df[col].astype("Int64")
    df = df.sort_values(
        ["file", "name", "D", "template_args", "arch"], na_position="first", kind="stable"
    ).reset_index(drop=True)
    df.attrs["compiled"] = compiled
    df.attrs["pairs"] = len(tasks)
    return df


def _compile_all(nvcc: str, tasks: list[tuple[Path, str]], jobs: int | None, use_cache: bool,
                 include_dirs: list[Path]) -> tuple[list[str], int]:
    """ptxas' log of every (file, arch), in parallel nvcc processes; and how many were compiled (not cached)."""
    nvcc_id = _nvcc_identity(nvcc) if use_cache else ""

    def one(t: tuple[Path, str]) -> tuple[str, bool]:
        if use_cache:
            return _cached_ptxas_log(nvcc, nvcc_id, *t, include_dirs)
        return _ptxas_log(nvcc, *t, include_dirs), True

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        results = list(pool.map(one, tasks))
    return [log for log, _ in results], sum(1 for _, c in results if c)


def _report_row(f: Path, arch: str, rec: dict[str, Any], pretty: str, annotations: dict[str, dict[str, str]],
                role_regs: dict[str, dict[str, int]]) -> dict[str, Any]:
    """One kernel instantiation on one arch: ptxas' figures, its name's parts, launch and occupancy."""
    kn = parse_kernel_name(pretty)
    D = kn.D
    row: dict[str, Any] = {
        **rec,
        "file": f.name,
        "kernel": pretty,
        "name": kn.name,
        "template_args": kn.template_args,
        "D": D,
        "arch": arch,
        "mangled": rec["kernel"],
        "threads": None,
        "dyn_smem_bytes": None,
        "blocks_per_sm": None,
        "active_warps": None,
        "occupancy_pct": math.nan,
        "limiter": None,
        "role_registers": None,
    }
    roles = role_regs.get(kn.base)
    if roles and arch == "sm_90a":  # setmaxnreg exists in sm_90a code only
        row["role_registers"] = ", ".join(f"{role} {n}" for role, n in roles.items())
    ann = annotations.get(kn.base)
    if ann is not None:
        try:
            if "D" in ann:
                D = row["D"] = eval_launch_expr(ann["D"], None, kn.int_args)
            threads = eval_launch_expr(ann.get("threads", "0"), D, kn.int_args)
            dyn = eval_launch_expr(ann.get("dyn_smem", "0"), D, kn.int_args)
        except (ValueError, SyntaxError) as e:
            raise FaprofError(f"{f.name}: bad faprof:launch annotation for {kn.base}: {e}") from e
        occ = occupancy(arch, threads, rec["registers"] or 0, rec["smem_static_bytes"] + dyn)
        row.update(threads=threads, dyn_smem_bytes=dyn, **asdict(occ))
    return row
