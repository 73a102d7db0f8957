"""One definition of each concept: the attention scores and the problem's columns.

Method: (1) every place that computes attention scores (the definition, the torch baselines, the oracle,
the adversarial bounds, the sample check, the bug signatures' alternative references and families, the
packed-sequence crossings) is run with faprof.model.scores' `scores` replaced by a recording wrapper in
that module, and must have called it (a copy written back inline would not); the source of faprof/ has
no tanh, no -inf mask fill, no scaled q·kᵀ and no tril/triu outside faprof.model.scores and
faprof.model.mask. (2) Each option of `scores` (the soft-cap bugs, the mask) equals the formula it names,
written out here, and the whole-matrix mask equals the rule row by row. (3) The problem's columns in a
table row, the schema's and a scenario's problem keys come from AttentionProblem's fields, in the order
the committed bundles have.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from faprof.correctness import adversarial, layouts, reference, signatures
from faprof.correctness.signatures import crossing, families, refs
from faprof.model import mask as maskmod
from faprof.model import scenarios, schema
from faprof.model import scores as scoresmod
from faprof.model.problem import AttentionProblem
from faprof.model.settings import DEFAULT_TOLERANCE
from faprof.timing import integrity
from faprof.variants import definition, torch_variants

FAPROF = Path(__file__).resolve().parents[1] / "faprof"

#: Where the scores and the mask may be written out: their one home.
HOMES = {FAPROF / "model" / "scores.py", FAPROF / "model" / "mask.py"}

def _transposed(node: ast.AST) -> bool:
    """node is x.transpose(-2, -1) (or (-1, -2)), x.mT or x.T: the key matrix of q·kᵀ."""
    if isinstance(node, ast.Attribute) and node.attr in ("mT", "T"):
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "transpose"
            and {ast.unparse(a) for a in node.args} == {"-2", "-1"})


def _is_qk(node: ast.AST) -> bool:
    """node is q·kᵀ: torch.matmul(q, k.transpose(-2, -1)) or q @ k.transpose(-2, -1)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return _transposed(node.right)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "matmul"
            and len(node.args) == 2 and _transposed(node.args[1]))


