"""MkDocs hooks: the reference pages that are generated at build time from faprof's own code.

`mkdocs.yml` names this file under `hooks:`; `on_files` adds three pages that are never committed as
text, so they cannot drift from the code:

- `reference/causes.md`: every cause the advisor can name (its record in `faprof.advisor.CAUSES`), with
  the rule functions that name it, the counters and thresholds those rules read (from their source), what
  the cause points to and the fix (the rules' own fix text, the ncu catalogue's `STALL_ADVICE` and
  `PIPE_ADVICE` for the accounting's terms, the record's fix for the other terms), the gap terms a
  mechanism claims (the record's `claims`) and the thresholds table (`THRESHOLDS`);
- `reference/signatures.md`: every wrong-result signature family (`signatures.FAMILIES`), the specific
  bugs (kinds) the code tests for, how each is tested (the function's docstring) and the constants it
  decides with;
- `reference/bundle.md`: a run bundle's tables (`faprof.model.schema.TABLES`), each table's columns
  from the module that writes it, their labels and units, and the types a committed bundle holds.

The command reference (`reference/cli.md`) is rendered by the mkdocs-click extension from the click
commands themselves. tests/test_docs.py checks that every cause, family, table and command has its entry.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Bundle table -> "module:NAME" of the column tuple the module that writes the table uses.
#: tests/test_docs.py fails when a table of `faprof.model.schema.TABLES` is missing here.
TABLE_COLUMNS = {
    "measurements": "faprof.model.schema:ROW_COLUMNS",
    "ncu_metrics": "faprof.nsight.ncu.parse:METRICS_COLUMNS",
    "ncu_summary": "faprof.nsight.ncu.summary:SUMMARY_COLUMNS",
    "stalls": "faprof.nsight.ncu.tables:STALL_COLUMNS",
    "roofline": "faprof.nsight.ncu.roofline:ROOFLINE_COLUMNS",
    "ncu_rules": "faprof.nsight.ncu.rule_results:RULES_COLUMNS",
    "nsys_kernels": "faprof.nsight.nsys.read:KERNEL_COLUMNS",
    "nsys_summary": "faprof.nsight.nsys.tables:SUMMARY_COLUMNS",
    "error_maps": "faprof.store.error_maps:COLUMNS",
    "source_lines": "faprof.nsight.ncu.source:SOURCE_COLUMNS",
    "sanitizer": "faprof.run.sanitize:COLUMNS",
}

#: Column-name endings -> unit, for columns the analysis labels do not give a unit (longest first).
UNIT_SUFFIXES = (
    ("_per_s", "1/s"), ("_flops_per_s", "FLOP/s"), ("_bytes_per_s", "B/s"), ("_ms", "ms"), ("_us", "µs"),
    ("_ns", "ns"), ("_s", "s"), ("_bytes", "bytes"), ("_pct", "%"), ("_mhz", "MHz"), ("_gbs", "GB/s"),
    ("gbps", "GB/s"), ("tflops", "TFLOP/s"), ("_c_before", "°C"), ("_c_after", "°C"), ("_w_max", "W"),
    ("flops", "FLOP"), ("_frac", "share 0..1"), ("share", "share 0..1"), ("share_bad", "share 0..1"),
)

#: Where generated pages go (site paths) and what makes them.
PAGES: dict[str, Callable[[], str]] = {}


def page(path: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        PAGES[path] = fn
        return fn
    return register


# ------------------------------------------------------------------------------ source reading
def _module_functions(package: str) -> list[tuple[str, ast.FunctionDef]]:
    """(module name, function node) of every function in a package's modules."""
    pkg = importlib.import_module(package)
    names = [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    out = []
    for name in names:
        src = inspect.getsource(importlib.import_module(name))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef):
                out.append((name, node))
    return out


