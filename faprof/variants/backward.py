"""Backward passes of faprof's fa2 and fa2_mma kernels, wired into autograd.

Each kernel variant's fn stays the plain forward op when nothing needs a gradient (direction
'fwd': the harness calls it under torch.no_grad, so the forward is timed exactly as before, with
no autograd overhead). When an input requires grad and grad mode is on, fn runs a
torch.autograd.Function whose forward calls the same forward op (which writes lse) and saves
q, k, v, out and lse, and whose backward calls torch.ops.faprof.fa2_bwd / fa2_mma_bwd
(kernels/fa2_bwd.cu, kernels/fa2_mma_bwd.cu).

dQ: the backward kernels loop over query tiles inside a block that owns a K/V tile, so dQ gets
contributions from every key tile. The default path adds them with fp32 atomics (one kernel,
FlashAttention-2's choice; the order of the additions varies, so dQ is not bit-reproducible). The
`*_det` variants compute dQ in a second kernel over query tiles instead (S and dP are computed
twice), which makes every gradient bit-identical from call to call. faprof exposes the choice as
two variants rather than a Variant field so that both appear as rows of one table.

fa2_mma's atomic path double-buffers Q/dO and staggers the first query tile when non-causal
(kernels/fa2_mma_bwd.cu, QBUF = 2); `single_buffer=True` (the hidden test-only variant
`_fa2_mma_bwd_1buf`) keeps the single-buffered kernel it replaced, measured beside it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.variants import build

#: Head dimensions fa2_mma's backward is instantiated for (kFaprofMmaBwdHeadDims): at D = 256 the
#: dK and dV accumulators of 16 keys alone would take 256 registers per thread.
MMA_BWD_HEAD_DIMS = (64, 128)

ALL_DIRECTIONS = ("fwd", "bwd", "fwd_bwd")
GRAD_DIRECTIONS = ("bwd", "fwd_bwd")


def _ops():
    import torch


    build.load()
    return torch.ops.faprof


@functools.cache
def attention_function(kernel: str) -> Any:
    """The torch.autograd.Function of `kernel` ('fa2' or 'fa2_mma'), created on first use (torch is
    imported lazily everywhere in faprof)."""
    import torch

    if kernel not in ("fa2", "fa2_mma"):
        raise ValueError(f"no backward kernel for {kernel!r}")

    class _Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal: bool, scale: float, deterministic: bool,  # type: ignore[override]
                    single_buffer: bool = False):
            ops = _ops()
            B, H, Sq, _ = q.shape
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
            lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
            getattr(ops, f"{kernel}_fwd")(q, k, v, out, lse, bool(causal), float(scale))
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal, ctx.scale, ctx.deterministic = bool(causal), float(scale), bool(deterministic)
            ctx.single_buffer = bool(single_buffer)
            return out

        @staticmethod
        def backward(ctx, dout):  # type: ignore[override]
            q, k, v, out, lse = ctx.saved_tensors
            return (*backward(kernel, q, k, v, out, dout, lse, ctx.causal, ctx.scale, ctx.deterministic,
                              ctx.single_buffer),
                    None, None, None, None)

    _Attention.__name__ = f"{kernel}_attention"
    return _Attention


def backward(kernel: str, q, k, v, out, dout, lse, causal: bool, scale: float, deterministic: bool = False,
             single_buffer: bool = False):
    """(dq, dk, dv) of attention from the forward's out and lse, by torch.ops.faprof.<kernel>_bwd
    (single_buffer: fa2_mma's earlier atomic kernel, see the module docstring)."""
    import torch

    ops = _ops()
    dout = dout.to(q.dtype).contiguous()
    B, H, Sq, D = q.shape
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    if kernel == "fa2":
        ops.fa2_bwd(q, k, v, out, dout, lse, dq, dk, dv, delta, bool(causal), float(scale), bool(deterministic))
    else:
        shape = (0,) if deterministic else (B, H, Sq, D)
        dq_accum = torch.empty(shape, dtype=torch.float32, device=q.device)
        ops.fa2_mma_bwd(q, k, v, out, dout, lse, dq, dk, dv, delta, dq_accum, bool(causal), float(scale),
                        bool(deterministic), bool(single_buffer))
    return dq, dk, dv


def differentiable(kernel: str, plain: Callable, deterministic: bool = False,
                   single_buffer: bool = False) -> Callable:
    """fn(q, k, v, causal, scale, out=None, return_lse=False): `plain` (the forward op) unless autograd
    needs a graph, the autograd Function of `kernel` otherwise."""

    def fn(q, k, v, causal: bool, scale: float, out=None, return_lse: bool = False):
        import torch

        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            if return_lse:
                raise ValueError(f"{kernel}: return_lse is a forward-only option (no gradient flows through lse)")
            return attention_function(kernel).apply(q, k, v, bool(causal), float(scale), bool(deterministic),
                                                    bool(single_buffer))
        return plain(q, k, v, causal, scale, out, return_lse)

    fn.__name__ = f"{kernel}{'_det' if deterministic else ''}{'_1buf' if single_buffer else ''}_attention"
    fn.__doc__ = plain.__doc__
    return fn


def with_bwd_head_dims(variant: str, check: Callable[[AttentionProblem], str | None],
                       bwd_dims: tuple[int, ...]) -> Callable[[AttentionProblem], str | None]:
    """`check`, plus: backward problems only for head dims in `bwd_dims`."""

    def wrapped(problem: AttentionProblem) -> str | None:
        if problem.direction in GRAD_DIRECTIONS and problem.D not in bwd_dims:
            dims = ", ".join(map(str, bwd_dims))
            return f"D={problem.D} not supported by {variant}'s backward (supported: {dims})"
        return check(problem)

    return wrapped
