"""GPU kernel time per call from CUPTI activity records (NVIDIA's `cupti-python`).

CUDA events around a call time more than its kernels: each event is itself a GPU command, and an
event pair around a 4 µs kernel reads ~8 µs on an H100 (an empty pair reads ~1.3 µs, a pair
around an empty kernel ~3.8 µs). CUPTI's activity API reports every kernel's own start and end
timestamps, taken by the GPU, the same records Nsight Systems shows. The harness tags each timed
call with an external correlation id (`activity_push_external_correlation_id` before the call,
pop after); CUPTI links every kernel launched inside to that id through its correlation id, so
kernels are attributed to calls exactly, whatever else (the L2 flush, the GPU-side lead) runs
between them. Per call this gives two figures:

- `sum`: the call's GPU busy time: the union of its kernels' intervals, which is the sum of their
  durations unless kernels overlap (a kernel launched with programmatic dependent launch starts
  before its predecessor ends and waits; summing would count that overlap twice: see
  faprof.rows.intervals). nsys' per-call kernel time (faprof.nsight.nsys.tables) is the same figure;
- `span`: first kernel start to last kernel end (includes gaps between the call's kernels).

Why cupti-python and not torch's profiler (Kineto): Kineto records the same CUPTI activities,
but each profiling session starts and stops the whole tracing machinery, adds its own bookkeeping
per op, and returns records only when the session ends; the harness needs thousands of calls
with a stop rule evaluated between batches. The activity API is a thin binding over the same
buffers, flushed once per batch. (Both read the GPU's timestamps, so precision is the same.)

Where CUPTI cannot be used (package missing, another profiler such as nsys, ncu or torch's
profiler holds CUPTI, an error from CUPTI) `KernelTimer.open()` raises `CuptiUnavailable` with
the reason; the harness then falls back to CUDA events and records the timer and the reason per row.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from faprof.rows.intervals import busy_ns

#: Environment variables that tell this process runs under an NVIDIA profiler (which owns CUPTI).
PROFILER_ENV = ("NSYS_PROFILING_SESSION_ID", "NV_NSIGHT_INJECTION_TRANSPORT_TYPE", "NV_COMPUTE_PROFILER_PERFWORKS_DIR",
                "NV_TPS_LAUNCH_UID", "CUDA_INJECTION64_PATH")

INSTALL_HINT = "pip install cupti-python (the 'gpu' extra: pip install 'faprof[gpu]'), matching torch's CUDA major version"


#: Activity kinds the timer enables: kernels, the external ids of the calls, and the runtime and
#: driver API records (CUPTI emits external-correlation records alongside API records; the API
#: records' start times also attribute a kernel to the call whose host window launched it).
ENABLED_KINDS = ("CONCURRENT_KERNEL", "EXTERNAL_CORRELATION", "RUNTIME", "DRIVER")

#: Of the runtime and driver API records only the launches are kept (cuptiActivityEnableRuntimeApi /
#: cuptiActivityEnableDriverApi per callback id): a timed call makes dozens of other API calls
#: (events, device queries, the flush's memsets), and every record costs Python time in the buffer
#: callback. Measured on the H100 over l4_causal's 75 GPU rows: 33 s of the timing stage's 42 s
#: went to collecting records with every API recorded.
API_KEEP = ("launch",)


class CuptiUnavailable(RuntimeError):
    """CUPTI kernel timing cannot be used in this process; the message says why."""


#: External correlation id of the harness's own work between calls (L2 flush, GPU-side lead): tagged,
#: so that a kernel linked to no id at all was launched by something else (another thread of the
#: user's, work left behind by a call) and is counted as work outside the calls (faprof.timing.integrity).
HARNESS_ID = 1 << 62


#: One kernel launch as CUPTI recorded it: (name, grid "x,y,z", block "x,y,z", registers per thread,
#: static + dynamic shared memory bytes). Two variants of one Triton kernel that differ in constexprs
#: share the name, and usually differ in registers, shared memory or grid (faprof.analysis.aliases).
KernelSig = tuple[str, str, str, int, int]


def _sig(a: Any) -> KernelSig:
    """The `KernelSig` of a CUPTI kernel record (fields a record lacks read as empty / 0)."""
    def g(name: str) -> int:
        return int(getattr(a, name, 0) or 0)
    return (str(getattr(a, "name", "") or ""), f"{g('grid_x')},{g('grid_y')},{g('grid_z')}",
            f"{g('block_x')},{g('block_y')},{g('block_z')}", g("registers_per_thread"),
            g("static_shared_memory") + g("dynamic_shared_memory"))


def common_sig(sigs: list[tuple[KernelSig, ...]]) -> str | None:
    """The kernels most of `sigs` (calls' `CallTime.sig`) share, as JSON text (a row's `kernel_sig`:
    [[name, grid, block, registers, shared memory], ...]); None when none was recorded."""
    if not sigs:
        return None
    best = Counter(sigs).most_common(1)[0][0]  # ties: the first seen (set order would vary by hash seed)
    return json.dumps([list(k) for k in best]) if best else None


def _profiler_in_env() -> str | None:
    for k in PROFILER_ENV:
        if os.environ.get(k):
            return k
    return None


def _torch_profiler_active() -> bool:
    try:
        import torch

        return bool(torch.autograd.profiler._is_profiler_enabled)
    except Exception:  # pragma: no cover - private API moved
        return False


@dataclass
class CallTime:
    """GPU time of one call, from its kernels' activity records (nanoseconds)."""

    sum_ns: int
    span_ns: int
    kernels: int
    sig: tuple[KernelSig, ...] = ()
    """The call's kernels in start order, each as `KernelSig` (what the code and its launch were)."""


