"""Scenario files: every shipped file validates; bad files give errors naming file, key, expectation."""

import textwrap

import pytest

from faprof.errors import FaprofError
from faprof.model.scenarios import list_scenarios, load_scenario

SHIPPED = ["l4_causal", "rtx3090_tensorcore", "l20_fwd_bwd", "rtx3060_latency", "rtx4070_cpu_baseline", "smoke"]


def test_every_seed_has_a_scenario():
    assert set(SHIPPED) <= set(list_scenarios())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_validate(name):
    s = load_scenario(name)
    assert s.problems, name
    assert s.baseline
    if name != "smoke":
        assert s.published, f"{name} should quote its report's figures"
        for p in s.published:
            assert p.gpu and p.what and p.unit is not None


def test_l4_causal_has_the_reports_exact_shapes():
    s = load_scenario("l4_causal")
    got = [(p.B, p.H, p.Sq, p.Sk, p.D, p.dtype, p.causal) for p in s.groups[0].problems]
    assert got == [(1, 1, 128, 128, 64, "fp16", True), (4, 8, 128, 128, 64, "fp16", True),
                   (8, 8, 128, 128, 64, "fp16", True), (8, 8, 256, 256, 64, "fp16", True),
                   (16, 8, 512, 512, 64, "fp16", True)]
    # the same shapes in fp32 for the CUDA-core kernels, against a baseline that takes fp32
    fp32 = s.groups[1]
    assert [(p.B, p.H, p.Sq) for p in fp32.problems] == [(b, h, sq) for b, h, sq, *_ in got]
    assert all(p.dtype == "fp32" for p in fp32.problems)
    assert s.group_baselines() == {"forward fp32": "sdpa_efficient"}


def test_rtx3090_shapes():
    s = load_scenario("rtx3090_tensorcore")
    assert [(p.B, p.Sq) for p in s.problems] == [(32, 512), (16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384)]
    assert all(p.H == 16 and p.D == 128 and not p.causal and p.dtype == "fp16" for p in s.problems)


def test_l20_reads_BxSxHxD_order_and_has_three_parts():
    s = load_scenario("l20_fwd_bwd")
    names = [g.name for g in s.groups]
    assert names[:2] == ["forward", "backward"] and "memory sweep" in names
    fwd = s.groups[0].problems
    # '4x256x16x64' is B=4, S=256, H=16, D=64
    assert (fwd[3].B, fwd[3].Sq, fwd[3].H, fwd[3].D) == (4, 256, 16, 64)
    assert (fwd[-1].B, fwd[-1].Sq, fwd[-1].H, fwd[-1].D) == (64, 1024, 64, 128)
    assert len(fwd) == 8
    assert all(p.direction == "bwd" for p in s.groups[1].problems) and len(s.groups[1].problems) == 5
    mem = next(g for g in s.groups if g.name == "memory sweep").problems
    assert [p.Sq for p in mem] == [64, 128, 256, 512, 1024, 2048]


def test_rtx3060_says_which_head_count_it_chose():
    s = load_scenario("rtx3060_latency")
    (p,) = s.problems
    assert (p.B, p.Sq, p.D) == (1, 512, 64)
    assert "head count" in s.notes


def _write(tmp_path, text):
    f = tmp_path / "bad.toml"
    f.write_text(textwrap.dedent(text))
    return f


def test_syntax_error_gives_line_and_column(tmp_path):
    f = _write(tmp_path, """\
        name = "x"
        baseline = "torch_standard"
        problems = [ { B = 1, H = 1, S = 8, D = 8 ]
        """)
    with pytest.raises(FaprofError) as e:
        load_scenario(f)
    msg = str(e.value)
    assert str(f) in msg and "line 3" in msg and "column" in msg


