"""The oracle a variant is checked against: attention from the definition at full precision, and PyTorch's
error in the problem's dtype (the FlashAttention rule's baseline).

- 2022's problems (no feature of AttentionProblem.features(): equal heads, top-left causal or none,
  dense) keep the path their recorded numbers came from: explicit attention over the whole
  [B, H, Sq, Sk] on the CPU in float64, or one (b, h) slice at a time on the GPU in fp32.
- Every other problem (GQA, bottom-right or windowed masks, soft-cap, packed varlen, paged KV) is
  computed from the definition one sequence, one KV head's group of query heads and one block of
  query rows at a time (`layout_attention`): query head h reads KV head h // (H // Hkv), the mask
  is faprof.model.mask's rule for that sequence's lengths, a soft-cap c maps s to c·tanh(s / c) (the
  scores come from faprof.model.scores), a query that sees no key gets zeros and an LSE of -inf.
  Each block's score matrix holds at most REF_BLOCK_ELEMENTS elements, so a 32k-key decode or a
  16k-token packed batch needs memory of the order of its inputs, not of the Sq x Sk scores. Paged
  caches are gathered through the block table.
- Outputs come in the problem's layout (faprof.correctness.layouts): o and dq like q, dk and dv like k
  (Hkv heads), the LSE [B, H, Sq] (dense, paged) or [H, total_q] (varlen, FlashAttention's).
- fp32 matmuls run at full precision (TF32 off, precision 'highest') whatever the user's code set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from faprof.correctness import layouts
from faprof.model.mask import allowed_rows as mask_rows
from faprof.model.problem import AttentionProblem, torch_dtype
from faprof.model.scores import scores
from faprof.variants.definition import AttnArgs, sequence_kv, sequence_q, sequence_views
from faprof.variants.torch_variants import masked_scores as _scores
from faprof.variants.torch_variants import standard_attention as _standard_attention

#: Problems whose float64 forward (+ backward) costs more than this are checked against an fp32
#: GPU reference instead of the CPU: 2e10 FLOP is a few seconds on a small host in float64.
CPU_REFERENCE_MAX_FLOPS = 2.0e10

#: Score elements of one block of `layout_attention` (group heads x query rows x keys): 2^24 is 64 MiB
#: in fp32 (128 MiB in float64); a block's softmax and backward hold a few such matrices at once.
REF_BLOCK_ELEMENTS = 2**24


@contextmanager
def full_fp32_precision() -> Iterator[None]:
    """fp32 matmuls at full precision inside (TF32 off), restored afterwards: a user module that
    set `torch.set_float32_matmul_precision('high')` must not degrade the reference."""
    import torch

    old_prec = torch.get_float32_matmul_precision()
    old_mm = torch.backends.cuda.matmul.allow_tf32
    old_cudnn = torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        torch.set_float32_matmul_precision(old_prec)
        torch.backends.cuda.matmul.allow_tf32 = old_mm
        torch.backends.cudnn.allow_tf32 = old_cudnn


@dataclass
class Reference:
    out: Any
    grads: tuple | None
    kind: str
    """'cpu_ref fp64' or 'gpu fp32'."""
    baseline_err: dict[str, float] = field(default_factory=dict)
    """max |base - ref| per output ('out', 'dq', 'dk', 'dv', 'lse') of PyTorch in the problem's dtype."""
    lse_fn: Callable[[], tuple[Any, float | None]] | None = None
    """Computes (reference LSE, PyTorch's LSE error in the dtype) on demand: only variants that return
    an LSE need it, and for 2022's problems it costs another pass over the scores."""
    _lse: Any = None

    @property
    def lse(self) -> Any:
        if self._lse is None and self.lse_fn is not None:
            self._lse, err = self.lse_fn()
            if err is not None:
                self.baseline_err["lse"] = err
        return self._lse


def needs_grads(problem: AttentionProblem) -> bool:
    return problem.direction in ("bwd", "fwd_bwd")


def _args(inputs: Any) -> AttnArgs | None:
    return getattr(inputs, "args", None)


# ------------------------------------------------------------------ 2022's problems (unchanged)
def _lse_pass(problem: AttentionProblem, inputs: Any, dev, dt):
    """Natural-log LSE of the scaled, masked scores per query row, [B, H, Sq], in fp32 or fp64."""
    import torch

    acc = torch.float64 if dt == torch.float64 else torch.float32
    on_cpu = str(dev) == "cpu"
    slices = [(slice(None), slice(None))] if on_cpu else [(b, h) for b in range(problem.B) for h in range(problem.H)]
    parts = []
    with torch.no_grad():
        for sl in slices:
            q, k = (t[sl].detach().to(dev, dt) for t in (inputs.q, inputs.k))
            parts.append(torch.logsumexp(_scores(q, k, problem.causal, problem.softmax_scale).to(acc), dim=-1))
    return parts[0] if on_cpu else torch.stack(parts).reshape(problem.B, problem.H, problem.Sq)


