"""Run bundles: round trip, never overwritten, atomic appends, resume, CSV export."""

import json
from datetime import UTC, datetime

import pandas as pd
import pytest

from faprof.errors import FaprofError
from faprof.store import Bundle, export_csv, find_bundles, load_many, resolve_run


def _row(variant, shape, status="ok", ms=1.0):
    return {"variant": variant, "shape_id": shape, "status": status, "median_ms": ms,
            "samples_ms": [ms, ms * 1.01], "errors": {"out": {"max_abs": 0.0}}}


def test_create_write_read_round_trip(tmp_path):
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    b = Bundle.create(tmp_path, "smoke", "NVIDIA H100 80GB HBM3", {"env": {"gpu_name": "NVIDIA H100 80GB HBM3"}}, now=now)
    assert b.path.name == "20260102T030405Z_nvidia-h100-80gb-hbm3_smoke"
    assert b.manifest()["status"] == "running"
    b.append_measurement(_row("a", "s1", ms=2.0))
    b.append_measurement(_row("b", "s1", status="wrong", ms=3.0))
    df = Bundle.open(b.path).measurements()
    assert list(df["variant"]) == ["a", "b"]
    assert list(df["samples_ms"].iloc[0]) == [2.0, 2.02]
    assert json.loads(df["errors"].iloc[0]) == {"out": {"max_abs": 0.0}}
    assert b.done_keys() == {("a", "s1"), ("b", "s1")}
    # re-appending a row for the same key replaces it
    b.append_measurement(_row("a", "s1", ms=5.0))
    df = b.measurements()
    assert len(df) == 2 and df.set_index("variant").loc["a", "median_ms"] == 5.0


def test_bundle_is_never_overwritten(tmp_path):
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    a = Bundle.create(tmp_path, "s", "cpu", {}, now=now)
    b = Bundle.create(tmp_path, "s", "cpu", {}, now=now)
    assert a.path != b.path and a.path.exists() and b.path.exists()
    assert b.path.name.endswith("-2")


def test_no_temp_files_left_and_manifest_log(tmp_path):
    b = Bundle.create(tmp_path, "s", "cpu", {})
    b.append_measurement(_row("a", "s1"))
    b.log("hello")
    assert "hello" in b.manifest()["log"][-1]
    assert not [p for p in b.path.iterdir() if p.name.endswith(".tmp")]


def test_open_errors(tmp_path):
    with pytest.raises(FaprofError, match="does not exist"):
        Bundle.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FaprofError, match="not a faprof run bundle"):
        Bundle.open(tmp_path / "empty")


def test_resolve_find_merge_export(tmp_path):
    b1 = Bundle.create(tmp_path, "s", "cpu", {"env": {"gpu_name": None}, "scenario": {"name": "s"}},
                       now=datetime(2026, 1, 1, tzinfo=UTC))
    b2 = Bundle.create(tmp_path, "s", "cpu", {"env": {"gpu_name": "G"}, "scenario": {"name": "s"}},
                       now=datetime(2026, 1, 2, tzinfo=UTC))
    b1.append_measurement(_row("a", "x"))
    b2.append_measurement(_row("a", "x", ms=2.0))
    assert [b.path for b in find_bundles(tmp_path)] == [b2.path, b1.path]
    assert resolve_run("latest", tmp_path).path == b2.path
    assert resolve_run(b1.run_id[:9], tmp_path).path == b1.path
    with pytest.raises(FaprofError, match="matches 2 runs"):
        resolve_run("2026", tmp_path)
    df, manifests = load_many([tmp_path])
    assert len(df) == 2 and set(df["gpu"].fillna("cpu")) == {"G", "cpu"}
    written = export_csv(b2, tmp_path / "csv")
    csv = pd.read_csv(tmp_path / "csv" / "measurements.csv")
    assert csv["median_ms"].tolist() == [2.0]
    assert json.loads(csv["samples_ms"].iloc[0]) == [2.0, 2.02]
    assert any(p.name == "bundle_manifest.json" for p in written)
    # an exported or reported folder is never taken for a run
    assert [b.path for b in find_bundles(tmp_path)] == [b2.path, b1.path]


def test_latest_is_the_newest_complete_run_and_says_when_it_is_not(tmp_path):
    """'latest' passes over a newer interrupted run (naming it); with no complete run it takes the newest, saying so."""
    old = Bundle.create(tmp_path, "s", "cpu", {}, now=datetime(2026, 1, 1, tzinfo=UTC))
    new = Bundle.create(tmp_path, "s", "cpu", {}, now=datetime(2026, 1, 2, tzinfo=UTC))
    new.update_manifest(status="interrupted")
    notes: list[str] = []
    assert resolve_run("latest", tmp_path, notes.append).path == new.path  # `old` is running: not complete either
    assert len(notes) == 1 and "no run under" in notes[0] and new.run_id in notes[0] and "interrupted" in notes[0]
    old.update_manifest(status="complete")
    notes.clear()
    assert resolve_run("latest", tmp_path, notes.append).path == old.path
    assert len(notes) == 1 and old.run_id in notes[0] and f"{new.run_id} (interrupted)" in notes[0]
    new.update_manifest(status="complete")
    notes.clear()
    assert resolve_run("latest", tmp_path, notes.append).path == new.path and notes == []


def test_bundle_files_are_created_as_other_files_are(tmp_path):
    """Bundle files get 0666 less the umask, as open() makes them (not mkstemp's private 0600)."""
    import os
    import stat

    mask = os.umask(0o022)
    try:
        b = Bundle.create(tmp_path, "s", "cpu", {})
        b.append_measurement(_row("a", "s1"))
        b.compact()
        files = [b.manifest_path, b.table_path("measurements")]
        assert [stat.S_IMODE(p.stat().st_mode) for p in files] == [0o644, 0o644]
        os.umask(0o077)
        b.log("private now")
        assert stat.S_IMODE(b.manifest_path.stat().st_mode) == 0o600
    finally:
        os.umask(mask)
