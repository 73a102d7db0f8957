"""Append-only measurement rows: constant-time appends, faithful dtypes, crash-safe compaction."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from faprof.model.schema import ROW_COLUMNS
from faprof.store import Bundle


def _row(i: int, gpu: str | None = "GPU A", median: float | None = 1.0) -> dict:
    r = dict.fromkeys(ROW_COLUMNS)
    r.update(variant=f"v{i % 7}", shape_id=f"s{i}", status="ok", median_ms=median, n=5 + i % 3,
             samples_ms=[0.5 + i, 0.6 + i], errors={"out": 0.1}, causal=bool(i % 2), gpu_name=gpu)
    return r


def _bundle(tmp_path, name="b") -> Bundle:
    return Bundle.create(tmp_path / name, "s", "gpu", {"scenario": {"name": "s"}})


def _files(b: Bundle) -> dict[str, int]:
    return {str(p.relative_to(b.path)): p.stat().st_mtime_ns for p in b.path.rglob("*") if p.is_file()}


def _seed(b: Bundle, n: int) -> None:
    """n rows already compacted (as a long run that was resumed would have)."""
    b.write("measurements", pd.DataFrame([{**_row(i), "errors": "{}", "row_seq": f"{i:020d}-0000000"}
                                          for i in range(n)]))


def _append_cost(b: Bundle, start: int, k: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + k):
        b.append_measurement(_row(i))
    return (time.perf_counter() - t0) / k


def test_append_is_constant_time_and_writes_one_file(tmp_path):
    small, large = _bundle(tmp_path, "small"), _bundle(tmp_path, "large")
    _seed(small, 100)
    _seed(large, 5000)
    for b in (small, large):  # the structural check: one new file per append, nothing rewritten
        before = _files(b)
        b.append_measurement(_row(999_999))
        after = _files(b)
        new = set(after) - set(before)
        assert len(new) == 1 and next(iter(new)).startswith("rows/")
        assert all(after[f] == before[f] for f in before), "an append rewrote an existing file"
    _append_cost(small, 10_000, 5)  # warm-up
    c_small = min(_append_cost(small, 20_000 + 40 * j, 40) for j in range(3))
    c_large = min(_append_cost(large, 20_000 + 40 * j, 40) for j in range(3))
    assert c_large < 3 * c_small, f"append at 5000 rows {c_large * 1e3:.2f} ms vs at 100 rows {c_small * 1e3:.2f} ms"


def test_rows_read_back_with_their_types_and_compact(tmp_path):
    b = _bundle(tmp_path)
    b.append_measurement(_row(1, median=None))  # all-null float column in a one-row file
    b.append_measurement(_row(2, median=2.5))
    pending = b.measurements()
    assert b.has("measurements") and not b.table_path("measurements").exists()
    assert len(b.pending_rows()) == 2
    assert pending["median_ms"].dtype == np.float64
    assert list(pending["samples_ms"].iloc[1]) == [2.5, 2.6]
    assert b.compact() == 2
    assert b.pending_rows() == [] and not (b.path / "rows").exists()
    done = b.measurements()
    pd.testing.assert_frame_equal(done, pending)
    assert b.done_keys() == {("v1", "s1"), ("v2", "s2")}


def test_newer_row_replaces_older_and_crash_during_compaction_duplicates_nothing(tmp_path):
    b = _bundle(tmp_path)
    b.append_measurement(_row(1, median=1.0))
    b.append_measurement(_row(2, median=2.0))
    b.compact()
    b.append_measurement(_row(1, median=9.0))  # a re-measured row replaces the compacted one
    rows = b.measurements().set_index("shape_id")
    assert len(rows) == 2 and rows.loc["s1", "median_ms"] == 9.0
    # a crash after the compacted table is written but before the row files are deleted:
    merged = b.measurements()
    b.write("measurements", merged)
    assert len(b.pending_rows()) == 1
    again = b.measurements()
    assert len(again) == 2 and again.set_index("shape_id").loc["s1", "median_ms"] == 9.0
    # and an older row file left behind does not win over a newer compacted row
    stale = b.path / "rows" / ("0" * 20 + "-0000001.parquet")
    pd.DataFrame([{**_row(2, median=-1.0), "errors": "{}", "row_seq": "0" * 20 + "-0000001"}]).to_parquet(stale)
    assert b.measurements().set_index("shape_id").loc["s2", "median_ms"] == 2.0
    b.compact()
    final = b.measurements()
    assert sorted(final["shape_id"]) == ["s1", "s2"] and b.pending_rows() == []


def test_rows_of_two_gpu_models_are_kept_apart(tmp_path):
    b = _bundle(tmp_path)
    b.append_measurement(_row(1, gpu="NVIDIA H100"))
    b.append_measurement(_row(1, gpu="NVIDIA H200"))
    assert len(b.measurements()) == 2
    assert b.done_keys(gpu_name="NVIDIA H200") == {("v1", "s1")}
    assert b.done_keys(gpu_name="NVIDIA L4") == set()


def test_old_bundle_without_row_files_reads_as_before(tmp_path):
    b = _bundle(tmp_path)
    old = pd.DataFrame([{"variant": "a", "shape_id": "x", "status": "ok", "median_ms": 1.0}])
    b.write("measurements", old)
    pd.testing.assert_frame_equal(b.measurements(), old)
    assert b.compact() == 0
    assert b.done_keys(gpu_name="NVIDIA H100") == {("a", "x")}


def test_rows_from_before_gpu_names_take_the_runs_gpu(tmp_path):
    """A bundle resumed by this faprof mixes older rows (no gpu_name) with newer ones: the older rows
    get the run's GPU from the manifest, so both join on gpu_name (speedups per GPU)."""
    b = Bundle.create(tmp_path, "s", "NVIDIA H100 80GB HBM3", {"env": {"gpu_name": "NVIDIA H100 80GB HBM3"}})
    b.append_measurement({"variant": "a", "shape_id": "x", "status": "ok", "median_ms": 1.0})
    b.append_measurement({"variant": "b", "shape_id": "x", "status": "ok", "median_ms": 2.0,
                          "gpu_name": "NVIDIA H100 80GB HBM3"})
    m = b.measurements()
    assert set(m["gpu_name"]) == {"NVIDIA H100 80GB HBM3"}
