"""TEST ONLY: planted wrong variants on the CPU, one bug each, as hidden user variants.

Each computes attention the way a kernel would (fp32 math on the problem's dtype, output in that
dtype, written into `out` when the harness gives one, so an element it skips keeps the poison)
with one bug a user's kernel really has; tests/test_wrong_signatures.py runs them through the
runner and checks that faprof's bug signatures name the bug, the error map locates it, and the
correct control gets no signature. Load with

    faprof profile --scenario tests/wrong/wrong_cpu.toml --user-variants tests/wrong/cpu_wrong_variants.py

=========================  =====================================================  ==================
variant                    planted bug                                            expected family
=========================  =====================================================  ==================
wrong_control              none (the same code without a bug)                     none
wrong_mask_missing         causal mask never applied                              causal_mask
wrong_mask_shift           causal mask off by one: row i also sees key i + 1      causal_mask
wrong_mask_bottom_right    causal mask aligned bottom-right (j <= i + Sk - Sq)    causal_mask
wrong_scale_exp2           exp2 without the log2(e) factor: scale x ln 2          softmax_scale
wrong_norm_missing         final 1/l never applied                                normalisation
wrong_no_max_sub           softmax without max subtraction (exp overflows)        overflow
wrong_batch_offset         Q, K, V read at the head's offset only: batch ignored  stride
wrong_tail_unwritten       grid of floor(Sq / 64) row tiles: last partial tile    partial_tile
                           never written
wrong_head_skipped         head 1's output never written                          unwritten
wrong_race                 calls after the first lose half of one row block       race
wrong_propagated           forward adds 0.05 to head 1's O; the backward is        propagated
                           right for that O (delta = rowsum(dO·O))
=========================  =====================================================  ==================
"""

from __future__ import annotations

import math
from typing import Any

from faprof.variants import Variant, register

#: The planted variant -> the bug family its signature must name first (None: the control).
EXPECTED: dict[str, str | None] = {
    "wrong_control": None,
    "wrong_mask_missing": "causal_mask",
    "wrong_mask_shift": "causal_mask",
    "wrong_mask_bottom_right": "causal_mask",
    "wrong_scale_exp2": "softmax_scale",
    "wrong_norm_missing": "normalisation",
    "wrong_no_max_sub": "overflow",
    "wrong_batch_offset": "stride",
    "wrong_tail_unwritten": "partial_tile",
    "wrong_head_skipped": "unwritten",
    "wrong_race": "race",
    "wrong_propagated": "propagated",
}

#: Query tile of wrong_tail_unwritten (declared as its tile, as faprof's kernels declare theirs).
TAIL_TILE = 64


def _kernel(q, k, v, causal: bool, scale: float, *, mask: str = "top_left", scale_factor: float = 1.0,
            normalise: bool = True, subtract_max: bool = True):
    import torch

    qf, kf, vf = q.float(), k.float(), v.float()
    s = torch.matmul(qf, kf.transpose(-2, -1)) * (scale * scale_factor)
    sq, sk = s.shape[-2], s.shape[-1]
    if causal and mask != "none":
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        limit = {"top_left": i, "shift": i + 1, "bottom_right": i + (sk - sq)}[mask]
        s = s.masked_fill(j > limit, float("-inf"))
    m = s.amax(dim=-1, keepdim=True) if subtract_max else torch.zeros_like(s[..., :1])
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    o = torch.matmul(p, vf)
    if normalise:
        ln = p.sum(dim=-1, keepdim=True)
        o = o / ln
    return o


def _store(o, q, out, rows: int | None = None, heads: Any = None):
    """Write o into out (or a fresh tensor) like a kernel: only rows < `rows`, only `heads`."""
    import torch

    dst = torch.empty_like(q) if out is None else out
    o = o.to(q.dtype)
    if rows is None and heads is None:
        dst.copy_(o)
        return dst
    hs = slice(None) if heads is None else heads
    r = slice(None) if rows is None else slice(0, rows)
    dst[:, hs, r] = o[:, hs, r]
    return dst


def control(q, k, v, causal, scale, out=None):
    return _store(_kernel(q, k, v, causal, scale), q, out)


def mask_missing(q, k, v, causal, scale, out=None):
    return _store(_kernel(q, k, v, causal, scale, mask="none"), q, out)


def mask_shift(q, k, v, causal, scale, out=None):
    return _store(_kernel(q, k, v, causal, scale, mask="shift"), q, out)


def mask_bottom_right(q, k, v, causal, scale, out=None):
    return _store(_kernel(q, k, v, causal, scale, mask="bottom_right"), q, out)


def scale_exp2(q, k, v, causal, scale, out=None):
    # exp2(scale * s) where exp(scale * s) was meant: the softmax runs at scale * ln 2
    return _store(_kernel(q, k, v, causal, scale, scale_factor=math.log(2.0)), q, out)


