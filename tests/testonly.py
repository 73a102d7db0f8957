"""Where the tests find the test-only kernels (tests/kernels/): their variants file and its module.

The kernels that fault or race on purpose, and the wgmma GEMM probe, are built as their own small
extension (torch.ops.faprof_test.*) by tests/kernels/testonly_variants.py, never into faprof's. A
test that runs one of their variants in a worker passes TESTONLY_VARIANTS as a user-variants file
(`ProfileOptions(user_variants=[...])`, `--user-variants`); one that calls an op uses the
`testonly_ops` fixture (conftest.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The test-only kernels' variants file: hidden variants _fault_oob, _race_atomic, _race_plain.
TESTONLY_VARIANTS = Path(__file__).resolve().parent / "kernels" / "testonly_variants.py"


def load_testonly() -> ModuleType:
    """tests/kernels/testonly_variants.py as a module (imported once; importing registers its variants)."""
    name = "faprof_testonly_variants"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTONLY_VARIANTS)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
