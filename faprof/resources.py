"""Where faprof's own files are: kernels, scenarios, the dashboard app, examples and data files.

They reach the package as `faprof/data/...` through importlib.resources, in a source tree and in an
installed wheel alike: in the source tree `faprof/data/kernels`, `scenarios`, `app` and `examples`
are links to the top-level folders; building a wheel copies what they point to (pyproject's
package-data; the example bundles stay out of the wheel). Nothing in faprof finds its data through
`__file__` parents.
"""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

from faprof.errors import FaprofError


def data_path(*parts: str) -> Path:
    """A file or folder under faprof's package data, as a real filesystem path (links resolved, so
    nvcc and build caches see one stable path).

    Raises:
        FaprofError: faprof is installed in a form whose data is not on the filesystem (a zip).
    """
    root = resources.files("faprof").joinpath("data", *parts)
    if not isinstance(root, Path):
        raise FaprofError(f"faprof's package data ({'/'.join(parts)}) is not on the filesystem; "
                          "install faprof as a regular (unzipped) package")
    return root.resolve()


def kernels_dir() -> Path:
    """faprof's CUDA sources (`kernels/`)."""
    return data_path("kernels")


def scenarios_dir() -> Path:
    """The shipped scenario files (`scenarios/`)."""
    return data_path("scenarios")


def app_dir() -> Path:
    """The Streamlit dashboard (`app/`; its entry file is `dashboard.py`)."""
    return data_path("app")


def examples_dir() -> Path | None:
    """The example run bundles of a source tree (`examples/runs`); None in an installed wheel."""
    p = data_path("examples") / "runs"
    return p if p.is_dir() else None


def package_parent() -> Path:
    """The folder that holds the `faprof` package: what a child process needs on PYTHONPATH to import
    this same faprof (a source tree's root, or site-packages)."""
    spec = importlib.util.find_spec("faprof")
    if spec is None or not spec.submodule_search_locations:
        raise FaprofError("faprof's own package cannot be found (is it installed?)")
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def source_root() -> Path | None:
    """The git checkout faprof runs from, when it runs from one (for the commit a run records)."""
    root = package_parent()
    return root if (root / ".git").exists() else None
