"""Your own kernel as a variant: `faprof profile --kernel my_attn.cu[:launcher]` or `my_attn.py:fn`.

A kernel spec is a string, so that it reaches the worker process, the Nsight targets and a
resumed run the same way as `--user-variants` (they all call `variants.load_user_variants`):

    [NAME=]PATH.cu[:LAUNCHER]    a CUDA file with a plain-C launcher (faprof_attention.h)
    [NAME=]PATH.py:FUNCTION      a Python function fn(q, k, v, causal, scale, out=None)

NAME defaults to the file's stem, LAUNCHER to the stem too (it must then be a C identifier).

A .cu file is compiled with nvcc into a shared library (not a torch extension): faprof writes a
small wrapper that includes `faprof_attention.h`, then the user's file, then a static_assert that
LAUNCHER has the launcher type, and builds it with ``nvcc -shared -Xcompiler -fPIC`` plus the
flags of faprof's own kernels (``-O3 -lineinfo -std=c++17``) for the architecture they use. The
library is cached under ``<cache root>/user/<hash>`` (hash of the file and its sibling headers,
the header, the flags, nvcc and the architecture). The launcher is then called through ctypes
with raw device pointers. What the file supports comes from `FAPROF_KERNEL_INFO(...)`, read
through ctypes after the build: "dtypes=fp16,bf16;head_dims=64,128;compute=tensor".
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faprof import resources
from faprof.errors import FaprofError
from faprof.model import variant as variants
from faprof.model.problem import FEATURES
from faprof.variants import build

#: The header user kernels include; it installs with the package (faprof/data).
HEADER_DIR = resources.data_path()
HEADER = HEADER_DIR / "faprof_attention.h"

#: dtype codes of faprof_attention.h.
DTYPE_CODES = {"fp16": 0, "bf16": 1, "fp32": 2}

#: Bump to invalidate every cached user-kernel build.
USER_BUILD_FORMAT = 2

_NAME_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)=(.+)$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIGNATURE_MARK = "faprof_launcher_signature_mismatch"


@dataclass(frozen=True)
class KernelSpec:
    """A parsed kernel spec."""

    path: Path
    symbol: str | None
    """Launcher (.cu) or function (.py); None = the default."""
    name: str | None
    """Variant name given with NAME= (or --name); None = the file's stem."""

    @property
    def kind(self) -> str:
        return "cu" if self.path.suffix == ".cu" else "py"

    @property
    def variant_name(self) -> str:
        return self.name or self.path.stem

    def text(self) -> str:
        """The spec string again (the path as stored)."""
        s = str(self.path) + (f":{self.symbol}" if self.symbol else "")
        return f"{self.name}={s}" if self.name else s


def parse_spec(spec: str) -> KernelSpec | None:
    """A KernelSpec when `spec` names a .cu file or a .py file with a function; None otherwise
    (a plain .py file or a module name: the `--user-variants` kind)."""
    name = None
    m = _NAME_RE.match(spec)
    rest = spec
    if m and (m.group(2).endswith(".cu") or ".cu:" in m.group(2) or ".py:" in m.group(2)):
        name, rest = m.group(1), m.group(2)
    symbol = None
    head, sep, tail = rest.rpartition(":")
    if sep and _IDENT_RE.match(tail) and (head.endswith(".cu") or head.endswith(".py")):
        rest, symbol = head, tail
    path = Path(rest)
    if path.suffix == ".cu" or (path.suffix == ".py" and symbol):
        return KernelSpec(path, symbol, name)
    return None


def make_spec(kernel: str, name: str | None = None) -> str:
    """The spec string for `--kernel KERNEL [--name NAME]`, with the file as an absolute path.

    Raises FaprofError for a spec that is neither a .cu file nor FILE.py:FUNCTION, or a missing file.
    """
    ks = parse_spec(kernel)
    if ks is None:
        raise FaprofError(f"--kernel {kernel}: give a CUDA file (my_attn.cu[:launcher]) or a Python function "
                          "(my_attn.py:fn); a .py file that registers variants itself goes to --user-variants")
    if not ks.path.is_file():
        raise FaprofError(f"--kernel {kernel}: {ks.path} does not exist")
    if name is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_.\-]*$", name):
        raise FaprofError(f"--name {name!r}: use letters, digits, '_', '.' or '-' (starting with a letter or '_')")
    return KernelSpec(ks.path.resolve(), ks.symbol, name or ks.name).text()


def resolve_spec(spec: str) -> str:
    """`spec` with its file made absolute (kernel specs only; others unchanged)."""
    ks = parse_spec(spec)
    if ks is None:
        return spec
    return KernelSpec(ks.path.resolve(), ks.symbol, ks.name).text()