@pytest.mark.parametrize("body,key,expected", [
    ('name = "x"\nproblems = [{B=1,H=1,S=8,D=8}]\n', "baseline", "variant"),
    ('name = "x"\nbaseline = "nope"\nproblems = [{B=1,H=1,S=8,D=8}]\n', "baseline", "known variant"),
    ('name = "x"\nbaseline = "torch_standard"\nproblems = [{B=0,H=1,S=8,D=8}]\n', "problems[0].B", "positive integer"),
    ('name = "x"\nbaseline = "torch_standard"\nproblems = [{B=1,H=1,S=8,D=8,dtype="fp8"}]\n', "problems[0].dtype", "one of"),
    ('name = "x"\nbaseline = "torch_standard"\nproblems = [{B=1,H=1,D=8}]\n', "problems[0].S", "S (or both Sq and Sk)"),
    ('name = "x"\nbaseline = "torch_standard"\nproblems = [{B=1,H=1,S=8,D=8,Sq=4}]\n', "problems[0].S", "not both"),
    ('name = "x"\nbaseline = "torch_standard"\nproblem = [{B=1,H=1,S=8,D=8}]\n', "problem", "unknown key"),
    ('name = "x"\nbaseline = "torch_standard"\n', "problems", "at least one problem"),
    ('name = "x"\nbaseline = "torch_standard"\nproblems = [{B=1,H=1,S=8,D=8}]\n[collect]\nncu = "all"\n', "collect.ncu", "one of"),
    ('name = "x"\nbaseline = "torch_standard"\nproblems = [{B=1,H=1,S=8,D=8}]\n[timing]\nbudget_s = "long"\n', "timing.budget_s", "non-negative"),
    ('name = "x"\nbaseline = "torch_standard"\nvariants = ["fa9"]\nproblems = [{B=1,H=1,S=8,D=8}]\n', "variants", "known variant"),
    ('name = "x"\nbaseline = "torch_standard"\nproblems = [{B=1,H=1,S=8,D=8}]\n[[published]]\ngpu = "L4"\nwhat = "latency"\nsubject = "x"\nunit = "ms"\n', "published[0].value", "present"),
    ('name = "x"\nbaseline = "torch_standard"\ngrid = {B = []}\n', "grid.B", "non-empty list"),
    ('name = "x"\nbaseline = "torch_standard"\nbaseline_fallback = ["fa9"]\nproblems = [{B=1,H=1,S=8,D=8}]\n',
     "baseline_fallback", "known variant"),
    ('name = "x"\nbaseline = "torch_standard"\n[[groups]]\nbaseline_fallback = 3\nproblems = [{B=1,H=1,S=8,D=8}]\n',
     "groups[0].baseline_fallback", "variant name"),
])
def test_validation_errors_name_file_key_and_expectation(tmp_path, body, key, expected):
    f = _write(tmp_path, body)
    with pytest.raises(FaprofError) as e:
        load_scenario(f)
    msg = str(e.value)
    assert str(f) in msg, msg
    assert f"key '{key}'" in msg, msg
    assert expected in msg, msg


def test_grid_and_group_defaults(tmp_path):
    f = _write(tmp_path, """\
        name = "g"
        baseline = "torch_standard"
        [defaults]
        D = 16
        dtype = "fp32"
        [[groups]]
        name = "a"
        defaults = { direction = "bwd", H = 2 }
        grid = { B = [1, 2], S = [8, 16] }
        """)
    s = load_scenario(f)
    ps = s.problems
    assert len(ps) == 4
    assert all(p.direction == "bwd" and p.H == 2 and p.D == 16 for p in ps)
    assert {(p.B, p.Sq) for p in ps} == {(1, 8), (1, 16), (2, 8), (2, 16)}


def test_unknown_scenario_name_lists_known_ones():
    with pytest.raises(FaprofError, match="known scenarios: .*smoke"):
        load_scenario("no_such_scenario")


def test_group_baseline_must_be_a_known_variant(tmp_path):
    f = _write(tmp_path, """\
        name = "x"
        baseline = "torch_standard"
        [[groups]]
        name = "g"
        baseline = "fa9"
        problems = [{B = 1, H = 1, S = 8, D = 8}]
        """)
    with pytest.raises(FaprofError, match=r"key 'groups\[0\].baseline'"):
        load_scenario(f)
