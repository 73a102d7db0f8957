"""The optional library baselines (FlashInfer, FlashAttention-4) on the CPU: registered whatever is installed,
refused with the pip line when missing, refused by their own limits, and FlashInfer's page table made from
faprof's block table (checked against a gather of the pages)."""

import sys
import tomllib
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import faprof.variants as V
from faprof.cli import main
from faprof.correctness import layouts
from faprof.model.mask import allowed
from faprof.model.problem import AttentionProblem as P
from faprof.store import find_bundles
from faprof.variants import lib_fa4, lib_flashinfer, libraries
from faprof.variants.definition import sequence_kv
from faprof.variants.lib_flashinfer import dense_kv_pages, flashinfer_mask, paged_kv_layout

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("flashinfer_decode", "flashinfer_prefill", "fa4")
INSTALL = {"flashinfer_decode": "pip install 'faprof[flashinfer]'", "flashinfer_prefill": "pip install 'faprof[flashinfer]'",
           "fa4": "pip install 'faprof[fa4]'"}

DECODE_PAGED = P(B=3, H=8, Hkv=2, Sq=1, Sk=40, D=128, dtype="bf16", causal=True, mask_align="bottom_right",
                 seqlens_k=(40, 17, 33), page_size=16)
VARLEN = P(B=2, H=4, Sq=24, Sk=24, D=64, dtype="fp16", causal=True, seqlens_q=(24, 9))


@pytest.fixture
def absent(monkeypatch):
    """Neither library installed, whatever this machine has."""
    monkeypatch.setattr(libraries, "installed_version", lambda dist: None)


@pytest.fixture
def present(monkeypatch):
    """Both libraries 'installed' at their pins (nothing is imported: support reads metadata only)."""
    pins = {lib.dist: lib.pin for lib in libraries.LIBRARIES}
    monkeypatch.setattr(libraries, "installed_version", lambda dist: pins.get(dist))


def test_registered_listed_and_never_in_all():
    r = CliRunner().invoke(main, ["list", "variants"])
    assert r.exit_code == 0, r.output
    all_names = {v.name for v in V.resolve("all")}
    for name in NAMES:
        v = V.get(name)
        assert name in r.output and not v.hidden and not v.in_all and name not in all_names
        assert v.device == "cuda" and set(v.dtypes) == {"fp16", "bf16"}


@pytest.mark.parametrize("name,problem", [("flashinfer_decode", DECODE_PAGED), ("flashinfer_prefill", VARLEN),
                                          ("fa4", VARLEN)])
def test_missing_package_is_unsupported_with_the_pip_line(absent, name, problem):
    ok, reason = V.get(name).supports(problem, cuda_available=True)
    assert not ok and reason.endswith(INSTALL[name]) and "not installed" in reason


def test_support_checks_import_no_library(present):
    before = {m for m in sys.modules if m.startswith(("flashinfer", "flash_attn", "cutlass"))}
    for name in NAMES:
        V.get(name).supports(VARLEN, cuda_available=True)
    assert {m for m in sys.modules if m.startswith(("flashinfer", "flash_attn", "cutlass"))} == before


def test_profile_rows_are_unsupported_with_the_install_line(absent, tmp_path):
    scenario = tmp_path / "libs.toml"
    scenario.write_text('''name = "libs"
description = "library baselines on a machine without them"
baseline = "torch_standard"
variants = ["torch_standard", "flashinfer_decode", "flashinfer_prefill", "fa4"]

[defaults]
H = 4
Hkv = 2
D = 64
dtype = "fp16"
causal = true
mask_align = "bottom_right"

[[groups]]
name = "decode"
problems = [{ B = 2, Sq = 1, Sk = 40, seqlens_k = [40, 23], page_size = 16 }]

[[groups]]
name = "varlen"
problems = [{ B = 2, Sq = 24, Sk = 24, seqlens_q = [24, 9] }]
''')
    out = tmp_path / "runs"
    r = CliRunner().invoke(main, ["profile", "--scenario", str(scenario), "--out", str(out), "--budget", "0.05"])
    assert r.exit_code == 0, r.output
    (bundle,) = find_bundles(out)
    df = bundle.measurements()
    lib = df[df["variant"].isin(NAMES)]
    # a problem outside a library's own limits says so; every other row is the missing package and its pip line
    own_limit = {("flashinfer_decode", 24): "does not run packed variable-length batches",
                 ("fa4", 1): "does not run a paged KV cache"}
    assert len(lib) == 6
    for _, row in lib.iterrows():
        assert row["status"] == "unsupported", row.to_dict()
        words = own_limit.get((row["variant"], row["Sq"]))
        assert (words in row["reason"]) if words else row["reason"].endswith(INSTALL[row["variant"]]), row["reason"]


