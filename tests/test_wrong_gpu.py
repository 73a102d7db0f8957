"""Planted wrong GPU kernels, and every correct GPU variant against the adversarial inputs (GPU tests).

Method: two user kernels copied from examples/kernels/simple_attn.cu with one bug each
(tests/wrong/kernels: the inputs' batch offset dropped; the causal limit off by one) run through
`runner.profile` in this process with the correct simple_attn, torch_standard, sdpa_flash and
fa2_mma on tests/wrong/wrong_gpu.toml; the bundle must name each bug's family first, locate it in
the error map, and give the correct variants no signature (their probes all pass). Then every
correct faprof and PyTorch variant that runs on this GPU is checked on the probes of a few shapes
(fp16 / bf16 / fp32, causal and not, backward): none may be flagged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faprof import variants
from faprof.correctness import adversarial, wrong_text
from faprof.correctness import check as correctness
from faprof.correctness.reference import compute_reference
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE
from faprof.run import ProfileOptions, profile
from faprof.timing.harness import probe_checker

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
WRONG = ROOT / "tests" / "wrong"
SPECS = [f"wrong_batch_offset={WRONG / 'kernels' / 'wrong_batch_offset.cu'}:wrong_batch_offset",
         f"wrong_causal_shift={WRONG / 'kernels' / 'wrong_causal_shift.cu'}:wrong_causal_shift",
         f"simple_attn={ROOT / 'examples' / 'kernels' / 'simple_attn.cu'}:simple_attn"]
CAUSAL = "b2_h2_sq128_sk128_d64_fp16_causal_fwd"
FULL = "b3_h2_sq200_sk200_d64_fp16_full_fwd"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    bundle = profile(WRONG / "wrong_gpu.toml", ProfileOptions(out_dir=tmp_path_factory.mktemp("runs"), isolate=False,
                                                              ceilings=False, user_variants=SPECS))
    df = bundle.measurements().set_index(["variant", "shape_id"])
    return bundle, df, bundle.read("error_maps")


def test_batch_offset_kernel_is_a_stride_bug_batch_0_right(run):
    bundle, df, maps = run
    for shape in (CAUSAL, FULL):
        r = df.loc[("wrong_batch_offset", shape)]
        assert r["status"] == "wrong" and r["bug_signature"] == "stride", r["reason"]
        top = json.loads(r["signatures"])[0]
        assert top["kind"] == "slice_copy" and "batch 0's answer" in top["title"] and top["share"] >= 0.9
        m = maps[(maps["variant"] == "wrong_batch_offset") & (maps["shape_id"] == shape) &
                 (maps["check_input"] == "randn") & (maps["axis"] == "batch")].set_index("bin")
        assert m.loc["0", "n_bad"] == 0 and (m.drop(index="0")["share_bad"] > 0.9).all()
        assert m["n_unwritten"].sum() == 0
    lines = wrong_text.explain_wrong_rows(bundle.measurements(), maps, "wrong_batch_offset", CAUSAL)
    assert "stride/offset bug" in lines[0]


def test_causal_off_by_one_kernel_is_a_shifted_mask_and_only_under_the_mask(run):
    bundle, df, maps = run
    r = df.loc[("wrong_causal_shift", CAUSAL)]
    assert r["status"] == "wrong" and r["bug_signature"] == "causal_mask", r["reason"]
    assert json.loads(r["signatures"])[0]["kind"] == "mask_shift_plus"
    m = maps[(maps["variant"] == "wrong_causal_shift") & (maps["shape_id"] == CAUSAL) &
             (maps["check_input"] == "randn") & (maps["axis"] == "mask")].set_index("bin")
    assert m.loc["rows seeing every key", "n_bad"] == 0
    assert df.loc[("wrong_causal_shift", FULL), "status"] == "ok"  # no mask, no bug
    lines = wrong_text.explain_wrong_rows(bundle.measurements(), maps, "wrong_causal_shift", CAUSAL)
    assert "causal mask" in lines[0]


def test_correct_variants_get_no_signature_and_pass_every_probe(run):
    _, df, _ = run
    for v in ("simple_attn", "torch_standard", "sdpa_flash", "fa2_mma"):
        for shape in (CAUSAL, FULL):
            r = df.loc[(v, shape)]
            assert r["status"] == "ok", (v, shape, r["reason"])
            assert not isinstance(r["signatures"], str) and not isinstance(r["bug_signature"], str)
            # every probe passes or is one the variant's support test declines (sdpa_flash: causal Sq != Sk)
            assert {p["status"] for p in json.loads(r["probes"])} <= {"ok", "skipped"}, (v, shape, r["probes"])


SHAPES = [
    AttentionProblem(B=2, H=3, Sq=128, Sk=128, D=64, dtype="fp16", causal=True),
    AttentionProblem(B=2, H=3, Sq=200, Sk=200, D=128, dtype="bf16", causal=False),
    AttentionProblem(B=2, H=3, Sq=128, Sk=128, D=64, dtype="fp32", causal=True),
    AttentionProblem(B=2, H=3, Sq=128, Sk=128, D=64, dtype="fp16", causal=True, direction="fwd_bwd"),
    AttentionProblem(B=2, H=3, Sq=128, Sk=128, D=64, dtype="fp32", causal=False, direction="bwd"),
]


@pytest.mark.parametrize("problem", SHAPES, ids=[p.shape_id for p in SHAPES])
def test_no_correct_variant_is_flagged_by_a_probe(problem):
    inputs = correctness.make_inputs(problem, "cuda", seed=2025)
    ps = adversarial.ProbeSet(problem, "cuda", lambda p, i: compute_reference(p, i, cuda_ok=True),
                              inputs.seed)
    tol = DEFAULT_TOLERANCE[problem.dtype]
    ran = []
    planted = {spec.split("=", 1)[0] for spec in SPECS if "wrong" in spec.split("=", 1)[0]}
    for v in variants.all_variants():
        if v.name in planted or not v.supports(problem, cuda_available=True)[0]:
            continue
        dev = v.resolved_device(True)
        # the check faprof runs on a probe (the randn check's tolerance plus the probe's rounding slack)
        res = adversarial.run(ps, lambda p, v=v: v.supports(p, cuda_available=True), probe_checker(v, dev, tol))
        bad = [(r["name"], r["status"], r["reason"]) for r in res["probes"] if r["status"] not in ("ok", "skipped")]
        assert not bad, (v.name, bad)
        ran.append(v.name)
    assert ran
