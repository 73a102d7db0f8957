"""The dashboard in a real browser: Debian's headless Chromium, driven by playwright, opens every page.

Method: start `streamlit run app/dashboard.py -- tests/data/bundles` on a free loopback port, wait
for its health endpoint, then for each page wait (bounded) until its title and either a rendered
plotly chart or the page's "no data, run this" hint is on screen and the script has stopped
running; fail on any Streamlit exception box or error alert, and on any chart whose tick labels
overlap, run past the chart's edge, or whose legend entries are cut off (measured on the drawn SVG:
plotly's automargin and angled ticks must have made room). The server is killed at the end.
Screenshots of every page (1400x900 viewport, grown to the page's height) go to $FAPROF_SHOTS when it
is set, for looking at them by eye (none are taken otherwise: they assert nothing, and growing the
window, redrawing and capturing seven tall pages costs a 2-core CI machine seconds each). With FAPROF_DOCS_SHOTS=1 the
first screen of each page (1400x900, scaled to 1050 px wide, 128 colours) is also written to
docs/img/dashboard/<page>.png, the screenshots the documentation shows (tests/test_docs.py checks
there is one per page).

Skips, with the reason, when chromium or playwright is missing (CI installs chromium through
scripts/setup.sh). Never runs `playwright install`: the browser is the system's.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from faprof import analysis as fd
from faprof.report.png import browser_env

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = ROOT / "tests" / "data" / "bundles"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

SERVER_START_S = 90
"""Streamlit's first start imports pandas, plotly and torch-free faprof: seconds, more on a busy CI."""

PAGE_LOAD_S = 60
"""A page's script (loading bundles on the first one) and plotly's first draw, on a 2-core machine."""

#: url path -> (title, whether the fixture bundles give this page a chart; None: decide from the data).
#: A deep link comes first: the first session of a fresh server opening /variants is the case where
#: Streamlit, seeing app/pages/, would run the page without the entry file (faprof_ui.context).
PAGES: dict[str, tuple[str, bool | None]] = {
    "variants": ("Variants", True),
    "": ("faprof dashboard", True),
    "gpus": ("GPUs", True),
    "ncu": ("Nsight Compute", None),
    "timeline": ("Timeline", None),
    "diff": ("Diff", True),
    "wrong": ("Wrong results", False),
}

DOCS_SHOTS = ROOT / "docs" / "img" / "dashboard"
DOCS_SHOT_WIDTH = 1050
"""Width of the documentation's screenshots: readable in the docs' content column, a few dozen KB each."""

CHART = ".js-plotly-plot, [data-testid=stPlotlyChart]"
VIEWPORT = {"width": 1400, "height": 900}

#: Finds what a reader would see as broken in every drawn plotly chart: tick labels of one axis that
#: overlap, tick labels past the chart's edge, legend entries outside the chart or outside the
#: legend's own box (cut off). One message per problem.
GEOMETRY_JS = """
() => {
  const out = [];
  const cut = (r, b) => r.left < b.left - 1 || r.right > b.right + 1 || r.top < b.top - 1 || r.bottom > b.bottom + 1;
  const hit = (r, s) => r.left < s.right - 1 && s.left < r.right - 1 && r.top < s.bottom - 1 && s.top < r.bottom - 1;
  document.querySelectorAll('.js-plotly-plot').forEach((plot, i) => {
    const svg = plot.querySelector('.main-svg');
    if (!svg) return;
    const box = svg.getBoundingClientRect();
    const name = ((plot.querySelector('.gtitle') || {}).textContent || `chart ${i + 1}`).slice(0, 60);
    plot.querySelectorAll('.xaxislayer-above, .yaxislayer-above').forEach(layer => {
      const labels = [...layer.querySelectorAll('text')].filter(t => t.textContent.trim())
        .map(t => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0);
      for (let a = 0; a < labels.length; a++) {
        if (cut(labels[a][1], box)) out.push(`${name}: tick label '${labels[a][0]}' runs past the chart's edge`);
        for (let b = a + 1; b < labels.length; b++)
          if (hit(labels[a][1], labels[b][1])) out.push(`${name}: tick labels '${labels[a][0]}' and '${labels[b][0]}' overlap`);
      }
    });
    const legend = plot.querySelector('.legend');
    if (legend) {
      const bg = (legend.querySelector('.bg') || legend).getBoundingClientRect();
      legend.querySelectorAll('.traces').forEach(tr => {
        const r = tr.getBoundingClientRect();
        if (r.width && (cut(r, box) || cut(r, bg))) out.push(`${name}: legend entry '${tr.textContent}' is cut off`);
      });
    }
  });
  return out;
}
"""
ERRORS = "[data-testid=stException], [data-testid=stAlertContentError]"


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install 'faprof[dev]')")
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium, or FAPROF_INSTALL_BROWSER=1 bash scripts/setup.sh)")
    try:
        import streamlit  # noqa: F401
    except ImportError:
        pytest.skip("streamlit is not installed (pip install 'faprof[app]')")
    return sync_playwright


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    _playwright()
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("FAPROF_RUNS", None)  # only the folder on the command line, as a user would start it
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "dashboard.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none", "--", str(BUNDLES)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_S
    try:
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                pytest.fail(f"streamlit exited with {proc.returncode}:\n{out[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not answer on {base} within {SERVER_START_S} s")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def _expects_chart(path: str, has_chart: bool | None) -> bool:
    if has_chart is not None:
        return has_chart
    runs = fd.load_runs([(BUNDLES, "command line"), (fd.EXAMPLES_DIR, "example")])
    names = ("ncu_summary", "stalls", "roofline") if path == "ncu" else ("nsys_kernels", "nsys_summary")
    return any(not runs.table(n).empty for n in names)


