"""Shared test configuration: `gpu` tests skip without CUDA; `browser` tests need chromium."""

from __future__ import annotations

import pytest
from testonly import load_testonly

#: torch's intra-op threads in the test process. Its tensors are tiny (a few thousand elements): OpenMP's
#: threads cost more than they give. tests/test_wrong_signatures.py's run took 62 s of CPU with 2 threads
#: and 17 s with 1 (2-core machine). Workers that runs spawn set their own (faprof.run.gpu_pool), as for users.
TEST_TORCH_THREADS = 1


def pytest_configure(config):
    """One torch thread in this process, unless the user chose a count (OMP_NUM_THREADS)."""
    import os

    if os.environ.get("OMP_NUM_THREADS"):
        return
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(TEST_TORCH_THREADS)


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


#: The slowest test files on 2 cores (docs/development/tests.md), collected first: pytest-xdist hands files to
#: idle workers in collection order, so a long file started last would keep one worker busy while the other
#: waits.
SLOW_FIRST = ("test_tutorials_cpu.py", "test_app_browser.py", "test_wheel.py", "test_report.py", "test_pool.py",
              "test_worker.py", "test_cluster.py", "test_app.py", "test_advise_planted.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _registry_restored():
    """Variants a test registers (user plugins, planted kernels) leave the registry afterwards, so no
    later `variants = ["all"]` scenario runs them whatever the order tests run in."""
    from faprof import variants  # noqa: F401  (installs the built-in variants' loader)
    from faprof.model import variant
    from faprof.variants import user

    variant.all_variants()  # load the built-ins first: they stay
    before, specs = dict(variant._REGISTRY), dict(user._USER_SPECS)
    yield
    variant._REGISTRY.clear()
    variant._REGISTRY.update(before)
    user._USER_SPECS.clear()
    user._USER_SPECS.update(specs)


@pytest.fixture(scope="module")
def ops():
    """torch.ops.faprof with faprof's CUDA extension built (or loaded from its cache)."""
    import torch

    from faprof.variants import build

    info = build.load()
    print(f"faprof extension: {info.summary()}")
    return torch.ops.faprof


@pytest.fixture(scope="module")
def testonly_ops():
    """torch.ops.faprof_test with the test-only kernels' extension built (or loaded from its cache)."""
    info = load_testonly().load_extension()
    print(f"test-only extension: {info.summary()}")
    return load_testonly().ops()


@pytest.fixture(scope="session")
def smoke_local(tmp_path_factory):
    """The smoke scenario through the default local runner (one worker process, no ceilings): the rows
    that tests/test_pool.py's two pinned workers and tests/test_cluster.py's Dask workers must give too.
    Read only: a test that changes a bundle copies it first."""
    from faprof import run as runner

    return runner.profile("smoke", runner.ProfileOptions(out_dir=tmp_path_factory.mktemp("smoke_local"), ceilings=False))

