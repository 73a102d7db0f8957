"""The documentation against the code: every command, advisor cause, signature family, bundle table and
dashboard page has its entry, and every `faprof ...` line the docs tell a user to type parses.

The expected sets come from the code (the click group, `faprof.advisor.CAUSES`,
`faprof.correctness.signatures.FAMILIES`, `faprof.model.schema.TABLES`, the browser test's `PAGES`), so a
command, cause, family, table or page added without its documentation fails here. The site itself is
built with `mkdocs build --strict` by scripts/test.sh (links and anchors checked there).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: The README is a landing page: at most this many lines (issue 35: "at most ~200").
README_MAX_LINES = 200


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hooks():
    return _load("faprof_mkdocs_hooks_for_test", ROOT / "scripts" / "mkdocs_hooks.py")


def _commands(group: click.Group, prefix: str = "faprof") -> dict[str, click.Command]:
    """Every command under the group, by its full name ('faprof profile'), nested groups included."""
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        full = f"{prefix} {name}"
        out[full] = cmd
        if isinstance(cmd, click.Group):
            out.update(_commands(cmd, full))
    return out


def test_every_command_has_an_entry_in_the_command_reference():
    """docs/reference/cli.md rendered as MkDocs renders it (the mkdocs-click extension): a heading per command."""
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("mkdocs_click")
    from faprof.cli import main

    html = markdown.markdown((DOCS / "reference" / "cli.md").read_text(encoding="utf-8"),
                             extensions=["attr_list", "tables", "mkdocs-click"])
    headings = {re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", html)}
    expected = {name for name, cmd in _commands(main).items() if not cmd.hidden}
    assert expected, "no commands found on faprof.cli.main"
    missing = sorted(expected - headings)
    assert not missing, f"commands without an entry in docs/reference/cli.md: {missing}"


def test_every_advisor_cause_has_a_catalogue_entry_with_its_fix(hooks):
    from faprof.advisor import CAUSES

    page = hooks.causes_page()
    entries = hooks.cause_entries()
    missing = [k for k in CAUSES if f"{{#{hooks._anchor(k)}}}" not in page or f"Key `{k}`" not in page]
    assert not missing, f"advisor causes without an entry in reference/causes.md: {missing}"
    # a cause that costs time and can be acted on says what to do about it
    no_fix = [k for k, e in entries.items() if e["kind"] in ("defect", "limit", "position")
              and not (e["fixes"] or e["texts"] or e["advice"])]
    assert not no_fix, (f"causes whose fix the catalogue cannot find: {no_fix}; give the rule a `fix = \"...\"` "
                        "string (or an Advice in the ncu catalogue) that scripts/mkdocs_hooks.py can read")
    terms = [k for k in CAUSES if k.startswith(("stall:", "pipe:"))]
    assert terms and all(entries[k]["advice"] is not None for k in terms)


def test_every_threshold_is_in_the_catalogue_with_its_value_and_unit(hooks):
    """The thresholds table the docs show is THRESHOLDS itself (it was a hand copy in the README)."""
    from faprof.advisor import THRESHOLDS

    page = hooks.causes_page()
    missing = [k for k, t in THRESHOLDS.items() if f"| `{k}` | {t.value:g} | {hooks._cell(t.unit)} |" not in page]
    assert missing == []


def test_every_signature_family_has_an_entry_and_a_test_that_builds_it(hooks):
    from faprof.correctness.signatures import FAMILIES

    page = hooks.signatures_page()
    entries = hooks.signature_entries()
    assert [f for f in FAMILIES if f"{{#{hooks._anchor(f)}}}" not in page] == []
    unbuilt = [f for f, e in entries.items() if not e["kinds"]]
    assert not unbuilt, f"signature families no Alt(...)/Signature(...) in faprof.correctness.signatures builds: {unbuilt}"
    # the specific bugs the README and the tutorials name are found in the code
    kinds = {k["kind"] for e in entries.values() for k in e["kinds"]}
    assert {"mask_missing", "mask_shift_plus", "norm_missing", "slice_copy", "race"} <= kinds


def test_every_bundle_table_and_column_is_in_the_format_page(hooks):
    from faprof.model import schema

    assert set(hooks.TABLE_COLUMNS) == set(schema.TABLES), (
        "scripts/mkdocs_hooks.py TABLE_COLUMNS must name the column tuple of every bundle table")
    page = hooks.bundle_page()
    cols = hooks.table_columns()
    assert set(schema.ROW_COLUMNS) == set(cols["measurements"])
    missing = [(t, c) for t in schema.TABLES for c in cols[t] if f"| `{c}` |" not in page.split(f"## {t} ")[1]]
    assert not missing, missing


def test_every_scenario_is_in_the_scenarios_page(hooks):
    from faprof.model.scenarios import list_scenarios

    page = (DOCS / "guide" / "scenarios.md").read_text(encoding="utf-8")
    assert hooks.SCENARIOS_MARKER in page
    table = hooks.scenarios_table()
    names = list_scenarios()
    assert names and [n for n in names if f"| `{n}` |" not in table] == []
    assert "invalid:" not in table, table


def test_every_dashboard_page_has_its_screenshot_in_the_docs():
    browser = _load("faprof_app_browser_for_docs", ROOT / "tests" / "test_app_browser.py")
    guide = (DOCS / "guide" / "dashboard.md").read_text(encoding="utf-8")
    for path in browser.PAGES:
        name = browser.shot_name(path)
        assert (browser.DOCS_SHOTS / name).is_file(), (
            f"docs/img/dashboard/{name} is missing: FAPROF_DOCS_SHOTS=1 pytest tests/test_app_browser.py -k every_page")
        assert f"img/dashboard/{name}" in guide, f"docs/guide/dashboard.md does not show {name}"


# ------------------------------------------------------------------ commands the docs tell users to type
def _bash_lines(text: str) -> list[str]:
    """The logical lines of the ```bash blocks of a Markdown text (continuations joined)."""
    out: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        out += block.replace("\\\n", " ").splitlines()
    return out


def _faprof_commands(text: str) -> list[list[str]]:
    """The argument lists of every `faprof ...` command in the bash blocks (env assignments and
    the `&&` chain's other commands dropped)."""
    out = []
    for line in _bash_lines(text):
        for part in re.split(r"&&|\|\||;|\|", line):
            words = shlex.split(part, comments=True)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words = words[1:]
            if words[:1] == ["faprof"]:
                out.append(words[1:])
    return out


def _doc_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def test_the_docs_tell_users_to_type_faprof_commands():
    found = sum(len(_faprof_commands(p.read_text(encoding="utf-8"))) for p in _doc_files())
    assert found >= 20, found  # the tutorials hold dozens; a parser that finds none would pass the next test


def _parse(group: click.Group, args: list[str]) -> None:
    """Parse `faprof ARGS` as click would run it, without running it (UsageError when it would not parse)."""
    if not args or args[0].startswith("-"):
        return  # `faprof --help`, `faprof --version`
    cmd = group.get_command(click.Context(group), args[0])
    if cmd is None:
        raise click.UsageError(f"no such command {args[0]!r}")
    cmd.make_context(args[0], list(args[1:]))


def test_every_faprof_command_in_the_docs_parses():
    """Each `faprof ...` line parses against the click command it names: the command exists, every
    option exists and takes the value given; a path that does not exist here is not an error."""
    from faprof.cli import main

    bad = []
    for path in _doc_files():
        for args in _faprof_commands(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}: faprof {' '.join(args)}"
            try:
                _parse(main, args)
            except click.exceptions.Exit:
                pass
            except click.BadParameter as e:
                if not re.search(r"does not exist|File '|Directory '|Path '", e.format_message()):
                    bad.append(f"{where}: {e.format_message()}")
            except click.UsageError as e:
                bad.append(f"{where}: {e.format_message()}")
    assert not bad, "\n".join(bad)


def test_a_broken_command_line_is_caught():
    """The check above fails on a renamed option and an unknown command (it is not vacuous)."""
    from faprof.cli import main

    for args in (["profile", "--scenarioo", "smoke"], ["profil", "--scenario", "smoke"], ["explain"]):
        with pytest.raises(click.UsageError):
            _parse(main, args)
    _parse(main, ["explain", "runs/x", "--against", "sdpa_cudnn"])  # and passes a good one


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    first = re.search(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    assert first is not None
    lines = [ln for ln in first.group(1).splitlines() if ln.strip()]
    assert lines[0].startswith("bash scripts/setup.sh && faprof profile --scenario")
    assert lines[1].startswith("bash scripts/test.sh")
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # the README points into the docs, at pages that exist
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links and all((ROOT / link).is_file() for link in links), links


#: Internal history a reader cannot look up: "issue 28", "faprof issue 27", "the issue's bar".
INTERNAL_HISTORY = re.compile(r"\b(?:issues? #?\d+|issue's|the issue that)", re.IGNORECASE)


def test_user_facing_text_names_no_internal_issue():
    """Docs, the README, scenario files and faprof's and the dashboard's code say what is meant, not
    which internal issue asked for it (scripts/ and tests/ are the developers' and may)."""
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "scenarios").glob("*.toml"),
             *(ROOT / "faprof").rglob("*.py"), *(ROOT / "app").rglob("*.py")]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p in files
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if INTERNAL_HISTORY.search(line)]
    assert not hits, "\n".join(hits)
