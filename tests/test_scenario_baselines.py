"""Every built-in scenario's baselines run every problem of their group, as far as the problem model and
the variants' own checks can tell without a GPU: a baseline that cannot run a group leaves its
speedup column empty (mistral_window named sdpa_efficient, which has no GQA kernel, until
2026-11-27's H100 run showed it).

A group's speedups are over the first baseline of its chain (`Scenario.baseline_chain`: its baseline,
its fallbacks, the scenario's) that was timed on some of its shapes (faprof.analysis.speedups.with_speedups),
so the rule is checked twice: with the optional libraries absent (CI, a CPU, a GPU machine without them)
and with them installed. The scenarios that name a library variant still run everywhere: without the
library its rows are `unsupported` with the pip line."""

from pathlib import Path

import pytest

import faprof.variants  # noqa: F401 (registers the built-in variants)
from faprof.model.scenarios import load_scenario
from faprof.model.variant import get, resolve
from faprof.variants import libraries

SCENARIOS = sorted(Path(__file__).resolve().parents[1].joinpath("scenarios").glob("*.toml"))

#: Shapes a group's first runnable baseline refuses with the libraries installed, by (scenario, group):
#: (how many, words its reason has). FlashInfer's decode takes one query per sequence, so the paged
#: group's Sq = 4 (speculative verification) shape has no speedup when flashinfer_decode is the baseline.
PARTIAL = {("llama3_70b_decode", "paged"): (1, "one query per sequence")}

LIBRARY_VARIANTS = {v for lib in libraries.LIBRARIES for v in lib.variants}


def _uncovered(path: Path) -> dict[str, list[str]]:
    """{group: the '<shape>: <reason>' its effective baseline (the chain's first running any shape) refuses}."""
    scn = load_scenario(str(path))
    out = {}
    for g in scn.groups:
        chain = [get(n) for n in scn.baseline_chain(g.name)]
        for base in chain:
            why = {p.shape_id: base.supports(p, cuda_available=True) for p in g.problems}
            if any(ok for ok, _ in why.values()):
                out[g.name] = [f"{s}: {base.name}: {r}" for s, (ok, r) in why.items() if not ok]
                break
        else:
            out[g.name] = [f"no baseline of {scn.baseline_chain(g.name)} runs any shape"]
    return out


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_baseline_runs_every_problem_of_its_group_without_the_libraries(path, monkeypatch):
    monkeypatch.setattr(libraries, "installed_version", lambda dist: None)
    bad = [line for lines in _uncovered(path).values() for line in lines]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_baseline_runs_every_problem_of_its_group_with_the_libraries(path, monkeypatch):
    pins = {lib.dist: lib.pin for lib in libraries.LIBRARIES}
    monkeypatch.setattr(libraries, "installed_version", lambda dist: pins.get(dist))
    for group, lines in _uncovered(path).items():
        n, words = PARTIAL.get((path.stem, group), (0, ""))
        assert len(lines) == n and all(words in line for line in lines), "\n".join(lines)


def test_the_paged_groups_baseline_is_flashinfer_with_torch_standard_after_it():
    scn = load_scenario(str(SCENARIOS[0].parent / "llama3_70b_decode.toml"))
    assert scn.baseline_chain("paged") == ["flashinfer_decode", "torch_standard", "sdpa_flash"]
    assert scn.baseline_chain("contiguous") == ["sdpa_flash"]


@pytest.mark.parametrize("name,wanted", [
    ("llama3_70b_decode", {"flashinfer_decode"}), ("varlen_packed", {"flashinfer_prefill", "fa4"}),
    ("llama3_8b_prefill", {"flashinfer_prefill", "fa4"}), ("mistral_window", {"flashinfer_prefill", "fa4"}),
    ("h100_headline", {"fa4"}),
])
def test_library_rows_are_unsupported_with_the_pip_line_without_the_library(name, wanted, monkeypatch):
    monkeypatch.setattr(libraries, "installed_version", lambda dist: None)
    scn = load_scenario(str(SCENARIOS[0].parent / f"{name}.toml"))
    names = [v.name for v in resolve(scn.variants)]
    assert wanted <= set(names) and len(names) == len(set(names))
    if name == "h100_headline":  # "all" and fa4: every variant "all" runs, then the library
        assert names[:-1] == [v.name for v in resolve("all")] and names[-1] == "fa4"
    for v in wanted:
        lib = next(lib for lib in libraries.LIBRARIES if v in lib.variants)
        for p in scn.problems:
            ok, reason = get(v).supports(p, cuda_available=True)
            assert not ok and reason, (v, p.shape_id)
            # its own limits come first (FlashInfer's dense B > 1, decode's Sq > 1), else the pip line
            assert reason.endswith(lib.install) or lib.name in reason, reason


def test_library_shapes_they_run_when_installed(monkeypatch):
    """With the libraries installed (and no GPU to ask), which scenario shapes they take: the leaderboard's rows."""
    pins = {lib.dist: lib.pin for lib in libraries.LIBRARIES}
    monkeypatch.setattr(libraries, "installed_version", lambda dist: pins.get(dist))

    def runs(scenario, variant):
        scn = load_scenario(str(SCENARIOS[0].parent / f"{scenario}.toml"))
        return sum(get(variant).supports(p, cuda_available=True)[0] for p in scn.problems), len(scn.problems)

    assert runs("llama3_70b_decode", "flashinfer_decode") == (8, 14)  # every Sq = 1 shape
    assert runs("varlen_packed", "flashinfer_prefill") == (2, 2) and runs("varlen_packed", "fa4") == (2, 2)
    assert runs("llama3_8b_prefill", "flashinfer_prefill") == (1, 3) and runs("llama3_8b_prefill", "fa4") == (3, 3)
    assert runs("mistral_window", "flashinfer_prefill") == (1, 2) and runs("mistral_window", "fa4") == (2, 2)
    assert runs("h100_headline", "fa4") == (8, 8)