def _text(node: ast.AST | None) -> str | None:
    """A string expression as text: constants kept, formatted values shown as `…`, None if not text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _text(node.left), _text(node.right)
        if a is not None or b is not None:
            return (a or "…") + (b or "…")
    if isinstance(node, ast.IfExp):
        a, b = _text(node.body), _text(node.orelse)
        return a if b in (None, "") else b if a in (None, "") else f"{a} / {b}"
    return None


def _parents(fn: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: parent for parent in ast.walk(fn) for child in ast.iter_child_nodes(parent)}


def _blocks_up(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> Iterable[list[ast.stmt]]:
    """The statement lists enclosing `node`, innermost first."""
    cur: ast.AST | None = node
    while cur is not None:
        parent = parents.get(cur)
        if parent is None:
            return
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and cur in block:
                yield block
        cur = parent


def _assigned_text(block: list[ast.stmt], name: str) -> str | None:
    """The text assigned to `name` in a statement list (with `+=` additions), None when none is."""
    parts: list[str] = []
    for st in block:
        if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in st.targets):
            parts = [_text(st.value) or "…"]
        elif isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name) and st.target.id == name and parts:
            parts.append(_text(st.value) or "…")
    return "".join(parts) if parts else None


def _branch_texts(block: list[ast.stmt], name: str) -> list[str]:
    """The texts assigned to `name` in the if/else branches of a statement list (one per branch)."""
    out: list[str] = []
    for st in block:
        if isinstance(st, ast.If):
            for branch in (st.body, st.orelse):
                found = _assigned_text(branch, name)
                out += [found] if found is not None else _branch_texts(branch, name)
    return out


def _fix_near(const: ast.AST, parents: dict[ast.AST, ast.AST]) -> str | list[str] | None:
    """The fix text that goes with one occurrence of a cause key: a `fix = ...` in the enclosing
    blocks, a literal fix argument of the Finding call it is in, or the string an `if ... == key:`
    branch returns."""
    parent = parents.get(const)
    if isinstance(parent, ast.Compare):
        return None  # an `if ... == key: return ...` branch: a text, collected apart
    call = parent if isinstance(parent, ast.Call) else None
    if call is not None and const in call.args:
        i = call.args.index(const)
        if len(call.args) > i + 3:
            lit = _text(call.args[i + 3])
            if lit is not None and not isinstance(call.args[i + 3], ast.Name):
                return lit
    for block in _blocks_up(const, parents):
        found = _assigned_text(block, "fix")
        if found is not None:
            return found
        branches = _branch_texts(block, "fix")  # `if ...: fix = "a"` / `else: fix = "b"`, then the Finding
        if branches:
            return branches
    return None


#: Calls that make a finding: a function that contains one and a cause key names that cause.
FINDING_MAKERS = ("Finding", "_f", "Term")

_READ_CALLS = {"metric": "ncu metric", "col": "ncu_summary column", "stall_share": "stall share",
               "state_share": "warp state", "pipe_share": "pipe share", "problem": "problem field"}


def _reads(fn: ast.FunctionDef) -> tuple[list[str], list[str]]:
    """(counters and fields a function reads by name, thresholds it reads with T("NAME"))."""
    reads: list[str] = []
    thresholds: list[str] = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if name == "T" or name == "value" and args and args[0].isupper():
            thresholds += args[:1]
        elif name in _READ_CALLS:
            reads += args
        elif name == "get" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) \
                and f.value.attr == "nsys":
            reads += [f"nsys {a}" for a in args]
    return list(dict.fromkeys(reads)), list(dict.fromkeys(thresholds))


def _doc(fn: ast.FunctionDef, module: str = "") -> str:
    """A function's docstring's first paragraph, on one line; for a function without one, its item
    in the module docstring's list (`- name: what it does`), where there is one."""
    doc = ast.get_docstring(fn) or ""
    if not doc and module:
        mod_doc = inspect.getdoc(importlib.import_module(module)) or ""
        m = re.search(rf"^- {re.escape(fn.name)}: (.*?)(?=^- |\n\n|\Z)", mod_doc, re.S | re.M)
        doc = m.group(1).rstrip(" ;.\n") + "." if m else ""
    return " ".join(doc.split("\n\n")[0].split())


