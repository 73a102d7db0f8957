"""The variants stage: implementations of attention and their build, and the variant API users call.

`faprof.variants` is what user code imports (`register`, `Variant`, `user_variant`,
`load_user_variants`, `get`, `resolve`, `all_variants`). Importing it fills the registry
(`faprof.model.variant`) with faprof's own variants on first look-up: the torch baselines
(`torch_variants`) and faprof's CUDA kernels (`kernels`; their extension is built only when one
runs). Modules: torch_variants, kernels, backward (autograd wiring of the backward kernels),
user_kernel (a .cu or .py kernel file as a variant), user (loading users' files), build (nvcc and the
torch extension), ptxas (the compiler's resource report), libraries (the optional library baselines:
lib_flashinfer, lib_fa4; each library imported only inside a call).
"""

from faprof.model import variant as _registry
from faprof.model.variant import KINDS, Variant, all_variants, get, register, resolve
from faprof.variants import kernels as _kernels
from faprof.variants import lib_fa4 as _lib_fa4
from faprof.variants import lib_flashinfer as _lib_flashinfer
from faprof.variants import torch_variants as _torch_variants
from faprof.variants.user import load_user_variants, user_variant


def _load_builtins() -> None:
    _torch_variants.register_all()
    _kernels.register_all()
    for v in (*_lib_flashinfer.variants(), *_lib_fa4.variants()):  # installed or not (faprof.variants.libraries)
        register(v)


_registry.add_loader(_load_builtins)

__all__ = ["KINDS", "Variant", "all_variants", "get", "load_user_variants", "register", "resolve", "user_variant"]
