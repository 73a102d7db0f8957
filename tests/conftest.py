"""Shared test configuration: `gpu` tests skip without CUDA; `browser` tests need chromium."""

from __future__ import annotations

import pytest


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ops():
    """torch.ops.faprof with faprof's CUDA extension built (or loaded from its cache)."""
    import torch

    from faprof import build

    info = build.load()
    print(f"faprof extension: {info.summary()}")
    return torch.ops.faprof
