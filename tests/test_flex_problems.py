"""flex keeps one compiled function per problem: a (flex, shape) task compiles its problem once, the next
task does not compile its probe shapes again, and no problem's graphs share a code object with another's.

Method: the CPU runs flex eagerly, so these tests put the CPU among flex's compiled devices and stand in
for torch.compile with a recorder that returns the function it was given (every call then runs eager
flex through the same per-problem copy of `_call` the GPU compiles). What is counted is what the GPU
pays for: each torch.compile of a problem's copy. Outputs are checked against the float64 reference.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import pytest
import torch

from faprof.correctness import layouts
from faprof.model.problem import AttentionProblem
from faprof.model.settings import TimingSettings
from faprof.run import tasks
from faprof.variants import flex

FAST = dataclasses.asdict(TimingSettings(budget_s=0.02, min_repeats=3, warmup_ms=1, e2e_repeats=2))


@pytest.fixture
def compiles(monkeypatch):
    """The code objects torch.compile was asked to compile, in order (flex compiled on the CPU too)."""
    seen: list = []
    real = torch.compile

    def recorder(fn, **kw):
        if getattr(fn, "__module__", None) != flex.__name__:
            return real(fn, **kw)  # eager flex_attention compiles a wrapper of its own (backend "eager")
        assert kw == {"dynamic": False}
        seen.append(fn.__code__)
        return fn

    monkeypatch.setattr(flex, "COMPILED_ON", ("cuda", "cpu"))
    monkeypatch.setattr(flex, "_PROBLEMS", OrderedDict())
    monkeypatch.setattr(flex, "_UNSAID", {"n": 0, "s": 0.0})
    monkeypatch.setattr(torch, "compile", recorder)
    return seen


def _problem(**kw) -> AttentionProblem:
    base = dict(B=1, H=4, Hkv=2, Sq=4, Sk=96, D=16, dtype="fp32", causal=True, mask_align="bottom_right")
    return AttentionProblem(**{**base, **kw})


def _run(problem: AttentionProblem, seed: int = 0):
    q, k, v, _, args = layouts.make_layout_inputs(problem, "cpu", torch.Generator().manual_seed(seed))
    got = flex.flex_fn(q, k, v, problem.causal, problem.softmax_scale, attn=args)
    want = layouts.reference_forward(problem, q, k, v, args, "cpu", torch.float64)
    assert (got.double() - want).abs().max() < 1e-5
    return args


def test_each_problem_compiles_once_with_a_code_object_of_its_own(compiles):
    a, b = _problem(), _problem(Sq=1, Sk=200)
    _run(a)
    state_a = flex._PROBLEMS[(a.shape_id, "cpu")]
    _run(b)
    _run(a, seed=1)  # back to the first problem (a task's timed calls after its probes): nothing rebuilt
    assert len(compiles) == 2
    assert compiles[0] is not compiles[1] and compiles[0].co_name != compiles[1].co_name
    assert flex._PROBLEMS[(a.shape_id, "cpu")] is state_a


def test_a_new_draw_of_a_paged_problem_keeps_its_kernel_and_builds_its_mask_again(compiles):
    p = _problem(B=2, Sq=1, Sk=300, page_size=16)
    _run(p, seed=0)
    st = flex._PROBLEMS[(p.shape_id, "cpu")]
    mask, fn = st["block_mask"], st["fn"]
    _run(p, seed=1)  # another block table: its mask must follow the new table (the output check above)
    assert len(compiles) == 1 and st["fn"] is fn and st["block_mask"] is not mask


def test_the_kept_problems_are_bounded_least_recently_used_first(compiles, monkeypatch):
    monkeypatch.setattr(flex, "FLEX_KEEP_PROBLEMS", 2)
    a, b, c = _problem(), _problem(Sk=100), _problem(Sk=104)
    for p in (a, b, a, c):  # a used again after b: b is the oldest when c comes
        _run(p)
    assert len(compiles) == 3 and set(flex._PROBLEMS) == {(a.shape_id, "cpu"), (c.shape_id, "cpu")}
    _run(b)
    assert len(compiles) == 4


def test_a_task_compiles_its_problem_once_and_the_next_task_reuses_the_probe_shapes(compiles, monkeypatch):
    """The measure task: the check, every adversarial probe (a problem each), then timing of the task's
    own problem. Resetting per new problem compiled the task's problem twice and every probe in every task."""
    names: list[str] = []
    built = flex._state

    def named(problem, q, kv_len, args):
        n = len(compiles)
        st = built(problem, q, kv_len, args)
        if len(compiles) > n:
            names.append(problem.shape_id)
        return st

    monkeypatch.setattr(flex, "_state", named)
    state: dict = {}
    per_task = []
    for p in (_problem(), _problem(Sk=128)):
        before = len(names)
        task = {"op": "measure", "variant": "flex", "problem": p.to_dict(), "settings": FAST}
        row = tasks.dispatch(task, state)
        assert row["status"] == "ok", row.get("reason")
        per_task.append(names[before:])
        # the row's path counts the compiles its wall time paid for (its own and its probes')
        assert f"; {len(per_task[-1])} compiles since the previous flex row" in row["path"], row["path"]
    first, second = per_task
    assert len(first) > 3, first  # the task's problem and its probes (a test of nothing otherwise)
    assert len(names) == len(set(names)), f"a problem compiled twice: {names}"
    assert len(second) < len(first), (first, second)
