"""A group whose baseline was timed on none of its shapes (an optional library not installed: every row
`unsupported`) is compared with the next baseline of its chain, and every output says so: the speedup
column (analysis.with_speedups), `faprof show`'s lines (cli.app.print_baselines) and the report's sentence
(report.answer). Checked on the committed H100 llama3_70b_decode run, with the flashinfer_decode rows a
machine without FlashInfer writes."""

import tomllib
from pathlib import Path

import pandas as pd
import pytest

from faprof.analysis.speedups import speedups_for, with_speedups
from faprof.store import Bundle

ROOT = Path(__file__).resolve().parents[1]
DECODE_RUN = ROOT / "examples" / "runs" / "20261128T025126Z_nvidia-h100-80gb-hbm3_llama3-70b-decode"
NOT_INSTALLED = "FlashInfer is not installed (the package flashinfer-python): pip install 'faprof[flashinfer]'"


def test_the_next_baseline_is_taken_per_group_and_said():
    df = pd.DataFrame([
        {"variant": "lib", "shape_id": "a", "group": "paged", "status": "unsupported", "median_ms": None,
         "reason": "lib is not installed"},
        {"variant": "lib", "shape_id": "b", "group": "paged", "status": "unsupported", "median_ms": None,
         "reason": "lib is not installed"},
        {"variant": "torch", "shape_id": "a", "group": "paged", "status": "ok", "median_ms": 4.0},
        {"variant": "torch", "shape_id": "b", "group": "paged", "status": "ok", "median_ms": 8.0},
        {"variant": "mine", "shape_id": "a", "group": "paged", "status": "ok", "median_ms": 1.0},
        {"variant": "mine", "shape_id": "b", "group": "paged", "status": "ok", "median_ms": 2.0},
        {"variant": "flash", "shape_id": "c", "group": "dense", "status": "ok", "median_ms": 1.0},
        {"variant": "mine", "shape_id": "c", "group": "dense", "status": "ok", "median_ms": 0.5},
    ])
    out = with_speedups(df, "flash", {"paged": "lib"}, {"paged": ["torch"], "": ["flash"]}).set_index(
        ["variant", "shape_id"])
    assert out.loc[("mine", "a"), "speedup"] == 4.0 and out.loc[("mine", "b"), "speedup"] == 4.0
    assert set(out.loc[out["group"] == "paged", "baseline"]) == {"torch"}
    assert set(out.loc[out["group"] == "paged", "baseline_declared"]) == {"lib"}
    note = out.loc[("mine", "a"), "baseline_note"]
    assert "lib was unsupported on every shape (lib is not installed)" in note and note.endswith("torch")
    assert out.loc[("mine", "c"), "speedup"] == 2.0 and out.loc[("mine", "c"), "baseline_note"] == ""
    # without fallbacks (an old caller), the declared baseline stays and the speedups are empty, as before
    old = with_speedups(df, "flash", {"paged": "lib"}).set_index(["variant", "shape_id"])
    assert pd.isna(old.loc[("mine", "a"), "speedup"]) and old.loc[("mine", "a"), "baseline"] == "lib"


def test_a_baseline_timed_on_some_shapes_is_kept():
    """FlashInfer installed refuses the paged Sq = 4 shape only: flashinfer_decode stays the baseline
    (that shape has no speedup, as the report says), no fallback is mixed into the group."""
    df = pd.DataFrame([
        {"variant": "lib", "shape_id": "a", "group": "g", "status": "ok", "median_ms": 2.0},
        {"variant": "lib", "shape_id": "b", "group": "g", "status": "unsupported", "median_ms": None},
        {"variant": "torch", "shape_id": "a", "group": "g", "status": "ok", "median_ms": 4.0},
        {"variant": "torch", "shape_id": "b", "group": "g", "status": "ok", "median_ms": 4.0},
    ])
    out = with_speedups(df, "lib", None, {"": ["lib", "torch"]}).set_index(["variant", "shape_id"])
    assert set(out["baseline"]) == {"lib"} and set(out["baseline_note"]) == {""}
    assert out.loc[("torch", "a"), "speedup"] == 0.5 and pd.isna(out.loc[("torch", "b"), "speedup"])


@pytest.fixture(scope="module")
def decode_without_flashinfer():
    """The committed llama3_70b_decode rows, the flashinfer_decode rows a machine without FlashInfer
    writes, and the manifest of today's scenario file (its paged baseline flashinfer_decode)."""
    b = Bundle.open(DECODE_RUN)
    df = b.measurements()
    lib = df[df["variant"] == "torch_standard"].assign(
        variant="flashinfer_decode", status="unsupported", reason=NOT_INSTALLED, median_ms=float("nan"))
    m = b.manifest()
    raw = tomllib.loads((ROOT / "scenarios" / "llama3_70b_decode.toml").read_text())
    m["scenario"] = {**m["scenario"], "baseline": raw["baseline"], "raw": raw}
    return pd.concat([df, lib], ignore_index=True), m


def test_committed_decode_run_falls_back_to_torch_standard_on_the_paged_group(decode_without_flashinfer):
    df, m = decode_without_flashinfer
    out = speedups_for(df, m)
    paged = out[out["group"] == "paged"]
    assert set(paged["baseline"]) == {"torch_standard"} and set(paged["baseline_declared"]) == {"flashinfer_decode"}
    mine = paged[paged["variant"] == "decode_splitkv"]
    assert mine["speedup"].notna().all() and (mine["speedup"] > 10).all()  # torch_standard is unfused: 10-90x slower
    assert all("flashinfer_decode was unsupported on every shape" in n and NOT_INSTALLED in n
               and n.endswith("torch_standard") for n in paged["baseline_note"])
    rest = out[out["group"] != "paged"]
    assert set(rest["baseline"]) == {"sdpa_flash"} and set(rest["baseline_note"]) == {""}


def test_show_and_the_report_say_the_fallback(decode_without_flashinfer, monkeypatch):
    from faprof.cli import group as cli_app
    from faprof.report import answer
    from faprof.report.blocks import blocks

    df, m = decode_without_flashinfer
    out = speedups_for(df, m)
    said = []
    monkeypatch.setattr(cli_app, "say", lambda text, **kw: said.append(text))
    cli_app.print_baselines(out)
    assert "torch_standard for paged" in said[0]
    assert any("the baseline flashinfer_decode was unsupported" in s and "next baseline, torch_standard" in s
               for s in said[1:])
    paged = next(b for b in blocks(out) if b.group == "paged")
    assert paged.baseline == "torch_standard" and paged.baseline_ran
    head = "\n".join(answer.headline(paged))
    assert "4 shapes, fallback baseline torch_standard" in head
    assert "Group paged: the baseline flashinfer_decode was unsupported on every shape" in head.replace("\\_", "_")
    dense = next(b for b in blocks(out) if b.group == "contiguous")
    assert "fallback" not in "\n".join(answer.headline(dense))
