"""The Hopper backward steps (fa3_bwd_a .. fa3_bwd_d), wired into autograd and the registry.

Each step is a variant whose forward is fa3_wgmma_e's forward op (which writes the natural-log LSE
the backward needs) and whose backward is torch.ops.faprof.fa3_bwd_<step> (kernels/fa3_bwd_a.cu ..
kernels/fa3_bwd_d.cu): FlashAttention-2's KV-block-parallel backward with all five GEMMs on
wgmma, dQ summed with fp32 atomic adds (red.global.add; step d: the TMA unit's bulk reduce-add), in
no fixed order, so the backward is not bit-reproducible: the variants declare only `fwd`
deterministic. As with fa2_mma (faprof.kernel_bwd), the variant's fn is the plain forward
op unless autograd needs a graph, so its forward rows time exactly fa3_wgmma_e's forward.

Workspaces the backward op takes from here: lse2 and delta, fp32 [B, H, Sq_pad] with Sq rounded up
to FA3_BWD_SEQ_PAD (the kernel copies whole query tiles of them), and dq_accum, fp32 [B, H, Sq, D]
(step d's holds each row's 16-byte chunks permuted; its convert kernel undoes that).

faprof.kernel_variants calls register_variants() with its fa3 support check and forward, so that
this module needs nothing from it (no import circle).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.model.variant import Variant, register
from faprof.variants import backward as kernel_bwd
from faprof.variants import build

#: Query rows of the lse2/delta workspaces are padded to a multiple of this (kFaprofFa3BwdSeqPad in
#: kernels/faprof_kernels.h; the largest query tile of the backward kernels).
FA3_BWD_SEQ_PAD = 128

#: The backward steps: name -> (what it adds, extra tags, source file).
FA3_BWD_STEPS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "fa3_bwd_a": (
        "Hopper backward step (a): all five GEMMs on wgmma (Sᵀ, dPᵀ SS; dV, dK RS with Pᵀ/dSᵀ from registers; "
        "dQ SS with dS transposed from shared memory), cp.async Q/dO double buffer, dQ by fp32 atomics; "
        "forward: fa3_wgmma_e (sm_90a)",
        (),
        "kernels/fa3_bwd_a.cu",
    ),
    "fa3_bwd_b": (
        "Hopper backward step (b): step (a) with TMA loads (K/V once, Q/dO by tensor map, lse2/delta by bulk "
        "copy) through a 2-stage mbarrier ring; forward: fa3_wgmma_e (sm_90a)",
        ("tma",),
        "kernels/fa3_bwd_b.cu",
    ),
    "fa3_bwd_c": (
        "Hopper backward step (c): step (b) warp-specialized: a TMA producer warpgroup (setmaxnreg 24) filling a "
        "3-stage ring released through empty mbarriers, two consumer warpgroups (setmaxnreg 240) meeting at named "
        "barriers, double-buffered dSᵀ; at D=128 Sᵀ/dPᵀ issued together, dV under the dSᵀ math, dSᵀ from fp32 Pᵀ; "
        "forward: fa3_wgmma_e (sm_90a)",
        ("tma", "warp_specialized"),
        "kernels/fa3_bwd_c.cu",
    ),
    "fa3_bwd_d": (
        "Hopper backward step (d): step (c) with dQ added by the TMA unit (the consumers' dQ into a shared-memory "
        "tile, one cp.reduce.async.bulk add per query tile from a writer warp) instead of red.global.add; forward: "
        "fa3_wgmma_e (sm_90a)",
        ("tma", "warp_specialized"),
        "kernels/fa3_bwd_d.cu",
    ),
}


def _ops():
    import torch


    build.load()
    return torch.ops.faprof


def padded_seq(Sq: int) -> int:
    """Sq rounded up to FA3_BWD_SEQ_PAD: the row count of the lse2/delta workspaces."""
    return -(-Sq // FA3_BWD_SEQ_PAD) * FA3_BWD_SEQ_PAD


def backward(step: str, q, k, v, out, dout, lse, causal: bool, scale: float):
    """(dq, dk, dv) of attention from the forward's out and natural-log lse, by
    torch.ops.faprof.<step> (a key of FA3_BWD_STEPS).

    Args:
        step: the backward step's op name.
        q, k, v, out: the forward's inputs and output, [B, H, S, D] fp16/bf16 on a CUDA device.
        dout: the upstream gradient (cast to q's dtype, made contiguous).
        lse: the forward's [B, H, Sq] fp32 log-sum-exp.
        causal, scale: the forward's mask and softmax scale.

    Returns:
        (dq, dk, dv), new tensors shaped like q, k, v.
    """
    import torch

    if step not in FA3_BWD_STEPS:
        raise ValueError(f"no fa3 backward step {step!r}; known: {', '.join(FA3_BWD_STEPS)}")
    ops = _ops()
    dout = dout.to(q.dtype).contiguous()
    B, H, Sq, D = q.shape
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    lse2 = torch.empty((B, H, padded_seq(Sq)), dtype=torch.float32, device=q.device)
    delta = torch.empty_like(lse2)
    dq_accum = torch.empty((B, H, Sq, D), dtype=torch.float32, device=q.device)
    getattr(ops, step)(q, k, v, out, dout, lse, dq, dk, dv, lse2, delta, dq_accum, bool(causal), float(scale))
    return dq, dk, dv


@functools.cache
def attention_function(step: str, fwd_op: str) -> Any:
    """The torch.autograd.Function of a backward step: forward by torch.ops.faprof.<fwd_op> (which
    writes lse), backward by torch.ops.faprof.<step>. Created on first use (torch is imported lazily)."""
    import torch

    class _Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal: bool, scale: float):  # type: ignore[override]
            ops = _ops()
            B, H, Sq, _ = q.shape
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
            lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
            getattr(ops, fwd_op)(q, k, v, out, lse, bool(causal), float(scale))
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal, ctx.scale = bool(causal), float(scale)
            return out

        @staticmethod
        def backward(ctx, dout):  # type: ignore[override]
            q, k, v, out, lse = ctx.saved_tensors
            return (*backward(step, q, k, v, out, dout, lse, ctx.causal, ctx.scale), None, None)

    _Attention.__name__ = f"{step}_attention"
    return _Attention


def differentiable(step: str, plain: Callable, fwd_op: str) -> Callable:
    """fn(q, k, v, causal, scale, out=None, return_lse=False): `plain` (the forward op's registry
    callable) unless autograd needs a graph, the step's autograd Function otherwise."""

    def fn(q, k, v, causal: bool, scale: float, out=None, return_lse: bool = False):
        import torch

        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            if return_lse:
                raise ValueError(f"{step}: return_lse is a forward-only option (no gradient flows through lse)")
            return attention_function(step, fwd_op).apply(q, k, v, bool(causal), float(scale))
        return plain(q, k, v, causal, scale, out, return_lse)

    fn.__name__ = f"{step}_attention"
    fn.__doc__ = plain.__doc__
    return fn


#: The backward indexes the padded lse2/delta rows with 32-bit ints: B·H·Sq_pad must stay below this.
INT32_MAX = 2**31 - 1


def _with_workspace_limit(check: Callable[[AttentionProblem], str | None]) -> Callable[[AttentionProblem], str | None]:
    """`check`, plus the backward's own limit: B·H·Sq_pad rows of lse2/delta indexed with int32."""

    def wrapped(problem: AttentionProblem) -> str | None:
        rows = problem.B * problem.H * padded_seq(problem.Sq)
        if problem.direction in kernel_bwd.GRAD_DIRECTIONS and rows > INT32_MAX:
            return (f"the fa3 backward indexes B·H·Sq (Sq rounded up to {FA3_BWD_SEQ_PAD}) rows with 32-bit ints: "
                    f"{rows} is over 2^31 - 1")
        return check(problem)

    return wrapped


def register_variants(check_factory: Callable[[str], Callable[[AttentionProblem], str | None]], plain_fwd: Callable,
                      fwd_op: str = "fa3_wgmma_e_fwd", fwd_variant: str = "fa3_wgmma_e") -> list[Variant]:
    """Register the steps of FA3_BWD_STEPS.

    Args:
        check_factory: variant name -> its support check (faprof.kernel_variants' fa3 check: head dims
            64/128, fp16/bf16, scale > 0, compute capability 9.0, else the reason).
        plain_fwd: the registry callable of the forward op `fwd_op` (returns out, or (out, lse)).
        fwd_op: the forward op whose LSE the backward uses.
        fwd_variant: the variant whose kernel `fwd_op` is: each step declares it as its forward's alias
            (direction 'fwd' times exactly that kernel; 'bwd' and 'fwd_bwd' run the step's own).

    Returns:
        The registered variants.
    """
    done = []
    for name, (what, extra, source) in FA3_BWD_STEPS.items():
        done.append(register(Variant(
            name,
            "cuda",
            what,
            differentiable(name, plain_fwd, fwd_op),
            check=_with_workspace_limit(check_factory(name)),
            source=source,
            tags=("tensor_core", "flash", "wgmma", "sm90a", "backward", *extra),
            dtypes=("fp16", "bf16"),
            directions=kernel_bwd.ALL_DIRECTIONS,
            device="cuda",
            compute="tensor",
            needs_extension=True,
            aliases={"fwd": fwd_variant},
        )))
    return done