# ------------------------------------------------------------------------- kernel info
@dataclass(frozen=True)
class KernelInfo:
    dtypes: tuple[str, ...]
    head_dims: tuple[int, ...] | None
    compute: str = "tensor"
    features: frozenset[str] = frozenset()
    """Problem features it runs (faprof.model.problem.FEATURES); launched with FAPROF_PROBLEM_LAUNCHER."""
    problem_launcher: bool = False
    """The launcher is a FAPROF_PROBLEM_LAUNCHER (takes a faprof_attention_problem)."""


class ProblemStruct(ctypes.Structure):
    """faprof_attention.h's faprof_attention_problem (field for field, in order)."""

    _fields_ = [
        *((n, ctypes.c_int) for n in ("B", "H", "Hkv", "Sq", "Sk", "D", "dtype")),
        ("scale", ctypes.c_float), ("softcap", ctypes.c_float),
        *((n, ctypes.c_int) for n in ("causal", "bottom_right", "window_left", "window_right", "total_q", "total_k")),
        *((n, ctypes.c_void_p) for n in ("cu_seqlens_q", "cu_seqlens_k", "seqlens_k", "block_table")),
        *((n, ctypes.c_int) for n in ("max_blocks", "page_size", "num_blocks")),
    ]


def problem_struct(q, k, causal: bool, scale: float, dtype: str, attn: Any = None) -> ProblemStruct:
    """The faprof_attention_problem of a call: from `attn` (faprof.variants.definition.AttnArgs) when the
    problem has one, else from the dense tensors' shapes (2022's problem)."""
    def ptr(t) -> int | None:
        return t.data_ptr() if t is not None else None

    if attn is None:
        B, H, Sq, D = q.shape
        Hkv, Sk = k.shape[1], k.shape[2]
        return ProblemStruct(B, H, Hkv, Sq, Sk, D, DTYPE_CODES[dtype], float(scale), 0.0, int(bool(causal)), 0,
                             -1, -1, B * Sq, B * Sk, None, None, None, None, 0, 0, 0)
    p = attn.problem
    left, right = attn.window
    table = attn.block_table
    return ProblemStruct(
        p.B, p.H, p.kv_heads, p.Sq, p.Sk, p.D, DTYPE_CODES[dtype], float(scale), float(p.softcap), int(p.causal),
        int(attn.bottom_right), left, right, p.total_q, p.total_k, ptr(attn.cu_seqlens_q), ptr(attn.cu_seqlens_k),
        ptr(attn.seqlens_k), ptr(table), table.shape[1] if table is not None else 0, p.page_size,
        k.shape[0] if p.layout == "paged" else 0)


def parse_features(text: str, where: str) -> frozenset[str]:
    """'gqa,paged' -> frozenset; unknown names are an error naming the known ones."""
    feats = frozenset(x.strip() for x in text.split(",") if x.strip())
    bad = sorted(feats - set(FEATURES))
    if bad:
        raise FaprofError(f"{where}: features {bad} are not faprof problem features; use some of "
                          f"{', '.join(FEATURES)}")
    return feats


def parse_kernel_info(text: str, where: str) -> KernelInfo:
    """Parse FAPROF_KERNEL_INFO's text, e.g. 'dtypes=fp16,bf16;head_dims=64,128;compute=tensor'."""
    fields: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("dtypes", "head_dims", "compute", "features"):
            raise FaprofError(f"{where}: cannot read {part!r} in FAPROF_KERNEL_INFO({text!r}); "
                              "write e.g. \"dtypes=fp16,bf16;head_dims=64,128\"")
        fields[key] = value.strip()
    dtypes = tuple(d.strip() for d in fields.get("dtypes", "").split(",") if d.strip())
    if not dtypes:
        raise FaprofError(f"{where} declares no dtypes: FAPROF_KERNEL_INFO({text!r}) needs dtypes=..., "
                          f"some of {', '.join(DTYPE_CODES)}")
    bad = [d for d in dtypes if d not in DTYPE_CODES]
    if bad:
        raise FaprofError(f"{where}: dtypes {bad} are not faprof dtypes; use some of {', '.join(DTYPE_CODES)}")
    head_dims: tuple[int, ...] | None = None
    if "head_dims" in fields:
        try:
            head_dims = tuple(int(x) for x in fields["head_dims"].split(",") if x.strip())
        except ValueError:
            raise FaprofError(f"{where}: head_dims must be integers, got {fields['head_dims']!r}") from None
        if not head_dims or any(d < 1 for d in head_dims):
            raise FaprofError(f"{where}: head_dims must list positive integers, got {fields['head_dims']!r}")
    compute = fields.get("compute", "tensor")
    if compute not in ("tensor", "cuda_core"):
        raise FaprofError(f"{where}: compute must be 'tensor' or 'cuda_core', got {compute!r}")
    return KernelInfo(dtypes, head_dims, compute, parse_features(fields.get("features", ""), where))


