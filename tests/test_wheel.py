"""faprof installed from its wheel works like a clone: built with `pip wheel`, installed into a fresh
virtual environment, and run from a folder outside the source tree.

Method: copy the files a wheel is built from (pyproject.toml, README.md, faprof/ with its data links,
kernels/, scenarios/, app/) to a temporary folder, so the build's `build/` and `*.egg-info` never
land in the checkout; `pip wheel --no-deps --no-build-isolation`; `python -m venv` with a .pth file listing this
interpreter's site-packages folders (torch, pandas and the rest come from there, whether this Python is
a system one or a virtualenv: `--system-site-packages` would give a virtualenv's *base* interpreter's
packages instead) and `pip install --no-deps --ignore-installed` the wheel. Then, from a working folder under a path of more than 120
characters, with PYTHONPATH unset and a fresh FAPROF_CACHE: `faprof list`, `faprof build --arch
sm_80` (nvcc compiles the kernels the wheel carries), `faprof profile --scenario smoke` (CPU rows
here), `faprof report ... --format md` and `faprof dashboard --print-command`. Every faprof module
the venv imports must come from the venv's site-packages, never from the checkout (an editable
install of the checkout is on this Python's path and would otherwise fill in a module the wheel
lacks).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from faprof.variants import build

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

#: What a wheel is built from (pyproject's package-data follows faprof/data's links into these).
WHEEL_INPUTS = ("pyproject.toml", "README.md", "faprof", "kernels", "scenarios", "app")

#: Paths at least this long catch tools that cut or wrap long paths (nvcc, ptxas, the worker's argv).
LONG_PATH_CHARS = 120

#: Limits per step, in seconds: generous for a loaded 2-core machine; the whole module takes ~2 minutes.
STEP_TIMEOUT_S = 300

#: The kernels that only the tests build (tests/kernels/); a wheel must not carry them.
TEST_ONLY_KERNELS = ("fault.cu", "race.cu", "wgmma_test.cu")


#: The .pth file in the test venv that lists this interpreter's site-packages (sorts after pip's own).
OUTER_PTH = "zz_faprof_test_outer_site.pth"


def outer_site_packages() -> list[str]:
    """The site-packages folders this interpreter imports from, in its order (a virtualenv's, its base's
    when it was made with --system-site-packages, the user's)."""
    return [p for p in dict.fromkeys(sys.path) if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


class Installed:
    """A venv with faprof installed from its wheel, and a working folder outside the checkout."""

    def __init__(self, base: Path):
        self.wheel = _build_wheel(base)
        # ~95 characters of folder names on top of pytest's base: past LONG_PATH_CHARS everywhere below
        long = base / ("a_long_folder_name_that_tools_must_not_cut_" * 2 + "end")
        self.venv = long / "venv"
        self.work = long / "work"
        self.work.mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True, timeout=STEP_TIMEOUT_S)
        self.cache = long / "cache"
        self.python = self.venv / "bin" / "python"
        purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        self.site = Path(self.run([str(self.python), "-c", purelib]).stdout.strip())
        # After the venv's own site-packages, so the wheel's faprof comes first. Plain path lines: the
        # folders' own .pth files (this checkout's editable install among them) are not run.
        (self.site / OUTER_PTH).write_text("".join(f"{p}\n" for p in outer_site_packages()))
        self.run([str(self.python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(self.wheel)])

    def env(self) -> dict[str, str]:
        """This environment without PYTHONPATH (it points at the checkout under test), a fresh cache."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["FAPROF_CACHE"] = str(self.cache)
        return env

    def run(self, argv: list[str]) -> subprocess.CompletedProcess:
        """A command in the working folder; it must exit 0."""
        r = subprocess.run(argv, cwd=self.work, env=self.env(), capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        assert r.returncode == 0, f"{' '.join(argv[:3])}... exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    def faprof(self, *args: str) -> subprocess.CompletedProcess:
        """The installed console script."""
        return self.run([str(self.venv / "bin" / "faprof"), *args])


def _build_wheel(base: Path) -> Path:
    src, dist = base / "src", base / "dist"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in WHEEL_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, timeout=STEP_TIMEOUT_S, capture_output=True)
    (wheel,) = dist.glob("faprof-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    return Installed(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_carries_the_package_data_and_no_test_only_kernel(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    kernels = {Path(n).name for n in names if n.startswith("faprof/data/kernels/")}
    assert kernels == {p.name for p in (ROOT / "kernels").iterdir() if p.is_file()}
    assert not kernels & set(TEST_ONLY_KERNELS)
    scenarios = {Path(n).name for n in names if n.startswith("faprof/data/scenarios/")}
    assert scenarios == {p.name for p in (ROOT / "scenarios").glob("*.toml")}
    assert "faprof/data/app/dashboard.py" in names and "faprof/data/gpus.toml" in names
    assert "faprof/data/faprof_attention.h" in names
    assert not any(n.startswith("faprof/data/examples/") for n in names)  # example bundles stay out


def test_every_module_comes_from_the_installed_wheel(installed):
    """Import each faprof module in the venv: every one is found, and under the venv's site-packages."""
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / "faprof").rglob("*.py")
                     if "data" not in p.relative_to(ROOT / "faprof").parts)
    code = ("import importlib, json, sys\n"
            f"names = {modules!r}\n"
            "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n")
    r = installed.run([str(installed.python), "-c", code])
    files = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(files) == set(modules)
    outside = {n: f for n, f in files.items() if not Path(f).resolve().is_relative_to(installed.site.resolve())}
    assert outside == {}, f"imported from outside {installed.site}: {outside}"
    assert len(str(installed.site)) > LONG_PATH_CHARS


