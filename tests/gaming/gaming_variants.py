"""TEST ONLY: kernels that game the timer, one trick each, as hidden user variants.

Each computes correct attention (fp32 math, output in the problem's dtype, written into `out` when
the harness gives one) plus a fixed floor of work a timer cannot miss honestly: on the CPU a
`time.sleep(CPU_WORK_S)`, on a GPU a `torch.cuda._sleep(GPU_SPIN_CYCLES)` spin kernel. The trick
moves or skips that work so that a naive timer reads less than the call costs.
tests/test_timing_gaming.py (CPU) and tests/test_timing_gaming_gpu.py (GPU) run them through
`faprof.timing.harness.measure`, and check each is flagged with its reason or timed in full (the
reported median at least the honest twin's); scripts/gpu/gpu_timing_gaming.sh prints the table.
Load with `--user-variants tests/gaming/gaming_variants.py`.

=======================  =========================================================  ===========
variant                  trick                                                      devices
=======================  =========================================================  ===========
gaming_control           none: the work, on the caller's stream and thread          cpu, cuda
gaming_stream            (a) the work on a side stream the caller's never waits on  cuda
gaming_thread            (b) the work in a thread started by the call; returns      cpu, cuda
                         at once
gaming_deferred          (c) each call does the previous call's work (same tensors)  cpu, cuda
                         and leaves its own to the next
gaming_deferred_skip     (c) like gaming_deferred, but a pending call's work on the  cpu, cuda
                         same tensors is dropped (it would be overwritten)
gaming_cache             (d) the output cached by the inputs' data pointers         cpu, cuda
gaming_inplace           (e) the output written into q (and q returned)             cpu, cuda
gaming_content_cache     (f) the output cached by a hash of the inputs' values,     cpu, cuda
                         any number of input sets
gaming_skip_b2b          (g) a call that comes right after the previous one         cpu, cuda
                         returned (a timing loop) does nothing
gaming_half_b2b          (h) a call right after the previous one does half the      cpu, cuda
                         query rows and leaves the rest as they are
gaming_skip_busy         (i) a call made while the GPU is still busy (a timing      cuda
                         loop's lead) does nothing
gaming_host              (j) the attention computed on the host and uploaded; a     cuda
                         tiny kernel is all the GPU runs
gaming_skip_after        (k) every call after its first on a shape does nothing     cpu, cuda
=======================  =========================================================  ===========
"""

from __future__ import annotations

import threading
import time
from typing import Any

from faprof.variants import Variant, register

#: The CPU work floor per call: a sleep, so the honest time has a lower bound a loaded machine
#: cannot shrink (the tests assert on it, never on a wall-clock ceiling).
CPU_WORK_S = 0.01

#: The GPU work floor per call: a spin kernel of this many cycles (~0.5 ms at 2 GHz: well above the
#: ~50 µs host-clock margin an events-timed row is judged with, faprof.timing.integrity).
GPU_SPIN_CYCLES = 1_000_000

#: What each variant games: (a)-(e) of issue 34 item 5, for tables.
GAMES: dict[str, str] = {
    "gaming_control": "nothing (honest twin)",
    "gaming_stream": "(a) work on another stream",
    "gaming_thread": "(b) work on another host thread",
    "gaming_deferred": "(c) work deferred to the next call",
    "gaming_deferred_skip": "(c) deferred, repeats dropped",
    "gaming_cache": "(d) result cached by pointer",
    "gaming_inplace": "(e) output written into q",
    "gaming_content_cache": "(f) result cached by the inputs' values",
    "gaming_skip_b2b": "(g) back-to-back calls skip the work",
    "gaming_half_b2b": "(h) back-to-back calls do half the work",
    "gaming_skip_busy": "(i) calls made while the GPU is busy skip the work",
    "gaming_host": "(j) computed on the host, uploaded",
    "gaming_skip_after": "(k) every call after the first skips the work",
}

#: Variants that need a GPU (the others run on the CPU as well).
GPU_ONLY = ("gaming_stream", "gaming_skip_busy", "gaming_host")

#: Variants that run on the CPU as well as on a GPU.
CPU_VARIANTS = tuple(n for n in GAMES if n not in GPU_ONLY)

