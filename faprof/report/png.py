"""PNG charts for the Markdown report: find the browser kaleido would start, then render through kaleido
in a child process under a time limit, so the report never waits on a browser that is missing or never
answers.

Why a child process: kaleido 1.x renders in a browser it drives from a thread; when the browser cannot
start, its sync server thread dies and the caller waits on a queue forever, and a hung server thread
also blocks interpreter exit (kaleido joins it at exit). A process can be stopped, and its browser with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Browser start-up plus the page's plotly.js: ~2 s for Debian's chromium on an idle 2-core machine;
#: 30 s leaves room for a loaded CI machine or a cold container, and no more: past it the browser is not coming.
START_LIMIT_S = 30.0

#: Added per chart: one 960 x 440 figure renders in well under a second once the browser is up.
PER_CHART_LIMIT_S = 5.0

#: After SIGTERM, the time the child gets to close the browser it started before it is killed.
STOP_GRACE_S = 5.0

#: The browsers kaleido's choreographer looks for on PATH, in its order (used only if its own lookup
#: cannot be called, e.g. a choreographer whose API moved).
BROWSER_NAMES = ("chrome", "google-chrome", "google-chrome-stable", "chromium", "chromium-browser",
                 "msedge", "microsoft-edge", "brave", "brave-browser", "vivaldi")

NO_KALEIDO = "PNG charts need kaleido (pip install 'faprof[report]')"
NO_BROWSER = ("PNG charts need Chrome or Chromium for kaleido and none was found (its download, BROWSER_PATH, "
              "PATH, /usr/bin): install one (apt-get install chromium, or kaleido_get_chrome)")


def find_browser() -> str | None:
    """The Chrome/Chromium kaleido would start, or None: looked up the way kaleido's choreographer does.

    choreographer (kaleido 1.x) takes, in order: its own download (`kaleido_get_chrome`, under the user
    data folder, so XDG_DATA_HOME on Linux), BROWSER_PATH when set (whatever it names), the Chrome,
    Chromium, Edge, Brave and Vivaldi names on PATH, their usual install paths (/usr/bin/chromium, ...).
    A path that is not an executable file is no browser: kaleido raises ChromeNotFoundError there.
    """
    try:
        from choreographer.browsers.chromium import Chromium

        # skip_local as kaleido's Chromium sets it: only with the sandbox on, which kaleido leaves off
        path = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - no choreographer, or its API moved: BROWSER_PATH, then PATH
        path = os.environ.get("BROWSER_PATH") or next(filter(None, map(shutil.which, BROWSER_NAMES)), None)
    if not path or not Path(path).is_file() or not os.access(path, os.X_OK):
        return None
    return str(path)


def kaleido_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("kaleido") is not None


def limit_s(n_charts: int) -> float:
    """The time the child gets for `n_charts` charts, start-up included."""
    return START_LIMIT_S + PER_CHART_LIMIT_S * n_charts


def png_images(charts: list[Any], limit: float | None = None) -> tuple[dict[str, bytes] | None, str]:
    """PNG bytes per chart name through kaleido, or (None, why not) at once when kaleido or a browser is
    missing, or (None, why not) after `limit` seconds (default `limit_s(len(charts))`) when it hangs.

    Args:
        charts: `faprof.report.charts.Chart`s (a name, a plotly figure with its layout's width and height).
    """
    if not charts:
        return {}, ""
    if not kaleido_installed():
        return None, NO_KALEIDO
    browser = find_browser()
    if browser is None:
        return None, NO_BROWSER
    spec = {"browser": browser, "charts": [
        {"name": c.name, "figure": c.figure.to_json(), "width": c.figure.layout.width,
         "height": c.figure.layout.height} for c in charts]}
    return _render(spec, limit_s(len(charts)) if limit is None else limit)


#: A Unix socket's path holds at most 107 bytes (sun_path), and Chromium binds its SingletonSocket at
#: $TMPDIR/org.chromium.Chromium.XXXXXX/SingletonSocket: under a longer temporary folder it dies at start
#: ("Socket path too long"; seen with a 110-character TMPDIR).
SOCKET_PATH_MAX = 107
CHROMIUM_SOCKET_TAIL = len("/org.chromium.Chromium.XXXXXX/SingletonSocket")

#: Short temporary folders a browser gets instead, the first that exists and is writable.
SHORT_TMPDIRS = ("/tmp", "/var/tmp", "/dev/shm")


def browser_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this environment) for starting Chromium: TMPDIR moved to a short folder when the
    temporary folder is too long for Chromium's socket path, unchanged otherwise."""
    env = dict(os.environ if env is None else env)
    tmp = env.get("TMPDIR") or tempfile.gettempdir()
    if len(os.fsencode(tmp)) + CHROMIUM_SOCKET_TAIL <= SOCKET_PATH_MAX:
        return env
    for short in SHORT_TMPDIRS:
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
            env["TMPDIR"] = short
            break
    return env


def _child_env() -> dict[str, str]:
    """This environment with this interpreter's module path, so the child imports what this process does;
    TMPDIR short enough for the browser it starts (`browser_env`)."""
    env = browser_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    return env


def _render(spec: dict[str, Any], limit: float) -> tuple[dict[str, bytes] | None, str]:
    with tempfile.TemporaryDirectory(prefix="faprof-png-") as tmp:
        argv = [sys.executable, "-m", "faprof.report.png_worker", tmp]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=_child_env(), start_new_session=True)
        try:
            _, err = proc.communicate(json.dumps(spec), timeout=limit)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return None, (f"PNG charts stopped after {limit:g} s: kaleido with {spec['browser']} did not "
                          "answer in time")
        if proc.returncode != 0:
            last = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200]
            return None, f"PNG charts could not be rendered ({last})"
        out = {c["name"]: (Path(tmp) / f"{c['name']}.png").read_bytes() for c in spec["charts"]}
    return out, ""


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the child closes its browser), then SIGKILL to its process group after STOP_GRACE_S."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