def shot_name(path: str) -> str:
    """The file name of a page's screenshot ('' is the overview)."""
    return f"{path or 'overview'}.png"


def _docs_shot(page, path: str) -> None:
    """The first screen of the page, small, into docs/img/dashboard/ (FAPROF_DOCS_SHOTS=1 only)."""
    from PIL import Image

    img = Image.open(io.BytesIO(page.screenshot(full_page=False))).convert("RGB")
    img = img.resize((DOCS_SHOT_WIDTH, round(img.height * DOCS_SHOT_WIDTH / img.width)), Image.LANCZOS)
    DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
    img.quantize(colors=128).save(DOCS_SHOTS / shot_name(path), optimize=True)


def _full_shot(page, file: Path) -> None:
    """The whole page: the window grown to its height (charts redraw at that size), then back."""
    height = page.evaluate("() => (document.querySelector('[data-testid=stMainBlockContainer]')"
                           " || document.body).scrollHeight")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": min(max(900, int(height) + 120), 8000)})
    page.wait_for_timeout(800)
    page.screenshot(path=str(file), full_page=True)
    page.set_viewport_size(VIEWPORT)


def _wait_idle(page, timeout_s: float) -> None:
    """Until Streamlit's 'running' indicator has been gone for a moment (the script finished)."""
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        running = page.locator("[data-testid=stStatusWidgetRunningIcon], [data-testid=stStatusWidgetRunningManIcon]").count()
        if running:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            return
        page.wait_for_timeout(200)


def test_every_page_renders_in_chromium(server):
    sync_playwright = _playwright()
    shots = os.environ.get("FAPROF_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                    args=CHROMIUM_ARGS, timeout=60_000, env=browser_env())
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(PAGE_LOAD_S * 1000)
            for path, (title, has_chart) in PAGES.items():
                page.goto(f"{server}/{path}", wait_until="domcontentloaded")
                page.locator("h1").filter(has_text=title).first.wait_for(state="visible")
                if _expects_chart(path, has_chart):
                    page.locator(CHART).first.wait_for(state="visible")
                    page.locator(".js-plotly-plot .main-svg").first.wait_for(state="attached")
                else:
                    page.locator("[data-testid=stAlertContainer]").filter(has_text="faprof profile").first.wait_for(
                        state="visible")
                _wait_idle(page, PAGE_LOAD_S)
                nav = " ".join(page.locator("[data-testid=stSidebarNav]").all_inner_texts())
                if "Nsight Compute" not in nav:
                    problems.append(f"/{path}: the sidebar shows {nav!r}, not the app's navigation")
                n_err = page.locator(ERRORS).count()
                if n_err:
                    texts = page.locator(ERRORS).all_inner_texts()
                    problems.append(f"/{path}: {n_err} error box(es): {' | '.join(t[:300] for t in texts)}")
                problems += [f"/{path}: {msg}" for msg in page.evaluate(GEOMETRY_JS)]
                if os.environ.get("FAPROF_DOCS_SHOTS") == "1":
                    _docs_shot(page, path)
                if shots:
                    _full_shot(page, Path(shots) / shot_name(path))
        finally:
            browser.close()
    assert not problems, "\n".join(problems)


#: Every drawn chart's traces as the browser holds them: (chart title, [(trace name, colour)]).
TRACE_COLOURS_JS = """
() => [...document.querySelectorAll('.js-plotly-plot')].map(el => [
  ((el.querySelector('.gtitle') || {}).textContent || ''),
  (el._fullData || el.data || []).map(t => [String(t.name || ''),
    (t.line && typeof t.line.color === 'string') ? t.line.color :
    (t.marker && typeof t.marker.color === 'string') ? t.marker.color : ''])
])
"""


def test_a_variant_has_one_colour_in_every_chart(server):
    """Two charts of the Variants page (latency, TFLOP/s) and the GPUs page, as drawn: each variant in one colour."""
    sync_playwright = _playwright()
    colours: dict[str, set[str]] = {}
    charts_with: dict[str, set[str]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                    args=CHROMIUM_ARGS, timeout=60_000, env=browser_env())
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(PAGE_LOAD_S * 1000)
            for path in ("variants", "gpus"):
                page.goto(f"{server}/{path}", wait_until="domcontentloaded")
                page.locator(".js-plotly-plot .main-svg").first.wait_for(state="attached")
                _wait_idle(page, PAGE_LOAD_S)
                for title, traces in page.evaluate(TRACE_COLOURS_JS):
                    for name, colour in traces:
                        variant = name.split(",")[0].split(" (")[0]
                        if variant in fd.KNOWN_ORDER and colour:
                            colours.setdefault(variant, set()).add(colour.lower())
                            charts_with.setdefault(variant, set()).add(f"{path}: {title}")
        finally:
            browser.close()
    several = {v for v, c in charts_with.items() if len(c) >= 2}
    assert several, charts_with  # some variant is drawn in two charts at least
    assert all(len(colours[v]) == 1 for v in several), {v: colours[v] for v in several if len(colours[v]) > 1}