def _support_check(name: str, head_dims: tuple[int, ...] | None) -> Callable[[Any], str | None] | None:
    if head_dims is None:
        return None

    def check(problem: Any) -> str | None:
        if problem.D not in head_dims:
            return f"{name} declares head dims {list(head_dims)}, not D={problem.D}"
        return None

    return check


# ------------------------------------------------------------------------------ .cu build
def nvcc_shared_command(nvcc: str, wrapper: Path, source_dir: Path, arch: str, output: Path) -> list[str]:
    """The nvcc command line that builds a user kernel's shared library."""
    return [nvcc, "-shared", "-Xcompiler", "-fPIC", *build.NVCC_OPT_FLAGS, build.gencode_flag(arch),
            f"-I{HEADER_DIR}", f"-I{source_dir}", "-o", str(output), str(wrapper)]


def wrapper_source(source: Path, launcher: str) -> str:
    """The translation unit faprof compiles: header, the user's file, the signature check."""
    src = json.dumps(str(source), ensure_ascii=False)  # a C string literal for the path (quotes and backslashes escaped)
    return (
        '#include "faprof_attention.h"\n'
        f"#include {src}\n"
        "#include <type_traits>\n"
        f"static_assert(std::is_same<decltype(&{launcher}), faprof_attention_launcher_t>::value ||\n"
        f"              std::is_same<decltype(&{launcher}), faprof_problem_launcher_t>::value,\n"
        f'              "{_SIGNATURE_MARK}: {launcher} must be declared as '
        f'extern \\"C\\" FAPROF_LAUNCHER({launcher}) or FAPROF_PROBLEM_LAUNCHER({launcher}) '
        '(see faprof_attention.h)");\n'
        'extern "C" const char *faprof_cuda_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }\n'
        f'extern "C" int faprof_launcher_kind(void) {{ return std::is_same<decltype(&{launcher}), '
        "faprof_problem_launcher_t>::value ? 2 : 1; }\n"
    )


def user_build_key(source: Path, launcher: str, arch: str, flags: list[str], nvcc_id: str) -> str:
    deps = sorted(p for p in source.parent.iterdir() if p.is_file() and p.suffix in (".cuh", ".h", ".hpp"))
    payload = {
        "format": USER_BUILD_FORMAT, "source": hashlib.sha256(source.read_bytes()).hexdigest(),
        "deps": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in deps},
        "header": hashlib.sha256(HEADER.read_bytes()).hexdigest(), "launcher": launcher, "arch": arch,
        "flags": flags, "nvcc": nvcc_id,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _nvcc_version(nvcc: str) -> str:
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return nvcc


def build_cu(source: Path, launcher: str, arch: str | None = None) -> Path:
    """Compile `source` into a cached shared library and return its path.

    Raises:
        FaprofError: no nvcc; the launcher is missing or has another signature; a compile error
        (the message carries nvcc's diagnostics with file(line)).
    """
    source = source.resolve()
    if not source.is_file():
        raise FaprofError(f"kernel file {source} does not exist")
    if not _IDENT_RE.match(launcher):
        raise FaprofError(f"{source.name}: launcher name {launcher!r} is not a C identifier; "
                          f"name it: --kernel {source.name}:my_launcher")
    arch = build.require_kernel_arch(arch) if arch else build.target_arch()
    nvcc = build.find_nvcc()
    flags = ["-shared", "-Xcompiler", "-fPIC", *build.NVCC_OPT_FLAGS, build.gencode_flag(arch)]
    out_dir = build.cache_root() / "user" / user_build_key(source, launcher, arch, flags, _nvcc_version(nvcc))
    library = out_dir / f"lib{source.stem}.so"
    if library.exists():
        return library
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix="tmp-") as tmp:
        wrapper = Path(tmp) / f"faprof_wrap_{launcher}.cu"
        wrapper.write_text(wrapper_source(source, launcher))
        partial = Path(tmp) / library.name
        cmd = nvcc_shared_command(nvcc, wrapper, source.parent, arch, partial)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            raise FaprofError(f"could not run nvcc on {source}: {e}") from e
        if proc.returncode != 0:
            raise _compile_error(source, launcher, arch, proc.stdout + proc.stderr, wrapper.name)
        os.replace(partial, library)  # atomic: a cached library is always a complete one
    return library