def _comment_above(src: str, name: str) -> str:
    """The `#:` comment lines right above a module-level `NAME =` or `NAME: ... =` in `src`."""
    lines = src.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^{re.escape(name)}\s*(:|=)", line):
            out = []
            j = i - 1
            while j >= 0 and lines[j].lstrip().startswith("#:"):
                out.insert(0, lines[j].lstrip()[2:].strip())
                j -= 1
            return " ".join(out)
    return ""


def _md(text: object) -> str:
    """Text from the code as Markdown that renders as written: outside `code` spans, the characters
    Markdown would read as emphasis, links or HTML are escaped (`__launch_bounds__` stays itself)."""
    parts = str(text).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")
                    .replace("[", "\\[").replace("]", "\\]").replace("<", "&lt;").replace(">", "&gt;"))
    return "`".join(parts) if len(parts) % 2 else str(text).replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: object) -> str:
    """Text for a Markdown table cell."""
    return _md(text).replace("|", "\\|").replace("\n", " ")


def _anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", key.lower()).strip("-")


# ------------------------------------------------------------------------------------ causes
def cause_entries() -> dict[str, dict[str, Any]]:
    """Per advisor cause: title, kind, the functions that name it (with what they read) and fixes."""
    from faprof.advisor import CAUSES, THRESHOLDS
    from faprof.nsight.ncu.catalogue_stalls import (
        PIPE_ADVICE,
        PIPE_ADVICE_PRODUCTS_ON_TENSOR_CORES,
        STALL_ADVICE,
    )

    entries: dict[str, dict[str, Any]] = {
        key: {"title": c.title, "kind": c.kind, "rules": [], "fixes": [], "texts": [], "from_terms": [],
              "claims": c.claims, "shape_note": c.of_shape, "advice": None}
        for key, c in CAUSES.items()}
    for key, e in entries.items():
        family, _, name = key.partition(":")
        table = {"stall": STALL_ADVICE, "pipe": PIPE_ADVICE}.get(family)
        if table is not None and name in table:
            e["advice"] = table[name]
        if family == "pipe":
            e["advice_on_tc"] = PIPE_ADVICE_PRODUCTS_ON_TENSOR_CORES.get(name)
        if CAUSES[key].fix and e["advice"] is None:  # a term's fix, in its record
            e["texts"].append(("faprof.advisor.causes.CAUSES", CAUSES[key].fix))
    for module, fn in _module_functions("faprof.advisor"):
        for node in ast.walk(fn):  # `if t.key == "<cause>": return "<text>"`: a text the cause is said with
            if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and node.body \
                    and isinstance(node.body[0], ast.Return):
                keys = [c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant) and c.value in entries]
                said = _text(node.body[0].value)
                for key in keys:
                    if said and said.strip("…"):
                        entries[key]["texts"].append((f"{module}.{fn.name}", said))
        if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in FINDING_MAKERS
                   for n in ast.walk(fn)):
            continue  # mentions a cause (ranking, rendering) without naming it as a finding
        parents = _parents(fn)
        reads, thresholds = _reads(fn)
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in entries):
                continue
            e = entries[node.value]
            ref = f"{module}.{fn.name}"
            if all(r["ref"] != ref for r in e["rules"]):
                e["rules"].append({"ref": ref, "doc": _doc(fn, module), "reads": reads,
                                   "thresholds": [t for t in thresholds if t in THRESHOLDS]})
            found = _fix_near(node, parents)
            for fix in [found] if isinstance(found, str) else found or []:
                if fix.strip("…") and fix not in e["fixes"]:
                    e["fixes"].append(fix)
            term = _branch_key(node, parents, entries)
            if term and term != node.value and term not in e["from_terms"]:
                e["from_terms"].append(term)
    for e in entries.values():  # a cause said for a gap term (`if key == "occupancy": cause = ...`)
        for term in e["from_terms"]:
            e["texts"] += [t for t in entries[term]["texts"] if t not in e["texts"]]
    return entries


