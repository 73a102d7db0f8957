"""Reports on the committed bundles: the first screen answers (fastest, by how much, why, against the
published figures), numbers are formatted for people (no `nan`, no `e+0`), the HTML is rendered by a
Markdown library with charts, trend sentences point the right way, and nothing is written for a
damaged bundle.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from faprof.errors import FaprofError
from faprof.report import fmt as report_fmt
from faprof.report import writer as report
from faprof.store import Bundle

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "runs"
L4 = EXAMPLES / "20261121T200256Z_nvidia-h100-80gb-hbm3_l4-causal"
L4_NCU = EXAMPLES / "20261121T202207Z_nvidia-h100-80gb-hbm3_l4-causal"
BUNDLES = ROOT / "tests" / "data" / "bundles"

#: The first screen: everything before the charts.
FIRST_SCREEN_LINES = 60


@pytest.fixture(scope="module")
def l4_md() -> str:
    return report.render_markdown(Bundle(L4))


def _first_screen(md: str) -> list[str]:
    return md.split("\n## Charts")[0].splitlines()


def test_first_screen_answers_what_is_fastest_by_how_much_why_and_against_the_published_l4(l4_md):
    screen = _first_screen(l4_md)
    assert len(screen) <= FIRST_SCREEN_LINES, len(screen)
    text = "\n".join(screen)
    # one headline per dtype group, each naming the fastest and a ratio
    heads = [ln for ln in screen if "fastest is **" in ln]
    assert len(heads) == 2 and "fp16" in heads[0] and "fp32" in heads[1]
    assert all(re.search(r"\d\.\d\dx \w+'s speed", h) for h in heads)
    assert "**fa2**: 1.24x sdpa_efficient's speed" in text  # fp32 group, geometric mean over its 5 shapes
    # the ranking keeps dtypes apart: fp32-only kernels are never ranked against fp16 rows
    fp16_rank = next(ln for ln in screen if ln.startswith("Speed vs sdpa_flash"))
    assert "fa2 " not in fp16_rank and "naive" not in fp16_rank and "fa2_mma" in fp16_rank
    # why: this bundle has timings only, so the advisor claims no cause it has no counters for
    # (the old advisor called ~60 calls "launch overhead" from host enqueue time alone)
    assert "### Why" in text and "From the timings alone" in text
    assert "launch overhead" not in text and "- no diagnosis from this run's data for " in text
    # published figures: the custom kernel mapped to faprof's stand-in, measured column filled for throughput
    assert "report's custom kernel → **fa2_mma**" in text
    rows = [ln for ln in screen if ln.startswith("| throughput")]
    assert len(rows) == 2 and all("GFLOP/s (report's FLOP count)" in r for r in rows)
    custom = [ln for ln in screen if ln.startswith("| latency: report's custom kernel")]
    assert len(custom) == 5 and all("fa2_mma: " in r and "less time" in r for r in custom)
    assert "*FlashAttention Kernel Benchmark Report* (NVIDIA L4, 2025-10-13)" in text


def test_no_nan_no_positive_exponents_and_units_in_headers(l4_md):
    assert report_fmt.problems_in(l4_md) == []
    assert "footprint_standard_bytes" not in l4_md
    assert "analytic standard footprint MiB" in l4_md or "MiB" in l4_md
    assert not re.search(r"\b\d+\.0\b \|", l4_md.split("### Correctness")[1].split("###")[0])  # seeds as integers


def test_every_committed_bundle_renders_clean():
    for b in [*sorted(EXAMPLES.iterdir()), *sorted(BUNDLES.iterdir())]:
        if not (b / "manifest.json").exists():
            continue
        if Bundle(b).manifest().get("kind") == "sanitize":  # no timed rows: refused in one line
            with pytest.raises(FaprofError, match="faprof sanitize"):
                report.render_markdown(Bundle(b))
            continue
        md = report.render_markdown(Bundle(b))
        assert report_fmt.problems_in(md) == [], b.name
        assert "shared/seeds" not in md and "shared/GPU" not in md, b.name  # reports cited by title, GPU and date
        assert len(_first_screen(md)) <= FIRST_SCREEN_LINES + 10, b.name


def test_nsight_bundle_diagnoses_from_the_profiler():
    md = report.render_markdown(Bundle(L4_NCU))
    screen = "\n".join(_first_screen(md))
    assert "From the timings and Nsight Compute" in screen
    fa1 = next(ln for ln in screen.splitlines() if ln.startswith("- **fa1**"))
    assert "too few CTAs" in fa1 and "SMs idle" in fa1  # fa1: a block per (b, h) leaves SMs idle
    assert "### Nsight Compute, per kernel launch" in md


def test_html_is_rendered_markdown_with_plotly_charts():
    pytest.importorskip("plotly")
    page = report.render_html(Bundle(L4))
    body = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    assert "<h2>The answer</h2>" in body and "<table>" in body and "<strong>fa2</strong>" in body
    assert "**" not in body and "`" not in body
    assert body.count('class="chart"') == 4 and "Plotly.newPlot" in page
    assert report_fmt.problems_in(body) == []


def test_markdown_charts_are_png_files_or_a_pointer_to_the_html(tmp_path):
    pytest.importorskip("plotly")
    notes: list[str] = []
    written = report.write_reports(Bundle(L4), tmp_path / "rep", ("md", "html"), notice=notes.append)
    md = (tmp_path / "rep" / "report.md").read_text()
    pngs = [p for p in written if p.suffix == ".png"]
    if pngs:  # kaleido found a browser
        assert len(pngs) == 4 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
        for p in pngs:
            assert f"](charts/{p.name})" in md
    else:
        assert notes and "report.html" in md


@pytest.mark.parametrize("first,last,words", [
    (1.42, 1.02, "fa2's lead shrinks (1.42x faster → 1.02x faster)"),  # the backwards sentence
    (1.01, 1.49, "fa2's lead grows"),
    (0.5, 0.2, "fa2's gap widens (2.00x slower → 5.00x slower)"),
    (0.2, 0.5, "fa2's gap narrows"),
    (1.3, 0.7, "fa2 changes sides"),
    (1.01, 0.99, "fa2 stays level"),
    (1.09, 1.13, "fa2 holds steady"),
])
def test_trend_wording(first, last, words):
    assert words in report.trend_phrase("fa2", first, last)


@pytest.mark.parametrize("fn,x,out", [
    (report_fmt.sig, 13270.4, "13,300"), (report_fmt.sig, 0.008224, "0.00822"), (report_fmt.sig, float("nan"), "–"),
    (report_fmt.ms, 190.53, "190.5"), (report_fmt.ms, 0.03978, "0.0398"), (report_fmt.integer, 2723400785.0, "2723400785"),
    (report_fmt.err, 1.8e-6, "1.8e-06"), (report_fmt.err, 0.001953, "0.00195"), (report_fmt.ratio, 4789.2, "4,789x"),
    (report_fmt.ratio, 0.0021, "0.0021x"), (report_fmt.mib, 3 * 2**20, "3.00"), (report_fmt.as_written, 26312.6, "26312.6"),
    (report_fmt.text, None, "–"), (report_fmt.pct, 0.02, "0.02"), (report_fmt.ratio, 0.0999, "0.10x"),
])
def test_number_formats(fn, x, out):
    assert fn(x) == out


def test_cite_keeps_title_gpu_and_date_and_drops_the_path():
    src = "shared/seeds/003_98ea9d3a015f479c.txt (FlashAttention Kernel Benchmark Report, NVIDIA L4, 2025-10-13)"
    assert report.cite(src) == "*FlashAttention Kernel Benchmark Report* (NVIDIA L4, 2025-10-13)"
    assert report.cite("Flash Attention Benchmark Report, RTX 4070") == "*Flash Attention Benchmark Report* (RTX 4070)"
    assert report.cite("shared/seeds/x.txt") == "" and report.cite(None) == ""


def test_a_damaged_bundle_writes_nothing(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(L4, run)
    (run / "measurements.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(FaprofError, match="measurements.parquet cannot be read"):
        report.write_reports(Bundle(run), tmp_path / "out" / "deeper")
    assert not (tmp_path / "out").exists()


L20 = EXAMPLES / "20261123T110445Z_nvidia-h100-80gb-hbm3_l20-fwd-bwd"


def test_report_002s_tables_with_faprofs_backward():
    """l20_fwd_bwd on the H100 (committed bundle): report 002's gradient table for every variant with
    both directions (times and TFLOP/s), its two scaling tables told apart, the memory sweep with the
    direction named, and the report's backward/forward ratio set beside fa2_mma's."""
    md = report.render_markdown(Bundle(L20))
    fb = md.split("### Forward and backward")[1].split("\n### ")[0]
    assert "forward TFLOP/s" in fb and "backward TFLOP/s" in fb and "fwd+bwd TFLOP/s" in fb
    rows = [ln for ln in fb.splitlines() if ln.startswith("| fa2_mma ")]
    assert len(rows) == 2 and all("fp16" in r for r in rows)  # D=64 problems: the bwd kernel takes 64, 128
    assert any(ln.startswith("| sdpa_flash ") for ln in fb.splitlines())
    sc = md.split("### Scaling over batch size")[1].split("\n### ")[0]
    assert "| strong scaling" in sc and "| weak scaling" in sc
    mem = md.split("### Memory")[1].split("\n### ")[0]
    assert " bwd " in mem and " fwd_bwd " in mem
    pub = [ln for ln in md.splitlines() if ln.startswith("| bwd over fwd: Flash Attention v2")]
    assert len(pub) == 1 and re.search(r"fa2_mma: \d\.\d+x \(0\.1\d+ / 0\.03\d+ ms\)", pub[0]), pub
