"""ptxas' resource report of every kernel, without a GPU: `resource_report()` compiles each kernel
file with nvcc for a list of architectures and turns ptxas' `-v` output into a table (registers,
shared memory, spills, barriers per kernel instantiation) with the launch configuration and the
theoretical occupancy they imply; also the launch and setmaxnreg annotations it reads from the .cu
files, and kernel-name demangling. The toolchain (nvcc, flags, architectures, cache) is
faprof.build's, so the report describes the code the extension runs.

Launch configurations for the occupancy columns come from annotations beside each kernel in its
.cu file, one line per kernel, in which `D` is the head-dimension template argument::

    // faprof:launch kernel=fa2_fwd_kernel threads=128 dyn_smem=4*(32*D+64*(D+4)+64*D+4*8*64)

An annotation sits next to the tile struct it describes, so the two are edited together; a
Python table would drift from the code more easily.
"""

from __future__ import annotations

import ast
import concurrent.futures
import hashlib
import json
import math
import operator
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from faprof.errors import FaprofError
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
    normalize_arch,
    require_kernel_arch,
)

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


# ------------------------------------------------------------------------------ occupancy
@dataclass(frozen=True)
class ArchLimits:
    """Per-SM limits of one architecture that bound occupancy (CUDA programming guide, table
    'Technical Specifications per Compute Capability', and cuda_occupancy.h)."""

    max_warps: int
    """Resident warps per SM."""
    max_blocks: int
    """Resident blocks per SM."""
    smem_per_sm: int
    """Largest shared-memory carveout per SM, bytes (includes the per-block reserve)."""
    smem_per_block: int
    """Largest opt-in dynamic + static shared memory per block, bytes."""
    regs_per_sm: int = 65536
    """32-bit registers per SM."""
    regs_per_block: int = 65536
    """Registers one block may hold."""
    reg_alloc_unit: int = 256
    """Registers are allocated per warp in units of this many."""
    smem_alloc_unit: int = 128
    """Shared memory is allocated per block in units of this many bytes."""
    smem_reserved_per_block: int = 1024
    """Shared memory the driver reserves per block (sm_80 and later)."""
    sub_partitions: int = 4
    """Register files per SM: a warp's registers come from one of them."""
    max_threads_per_block: int = 1024
    """Threads per block."""