def scores_code(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each piece of a scores computation in a module: a soft-cap (tanh), a mask filled
    with -inf, q·kᵀ times a scale (a name with 'scale' in it), a mask from a triangle (tril/triu)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name == "tanh":
                found.append((node.lineno, "soft-cap (tanh)"))
            elif name in ("tril", "triu"):
                found.append((node.lineno, "triangular mask"))
            elif name in ("masked_fill", "masked_fill_") and any("inf" in ast.unparse(a) for a in node.args[1:]):
                found.append((node.lineno, "mask filled with -inf"))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                if _is_qk(a) and "scale" in ast.unparse(b):
                    found.append((node.lineno, "scaled q·kᵀ"))
    return found


def test_the_source_scan_sees_a_copy():
    copy = """
s = torch.matmul(q, k.transpose(-2, -1)) * scale
s = softcap * torch.tanh(s / softcap)
s = s.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf"))
"""
    assert sorted(w for _, w in scores_code(ast.parse(copy))) == [
        "mask filled with -inf", "scaled q·kᵀ", "soft-cap (tanh)", "triangular mask"]
    assert scores_code(ast.parse("dq = scale * torch.matmul(dS, k); e = '= c·tanh(s / c)'\n"
                                 "err = gamma(D) * torch.matmul(do, v.transpose(-2, -1))")) == []


def test_no_second_scores_implementation_in_the_source():
    found = [f"{path.relative_to(FAPROF.parent)}:{line}: {what}"
             for path in sorted(FAPROF.rglob("*.py")) if path not in HOMES
             for line, what in scores_code(ast.parse(path.read_text()))]
    assert not found, "compute scores with faprof.model.scores (and masks with faprof.model.mask):\n" + "\n".join(found)


@pytest.fixture
def spy(monkeypatch):
    """spy(module): records the name of each function of `module` that calls its `scores`."""
    def install(module):
        calls: list[str] = []
        real = module.scores
        assert real is scoresmod.scores, f"{module.__name__}.scores is not faprof.model.scores.scores"

        def wrapper(*a, **kw):
            calls.append(sys._getframe(1).f_code.co_name)
            return real(*a, **kw)

        monkeypatch.setattr(module, "scores", wrapper)
        return calls

    return install


def _inputs(p: AttentionProblem, seed: int = 3) -> SimpleNamespace:
    q, k, v, dout, args = layouts.make_layout_inputs(p, "cpu", torch.Generator().manual_seed(seed))
    return SimpleNamespace(q=q, k=k, v=v, dout=dout, args=args if p.layout != "dense" else None)


CAPPED = AttentionProblem(B=2, H=4, Hkv=2, Sq=6, Sk=9, D=4, dtype="fp32", causal=True, mask_align="bottom_right",
                          window=(3, 0), softcap=2.0, direction="fwd_bwd")
PLAIN = AttentionProblem(B=2, H=2, Sq=8, Sk=8, D=4, dtype="fp32", causal=True, direction="fwd_bwd")


def test_the_definition_and_the_baselines_call_the_scores(spy):
    inp = _inputs(CAPPED)
    calls = spy(definition)
    definition.attention(CAPPED, inp.q, inp.k, inp.v, inp.args)
    assert "attend" in calls
    calls = spy(torch_variants)
    plain = _inputs(PLAIN)
    torch_variants.standard_attention(plain.q, plain.k, plain.v, True, 0.5)
    assert calls == ["masked_scores"]


def test_the_oracle_and_the_bounds_call_the_scores(spy):
    inp = _inputs(CAPPED)
    calls = spy(reference)
    reference.layout_attention(CAPPED, inp.q, inp.k, inp.v, inp.args, "cpu", torch.float64, inp.dout)
    assert "_block" in calls
    calls = spy(torch_variants)  # 2022's path: explicit attention and its LSE
    plain = _inputs(PLAIN)
    reference._attention_pass(PLAIN, plain, "cpu", torch.float64)
    reference._lse_pass(PLAIN, plain, "cpu", torch.float64)
    assert calls == ["masked_scores", "masked_scores"]
    calls = spy(adversarial)
    adversarial.rounding_slack(CAPPED, inp)
    assert "_slack_one" in calls
    calls = spy(integrity)
    integrity._rows_reference(PLAIN, plain.q, plain.k, plain.v)
    assert calls == ["_rows_reference"]


def test_the_signatures_call_the_scores(spy):
    calls = spy(refs)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    refs.attend(q, k, v, 0.5, refs.mask_rows(5, 5, causal=True), softcap=1.0, cap_bug="after_mask")
    assert calls == ["attend"]
    calls = spy(crossing)
    p = AttentionProblem(B=2, H=2, Sq=4, Sk=4, D=4, dtype="fp32", causal=True, seqlens_q=(4, 2), softcap=1.0)
    inp = _inputs(p)
    crossing._attend_range(p, definition.sequence_q(p, inp.q, 1), inp.k, inp.v, 1, 6, 0, torch.arange(2), 2, 2)
    assert calls == ["_attend_range"]
    # the families: a forward at twice the scale gives a wrong O and (through it) wrong gradients
    calls = spy(families)
    inp = _inputs(PLAIN)
    wrong = dataclasses.replace(PLAIN, scale=2 * PLAIN.softmax_scale)
    qd, kd, vd = (t.double().requires_grad_(True) for t in (inp.q, inp.k, inp.v))
    outs = {"out": definition.attention(wrong, qd, kd, vd, None)}
    outs.update(zip(("dq", "dk", "dv"), torch.autograd.grad(outs["out"], (qd, kd, vd), inp.dout.double()), strict=True))
    ref = reference.layout_attention(PLAIN, inp.q, inp.k, inp.v, None, "cpu", torch.float64, inp.dout)
    refs_ = {"out": ref.out, "dq": ref.grads[0], "dk": ref.grads[1], "dv": ref.grads[2]}
    tol = DEFAULT_TOLERANCE["fp32"]
    names = list(outs)
    signatures.diagnose_wrong(PLAIN, inp, names, [outs[n].detach().float() for n in names], refs_, tol.atol, tol.rtol,
                              dict.fromkeys(names, math.nan), lambda name: None)
    assert {"overflow_signature", "propagated_signature"} <= set(calls), calls


# ------------------------------------------------------------------ the options are the formulas they name
def _qk(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(3, 7, 5, generator=g, dtype=torch.float64) * 3 for _ in range(2))


@pytest.mark.parametrize("bug", [None, *scoresmod.CAP_BUGS])
@pytest.mark.parametrize("masked", [False, True])
def test_each_cap_option_is_its_formula(bug, masked):
    q, k = _qk()
    c, scale = 1.5, 0.4
    ok = maskmod.allowed(maskmod.MaskSpec(causal=True), 7, 7) if masked else None
    raw = q @ k.transpose(1, 2)
    neg = torch.tensor(-math.inf, dtype=torch.float64)
    mask = (lambda s: torch.where(ok, s, neg)) if masked else (lambda s: s)
    expected = {
        None: mask(c * torch.tanh(raw * scale / c)),
        "unscaled": mask(c * torch.tanh(raw / c) * scale),
        "scaled_twice": mask(c * torch.tanh(raw * scale / c) * scale),
        "after_mask": c * torch.tanh(mask(raw * scale) / c),
        "on_probs": mask(raw * scale),  # the cap goes on the probabilities (refs.attend)
    }[bug]
    got = scoresmod.scores(q, k, scale, softcap=c, allowed=ok, cap_bug=bug)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    # no cap: every bug is the plain scaled, masked score
    torch.testing.assert_close(scoresmod.scores(q, k, scale, allowed=ok, cap_bug=bug), mask(raw * scale),
                               rtol=1e-12, atol=0)


def test_a_maskspec_is_its_whole_matrix():
    q, k = _qk(1)
    spec = maskmod.MaskSpec(causal=True, align="bottom_right", left=2)
    torch.testing.assert_close(scoresmod.scores(q, k[:, :5], 0.3, allowed=spec),
                               scoresmod.scores(q, k[:, :5], 0.3, allowed=maskmod.allowed(spec, 7, 5)))


@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 9), (9, 5), (8, 8), (3, 17)])
def test_the_whole_mask_matrix_is_the_rule_on_every_row(sq, sk):
    for causal in (False, True):
        for align in maskmod.ALIGNS:
            for left in (-1, 0, 2):
                for right in (-1, 0, 1, 3):
                    spec = maskmod.MaskSpec(causal, align, left, right)
                    rule = maskmod.allowed_rows(spec, torch.arange(sq), sq, sk)
                    assert torch.equal(maskmod.allowed(spec, sq, sk), rule), spec
                    by_hand = torch.tensor([[lo <= j <= hi for j in range(sk)]
                                            for lo, hi in (spec.key_range(i, sq, sk) for i in range(sq))])
                    assert torch.equal(rule, by_hand), spec


