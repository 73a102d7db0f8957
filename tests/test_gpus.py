"""Tests for the GPU spec database (CPU only): the shipped rows are complete and self-consistent,
torch's device names map to the right row and never to a neighbouring product, the peak chosen
for "% of peak" is the dense fp32-accumulate tensor rate or the non-tensor rate, unknown GPUs carry
no peaks, and a malformed data file is rejected with the row and key named.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from faprof.errors import FaprofError
from faprof.model import gpus
from faprof.model.gpus import GPUSpec

ROUNDING_TFLOPS = 0.1
"""Datasheets print one decimal, so halving a rate can be off by up to 0.05 each side."""

REQUIRED_ROWS = {
    "GeForce RTX 3060",
    "GeForce RTX 3090",
    "GeForce RTX 4070",
    "GeForce RTX 4090",
    "L4",
    "L20",
    "L40S",
    "A100 40GB",
    "A100 80GB SXM4",
    "A100 80GB PCIe",
    "H100 SXM5",
    "H100 PCIe",
    "H200 SXM",
}

# What torch.cuda.get_device_name() returns -> the canonical row it must select.
TORCH_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100 SXM5",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA GeForce RTX 3060": "GeForce RTX 3060",
    "NVIDIA GeForce RTX 3080": "GeForce RTX 3080",
    "NVIDIA GeForce RTX 3090": "GeForce RTX 3090",
    "NVIDIA GeForce RTX 4070": "GeForce RTX 4070",
    "NVIDIA GeForce RTX 4080": "GeForce RTX 4080",
    "NVIDIA GeForce RTX 4090": "GeForce RTX 4090",
    "NVIDIA L4": "L4",
    "NVIDIA L20": "L20",
    "NVIDIA L40S": "L40S",
    "NVIDIA A100-SXM4-80GB": "A100 80GB SXM4",
    "NVIDIA A100-SXM4-40GB": "A100 40GB",
    "NVIDIA A100-PCIE-40GB": "A100 40GB",
    "NVIDIA A100 80GB PCIe": "A100 80GB PCIe",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": "A10G",
    "Tesla T4": "T4",
}

# Names of other products (or slices of one) that contain a known name: they must not match it.
NOT_IN_DATABASE = [
    "NVIDIA GeForce RTX 4070 Ti",
    "NVIDIA GeForce RTX 4070 SUPER",
    "NVIDIA GeForce RTX 4070 Ti SUPER",
    "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA GeForce RTX 4090 D",
    "NVIDIA GeForce RTX 3060 Ti",
    "NVIDIA GeForce RTX 3060 Laptop GPU",
    "NVIDIA GeForce RTX 3080 Ti",
    "NVIDIA H100",
    "NVIDIA H200 NVL",
    "NVIDIA GH200 480GB",
    "NVIDIA H800",
    "NVIDIA L40",
    "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
    "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
    "NVIDIA RTX A6000",
    "",
]


@pytest.fixture(scope="module")
def rows() -> list[GPUSpec]:
    return gpus.all_gpus()


@pytest.fixture(scope="module")
def by_name(rows: list[GPUSpec]) -> dict[str, GPUSpec]:
    return {spec.name: spec for spec in rows}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpus.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------- shipped rows


def test_required_rows_present(by_name: dict[str, GPUSpec]) -> None:
    assert set(by_name) >= REQUIRED_ROWS


def test_every_row_has_identity_and_provenance(rows: list[GPUSpec]) -> None:
    for spec in rows:
        assert spec.known, spec.name
        assert spec.match and all(spec.match), spec.name
        assert spec.family in gpus.FAMILIES, spec.name
        assert spec.cc.count(".") == 1 and all(p.isdigit() for p in spec.cc.split(".")), spec.name
        assert isinstance(spec.sms, int) and spec.sms > 0, spec.name
        assert spec.source.strip(), spec.name
        assert spec.memory_gb and spec.mem_bw_gbs and spec.l2_mb and spec.smem_per_sm_kb, spec.name
        assert spec.fp32_tflops and spec.fp64_tflops, spec.name
        for field_name in spec.derived:
            assert getattr(spec, field_name) is not None, (spec.name, field_name)


def test_rows_missing_a_peak_say_why(rows: list[GPUSpec]) -> None:
    peak_fields = [f.name for f in dataclasses.fields(GPUSpec) if f.name.endswith("_tflops")]
    for spec in rows:
        missing = [f for f in peak_fields if getattr(spec, f) is None]
        if missing:
            assert "left out" in spec.notes, (spec.name, missing)


def test_smem_carveout_follows_compute_capability(rows: list[GPUSpec]) -> None:
    expected = {"7.5": 64, "8.0": 164, "8.6": 100, "8.9": 100, "9.0": 228}
    for spec in rows:
        assert spec.smem_per_sm_kb == expected[spec.cc], spec.name


def test_geforce_fp32_accumulate_is_half_rate(rows: list[GPUSpec]) -> None:
    geforce = [spec for spec in rows if spec.family == "geforce"]
    assert len(geforce) >= 4
    for spec in geforce:
        assert spec.fp16_tensor_fp16acc_tflops is not None, spec.name
        half = spec.fp16_tensor_fp16acc_tflops / 2
        assert spec.fp16_tensor_tflops == pytest.approx(half, abs=ROUNDING_TFLOPS), spec.name
        assert spec.bf16_tensor_tflops == pytest.approx(half, abs=ROUNDING_TFLOPS), spec.name


def test_datacenter_fp32_accumulate_is_full_rate_where_published(rows: list[GPUSpec]) -> None:
    checked = 0
    for spec in rows:
        if spec.family == "geforce" or spec.fp16_tensor_fp16acc_tflops is None:
            continue
        assert spec.fp16_tensor_tflops == spec.fp16_tensor_fp16acc_tflops, spec.name
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize(
    ("name", "fp16_fp32acc", "fp16_fp16acc"),
    [
        # GA102 whitepaper: 71 / 142 dense (142 / 284 are the fp16-acc dense / sparse pair).
        ("GeForce RTX 3090", 71.0, 142.0),
        # Ada whitepaper: 165.2 / 330.3 dense (82.6 is the TF32 and non-tensor FP32 rate).
        ("GeForce RTX 4090", 165.2, 330.3),
        # Datasheets print sparse figures (1979, 242, 733): the database must hold the dense ones.
        ("H100 SXM5", 989.4, 989.4),
        ("L4", 121.0, 121.0),
        ("L40S", 362.05, 362.05),
        ("A100 40GB", 312.0, 312.0),
    ],
)
def test_dense_tensor_figures(
    by_name: dict[str, GPUSpec], name: str, fp16_fp32acc: float, fp16_fp16acc: float
) -> None:
    spec = by_name[name]
    assert spec.fp16_tensor_tflops == fp16_fp32acc
    assert spec.fp16_tensor_fp16acc_tflops == fp16_fp16acc


def test_tensor_peak_matches_sms_times_clock_where_computed(by_name: dict[str, GPUSpec]) -> None:
    # GA10x / AD10x: 1024 dense fp16 flop per clock per SM with fp16 accumulate.
    for name in ("GeForce RTX 3060", "GeForce RTX 4070", "GeForce RTX 3090", "GeForce RTX 4090"):
        spec = by_name[name]
        assert spec.boost_clock_mhz is not None
        computed = spec.sms * 1024 * spec.boost_clock_mhz * 1e6 / 1e12
        assert spec.fp16_tensor_fp16acc_tflops == pytest.approx(computed, rel=0.01), name


def test_a100_40gb_merges_sxm_and_pcie(by_name: dict[str, GPUSpec]) -> None:
    spec = by_name["A100 40GB"]
    assert set(spec.match) == {"NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"}
    assert "merged" in spec.notes
    assert by_name["A100 80GB SXM4"].mem_bw_gbs != by_name["A100 80GB PCIe"].mem_bw_gbs


def test_all_gpus_returns_a_fresh_list_from_one_load(rows: list[GPUSpec]) -> None:
    again = gpus.all_gpus()
    assert again == rows
    again.clear()
    assert gpus.all_gpus() == rows


# ------------------------------------------------------------------------------------ lookup


@pytest.mark.parametrize(("device_name", "expected"), sorted(TORCH_NAMES.items()))
def test_lookup_torch_device_names(device_name: str, expected: str) -> None:
    spec = gpus.lookup(device_name)
    assert spec is not None, device_name
    assert spec.name == expected


@pytest.mark.parametrize(
    ("device_name", "expected"),
    [
        ("nvidia h100 80gb hbm3", "H100 SXM5"),
        ("  NVIDIA   GeForce RTX 3090  ", "GeForce RTX 3090"),
        ("GeForce RTX 3090", "GeForce RTX 3090"),
        ("NVIDIA RTX 4090", "GeForce RTX 4090"),
        ("NVIDIA A100 SXM4 80GB", "A100 80GB SXM4"),
        ("NVIDIA T4", "T4"),
    ],
)
def test_lookup_is_robust_to_case_prefixes_and_separators(device_name: str, expected: str) -> None:
    spec = gpus.lookup(device_name)
    assert spec is not None and spec.name == expected


@pytest.mark.parametrize("device_name", NOT_IN_DATABASE)
def test_lookup_never_matches_a_neighbouring_product(device_name: str) -> None:
    assert gpus.lookup(device_name) is None


def test_lookup_h100_variants_stay_apart() -> None:
    sxm = gpus.lookup("NVIDIA H100 80GB HBM3")
    pcie = gpus.lookup("NVIDIA H100 PCIe")
    nvl = gpus.lookup("NVIDIA H100 NVL")
    assert sxm is not None and pcie is not None and nvl is not None
    assert len({sxm.name, pcie.name, nvl.name}) == 3
    assert sxm.sms == 132 and pcie.sms == 114


def test_lookup_prefers_exact_pattern_over_contained_one() -> None:
    short = dataclasses.replace(gpus.lookup("NVIDIA L4"), name="short", match=("NVIDIA X1",))  # type: ignore[arg-type]
    long = dataclasses.replace(short, name="long", match=("NVIDIA X1 PRO",))
    assert gpus.lookup("NVIDIA X1 PRO", specs=[short, long]) is long
    assert gpus.lookup("NVIDIA X1", specs=[short, long]) is short
    # A name containing both patterns picks the longer (more specific) one.
    assert gpus.lookup("NVIDIA X1 PRO 48GB", specs=[short, long]) is long


def test_lookup_ambiguous_contained_match_gives_none() -> None:
    base = gpus.lookup("NVIDIA L4")
    assert base is not None
    a = dataclasses.replace(base, name="a", match=("NVIDIA X1",))
    b = dataclasses.replace(base, name="b", match=("NVIDIA Y2",))
    assert gpus.lookup("NVIDIA X1 Y2", specs=[a, b]) is None


# ------------------------------------------------------------------------------------- peaks


def test_peak_fp16_tensor_is_dense_fp32_accumulate(by_name: dict[str, GPUSpec]) -> None:
    value, label = gpus.peak_tflops(by_name["GeForce RTX 3090"], "fp16", "tensor")
    assert value == 71.0
    assert label == "dense fp16 tensor, fp32 acc (datasheet)"
    value, label = gpus.peak_tflops(by_name["H100 SXM5"], "bf16", "tensor")
    assert value == 989.4
    assert label == "dense bf16 tensor, fp32 acc (datasheet)"


def test_peak_cuda_core_and_fp32_use_non_tensor_rate(by_name: dict[str, GPUSpec]) -> None:
    spec = by_name["L4"]
    for dtype, compute in [
        ("fp32", "cuda_core"),
        ("fp32", "tensor"),
        ("fp16", "cuda_core"),
        ("bf16", "cuda_core"),
    ]:
        value, label = gpus.peak_tflops(spec, dtype, compute)
        assert value == spec.fp32_tflops == 30.3, (dtype, compute)
        assert label.startswith("fp32 non-tensor"), label


def test_peak_fp64(by_name: dict[str, GPUSpec]) -> None:
    assert gpus.peak_tflops(by_name["A100 40GB"], "fp64", "cuda_core") == (9.7, "fp64 non-tensor (datasheet)")


def test_peak_label_says_when_derived(by_name: dict[str, GPUSpec]) -> None:
    value, label = gpus.peak_tflops(by_name["GeForce RTX 4070"], "fp16", "tensor")
    assert value == pytest.approx(58.29)
    assert "derived" in label


def test_peak_missing_figure_is_none_with_reason(by_name: dict[str, GPUSpec]) -> None:
    value, label = gpus.peak_tflops(by_name["T4"], "bf16", "tensor")
    assert value is None
    assert "not available for T4" in label


def test_peak_rejects_unknown_dtype_and_compute(by_name: dict[str, GPUSpec]) -> None:
    with pytest.raises(FaprofError, match="dtype"):
        gpus.peak_tflops(by_name["L4"], "float16", "tensor")
    with pytest.raises(FaprofError, match="compute"):
        gpus.peak_tflops(by_name["L4"], "fp16", "wmma")


# ------------------------------------------------------------------------------ slug, table


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "a100-sxm4-80gb-mig-1g-10gb"),
        ("NVIDIA", "unknown-gpu"),
    ],
)
def test_slug(name: str, expected: str) -> None:
    assert gpus.slug(name) == expected


def test_as_dataframe_has_one_row_per_gpu(rows: list[GPUSpec]) -> None:
    pd = pytest.importorskip("pandas")
    df = gpus.as_dataframe()
    assert isinstance(df, pd.DataFrame)
    assert len(df) == len(rows)
    assert list(df.columns) == [f.name for f in dataclasses.fields(GPUSpec)]
    h100 = df.set_index("name").loc["H100 SXM5"]
    assert h100["match"] == "NVIDIA H100 80GB HBM3"
    assert h100["fp16_tensor_tflops"] == 989.4
    t4 = df.set_index("name").loc["T4"]
    assert t4["bf16_tensor_tflops"] is None or math.isnan(t4["bf16_tensor_tflops"])


# ---------------------------------------------------------------------------- malformed data

GOOD_ROW = """
[[gpu]]
name = "Test GPU"
family = "datacenter"
match = ["NVIDIA Test GPU"]
cc = "8.0"
sms = 10
fp32_tflops = 1.0
fp16_tensor_tflops = 8.0
fp16_tensor_fp16acc_tflops = 8.0
source = "made up for the test"
"""


def test_loader_reads_an_explicit_path(tmp_path: Path) -> None:
    specs = gpus.all_gpus(_write(tmp_path, GOOD_ROW))
    assert [s.name for s in specs] == ["Test GPU"]
    assert specs[0].match == ("NVIDIA Test GPU",)
    assert specs[0].l2_mb is None
    assert gpus.lookup("NVIDIA Test GPU", specs=specs) is specs[0]


@pytest.mark.parametrize(
    ("replace", "by", "message"),
    [
        ("sms = 10", 'sms = "ten"', r"'Test GPU'.*key 'sms'"),
        ("sms = 10", "sms = 0", r"'Test GPU'.*key 'sms'"),
        ('cc = "8.0"', "cc = 8.0", r"'Test GPU'.*key 'cc'"),
        ('family = "datacenter"', 'family = "gaming"', r"'Test GPU'.*key 'family'"),
        ('match = ["NVIDIA Test GPU"]', "match = []", r"'Test GPU'.*key 'match'"),
        ("fp32_tflops = 1.0", "fp32_tflops = -1.0", r"'Test GPU'.*key 'fp32_tflops'"),
        ("fp32_tflops = 1.0", "fp32_tflops = true", r"'Test GPU'.*key 'fp32_tflops'"),
        ("fp32_tflops = 1.0", "fp32_tflop = 1.0", r"'Test GPU'.*unknown key.*fp32_tflop"),
        ('source = "made up for the test"', "", r"'Test GPU'.*missing required key 'source'"),
        ("fp16_tensor_tflops = 8.0", "fp16_tensor_tflops = 16.0", r"'Test GPU'.*key 'fp16_tensor_tflops'"),
        ("fp32_tflops = 1.0", 'derived = ["l2_mb"]', r"'Test GPU'.*key 'derived'"),
        ('name = "Test GPU"', "name = 3", r"row 1: key 'name'"),
    ],
)
def test_malformed_row_raises_naming_row_and_key(tmp_path: Path, replace: str, by: str, message: str) -> None:
    assert replace in GOOD_ROW
    path = _write(tmp_path, GOOD_ROW.replace(replace, by))
    with pytest.raises(FaprofError, match=message):
        gpus.all_gpus(path)


def test_duplicate_match_pattern_across_rows_raises(tmp_path: Path) -> None:
    second = GOOD_ROW.replace('name = "Test GPU"', 'name = "Other GPU"').replace(
        "NVIDIA Test GPU", "Test GPU"
    )
    with pytest.raises(FaprofError, match=r"row 2 \('Other GPU'\).*key 'match'.*also matches 'Test GPU'"):
        gpus.all_gpus(_write(tmp_path, GOOD_ROW + second))


def test_duplicate_name_raises(tmp_path: Path) -> None:
    second = GOOD_ROW.replace("NVIDIA Test GPU", "NVIDIA Test GPU 2")
    with pytest.raises(FaprofError, match=r"row 2 \('Test GPU'\).*key 'name'.*duplicate"):
        gpus.all_gpus(_write(tmp_path, GOOD_ROW + second))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[gpu]\nname = ", "not valid TOML"),
        ("schema = 1\n", r"at least one \[\[gpu\]\]"),
        ("schema = 2\n" + GOOD_ROW, "schema 2 not supported"),
        ("colour = 1\n" + GOOD_ROW, "unknown top-level key"),
    ],
)
def test_malformed_file_raises(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(FaprofError, match=message):
        gpus.all_gpus(_write(tmp_path, text))


def test_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FaprofError, match="not found"):
        gpus.all_gpus(tmp_path / "nope.toml")
