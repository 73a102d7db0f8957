"""The leaderboard (faprof.analysis.leaderboard, faprof.report.leaderboard_page, scripts/analysis/leaderboard.py) on
the committed H100 bundles: the committed page is what the script writes from them, a later bundle of the
library baselines alone merges beside the earlier run's rows (each row naming its bundle and the library's
version from its path), the ceiling is the copy for memory-bound rows and the matmul for compute-bound ones,
and wrong rows are shown, never scored."""

import importlib.util
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from faprof.analysis import leaderboard as L
from faprof.report.leaderboard_page import markdown
from faprof.store import Bundle

ROOT = Path(__file__).resolve().parents[1]
DECODE_RUN = ROOT / "examples" / "runs" / "20261128T025126Z_nvidia-h100-80gb-hbm3_llama3-70b-decode"
PREFILL_RUN = ROOT / "examples" / "runs" / "20261128T031741Z_nvidia-h100-80gb-hbm3_llama3-8b-prefill"
FLASHINFER_PATH = ("fused: FlashInfer 0.6.18.post1 BatchDecodeWithPagedKVCacheWrapper (HND pages of 8192 tokens, "
                   "one per sequence), backend fa2, tensor cores: yes")


def _script():
    spec = importlib.util.spec_from_file_location("leaderboard_script", ROOT / "scripts" / "analysis" / "leaderboard.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_page_is_what_the_script_writes():
    """docs/kernels/leaderboard.md is regenerated whenever bundles land: the script's --check says when it is stale."""
    assert _script().main(["--check"]) == 0, "PYTHONPATH=$PWD python3 scripts/analysis/leaderboard.py"
    page = (ROOT / "docs" / "kernels" / "leaderboard.md").read_text()
    assert "## Bundles read" in page and DECODE_RUN.name in page
    assert "No library rows yet" in page  # the committed bundles predate the library baselines


def _decode_with_flashinfer():
    """The committed decode run, and a later bundle of flashinfer_decode alone (as `--variants flashinfer_decode`
    writes it): timed on the Sq = 1 shapes at 90% of copy plus one point per shape, unsupported on Sq = 4."""
    b = Bundle.open(DECODE_RUN)
    old = b.measurements().assign(run_id="old")
    lib = old[old["variant"] == "decode_splitkv"].copy()
    one = lib["Sq"] == 1
    lib = lib.assign(variant="flashinfer_decode", variant_kind="torch", run_id="new", path=FLASHINFER_PATH,
                     pct_copy=[90.0 + i for i in range(len(lib))])
    lib.loc[~one, ["status", "median_ms", "pct_copy"]] = ["unsupported", math.nan, math.nan]
    lib.loc[~one, "reason"] = "FlashInfer's decode kernels take one query per sequence, got Sq=4"
    m = b.manifest()
    manifests = {"old": {**m, "path": str(DECODE_RUN)},
                 "new": {**m, "run_id": "new", "created_utc": "20261201T000000Z", "path": "runs/new_flashinfer"}}
    return pd.concat([old, lib], ignore_index=True), manifests, lib


def test_a_library_bundle_merges_beside_the_earlier_run():
    meas, manifests, lib = _decode_with_flashinfer()
    lb = L.build(meas, manifests, ["llama3_70b_decode"], root=ROOT)
    s = lb.summary.set_index("variant")
    fi = s.loc["flashinfer_decode"]
    ran = lib.loc[lib["status"] == "ok", "pct_copy"]
    assert fi["who"] == "library" and fi["version"] == "FlashInfer 0.6.18.post1"
    assert fi["shapes"] == len(ran) == 8 and fi["total"] == 14 and fi["ceiling"] == "copy"
    assert fi["score"] == pytest.approx(math.exp(ran.map(math.log).mean()))
    assert fi["bundles"] == "runs/new_flashinfer" and "one query per sequence" in fi["not_run"]
    dk = s.loc["decode_splitkv"]
    assert dk["who"] == "faprof" and dk["bundles"] == f"examples/runs/{DECODE_RUN.name}" and dk["shapes"] == 14
    assert s.loc["flex", "who"] == "PyTorch"
    used = lb.bundles.set_index("run_id")["rows"]
    assert used["new"] == 14 and used["old"] == 14 * 7
    page = markdown(lb, "cmd")
    assert "No library rows yet" not in page and "| `flashinfer_decode` | library | FlashInfer 0.6.18.post1 |" in page
    assert "`new_flashinfer`" in page


def test_the_ceiling_follows_the_bound_and_wrong_rows_are_not_scored():
    meas = Bundle.open(PREFILL_RUN).measurements().assign(run_id="p")
    m = Bundle.open(PREFILL_RUN).manifest()
    flip = meas.index[(meas["variant"] == "sdpa_flash")][0]
    meas.loc[flip, "status"] = "wrong"
    lb = L.build(meas, {"p": {**m, "path": str(PREFILL_RUN)}}, ["llama3_8b_prefill"])
    rows = lb.rows.set_index(["variant", "shape_id"])
    ok = meas[meas["status"] == "ok"].iloc[0]
    r = rows.loc[(ok["variant"], ok["shape_id"])]
    assert r["ceiling"] == "matmul" and r["pct_ceiling"] == pytest.approx(ok["pct_measured_ceiling"])
    s = lb.summary.set_index("variant").loc["sdpa_flash"]
    assert s["wrong"] == 1 and s["shapes"] == s["total"] - 1
    assert "wrong (" in markdown(lb, "cmd")
    decode = Bundle.open(DECODE_RUN).measurements().iloc[0]
    assert L.ceiling_share(decode) == (pytest.approx(decode["pct_copy"]), "copy")


def test_versions_from_the_row_and_the_bundle():
    env = {"torch": "2.11.0+cu130", "cudnn": 91900, "faprof": "0.1.0", "git_sha": "9295c20a1234"}
    assert L.library_version(FLASHINFER_PATH) == "FlashInfer 0.6.18.post1"
    assert L.library_version("fused: FlashAttention-4 4.0.0b40 flash_attn_func") == "FlashAttention-4 4.0.0b40"
    assert L.version_of({"variant": "sdpa_cudnn", "path": ""}, env, "PyTorch") == "torch 2.11.0+cu130, cuDNN 9.19.0"
    assert L.version_of({"variant": "decode_splitkv"}, env, "faprof") == "faprof 0.1.0 @ 9295c20a"
    assert L.version_of({"variant": "fa4", "path": "fused: FlashAttention-4 ? x"}, env, "library") == "version not recorded"
    assert L.who_of("fa4", "torch") == "library" and L.who_of("my_kernel", "user") == "user"