def _compile_error(source: Path, launcher: str, arch: str, output: str, wrapper_name: str) -> FaprofError:
    if _SIGNATURE_MARK in output:
        return FaprofError(f"{source.name}: {launcher} does not have faprof's launcher signature; define it as "
                           f'`extern "C" FAPROF_LAUNCHER({launcher}) {{...}}` (faprof_attention.h: '
                           "q, k, v, out, lse, B, H, Sq, Sk, D, scale, causal, dtype, stream; returns int)")
    wrapper_lines = [ln for ln in output.splitlines() if wrapper_name in ln and "error" in ln]
    if any(f'"{launcher}" is undefined' in ln for ln in wrapper_lines):
        return FaprofError(f"{source.name} defines no function {launcher!r}; name the launcher with "
                           f"--kernel {source.name}:LAUNCHER, or define `extern \"C\" FAPROF_LAUNCHER({launcher})`")
    lines = [ln for ln in output.splitlines() if ln.strip() and wrapper_name not in ln]
    diagnostics = "\n".join(lines[:60]) + ("\n..." if len(lines) > 60 else "")
    return FaprofError(f"nvcc could not compile {source} for {arch}:\n{diagnostics}")


def _exported_names(library: Path) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        return []
    try:
        out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    names = [ln.split()[-1] for ln in out.splitlines() if len(ln.split()) == 3 and ln.split()[1] == "T"]
    return sorted(n for n in names if not n.startswith(("_", "faprof_", "cuda", "__cuda")))


def open_library(library: Path, source: Path, launcher: str) -> tuple[Any, KernelInfo]:
    """Load a built library; its launcher (argtypes set) and the file's declared KernelInfo."""
    try:
        lib = ctypes.CDLL(str(library))
    except OSError as e:
        raise FaprofError(f"could not load {library} (built from {source.name}): {e}") from e
    try:
        fn = getattr(lib, launcher)
    except AttributeError:
        exported = _exported_names(library)
        also = f" (C symbols it exports: {', '.join(exported)})" if exported else ""
        raise FaprofError(f"{source.name}: {launcher} is not exported with C linkage; declare it "
                          f'`extern "C" FAPROF_LAUNCHER({launcher})`{also}') from None
    fn.restype = ctypes.c_int
    kind = lib.faprof_launcher_kind
    kind.restype, kind.argtypes = ctypes.c_int, []
    if kind() == 2:
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.POINTER(ProblemStruct), ctypes.c_void_p]
    else:
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5 + [ctypes.c_float, ctypes.c_int, ctypes.c_int,
                                                                    ctypes.c_void_p]
    try:
        info_fn = lib.faprof_kernel_info
    except AttributeError:
        raise FaprofError(f"{source.name} declares no dtypes: add FAPROF_KERNEL_INFO(\"dtypes=fp16,bf16\") "
                          "(and optionally head_dims=...) to it, see faprof_attention.h") from None
    info_fn.restype = ctypes.c_char_p
    info_fn.argtypes = []
    text = (info_fn() or b"").decode("utf-8", "replace")
    info = parse_kernel_info(text, source.name)
    if info.features and kind() != 2:
        raise FaprofError(f"{source.name} declares features={','.join(sorted(info.features))} but {launcher} is a "
                          f'FAPROF_LAUNCHER: declare it `extern "C" FAPROF_PROBLEM_LAUNCHER({launcher})` to get '
                          "the problem's heads, mask and index tensors (faprof_attention.h)")
    info = dataclasses.replace(info, problem_launcher=kind() == 2)
    err = lib.faprof_cuda_error_string
    err.restype = ctypes.c_char_p
    err.argtypes = [ctypes.c_int]
    return (fn, err), info


def cu_callable(launch: Any, error_string: Any, name: str, dtypes: tuple[str, ...],
                problem_launcher: bool = False) -> Callable:
    """fn(q, k, v, causal, scale, out=None, attn=None) calling a ctypes launcher on torch's current stream
    (a FAPROF_PROBLEM_LAUNCHER gets the problem struct, built from `attn` when the call has one)."""

    def fn(q, k, v, causal: bool, scale: float, out=None, attn=None):
        import torch

        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get(q.dtype)
        if dtype not in dtypes:
            raise ValueError(f"{name} does not take {q.dtype} (declared dtypes {list(dtypes)})")
        if not (q.is_cuda and k.is_cuda and v.is_cuda):
            raise ValueError(f"{name} needs CUDA tensors")
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if out is None:
            out = torch.empty_like(q)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        with torch.cuda.device(q.device):
            if problem_launcher:
                ps = problem_struct(q, k, causal, scale, dtype, attn)
                rc = launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None, ctypes.byref(ps), stream)
            else:
                B, H, Sq, D = q.shape
                rc = launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None, B, H, Sq, k.shape[2], D,
                            float(scale), int(bool(causal)), DTYPE_CODES[dtype], stream)
        if rc != 0:
            msg = (error_string(rc) or b"").decode("utf-8", "replace")
            raise RuntimeError(f"{name} returned CUDA error {rc}: {msg}")
        return out

    return fn