def _attention_pass(problem: AttentionProblem, inputs: Any, dev, dt) -> tuple[Any, tuple | None]:
    """(out, grads) of explicit attention on `dev` in `dt`, one (b, h) slice at a time off the CPU."""
    import torch

    scale = problem.softmax_scale
    B, H = problem.B, problem.H
    on_cpu = str(dev) == "cpu"
    slices = [(slice(None), slice(None))] if on_cpu else [(b, h) for b in range(B) for h in range(H)]
    outs, gq, gk, gv = [], [], [], []
    for sl in slices:
        q, k, v = (t[sl].detach().to(dev, dt) for t in (inputs.q, inputs.k, inputs.v))
        if needs_grads(problem):
            for t in (q, k, v):
                t.requires_grad_(True)
            with torch.enable_grad():
                o = _standard_attention(q, k, v, problem.causal, scale)
                dq, dk, dv = torch.autograd.grad(o, (q, k, v), inputs.dout[sl].to(dev, dt))
            gq.append(dq)
            gk.append(dk)
            gv.append(dv)
            o = o.detach()
        else:
            with torch.no_grad():
                o = _standard_attention(q, k, v, problem.causal, scale)
        outs.append(o)
    if on_cpu:
        return outs[0], ((gq[0], gk[0], gv[0]) if gq else None)

    def stack(parts):
        return torch.stack(parts).reshape(B, H, *parts[0].shape)

    grads = (stack(gq), stack(gk), stack(gv)) if gq else None
    return stack(outs), grads


# ------------------------------------------------------------------ every other problem
@dataclass
class LayoutResult:
    """Outputs of `layout_attention` in the problem's layout (grads None for a forward)."""

    out: Any
    lse: Any
    grads: tuple | None


def allowed_rows(problem: AttentionProblem, rows, sq: int, sk: int):
    """[len(rows), sk] bool: the keys query rows `rows` (of a sequence of sq queries, sk keys) see,
    by faprof.model.mask's rule."""
    return mask_rows(problem.mask, rows, sq, sk)


def _block(problem: AttentionProblem, q, k, v, ok):
    """(o, lse) of one block: q [G, n, D] against k, v [1, sk, D] (one KV head), `ok` [n, sk]."""
    import torch

    s = scores(q, k, problem.softmax_scale, softcap=problem.softcap, allowed=ok)
    acc = torch.float64 if s.dtype == torch.float64 else torch.float32
    lse = torch.logsumexp(s.to(acc), dim=-1)
    seen = ok.any(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(seen, s, torch.zeros_like(s)), dim=-1) * seen  # no key seen: zeros, not NaN
    return torch.matmul(p, v), lse


def _block_grads(problem: AttentionProblem, q, k, v, ok, dout):
    """(o, lse, dq, dk, dv) of one block for the upstream gradient `dout` (autograd through `_block`)."""
    import torch

    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        o, lse = _block(problem, q, k, v, ok)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), dout)
    return o.detach(), lse.detach(), dq, dk, dv