def _branch_key(node: ast.AST, parents: dict[ast.AST, ast.AST], keys: dict[str, Any]) -> str | None:
    """The cause key an enclosing `if ... == "<key>":` branch tests, when `node` is in its body."""
    cur: ast.AST | None = node
    while cur is not None:
        parent = parents.get(cur)
        if isinstance(parent, ast.If) and cur in parent.body:
            found = [c.value for c in ast.walk(parent.test) if isinstance(c, ast.Constant) and c.value in keys]
            if found:
                return found[0]
        cur = parent
    return None


def _kind_notes() -> dict[str, str]:
    """Each finding kind's one-line meaning, from the comment above `KINDS` in causes.py."""
    from faprof.advisor import causes

    src = inspect.getsource(causes)
    block = _comment_above(src, "KINDS")
    out = {}
    for part in re.split(r";\s*", block):
        m = re.search(r"(\w+): (.*)", part.strip())
        if m:
            out[m.group(1)] = m.group(2).rstrip(".")
    return out


@page("reference/causes.md")
def causes_page() -> str:
    from faprof.advisor import KINDS, THRESHOLDS

    entries = cause_entries()
    notes = _kind_notes()
    out = ["# Causes the advisor names", "",
           "Generated at build time from `faprof.advisor.causes.CAUSES`, the rules that name each cause "
           "(their source: the counters they read and their fix text), the Nsight Compute catalogue's advice "
           "for warp states and pipes, and `faprof.advisor.thresholds.THRESHOLDS`. `…` stands for a value "
           "the rule fills in from the measurement. How the advisor uses these: "
           "[Why is it slow?](../explain/index.md).", "",
           "| kind | what it is |", "| --- | --- |"]
    out += [f"| `{k}` | {_cell(notes.get(k, ''))} |" for k in KINDS]
    for kind in KINDS:
        keys = [k for k, e in entries.items() if e["kind"] == kind]
        if not keys:
            continue
        out += ["", f"## {kind}", ""]
        for key in keys:
            out += _cause_section(key, entries[key])
    out += ["", "## Thresholds", "", "Every number a rule decides with (`faprof.advisor.THRESHOLDS`).", "",
            "| threshold | value | unit | why |", "| --- | --- | --- | --- |"]
    out += [f"| `{k}` | {t.value:g} | {_cell(t.unit)} | {_cell(t.why)} |" for k, t in THRESHOLDS.items()]
    return "\n".join(out) + "\n"


def _cause_section(key: str, e: dict[str, Any]) -> list[str]:
    out = [f"### {_md(e['title'])} {{#{_anchor(key)}}}", "", f"Key `{key}`, kind `{e['kind']}`."]
    adv = e["advice"]
    if adv is not None:
        out += ["", f"- **What it is:** {_md(adv.meaning)}", f"- **Points to:** {_md(adv.points_to)}",
                f"- **Fix:** {_md(adv.fix)}"]
        alt = e.get("advice_on_tc")
        if alt is not None:
            out += [f"- **When the kernel's matrix products already run on tensor cores** (`PRODUCTS_ON_TC_SHARE`), "
                    f"it points to: {_md(alt.points_to)}", f"- **and the fix is:** {_md(alt.fix)}"]
    rules = [r for r in e["rules"] if r["doc"] or r["reads"] or r["thresholds"]]
    if rules:
        out += ["", "**Named by:**", ""]
        for r in rules:
            line = f"- `{r['ref']}`" + (f": {_md(r['doc'])}" if r["doc"] else "")
            if r["reads"]:
                line += " Reads: " + ", ".join(f"`{x}`" for x in r["reads"]) + "."
            if r["thresholds"]:
                line += " Thresholds: " + ", ".join(f"`{t}`" for t in r["thresholds"]) + "."
            out.append(line)
    elif e["rules"]:
        out += ["", "**Named by:** " + ", ".join(f"`{r['ref']}`" for r in e["rules"])]
    if e["fixes"] and adv is None:
        out += ["", "**Fix:**", ""] + [f"- {_md(f)}" for f in e["fixes"]]
    if e["from_terms"]:
        out += ["", "**Said for the gap term:** " + ", ".join(f"[`{t}`](#{_anchor(t)})" for t in e["from_terms"])]
    if e["texts"]:
        out += ["", "**Said with** (the function that words it, and its text):", ""]
        out += [f"- `{ref}`: {_md(text)}" for ref, text in e["texts"]]
    if not e["rules"] and not e["texts"] and adv is None:
        out += ["", "No rule in this version names it (kept in `CAUSES` for bundles and reports that do)."]
    if e["claims"]:
        out += ["", "**In a gap, claims the terms:** " + ", ".join(f"`{c}`" for c in e["claims"])]
    if e["shape_note"]:
        out += ["", "When the fastest variant at a shape has it too, it is said once, as a note about the shape."]
    return out + [""]