def test_the_signatures_masks_are_the_rule_moved():
    """refs.mask_rows' shift and sides below 0 (a bug's off-by-one) are the rule's `visible` with them."""
    m = refs.mask_rows(6, 8, causal=True, align="bottom_right", shift=-1, left=-1, rows=torch.tensor([0, 5]), n_keys=10)
    i, j = torch.tensor([0, 5])[:, None] + 2, torch.arange(10)[None, :]
    assert torch.equal(m, (j <= i - 1) & (j >= i + 1))
    assert refs.mask_rows(4, 4, causal=False) is None


# ------------------------------------------------------------------ the problem's columns
FIELDS = [f.name for f in dataclasses.fields(AttentionProblem)]


def test_problem_columns_are_the_dataclass_fields():
    from faprof.model import problem

    cols = schema.PROBLEM_COLUMNS
    # every field is a column, as itself or (mask_align) through the mask's name and the layout; the rest
    # are derived from the fields
    shown = [c for f in FIELDS for c in problem.ROW_SHOWN_AS.get(f, (f,))]
    assert sorted(cols) == sorted([*shown, *problem.ROW_DERIVED])
    assert tuple(AttentionProblem(B=1, H=1, Sq=1, Sk=1, D=1).to_row()) == cols
    # the row columns hold them in one run, in the order bundles have (after `label`)
    start = schema.ROW_COLUMNS.index("B")
    assert schema.ROW_COLUMNS[start:start + len(cols)] == cols
    assert schema.ROW_COLUMNS[start - 1] == "label" and schema.ROW_COLUMNS[start + len(cols)] == "status"