#: A call that starts less than this long after the previous call returned is "back to back" for (g), (h).
B2B_S = 0.002


def _attention(q, k, v, causal: bool, scale: float):
    import torch

    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril().logical_not(), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v.float()).to(q.dtype)


def work(q, k, v, causal: bool, scale: float, out):
    """The honest work: the floor, then attention written into `out`."""
    import torch

    if q.is_cuda:
        torch.cuda._sleep(GPU_SPIN_CYCLES)
    else:
        time.sleep(CPU_WORK_S)
    out.copy_(_attention(q, k, v, causal, scale))
    return out


def _out(q, out):
    import torch

    return torch.empty_like(q) if out is None else out


def control(q, k, v, causal, scale, out=None):
    return work(q, k, v, causal, scale, _out(q, out))


_SIDE: dict[Any, Any] = {}


def stream(q, k, v, causal, scale, out=None):
    """(a) The work on a side stream that waits for the caller's, which never waits for it."""
    import torch

    out = _out(q, out)
    side = _SIDE.setdefault(q.device, torch.cuda.Stream(q.device))
    side.wait_stream(torch.cuda.current_stream(q.device))
    with torch.cuda.stream(side):
        work(q, k, v, causal, scale, out)
    return out


def thread(q, k, v, causal, scale, out=None):
    """(b) The work in a thread the call starts and does not wait for (on a GPU, on the thread's
    current stream: the default stream, ordered after the caller's work on it)."""
    out = _out(q, out)
    threading.Thread(target=work, args=(q, k, v, causal, scale, out), daemon=True).start()
    return out


_PENDING: dict[str, tuple] = {}
_LAST: dict[str, tuple] = {}


def _same(a: tuple | None, b: tuple) -> bool:
    """The same q, k, v and out tensors (objects, as a caller that reuses its buffers passes them)."""
    return a is not None and all(x is y for x, y in zip(a[:3] + a[5:], b[:3] + b[5:], strict=True))


def deferred(q, k, v, causal, scale, out=None):
    """(c) Called again on the same tensors, a call does the previous call's work and leaves its own
    to the next; on other tensors it does its work at once."""
    out = _out(q, out)
    args = (q, k, v, causal, scale, out)
    repeat = _same(_LAST.get("deferred"), args)
    _LAST["deferred"] = args
    pending = _PENDING.pop("deferred", None)
    if pending is not None:
        work(*pending)
    if repeat:
        _PENDING["deferred"] = args
    else:
        work(*args)
    return out


def deferred_skip(q, k, v, causal, scale, out=None):
    """(c) Like `deferred`, but the pending work of a call on the same tensors is dropped, not done
    (this call's output would overwrite it): calls on unchanged tensors do nothing."""
    out = _out(q, out)
    args = (q, k, v, causal, scale, out)
    repeat = _same(_LAST.get("skip"), args)
    _LAST["skip"] = args
    pending = _PENDING.pop("skip", None)
    if repeat:
        _PENDING["skip"] = args
        return out
    if pending is not None:
        work(*pending)
    work(*args)
    return out


_CACHE: dict[tuple, Any] = {}


def cache(q, k, v, causal, scale, out=None):
    """(d) The output cached by the inputs' data pointers, shapes and flags (stale when the storage
    is reused with new values)."""
    out = _out(q, out)
    key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), tuple(q.shape), tuple(k.shape), str(q.dtype), causal, scale)
    hit = _CACHE.get(key)
    if hit is None:
        work(q, k, v, causal, scale, out)
        _CACHE[key] = out.clone()
    else:
        out.copy_(hit)
    return out


def inplace(q, k, v, causal, scale, out=None):
    """(e) The output written into q, which is returned (the harness's `out` is left alone)."""
    o = _attention(q, k, v, causal, scale)
    work(q, k, v, causal, scale, q)
    q.copy_(o)
    return q


_CONTENT: dict[Any, Any] = {}


def _content_key(q, k, v, causal, scale) -> tuple:
    """A key from the inputs' values (every element read where they are: on a GPU, a few reductions and
    one synchronize), shapes and flags."""
    import torch

    with torch.no_grad():
        stats = torch.stack([f(t.detach().float()) for t in (q, k, v)
                             for f in (torch.sum, lambda x: (x * x).sum(), lambda x: x.abs().amax())])
    return (tuple(stats.tolist()), tuple(q.shape), str(q.dtype), causal, scale)


