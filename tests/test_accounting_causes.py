"""Issue 44 item 2, a physically sound accounting: a stall counts under the reason it waits for, and four
mechanisms the planted set did not cover are causes of their own (barrier imbalance, global atomics,
dependent global loads, divisions and extra special functions per score).

Small objects built in code (accounts, gaps, launches, SASS listings in ncu's text form); the recorded
bundles are read by tests/test_advise_planted.py and tests/test_partition.py.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from faprof.advisor import accounting, differential, evidence, partition, producers, rules_code
from faprof.advisor.causes import CAUSES, DEFECT_CAUSES, MECHANISMS, problems
from faprof.advisor.findings import Finding
from faprof.advisor.rules_kernel import Context


def _account(barrier: float, other: float, cbu: float = 1e6, inst: float = 1e8, lanes: float = 32.0) -> accounting.Account:
    return accounting.Account("v", "s", "k", 1, 1.0, {"selected": other * 0.2, "barrier": barrier, "wait": other * 0.8},
                              {"cbu": cbu, "fma_int": inst / 2, "alu": inst / 2 - cbu}, inst, 1e9, 1e9, 1e9,
                              thread_inst=inst * lanes)


def test_the_new_causes_have_records_that_hold_together():
    assert problems() == []
    for key in ("barrier_imbalance", "global_atomics", "dependent_global_loads"):
        assert key in CAUSES and key in MECHANISMS and key in DEFECT_CAUSES
    assert "stall:barrier" in CAUSES["barrier_imbalance"].claims
    assert "uncoalesced_global" in CAUSES["global_atomics"].absorbs


def test_barrier_imbalance_reads_where_the_added_work_ran():
    ref = _account(barrier=1e8, other=1e9)
    # every warp does the added work: the barrier wait grows by the slowest sibling's lead only
    even = _account(barrier=1.1e8, other=2e9)
    assert accounting.barrier_imbalance(even, ref) == pytest.approx(0.01)
    # one warp in four does it: the three others wait 3x its added time at the barrier
    one_in_four = _account(barrier=1e8 + 3e9, other=2e9)
    assert accounting.barrier_imbalance(one_in_four, ref) == pytest.approx(3.0)
    assert accounting.barrier_imbalance(_account(barrier=5e7, other=2e9), ref) == 0.0
    assert math.isinf(accounting.barrier_imbalance(_account(barrier=2e8, other=9e8), ref))


def _gap(a: accounting.Account, b: accounting.Account) -> differential.Gap:
    """A gap whose positive terms are the barrier stall and the integer instructions (each 40 µs of 100 µs)."""
    terms = [differential.Term("stall:barrier", "cycles per instruction", 0.1, 2.0, 1.0, 0.4, 0.04),
             differential.Term("pipe:fma_int", "instructions", 0.1, 6e7, 4e7, 0.4, 0.04),
             differential.Term("pipe:alu", "instructions", 0.05, 4e7, 3e7, 0.2, 0.02),
             differential.Term("residual", "residual", 0.0, share=0.0, ms=0.0)]
    return differential.Gap("v", "ref", "s", 0.2, 0.1, terms, a, b)


def test_a_barrier_wait_for_work_few_warps_do_is_never_folded_into_a_pipe():
    """The misdiagnosis of issue 44: warps waiting at __syncthreads while one thread loads the block's tile got
    'integer multiply-adds' as primary with the barrier folded into that term. At equal barrier counts the wait
    is the siblings' delay only where every warp does the added work."""
    ref = _account(barrier=1e8, other=1e9)
    even = partition.partition(_gap(_account(barrier=1.1e8, other=2e9), ref), [], [])
    barrier_in = [p.key for p in even.parts for t in p.terms if t.key == "stall:barrier"]
    assert barrier_in == ["pipe:fma_int"]  # spread over the rising integer work (spills' case)
    skewed = _gap(_account(barrier=1e8 + 3e9, other=2e9), ref)
    alone = partition.partition(skewed, [], [])
    assert alone.part("stall:barrier") is not None and len(alone.part("stall:barrier").terms) == 1
    assert all(t.key != "stall:barrier" for t in alone.part("pipe:fma_int").terms)
    # with the imbalance found, its finding owns the barrier wait (and ranks above the integer work)
    f = Finding("v", "s", "barrier_imbalance", 0.3, "at equal barrier counts ...", "share the work", "barrier_imbalance",
                claims=("lanes:inactive",))
    named = partition.partition(skewed, [f], [])
    assert [t.key for t in named.part("barrier_imbalance").terms] == ["stall:barrier"]
    assert math.fsum(p.ms for p in named.parts) == pytest.approx(0.1)


