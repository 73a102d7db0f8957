"""The ncu fan-out's split, plan, lock switch and concurrency record (CPU; `faprof.run.ncu_split`)."""

from __future__ import annotations

import pytest

from faprof.errors import FaprofError
from faprof.run import ncu_split


def _pairs(variants, shapes):
    return [(v, s) for v in variants for s in shapes]


def test_weighted_split_balances_kernels_not_pairs():
    """One shape whose pairs profile 12 kernels each against three of 1: a pair-count split would put
    two shapes per GPU; the weighted split puts the heavy shape alone."""
    pairs = _pairs(["fa2"], ["big", "s1", "s2", "s3"])
    weights = {("fa2", "big"): 12, ("fa2", "s1"): 1, ("fa2", "s2"): 1, ("fa2", "s3"): 1}
    parts = ncu_split.split_weighted(pairs, 2, weights)
    shapes = sorted(sorted(ss) for _, ss in parts)
    assert shapes == [["big"], ["s1", "s2", "s3"]]
    plans = ncu_split.plan_parts(pairs, [0, 1], weights)
    assert sorted(p.kernels for p in plans) == [3, 12]
    assert sum(p.pairs for p in plans) == len(pairs)
    covered = sorted((v, s) for p in plans for v in p.variants for s in p.shapes if (v, s) in pairs)
    assert covered == sorted(pairs)  # each pair in exactly one part


def test_pair_weights_from_the_cost_cache():
    seen = {"fa2|s1": {"kernels_per_call": 3}, "fa2|s2": {"kernels_per_call": 0}}
    w = ncu_split.pair_weights([("fa2", "s1"), ("fa2", "s2"), ("fa2", "s3")], 2, seen)
    assert w == {("fa2", "s1"): 6, ("fa2", "s2"): 2, ("fa2", "s3"): 2}


def test_expected_wall_and_the_plan_name_the_gpus_and_both_outcomes():
    parts = ncu_split.plan_parts(_pairs(["a"], ["s1", "s2"]), [0, 1], {("a", "s1"): 10, ("a", "s2"): 6})
    e = ncu_split.expected_wall(parts, seconds_per_kernel=2.0, overhead_s=20.0)
    assert e == {"parallel": 40.0, "serial": 52.0}
    lines = ncu_split.plan_lines(parts, e, "per-gpu", "measured on this GPU")
    assert "GPUs 0, 1" in lines[0] and "GPU 0: 1 pair(s), ~10 kernel(s)" in lines[0]
    assert "~40 s if the GPUs profile at once" in lines[1] and "~52 s if ncu serializes" in lines[1]
    assert "shared lock file" in ncu_split.plan_lines(parts, e, "shared", "x")[1]
    assert "serializes kernel profiling across processes" in lines[2] and "51.1 s against 56.3 s" in lines[2]


