"""Correctness before timing: inputs, the reference, and the rules a variant's output must meet.

- Inputs are fresh `torch.randn` draws for every (problem, run), seeded from the OS and the seed
  recorded; never zeros, which hide unwritten outputs and run faster than real data. They come in
  the problem's layout (dense, packed varlen, paged: faprof.correctness.layouts) with its index tensors
  (`Inputs.args`), which variants declaring features get as `attn=` on their device.
- Outputs are poisoned with NaN before the checked call (kernels get a NaN-filled `out`; torch
  baselines get NaN-filled memory recycled through the caching allocator), so an element the
  variant forgot to write fails the check.
- The reference (faprof.correctness.reference) is float64 attention on the CPU when that takes seconds,
  otherwise fp32 attention on the GPU computed one (b, h) slice at a time (for GQA, masks, varlen
  and paged problems: one sequence, KV head group and block of query rows at a time), always at
  full fp32 precision (TF32 off, matmul precision 'highest'), whatever the user's code set.
- Two rules, both must hold, for every output (O; dQ, dK, dV for backward problems; LSE where a
  variant returns it):
  1. per element: |out - ref| <= atol + rtol * |ref| (the dtype's `Tolerance`);
  2. FlashAttention's rule: max |out - ref| <= factor * max |base - ref| + eps * max(1, max |ref|)
     (the slack scales with the output's magnitude, as rounding does), where `base` is
     the same attention computed by PyTorch in the problem's dtype (explicit QKᵀ, softmax, PV on
     the same device). A kernel may be as inexact as PyTorch in that dtype, a few times over, but a
     local bug (a masked key leaking at a tile edge, a skipped K/V tile) shows as an error many
     times PyTorch's. Where the reference itself is computed in the problem's dtype (fp32 problems
     checked on the GPU) the rule has no separate baseline and only rule 1 applies.
- One output of the timed calls is compared with the checked one: bitwise for directions a
  variant declares deterministic, else within the same rules (a race in the timed calls fails).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faprof.correctness import errormap, layouts, positions, signatures
from faprof.correctness.reference import Reference, needs_grads
from faprof.model.problem import AttentionProblem, torch_dtype
from faprof.model.settings import Tolerance
from faprof.variants.definition import AttnArgs

#: Number of output elements kept per row, as in report 000's "first 10 elements" table.
SAMPLE_ELEMENTS = 10


# ---------------------------------------------------------------------------- inputs
@dataclass
class Inputs:
    q: Any
    k: Any
    v: Any
    dout: Any
    seed: int
    args: AttnArgs | None = None
    """The problem's index tensors (cu_seqlens, cache lengths, block table), on the inputs' device;
    every tensor None for a dense problem. Variants that declare features get it as `attn=`."""


def make_inputs(problem: AttentionProblem, device: str, seed: int | None = None) -> Inputs:
    """Fresh random Q, K, V (and an upstream gradient dO) for `problem` in its layout, on `device`.

    Drawn in fp32 on the CPU from a generator seeded with `seed` (reproducible on any device), then
    cast: q, k, v, dO in that order, then the index tensors (faprof.correctness.layouts.make_layout_inputs).
    A dense problem with as many KV heads as query heads draws exactly the tensors it always did."""
    import torch

    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v, dout, args = layouts.make_layout_inputs(problem, device, g)
    return Inputs(q=q, k=k, v=v, dout=dout, seed=seed, args=args)


# ---------------------------------------------------------------------------- rules
def compare(result, ref, tol: Tolerance, baseline_err: float | None,
            position: Callable[[int], str] | None = None) -> dict[str, Any]:
    """Check one output against its reference under both rules.

    `position` turns a flat index into the text the reason gives for the worst element (the
    output's (sequence b, head h, row i, d) and tile: faprof.correctness.positions.describe).

    Returns max_abs, rel (norm-wise), ref_max, bad_elems (elements over atol + rtol|ref|),
    worst_elem (its flat index, or -1), baseline_err, bound (rule 2's bound or nan), ok.
    NaN or inf anywhere in the result, or a wrong shape, is never a pass.
    """
    import torch

    fin = ref[torch.isfinite(ref)] if ref.numel() else ref
    out: dict[str, Any] = {"max_abs": float("nan"), "rel": float("nan"), "ref_max": float(fin.abs().max()) if fin.numel() else 0.0,
                           "bad_elems": -1, "worst_elem": -1, "baseline_err": baseline_err, "bound": float("nan"), "ok": False}
    if tuple(result.shape) != tuple(ref.shape):  # never let broadcasting hide a wrong shape
        out["reason"] = f"shape {tuple(result.shape)} != {tuple(ref.shape)}"
        return out
    r = result.detach().to(ref.device, ref.dtype)
    same = r == ref  # an empty row's LSE: -inf in both is right
    nonfinite = ~torch.isfinite(r) & ~same
    if bool(nonfinite.any()):
        out["bad_elems"] = int(nonfinite.sum())
        unw = int(errormap.unwritten_mask(result).sum())
        first = int(nonfinite.reshape(-1).nonzero()[0])
        where = position(first) if position else f"flat index {first}"
        out["reason"] = (f"{out['bad_elems']} non-finite elements ({unw} unwritten: the NaN poison is still there; "
                         f"{out['bad_elems'] - unw} inf/NaN computed), first at {where}")
        return out
    diff = torch.where(same, torch.zeros_like(r), r - ref).abs()
    ref = torch.where(torch.isfinite(ref), ref, torch.zeros_like(ref))
    ref_norm = float(torch.linalg.vector_norm(ref))
    dnorm = float(torch.linalg.vector_norm(diff))
    out["rel"] = dnorm / ref_norm if ref_norm > 0 else dnorm
    out["max_abs"] = float(diff.max()) if diff.numel() else 0.0
    excess = diff - (tol.atol + tol.rtol * ref.abs())
    bad = excess > 0
    out["bad_elems"] = int(bad.sum())
    out["worst_elem"] = int(excess.reshape(-1).argmax()) if out["bad_elems"] else -1
    ok = out["bad_elems"] == 0
    if baseline_err is not None and math.isfinite(baseline_err):
        out["bound"] = tol.fa_bound(baseline_err, out["ref_max"])
        ok = ok and out["max_abs"] <= out["bound"]
    out["ok"] = ok
    if not ok:
        parts = []
        if out["bad_elems"]:
            where = position(out["worst_elem"]) if position else f"flat index {out['worst_elem']}"
            parts.append(f"{out['bad_elems']} elements over atol+rtol*|ref| (worst at {where})")
        if math.isfinite(out["bound"]) and out["max_abs"] > out["bound"]:
            slack = out["bound"] - tol.factor * (baseline_err or 0.0)
            parts.append(f"max error {out['max_abs']:.3g} > {tol.factor:g} x PyTorch's {baseline_err:.3g} + {slack:.3g}")
        out["reason"] = "; ".join(parts)
    return out


def _outputs(problem: AttentionProblem, result) -> tuple[list[str], list[Any]]:
    """Names and tensors of a call's outputs: fwd -> out (and lse if the variant returns (out, lse));
    bwd/fwd_bwd -> out, dq, dk, dv."""
    if problem.direction != "fwd":
        return ["out", "dq", "dk", "dv"], list(result)[:4]
    if isinstance(result, tuple | list):
        if len(result) >= 2 and result[1] is not None:
            return ["out", "lse"], [result[0], result[1]]
        return ["out"], [result[0]]
    return ["out"], [result]


def empty_rows_lse(r, ref):
    """A variant's LSE with +inf turned into -inf where the reference is -inf (a query that sees no
    key): FlashAttention writes +inf there (so its backward's exp(s - lse) is 0), faprof's definition
    log(0) = -inf; both say 'no key'. Anything else is left as it is."""
    import torch

    if r.shape != ref.shape:
        return r
    flip = torch.isposinf(r) & torch.isneginf(ref.to(r.device))
    return torch.where(flip, torch.full_like(r, float("-inf")), r) if bool(flip.any()) else r


def _position_text(problem: AttentionProblem, name: str, shape: tuple[int, ...],
                   tile: tuple[int, int] | None) -> Callable[[int], str]:
    def text(flat: int) -> str:
        return positions.describe(problem, name, shape, flat, tile)
    return text


def check_outputs(problem: AttentionProblem, result, ref: Reference, tol: Tolerance,
                  tile: Callable[[str], tuple[int, int] | None] | None = None) -> dict[str, Any]:
    """Both rules on every output of one call, each in the problem's layout; the summary fields of a
    row (positions in reasons as (sequence b, head h, row i, d) with the tile of `tile(output)`
    when known)."""
    names, results = _outputs(problem, result)
    refs = {"out": ref.out}
    if "lse" in names:
        refs["lse"] = ref.lse
    if ref.grads is not None:
        refs.update(dq=ref.grads[0], dk=ref.grads[1], dv=ref.grads[2])
    per: dict[str, dict[str, Any]] = {}
    worst_abs, worst_rel, ok, reasons = 0.0, 0.0, True, []
    for name, r in zip(names, results, strict=True):
        rf = refs.get(name)
        if rf is None:
            continue
        if name == "lse":
            r = empty_rows_lse(r.reshape(rf.shape) if r.numel() == rf.numel() else r, rf)
        c = compare(r, rf, tol.for_output(name), ref.baseline_err.get(name),
                    _position_text(problem, name, tuple(rf.shape), tile(name) if tile else None))
        per[name] = {k: v for k, v in c.items() if k != "worst_elem"}
        ok = ok and c["ok"]
        if not c["ok"]:
            reasons.append(f"{name}: {c.get('reason', 'differs')}")
        for key, cur in (("max_abs", worst_abs), ("rel", worst_rel)):
            val = c[key]
            new = val if (math.isnan(val) or math.isnan(cur)) else max(cur, val)
            if key == "max_abs":
                worst_abs = new
            else:
                worst_rel = new
    return {"correct": ok, "max_abs_err": worst_abs, "rel_err": worst_rel, "errors": per,
            "check_reason": "; ".join(reasons), "lse_checked": "lse" in per}


# -------------------------------------------------------------------------- running
def prepare(problem: AttentionProblem, inputs: Inputs, device: str, variant_name: str):
    """Inputs on the variant's device and dtype (cpu_ref runs in float64), with grads if needed."""
    import torch

    dt = torch.float64 if variant_name == "cpu_ref" else torch_dtype(problem.dtype)
    # clone(): each variant gets its own copies, so one that writes into its inputs cannot change
    # what later variants on this problem see.
    ts = [t.detach().to(device=device, dtype=dt).contiguous().clone() for t in (inputs.q, inputs.k, inputs.v)]
    dout = inputs.dout.detach().to(device=device, dtype=dt)
    if needs_grads(problem):
        for t in ts:
            t.requires_grad_(True)
    return ts, dout


def poison_bytes(problem: AttentionProblem) -> int:
    """Bytes of allocator memory to poison before a torch baseline's checked call: four outputs the
    size of the larger of Q's and K's tensors, in fp32 (the outputs and a baseline's temporaries)."""
    elems = max(problem.total_q * problem.H, problem.B * problem.H * problem.Sq,
                problem.total_k * problem.kv_heads, problem.B * problem.H * problem.Sk) * problem.D
    return 4 * elems * 4


def poison_allocator(nbytes: int, device: str) -> None:
    """Fill `nbytes` of freed CUDA caching-allocator memory with the poison NaN, so a torch op that
    allocates its output there and fails to write part of it shows NaN instead of stale valid values."""
    if device != "cuda" or nbytes <= 0:
        return
    junk = errormap.poison_words(nbytes, device)
    del junk


def make_call(variant, problem: AttentionProblem, ts, dout, out=None,
              attn: AttnArgs | None = None) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(checked_call, timed_call) for the variant and direction.

    fwd: the forward. bwd: gradients for `dout` with the forward done once, outside the timing
    (retain_graph so the backward can be replayed). fwd_bwd: forward then backward. A variant that
    declares `features` also gets `attn=` (the inputs' AttnArgs, moved to q's device once, here,
    outside the timing); no other variant does, so 2022's callables keep their signature.
    """
    import torch

    q, k, v = ts
    causal, scale = problem.causal, problem.softmax_scale
    kw: dict[str, Any] = {}
    if getattr(variant, "features", None):
        kw["attn"] = (attn if attn is not None else AttnArgs(problem)).to(q.device)
    if problem.direction == "fwd":
        def fwd():
            with torch.no_grad():
                return variant.fn(q, k, v, causal, scale, out, **kw)
        return fwd, fwd
    if problem.direction == "bwd":
        with torch.enable_grad():
            o = variant.fn(q, k, v, causal, scale, **kw)

        def bwd():
            with torch.enable_grad():
                return (o.detach(), *torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
        return bwd, bwd

    def fwd_bwd():
        with torch.enable_grad():
            o = variant.fn(q, k, v, causal, scale, **kw)
            return (o.detach(), *torch.autograd.grad(o, (q, k, v), dout))
    return fwd_bwd, fwd_bwd


def snapshot(problem: AttentionProblem, result) -> list[Any]:
    """Copies of a call's output tensors (the timed loop reuses `out` buffers)."""
    _, results = _outputs(problem, result)
    return [r.detach().clone() for r in results]


def check_correctness(variant, problem, inputs, ref: Reference, device: str, tol: Tolerance,
                      check_input: str = "randn") -> dict[str, Any]:
    """Run the variant once on poisoned outputs and check it against the reference.

    A wrong call also gets its error map records (`error_map`) and bug signatures (`signatures`,
    dicts, best first) from faprof.correctness.signatures, labelled with `check_input` (the inputs' name)."""
    import torch

    ts, dout = prepare(problem, inputs, device, variant.name)
    out = None
    # freed allocator memory poisoned first, for every variant: one that ignores `out` and allocates its own
    # (a Triton wrapper's torch.empty) starts from poison too, so the rows it never writes show as unwritten
    poison_allocator(poison_bytes(problem), device)
    if variant.kind in ("cuda", "user") and problem.direction == "fwd":
        out = errormap.poison_like(ts[0])  # a NaN no arithmetic makes: unwritten elements are told apart
    checked, _ = make_call(variant, problem, ts, dout, out, getattr(inputs, "args", None))
    result, _ = call_drained(checked)
    if device == "cuda":
        torch.cuda.synchronize()
    tile_for = getattr(variant, "tile_for", None)

    def tile(name: str) -> tuple[int, int] | None:
        return tile_for(problem, name) if tile_for else None

    res = check_outputs(problem, result, ref, tol, tile)
    res["error_map"], res["signatures"] = [], []
    if not res["correct"]:
        names, results = _outputs(problem, result)
        refs = {n: (ref.lse if n == "lse" else ref.out if n == "out" else
                    ref.grads[("dq", "dk", "dv").index(n)] if ref.grads is not None else None) for n in names}
        bounds = {n: e.get("bound", float("nan")) for n, e in res["errors"].items()}
        with torch.no_grad():
            res["error_map"], sigs = signatures.diagnose_wrong(problem, inputs, names, results, refs, tol.atol, tol.rtol,
                                                               bounds, tile, check_input)
        res["signatures"] = [sg.to_dict() for sg in sigs]
    outs = snapshot(problem, result)
    res["out_sample"] = outs[0].reshape(-1)[:SAMPLE_ELEMENTS].to("cpu", torch.float64).tolist()
    res["ref_sample"] = ref.out.detach().reshape(-1)[:SAMPLE_ELEMENTS].to("cpu", torch.float64).tolist()
    res["checked_outputs"] = outs
    res["inputs_written"] = inputs_written(ts, inputs)
    return res


#: A Python thread a call left running is joined for at most this long (a hung one stays a hang for
#: the worker's task timeout to catch, not a reason to wait forever here).
THREAD_JOIN_S = 60.0


class NewThreads:
    """The Python threads started inside the `with` block that are still alive when it ends."""

    def __enter__(self) -> NewThreads:
        self._before = set(threading.enumerate())
        self.left: list[threading.Thread] = []
        return self

    def __exit__(self, *exc: object) -> None:
        self.left = [t for t in threading.enumerate() if t not in self._before and t.is_alive()]

    def join(self) -> None:
        join_threads(self.left)


def join_threads(threads: list[threading.Thread]) -> None:
    """Wait for `threads`, all of them together at most THREAD_JOIN_S (a call whose threads hang stays a hang
    for the worker's task timeout, not N x the limit here)."""
    deadline = time.monotonic() + THREAD_JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def call_drained(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn(), threads it left running): those threads joined before returning, so output a thread of
    the call's writes is there to check (faprof.timing.integrity times such calls in full)."""
    with NewThreads() as th:
        r = fn()
    th.join()
    return r, len(th.left)


def inputs_written(ts: list[Any], inputs: Inputs) -> list[str]:
    """Names of the call's inputs (q, k, v) whose values differ from the originals they were copied from."""
    import torch

    out = []
    for name, t, orig in zip("qkv", ts, (inputs.q, inputs.k, inputs.v), strict=True):
        o = orig.detach().to(device=t.device, dtype=t.dtype)
        if not torch.equal(t.detach(), o):
            out.append(name)
    return out


def check_repeat(variant, problem: AttentionProblem, checked: list[Any], timed_result, ref: Reference | None,
                 tol: Tolerance) -> dict[str, Any]:
    """Compare a timed call's outputs with the checked call's: bitwise where the variant declares
    the direction deterministic, else against the reference under the same rules."""
    import torch

    timed = snapshot(problem, timed_result)
    same = len(timed) == len(checked) and all(
        a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b)) for a, b in zip(timed, checked, strict=False))
    out: dict[str, Any] = {"repeatable": same, "repeat_ok": True, "repeat_reason": ""}
    if same:
        return out
    deterministic = problem.direction in getattr(variant, "deterministic", ("fwd",))
    if ref is not None:
        res = check_outputs(problem, tuple(timed) if len(timed) > 1 else timed[0], ref, tol)
        if not res["correct"]:
            out.update(repeat_ok=False, repeat_reason=f"a timed call's output fails the check ({res['check_reason']})")
            return out
    if deterministic:
        out.update(repeat_ok=False, repeat_reason="a timed call's output differs bitwise from the checked call's "
                   "(the variant declares this direction deterministic: a race?)")
    return out