def test_the_barrier_imbalance_rule_compares_the_call_with_its_reference(monkeypatch):
    accounts = {"slow": _account(barrier=1e8 + 3e9, other=2e9, lanes=20.0), "fast": _account(barrier=1e8, other=1e9),
                "even": _account(barrier=1.1e8, other=2e9), "more": _account(barrier=4e9, other=2e9, cbu=4e6)}
    monkeypatch.setattr(rules_code, "call_account", lambda call, launches=None: accounts[call.variant])
    monkeypatch.setattr(rules_code, "math_launches", lambda call: call.launches)
    call = {k: evidence.Call(k, "s") for k in accounts}
    [f] = rules_code.barrier_imbalance(call["slow"], call["fast"])
    assert f.cause == "barrier_imbalance" and "3.0x" in f.evidence and "25% of a block's warps" in f.evidence
    assert f.claims == ("lanes:inactive",)
    assert rules_code.barrier_imbalance(call["even"], call["fast"]) == []
    # the same barrier growth on full warps: exposed latency as much as imbalance, the barrier's own term says it
    accounts["latency"] = _account(barrier=1e8 + 3e9, other=2e9)
    assert rules_code.barrier_imbalance(evidence.Call("latency", "s"), call["fast"]) == []
    assert rules_code.barrier_imbalance(call["more"], call["fast"]) == []  # more barriers: the barriers' own term


INDIRECT = [  # an index table read, then the data it addresses (ncu's SASS text)
    "LDG.E R4, desc[UR4][R2.64]",
    "IMAD.WIDE R6, R4, 0x4, R8",
    "LDG.E R10, desc[UR4][R6.64]",
    "FFMA R12, R10, R11, R12",
    "IADD3 R2, P0, R2, 0x4, RZ",
    "BRA 0x100",
]


def _code(listing, samples=None):
    code = [producers.parse(s, k, "k.cu", 10 + k) for k, s in enumerate(listing)]
    for k, s in (samples or {}).items():
        code[k].samples.update(s)
    return code


def test_a_load_addressed_by_another_loads_result_is_a_dependent_load():
    assert producers.dependent_loads(_code(INDIRECT)) == {2: {0}}
    direct = ["LDG.E R4, desc[UR4][R2.64]", "IADD3 R6, R2, 0x80, RZ", "LDG.E R10, desc[UR4][R6.64]",
              "FFMA R12, R10, R4, R12"]
    assert producers.dependent_loads(_code(direct)) == {}


def _lines(listing, samples):
    rows = []
    for k, s in enumerate(listing):
        rows.append(("v", "s", "k", "k.cu", 10 + k, s, "sass", sum(samples.get(k, {}).values()), float(16 * k)))
        for reason, n in samples.get(k, {}).items():
            rows.append(("v", "s", "k", "k.cu", 10 + k, s, f"sass:stall:{reason}", n, float(16 * k)))
    return pd.DataFrame(rows, columns=["variant", "shape_id", "kernel", "file", "line", "code", "metric", "value", "pc"])


def _launch(metrics=None, stalls=(("long_scoreboard", 0.6),)):
    return evidence.Launch("k", 0, 0, {"duration_ms": 1.0}, metrics or {}, "9.0", stalls=list(stalls), share=1.0)


