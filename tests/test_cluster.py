"""--cluster on a real local Dask cluster of two CPU worker processes (the `cluster` extra)."""

from __future__ import annotations

import socket
import sys

import pytest

from faprof import run as runner
from faprof.errors import FaprofError
from faprof.run import cluster

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def dask_cluster():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0",
                                  silence_logs=40) as c:
        yield c


def _rows(b) -> list[tuple[str, str, str]]:
    df = b.measurements()
    return sorted(zip(df["variant"], df["shape_id"], df["status"], strict=True))


def test_smoke_on_the_cluster_gives_the_local_rows(dask_cluster, tmp_path, smoke_local):
    local = smoke_local  # the default local runner's rows (conftest)
    opts = runner.ProfileOptions(out_dir=tmp_path / "cluster", ceilings=False, cluster=dask_cluster.scheduler_address)
    remote = runner.profile("smoke", opts, progress=lambda *a: None)
    assert _rows(remote) == _rows(local)
    m = remote.manifest()
    assert m["status"] == "complete" and m["settings"]["cluster"] == dask_cluster.scheduler_address
    assert sorted(w["dask_worker"] for w in m["workers"]) == sorted(dask_cluster.scheduler_info["workers"])
    assert all(w["env"].get("python") or w["env"] for w in m["workers"])
    df = remote.measurements()
    timed = df[df["status"] == "ok"]
    assert len(timed) and (timed["attempts"] == 1).all()
    assert remote.pending_rows() == []
    # smoke times cpu_ref on the host: a worker Dask started on 1 torch thread of several cores is named
    one_thread = [w["dask_worker"] for w in m["workers"]
                  if w["env"].get("torch_threads") == 1 and (w["env"].get("cpu_count") or 1) > 1]
    said = [line for line in m.get("log", []) if "runs torch on 1 CPU thread" in line]
    assert "cpu_ref" in set(df["variant"]) and len(said) == len(one_thread)
    assert all(any(a in line for line in said) for a in one_thread)


def test_unreachable_scheduler_is_one_line_and_no_bundle(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT_S", 2.0)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = runner.ProfileOptions(out_dir=tmp_path / "runs", ceilings=False, cluster=f"tcp://127.0.0.1:{port}")
    with pytest.raises(FaprofError, match="cannot reach the Dask scheduler"):
        runner.profile("smoke", opts, progress=lambda *a: None)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_version_mismatch_is_refused_before_a_bundle(dask_cluster, tmp_path, monkeypatch):
    # Simulated: this client claims another commit than the workers run (the workers report their real one).
    real = cluster.versions()
    monkeypatch.setattr(cluster, "versions", lambda: {**real, "git_sha": "0" * 40, "faprof": "0.0.0-other"})
    opts = runner.ProfileOptions(out_dir=tmp_path / "runs", ceilings=False, cluster=dask_cluster.scheduler_address)
    with pytest.raises(FaprofError, match="runs another faprof: faprof"):
        runner.profile("smoke", opts, progress=lambda *a: None)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_without_dask_the_hint_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the extra were not installed
    with pytest.raises(FaprofError, match=r"pip install 'faprof\[cluster\]'"):
        cluster.connect("tcp://127.0.0.1:1")


def test_a_task_whose_dask_worker_dies_twice_becomes_a_failed_outcome():
    """The Dask worker process itself dies mid-task (test hook `die_host`); the nanny restarts it and
    Dask reschedules; the third start returns a `died` outcome instead of running again."""
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0",
                                  silence_logs=50) as c, distributed.Client(c, set_as_default=False) as client:
        fut = client.submit(cluster.run_remote, {"op": "die_host"}, [], 30.0, "faprof-test-topic", "k1", pure=False)
        out = fut.result(timeout=120)
    assert out["kind"] == "died" and "lost twice" in out["payload"] and out["attempts"] == 3


class _Info:
    """A client answering scheduler_info() as Dask's does, for the worker-selection rules."""

    def __init__(self, workers):
        self._workers = workers

    def scheduler_info(self, n_workers=None):
        return {"workers": self._workers}


def test_with_gpu_resources_a_worker_declaring_none_is_left_out_by_name():
    client = _Info({"tcp://a:1": {"resources": {"GPU": 1}, "nthreads": 1},
                    "tcp://b:1": {"resources": {}, "nthreads": 4}})
    assert cluster.gpu_resources(client) == {"GPU": 1}
    keep, notes = cluster.usable_workers(client, ["tcp://a:1", "tcp://b:1"], {"GPU": 1})
    assert keep == ["tcp://a:1"] and len(notes) == 1 and "tcp://b:1 declares no GPU resource" in notes[0]
    # a CPU-only cluster (no resources anywhere): every worker
    assert cluster.usable_workers(client, ["tcp://a:1", "tcp://b:1"], None) == (["tcp://a:1", "tcp://b:1"], [])


def test_a_gpu_worker_with_threads_and_no_gpu_resource_is_refused():
    client = _Info({"tcp://g:1": {"resources": {}, "nthreads": 2}, "tcp://c:1": {"resources": {}, "nthreads": 8}})
    cpu_only = [{"dask_worker": "tcp://c:1", "cuda_available": False}]
    cluster.check_gpu_sharing(client, cpu_only, None)  # CPU workers may run tasks side by side
    with pytest.raises(FaprofError, match=r"tcp://g:1 has a GPU, 2 threads and no GPU resource"):
        cluster.check_gpu_sharing(client, [*cpu_only, {"dask_worker": "tcp://g:1", "cuda_available": True}], None)
    cluster.check_gpu_sharing(client, [{"dask_worker": "tcp://g:1", "cuda_available": True}], {"GPU": 1})


def test_a_one_thread_worker_is_named_only_when_the_run_times_the_host():
    envs = [{"dask_worker": "tcp://a:1", "torch_threads": 1, "cpu_count": 32},
            {"dask_worker": "tcp://b:1", "torch_threads": 16, "cpu_count": 32},
            {"dask_worker": "tcp://c:1", "torch_threads": 1, "cpu_count": 1}]
    notes = cluster.host_thread_notes(envs, ["cpu_ref"])
    assert len(notes) == 1 and "tcp://a:1 runs torch on 1 CPU thread of 32 cores" in notes[0]
    assert "cpu_ref" in notes[0] and "pre-spawn-environ" in notes[0]
    assert cluster.host_thread_notes(envs, []) == []  # GPU variants only: nothing to say
