"""The Markdown report's PNG charts never hang the report (issue 34): kaleido is asked for images only when
the browser it would start exists, and every kaleido call runs in a child process under a time limit.

Method: `faprof report` (the CLI, in a subprocess limited to NO_BROWSER_LIMIT_S) on the committed l4_causal
H100 bundle with kaleido installed and no browser it can find (PATH, BROWSER_PATH and the user data folder
of kaleido's own download pointed at empty places; checked by constructing a `kaleido.Kaleido`, which
raises ChromeNotFoundError then): the report is written at once, its charts are links into report.html,
and one line says why. `find_browser` agrees with the browser kaleido itself picks under the same
environments. A fake browser that never answers is stopped at the time limit, and killed. With Debian's
chromium (`browser` mark), the report's charts are PNG files.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faprof.report import png, writer
from faprof.store import Bundle

pytest.importorskip("plotly")
pytest.importorskip("kaleido")

ROOT = Path(__file__).resolve().parent.parent
L4_H100 = ROOT / "examples" / "runs" / "20261123T053932Z_nvidia-h100-80gb-hbm3_l4-causal"
L4_SMALL = ROOT / "tests" / "data" / "bundles" / "20261121T192510Z_nvidia-h100-80gb-hbm3_l4-causal"  # one chart

#: The issue's bound for `faprof report` without a browser (it hung forever); it takes ~3 s here.
NO_BROWSER_LIMIT_S = 60

#: A `faprof report` with chromium rendering 2 PNGs takes ~6 s on an idle 2-core machine.
WITH_BROWSER_LIMIT_S = 120

#: The fake browser's time limit in the hang test: long enough for the child to import kaleido and start
#: the fake browser on a loaded machine (so its kill is checked), short enough for a fast test.
FAKE_LIMIT_S = 4.0

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _no_browser_env(tmp_path: Path) -> dict[str, str]:
    """This environment with every place kaleido looks for a browser pointed at nothing."""
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(PATH=str(empty), BROWSER_PATH=str(tmp_path / "no-browser-here"), XDG_DATA_HOME=str(tmp_path / "data"),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return env


def _kaleido_finds_a_browser(env: dict[str, str]) -> bool:
    code = ("import sys, kaleido\nfrom kaleido.errors import ChromeNotFoundError\n"
            "try:\n    kaleido.Kaleido()\nexcept ChromeNotFoundError:\n    sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 3), r.stderr[-2000:]
    return r.returncode == 0


def _faprof_report(env: dict[str, str], out: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "faprof", "report", str(L4_H100), "--out", str(out)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r, time.monotonic() - t0


def test_report_without_a_browser_is_written_at_once_with_links_to_the_html(tmp_path):
    env = _no_browser_env(tmp_path)
    if _kaleido_finds_a_browser(env):
        pytest.skip("kaleido still finds a browser here (its own download inside the choreographer package?)")
    out = tmp_path / "rep"
    r, _ = _faprof_report(env, out, NO_BROWSER_LIMIT_S)  # a hang fails here: TimeoutExpired
    assert {p.name for p in out.iterdir()} >= {"report.md", "appendix.md", "report.html", "csv"}
    assert not (out / "charts").exists()
    notes = [ln for ln in r.stdout.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "need Chrome or Chromium" in notes[0] and "links each chart to report.html" in notes[0]
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    links = [ln for ln in md.splitlines() if "](report.html#chart-" in ln]
    assert len(links) == 2, md  # the two blocks' charts, each a link to its div in report.html
    for ln in links:
        assert f'id="{ln.split("#", 1)[1].rstrip(")")}"' in html


def test_find_browser_picks_what_kaleido_picks(tmp_path, monkeypatch):
    import kaleido
    from kaleido.errors import ChromeNotFoundError

    fake = tmp_path / "bin" / "chrome"  # the first name choreographer looks for on PATH
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    if png.find_browser() != str(fake):
        pytest.skip(f"kaleido's own browser download is present ({png.find_browser()}): it comes before PATH")
    assert kaleido.Kaleido()._browser_impl.path == str(fake)
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "missing"))  # set: kaleido takes it, and finds nothing there
    assert png.find_browser() is None
    with pytest.raises(ChromeNotFoundError):
        kaleido.Kaleido()
    monkeypatch.setenv("BROWSER_PATH", str(fake))
    assert png.find_browser() == str(fake) == kaleido.Kaleido()._browser_impl.path


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_a_browser_that_never_answers_is_stopped_at_the_limit_and_killed(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    fake = tmp_path / "chrome"
    fake.write_text(f"#!/bin/sh\necho $$ >> '{pids}'\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(fake))
    charts = writer.build_charts(writer.read_run(Bundle(L4_SMALL)))
    t0 = time.monotonic()
    images, why = png.png_images(charts, limit=FAKE_LIMIT_S)
    took = time.monotonic() - t0
    assert images is None and f"stopped after {FAKE_LIMIT_S:g} s" in why and str(fake) in why
    assert took < FAKE_LIMIT_S + png.STOP_GRACE_S + 5, took
    started = [int(x) for x in pids.read_text().split()] if pids.exists() else []
    time.sleep(0.5)  # SIGKILL is delivered at once; the state in /proc follows
    assert not [p for p in started if _alive(p)], started


def test_a_browser_gets_a_short_tmpdir_when_the_temporary_folder_is_too_long_for_its_socket():
    """Chromium binds $TMPDIR/org.chromium.Chromium.XXXXXX/SingletonSocket, at most 107 bytes: under a
    longer TMPDIR it dies at start ("Socket path too long"), so its TMPDIR moves to a short folder."""
    long_tmp = "/tmp/" + "a long folder name " * 5
    assert len(long_tmp) + png.CHROMIUM_SOCKET_TAIL > png.SOCKET_PATH_MAX
    env = png.browser_env({"TMPDIR": long_tmp, "KEEP": "1"})
    assert env["TMPDIR"] in png.SHORT_TMPDIRS and env["KEEP"] == "1"
    assert len(env["TMPDIR"]) + png.CHROMIUM_SOCKET_TAIL <= png.SOCKET_PATH_MAX
    assert png.browser_env({"TMPDIR": "/tmp/short"})["TMPDIR"] == "/tmp/short"


@pytest.mark.browser
def test_report_with_chromium_has_png_charts(tmp_path):
    if png.find_browser() is None:
        pytest.skip("no Chrome/Chromium for kaleido (apt-get install chromium, or scripts/setup.sh)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = tmp_path / "rep"
    r, _ = _faprof_report(env, out, WITH_BROWSER_LIMIT_S)
    pngs = sorted((out / "charts").glob("*.png"))
    assert len(pngs) == 2 and all(p.read_bytes()[:8] == PNG_MAGIC for p in pngs), r.stdout
    md = (out / "report.md").read_text()
    assert all(f"](charts/{p.name})" in md for p in pngs)
    assert "note:" not in r.stdout