def test_dependent_global_loads_names_the_chain_from_the_source_rows():
    ctx = Context(lines=_lines(INDIRECT, {1: {"long_scoreboard": 40}, 3: {"long_scoreboard": 50}, 4: {"selected": 10}}))
    f = rules_code.dependent_global_loads(_launch(), evidence.Call("v", "s"), ctx)
    assert f is not None and f.cause == "dependent_global_loads"
    assert "`LDG.E R10, desc[UR4][R6.64]` at k.cu:12 is addressed by `LDG.E R4, desc[UR4][R2.64]` at k.cu:10" in f.evidence
    assert "100% of the long-scoreboard samples" in f.evidence
    assert rules_code.dependent_global_loads(_launch(), evidence.Call("v", "s"), Context()) is None


def test_global_atomics_are_a_memory_class_of_their_own():
    m = {"lts__t_sectors_srcunit_tex_op_read.sum": 8e6, "lts__t_sectors_srcunit_tex_op_write.sum": 1e6,
         "lts__t_sectors_srcunit_tex_op_atom.sum": 0.0, "lts__t_sectors_srcunit_tex_op_red.sum": 3e6,
         "smsp__sass_inst_executed_op_global_red.sum": 1e5, "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum": 1e5}
    f = rules_code.global_atomics(_launch(m), evidence.Call("v", "s"), Context())
    assert f is not None and f.cause == "global_atomics" and "25%" in f.evidence and "30.0 L2 sectors per atomic request" in f.evidence
    scheduler = dict(m, **{"lts__t_sectors_srcunit_tex_op_red.sum": 0.0, "lts__t_sectors_srcunit_tex_op_atom.sum": 4228.0})
    assert rules_code.global_atomics(_launch(scheduler), evidence.Call("v", "s"), Context()) is None  # cuDNN's tile counter


def test_divisions_and_special_functions_per_score_from_the_issue_samples():
    listing = ["MUFU.EX2 R4, R4", "MUFU.RCP R6, R5", "FFMA R7, -R5, R6, 1", "FCHK P0, R3, R5", "FFMA R8, R4, R6, RZ"]
    code = _code(listing, {0: {"selected": 30}, 1: {"selected": 30}, 3: {"selected": 28}})
    mufu, div = rules_code.mufu_mix(code)
    assert dict(mufu) == {"EX2": 30, "RCP": 30} and div == 30
    ctx = Context(lines=_lines(listing, {0: {"selected": 30}, 1: {"selected": 30}, 3: {"selected": 28}}))
    mix = rules_code.sass_per_score(_launch(), evidence.Call("v", "s"), ctx, 2.0)
    assert mix == pytest.approx({"EX2": 1.0, "RCP": 1.0, "division": 1.0})
    assert "1.00 divisions per score" in rules_code.per_score_text(mix)


def test_a_division_per_score_is_named_even_below_the_xu_threshold():
    """1.4 XU instructions per score (under XU_PER_SCORE_MAX) of which 0.4 are MUFU.RCP: a division per score in
    part of the loop is still a division per score."""
    from faprof.advisor.rules_kernel import transcendentals

    listing = ["MUFU.EX2 R4, R4", "MUFU.RCP R6, R5", "FCHK P0, R3, R5"]
    ctx = Context(lines=_lines(listing, {0: {"selected": 50}, 1: {"selected": 20}, 2: {"selected": 20}}))
    call = evidence.Call("v", "s", {"B": 1, "H": 1, "Sq": 128, "Sk": 128, "D": 64, "causal": False})
    lz = evidence.Launch("k", 0, 0, {"duration_ms": 1.0}, {"smsp__thread_inst_executed_pipe_xu_pred_on.sum": 1.4 * 128 * 128},
                         "9.0", share=1.0)
    f = transcendentals(lz, call, ctx)
    assert f is not None and "0.40 divisions per score" in f.evidence and "16,384 scores unmasked" in f.evidence
    assert transcendentals(lz, call, Context()) is None  # no SASS: 1.4 per score is under the XU threshold