@pytest.mark.parametrize("name,problem,words", [
    ("flashinfer_decode", P(B=2, H=8, Sq=1, Sk=64, D=96, causal=True, mask_align="bottom_right"), "head dims 64, 128, 256"),
    ("flashinfer_decode", P(B=2, H=8, Sq=4, Sk=64, D=128, causal=True, mask_align="bottom_right"), "one query per sequence"),
    ("flashinfer_decode", P(B=2, H=8, Sq=1, Sk=64, D=128, dtype="fp32"), "supports dtypes"),
    ("flashinfer_prefill", P(B=1, H=8, Sq=16, Sk=64, D=128, causal=True), "bottom-right corner"),
    ("flashinfer_prefill", P(B=1, H=8, Sq=64, Sk=64, D=128, window=(8, 4)), "left side only"),
    ("flashinfer_prefill", P(B=1, H=8, Sq=64, Sk=32, D=128, causal=True, mask_align="bottom_right"), "qo_len <= kv_len"),
    ("flashinfer_prefill", P(B=4, H=8, Sq=64, Sk=64, D=128), "packed batch"),
    ("flashinfer_prefill", P(B=1, H=8, Sq=64, Sk=64, D=128, direction="bwd"), "supports directions"),
    ("fa4", P(B=1, H=8, Sq=64, Sk=64, D=100), "multiples of 8"),
    ("fa4", P(B=1, H=8, Sq=64, Sk=64, D=512), "from 8 to 256"),
    ("fa4", P(B=1, H=8, Sq=16, Sk=64, D=128, causal=True), "bottom-right corner"),
    ("fa4", DECODE_PAGED, "does not run a paged KV cache"),
    ("fa4", P(B=1, H=8, Sq=64, Sk=64, D=128, dtype="fp32"), "supports dtypes"),
])
def test_refuses_what_the_library_cannot_run(present, name, problem, words):
    ok, reason = V.get(name).supports(problem, cuda_available=True)
    assert not ok and words in reason, reason


@pytest.mark.parametrize("name,problem", [
    ("flashinfer_decode", DECODE_PAGED),
    ("flashinfer_decode", P(B=4, H=32, Hkv=4, Sq=1, Sk=1000, D=128, dtype="bf16", causal=True, mask_align="bottom_right",
                            window=(256, 0), softcap=30.0)),
    ("flashinfer_prefill", VARLEN),
    ("flashinfer_prefill", P(B=1, H=8, Hkv=1, Sq=64, Sk=64, D=256, window=(16, 0))),
    ("flashinfer_prefill", P(B=2, H=8, Sq=4, Sk=40, D=64, causal=True, mask_align="bottom_right", seqlens_k=(40, 9),
                             page_size=8)),
    ("fa4", VARLEN),
    ("fa4", P(B=2, H=8, Hkv=2, Sq=128, Sk=256, D=96, causal=True, mask_align="bottom_right", window=(32, 8),
              softcap=20.0, direction="fwd_bwd")),
])
def test_accepts_what_the_library_runs(present, name, problem):
    assert V.get(name).supports(problem, cuda_available=True) == (True, "")


def test_fa4_refuses_gpus_before_hopper(present, monkeypatch):
    monkeypatch.setattr(lib_fa4, "compute_capability", lambda: (8, 9))
    ok, reason = V.get("fa4").supports(VARLEN, cuda_available=True)
    assert not ok and "Hopper and Blackwell" in reason and "8.9" in reason
    monkeypatch.setattr(lib_fa4, "compute_capability", lambda: (10, 0))
    assert not V.get("fa4").supports(P(B=1, H=8, Sq=64, Sk=64, D=192), cuda_available=True)[0]
    assert V.get("fa4").supports(P(B=1, H=8, Sq=64, Sk=64, D=256), cuda_available=True)[0]


# ------------------------------------------------------------------ FlashInfer's page table
def _gather_flashinfer_pages(pool, indptr, indices, last, page_size, b):
    """Sequence b's tokens read the way FlashInfer reads its NHD page table: [Hkv, tokens, D]."""
    rows = []
    start, end = int(indptr[b]), int(indptr[b + 1])
    for j, page in enumerate(indices[start:end].tolist()):
        n = int(last[b]) if start + j == end - 1 else page_size
        assert 1 <= n <= page_size
        rows.append(pool[page, :n])
    return torch.cat(rows).transpose(0, 1)


@pytest.mark.parametrize("problem", [
    DECODE_PAGED,
    P(B=4, H=2, Sq=1, Sk=64, D=8, seqlens_k=(64, 1, 63, 32), page_size=16),  # full, one token, one short, exact
    P(B=2, H=2, Sq=3, Sk=7, D=8, seqlens_k=(7, 5), page_size=1),
    P(B=2, H=2, Sq=1, Sk=10, D=8, seqlens_k=(10, 3), page_size=4, pool_blocks=9,
      block_table=((8, 0, 5), (2,))),  # a serving system's own table
])
def test_paged_kv_layout_gathers_the_same_tokens_as_the_block_table(problem):
    gen = torch.Generator().manual_seed(0)
    q, k, v, _, args = layouts.make_layout_inputs(problem, "cpu", gen)
    indptr, indices, last = paged_kv_layout(args.block_table, problem.k_lens(), problem.page_size)
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr.tolist()[-1] == len(indices) == sum(problem.blocks_per_seq())
    assert (indices >= 0).all() and (indices < k.shape[0]).all()
    for b in range(problem.B):
        for pool in (k, v):
            want = sequence_kv(problem, pool, b, args.block_table)   # faprof's own gather
            got = _gather_flashinfer_pages(pool, indptr, indices, last, problem.page_size, b)
            assert got.shape == want.shape and torch.equal(got, want)


