"""The source tree holds no merge leftovers: no `*.orig` or `*.rej` file (a resolved conflict's backup,
a patch's rejected hunks), tracked or untracked-but-not-ignored. One was committed once
(faprof/cli/inspect.py.orig) and would have shipped in an sdist.

Method: `git ls-files --cached --others --exclude-standard` on the two patterns, in a git checkout; outside
one (an unpacked sdist), every file under the tree but hidden folders.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What merge and patch tools leave behind.
LEFTOVER_PATTERNS = ("*.orig", "*.rej")


def _leftovers(root: Path) -> list[str]:
    git = shutil.which("git")
    if git is not None and (root / ".git").exists():
        r = subprocess.run([git, "ls-files", "--cached", "--others", "--exclude-standard", "--", *LEFTOVER_PATTERNS],
                           cwd=root, capture_output=True, text=True, timeout=60, check=True)
        return [ln for ln in r.stdout.splitlines() if (root / ln).exists()]  # tracked but deleted in the tree: gone
    return sorted(str(p.relative_to(root)) for pat in LEFTOVER_PATTERNS for p in root.rglob(pat)
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


def test_no_merge_leftovers_in_the_tree():
    assert _leftovers(ROOT) == [], "merge leftovers in the tree: delete them (git rm), they are not source"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_check_sees_untracked_leftovers_and_skips_ignored_ones(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    (tmp_path / ".gitignore").write_text("build/\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py.orig").write_text("")
    (tmp_path / "fix.rej").write_text("")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "old.py.orig").write_text("")
    assert sorted(_leftovers(tmp_path)) == ["fix.rej", "pkg/mod.py.orig"]
