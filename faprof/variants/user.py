"""Users' own variants: a Python callable (`user_variant`), or a file/module that registers some
(`load_user_variants`: `--user-variants FILE` and `--kernel FILE.cu|FILE.py:fn`)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from faprof.errors import FaprofError
from faprof.model import variant as registry
from faprof.model.problem import AttentionProblem
from faprof.model.variant import Variant, register
from faprof.variants import user_kernel


def load_user_variants(spec: str) -> list[str]:
    """Register user variants from a Python file or module that calls `faprof.variants.register`.

    `spec` is a path to a .py file or a dotted module name, or a kernel spec of `--kernel`
    ([NAME=]FILE.cu[:launcher] or [NAME=]FILE.py:function, see faprof.user_kernel). Returns the
    names it added.
    """
    if user_kernel.parse_spec(spec) is not None:  # --kernel FILE.cu[:launcher] or FILE.py:fn
        key = user_kernel.resolve_spec(spec)
        if key not in _USER_SPECS:
            _USER_SPECS[key] = [user_kernel.load_kernel(key).name]
        return _USER_SPECS[key]
    key = str(Path(spec).resolve()) if spec.endswith(".py") else spec
    if key in _USER_SPECS:  # loading the same file twice is a no-op, not a name clash
        return _USER_SPECS[key]
    before = {v.name for v in registry.all_variants(include_hidden=True)}
    path = Path(spec)
    try:
        if path.suffix == ".py":
            if not path.exists():
                raise FaprofError(f"user variant file {spec} does not exist")
            mod_spec = importlib.util.spec_from_file_location(f"faprof_user_{path.stem}", path)
            assert mod_spec and mod_spec.loader
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except FaprofError:
        raise
    except Exception as e:  # a user's module failing to import is a user error
        raise FaprofError(f"could not load user variants from {spec}: {type(e).__name__}: {e}") from e
    _USER_SPECS[key] = sorted({v.name for v in registry.all_variants(include_hidden=True)} - before)
    return _USER_SPECS[key]


_USER_SPECS: dict[str, list[str]] = {}


def user_variant(
    name: str,
    fn: Callable,
    *,
    description: str = "user variant",
    dtypes: tuple[str, ...] = ("fp16", "bf16", "fp32"),
    directions: tuple[str, ...] = ("fwd",),
    device: str = "cuda",
    compute: str = "tensor",
    check: Callable[[AttentionProblem], str | None] | None = None,
    aliases: dict[str, str] | None = None,
) -> Variant:
    """Register a Python callable fn(q, k, v, causal, scale, out=None) -> o as a 'user' variant.

    `aliases`: direction -> the variant whose kernels fn runs for it (see Variant.aliases): a run
    that has both times that kernel once."""
    return register(
        Variant(name, "user", description, fn, dtypes=dtypes, directions=directions, device=device,
                compute=compute, check=check, source=getattr(fn, "__module__", "user"), aliases=dict(aliases or {}))
    )