# -------------------------------------------------------------------------------- signatures
def signature_entries() -> dict[str, dict[str, Any]]:
    """Per signature family: its title, and the kinds the code tests with their titles, function and constants."""
    from faprof.correctness.signatures import FAMILIES

    out: dict[str, dict[str, Any]] = {f: {"title": t, "kinds": []} for f, t in FAMILIES.items()}
    for module, fn in _module_functions("faprof.correctness.signatures"):
        consts = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]+", n.id)]
        parents = _parents(fn)
        for node in ast.walk(fn):
            # Alt(family, kind, title, ...) / Signature(family, kind, title, ...), or a (family, kind, title, ...)
            # tuple a family collects its alternatives in (faprof/correctness/signatures/layout.py)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("Alt", "Signature") and len(node.args) >= 3):
                args = node.args
            elif (isinstance(node, ast.Tuple) and len(node.elts) >= 3 and isinstance(node.elts[1], ast.Constant)
                  and isinstance(node.elts[1].value, str)):
                args = node.elts
            else:
                continue
            fam = args[0]
            if not (isinstance(fam, ast.Constant) and fam.value in out):
                continue
            kind = _text(args[1]) or "…"
            title = _text(args[2])
            if title is None and isinstance(args[2], ast.Name):
                title = next((t for b in _blocks_up(node, parents) if (t := _assigned_text(b, args[2].id))), "…")
            out[fam.value]["kinds"].append({"kind": kind, "title": title or "…", "ref": f"{module}.{fn.name}",
                                            "doc": _doc(fn), "constants": list(dict.fromkeys(consts))})
    return out


def _constant_notes() -> dict[str, tuple[Any, str]]:
    """Module-level constants of the signatures package: name -> (value, its `#:` comment)."""
    pkg = importlib.import_module("faprof.correctness.signatures")
    notes: dict[str, tuple[Any, str]] = {}
    for m in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"faprof.correctness.signatures.{m.name}")
        src = inspect.getsource(mod)
        for name, val in vars(mod).items():
            if re.fullmatch(r"[A-Z][A-Z0-9_]+", name) and name != "FAMILIES" and isinstance(val, int | float | tuple):
                comment = _comment_above(src, name)
                if comment:
                    notes[name] = (val, comment)
    return notes


