"""The HTML report in a real browser (Debian's headless Chromium): it fits a 1280 px window, and its first
screen (1280 x 1000) shows the answer: the fastest variant against the baseline, the table, and why.

Method: render the l4_causal H100 report (`faprof.report.writer.render_html`) to a file, open it at 1280 x 1000,
and measure the page's scroll width and where the headings sit; screenshots go to $FAPROF_SHOTS when set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from faprof.report import writer
from faprof.report.png import browser_env
from faprof.store import Bundle

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
L4_H100 = ROOT / "examples" / "runs" / "20261123T053932Z_nvidia-h100-80gb-hbm3_l4-causal"
CHROMIUM = "/usr/bin/chromium"
WINDOW = {"width": 1280, "height": 1000}

LAYOUT_JS = """
() => {
  const top = s => { const e = [...document.querySelectorAll('h2, h3, p, table')].find(x => x.textContent.includes(s));
                     return e ? e.getBoundingClientRect().top + window.scrollY : -1; };
  return {width: document.documentElement.scrollWidth, fastest: top('Fastest:'), why: top('Why:'),
          table: (document.querySelector('table') || {getBoundingClientRect: () => ({top: -1})}).getBoundingClientRect().top,
          charts: [...document.querySelectorAll('.chart')].map(c => c.getBoundingClientRect().right)};
}
"""


def test_the_l4_causal_report_fits_1280_px_and_its_first_screen_is_the_answer(tmp_path):
    pytest.importorskip("plotly")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install 'faprof[dev]')")
    exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium, or FAPROF_INSTALL_BROWSER=1 bash scripts/setup.sh)")
    html = tmp_path / "report.html"
    html.write_text(writer.render_html(Bundle(L4_H100)))
    shots = Path(os.environ.get("FAPROF_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--headless=new", "--no-sandbox", "--disable-gpu"],
                                    env=browser_env())
        try:
            page = browser.new_page(viewport=WINDOW)
            page.goto(html.as_uri())
            page.locator(".js-plotly-plot .main-svg").first.wait_for(state="attached", timeout=60_000)
            got = page.evaluate(LAYOUT_JS)
            page.screenshot(path=str(shots / "report_first_screen.png"))
            page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            opened = page.evaluate("document.documentElement.scrollWidth")
        finally:
            browser.close()
    assert got["width"] <= WINDOW["width"] and opened <= WINDOW["width"], (got, opened)  # the appendix's wide tables too
    assert all(right <= WINDOW["width"] for right in got["charts"]), got["charts"]
    assert 0 < got["fastest"] < got["table"] < got["why"] < WINDOW["height"], got
