"""TEST ONLY: SASS instruction census of the planted kernels, to show that each planted defect is in
the code the GPU runs (not optimised away) and what it adds per loop iteration.

Compiles a planted .cu file with the resource report's nvcc command (faprof.variants.ptxas: the
extension's flags, so the code is the code the planted extension runs), disassembles it with
`cuobjdump -sass`, and counts opcodes inside a kernel's loops. Loops are found from backward
branches (`BRA` to a lower address): a loop is the address range [target, branch]. Used by
tests/test_planted_sass.py and to write the census tables in planted_variants.py's docstring:

    python3 tests/planted/sass_census.py            # the tables, for sm_90
"""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from faprof.errors import FaprofError
from faprof.variants.build import find_cuda_home, find_nvcc, require_kernel_arch
from faprof.variants.ptxas import nvcc_resource_command

KERNELS = Path(__file__).resolve().parent / "kernels"
#: fa2_mma's warps per block (both planted configs): planted_mma's kBarrier runs each compute phase
#: in this many turns, one warp each, so its turn loops run this many times per key tile.
MMA_WARPS = 4

#: Instruction prefixes that run on the integer ALU pipe (and its 64-bit pairs), for the index-math
#: census. IMAD variants issue to the FMA pipe on sm_80..sm_90 and are counted apart.
ALU_OPS = (
    "IADD3",
    "LEA",
    "LOP3",
    "SHF",
    "ISETP",
    "SEL",
    "IABS",
    "IMNMX",
    "MOV",
    "PRMT",
    "FLO",
    "POPC",
    "BMSK",
)


@dataclass(frozen=True)
class Instr:
    """One SASS instruction."""

    addr: int
    """Byte offset in the function."""
    pred: str
    """Guard predicate ('@P0', '@!P1') or ''."""
    op: str
    """Opcode with its modifiers, e.g. 'HMMA.16816.F32'."""
    text: str
    """The whole instruction without the guard."""


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, under the CUDA toolkit, or from the nvidia-cuda-cuobjdump wheel (which
    scripts/setup.sh installs with nvidia-cuda-nvdisasm), else None. It needs nvdisasm beside it or
    on PATH."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    home = find_cuda_home()
    if home is not None and (home / "bin" / "cuobjdump").is_file():
        return str(home / "bin" / "cuobjdump")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for exe in sorted(Path(root).glob("cu*/bin/cuobjdump"), reverse=True):
            if (exe.parent / "nvdisasm").is_file() and os.access(exe, os.X_OK):
                return str(exe)
    return None


_FUNC = re.compile(r"Function : (\S+)")
_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?P<body>[^;]*);")


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """`cuobjdump -sass` output -> {mangled kernel name: its instructions in address order}."""
    funcs: dict[str, list[Instr]] = {}
    cur: list[Instr] | None = None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _INSTR.match(line)
        if m and cur is not None:
            body = m.group("body").strip()
            pred = ""
            if body.startswith("@"):
                pred, body = body.split(None, 1)
            cur.append(Instr(int(m.group(1), 16), pred, body.split()[0], body))
    return funcs


def compile_sass(source: Path, arch: str = "sm_90") -> dict[str, list[Instr]]:
    """Compile one planted .cu file for `arch` and return its kernels' SASS.

    Raises:
        FaprofError: nvcc or cuobjdump missing or failing.
    """
    return parse_sass(sass_text(source, arch))


def sass_command(nvcc: str, source: Path, arch: str, cubin: Path) -> list[str]:
    """The nvcc command whose cubin is disassembled: the resource report's (the planted extension's flags)."""
    return nvcc_resource_command(nvcc, source, require_kernel_arch(arch), cubin)


def sass_text(source: Path, arch: str = "sm_90") -> str:
    """`cuobjdump -sass` of one planted .cu file compiled for `arch` (the text parse_sass reads).

    Raises:
        FaprofError: nvcc or cuobjdump missing or failing.
    """
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        raise FaprofError(
            "cuobjdump not found: install the CUDA toolkit's cuobjdump and nvdisasm (or put them on PATH)"
        )
    nvcc = find_nvcc()
    with tempfile.TemporaryDirectory(prefix="faprof_sass_") as tmp:
        cubin = Path(tmp) / "k.cubin"
        res = subprocess.run(sass_command(nvcc, source, arch, cubin), capture_output=True, text=True, timeout=1200)
        if res.returncode != 0:
            raise FaprofError(f"nvcc failed on {source.name} for {arch}:\n{res.stderr.strip()}")
        res = subprocess.run(
            [cuobjdump, "-sass", str(cubin)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PATH": f"{Path(cuobjdump).parent}:{os.environ.get('PATH', '')}"},
        )
        if res.returncode != 0:
            raise FaprofError(f"cuobjdump -sass failed on {source.name}:\n{res.stderr.strip()}")
    return res.stdout


def loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) address of every loop (a backward branch to `first`), smallest first."""
    out = []
    for ins in instrs:
        if ins.op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)\s*$", ins.text)
            if m and int(m.group(1), 16) < ins.addr:
                out.append((int(m.group(1), 16), ins.addr))
    return sorted(set(out), key=lambda r: r[1] - r[0])


def counts(
    instrs: list[Instr], span: tuple[int, int] | None = None, predicated: bool | None = None
) -> collections.Counter:
    """Opcodes (with modifiers) inside `span` (all when None); only guarded or only unguarded ones
    when `predicated` is True or False."""
    c: collections.Counter = collections.Counter()
    for ins in instrs:
        if span is not None and not (span[0] <= ins.addr <= span[1]):
            continue
        if predicated is not None and bool(ins.pred) != predicated:
            continue
        c[ins.op] += 1
    return c


def total(c: collections.Counter, *prefixes: str) -> int:
    """Instructions of `c` whose opcode starts with one of `prefixes`."""
    return sum(n for op, n in c.items() if op.startswith(prefixes))


def tile_loop(instrs: list[Instr]) -> tuple[int, int]:
    """The key-tile loop: the smallest loop that issues the next tile's cp.async copies (LDGSTS)."""
    copies = [i.addr for i in instrs if i.op.startswith("LDGSTS")]
    for lo, hi in loops(instrs):
        if any(lo <= a <= hi for a in copies):
            return lo, hi
    raise ValueError("no loop issues LDGSTS")