def content_cache(q, k, v, causal, scale, out=None):
    """(f) The output cached by the inputs' values: a repeat of any input set seen before is served."""
    out = _out(q, out)
    key = _content_key(q, k, v, causal, scale)
    hit = _CONTENT.get(key)
    if hit is None:
        work(q, k, v, causal, scale, out)
        _CONTENT[key] = out.clone()
    else:
        out.copy_(hit)
    return out


_RETURNED: dict[str, float] = {}


def _back_to_back(name: str) -> bool:
    last = _RETURNED.get(name)
    return last is not None and time.perf_counter() - last < B2B_S


def skip_b2b(q, k, v, causal, scale, out=None):
    """(g) A call right after the previous one returned leaves `out` as it is (a timing loop's calls)."""
    out = _out(q, out)
    if not _back_to_back("skip"):
        work(q, k, v, causal, scale, out)
    _RETURNED["skip"] = time.perf_counter()
    return out


def half_b2b(q, k, v, causal, scale, out=None):
    """(h) A call right after the previous one computes the first half of the query rows only (half the
    floor of work too); the other half of `out` keeps what it held."""
    import torch

    out = _out(q, out)
    if not _back_to_back("half"):
        work(q, k, v, causal, scale, out)
    else:
        if q.is_cuda:
            torch.cuda._sleep(GPU_SPIN_CYCLES // 2)
        else:
            time.sleep(CPU_WORK_S / 2)
        half = q.shape[-2] // 2
        out[..., :half, :].copy_(_attention(q, k, v, causal, scale)[..., :half, :])
    _RETURNED["half"] = time.perf_counter()
    return out


def skip_busy(q, k, v, causal, scale, out=None):
    """(i) A call made while the GPU still has work queued (`query()` is False: a timing loop enqueues
    each call behind its lead) does nothing; an idle GPU gets the work."""
    import torch

    out = _out(q, out)
    if torch.cuda.current_stream(q.device).query():
        work(q, k, v, causal, scale, out)
    return out


def host(q, k, v, causal, scale, out=None):
    """(j) The attention computed on the host (the floor there too) and uploaded; the GPU runs one cast."""
    out = _out(q, out)
    time.sleep(CPU_WORK_S)
    o = _attention(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), causal, scale).float()
    out.copy_(o.to(q.device, non_blocking=False))  # an upload, then a cast kernel on the GPU
    return out


_CALLS: dict[tuple, int] = {}


def skip_after(q, k, v, causal, scale, out=None):
    """(k) The first call on a shape does the work; every later one (timed, drained, on any inputs) returns
    `out` as it is."""
    out = _out(q, out)
    key = (tuple(q.shape), str(q.dtype), causal)
    _CALLS[key] = _CALLS.get(key, 0) + 1
    if _CALLS[key] == 1:
        work(q, k, v, causal, scale, out)
    return out


FUNCTIONS = {"gaming_control": control, "gaming_stream": stream, "gaming_thread": thread,
             "gaming_deferred": deferred, "gaming_deferred_skip": deferred_skip, "gaming_cache": cache,
             "gaming_inplace": inplace, "gaming_content_cache": content_cache, "gaming_skip_b2b": skip_b2b,
             "gaming_half_b2b": half_b2b, "gaming_skip_busy": skip_busy, "gaming_host": host,
             "gaming_skip_after": skip_after}


def reset() -> None:
    """Forget pending work and cached outputs (a test starts from a fresh state)."""
    _PENDING.clear()
    _LAST.clear()
    _CACHE.clear()
    _CONTENT.clear()
    _RETURNED.clear()
    _CALLS.clear()


def _register() -> None:
    for name, fn in FUNCTIONS.items():
        register(Variant(name, "user", f"TEST ONLY: games the timer: {GAMES[name]}", fn,
                         dtypes=("fp16", "bf16", "fp32"), directions=("fwd",),
                         device="cuda" if name not in CPU_VARIANTS else "auto", compute="tensor", hidden=True,
                         source="tests/gaming/gaming_variants.py", tags=("test", "gaming")),
                 replace=True)


_register()
