"""The Triton tutorial's TMA row offset in a real Triton kernel on the GPU (issue 34 item 4; GPU test).

Method: tests/wrong/kernels/wrong_triton_tma_offset.py is examples/kernels/triton_attn.py with the
tutorial's `offset_y = off_z + off_h * N_CTX` planted; it runs through `runner.profile` in this process
beside the correct triton_attn on tests/wrong/wrong_where_gpu.toml (B=1, and B=2 and 4). At B=1 it must
be right; at B>1 wrong, explained first as "correct at B=1, wrong when B>1, and batch b's output lands
in batch 0's rows" with no other signature on the randn inputs (the race and the unwritten rows are
what that explains); the correct kernel gets no signature.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faprof.correctness import wrong_text
from faprof.run import ProfileOptions, profile

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
WRONG = ROOT / "tests" / "wrong"
SPECS = [f"wrong_triton_tma_offset={WRONG / 'kernels' / 'wrong_triton_tma_offset.py'}:wrong_triton_tma_offset",
         f"triton_attn={ROOT / 'examples' / 'kernels' / 'triton_attn.py'}:triton_attn"]
B1 = "b1_h4_sq256_sk256_d64_fp16_causal_fwd"
MULTI = ("b2_h2_sq128_sk128_d64_fp16_causal_fwd", "b4_h4_sq512_sk512_d64_fp16_full_fwd")
LEAD = "correct at B=1, wrong when B>1, and batch b's output lands in batch 0's rows"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("triton")
    bundle = profile(WRONG / "wrong_where_gpu.toml", ProfileOptions(out_dir=tmp_path_factory.mktemp("runs"),
                                                                    isolate=False, ceilings=False, user_variants=SPECS))
    return bundle, bundle.measurements().set_index(["variant", "shape_id"]), bundle.read("error_maps")


def test_right_at_b1(run):
    _, df, _ = run
    r = df.loc[("wrong_triton_tma_offset", B1)]
    assert r["status"] == "ok", r["reason"]


@pytest.mark.parametrize("shape", MULTI)
def test_wrong_at_b_gt_1_and_explained_as_batch_b_landing_in_batch_0(run, shape):
    bundle, df, maps = run
    r = df.loc[("wrong_triton_tma_offset", shape)]
    assert r["status"] == "wrong" and r["bug_signature"] == "placement", r["reason"]
    sigs = json.loads(r["signatures"])
    assert sigs[0]["title"].startswith(LEAD), sigs[0]["title"]
    assert sigs[0]["kind"].startswith("offset_batch_unscaled_both")
    assert not [s for s in sigs[1:] if "randn" in s["check_input"].split(", ")], sigs
    lines = wrong_text.explain_wrong_rows(bundle.measurements(), maps, "wrong_triton_tma_offset", shape)
    print("\n".join(lines))  # the text the report quotes
    assert LEAD in lines[0]


def test_the_correct_triton_kernel_gets_no_signature(run):
    _, df, _ = run
    for shape in (B1, *MULTI):
        r = df.loc[("triton_attn", shape)]
        assert r["status"] == "ok" and not isinstance(r["signatures"], str), (shape, r["reason"])