def test_list_finds_the_shipped_scenarios_and_variants(installed):
    out = installed.faprof("list").stdout
    for name in ("smoke", "l4_causal", "fa2_mma", "sdpa_flash", "H100 SXM"):
        assert name in out, name
    assert "invalid" not in out
    assert "_fault_oob" not in installed.faprof("list", "variants", "--hidden").stdout


@pytest.mark.skipif(build.find_cuda_home() is None and shutil.which("nvcc") is None,
                    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels")
def test_build_compiles_the_installed_kernels(installed):
    cu = sorted(p.name for p in (installed.site / "faprof" / "data" / "kernels").glob("*.cu"))
    out = installed.faprof("build", "--arch", "sm_80").stdout
    assert f"compiled {len(cu)} (file, arch) pairs" in out, out[-2000:]  # a fresh cache: every file compiled
    for name in cu:
        assert name in out, name
    assert len(list((installed.cache / "ptxas").glob("*.log"))) == len(cu)


def test_profile_then_report_from_outside_the_checkout(installed):
    runs = installed.work / "runs"
    r = installed.faprof("profile", "--scenario", "smoke", "--out", str(runs), "--budget", "0.05")
    assert "status:" in r.stdout and f"bundle: {runs}" in r.stdout
    (bundle,) = runs.iterdir()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["env"]["git_sha"] is None  # not measured from a checkout
    assert Path(manifest["scenario"]["path"]).resolve().is_relative_to(installed.site.resolve())
    assert (bundle / "measurements.parquet").is_file()
    out = installed.faprof("report", str(bundle), "--format", "md").stdout
    report = bundle / "report" / "report.md"
    assert f"report: {report.relative_to(installed.work)}" in out or f"report: {report}" in out, out
    assert "smoke" in report.read_text()


def test_dashboard_command_points_at_the_installed_app(installed):
    import importlib.util

    if importlib.util.find_spec("streamlit") is None or importlib.util.find_spec("plotly") is None:
        pytest.skip("streamlit/plotly not installed (pip install 'faprof[app]')")
    out = installed.faprof("dashboard", "--print-command").stdout.strip()
    argv = shlex.split(out)  # the command as a shell reads it (a path with spaces is one word)
    app = Path(argv[argv.index("run") + 1])
    assert app == installed.site / "faprof" / "data" / "app" / "dashboard.py"
    assert app.is_file() and (app.parent / "pages").is_dir()