def test_lock_switch_sets_tmpdir_per_part_or_keeps_it():
    base = {"TMPDIR": "/scratch", "PATH": "/bin"}
    per = ncu_split.part_env(base, 1, "/run/raw/ncu.gpu1/tmp", "per-gpu")
    assert per["TMPDIR"] == "/run/raw/ncu.gpu1/tmp" and per["CUDA_VISIBLE_DEVICES"] == "1"
    assert per["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and per["FAPROF_NCU_PART"] == "1"
    shared = ncu_split.part_env(base, 1, "/run/raw/ncu.gpu1/tmp", "shared")
    assert shared["TMPDIR"] == "/scratch"
    assert ncu_split.lock_mode({}) == "per-gpu" and ncu_split.lock_mode({"FAPROF_NCU_LOCK": "shared"}) == "shared"
    with pytest.raises(FaprofError, match="FAPROF_NCU_LOCK must be one of per-gpu, shared"):
        ncu_split.lock_mode({"FAPROF_NCU_LOCK": "none"})


def test_overlap_of_profiling_windows():
    # two GPUs profiling at once: windows [2, 10] and [3, 11] overlap 7 s
    c = ncu_split.concurrency({0: [2, 5, 10], 1: [3, 7, 11]}, 12.0, {"parallel": 12.0, "serial": 20.0})
    assert c["overlap_s"] == 7.0 and c["windows"] == "overlapping" and c["closer_to"] == "parallel"
    assert c["kernels_by_gpu"] == {"0": 3, "1": 3}
    # one after the other (a lock held for a whole process): no overlap
    c = ncu_split.concurrency({0: [2, 6], 1: [7, 11]}, 20.0, {"parallel": 12.0, "serial": 20.0})
    assert c["overlap_s"] == 0.0 and c["windows"] == "serial" and c["closer_to"] == "serial"
    # three windows: only where two or more are open counts
    assert ncu_split.overlap_s({0: (0, 4), 1: (2, 6), 2: (8, 9)}) == 2.0
    line = ncu_split.summary_line(c, 20.0)
    assert "overlapped 0.0 s" in line and "closer to serialized" in line


def test_pace_tells_turn_taking_from_parallel_profiling():
    """Two windows open over the same 10 s: at one GPU's pace (1 s per kernel) they profiled at
    once; at twice it, they took turns kernel by kernel although the windows overlap."""
    both = {0: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 1: [0.5 + i for i in range(11)]}
    c = ncu_split.concurrency(both, 12.0, None, seconds_per_kernel=1.0)
    assert c["windows"] == "overlapping" and c["pace_vs_one"] == 1.0
    turns = {0: [2 * i for i in range(6)], 1: [2 * i + 1 for i in range(6)]}
    c = ncu_split.concurrency(turns, 12.0, None, seconds_per_kernel=1.0)
    assert c["windows"] == "overlapping" and c["pace_vs_one"] == 2.0
    assert "2.00x one GPU's" in ncu_split.summary_line(c, 12.0)
    assert "pace_vs_one" not in ncu_split.concurrency(turns, 12.0, None)  # no measured pace: not claimed


def test_a_part_does_not_teach_the_cost_cache_its_pace(monkeypatch, tmp_path):
    """A fanned-out part shares the machine with the other parts: its seconds per kernel would make
    the next one-GPU plan wrong, so it records kernels per pair only."""
    from faprof.nsight.ncu import run as ncu_run
    from faprof.nsight.ncu import session_plan as ncu_plan
    from faprof.nsight.ncu.process import NcuRun

    path = tmp_path / "costs.json"
    monkeypatch.setattr(ncu_plan, "costs_path", lambda: path)

    class S:  # the fields _learn_costs reads
        gpu, ncu_set = "NVIDIA H100 80GB HBM3", "faprof"
        record = {"passes": 23.0}

        class settings:  # noqa: N801
            kernel_regex, iters = None, 1

        class bundle:  # noqa: N801
            @staticmethod
            def read(name):
                import pandas as pd

                return pd.DataFrame({"variant": ["a", "a"], "shape_id": ["s", "s"], "kernel": ["k1", "k2"]})

        @staticmethod
        def progress(*a):
            pass

    result = NcuRun(0, 30.0, 2, False, False, False, [], [], [], prof_times=[10.0, 12.0])
    monkeypatch.setenv("FAPROF_NCU_PART", "1")
    ncu_run._learn_costs(S, result, {"ncu_summary": 2})
    g = ncu_plan.load_costs(path)["gpus"]["NVIDIA H100 80GB HBM3"]
    assert g["pairs"]["a|s"]["kernels_per_call"] == 2 and "faprof" not in g["sets"]
    monkeypatch.delenv("FAPROF_NCU_PART")
    ncu_run._learn_costs(S, result, {"ncu_summary": 2})
    g = ncu_plan.load_costs(path)["gpus"]["NVIDIA H100 80GB HBM3"]
    assert g["sets"]["faprof"]["seconds_per_kernel"] == 2.0


def test_faprof_ncu_refuses_bad_gpus_in_one_line(tmp_path):
    from click.testing import CliRunner

    from faprof.cli import main

    res = CliRunner().invoke(main, ["ncu", str(tmp_path / "no-run"), "--gpus", "first"])
    assert res.exit_code == 2 and "comma-separated GPU indices" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_fan_out_end_to_end_with_a_stand_in_ncu(tmp_path, monkeypatch):
    """`collect_ncu` over two 'GPUs' on this CPU machine: the stand-in ncu of test_ncu_collect (it
    prints ncu's progress lines and copies a report recorded on an H100) runs in each part process;
    the plan names both GPUs, each part gets its own TMPDIR (or the shared one), and the record
    keeps each part's profiling window."""
    import gzip

    from fakes import PY_HEADER
    from test_ncu_collect import DATA, FAKE_NCU, GPU, _fake_exe, _reader

    from faprof import run as runner
    from faprof.model.scenarios import load_scenario
    from faprof.run import fanout
    from faprof.store import Bundle

    _reader()
    report = tmp_path / "fa_basic.ncu-rep"
    report.write_bytes(gzip.decompress((DATA / "fa_basic.ncu-rep.gz").read_bytes()))
    exe = _fake_exe(tmp_path / "bin" / "ncu")
    # the stand-in also notes the TMPDIR it ran with (where a real ncu keeps nsight-compute-lock)
    anchor = 'with open(os.environ["FAKE_NCU_ARGS"], "w") as f:'
    assert anchor in FAKE_NCU
    exe.write_text(FAKE_NCU.format(header=PY_HEADER).replace(anchor, (
        "open(os.path.join(os.environ['FAKE_TMP_LOG'], str(os.getpid())), 'w').write(os.environ.get('TMPDIR', ''))\n"
        + anchor)))
    (tmp_path / "tmplog").mkdir()
    for k, v in {"NCU": str(exe), "FAKE_NCU_ARGS": str(tmp_path / "args.json"), "FAKE_NCU_REPORT": str(report),
                 "FAPROF_CACHE": str(tmp_path / "cache"), "FAKE_NCU_PLAN": str(DATA / "fa_basic_plan.json"),
                 "FAKE_TMP_LOG": str(tmp_path / "tmplog"), "TMPDIR": str(tmp_path / "parent_tmp")}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "parent_tmp").mkdir()
    scenario = load_scenario("smoke")
    opts = runner.ProfileOptions(variants=["cpu_ref", "naive", "fa2"], out_dir=tmp_path / "runs")
    msgs: list[str] = []
    for mode in ("per-gpu", "shared"):
        monkeypatch.setenv("FAPROF_NCU_LOCK", mode)
        b = Bundle.create(tmp_path / "runs" / mode, "smoke", GPU, {
            "scenario": {"name": "smoke", "raw": scenario.raw}, "env": {"gpu_name": GPU, "cc": "9.0"},
            "settings": {"variants": ["cpu_ref", "naive", "fa2"], "user_variants": []}})
        b.append_measurement({"variant": "fa2", "shape_id": "s", "status": "ok", "median_ms": 1.0})
        fanout.collect_ncu(b, scenario, opts, "basic", lambda e, i: msgs.append(i.get("message", "")), True, [0, 1])
        rec = b.manifest()["ncu"]
        assert rec["gpus"] == [0, 1] and rec["fanout"]["lock"] == mode
        assert set(rec["fanout"]["windows_s"]) == {"0", "1"} and all(rec["fanout"]["kernels_by_gpu"].values())
        assert "expected_s" in rec["fanout"] and rec["fanout"]["overlap_s"] >= 0
        tmps = sorted(p.read_text() for p in (tmp_path / "tmplog").iterdir())
        if mode == "per-gpu":
            assert tmps == [str(b.raw_dir() / "ncu.gpu0" / "tmp"), str(b.raw_dir() / "ncu.gpu1" / "tmp")]
        else:
            assert tmps == [str(tmp_path / "parent_tmp")] * 2
        for p in (tmp_path / "tmplog").iterdir():
            p.unlink()
    assert any(m.startswith("ncu fan-out over GPUs 0, 1:") for m in msgs)
    assert any("if the GPUs profile at once" in m for m in msgs)
    assert any(m.startswith("ncu fan-out: ") and "overlapped" in m for m in msgs)