def test_paged_kv_layout_rejects_empty_sequences():
    with pytest.raises(ValueError, match="cache lengths >= 1"):
        paged_kv_layout(torch.zeros(1, 1, dtype=torch.int32), [0], 16)


def test_dense_kv_pages_read_each_sequence_as_one_hnd_page():
    k = torch.randn(3, 2, 5, 4)  # [B, Hkv, Sk, D] = HND pages [pages, Hkv, page_size, D]
    indptr, indices, last = dense_kv_pages(3, 5)
    for b in range(3):
        (page,) = indices[int(indptr[b]):int(indptr[b + 1])].tolist()
        assert int(last[b]) == 5 and torch.equal(k[page][:, : int(last[b])], k[b])


# ------------------------------------------------------------------ masks in FlashInfer's terms
def _flashinfer_allowed(causal: bool, window_left: int, qo: int, kv: int):
    """FlashInfer's rule: causal keeps j <= i + kv - qo (its docstring's tril(diagonal=kv_len - qo_len)); a window
    keeps j + qo + window_left >= kv + i (DefaultAttention's mask)."""
    i = torch.arange(qo).unsqueeze(1)
    j = torch.arange(kv).unsqueeze(0)
    ok = torch.ones(qo, kv, dtype=torch.bool)
    if causal:
        ok &= j <= i + kv - qo
    if window_left >= 0:
        ok &= j + qo + window_left >= kv + i
    return ok


@pytest.mark.parametrize("problem", [
    P(B=1, H=1, Sq=33, Sk=33, D=64),
    P(B=1, H=1, Sq=33, Sk=33, D=64, causal=True),
    P(B=1, H=1, Sq=20, Sk=50, D=64, causal=True, mask_align="bottom_right"),
    P(B=1, H=1, Sq=20, Sk=50, D=64, causal=True, mask_align="bottom_right", window=(7, 3)),
    P(B=1, H=1, Sq=40, Sk=40, D=64, window=(5, -1)),
    P(B=1, H=1, Sq=40, Sk=40, D=64, window=(5, 0)),
    P(B=1, H=1, Sq=40, Sk=40, D=64, window=(-1, 0)),
    P(B=1, H=1, Sq=1, Sk=40, D=64, window=(9, 4), mask_align="bottom_right"),
])
def test_flashinfer_mask_is_faprofs_mask(problem):
    mapped = flashinfer_mask(problem)
    assert not isinstance(mapped, str), mapped
    assert torch.equal(_flashinfer_allowed(*mapped, problem.Sq, problem.Sk), allowed(problem.mask, problem.Sq, problem.Sk))


# ------------------------------------------------------------------ doctor, extras
def test_doctor_lists_each_library(absent, monkeypatch):
    lines = {c.name: c for c in libraries.doctor_checks()}
    assert set(lines) == {"FlashInfer", "FlashAttention-4"}
    assert lines["FlashInfer"].status == "info" and "not installed: pip install 'faprof[flashinfer]'" in lines["FlashInfer"].detail
    assert "pip install 'faprof[fa4]'" in lines["FlashAttention-4"].detail
    monkeypatch.setattr(libraries, "installed_version", lambda dist: "0.0.1")
    line = next(c for c in libraries.doctor_checks() if c.name == "FlashInfer")
    assert line.status == "warn" and "0.0.1" in line.detail and lib_flashinfer.FLASHINFER.pin in line.detail


def test_extras_pin_the_libraries_and_nothing_installs_them_by_default():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for lib in libraries.LIBRARIES:
        assert extras[lib.extra] == [f"{lib.dist}=={lib.pin}"]
    for other in set(extras) - {"flashinfer", "fa4", "fa4-cu13"}:  # setup.sh and CI install app, report, dev
        assert not any(d.startswith(("flashinfer", "flash-attn")) for d in extras[other]), other
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "flashinfer" not in setup and "fa4" not in setup and "flash-attn" not in setup


def test_an_installed_library_that_does_not_import_says_so_with_the_pip_line():
    from faprof.errors import FaprofError
    from faprof.variants.libraries import FLASHINFER

    said = r"FlashInfer .*is installed but does not import .*pip install 'faprof\[flashinfer\]'"
    with pytest.raises(FaprofError, match=said), FLASHINFER.imported():
        import faprof_no_such_module  # noqa: F401