class _Collector:
    """Process-wide CUPTI activity state: callbacks can be registered once per process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kernels: list[tuple[int, int, int, KernelSig]] = []  # (correlation_id, start, end, signature)
        self.links: dict[int, int] = {}  # correlation_id -> external id
        self.api: dict[int, int] = {}  # correlation_id -> start of the runtime/driver call that launched it
        self.registered = False
        self.enabled = False
        self.api_filtered = False
        self.dropped = 0

    def on_complete(self, activities: list) -> None:
        from cupti import cupti

        kern = (int(cupti.ActivityKind.CONCURRENT_KERNEL), int(cupti.ActivityKind.KERNEL))
        ext = int(cupti.ActivityKind.EXTERNAL_CORRELATION)
        api = (int(cupti.ActivityKind.RUNTIME), int(cupti.ActivityKind.DRIVER))
        ks: list[tuple[int, int, int, KernelSig]] = []
        ls: dict[int, int] = {}
        calls: dict[int, int] = {}
        for a in activities:
            kind = int(a.kind)
            if kind in kern:
                ks.append((int(a.correlation_id), int(a.start), int(a.end), _sig(a)))
            elif kind == ext:
                ls[int(a.correlation_id)] = int(a.external_id)
            elif kind in api:
                calls.setdefault(int(a.correlation_id), int(a.start))
        with self.lock:
            self.kernels.extend(ks)
            self.links.update(ls)
            for c, t in calls.items():
                self.api.setdefault(c, t)

    def take(self) -> tuple[list[tuple[int, int, int, KernelSig]], dict[int, int], dict[int, int]]:
        with self.lock:
            ks, ls, api = self.kernels, self.links, self.api
            self.kernels, self.links, self.api = [], {}, {}
        return ks, ls, api


_COLLECTOR = _Collector()


def _api_names(enum_cls: Any) -> list[tuple[str, int]]:
    return [(m.name, int(m.value)) for m in enum_cls if m.name not in ("INVALID", "SIZE", "FORCE_INT")]


def _keep_only_launch_records(cupti: Any) -> bool:
    """Disable API records of every runtime/driver call that does not launch work (API_KEEP).
    False where this CUPTI cannot filter per call (then every API call is recorded: slower, same result)."""
    try:
        for enum_cls, enable in ((cupti.runtime_api_trace_cbid, cupti.activity_enable_runtime_api),
                                 (cupti.driver_api_trace_cbid, cupti.activity_enable_driver_api)):
            for name, cbid in _api_names(enum_cls):
                if not any(k in name.lower() for k in API_KEEP):
                    with contextlib.suppress(Exception):  # an id this driver does not know
                        enable(cbid, 0)
        return True
    except Exception:
        return False


def probe() -> tuple[bool, str]:
    """(usable, reason): whether cupti-python can be imported here and no profiler owns CUPTI.
    Does not initialise CUDA (safe for `faprof doctor`)."""
    prof = _profiler_in_env()
    if prof:
        return False, f"running under an NVIDIA profiler ({prof} is set), which owns CUPTI"
    try:
        from cupti import cupti  # noqa: F401
    except Exception as e:
        return False, f"cupti-python is not importable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {INSTALL_HINT}"
    return True, "cupti-python importable"


class KernelTimer:
    """Attributes kernels to calls by external correlation id. One open timer per process.

        timer = KernelTimer.open()        # raises CuptiUnavailable with the reason
        with timer.call(i): fn()          # tag call i
        times = timer.collect()           # {i: CallTime}, after the calls were synchronized
        timer.close()
    """

    def __init__(self) -> None:
        from cupti import cupti

        self._cupti = cupti
        self._kind = cupti.ExternalCorrelationKind.CUSTOM0
        self._next = 1
        self._windows: list[tuple[int, int, int]] = []  # (CUPTI timestamp before, after, call id)
        self.last_counts: dict[str, int] = {}
        self.last_unlinked: list[tuple[int, int]] = []
        """(start, end) of the kernels the last `collect` linked to no call and not to the harness:
        launched outside every tagged call (another thread, or after the call returned)."""

    @classmethod
    def open(cls) -> KernelTimer:
        ok, reason = probe()
        if not ok:
            raise CuptiUnavailable(reason)
        if _torch_profiler_active():
            raise CuptiUnavailable("torch's profiler (Kineto) is active and owns CUPTI")
        from cupti import cupti

        c = _COLLECTOR
        try:
            if not c.registered:
                def requested() -> tuple[int, int]:
                    return 8 * 1024 * 1024, 0

                cupti.activity_register_callbacks(requested, c.on_complete)
                c.registered = True
            if not c.enabled:
                for kind in ENABLED_KINDS:
                    cupti.activity_enable(getattr(cupti.ActivityKind, kind))
                c.enabled = True
                c.api_filtered = _keep_only_launch_records(cupti)
        except Exception as e:
            raise CuptiUnavailable(f"CUPTI refused the activity API ({type(e).__name__}: {e}); "
                                   "another profiler may be attached") from e
        return cls()

    @contextmanager
    def call(self, call_id: int) -> Iterator[None]:
        """Tag every kernel launched inside with `call_id` (a positive integer)."""
        t0 = self._cupti.get_timestamp()
        self._cupti.activity_push_external_correlation_id(self._kind, int(call_id))
        try:
            yield
        finally:
            self._cupti.activity_pop_external_correlation_id(self._kind)
            self._windows.append((t0, self._cupti.get_timestamp(), int(call_id)))

    @contextmanager
    def harness(self) -> Iterator[None]:
        """Tag the harness's own launches inside (flush, lead) as HARNESS_ID: they are nobody's call,
        and not work outside the calls either."""
        self._cupti.activity_push_external_correlation_id(self._kind, HARNESS_ID)
        try:
            yield
        finally:
            self._cupti.activity_pop_external_correlation_id(self._kind)

    def now(self) -> int:
        """CUPTI's timestamp now (ns; the clock of the kernel records)."""
        return int(self._cupti.get_timestamp())

    def new_ids(self, n: int) -> list[int]:
        ids = list(range(self._next, self._next + n))
        self._next += n
        return ids

    def collect(self, expect: list[int] | None = None, wait_s: float = 0.05) -> dict[int, CallTime]:
        """Flush CUPTI's buffers and return the calls seen since the last collect. Call it after
        a device synchronize, so every kernel of the tagged calls has finished.

        A kernel's record can reach the buffers a little after the kernel ends (seen on the H100:
        the last call before a flush sometimes had no record yet); with `expect`, flushing repeats
        for up to `wait_s` until every expected call has a kernel."""
        import time

        self._cupti.activity_flush_all(1)
        kernels, links, api = _COLLECTOR.take()
        if expect:
            deadline = time.perf_counter() + wait_s
            settled = False
            while time.perf_counter() < deadline:
                linked = {links[k[0]] for k in kernels if k[0] in links}
                done = all(i in linked for i in expect)
                if done and settled:
                    break
                settled = done  # once every call has a kernel, one more flush for a multi-kernel call's stragglers
                time.sleep(0.001)
                self._cupti.activity_flush_all(1)
                k2, l2, a2 = _COLLECTOR.take()
                kernels += k2
                links.update(l2)
                for c, t in a2.items():
                    api.setdefault(c, t)
        windows = sorted(self._windows)
        self._windows = []
        starts = [w[0] for w in windows]
        per: dict[int, list[tuple[int, int, KernelSig]]] = defaultdict(list)
        unlinked = by_window = 0
        self.last_unlinked = []
        for corr, start, end, sig in kernels:
            ext = links.get(corr)
            if ext is None and corr in api:
                # no external-correlation record: the call whose host window holds the launching API call
                t = api[corr]
                i = bisect.bisect_right(starts, t) - 1
                if i >= 0 and windows[i][0] <= t <= windows[i][1]:
                    ext = windows[i][2]
                    by_window += 1
            if ext is None:
                unlinked += 1  # launched outside any tagged call and not by the harness
                self.last_unlinked.append((start, end))
                continue
            if ext == HARNESS_ID:
                continue
            per[ext].append((start, end, sig))
        self.last_counts = {"kernels": len(kernels), "links": len(links), "api": len(api),
                            "by_window": by_window, "unlinked": unlinked}
        return {cid: CallTime(sum_ns=busy_ns([(s, e) for s, e, _ in ks]),
                              span_ns=max(e for _, e, _ in ks) - min(s for s, _, _ in ks), kernels=len(ks),
                              sig=tuple(g for _, _, g in sorted(ks))) for cid, ks in per.items()}

    def close(self) -> None:
        """Stop recording (the callbacks stay registered for a later timer in this process)."""
        c = _COLLECTOR
        try:
            self._cupti.activity_flush_all(1)
            if c.enabled:
                for kind in ENABLED_KINDS:
                    self._cupti.activity_disable(getattr(self._cupti.ActivityKind, kind))
                c.enabled = False
        except Exception:  # closing must never take a run down
            c.enabled = False
        _COLLECTOR.take()


def describe() -> dict[str, Any]:
    """For `faprof doctor` and the manifest: is CUPTI timing available, and which package version."""
    ok, reason = probe()
    out: dict[str, Any] = {"available": ok, "reason": reason}
    if ok:
        try:
            from importlib.metadata import version

            out["cupti_python"] = version("cupti-python")
        except Exception:
            out["cupti_python"] = None
    return out
