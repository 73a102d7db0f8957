"""--gpus: one worker process per GPU, one task queue, resume, Ctrl-C; the ncu fan-out's split and merge.

On this CPU machine the workers see no GPU (their rows are CPU rows or `skipped`), but the
machinery is the real one: spawned workers pinned with CUDA_VISIBLE_DEVICES, threads pulling from
one queue, rows appended as they finish.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from faprof import run as runner
from faprof.errors import FaprofError
from faprof.run import fanout, gpu_pool
from faprof.store import Bundle

DATA = Path(__file__).parent / "data" / "bundles"
H100_NCU = DATA / "20261121T195544Z_nvidia-h100-80gb-hbm3_smoke"


def _rows(b: Bundle) -> list[tuple[str, str, str]]:
    df = b.measurements()
    return sorted(zip(df["variant"], df["shape_id"], df["status"], strict=True))


def test_parse_gpus(monkeypatch):
    monkeypatch.setattr(gpu_pool, "nvml_gpu_count", lambda: 0)  # as on this machine: no driver
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_pool.parse_gpus(None) is None
    assert gpu_pool.parse_gpus("0, 1,1") == [0, 1]
    with pytest.raises(FaprofError, match="no NVIDIA GPU"):
        gpu_pool.parse_gpus("all")
    with pytest.raises(FaprofError, match="comma-separated GPU indices"):
        gpu_pool.parse_gpus("first")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert gpu_pool.parse_gpus("all") == [2, 3]
    monkeypatch.setattr(gpu_pool, "nvml_gpu_count", lambda: 2)  # simulated: a 2-GPU machine
    with pytest.raises(FaprofError, match="has 2 GPU"):
        gpu_pool.parse_gpus("0,2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, smoke_local):
    """smoke with the one default worker (conftest's, shared with test_cluster.py) and with two pinned
    workers (spawning workers takes seconds)."""
    tmp = tmp_path_factory.mktemp("pool")
    two = runner.profile("smoke", runner.ProfileOptions(out_dir=tmp / "two", ceilings=False, gpus=[0, 1]))
    return smoke_local, two


def test_two_workers_give_the_rows_of_one(runs):
    one, two = runs
    assert _rows(two) == _rows(one)
    m = two.manifest()
    assert m["status"] == "complete" and m["settings"]["gpus"] == [0, 1]
    assert [w["gpu_index"] for w in m["workers"]] == [0, 1]
    # each worker ran pinned to its own index, set before anything in it could initialise CUDA
    assert [w["env"]["cuda_visible_devices"] for w in m["workers"]] == ["0", "1"]
    # ... and with its share of the host cores (this 2-core machine: one thread each)
    if not os.environ.get("OMP_NUM_THREADS"):
        assert [w["env"]["torch_threads"] for w in m["workers"]] == [max(1, gpu_pool.host_cores() // 2)] * 2
    df = two.measurements()
    assert set(df["gpu_index"]) == {0, 1}  # both workers took tasks from the one queue
    assert two.pending_rows() == []  # compacted at the end
    assert one.measurements()["gpu_index"].isna().all()  # the default single worker names no index


def test_resume_of_a_two_gpu_bundle(runs, tmp_path):
    want = _rows(runs[1])
    full = Bundle(shutil.copytree(runs[1].path, tmp_path / runs[1].path.name))
    df = full.measurements()
    full.write("measurements", df.iloc[: len(df) // 3])  # as if Ctrl-C had stopped it there
    full.update_manifest(status="interrupted")
    again = runner.profile("", runner.ProfileOptions(), resume=full.path)
    assert again.path == full.path and _rows(again) == want
    assert again.manifest()["status"] == "complete"
    assert any("resumed on" in line for line in again.manifest()["log"])


def test_task_queue_keeps_models_apart_and_prefers_the_last_shape():
    p1, p2 = SimpleNamespace(shape_id="a"), SimpleNamespace(shape_id="b")
    q = gpu_pool.TaskQueue([("H100", p1, "v1"), ("H100", p2, "v1"), ("H200", p1, "v1"), ("H100", p2, "v2")])
    assert q.take("H100", "b")[1:] == (p2, "v1")  # its last shape first
    assert q.take("H100", None)[1:] == (p1, "v1")  # else the oldest
    assert q.take("L4", None) is None  # no task of another model
    assert q.take("H200", "b")[1:] == (p1, "v1")
    assert q.take("H100", "a")[1:] == (p2, "v2") and len(q) == 0


def test_task_queue_hands_out_host_rows_first_biggest_first():
    """cpu_ref rows take seconds on the CPU: handed out first (longest first) so that no worker is
    left running one while the others idle at the end; a worker's last shape still comes first."""
    small, big = SimpleNamespace(shape_id="s", flops=lambda: 1e6), SimpleNamespace(shape_id="b", flops=lambda: 1e9)
    gpu, cpu = SimpleNamespace(name="fa2", device="cuda"), SimpleNamespace(name="cpu_ref", device="cpu")
    q = gpu_pool.TaskQueue([("H100", small, gpu), ("H100", big, gpu), ("H100", small, cpu), ("H100", big, cpu)])
    assert q.take("H100", None)[1:] == (big, cpu)
    assert q.take("H100", "b")[1:] == (big, gpu)  # the shape it ran last
    assert q.take("H100", None)[1:] == (small, cpu)
    assert q.take("H100", None)[1:] == (small, gpu) and len(q) == 0


def test_each_of_several_workers_gets_its_share_of_the_host_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(gpu_pool, "host_cores", lambda: 32)
    assert gpu_pool.worker_env(1, 2) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1", "OMP_NUM_THREADS": "16"}
    assert gpu_pool.worker_env(0, 1) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"}  # one: all cores
    monkeypatch.setattr(gpu_pool, "host_cores", lambda: 2)
    assert gpu_pool.worker_env(0, 3)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's choice is kept
    assert "OMP_NUM_THREADS" not in gpu_pool.worker_env(0, 2)


def test_ctrl_c_stops_handing_out_tasks_and_keeps_finished_rows(monkeypatch):
    """Ctrl-C lands in the main thread's wait for the workers once the 6th task has begun. It is raised there
    directly: a timer raced 2 s of work, and `_thread.interrupt_main` does nothing while a library leaves
    SIGINT's handler changed; both made this test fail in full-suite runs. Tasks from the 6th on wait for
    the stop, so nothing can finish the queue first; no row is emitted after the interrupt, and at most one
    task per worker is taken in the moment before the stop is seen."""
    p = SimpleNamespace(shape_id="a")
    q = gpu_pool.TaskQueue([("cpu", p, f"v{i}") for i in range(40)])
    slots = [gpu_pool.Slot(i, None, {"gpu_name": None}) for i in range(2)]  # type: ignore[arg-type]
    emitted: list[dict] = []
    stop = threading.Event()
    sixth = threading.Event()
    count = {"n": 0}
    count_lock = threading.Lock()
    real_join = threading.Thread.join
    fired: list[bool] = []

    def join(self, timeout=None):
        if threading.current_thread() is threading.main_thread() and sixth.is_set() and not fired:
            fired.append(True)
            raise KeyboardInterrupt  # what the user's Ctrl-C does to the waiting main thread
        return real_join(self, timeout)

    def run_one(slot, problem, variant, died_on):
        with count_lock:
            count["n"] += 1
            n = count["n"]
        if n >= 6:
            sixth.set()
            assert stop.wait(10), "Ctrl-C did not reach the pool"  # in flight when it lands: its row is dropped
        return {"variant": variant, "slot": slot.index}

    monkeypatch.setattr(threading.Thread, "join", join)
    with pytest.raises(KeyboardInterrupt):
        gpu_pool.run_tasks(slots, q, run_one, emitted.append, stop)
    monkeypatch.undo()
    n = len(emitted)
    assert fired and stop.is_set() and 1 <= n <= 5, n  # only the rows of tasks finished before the interrupt
    time.sleep(0.3)
    assert len(emitted) == n, "a row was emitted after Ctrl-C"
    assert count["n"] <= 6 + len(slots), count  # no task handed out after the stop was seen
    assert len(q) >= 40 - count["n"]


def test_an_error_in_one_worker_keeps_the_rows_the_others_finish():
    """Slot 0 raises on its second task while slot 1 is inside a longer one: slot 1's row is kept
    (it ran to the end), no task is handed out after the error, and the error is raised."""
    p = SimpleNamespace(shape_id="a")
    q = gpu_pool.TaskQueue([("cpu", p, f"v{i}") for i in range(10)])
    slots = [gpu_pool.Slot(i, None, {"gpu_name": None}) for i in range(2)]  # type: ignore[arg-type]
    emitted: list[dict] = []
    calls = {0: 0, 1: 0}

    def run_one(slot, problem, variant, died_on):
        calls[slot.index] += 1
        if slot.index == 0:
            if calls[0] == 2:
                raise RuntimeError("bundle disk full")
            time.sleep(0.02)
        else:
            time.sleep(0.3)  # still running when slot 0 fails
        return {"variant": variant, "slot": slot.index}

    with pytest.raises(RuntimeError, match="disk full"):
        gpu_pool.run_tasks(slots, q, run_one, emitted.append, threading.Event())
    assert sorted(r["slot"] for r in emitted) == [0, 1], emitted  # slot 1's long task is kept
    assert calls[1] == 1 and len(q) == 10 - 3


def test_a_task_lost_with_its_worker_is_retried_once_on_another_gpu():
    p = SimpleNamespace(shape_id="a")
    q = gpu_pool.TaskQueue([("cpu", p, "crashes_on_0"), ("cpu", p, "always_crashes"), ("cpu", p, "fine")])
    slots = [gpu_pool.Slot(i, None, {"gpu_name": None}) for i in range(2)]  # type: ignore[arg-type]
    emitted: list[dict] = []

    def run_one(slot, problem, variant, died_on):
        time.sleep(0.05)
        if variant == "always_crashes" or (variant == "crashes_on_0" and slot.index == 0):
            if died_on is None:
                return gpu_pool.Retry(f"died on {slot.index}")
            return {"variant": variant, "slot": slot.index, "status": "failed", "reason": f"again, after {died_on}"}
        return {"variant": variant, "slot": slot.index, "status": "ok", "retried_after": died_on}

    gpu_pool.run_tasks(slots, q, run_one, emitted.append, threading.Event())
    rows = {r["variant"]: r for r in emitted}
    assert sorted(rows) == ["always_crashes", "crashes_on_0", "fine"] and len(emitted) == 3
    assert rows["always_crashes"]["status"] == "failed" and "again, after died on" in rows["always_crashes"]["reason"]
    first = int(rows["always_crashes"]["reason"][-1])
    assert rows["always_crashes"]["slot"] != first  # the retry ran on the other GPU
    if rows["crashes_on_0"].get("retried_after"):
        assert rows["crashes_on_0"]["slot"] == 1
    assert q.in_flight == 0 and len(q) == 0


def test_two_workers_contain_a_crash_and_a_hang(tmp_path):
    """End to end with two pinned workers: a variant that kills its worker is retried once on the other
    one and then `failed` with both reasons; a hang is `failed` after the timeout, not retried."""
    from faprof import variants
    from faprof.model.scenarios import parse_scenario

    plugin = tmp_path / "bad_variants.py"
    plugin.write_text(textwrap.dedent("""
        import os, time
        from faprof.variants import user_variant

        def dies(q, k, v, causal, scale, out=None):
            os._exit(7)          # as a crashing kernel takes its process down

        def hangs(q, k, v, causal, scale, out=None):
            time.sleep(3600)

        user_variant("pool_dies", dies, device="cpu", dtypes=("fp32",))
        user_variant("pool_hangs", hangs, device="cpu", dtypes=("fp32",))
    """))
    variants.load_user_variants(str(plugin))
    scen = parse_scenario({
        "name": "contain", "baseline": "torch_standard",
        "variants": ["pool_dies", "torch_standard", "pool_hangs", "sdpa_math"],
        "problems": [{"B": 1, "H": 1, "S": 16, "D": 8, "dtype": "fp32"}],
        "timing": {"budget_s": 0.05, "min_repeats": 3, "warmup_ms": 1, "e2e_repeats": 2},
    }, "test")
    opts = runner.ProfileOptions(out_dir=tmp_path / "runs", user_variants=[str(plugin)], task_timeout_s=8,
                                 ceilings=False, gpus=[0, 1])
    bundle = runner.profile(scen, opts)
    df = bundle.measurements().set_index("variant")
    dies = df.loc["pool_dies"]
    assert dies["status"] == "failed" and dies["attempts"] == 2
    assert dies["reason"].count("exit code 7") == 2 and "retried after" in dies["reason"]
    assert df.loc["pool_hangs", "status"] == "failed" and df.loc["pool_hangs", "attempts"] == 1
    assert "no answer within 8 s" in df.loc["pool_hangs", "reason"]
    assert (df.loc[["torch_standard", "sdpa_math"], "status"] == "ok").all()
    assert any("retrying once on another GPU" in line for line in bundle.manifest()["log"])


# ------------------------------------------------------------------------------------ ncu fan-out
def test_merge_parts_from_a_recorded_h100_session(tmp_path):
    """Two parts made of a real H100 ncu session's tables (split by shape) merge back to the same rows."""
    src = Bundle(H100_NCU)
    dest = Bundle.create(tmp_path / "runs", "smoke", "gpu", {"scenario": {"name": "smoke"}})
    summary = src.read("ncu_summary")
    shapes = sorted(summary["shape_id"].unique())
    assert len(shapes) >= 2
    halves = [shapes[: len(shapes) // 2], shapes[len(shapes) // 2:]]
    rec = src.manifest()["ncu"]
    parts = []
    for gpu, keep in zip((0, 1), halves, strict=True):
        d = dest.raw_dir() / f"ncu.gpu{gpu}"
        (d / "raw").mkdir(parents=True)
        sub = Bundle(d)
        sub.write_manifest({"ncu": {**rec, "kernels": int((summary["shape_id"].isin(keep) & (summary["kernel_id"] >= 0)).sum())}})
        for name in ("ncu_summary", "ncu_metrics", "stalls", "roofline", "ncu_rules"):
            df = src.read(name)
            if not df.empty:
                sub.write(name, df[df["shape_id"].isin(keep)])
        shutil.copy(H100_NCU / "raw" / "ncu.log", d / "raw" / "ncu.log") if (H100_NCU / "raw" / "ncu.log").exists() else None
        parts.append((gpu, d))
    record = fanout.merge_parts(dest, parts, "faprof", 12.5, lambda *a: None)
    merged = dest.read("ncu_summary")
    assert len(merged) == len(summary)
    assert set(merged["gpu_index"]) == {0, 1}
    ids = merged.loc[merged["kernel_id"] >= 0, "kernel_id"]
    assert ids.is_unique  # later parts' kernel ids shifted past earlier ones
    key = ["variant", "shape_id", "launch", "kernel"]
    pd.testing.assert_frame_equal(
        merged.drop(columns=["gpu_index", "kernel_id"]).sort_values(key).reset_index(drop=True),
        summary.drop(columns=["kernel_id"]).sort_values(key).reset_index(drop=True), check_dtype=False)
    # the metrics rows follow their summary rows' new ids
    mm = dest.read("ncu_metrics")
    assert set(mm.loc[mm["kernel_id"] >= 0, "kernel_id"]) <= set(ids)
    m = dest.manifest()["ncu"]
    assert m["status"] == "ok" and m["wall_s"] == 12.5 and m["gpus"] == [0, 1] and len(m["parts"]) == 2
    assert m["kernels"] == record["kernels"] == int((summary["kernel_id"] >= 0).sum())
    assert not (dest.raw_dir() / "ncu.gpu0").exists()  # scratch bundles removed
    json.dumps(m)  # the record is plain JSON


def test_profile_flags_refused_in_one_line(tmp_path):
    from click.testing import CliRunner

    from faprof.cli import main

    for args, words in ((["--gpus", "0", "--cluster", "tcp://127.0.0.1:1"], "give one of them"),
                        (["--gpus", "0", "--no-isolate"], "drop --no-isolate"),
                        (["--gpus", "first"], "comma-separated GPU indices")):
        res = CliRunner().invoke(main, ["profile", "-s", "smoke", "--out", str(tmp_path), *args])
        assert res.exit_code == 2 and words in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_nsys_parts_from_a_recorded_h100_capture_merge(tmp_path):
    """A real H100 nsys capture's tables split by variant into two parts merge back to the same rows."""
    src = Bundle(DATA / "20261121T194831Z_nvidia-h100-80gb-hbm3_smoke")
    dest = Bundle.create(tmp_path / "runs", "smoke", "gpu", {"scenario": {"name": "smoke"}})
    kernels, summary = src.read("nsys_kernels"), src.read("nsys_summary")
    names = sorted(summary["variant"].unique())
    groups = [names[0::2], names[1::2]]
    parts = []
    for gpu, vs in zip((0, 1), groups, strict=True):
        d = dest.raw_dir() / f"nsys.gpu{gpu}"
        (d / "raw").mkdir(parents=True)
        sub = Bundle(d)
        sub.write_manifest({"nsys": {**src.manifest()["nsys"], "status": "complete"}, "log": ["t nsys: captured"]})
        sub.write("nsys_kernels", kernels[kernels["variant"].isin(vs)])
        sub.write("nsys_summary", summary[summary["variant"].isin(vs)])
        (d / "raw" / "nsys.log").write_text("the part's log\n")
        parts.append((gpu, d))
    rec = fanout.merge_tool_parts(dest, "nsys", parts, 3.0, lambda *a: None)
    assert rec["status"] == "complete" and rec["gpus"] == [0, 1]
    merged = dest.read("nsys_summary")
    assert len(merged) == len(summary) and set(merged["run_id"]) == {dest.run_id}
    assert len(dest.read("nsys_kernels")) == len(kernels)
    assert (dest.raw_dir() / "nsys.gpu1.log").read_text() == "the part's log\n"
    assert not (dest.raw_dir() / "nsys.gpu0").exists()


def test_part_processes_run_pinned_and_report_back(runs, tmp_path, monkeypatch):
    """The fan-out's plumbing on this CPU machine: one part process per 'GPU', each calling the
    single-GPU nsys stage on its scratch bundle (which finds no nsys here and says so); the
    parts' records come back into the run's manifest."""
    monkeypatch.setenv("NSYS", str(tmp_path / "no-nsys-here"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    b = Bundle(shutil.copytree(runs[1].path, tmp_path / runs[1].path.name))
    seen: list[str] = []
    specs = [(g, {"tool": "nsys", "options": {"variants": vs, "user_variants": []}})
             for g, vs in ((0, ["torch_standard"]), (1, ["sdpa_math"]))]
    done = fanout._run_parts(b, "nsys", specs, lambda e, i: seen.append(i.get("message", "")), time.perf_counter(), {})
    rec = fanout.merge_tool_parts(b, "nsys", done, 1.0, lambda *a: None)
    assert [p["gpu_index"] for p in rec["parts"]] == [0, 1]
    assert all(p["status"] == "skipped" for p in rec["parts"]) and rec["status"] == "skipped"
    assert any(m.startswith("gpu0: ") for m in seen) and any(m.startswith("gpu1: ") for m in seen)
    assert b.manifest()["nsys"]["gpus"] == [0, 1]


def test_a_one_gpu_nsight_stage_profiles_the_gpu_the_timing_used(monkeypatch):
    """`--gpus 1` (or a fan-out that cannot split) runs ncu/nsys in this process: the profiled process
    it starts must see GPU 1, in NVML's (PCI) numbering, and the environment comes back afterwards."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with fanout.pinned(1):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and "CUDA_DEVICE_ORDER" not in os.environ
    with fanout.pinned(None):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