def test_scenario_problem_keys_are_the_fields_and_their_spellings():
    assert set(FIELDS) | set(scenarios.EXTRA_PROBLEM_KEYS) == scenarios._PROBLEM_KEYS


def test_committed_bundles_have_the_problem_columns_in_this_order():
    import pandas as pd

    tables = sorted((FAPROF.parent / "tests" / "data").rglob("measurements.parquet"))
    checked = 0
    for t in tables:
        cols = list(pd.read_parquet(t).columns)
        if set(schema.PROBLEM_COLUMNS) <= set(cols):
            assert [c for c in cols if c in schema.PROBLEM_COLUMNS] == list(schema.PROBLEM_COLUMNS), t
            checked += 1
    assert checked >= 3


# ------------------------------------------------------------------- the other concepts' one home
def _float_or_nan_copies(tree: ast.AST) -> list[int]:
    """Lines of `try: ... float(x) ... except ...: <NaN>` blocks: a private 'float or NaN'."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        calls_float = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "float"
                          for b in node.body for n in ast.walk(b))
        nan_after = any("nan" in ast.unparse(h).lower() for h in node.handlers)
        if calls_float and nan_after:
            out.append(node.lineno)
    return out


def test_the_float_scan_sees_a_copy():
    copy = "def num(x):\n    try:\n        return float(x)\n    except (TypeError, ValueError):\n        return math.nan\n"
    assert _float_or_nan_copies(ast.parse(copy)) == [2]


def test_one_float_or_nan_one_comparison_one_same_kernel_judgement():
    """'float or NaN' is faprof.model.values.as_float; the two-run test and shift live in
    faprof.analysis.comparison; 'same kernel' is faprof.analysis.aliases.same_kernel."""
    homes = {"as_float": FAPROF / "model" / "values.py"}
    floats = [f"{p.relative_to(FAPROF.parent)}:{line}" for p in sorted(FAPROF.rglob("*.py")) if p != homes["as_float"]
              for line in _float_or_nan_copies(ast.parse(p.read_text()))]
    assert not floats, "use faprof.model.values.as_float:\n" + "\n".join(floats)
    comparison = FAPROF / "analysis" / "comparison"
    tests = [str(p.relative_to(FAPROF.parent)) for p in sorted(FAPROF.rglob("*.py"))
             if comparison not in p.parents and ("mannwhitneyu" in p.read_text() or "def hl_" in p.read_text())]
    assert tests == [] or tests == ["faprof/rows/stats.py"], tests  # the sample statistics' one test, called by it
    home = FAPROF / "analysis" / "aliases.py"
    judges = [f"{p.relative_to(FAPROF.parent)}:{n.lineno}" for p in sorted(FAPROF.rglob("*.py")) if p != home
              for n in ast.walk(ast.parse(p.read_text()))
              if isinstance(n, ast.FunctionDef) and n.name.lstrip("_").startswith("same_kernel")
              and "aliases." not in ast.unparse(n)]  # elsewhere only adapters that ask faprof.analysis.aliases
    assert not judges, judges