#: Per-architecture limits. sm_90a and friends share their base architecture's entry.
ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm_80": ArchLimits(max_warps=64, max_blocks=32, smem_per_sm=164 * 1024, smem_per_block=163 * 1024),
    "sm_86": ArchLimits(max_warps=48, max_blocks=16, smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
    "sm_87": ArchLimits(max_warps=48, max_blocks=16, smem_per_sm=164 * 1024, smem_per_block=163 * 1024),
    "sm_89": ArchLimits(max_warps=48, max_blocks=24, smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
    "sm_90": ArchLimits(max_warps=64, max_blocks=32, smem_per_sm=228 * 1024, smem_per_block=227 * 1024),
    "sm_100": ArchLimits(max_warps=64, max_blocks=32, smem_per_sm=228 * 1024, smem_per_block=227 * 1024),
    "sm_120": ArchLimits(max_warps=48, max_blocks=24, smem_per_sm=100 * 1024, smem_per_block=99 * 1024),
}

#: Order in which limiters are named when several allow the same number of blocks: the hardware
#: caps first (a kernel at 64 of 64 warps is limited by warps, whatever else would also allow it),
#: then the resources a kernel can change.
LIMITER_ORDER = ("warps", "blocks", "registers", "shared memory")


@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one kernel launch on one SM."""

    blocks_per_sm: int
    """Resident blocks per SM."""
    active_warps: int
    """Resident warps per SM (blocks x warps per block)."""
    occupancy_pct: float
    """active_warps / max warps per SM, in percent."""
    limiter: str
    """What bounds blocks_per_sm: 'registers', 'shared memory', 'warps', 'blocks' (or 'threads'
    when the block is larger than 1024 threads)."""


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def arch_limits(arch: str) -> ArchLimits:
    """Limits of `arch` ('sm_90a' uses sm_90's); FaprofError for an architecture not in the table."""
    base = re.sub(r"[af]$", "", normalize_arch(arch))
    if base not in ARCH_LIMITS:
        raise FaprofError(f"no occupancy limits known for {arch}; known: {', '.join(ARCH_LIMITS)}")
    return ARCH_LIMITS[base]


def occupancy(arch: str, threads: int, registers: int, smem_bytes: int) -> Occupancy:
    """Theoretical occupancy, computed as CUDA's cuda_occupancy.h does.

    Registers: each warp gets ceil(registers·32 / 256)·256 registers from one of the SM's four
    register files (16384 registers each); blocks = (warps that fit per file · 4) // warps per
    block. Shared memory: each block takes round_up(static + dynamic + 1 KB reserved, 128 B) of
    the SM's largest carveout. Warps and blocks: the per-SM maxima.

    Args:
        arch: 'sm_80', 'sm_89', 'sm_90a', ...
        threads: threads per block.
        registers: registers per thread (from ptxas).
        smem_bytes: static + dynamic shared memory per block, bytes.

    Returns:
        Occupancy with blocks per SM, active warps, percentage and the limiting resource.
    """
    lim = arch_limits(arch)
    if threads < 1 or threads > lim.max_threads_per_block:
        return Occupancy(0, 0, 0.0, "threads")
    warps = -(-threads // 32)
    by_warps = lim.max_warps // warps
    by_blocks = lim.max_blocks

    regs_per_warp = _round_up(registers * 32, lim.reg_alloc_unit)
    if regs_per_warp == 0:
        by_regs = by_blocks
    elif (
        regs_per_warp * _round_up(warps, lim.sub_partitions) > lim.regs_per_block
        or regs_per_warp * warps > lim.regs_per_block
        or registers > 255
    ):
        by_regs = 0
    else:
        warps_per_partition = (lim.regs_per_sm // lim.sub_partitions) // regs_per_warp
        by_regs = warps_per_partition * lim.sub_partitions // warps

    if smem_bytes > lim.smem_per_block:
        by_smem = 0
    else:
        per_block = _round_up(smem_bytes + lim.smem_reserved_per_block, lim.smem_alloc_unit)
        by_smem = lim.smem_per_sm // per_block

    limits = {"registers": by_regs, "shared memory": by_smem, "warps": by_warps, "blocks": by_blocks}
    blocks = min(limits.values())
    limiter = next(name for name in LIMITER_ORDER if limits[name] == blocks)
    return Occupancy(blocks, blocks * warps, 100.0 * blocks * warps / lim.max_warps, limiter)


# --------------------------------------------------------------------- launch annotations
_RE_LAUNCH = re.compile(r"//\s*faprof:launch\s+(?P<fields>.+?)\s*$", re.M)

_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
}


def parse_launch_annotations(text: str) -> dict[str, dict[str, str]]:
    """`// faprof:launch kernel=NAME [D=EXPR] threads=EXPR dyn_smem=EXPR` lines -> {NAME: {field: EXPR}}.

    NAME is the kernel's name without namespaces or template arguments. Expressions may use D
    and A0, A1, ... (see eval_launch_expr); `D=` sets the report's D column for kernels whose
    head dimension is not their only integer template argument (e.g. D=A0).
    """
    out: dict[str, dict[str, str]] = {}
    for m in _RE_LAUNCH.finditer(text):
        fields = dict(tok.split("=", 1) for tok in m.group("fields").split() if "=" in tok)
        if "kernel" in fields:
            out[fields.pop("kernel")] = fields
    return out


_RE_SETMAXNREG = re.compile(r"//\s*faprof:setmaxnreg\s+(?P<fields>.+?)\s*$", re.M)


def parse_setmaxnreg_annotations(text: str) -> dict[str, dict[str, int]]:
    """`// faprof:setmaxnreg kernel=NAME ROLE=REGS ...` lines -> {NAME: {ROLE: REGS}}: the register
    budgets a warp-specialized kernel's warpgroups set with `setmaxnreg` (static values that ptxas'
    report, which gives the count at launch, does not show)."""
    out: dict[str, dict[str, int]] = {}
    for m in _RE_SETMAXNREG.finditer(text):
        fields = dict(tok.split("=", 1) for tok in m.group("fields").split() if "=" in tok)
        name = fields.pop("kernel", None)
        if name and fields and all(v.isdigit() for v in fields.values()):
            out[name] = {role: int(v) for role, v in fields.items()}
    return out


def eval_launch_expr(expr: str, D: int | None, args: Sequence[int] = ()) -> int:
    """Evaluate an annotation's integer expression: +, -, *, //, parentheses, integers, the
    name D (the head dimension) and A0, A1, ... (the kernel's integer template arguments)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id == "D":
            if D is None:
                raise ValueError(
                    f"{expr!r} uses D but the kernel's D is unknown (add D=... to the annotation)"
                )
            return D
        if isinstance(node, ast.Name) and re.fullmatch(r"A\d+", node.id):
            i = int(node.id[1:])
            if i >= len(args):
                raise ValueError(
                    f"{expr!r} uses {node.id} but the kernel has {len(args)} integer template arguments"
                )
            return args[i]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported element in launch expression {expr!r}")

    return ev(ast.parse(expr, mode="eval"))


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
def nvcc_resource_command(nvcc: str, source: Path, arch: str, output: Path) -> list[str]:
    """The nvcc command line that compiles one kernel file for one arch and prints ptxas' usage."""
    return [
        nvcc,
        "-cubin",
        *NVCC_OPT_FLAGS,
        *TORCH_NVCC_FLAGS,
        "-Xptxas",
        "-v",
        gencode_flag(arch),
        "-I",
        str(source.parent),
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


def ptxas_cache_key(nvcc_id: str, source: Path, arch: str) -> str:
    """Hash of the compiler, the command's flags, the arch, the file and every header beside it
    (the kernels include faprof_kernels.h), so a change to any of them compiles again."""
    headers = sorted(p for p in source.parent.iterdir() if p.suffix in (".h", ".cuh", ".hpp") and p.is_file())
    cmd = nvcc_resource_command("nvcc", Path(source.name), arch, Path("out.cubin"))
    payload = {
        "format": PTXAS_CACHE_FORMAT,
        "nvcc": nvcc_id,
        "command": cmd[1:],
        "source": hashlib.sha256(source.read_bytes()).hexdigest(),
        "headers": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in headers},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def _cached_ptxas_log(nvcc: str, nvcc_id: str, source: Path, arch: str) -> tuple[str, bool]:
    """ptxas' output for (source, arch), from the cache under cache_root()/ptxas when the sources,
    flags and compiler are unchanged; else compiled and stored. Returns (log, compiled)."""
    path = cache_root() / "ptxas" / f"{ptxas_cache_key(nvcc_id, source, arch)}.log"
    try:
        return path.read_text(), False
    except (OSError, UnicodeDecodeError):
        pass
    log = _ptxas_log(nvcc, source, arch)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(log)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs the next run a compile
    return log, True


def _ptxas_log(nvcc: str, source: Path, arch: str) -> str:
    with tempfile.TemporaryDirectory(prefix="faprof_ptxas_") as tmp:
        cmd = nvcc_resource_command(nvcc, source, arch, Path(tmp) / "out.cubin")
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


def resource_report(
    archs: Sequence[str] = DEFAULT_REPORT_ARCHS,
    sources: Sequence[str | Path] | None = None,
    jobs: int | None = None,
    use_cache: bool = True,
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
    norm_archs = [require_kernel_arch(a) for a in archs]
    tasks = [(f, a) for f in files for a in norm_archs]
    nvcc_id = _nvcc_identity(nvcc) if use_cache else ""

    def one(t: tuple[Path, str]) -> tuple[str, bool]:
        return _cached_ptxas_log(nvcc, nvcc_id, *t) if use_cache else (_ptxas_log(nvcc, *t), True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        results = list(pool.map(one, tasks))
    logs = [log for log, _ in results]
    compiled = sum(1 for _, c in results if c)

    parsed = [(f, a, rec) for (f, a), log in zip(tasks, logs, strict=True) for rec in ptxas_parse(log)]
    names = demangle(rec["kernel"] for _, _, rec in parsed)
    annotations = {f: parse_launch_annotations(f.read_text()) for f in files}
    role_regs = {f: parse_setmaxnreg_annotations(f.read_text()) for f in files}

    rows = []
    for f, arch, rec in parsed:
        pretty = names.get(rec["kernel"], rec["kernel"])
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
        roles = role_regs[f].get(kn.base)
        if roles and arch == "sm_90a":  # setmaxnreg exists in sm_90a code only
            row["role_registers"] = ", ".join(f"{role} {n}" for role, n in roles.items())
        ann = annotations[f].get(kn.base)
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
        rows.append(row)

    df = pd.DataFrame(rows, columns=list(REPORT_COLUMNS))
    for col in (
        "D",
        "registers",
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
    ):
        df[col] = df[col].astype("Int64")
    df = df.sort_values(
        ["file", "name", "D", "template_args", "arch"], na_position="first", kind="stable"
    ).reset_index(drop=True)
    df.attrs["compiled"] = compiled
    df.attrs["pairs"] = len(tasks)
    return df
