"""Two user variants with classic attention bugs, registered to make the `flags` fixture bundle.

`user_nomask` forgets the causal mask (right on full attention, wrong on causal problems);
`user_notrans` multiplies Q by K instead of Kᵀ (a shape error unless Sk == D, so the run records
it as `failed` with torch's message). Run on the CPU:

    python -m faprof profile --scenario tests/data/bundles/recipes/flags.toml \
        --user-variants tests/data/bundles/recipes/buggy_variants.py --out /tmp/flag_runs
"""

from __future__ import annotations

from faprof.variants import Variant, register


def _nomask(q, k, v, causal: bool, scale: float, out=None):
    import torch

    s = torch.matmul(q, k.transpose(-2, -1)) * scale  # the bug: `causal` is ignored
    return torch.matmul(torch.softmax(s, dim=-1), v)


def _notrans(q, k, v, causal: bool, scale: float, out=None):
    import torch

    s = torch.matmul(q, k) * scale  # the bug: K is not transposed
    return torch.matmul(torch.softmax(s, dim=-1), v)


register(Variant("user_nomask", "user", "attention that ignores the causal mask (bug)", _nomask,
                 device="cpu", compute="cuda_core", dtypes=("fp32",)), replace=True)
register(Variant("user_notrans", "user", "attention that multiplies Q by K, not K^T (bug)", _notrans,
                 device="cpu", compute="cuda_core", dtypes=("fp32",)), replace=True)
