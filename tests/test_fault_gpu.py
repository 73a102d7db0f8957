"""Fault containment on a real GPU: a kernel that corrupts the CUDA context is one 'failed' row.

The faulting kernel (tests/kernels/fault.cu, a test-only extension loaded as a user-variants file) writes out of bounds, which raises "an illegal memory
access" and leaves its process's CUDA context unusable. Run through `faprof.runner.profile`, the
worker that ran it is replaced, and the variants after it run in the fresh worker and are correct.
"""

import pytest
from testonly import TESTONLY_VARIANTS

from faprof import run as runner
from faprof import variants
from faprof.model.scenarios import parse_scenario

pytestmark = pytest.mark.gpu


def test_faulting_kernel_is_contained_and_later_variants_still_run(tmp_path):
    # as `faprof profile --user-variants FILE` does: the file's variants exist before the scenario names them
    # (this passed only when an earlier test had loaded it)
    variants.load_user_variants(str(TESTONLY_VARIANTS))
    scen = parse_scenario({
        "name": "fault_containment", "baseline": "fa2",
        "variants": ["fa2", "_fault_oob", "naive", "sdpa_efficient"],
        "problems": [{"B": 2, "H": 3, "Sq": 113, "Sk": 203, "D": 64, "dtype": "fp32", "causal": True}],
        "timing": {"budget_s": 0.2, "min_repeats": 5, "warmup_ms": 5, "e2e_repeats": 3},
    }, "test")
    bundle = runner.profile(scen, runner.ProfileOptions(out_dir=tmp_path, task_timeout_s=300, ceilings=False,
                                                             user_variants=[str(TESTONLY_VARIANTS)]))
    df = bundle.measurements().set_index("variant")
    assert df.loc["_fault_oob", "status"] == "failed"
    assert "illegal memory access" in df.loc["_fault_oob", "reason"]
    for v in ("fa2", "naive", "sdpa_efficient"):
        assert df.loc[v, "status"] == "ok", (v, df.loc[v, "reason"])
        assert df.loc[v, "rel_err"] < 1e-4
        assert df.loc[v, "median_ms"] > 0
    assert bundle.manifest()["status"] == "complete"
    assert any("_fault_oob" in line for line in bundle.manifest()["log"])
