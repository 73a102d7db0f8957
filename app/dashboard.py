"""faprof dashboard: compare kernel variants and GPUs from run bundles (reads bundles, never runs kernels).

Start it with `faprof dashboard [RUN_DIRS...]` or `streamlit run app/dashboard.py [-- RUN_DIRS...]`.
It loads the folders given, archives uploaded in the sidebar, `runs/` when nothing is given, and
always the example bundles under `examples/runs/`.
"""

from __future__ import annotations

import sys
from pathlib import Path

_APP_DIR = Path(__file__).resolve().parent
for _p in (str(_APP_DIR), str(_APP_DIR.parent)):  # faprof_ui beside this file; faprof from a source tree
    if _p not in sys.path:
        sys.path.insert(0, _p)

import faprof_ui as ui  # noqa: E402
import streamlit as st  # noqa: E402

page = st.navigation(ui.pages())
ui.setup()
page.run()