def norm_missing(q, k, v, causal, scale, out=None):
    return _store(_kernel(q, k, v, causal, scale, normalise=False), q, out)


def no_max_sub(q, k, v, causal, scale, out=None):
    return _store(_kernel(q, k, v, causal, scale, subtract_max=False), q, out)


def batch_offset(q, k, v, causal, scale, out=None):
    # the offset of (b, h) computed as h * S * D: every batch reads batch 0's Q, K and V
    n = q.shape[0]
    o = _kernel(q[:1], k[:1], v[:1], causal, scale).expand(n, *q.shape[1:])
    return _store(o, q, out)


def tail_unwritten(q, k, v, causal, scale, out=None):
    whole = (q.shape[2] // TAIL_TILE) * TAIL_TILE  # grid = Sq / 64 (floor), not ceil
    return _store(_kernel(q, k, v, causal, scale), q, out, rows=whole)


def head_skipped(q, k, v, causal, scale, out=None):
    heads = [h for h in range(q.shape[1]) if h != 1]
    return _store(_kernel(q, k, v, causal, scale), q, out, heads=heads)


_RACE_CALLS: dict[tuple, int] = {}


def race(q, k, v, causal, scale, out=None):
    # calls on the same inputs after the first lose a partial sum of one row block, as a race that
    # shows under load would (the harness's repeated calls are on copies of the checked inputs)
    key = (tuple(q.shape), float(q.reshape(-1)[0]), float(k.reshape(-1)[-1]))
    _RACE_CALLS[key] = _RACE_CALLS.get(key, 0) + 1
    o = _kernel(q, k, v, causal, scale)
    if _RACE_CALLS[key] > 1:
        o[:, -1, 16:32] = o[:, -1, 16:32] * 0.5
    return _store(o, q, out)


def _propagated_function():
    import torch

    class Propagated(torch.autograd.Function):
        """Forward: O with 0.05 added to head 1 (the bug). Backward: FlashAttention's, right for that O."""

        @staticmethod
        def forward(ctx, q, k, v, causal: bool, scale: float):  # type: ignore[override]
            o = _kernel(q, k, v, causal, scale)
            o[:, 1:2] += 0.05
            o = o.to(q.dtype)
            ctx.save_for_backward(q, k, v, o)
            ctx.causal, ctx.scale = causal, scale
            return o

        @staticmethod
        def backward(ctx, dout):  # type: ignore[override]
            q, k, v, o = ctx.saved_tensors
            qf, kf, vf, of, do = q.float(), k.float(), v.float(), o.float(), dout.float()
            s = torch.matmul(qf, kf.transpose(-2, -1)) * ctx.scale
            if ctx.causal:
                sq, sk = s.shape[-2:]
                s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).tril().logical_not(), float("-inf"))
            p = torch.softmax(s, dim=-1)
            dv = torch.matmul(p.transpose(-2, -1), do)
            dp = torch.matmul(do, vf.transpose(-2, -1))
            delta = (do * of).sum(dim=-1, keepdim=True)
            ds = p * (dp - delta)
            dq = ctx.scale * torch.matmul(ds, kf)
            dk = ctx.scale * torch.matmul(ds.transpose(-2, -1), qf)
            return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), None, None

    return Propagated


def propagated(q, k, v, causal, scale, out=None):
    import torch

    if torch.is_grad_enabled() and q.requires_grad:
        return _propagated_function().apply(q, k, v, causal, scale)
    o = _kernel(q, k, v, causal, scale)
    o[:, 1:2] += 0.05
    return _store(o, q, out)


def _register() -> None:
    fns = {
        "wrong_control": control, "wrong_mask_missing": mask_missing, "wrong_mask_shift": mask_shift,
        "wrong_mask_bottom_right": mask_bottom_right, "wrong_scale_exp2": scale_exp2,
        "wrong_norm_missing": norm_missing, "wrong_no_max_sub": no_max_sub, "wrong_batch_offset": batch_offset,
        "wrong_tail_unwritten": tail_unwritten, "wrong_head_skipped": head_skipped, "wrong_race": race,
        "wrong_propagated": propagated,
    }
    for name, fn in fns.items():
        register(Variant(name, "user", f"TEST ONLY: planted bug ({EXPECTED[name] or 'control'})", fn,
                         dtypes=("fp16", "bf16", "fp32"), directions=("bwd",) if name == "wrong_propagated" else ("fwd",),
                         device="cpu", compute="tensor", hidden=True, source="tests/wrong/cpu_wrong_variants.py",
                         tags=("test", "wrong"), tile=(TAIL_TILE, TAIL_TILE) if name == "wrong_tail_unwritten" else None),
                 replace=True)


_register()
