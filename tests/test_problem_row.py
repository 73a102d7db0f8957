"""A problem survives its table row: AttentionProblem.from_row(p.to_row()) == p, through parquet too.
(Before, readers rebuilt problems from B, H, Sq, Sk, D and causal only: every bottom-right decode row
read back as top-left causal, so the report called its FLOP count one 'this faprof does not recognise'
and the byte accounting's compulsory bytes were those of another mask.)"""

import math

import pandas as pd
import pytest

from faprof.model.problem import AttentionProblem

PROBLEMS = [
    AttentionProblem(B=2, H=4, Sq=64, Sk=64, D=32, dtype="fp16", causal=True),
    AttentionProblem(B=16, H=64, Sq=4, Sk=1024, D=128, dtype="bf16", Hkv=8, causal=True, mask_align="bottom_right"),
    AttentionProblem(B=2, H=32, Sq=8192, Sk=8192, D=128, dtype="bf16", Hkv=8, causal=True, window=(4095, 0)),
    AttentionProblem(B=3, H=4, Sq=9, Sk=17, D=64, dtype="fp16", Hkv=2, causal=True, seqlens_q=(9, 1, 4),
                     seqlens_k=(17, 5, 9), softcap=30.0, scale=0.1),
    AttentionProblem(B=2, H=8, Sq=1, Sk=512, D=128, dtype="bf16", Hkv=1, page_size=256, pool_blocks=5,
                     block_table=((3, 0), (4, 1)), seqlens_k=(512, 300), causal=True, mask_align="bottom_right"),
]


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.shape_id)
def test_row_round_trip(p, tmp_path):
    assert AttentionProblem.from_row(p.to_row()) == p
    f = tmp_path / "rows.parquet"
    pd.DataFrame([p.to_row()]).to_parquet(f)
    back = AttentionProblem.from_row(pd.read_parquet(f).iloc[0])
    assert back == p and back.shape_id == p.shape_id and math.isclose(back.flops(), p.flops())


def test_a_row_that_forms_no_problem_is_none():
    assert AttentionProblem.from_row({"B": 1, "H": 3, "Hkv": 2, "Sq": 4, "Sk": 4, "D": 32}) is None  # H % Hkv
    assert AttentionProblem.from_row({}) is None