@page("reference/signatures.md")
def signatures_page() -> str:
    entries = signature_entries()
    notes = _constant_notes()
    out = ["# Wrong-result signatures", "",
           "Generated at build time from `faprof.correctness.signatures`: the families (`FAMILIES`, in the order "
           "that breaks ties), the specific bugs each tests for (every `Alt(...)` and `Signature(...)` the code "
           "builds, with its title; `…` is filled in from the case), the function that tests it and the "
           "constants it decides with. A signature is tested only on wrong outputs and reported when it "
           "explains at least `MIN_SHARE` of the wrong rows; the best one is the row's `bug_signature`. "
           "How to read them: [Why a kernel is wrong](../tutorials/wrong-kernel.md).", ""]
    for fam, e in entries.items():
        out += [f"## {_md(e['title'])} {{#{_anchor(fam)}}}", "", f"Family `{fam}`.", ""]
        by_ref: dict[str, list[dict[str, Any]]] = {}
        for k in e["kinds"]:
            by_ref.setdefault(k["ref"], []).append(k)
        for ref, kinds in by_ref.items():
            doc = kinds[0]["doc"]
            out.append(f"**`{ref}`**" + (f": {_md(doc)}" if doc else ""))
            out.append("")
            out += [f"- `{k['kind']}`: {_md(k['title'])}" for k in kinds]
            consts = [c for c in kinds[0]["constants"] if c in notes]
            if consts:
                out += ["", "Decides with: " + "; ".join(f"`{c}` = `{notes[c][0]!r}` ({_md(notes[c][1])})" for c in consts)]
            out.append("")
        if not e["kinds"]:
            out += ["No test in the code builds this family yet.", ""]
    out += ["## Constants", "", "| constant | value | why |", "| --- | --- | --- |"]
    out += [f"| `{n}` | `{v!r}` | {_cell(c)} |" for n, (v, c) in notes.items()]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------ bundle
def table_columns() -> dict[str, tuple[str, ...]]:
    """Each bundle table's columns, from the module that writes it."""
    out = {}
    for table, where in TABLE_COLUMNS.items():
        mod, name = where.split(":")
        out[table] = tuple(getattr(importlib.import_module(mod), name))
    return out


def _unit(col: str, label: str) -> str:
    m = re.search(r"\(([^)]*)\)\s*$", label)
    if m and label != col and len(m.group(1).split()) <= 2 and " or " not in m.group(1):
        return m.group(1)  # "median latency (ms)"; not "bound (compute or memory)"
    for suffix, unit in UNIT_SUFFIXES:
        if col.endswith(suffix) or col == suffix.lstrip("_"):
            return unit
    return ""


def _example_types() -> dict[str, dict[str, str]]:
    """Arrow types of each table's columns in the newest committed bundle that holds the table."""
    import pyarrow.parquet as pq

    from faprof.model import schema

    found: dict[str, dict[str, str]] = {}
    folders = [p.parent for base in ("examples/runs", "tests/data") for p in (ROOT / base).rglob("manifest.json")]
    folders.sort(key=lambda f: f.name, reverse=True)  # run ids start with their UTC time: newest first
    for folder in folders:
        for table in schema.TABLES:
            f = folder / f"{table}.parquet"
            if table not in found and f.exists():
                found[table] = {fld.name: str(fld.type) for fld in pq.read_schema(f)}
                found[table]["@bundle"] = str(folder.relative_to(ROOT))
        if len(found) == len(schema.TABLES):
            break
    return found


