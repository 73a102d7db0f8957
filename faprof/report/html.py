"""The HTML report: the Markdown report rendered by markdown-it-py into one self-contained page, the
appendix below it in collapsed sections, interactive plotly charts in place of their placeholders.

The page fits a 1280 px window: the body is at most 1200 px wide, charts are 960 px, and a table wider
than the page scrolls inside its own box instead of widening the page.
"""

from __future__ import annotations

import html

from markdown_it import MarkdownIt

from faprof.report.appendix import Section

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222;
line-height:1.4}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3;text-align:left}td{text-align:right}td:first-child{text-align:left}
.wide{overflow-x:auto;max-width:100%}code{background:#f5f5f5;padding:0 3px}.chart{margin:.6em 0}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.2em;border-bottom:1px solid #ddd}h3{margin:1em 0 .3em}
details{margin:.3em 0;border:1px solid #e3e3e3;border-radius:4px;padding:.2em .6em}
summary{cursor:pointer;font-weight:600}
"""


def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": True}).enable("table")


def _wrap_tables(body: str) -> str:
    """Every table in a box that scrolls sideways, so a wide table never widens the page."""
    return body.replace("<table>", '<div class="wide"><table>').replace("</table>", "</table></div>")


def page(title: str, md: str, appendix: list[Section], script: str = "", divs: dict[str, str] | None = None) -> str:
    """One self-contained HTML page.

    Args:
        title: the page's <title>.
        md: the report proper, in Markdown, with `<!--chart:NAME-->` placeholders.
        appendix: (title, Markdown) sections, each rendered as a collapsed <details>.
        script: plotly.js (inline) when there are charts; divs: chart name -> its div.
    """
    mdi = _markdown()
    body = _wrap_tables(mdi.render(md))
    for name, div in (divs or {}).items():
        body = body.replace(f"<!--chart:{name}-->", f'<div class="chart">{div}</div>')
    if appendix:
        body += "<h2>Appendix</h2>\n<p>Every table of the run, one section each (click to open).</p>\n"
        for name, sec in appendix:
            body += (f"<details><summary>{html.escape(name)}</summary>\n{_wrap_tables(mdi.render(sec))}</details>\n")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style>{script}</head>\n'
            f"<body>\n{body}</body></html>\n")
