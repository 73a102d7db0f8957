"""`faprof profile`'s flags resolved by the run stage (faprof.run.request): which flags go together, and
the variant list a run gets once `--kernel` files join a scenario's list. Checked against hand-written
expectations, on the CPU, without building anything."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from faprof.errors import FaprofError
from faprof.model.options import NcuSelection
from faprof.model.scenarios import load_scenario
from faprof.run.request import ProfileRequest, merged_variants, resolve


def test_kernels_join_the_scenario_list_once_and_all_stays_all():
    everything = load_scenario("smoke")
    assert everything.variants == ["all"]
    smoke = dataclasses.replace(everything, variants=["cpu_ref", "torch_standard"])
    # no kernel: the --variants list (or None: the scenario's own) is passed on untouched
    assert merged_variants(smoke, None, []) is None
    assert merged_variants(smoke, ["fa2"], []) == ["fa2"]
    # a kernel joins the scenario's own list, in order, once
    assert merged_variants(smoke, None, ["mine", smoke.variants[0]]) == [*smoke.variants, "mine"]
    # ... or the --variants list
    assert merged_variants(smoke, ["cpu_ref", "fa2"], ["mine"]) == ["cpu_ref", "fa2", "mine"]
    # 'all' already includes every registered variant, kernels too
    assert merged_variants(smoke, ["all"], ["mine"]) == ["all"]
    assert merged_variants(everything, None, ["mine"]) is None  # the scenario's own 'all'


@pytest.mark.parametrize(("req", "needle"), [
    (ProfileRequest(), "give --scenario NAME|PATH"),
    (ProfileRequest(scenario="smoke", resume=Path("r")), "--resume finishes a run as it was started"),
    (ProfileRequest(resume=Path("r"), variants="fa2"), "--resume finishes a run as it was started"),
    (ProfileRequest(scenario="smoke", variants=" , "), "names no variant"),
    (ProfileRequest(resume=Path("r"), kernels=("a.cu",)), "drop --kernel"),
    (ProfileRequest(scenario="smoke", kernel_name="x"), "--name names the one --kernel"),
    (ProfileRequest(scenario="smoke", gpus="0", cluster="tcp://h:8786"), "give one of them"),
    (ProfileRequest(scenario="smoke", cluster="tcp://h:8786", isolate=False), "drop --no-isolate"),
    (ProfileRequest(scenario="smoke", ncu="none", ncu_select=NcuSelection(kernel="fa2")), "add --ncu [SET]"),
    (ProfileRequest(scenario="no_such_scenario"), "no_such_scenario"),
])
def test_flags_that_do_not_go_together_are_one_error(req, needle):
    with pytest.raises(FaprofError) as e:
        resolve(req)
    assert needle in str(e.value)


def test_a_plain_request_resolves_to_its_options(tmp_path):
    opts = resolve(ProfileRequest(scenario="smoke", variants="cpu_ref, torch_standard", out_dir=tmp_path,
                                  budget=0.5, timer="events", nsys=False, isolate=False))
    assert opts.variants == ["cpu_ref", "torch_standard"]
    assert opts.out_dir == tmp_path and opts.isolate is False
    assert opts.settings_overrides == {"budget_s": 0.5, "timer": "events"}
    assert opts.ncu is None and opts.nsys is False and opts.ncu_select.shapes is None and opts.ncu_select.variants is None
    assert opts.gpus is None and opts.cluster is None and opts.user_variants == []
