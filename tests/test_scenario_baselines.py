"""Every built-in scenario's baseline runs every problem of its group, as far as the problem model and
the variant's own checks can tell without a GPU: a baseline that cannot run a group leaves its
speedup column empty (mistral_window named sdpa_efficient, which has no GQA kernel, until
2026-11-27's H100 run showed it)."""

from pathlib import Path

import pytest

import faprof.variants  # noqa: F401 (registers the built-in variants)
from faprof.model.scenarios import load_scenario
from faprof.model.variant import get

SCENARIOS = sorted(Path(__file__).resolve().parents[1].joinpath("scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_baseline_runs_every_problem_of_its_group(path):
    scn = load_scenario(str(path))
    bad = []
    for g in scn.groups:
        base = get(g.baseline or scn.baseline)
        for p in g.problems:
            ok, why = base.supports(p, cuda_available=True)
            if not ok:
                bad.append(f"{g.name}/{p.shape_id}: {base.name}: {why}")
    assert not bad, "\n".join(bad)
