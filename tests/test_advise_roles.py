"""The roles of a call's kernels (faprof.advisor.roles) and what they change in the diagnosis: a kernel that
does none of the problem's math (a copy, cast, combine) gets no math cause and no share of the exact FLOPs,
its time is one term of the gap, and the cause that says what it moves claims that term.

Recorded fixture: tests/data/planted/*planted-decode (H100 2026-11-28, faprof set + source pass):
planted_kv_repeat (K/V repeated per query head by two PyTorch copy kernels, then decode_splitkv's kernel on
the copies) against decode_splitkv. Small hand-built tables exercise the rules one at a time.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from faprof import advisor
from faprof.advisor import differential, evidence, partition, producers, roles, rules_call, sources
from faprof.advisor.rules_kernel import Context
from faprof.advisor.rules_pair import pair_findings
from faprof.nsight.ncu import source
from faprof.store import Bundle

DECODE = next((Path(__file__).parent / "data" / "planted").glob("*planted-decode"))
B16 = "b16_h32kv8_sq1_sk8192_d128_fp16_causal_br_fwd"
B4 = "b4_h32kv8_sq1_sk16384_d128_fp16_causal_br_fwd"


@pytest.fixture(scope="module")
def bundle():
    return Bundle.open(DECODE)


@pytest.fixture(scope="module")
def calls(bundle):
    return {(c.variant, c.shape_id): c for c in evidence.calls_from(evidence.tables_from(bundle))}


@pytest.fixture(scope="module")
def diag(bundle):
    return advisor.diagnose(bundle, against="decode_splitkv")


def _absolute(call):
    import importlib

    return importlib.import_module("faprof.advisor.diagnose")._absolute(call, Context())


# ------------------------------------------------------------------------------ roles, recorded
def test_copy_kernels_are_data_movement_and_carry_none_of_the_exact_flops(calls):
    kv = calls[("planted_kv_repeat", B16)]
    moving = roles.movers(kv)
    assert [lz.kernel for lz in moving] == ["elementwise_kernel", "elementwise_kernel"]
    assert roles.input_movers(kv) == moving  # launched before the math kernel: copies of the inputs
    # their FLOPs are the compiler's HFMA2.MMA register moves: a few per hundred instructions
    assert all(roles.flops_per_inst(lz) < 0.1 for lz in moving)
    (math_k,) = roles.math_launches(kv)
    assert math_k.kernel == "decode_splitkv_kernel" and roles.flops_per_inst(math_k) > 5
    assert [roles.math_share(kv, lz) for lz in kv.launches] == [0.0, 0.0, 1.0]
    assert roles.exact_flops(kv, math_k) == pytest.approx(kv.analytic_flops)
    # the twin: one kernel (nothing to move); at B4 its combine kernel runs after the math
    assert roles.movers(calls[("decode_splitkv", B16)]) == []
    twin4 = calls[("decode_splitkv", B4)]
    assert [lz.kernel for lz in roles.movers(twin4)] == ["decode_combine_kernel"]
    assert roles.input_movers(twin4) == []


def _launch(kid, kernel, flops, inst, ms=1.0):
    return evidence.Launch(kernel, kid, kid, {"duration_ms": ms, "tensor_flops": flops, "fp32_flops": 0.0},
                           {"smsp__thread_inst_executed.sum": inst} if inst is not None else {}, "9.0", share=0.5)


def test_a_call_is_never_all_data_movement_and_nothing_is_decided_without_counters():
    call = evidence.Call("v", "s", analytic_flops=1e9)
    call.launches = [_launch(0, "a", 1e6, 1e8)]  # one kernel: it does the call's math whatever its density
    assert roles.movers(call) == []
    call.launches = [_launch(0, "a", 1e6, 1e8), _launch(1, "b", 3e6, 1e8)]  # both below the limit: none
    assert roles.movers(call) == []
    call.launches = [_launch(0, "a", 1e6, 1e8), _launch(1, "b", 3e9, None)]  # a launch without the counter
    assert roles.movers(call) == []
    call.launches = [_launch(0, "a", 1e9, 1e9), _launch(1, "b", 3e9, 1e9)]  # two math kernels share by FLOPs
    assert roles.movers(call) == []
    assert [roles.exact_flops(call, lz) for lz in call.launches] == pytest.approx([2.5e8, 7.5e8])


def test_more_cuda_core_math_beside_tensor_core_products_is_element_wise_work():
    """pipe:fma / pipe:fp16 terms: 'do QKᵀ and PV on tensor cores' only where the products are not there yet;
    beside tensor-core products the extra instructions are per-score work (softmax, rescales, masks)."""
    from faprof.advisor.gap_findings import _term_fix

    term = differential.Term("pipe:fma", "instructions", 0.1)
    on_tc = evidence.Call("v", "s", analytic_flops=1e9)
    on_tc.launches = [evidence.Launch("k", 0, 0, {"duration_ms": 1.0, "tensor_flops": 9e8, "fp32_flops": 1e8},
                                      {"smsp__thread_inst_executed.sum": 1e8}, "9.0", share=1.0)]
    on_cuda = evidence.Call("v", "s", analytic_flops=1e9)
    on_cuda.launches = [evidence.Launch("k", 0, 0, {"duration_ms": 1.0, "tensor_flops": 0.0, "fp32_flops": 1e9},
                                        {"smsp__thread_inst_executed.sum": 1e9}, "9.0", share=1.0)]
    no_counters = evidence.Call("v", "s", analytic_flops=1e9)
    no_counters.launches = [evidence.Launch("k", 0, 0, {"duration_ms": 1.0}, {}, "9.0", share=1.0)]
    assert roles.products_on_tensor_cores(on_tc)
    assert not roles.products_on_tensor_cores(on_cuda) and not roles.products_on_tensor_cores(no_counters)
    assert "rescale the accumulator once per key tile" in _term_fix(term, on_tc)
    assert "tensor cores" not in _term_fix(term, on_tc).split(" (points to")[0]
    assert _term_fix(term, on_cuda).startswith("do QKᵀ and PV on tensor cores")
    assert _term_fix(term, no_counters).startswith("do QKᵀ and PV on tensor cores")
    other = differential.Term("pipe:alu", "instructions", 0.1)
    assert _term_fix(other, on_tc) == _term_fix(other, on_cuda)


# --------------------------------------------------------------------------- the gap, recorded
@pytest.mark.parametrize("shape", [B16, B4])
def test_the_copy_kernels_are_one_term_and_the_terms_still_sum_to_the_gap(calls, shape):
    kv, twin = calls[("planted_kv_repeat", shape)], calls[("decode_splitkv", shape)]
    gap = differential.decompose(kv, twin)
    assert gap is not None
    moved = gap.term(differential.INPUTS_TERM)
    # the copies' share of Nsight Compute's durations of the call, in its timed median (the twin copies nothing)
    ms_a = kv.measurement["median_ms"] * roles.moved_ms(kv, roles.input_movers(kv)) / kv.profiled_ms
    assert roles.input_movers(twin) == []
    assert moved is not None and moved.ms == pytest.approx(ms_a) and moved.ms > 0.75 * gap.gap_ms
    assert math.fsum(t.ms for t in gap.terms) == pytest.approx(gap.gap_ms, rel=1e-12)
    assert math.fsum(t.log for t in gap.terms) == pytest.approx(gap.log_ratio, rel=1e-12)
    # the accounting of the math part compares the two decode kernels alone
    assert gap.account_a.kernels == 1 and gap.account_b.kernels == 1
    p = partition.partition(gap, (own := _absolute(kv)) + pair_findings(kv, twin, own), _absolute(twin))
    assert math.isclose(p.total_ms, gap.gap_ms, rel_tol=1e-9)
    assert p.causes()[0].key == "excess_dram_bytes"
    assert differential.INPUTS_TERM in {t.key for t in p.causes()[0].terms}
    assert gap.term(differential.MOVERS_TERM) is None if shape == B16 else gap.term(differential.MOVERS_TERM).ms < 0


def test_the_decode_plant_is_diagnosed_as_bytes_with_the_gqa_fix(diag):
    for shape in (B16, B4):
        mine = diag[(diag["variant"] == "planted_kv_repeat") & (diag["shape_id"] == shape)]
        p = mine[mine["primary"]].iloc[0]
        assert p["cause"] == "excess_dram_bytes" and p["unit"] == "gap"
        assert "transformed copies of the inputs" in p["evidence"] and "4x the compulsory bytes" in p["evidence"]
        assert "KV head h // 4" in p["fix"]
        # no competing math or RMW cause: the copy kernels do no math, and no kernel reads back its own writes
        assert not {"tensor_cores_unused", "transcendentals", "global_rmw", "wasted_work",
                    "slower_math_path"} & set(mine["cause"])
        # the fusion finding says what the extra kernels move, under the bytes cause
        kpc = mine[mine["cause"] == "kernels_per_call"].iloc[0]
        assert kpc["parent"] == "excess_dram_bytes" and "read the inputs in place" in kpc["fix"]
        assert "scores" not in kpc["fix"]
        # its line: a K/V load of the decode kernel (the cp.async of K, line 256, or of V, 257), from its own
        # profile (the source pass profiled the kernel doing the math, not the longer copy kernels)
        assert "charged to their producer" in p["source"] and "LDGSTS" in p["source"]
        assert "decode_splitkv.cu:256" in p["source"] or "decode_splitkv.cu:257" in p["source"]
        assert "profile of the same kernel code" not in p["source"]


def test_special_functions_per_score_count_the_scores_the_kernel_computed(diag, calls):
    """decode_splitkv computes a 16-row tile per KV head (1 real row at group 1, 4 at group 4): XU per score is
    its MUFU count over the scores its products stand for (executed FLOPs / 4D), about 1.26 on both sides."""
    from faprof.advisor.rules_kernel import _computed_scores

    for key in (("planted_kv_repeat", B16), ("decode_splitkv", B16)):
        c = calls[key]
        lz = roles.math_launches(c)[0]
        per = lz.metric("thread_inst_xu") / _computed_scores(c, lz)
        assert 1.0 < per < advisor.THRESHOLDS["XU_PER_SCORE_MAX"].value
    assert "transcendentals" not in set(diag["cause"])


# -------------------------------------------------------------------------------- rules, by hand
def _call(launches: list[dict], metrics: dict[int, dict[str, float]]) -> evidence.Call:
    summ = pd.DataFrame([{"variant": "v", "shape_id": "s", "kernel_id": k, "launch": k, "cc": "9.0", **r}
                         for k, r in enumerate(launches)])
    mrows = [{"kernel_id": k, "metric": n, "value": x} for k, d in metrics.items() for n, x in d.items()]
    t = {"ncu_summary": summ, "ncu_metrics": pd.DataFrame(mrows, columns=["kernel_id", "metric", "value"]),
         "measurements": pd.DataFrame([{"variant": "v", "shape_id": "s", "dtype": "fp16", "min_bytes": 1e6,
                                        "mem_bw_gbs": 3000.0, "status": "ok"}])}
    (c,) = evidence.calls_from(evidence.tables_from(t))
    return c


def _k(name, flops, ms=1.0, dram=1e6):
    return {"kernel": name, "duration_ms": ms, "tensor_flops": flops, "fp32_flops": 0.0, "dram_bytes": dram,
            "dram_read_bytes": dram / 2, "dram_write_bytes": dram / 2}


def test_the_fusion_fix_fits_what_the_extra_kernels_move():
    inst = {"smsp__thread_inst_executed.sum": 1e8}
    metrics = {k: inst for k in range(3)}
    # a copy before the math: materialised inputs
    before = _call([_k("copy", 1e6), _k("attn", 1e10), _k("epilogue", 2e6)], metrics)
    (f,) = rules_call.kernels_per_call(before, Context())
    assert "read the inputs in place" in f.fix and "before the first math kernel" in f.evidence
    assert "after the last math kernel: an epilogue" in f.evidence
    # a kernel between two products: intermediates (unfused attention), whatever else runs beside it
    between = _call([_k("scale_q", 1e6), _k("qk", 1e10), _k("softmax", 1e6), _k("pv", 1e10)], {k: inst for k in range(4)})
    (g,) = rules_call.kernels_per_call(between, Context())
    assert "scores and probabilities stay on chip" in g.fix and "between math kernels" in g.evidence
    # only a combine after the math: an epilogue to fold in
    after = _call([_k("attn", 1e10), _k("combine", 1e6)], metrics)
    (e,) = rules_call.kernels_per_call(after, Context())
    assert "fold the epilogue into the math kernel" in e.fix
    # without the instruction counters nothing is decided: the unfused fix, as before
    bare = _call([_k("qk", 1e10), _k("softmax", 1e6), _k("pv", 1e10)], {})
    (h,) = rules_call.kernels_per_call(bare, Context())
    assert "scores and probabilities stay on chip" in h.fix and "data-movement" not in h.evidence


def test_a_long_scoreboard_stall_after_a_depbar_is_charged_to_the_cp_async_it_waits_for():
    sass = ["LDGSTS.E.BYPASS.LTC128B.128 [R4+0x4000], desc[UR10][R22.64]", "IADD3 R7, R7, 0x1, RZ",
            "LDGDEPBAR", "DEPBAR.LE SB0, 0x1", "SHF.R.U32.HI R9, RZ, 0x1, R7", "BRA 0x0"]
    code = [producers.parse(s, i) for i, s in enumerate(sass)]
    code[4].samples["long_scoreboard"] = 10.0
    b = producers.blame(code, ("long_scoreboard",))
    assert list(b["producer_sass"]) == [sass[0]] and b["samples"].sum() == 10.0
    # a stall whose register comes from a load is still charged to the load, DEPBAR or not
    sass2 = ["LDG.E R7, desc[UR4][R2.64]", "DEPBAR.LE SB0, 0x1", "IADD3 R9, R7, 0x1, RZ"]
    code2 = [producers.parse(s, i) for i, s in enumerate(sass2)]
    code2[2].samples["long_scoreboard"] = 4.0
    assert list(producers.blame(code2, ("long_scoreboard",))["producer_sass"]) == [sass2[0]]


def test_source_rows_are_borrowed_only_for_the_same_kernel_code(bundle, calls):
    # as a recording made before the source pass picked the kernel doing the math had it: the twin's rows only
    lines = bundle.read("source_lines")
    assert set(lines["variant"]) == {"decode_splitkv", "planted_kv_repeat"}
    lines = lines[lines["variant"] == "decode_splitkv"].reset_index(drop=True)
    got = sources.borrow(lines, list(calls.values()))
    mine = got[got["variant"] == "planted_kv_repeat"]
    assert set(mine["kernel"]) == {"decode_splitkv_kernel"} and set(mine["shape_id"]) == {B16}
    assert set(mine[sources.BORROWED]) == {"decode_splitkv"} and len(mine) == len(lines)
    # another code under the same short name is not the same kernel
    other = calls[("planted_kv_repeat", B16)]
    for lz in other.launches:
        lz.row = {**lz.row, "kernel_demangled": f"{lz.row['kernel_demangled']}_other"}
    try:
        assert sources.borrow(lines, list(calls.values())).equals(lines)
    finally:
        for lz in other.launches:
            lz.row = {**lz.row, "kernel_demangled": lz.row["kernel_demangled"].removesuffix("_other")}


def test_the_source_pass_profiles_the_kernel_doing_the_math(bundle):
    """Its longest kernel is a PyTorch copy (no line info): the kernel that executed the most FLOPs is the
    decode kernel, the same code as the twin's, so one profile serves both."""
    targets = source.plan_source(bundle.read("ncu_summary"))
    assert [(t.variant, t.shape_id, t.kernel, t.also) for t in targets] == [
        ("decode_splitkv", B16, "decode_splitkv_kernel", ("planted_kv_repeat",))]
    # without FLOP counters: the longest kernel, as before
    summ = bundle.read("ncu_summary").drop(columns=["hw_flops"])
    kv = [t for t in source.plan_source(summ) if "planted_kv_repeat" in (t.variant, *t.also)]
    assert [t.kernel for t in kv] == ["elementwise_kernel"]


def test_the_outputs_a_read_modify_write_is_weighed_against_are_the_packed_query_tokens():
    """A packed (varlen) batch writes total_q rows of output, not B x the longest sequence: global_rmw's
    'writes beyond the problem's outputs' must not get the padded batch's bytes for free."""
    from faprof.advisor.evidence import Call
    from faprof.advisor.rules_pair import _output_bytes
    from faprof.model.problem import AttentionProblem

    packed = AttentionProblem(B=3, H=4, Hkv=2, Sq=100, Sk=100, D=32, dtype="fp16", causal=True,
                              seqlens_q=(100, 50, 7), seqlens_k=(100, 50, 7))
    dense = AttentionProblem(B=2, H=4, Sq=64, Sk=64, D=32, dtype="fp16")
    assert _output_bytes(Call("v", packed.shape_id, packed.to_row())) == 157 * 4 * 32 * 2
    assert _output_bytes(Call("v", dense.shape_id, dense.to_row())) == 2 * 64 * 4 * 32 * 2
