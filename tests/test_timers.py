"""Timer and clock-record fallbacks: each cause gives one clear reason, never an exception."""

from __future__ import annotations

import sys

import pytest

from faprof.model.settings import TimingSettings
from faprof.timing import cupti_timer, gpu_monitor, harness


def test_cupti_refused_under_a_profiler(monkeypatch):
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "42")
    ok, reason = cupti_timer.probe()
    assert not ok and "NSYS_PROFILING_SESSION_ID" in reason and "\n" not in reason
    with pytest.raises(cupti_timer.CuptiUnavailable, match="profiler"):
        cupti_timer.KernelTimer.open()


def test_cupti_missing_package_says_how_to_install(monkeypatch):
    for k in cupti_timer.PROFILER_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setitem(sys.modules, "cupti", None)  # import cupti -> ImportError
    ok, reason = cupti_timer.probe()
    assert not ok and "cupti-python" in reason and "pip install" in reason
    info = cupti_timer.describe()
    assert info == {"available": False, "reason": reason}


def test_harness_records_why_it_used_events(monkeypatch):
    timer, note = harness._open_timer(TimingSettings(timer="events"))
    assert timer is None and "events" in note
    monkeypatch.setenv("NSYS_PROFILING_SESSION_ID", "1")
    timer, note = harness._open_timer(TimingSettings(timer="auto"))
    assert timer is None and note.startswith("CUPTI unavailable: running under an NVIDIA profiler")


def test_nvml_missing_or_failing_gives_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    mon = gpu_monitor.Monitor.open()
    assert not mon.ok and "nvidia-ml-py" in mon.error
    assert mon.read() is None and mon.summary() == {"nvml": mon.error}


def test_nvml_init_error_is_recorded(monkeypatch):
    class FakeNvml:
        @staticmethod
        def nvmlInit():
            raise RuntimeError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml)
    mon = gpu_monitor.Monitor.open()
    assert not mon.ok and mon.error == "NVML init failed: Driver Not Loaded"


def test_throttle_summary_flags_slowdowns_not_idle():
    mon = gpu_monitor.Monitor(handle=None)
    mon.readings = [gpu_monitor.Reading(sm_clock_mhz=1980, temperature_c=40, reasons=0x1),
                    gpu_monitor.Reading(sm_clock_mhz=1755, temperature_c=71, reasons=0x4)]
    s = mon.summary()
    assert s["throttled"] is True and s["throttle_reasons"] == "sw_power_cap"
    assert (s["temp_c_before"], s["temp_c_after"]) == (40, 71)
    assert (s["nvml_sm_clock_mhz_min"], s["nvml_sm_clock_mhz_max"]) == (1755, 1980)
    mon.readings = [gpu_monitor.Reading(sm_clock_mhz=1980, temperature_c=40, reasons=0x1)]
    assert mon.summary()["throttled"] is False


def test_cupti_keeps_only_launch_api_records():
    """Only API records of launches stay enabled (the rest cost Python time per record)."""
    import enum
    import types

    calls: list[tuple[str, int, int]] = []
    rt = enum.IntEnum("rt", {"INVALID": 0, "cudaLaunchKernel_v7000": 1, "cudaEventRecord_v3020": 2,
                             "cudaGraphLaunch_v10000": 3, "cudaGetDevice_v3020": 4, "SIZE": 5})
    dr = enum.IntEnum("dr", {"INVALID": 0, "cuLaunchKernelEx": 1, "cuCtxGetCurrent": 2, "cuMemsetD8Async": 3})
    fake = types.SimpleNamespace(
        runtime_api_trace_cbid=rt, driver_api_trace_cbid=dr,
        activity_enable_runtime_api=lambda cbid, on: calls.append(("rt", cbid, on)),
        activity_enable_driver_api=lambda cbid, on: calls.append(("dr", cbid, on)))
    assert cupti_timer._keep_only_launch_records(fake) is True
    assert sorted(calls) == [("dr", 2, 0), ("dr", 3, 0), ("rt", 2, 0), ("rt", 4, 0)]
    # a CUPTI without per-call control keeps every record (slower, same attribution)
    assert cupti_timer._keep_only_launch_records(types.SimpleNamespace()) is False