def _row_blocks(problem: AttentionProblem, sq: int, sk: int) -> list[tuple[int, int]]:
    rows = max(1, REF_BLOCK_ELEMENTS // max(1, problem.group * sk))
    return [(r, min(r + rows, sq)) for r in range(0, sq, rows)]


def _empty_outputs(problem: AttentionProblem, like, dev, dt, grads: bool):
    import torch

    sh = layouts.shapes(problem)
    out = torch.zeros(sh["q"], device=dev, dtype=dt)
    if problem.layout == "varlen":
        lse = torch.empty(problem.H, problem.total_q, device=dev, dtype=torch.float64 if dt == torch.float64 else torch.float32)
    else:
        lse = torch.empty(problem.B, problem.H, problem.Sq, device=dev,
                          dtype=torch.float64 if dt == torch.float64 else torch.float32)
    g = None
    if grads:
        g = (torch.zeros(sh["q"], device=dev, dtype=dt), torch.zeros(sh["k"], device=dev, dtype=dt),
             torch.zeros(sh["k"], device=dev, dtype=dt))
    return out, lse, g


def _lse_view(problem: AttentionProblem, lse, b: int):
    """Sequence b's [H, sq_b] part of an LSE in the layout's shape (a view)."""
    if problem.layout == "varlen":
        start = sum(problem.q_lens()[:b])
        return lse[:, start:start + problem.q_lens()[b]]
    return lse[b]


def layout_attention(problem: AttentionProblem, q, k, v, args: AttnArgs | None, dev, dt,
                     dout=None) -> LayoutResult:
    """Attention of `problem` from the definition on `dev` in `dt`, block by block (module docstring):
    o and the LSE, and with `dout` the gradients dq, dk, dv, all in the problem's layout."""
    import torch

    grads = dout is not None
    out, lse, g = _empty_outputs(problem, q, dev, dt, grads)
    G = problem.group
    for sv in sequence_views(problem, q, k, v, args):
        sq, sk = sv.q.shape[1], sv.k.shape[1]
        o_seq, l_seq = sequence_q(problem, out, sv.b), _lse_view(problem, lse, sv.b)
        do_seq = sequence_q(problem, dout, sv.b) if grads else None
        g_seq = ((sequence_q(problem, g[0], sv.b), sequence_kv(problem, g[1], sv.b),
                  sequence_kv(problem, g[2], sv.b)) if g is not None else None)
        for kvh in range(problem.kv_heads):
            heads = slice(kvh * G, (kvh + 1) * G)
            kh = sv.k[kvh:kvh + 1].detach().to(dev, dt)
            vh = sv.v[kvh:kvh + 1].detach().to(dev, dt)
            for r0, r1 in _row_blocks(problem, sq, sk):
                ok = allowed_rows(problem, torch.arange(r0, r1, device=dev), sq, sk)
                qb = sv.q[heads, r0:r1].detach().to(dev, dt)
                if do_seq is None or g_seq is None:
                    with torch.no_grad():
                        o, lb = _block(problem, qb, kh, vh, ok)
                else:
                    o, lb, dq, dk, dv = _block_grads(problem, qb, kh, vh, ok, do_seq[heads, r0:r1].to(dev, dt))
                    g_seq[0][heads, r0:r1] = dq
                    g_seq[1][kvh:kvh + 1] += dk
                    g_seq[2][kvh:kvh + 1] += dv
                o_seq[heads, r0:r1] = o.detach()
                l_seq[heads, r0:r1] = lb.detach()
    return LayoutResult(out, lse, g)


# ------------------------------------------------------------------ the oracle
def _max_abs(a, ref) -> float:
    import torch

    x = a.detach().to(ref.device, ref.dtype)
    d = x - ref
    d.masked_fill_(x == ref, 0.0)  # an empty row's LSE: -inf in both
    torch.nan_to_num_(d, nan=float("inf"))
    return float(d.abs_().max()) if d.numel() else 0.0


def _where(problem: AttentionProblem, inputs: Any, cuda_ok: bool):
    import torch

    factor = 3.5 if needs_grads(problem) else 1.0
    if problem.fwd_flops() * factor <= CPU_REFERENCE_MAX_FLOPS or not cuda_ok:
        return "cpu", torch.float64, "cpu_ref fp64"
    return inputs.q.device, torch.float32, "gpu fp32"


def compute_reference(problem: AttentionProblem, inputs: Any, cuda_ok: bool, baseline: bool = True) -> Reference:
    """The oracle for `problem` on `inputs`: float64 on the CPU when affordable, else fp32 on the GPU,
    plus the error PyTorch makes in the problem's dtype (rule 2's baseline)."""
    if problem.features():
        return _layout_reference(problem, inputs, cuda_ok, baseline)
    dev, dt, kind = _where(problem, inputs, cuda_ok)
    pdt = torch_dtype(problem.dtype)
    with_baseline = baseline and pdt != dt
    bdev = inputs.q.device if cuda_ok else "cpu"

    def lse_fn() -> tuple[Any, float | None]:
        with full_fp32_precision():
            lse = _lse_pass(problem, inputs, dev, dt)
            err = _max_abs(_lse_pass(problem, inputs, bdev, pdt), lse) if with_baseline else None
        return lse, err

    with full_fp32_precision():
        out, grads = _attention_pass(problem, inputs, dev, dt)
        ref = Reference(out=out, grads=grads, kind=kind, lse_fn=lse_fn)
        if with_baseline:
            bout, bgrads = _attention_pass(problem, inputs, bdev, pdt)
            ref.baseline_err["out"] = _max_abs(bout, out)
            if grads is not None and bgrads is not None:
                for name, b, r in zip(("dq", "dk", "dv"), bgrads, grads, strict=True):
                    ref.baseline_err[name] = _max_abs(b, r)
    return ref


def _layout_reference(problem: AttentionProblem, inputs: Any, cuda_ok: bool, baseline: bool) -> Reference:
    """compute_reference for problems with features: `layout_attention` at full precision, and again
    in the problem's dtype on the inputs' device for the baseline (the LSE comes with both passes)."""
    dev, dt, kind = _where(problem, inputs, cuda_ok)
    pdt = torch_dtype(problem.dtype)
    dout = inputs.dout if needs_grads(problem) else None
    args = _args(inputs)
    with full_fp32_precision():
        res = layout_attention(problem, inputs.q, inputs.k, inputs.v, args, dev, dt, dout)
        ref = Reference(out=res.out, grads=res.grads, kind=kind, _lse=res.lse)
        if baseline and pdt != dt:
            bdev = inputs.q.device if cuda_ok else "cpu"
            base = layout_attention(problem, inputs.q, inputs.k, inputs.v, args, bdev, pdt, dout)
            ref.baseline_err["out"] = _max_abs(base.out, res.out)
            ref.baseline_err["lse"] = _max_abs(base.lse, res.lse)
            if res.grads is not None and base.grads is not None:
                for name, b, r in zip(("dq", "dk", "dv"), base.grads, res.grads, strict=True):
                    ref.baseline_err[name] = _max_abs(b, r)
    return ref
