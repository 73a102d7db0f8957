"""Render plotly figures to PNG files with kaleido, in a process of its own (`faprof.report.png` runs it
under a time limit and stops it when the limit passes, so a browser that never answers cannot hang the
report).

Reads a JSON object on stdin: `browser` (the Chrome/Chromium to start), `charts` (a list of `name`,
`figure` as plotly JSON, `width`, `height`); writes `<name>.png` per chart into the folder named by its
one argument. Exit 0 when every chart is written; otherwise the last line on stderr says why.
Imports only the standard library and kaleido, so it starts fast and needs nothing else of faprof.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

#: The Kaleido being used, for the SIGTERM handler.
_KALEIDO: list[Any] = []


def _stop_browser(_signum: int, _frame: Any) -> None:
    """SIGTERM from the parent (past its time limit): kill the browser's process group and leave at once.

    A browser that never answered fails kaleido's `__aenter__`, so `async with` would never close it; and it
    runs in a session of its own (choreographer starts it so), so the parent's kill would not reach it.
    """
    proc = getattr(_KALEIDO[0], "subprocess", None) if _KALEIDO else None
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the wrapper choreographer starts, and the browser under it
    for clean in ("_browser_impl", "_html_tmp_dir"):  # the browser's profile and kaleido's page, under /tmp
        with contextlib.suppress(Exception):
            getattr(_KALEIDO[0], clean).clean()
    print("stopped: past the time limit", file=sys.stderr, flush=True)
    os._exit(3)


async def _render(spec: dict[str, Any], out: Path) -> None:
    import kaleido

    # mathjax=False: the charts have no LaTeX, and kaleido's default fetches MathJax from a CDN
    # (a machine without network would wait on it).
    k = kaleido.Kaleido(n=1, path=spec["browser"], mathjax=False)
    _KALEIDO.append(k)
    async with k:
        for c in spec["charts"]:
            opts = {"format": "png", "width": c["width"], "height": c["height"], "scale": 1}
            png = await k.calc_fig(json.loads(c["figure"]), opts=opts)
            (out / f"{c['name']}.png").write_bytes(png)


def main() -> int:
    spec = json.load(sys.stdin)
    signal.signal(signal.SIGTERM, _stop_browser)
    try:
        asyncio.run(_render(spec, Path(sys.argv[1])))
    except Exception as e:  # noqa: BLE001 - one line for the parent, whatever kaleido raised
        print(f"{type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
