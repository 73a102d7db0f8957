"""Clock, temperature and throttle state of the GPU around each measured row (NVML, `nvidia-ml-py`).

A figure measured while the GPU throttled (power cap, thermal slowdown) is not the kernel's
figure. The harness reads, before and after each row and between timing batches: SM clock,
temperature and the clock-event ("throttle") reasons; rows are flagged `throttled` when a
slowdown reason was active at any read. The SM clock *during* the timed calls comes from the
harness' own calibration (GPU cycles of a spin kernel per microsecond), which NVML's sampled
clock cannot give.

NVML is optional: without `pynvml` (package `nvidia-ml-py`), or when NVML errors (no driver
access in a container, an unsupported query), `Monitor.open()` returns a monitor that records
the reason once and reads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: NVML clocks-event reason bits (nvml.h, nvmlClocksEventReason*) and the names faprof prints.
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

#: Reasons that mean the clock was pulled below what the card would otherwise run at.
SLOWDOWN_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


@dataclass
class Reading:
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    reasons: int = 0


@dataclass
class Monitor:
    """NVML handle for the GPU torch uses (matched by PCI bus id, then UUID), or a reason."""

    handle: Any = None
    error: str | None = None
    readings: list[Reading] = field(default_factory=list)

    @classmethod
    def open(cls, device_index: int = 0) -> Monitor:
        try:
            import pynvml  # from the nvidia-ml-py package
        except Exception:
            return cls(error="NVML not available: pip install nvidia-ml-py (the 'gpu' extra)")
        try:
            pynvml.nvmlInit()
        except Exception as e:
            return cls(error=f"NVML init failed: {e}")
        try:
            return cls(handle=_handle_for(pynvml, device_index))
        except Exception as e:
            return cls(error=f"NVML could not find torch's GPU: {e}")

    @property
    def ok(self) -> bool:
        return self.handle is not None

    def read(self) -> Reading | None:
        """One reading (also kept in `readings`); None when NVML is unavailable or errors."""
        if self.handle is None:
            return None
        import pynvml

        r = Reading()
        h = self.handle
        try:
            r.sm_clock_mhz = float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
            r.mem_clock_mhz = float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
            r.temperature_c = float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
        except Exception as e:
            self.error = f"NVML read failed: {e}"
            self.handle = None
            return None
        try:
            r.power_w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            r.power_w = None
        getter = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        try:
            r.reasons = int(getter(h)) if getter else 0
        except Exception:
            r.reasons = 0
        self.readings.append(r)
        return r

    def summary(self) -> dict[str, Any]:
        """Row fields from the readings since the last summary (then forgets them)."""
        rs, self.readings = self.readings, []
        if not rs:
            return {"nvml": self.error or "no readings"}
        mask = 0
        for r in rs:
            mask |= r.reasons
        first, last = rs[0], rs[-1]
        clocks = [r.sm_clock_mhz for r in rs if r.sm_clock_mhz]
        return {
            "nvml": "ok",
            "temp_c_before": first.temperature_c,
            "temp_c_after": last.temperature_c,
            "nvml_sm_clock_mhz_min": min(clocks) if clocks else None,
            "nvml_sm_clock_mhz_max": max(clocks) if clocks else None,
            "power_w_max": max((r.power_w for r in rs if r.power_w is not None), default=None),
            "throttle_reasons": ",".join(reason_names(mask & ~0x1)),  # idle between rows is not a finding
            "throttled": bool(mask & SLOWDOWN_MASK),
        }


def _handle_for(pynvml: Any, device_index: int) -> Any:
    import torch

    p = torch.cuda.get_device_properties(device_index)
    bus = getattr(p, "pci_bus_id", None)
    if bus is not None:
        dom = getattr(p, "pci_domain_id", 0)
        dev = getattr(p, "pci_device_id", 0)
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0".encode())
        except Exception:
            pass
    uuid = str(getattr(p, "uuid", "") or "")
    if uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(("GPU-" + uuid if not uuid.startswith("GPU-") else uuid).encode())
    if pynvml.nvmlDeviceGetCount() == 1:
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    raise RuntimeError("no PCI bus id or UUID from torch, and several GPUs")