@page("reference/bundle.md")
def bundle_page() -> str:
    from faprof import store
    from faprof.analysis.labels import LABELS
    from faprof.model import schema

    cols = table_columns()
    types = _example_types()
    out = ["# Run bundle format", "",
           "Generated at build time from `faprof.model.schema` (tables, row columns, statuses) and the column "
           "tuples of the modules that write each table; types are those of the newest committed bundle that "
           "holds the table, labels and units those the dashboard and reports use (`faprof.analysis.labels`), "
           "else the unit the column name ends in.", "",
           f"A bundle is a folder `runs/<UTC time>_<gpu>_<scenario>/` with `{store.MANIFEST}` (environment, "
           f"settings, the scenario as run), one parquet file per table, `{store.ROWS_DIR}/` (rows written as "
           "they finish, folded into `measurements.parquet` at the end, on Ctrl-C and on `--resume`) and "
           "`raw/` (tool output: ncu reports, nsys captures, sanitizer logs). Schema version "
           f"{store.SCHEMA_VERSION}. `faprof export RUN --csv DIR` writes every table as CSV.", "",
           "Row statuses: " + ", ".join(f"`{s}`" for s in schema.STATUSES) + "; rows whose timings are results: "
           + ", ".join(f"`{s}`" for s in schema.TIMED) + " (an `untrusted` row keeps its figures for the record: "
           "its time is above what the GPU can do, see [Timing that cannot be gamed](../measure/timing-integrity.md)).", "",
           "| table | written by | columns |", "| --- | --- | --- |"]
    producers = {"measurements": "`faprof profile` (the harness)"}
    producers.update({t: "the Nsight Compute stage (`--ncu`, `faprof ncu`)" for t in schema.NCU_TABLES})
    producers.update({t: "the Nsight Systems stage (`--nsys`)" for t in schema.NSYS_TABLES})
    producers.update({"error_maps": "the correctness check (wrong rows)", "sanitizer": "`faprof sanitize`"})
    for table in schema.TABLES:
        out.append(f"| [`{table}`](#{_anchor(table)}) | {producers.get(table, '')} | {len(cols.get(table, ()))} |")
    for table in schema.TABLES:
        where = TABLE_COLUMNS.get(table, "?")
        ex = types.get(table, {})
        out += ["", f"## {table} {{#{_anchor(table)}}}", "",
                f"`{table}.parquet`; columns from `{where.replace(':', '.')}`"
                + (f"; types from `{ex['@bundle']}`." if ex else "; no committed bundle holds it yet."), "",
                "| column | label | unit | type |", "| --- | --- | --- | --- |"]
        for c in cols.get(table, ()):
            label = LABELS.get(c, "")
            out.append(f"| `{c}` | {_cell(label)} | {_cell(_unit(c, label or c))} | {ex.get(c, '')} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------- scenarios
#: A hand-written page that holds this marker gets the table of every scenario in its place.
SCENARIOS_MARKER = "<!-- faprof:scenarios -->"


def scenarios_table() -> str:
    """Every scenario faprof ships (`faprof list scenarios`): name, problems, baseline, description."""
    import faprof.variants  # noqa: F401  (scenarios name variants: the registry must be filled)
    from faprof.errors import FaprofError
    from faprof.model.scenarios import list_scenarios, load_scenario

    out = ["| scenario | problems | baseline | description |", "| --- | --- | --- | --- |"]
    for name in list_scenarios():
        try:
            sc = load_scenario(name)
            out.append(f"| `{name}` | {len(sc.problems)} | `{sc.baseline}` | {_cell(sc.description)} |")
        except FaprofError as e:
            out.append(f"| `{name}` | | | invalid: {_cell(e)} |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ stages
#: A hand-written page that holds this marker gets the stage diagram and table drawn from the code
#: (scripts/analysis/stage_graph.py: the import contract's layers and every module's real imports).
STAGES_MARKER = "<!-- faprof:stages -->"


def stages_markdown() -> str:
    """scripts/analysis/stage_graph.py's `stages_markdown()` (loaded by path: scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("faprof_stage_graph", ROOT / "scripts" / "analysis" / "stage_graph.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.stages_markdown(ROOT)


# ------------------------------------------------------------------------------------- hooks
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the generated tables into hand-written pages that ask for them."""
    if SCENARIOS_MARKER in markdown:
        markdown = markdown.replace(SCENARIOS_MARKER, scenarios_table())
    if STAGES_MARKER in markdown:
        markdown = markdown.replace(STAGES_MARKER, stages_markdown())
    return markdown


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site's files (MkDocs calls this before it builds the nav)."""
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files


def write_all(dest: Path) -> list[Path]:
    """Write the generated pages under `dest` (for reading them without a build)."""
    written = []
    for path, make in PAGES.items():
        f = dest / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(make(), encoding="utf-8")
        written.append(f)
    return written


if __name__ == "__main__":
    import sys

    for p in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/faprof-docs-generated")):
        print(p)