def chunk_loop(instrs: list[Instr]) -> tuple[int, int]:
    """planted_rowthread's 16-key chunk loop: the largest loop inside the key-tile loop."""
    lo, hi = tile_loop(instrs)
    inner = [(a, b) for a, b in loops(instrs) if lo <= a and b <= hi and (a, b) != (lo, hi)]
    return max(inner, key=lambda r: r[1] - r[0])


def nested(instrs: list[Instr], span: tuple[int, int]) -> list[tuple[int, int]]:
    """Loops strictly inside `span`."""
    return [(a, b) for a, b in loops(instrs) if span[0] <= a and b <= span[1] and (a, b) != span]


def kernel(funcs: dict[str, list[Instr]], *parts: str) -> list[Instr]:
    """The one kernel whose mangled name contains every string of `parts`."""
    hits = [k for k in funcs if all(p in k for p in parts)]
    if len(hits) != 1:
        raise KeyError(f"{len(hits)} kernels match {parts}: {hits[:4]}")
    return funcs[hits[0]]


def mma_kernel(funcs: dict[str, list[Instr]], D: int, causal: bool, fault: int) -> list[Instr]:
    """planted_mma_fwd_kernel<__half, MmaConfig<D, ...>, causal, fault>."""
    return kernel(funcs, "planted_mma_fwd_kernel", f"MmaConfigILi{D}E", f"ELb{int(causal)}ELi{fault}EEE")


def rt_kernel(funcs: dict[str, list[Instr]], D: int, causal: bool, fault: int) -> list[Instr]:
    """planted_rt_fwd_kernel<RtConfig<D>, causal, fault>."""
    return kernel(funcs, "planted_rt_fwd_kernel", f"RtConfigILi{D}EEELb{int(causal)}ELi{fault}E")


def mma_tile_counts(instrs: list[Instr]) -> collections.Counter:
    """One warp's instructions per key tile of planted_mma: the tile loop's, plus the block barriers
    of kBarrier's turn loops (loops inside the tile loop) in the turns that are not the warp's own
    (the warp runs the phase in its own turn only, and skips it in the others)."""
    span = tile_loop(instrs)
    c = counts(instrs, span)
    for sub in nested(instrs, span):
        c["BAR.SYNC"] += (MMA_WARPS - 1) * total(counts(instrs, sub), "BAR.SYNC")
    return c


def _row(name: str, c: collections.Counter, keys: tuple[str, ...]) -> str:
    return f"{name:18}" + "".join(f"{total(c, k):>9}" for k in keys) + f"{sum(c.values()):>9}"


def main() -> None:
    """Print the census tables (sm_90, non-causal) that planted_variants.py's docstring quotes."""
    mma = compile_sass(KERNELS / "planted_mma.cu")
    keys = ("HMMA.16816", "HMMA.1688", "BAR.SYNC", "MEMBAR", "MUFU.EX2", "MUFU.RCP", "FCHK", "FFMA", "DFMA", "DADD",
            "F2F", "HADD2.F32")
    for D in (64, 128):
        print(
            f"planted_mma.cu, D={D}: SASS instructions of one warp in one key-tile iteration (static = dynamic, "
            f"but for kBarrier's {MMA_WARPS} turns: their barriers counted {MMA_WARPS} times)"
        )
        print(f"{'':18}" + "".join(f"{k:>9}" for k in keys) + f"{'all':>9}")
        for name, fault in (("clean", 0), ("barrier", 6), ("fence", 7), ("transcendental", 8), ("fp64", 9),
                            ("tf32_mma", 13)):
            print(_row(name, mma_tile_counts(mma_kernel(mma, D, False, fault)), keys))
    rt = compile_sass(KERNELS / "planted_rowthread.cu")
    keys = ("FFMA", "MUFU.EX2", "SHFL", "LDS", "LDS.128", "STS", *ALU_OPS[:4], "IMAD", "BRA")
    for D in (64, 128):
        print(
            f"planted_rowthread.cu, D={D}: per 16-key chunk (nested loops x their trip count 16), [predicated]"
        )
        print(f"{'':18}" + "".join(f"{k:>9}" for k in keys) + f"{'all':>9}")
        for name, fault in (
            ("clean", 0),
            ("dependency", 1),
            ("index_math", 2),
            ("divergence", 3),
            ("predicated_off", 4),
            ("scalar_loads", 5),
        ):
            ins = rt_kernel(rt, D, False, fault)
            span = chunk_loop(ins)
            c = counts(ins, span)
            for sub in nested(ins, span):
                for op, n in counts(ins, sub).items():
                    c[op] += 15 * n  # the rolled kc loop runs KC = 16 times; counted once above
            pred = total(counts(ins, span, predicated=True), "FFMA")
            print(_row(name, c, keys) + (f"   [{pred} FFMA predicated]" if pred else ""))


if __name__ == "__main__":
    main()
