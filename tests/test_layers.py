"""The house plan holds: stages import only the stages below them, no import circles (deferred imports
inside functions counted), and no faprof module is imported by a string (importlib / __import__).

Method: import-linter's layers contract from pyproject.toml (its graph, grimp, parses every import
statement of a module, those inside functions included); a strongly-connected-components pass over the
same graph for circles; an AST scan for string imports, which no graph can see.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "faprof"

grimp = pytest.importorskip("grimp")
importlinter_cli = pytest.importorskip("importlinter.cli")


def _graph():
    return grimp.build_graph("faprof", cache_dir=None)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_deferred_imports_included():
    g = _graph()
    edges = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    assert _cycles(edges) == []


def test_the_graph_sees_imports_inside_functions():
    """Guards the method: a deferred import must show up as an edge (else the circle test is blind)."""
    deferred = []
    for path in PACKAGE.rglob("*.py"):
        if "data" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("faprof."):
                    mod = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                    deferred.append((mod, node.module))
    assert deferred, "no deferred faprof import left to check the graph against"
    g = _graph()
    for mod, target in deferred:
        imported = g.find_modules_directly_imported_by(mod)
        assert target in imported or any(t.startswith(target + ".") for t in imported), (mod, target)


def test_stages_import_only_the_stages_below_them():
    assert importlinter_cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def test_no_faprof_module_is_imported_by_a_string():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "data" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("importlib.import_module", "import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("faprof"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}({arg.value!r})")
    assert offenders == []


def test_every_package_and_top_module_is_a_stage_of_the_contract():
    """A package (or top-level module) missing from the layers contract would escape it: import-linter
    checks only the layers it is given. The architecture page's diagram is drawn from the same list."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stage_graph", ROOT / "scripts" / "analysis" / "stage_graph.py")
    sg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sg)
    stages = set(sg.layers(ROOT))
    present = {f"faprof.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    present |= {f"faprof.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert present <= stages, f"not in [tool.importlinter] layers: {sorted(present - stages)}"
    order = sg.layers(ROOT)
    for stage, info in sg.graph(ROOT).items():  # the diagram shows only imports that go down
        assert all(order.index(t) > order.index(stage) for t in info["imports"]), (stage, info["imports"])


def test_module_names_are_unique_across_stages():
    """A newcomer finds a module by its name: no two faprof modules share one, except the twin modules of
    the two Nsight tools (nsight/ncu and nsight/nsys: find, command, read, tables), which play the same
    role for each tool, and the packages' own __init__ / __main__."""
    seen: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.name in ("__init__.py", "__main__.py"):
            continue
        seen.setdefault(p.stem, []).append(str(p.relative_to(ROOT)))
    twins = {n for n, ps in seen.items() if len(ps) == 2 and {Path(x).parent.name for x in ps} == {"ncu", "nsys"}}
    dupes = {n: ps for n, ps in seen.items() if len(ps) > 1 and n not in twins}
    assert not dupes, dupes


def test_reading_a_bundle_imports_neither_the_harness_nor_torch(tmp_path):
    """The store's upgrade-on-read (statistics, stability, the physical-limits judgement) is faprof.rows:
    reading a committed bundle's rows in a fresh interpreter loads no faprof.timing, faprof.correctness
    or torch."""
    import subprocess
    import sys

    bundle = next(p.parent for p in sorted((ROOT / "examples" / "runs").glob("*/manifest.json")))
    code = ("import sys; from faprof.store import Bundle; df = Bundle.open(sys.argv[1]).measurements(); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith(('faprof.timing', "
            "'faprof.correctness'))); print(len(df), bad)")
    out = subprocess.run([sys.executable, "-c", code, str(bundle)], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.split(maxsplit=1)
    assert int(out[0]) > 0 and out[1].strip() == "[]", out


def test_the_command_line_starts_without_pandas_or_torch():
    """`faprof --help` (and every command before it runs) imports the click group only: the stages a command
    calls are imported inside it (faprof.cli's docstring), so the CLI starts in a fraction of a second."""
    import subprocess
    import sys

    code = "import sys, faprof.cli; print(sorted(m for m in ('pandas', 'torch', 'numpy', 'scipy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]", out