# ------------------------------------------------------------------------------- loading
def load_kernel(spec: str, arch: str | None = None) -> Any:
    """Build (.cu) or import (.py) the kernel of `spec` and register it; returns the Variant."""

    ks = parse_spec(spec)
    if ks is None:
        raise FaprofError(f"{spec} is not a kernel spec (FILE.cu[:launcher] or FILE.py:function)")
    if not ks.path.is_file():
        raise FaprofError(f"kernel file {ks.path} does not exist")
    name = ks.variant_name
    if ks.kind == "cu":
        launcher = ks.symbol or ks.path.stem
        library = build_cu(ks.path, launcher, arch)
        (launch, err), info = open_library(library, ks.path, launcher)
        fn = cu_callable(launch, err, name, info.dtypes, info.problem_launcher)
        v = variants.Variant(name, "user", f"user kernel {ks.path.name}:{launcher} (nvcc, called through ctypes)",
                             fn, dtypes=info.dtypes, compute=info.compute, check=_support_check(name, info.head_dims),
                             features=info.features, source=f"{ks.path} ({library.parent.name})")
    else:
        assert ks.symbol is not None
        v = _python_variant(ks, name)
    _register(v, variants)
    return v


def _register(v: Any, variants: Any) -> None:
    try:
        variants.register(v)
    except FaprofError as e:
        raise FaprofError(f"{e} (give the kernel another with --name)") from None


def _python_variant(ks: KernelSpec, name: str) -> Any:

    digest = hashlib.sha256(str(ks.path.resolve()).encode()).hexdigest()[:8]
    mod_spec = importlib.util.spec_from_file_location(f"faprof_kernel_{ks.path.stem}_{digest}", ks.path)
    assert mod_spec and mod_spec.loader
    module = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(module)
    except Exception as e:  # the user's module failing to import is a user error
        raise FaprofError(f"could not import {ks.path}: {type(e).__name__}: {e}") from e
    fn = getattr(module, str(ks.symbol), None)
    if fn is None or not callable(fn):
        raise FaprofError(f"{ks.path.name} has no function {ks.symbol!r}")
    try:
        inspect.signature(fn).bind(None, None, None, False, 1.0, out=None)
    except TypeError:
        raise FaprofError(f"{ks.path.name}:{ks.symbol} does not take faprof's variant arguments "
                          "fn(q, k, v, causal, scale, out=None)") from None
    except ValueError:
        pass  # no signature to inspect (a builtin): trust it
    dtypes = tuple(getattr(fn, "faprof_dtypes", ("fp16", "bf16", "fp32")))
    bad = [d for d in dtypes if d not in ("fp16", "bf16", "fp32", "fp64")]
    if not dtypes or bad:
        raise FaprofError(f"{ks.path.name}:{ks.symbol}.faprof_dtypes must list some of fp16, bf16, fp32, fp64; "
                          f"got {list(dtypes)}")
    head_dims = getattr(fn, "faprof_head_dims", None)
    compute = getattr(fn, "faprof_compute", "tensor")
    if compute not in ("tensor", "cuda_core"):
        raise FaprofError(f"{ks.path.name}:{ks.symbol}.faprof_compute must be 'tensor' or 'cuda_core'")
    features = parse_features(",".join(getattr(fn, "faprof_features", ())), f"{ks.path.name}:{ks.symbol}")
    device = getattr(fn, "faprof_device", "cuda")
    if device not in ("cuda", "cpu", "auto"):
        raise FaprofError(f"{ks.path.name}:{ks.symbol}.faprof_device must be 'cuda', 'cpu' or 'auto'")
    return variants.Variant(name, "user", f"user function {ks.path.name}:{ks.symbol}", fn, dtypes=dtypes,
                            compute=compute, device=device, check=_support_check(name, tuple(head_dims) if head_dims else None),
                            features=features, source=f"{ks.path}:{ks.symbol}")
