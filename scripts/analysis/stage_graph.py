"""faprof's stages as the code has them: the layers of the import contract (pyproject.toml), each stage's
modules, and which stages each one really imports (every import statement, deferred ones included).

    python3 scripts/analysis/stage_graph.py          # the Markdown the architecture page shows

The architecture page (docs/development/architecture.md) holds the marker `<!-- faprof:stages -->`;
scripts/mkdocs_hooks.py replaces it with `stages_markdown()` at build time, so the diagram is drawn
from the code each time the docs are built and cannot drift from it.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layers(root: Path = ROOT) -> list[str]:
    """The import contract's layers, top (imports the most) to bottom, as dotted names."""
    cfg = tomllib.loads((root / "pyproject.toml").read_text())
    contracts = cfg["tool"]["importlinter"]["contracts"]
    return [name for c in contracts if c.get("type") == "layers" for name in c["layers"]]


def _files(stage: str, root: Path) -> list[Path]:
    base = root / stage.replace(".", "/")
    if base.is_dir():
        return sorted(base.rglob("*.py"))
    return [base.with_suffix(".py")] if base.with_suffix(".py").exists() else []


def _module(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imported(path: Path, module: str) -> set[str]:
    """Every faprof module `path` imports, at any depth of its code (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.update(f"{base}.{a.name}" for a in node.names)
            out.add(base)
    return {m for m in out if m == "faprof" or m.startswith("faprof.")}


def _stage_of(module: str, stages: list[str]) -> str | None:
    best = None
    for s in stages:
        if (module == s or module.startswith(s + ".")) and (best is None or len(s) > len(best)):
            best = s
    return best


def graph(root: Path = ROOT) -> dict[str, dict[str, object]]:
    """stage -> {"modules": [...], "doc": first sentence of its docstring, "imports": stages it imports}."""
    stages = layers(root)
    out: dict[str, dict[str, object]] = {}
    for s in stages:
        files = _files(s, root)
        mods = [_module(f, root) for f in files]
        imports: set[str] = set()
        for f, m in zip(files, mods, strict=True):
            for target in _imported(f, m):
                t = _stage_of(target, stages)
                if t is not None and t != s:
                    imports.add(t)
        doc = ""
        head = root / s.replace(".", "/") / "__init__.py"
        src = head if head.exists() else (files[0] if files else None)
        if src is not None:
            doc = (ast.get_docstring(ast.parse(src.read_text(encoding="utf-8"))) or "").strip()
            doc = doc.split("\n\n")[0].replace("\n", " ")
        short = sorted({m.removeprefix(s + ".") for m in mods if m != s})
        out[s] = {"modules": short, "doc": doc, "imports": sorted(imports, key=stages.index)}
    return out


def stages_markdown(root: Path = ROOT) -> str:
    """The stage diagram (top stage first, arrows to the stages it imports) and the stage table."""
    g = graph(root)
    stages = list(g)
    width = max(len(s) for s in stages)
    lines = ["```text", f"{'stage'.ljust(width)}      imports (only stages below it)"]
    for s in stages:
        imp = ", ".join(x.removeprefix("faprof.") for x in g[s]["imports"]) or "-"  # type: ignore[union-attr]
        lines.append(f"{s.ljust(width)}  ->  {imp}")
    lines.append("```")
    lines += ["", "| stage | modules | what it is |", "| --- | --- | --- |"]
    for s in stages:
        mods = ", ".join(f"`{m}`" for m in g[s]["modules"]) or "(one module)"  # type: ignore[union-attr]
        doc = str(g[s]["doc"]).replace("|", "\\|")
        lines.append(f"| `{s}` | {mods} | {doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(stages_markdown())
