"""Inputs that expose bugs: a small fixed, named set checked besides randn, on reduced problems.

`torch.randn` inputs leave whole families of bugs invisible: with scores of order 1 a softmax
without max subtraction never overflows, with Sq = Sk a bottom-right causal mask is the top-left
one, and shapes that are multiples of every tile never reach a kernel's tail handling. Each probe
below is a derived problem with the scenario problem's D, dtype, mask, direction and scale, B and H
cut to at most PROBE_BH (two batches and two heads still expose batch and head offsets) and
sequence lengths capped at PROBE_MAX_S, so the set costs a fraction of the full-size check:

=================  =====================================================================================
name               what it is, and what it exposes
=================  =====================================================================================
large_scores       each row's winning key scores 128, 48 or 6 (a third of the rows each), far above its
                   other keys: exp overflows fp32 (and fp16) without max subtraction in the first rows,
                   fp16 only in the second, never in the third; inputs stay small (|x| <= ~16)
dominant_key       one key (key 0 under a causal mask, which every row sees; else the last key, so the
                   running max jumps in the last tile) scores ~30 above the rest in every row:
                   online-softmax rescaling bugs
constant           Q and K constant (every score equal: uniform attention), V random: each row is the
                   mean of the values it sees, so a key too many or too few shows in every row
sq_gt_sk           Sq > Sk (Sk = Sq/2 - 1): the top-left causal mask (SDPA's) and a bottom-right one
                   differ; kernels assuming Sq = Sk fail
tile_minus         Sq, Sk = 64k - 1 (not a multiple of any common tile): the last partial tile
tile_plus          Sq, Sk = 64k + 1: a last tile of one row or key
=================  =====================================================================================

and, where the problem has what they test:

=================  =====================================================================================
sq_lt_sk           (causal or windowed) Sq < Sk (Sq = Sk/2 - 1), the problem's own corner: with sq_gt_sk,
                   Sq > Sk and Sq < Sk under whichever alignment the problem has; the signatures test
                   the other corner
window_edges       (windowed) one sequence longer than the window; every query's keys exactly at the
                   window's edges (i + off - left, i + off + right) and the two just outside score
                   EDGE_SCORE above the rest (keys D apart share a direction: windows longer than D
                   see more high keys), values random: a window off by one on either side moves a
                   third of a row's weight (a window of L keys: ~D / (2 L))
kv_heads           (GQA) every query head of one batch, V of KV head g centred on g + 1: the KV head a
                   query head reads shows in its output's mean
slice_b1, slice_h1 (B > 1, H > 1; given the randn check's inputs) those inputs cut to the last batch
                   (B=1) and to the last query head with its KV head (H=1): a result right alone and
                   wrong in the whole depends on the batch or head index (faprof.correctness.signatures.placement)
seq_boundary       (packed) the first four sequences, each
                   sequence's first and last keys dominating every query, V of sequence b centred on
                   b + 1: a key read across a boundary moves the row towards another sequence's level
paged_partial      (paged) cache lengths of k·page + 1 (a last
                   block of one token); the pool rows past each cache length are keys every query would
                   pick, with V + 10: a kernel reading the last block whole is far off
=================  =====================================================================================

Values are drawn in fp32 from a generator seeded from the check's seed (recorded in the row) and
cast to the problem's dtype; every value is representable in fp16 and bf16 without overflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from faprof.correctness import layouts
from faprof.model.mask import allowed
from faprof.model.problem import AttentionProblem, torch_dtype
from faprof.model.scores import masked, scores
from faprof.variants.definition import sequence_q, sequence_views

#: Probes run on at most 2 batches and 2 heads: the fewest that still show an offset that ignores
#: the batch or head index (one slice gets another's answer), and 1/4..1/64 of the scenario shapes.
PROBE_BH = 2

#: Probe sequence lengths are capped here: long enough for several 64-row tiles, cheap on any host.
PROBE_MAX_S = 256

#: Tile step of the shape probes: 64 rows/keys is the most common tile (16, 32 divide it, 128 is 2x).
PROBE_TILE = 64

#: Winning-key scores of large_scores' rows: above ln(fp32 max) = 88.7, between ln(fp16 max) = 11.1
#: and 88.7, and below 11.1, so an overflow shows in exactly the rows over the dtype's limit.
LARGE_SCORES = (128.0, 48.0, 6.0)

#: Key magnitude of large_scores (entries +-2, exact in every dtype); queries carry the row's level.
LARGE_KEY = 2.0

#: The dominant key's score above the others in dominant_key (e^-30: the rest weigh ~1e-13).
DOMINANT_SCORE = 30.0

#: The one score of every (query, key) pair in `constant`.
CONSTANT_SCORE = 2.0

NAMES = ("large_scores", "dominant_key", "constant", "sq_gt_sk", "tile_minus", "tile_plus")

#: Probes run only where the problem has what they test (see the module docstring).
CONDITIONAL = ("sq_lt_sk", "window_edges", "kv_heads", "slice_b1", "slice_h1", "seq_boundary", "paged_partial")

#: Scores of the window_edges keys (the edges and their outside neighbours) above the others'
#: (~EDGE_SCORE·4/sqrt(D) of cross-talk): e^-12 leaves the rest ~1e-5 of the weight.
EDGE_SCORE = 12.0

#: window_edges' sequence is at most this long (a longer window's far edge is then not reached: one
#: sequence of 8k costs ~10 GFLOP, seconds on the CPU reference).
WINDOW_PROBE_MAX_S = 8192

#: Sequence length of kv_heads (short: the mapping shows in every row).
KV_PROBE_S = 64

#: seq_boundary keeps the first sequences of the pack: four show "sequence 3 reads keys of sequence 2".
SEQ_PROBE_B = 4



@dataclass(frozen=True)
class Probe:
    """One adversarial input: a name, the derived problem it runs on, and what it is for."""

    name: str
    problem: AttentionProblem
    what: str


@dataclass
class ProbeInputs:
    """Inputs of a probe (the attributes of faprof.correctness.Inputs)."""

    q: Any
    k: Any
    v: Any
    dout: Any
    seed: int
    args: Any = None
    """The problem's index tensors (faprof.variants.definition.AttnArgs), on the inputs' device."""


#: fp32's unit roundoff: kernels compute scores and the softmax's exponent arguments in fp32.
FP32_UNIT_ROUNDOFF = 2.0**-24

#: Multiples of fp32's roundoff one exponent argument may carry: the rounded product of the score and
#: scale·log2(e) (folded into one factor for exp2, as every FlashAttention kernel does), the max
#: subtraction and exp2's own error. PyTorch's reference computes exp(s - max) exactly after the
#: subtraction, so with scores of ~100 (large_scores) an exact kernel still differs from it by
#: ~|s|·u·|v|: the FlashAttention rule's "3x PyTorch's error" cannot hold there. Measured on the H100:
#: fp32 rowthread/fa2-style kernels 5.96e-6 against a 4.2e-6 bound at |s| = 128.
EXP_ARGUMENT_ROUNDINGS = 4.0


def rounding_slack(problem: AttentionProblem, inputs: ProbeInputs) -> dict[str, float]:
    """The error an exact kernel may have on these inputs beyond PyTorch's own, per output: added to a
    probe's atol and eps, so that large-magnitude inputs test overflow, max subtraction and masking,
    not the conditioning every exp2-based kernel shares. The randn check itself gets none.

    Forward: each probability P_ij = exp2(a_ij) may carry a relative error up to delta =
    EXP_ARGUMENT_ROUNDINGS x u32 x max|a| (a = score x scale x log2 e: the rounded product, the max
    subtraction, exp2's own error), so out <= delta max|v| and lse <= delta.

    Backward: FlashAttention's rule (3x PyTorch's error) assumes errors of the same size as
    PyTorch's, but where a probe makes dS = P ∘ (dP - D) cancel (one-hot rows: large_scores,
    dominant_key) the gradient is ~0 and any other order of the same sums misses it by the sums'
    rounding (measured on the H100: sdpa_auto's fp32 backward 2.1e-5 off a dk of 9e-8 where PyTorch is
    8.8e-8 off). The slack is the first-order worst-case (Higham) bound of that computation in fp32,
    gamma_n = n u32 for an n-term sum: dP_ij = dO_i·v_j and D_i = dO_i·O_i each off by gamma_D times
    the sum of their terms' magnitudes (O itself off by (delta + gamma_Sk) sum_j P_ij |v_j|), P off by
    delta P, so |error of dS_ij| <= W_ij = P_ij (delta |dP_ij - D_i| + err dP_ij + err D_i +
    delta sum_l P_il |dP_il|); then
      dq_i <= |scale| (W |K| + gamma_Sk |dS| |K|)_i,  dk_j <= |scale| (Wᵀ |Q| + gamma_Sq |dS|ᵀ |Q|)_j,
      dv_j <= (delta Pᵀ |dO| + gamma_Sq Pᵀ |dO|)_j,
    each output's slack the largest element. A bound, not an estimate: on randn-like probes it allows
    ~1e-5 relative in fp32 gradients, far below any masking or tiling bug's error."""
    out: dict[str, float] = {}
    for q, k, v, do, ok in _sequences(problem, inputs):
        for name, val in _slack_one(problem, q, k, v, do, ok).items():
            out[name] = max(out.get(name, 0.0), val)
    return out


def _sequences(problem: AttentionProblem, inputs: Any) -> Iterator[tuple[Any, Any, Any, Any, Any]]:
    """Each sequence's (q [H, sq, D], k and v [H, sk, D] with each query head's KV head, dO, the mask
    [sq, sk]) in fp32, whatever the layout. 2022's problems: the whole batch at once, as it always was."""
    if not problem.features():
        ok = allowed(problem.mask, problem.Sq, problem.Sk).to(inputs.q.device)
        yield tuple(t.detach().float() for t in (inputs.q, inputs.k, inputs.v, inputs.dout)) + (ok,)  # type: ignore[misc]
        return
    for sv in sequence_views(problem, inputs.q, inputs.k, inputs.v, getattr(inputs, "args", None)):
        g = problem.group
        k, v = (t.detach().float().repeat_interleave(g, dim=0) for t in (sv.k, sv.v))
        do = sequence_q(problem, inputs.dout, sv.b).detach().float()
        yield sv.q.detach().float(), k, v, do, allowed(problem.mask, sv.q.shape[1], k.shape[1]).to(k.device)


def _slack_one(problem: AttentionProblem, q: Any, k: Any, v: Any, do: Any, ok: Any) -> dict[str, float]:
    """rounding_slack of one sequence (or of a whole 2022 batch)."""
    import torch

    s = scores(q, k, problem.softmax_scale, softcap=problem.softcap)  # unmasked: delta is over every score
    delta = EXP_ARGUMENT_ROUNDINGS * FP32_UNIT_ROUNDOFF * float(s.abs().amax()) * math.log2(math.e)
    out = {"out": delta * float(v.abs().amax()), "lse": delta}
    if problem.direction == "fwd":
        return out
    if problem.causal or problem.window is not None:  # the problem's mask (top-left causal: row i sees keys 0..i)
        s = masked(s, ok)
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    o = torch.matmul(p, v)
    sq, sk = q.shape[-2], k.shape[-2]

    def gamma(n: int) -> float:
        return n * FP32_UNIT_ROUNDOFF

    dp = torch.matmul(do, v.transpose(-2, -1))
    d_row = (do * o).sum(dim=-1, keepdim=True)
    err_dp = gamma(problem.D) * torch.matmul(do.abs(), v.abs().transpose(-2, -1))
    err_o = (delta + gamma(sk)) * torch.matmul(p, v.abs())
    err_d = gamma(problem.D) * (do.abs() * o.abs()).sum(dim=-1, keepdim=True) + (do.abs() * err_o).sum(dim=-1, keepdim=True)
    w = p * (delta * (dp - d_row).abs() + err_dp + err_d + delta * (p * dp.abs()).sum(dim=-1, keepdim=True))
    ds = (p * (dp - d_row)).abs()
    scale = abs(problem.softmax_scale)
    ka, qa = k.abs(), q.abs()
    out.update(
        dq=scale * float((torch.matmul(w, ka) + gamma(sk) * torch.matmul(ds, ka)).amax()),
        dk=scale * float((torch.matmul(w.transpose(-2, -1), qa) + gamma(sq) * torch.matmul(ds.transpose(-2, -1), qa)).amax()),
        dv=float(((delta + gamma(sq)) * torch.matmul(p.transpose(-2, -1), do.abs())).amax()),
    )
    if problem.group > 1:  # a KV head's gradient sums its group's query heads: their bounds add up
        out["dk"] *= problem.group
        out["dv"] *= problem.group
    return out


def _near_tile(s: int, sign: int) -> int:
    k = max(1, round(min(s, PROBE_MAX_S) / PROBE_TILE))
    return PROBE_TILE * k + sign


def reduced(problem: AttentionProblem, B: int, sq: int, sk: int, first: bool = False) -> AttentionProblem:
    """`problem` cut to B sequences, at most PROBE_BH KV heads (and PROBE_BH query heads per KV head,
    so GQA stays GQA), lengths sq and sk: every sequence of a packed batch or a paged cache gets them,
    or with `first` keeps its own, capped at sq and sk (the problem's mix of lengths, made small)."""
    hkv = min(problem.kv_heads, PROBE_BH)
    H = hkv * min(problem.group, PROBE_BH)
    ch: dict[str, Any] = dict(B=B, H=H, Hkv=hkv, Sq=sq, Sk=sk)
    if problem.layout == "varlen":
        ql = tuple(min(x, sq) for x in problem.q_lens()[:B]) if first else (sq,) * B
        kl = tuple(min(x, sk) for x in problem.k_lens()[:B]) if first else (sk,) * B
        ch.update(seqlens_q=ql, seqlens_k=kl, Sq=max(ql), Sk=max(kl))
    elif problem.layout == "paged" and problem.seqlens_k is not None:
        kl = tuple(min(x, sk) for x in problem.k_lens()[:B]) if first else (sk,) * B
        ch.update(seqlens_k=kl, Sk=max(kl))
    return problem.with_(**ch)


def probes(problem: AttentionProblem, sliced: bool = False) -> list[Probe]:
    """The probes derived from `problem` (same D, dtype, mask, layout, direction, scale; at most
    PROBE_BH sequences and KV heads, PROBE_BH query heads per KV head), then those of CONDITIONAL the
    problem has a use for (the slicing probes when `sliced`: the randn check's inputs are there to cut)."""
    B = min(problem.B, PROBE_BH)
    sq, sk = min(problem.Sq, PROBE_MAX_S), min(problem.Sk, PROBE_MAX_S)
    small = reduced(problem, B, sq, sk, first=True)
    gt_sq = max(sq, 4)
    out = [
        Probe("large_scores", small, "winning scores 128 / 48 / 6: exp overflows without max subtraction"),
        Probe("dominant_key", small, "one key dominates every row by ~30"),
        Probe("constant", small, "Q and K constant: uniform attention"),
        Probe("sq_gt_sk", reduced(problem, B, gt_sq, max(1, gt_sq // 2 - 1)),
              "Sq > Sk: top-left and bottom-right causal masks differ"),
        Probe("tile_minus", reduced(problem, B, _near_tile(problem.Sq, -1), _near_tile(problem.Sk, -1)),
              "lengths 64k - 1: a last partial tile"),
        Probe("tile_plus", reduced(problem, B, _near_tile(problem.Sq, 1), _near_tile(problem.Sk, 1)),
              "lengths 64k + 1: a last tile of one row"),
    ]
    return out + _conditional(problem, B, sk, sliced)


def _conditional(problem: AttentionProblem, B: int, sk: int, sliced: bool) -> list[Probe]:
    """The probes of CONDITIONAL that this problem has a use for."""
    out = []
    if problem.causal or problem.window is not None:
        sk = max(sk, 8)
        out.append(Probe("sq_lt_sk", reduced(problem, B, max(1, sk // 2 - 1), sk),
                         f"Sq < Sk under the problem's {problem.mask_align.replace('_', '-')} corner"))
    if problem.window is not None:
        left, right = problem.window
        span = max(left, 0) + max(right, 0) + 2 + PROBE_TILE
        s = min(WINDOW_PROBE_MAX_S, max(PROBE_MAX_S, span))
        out.append(Probe("window_edges", reduced(problem, 1, s, s),
                         "keys at the window's edges and just outside dominate every row"))
    if problem.kv_heads < problem.H:
        one = reduced(problem, 1, min(problem.Sq, KV_PROBE_S), min(problem.Sk, KV_PROBE_S))
        out.append(Probe("kv_heads", one.with_(H=problem.H, Hkv=problem.Hkv),
                         "V of KV head g centred on g + 1: the KV head each query head reads shows"))
    out += _layout_probes(problem)
    if sliced and problem.layout == "dense":
        if problem.B > 1:
            out.append(Probe("slice_b1", problem.with_(B=1), f"the randn inputs of batch {problem.B - 1} alone (B=1)"))
        if problem.H > 1:
            out.append(Probe("slice_h1", problem.with_(H=1, Hkv=None),
                             f"the randn inputs of head {problem.H - 1} alone (H=1)"))
    return out


def _layout_probes(problem: AttentionProblem) -> list[Probe]:
    """Probes of packed and paged problems (their inputs come with index tensors: `ProbeInputs.args`)."""
    out = []
    if problem.layout == "varlen" and problem.B > 1:
        n = min(problem.B, SEQ_PROBE_B)
        lq = tuple(min(x, PROBE_MAX_S) for x in problem.q_lens()[:n])
        lk = tuple(min(x, PROBE_MAX_S) for x in problem.k_lens()[:n])
        out.append(Probe("seq_boundary", problem.with_(B=n, Sq=max(lq), Sk=max(lk), seqlens_q=lq, seqlens_k=lk),
                         "each sequence's first and last keys dominate, V of sequence b centred on b + 1: a key "
                         "read across a boundary shows"))
    if problem.layout == "paged":
        n, ps = min(problem.B, PROBE_BH), problem.page_size
        lk = tuple((min(x, PROBE_MAX_S) // ps) * ps + 1 for x in problem.k_lens()[:n])  # a last block of one token
        out.append(Probe("paged_partial", problem.with_(B=n, Sk=max(lk), seqlens_k=lk, block_table=None, pool_blocks=0),
                         "cache lengths of k·page + 1; the pool rows past them are keys every query would pick"))
    return out


def _layout_inputs(probe: Probe, device: str, seed: int) -> ProbeInputs:
    """seq_boundary's and paged_partial's inputs in the problem's layout, with their index tensors."""
    import torch

    p = probe.problem
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v, dout, args = layouts.make_layout_inputs(p.with_(dtype="fp32"), "cpu", g)
    u = (torch.randint(0, 2, (p.D,), generator=g).float() * 2 - 1) * LARGE_KEY
    beta = DOMINANT_SCORE / (abs(p.softmax_scale) * LARGE_KEY * LARGE_KEY * p.D) * math.copysign(1.0, p.softmax_scale)
    q = q + beta * u
    if probe.name == "seq_boundary":
        cu = args.cu_seqlens_k.tolist()
        for b in range(p.B):
            k[cu[b]] = u
            k[cu[b + 1] - 1] = u
            v[cu[b]:cu[b + 1]] += b + 1
    else:  # the pool rows past each cache length (the last block's unused tail): keys every query would pick
        for b, n in enumerate(p.k_lens()):
            blk = int(args.block_table[b, (n - 1) // p.page_size])
            k[blk, n % p.page_size or p.page_size:] = u
            v[blk, n % p.page_size or p.page_size:] += 10.0
    dt = torch_dtype(p.dtype)
    q, k, v, dout = (t.to(device=device, dtype=dt) for t in (q, k, v, dout))
    return ProbeInputs(q, k, v, dout, seed, args.to(device))


def slice_inputs(probe: Probe, whole: Any, problem: AttentionProblem) -> ProbeInputs:
    """A slicing probe's inputs: the whole check's inputs cut to the last batch (slice_b1) or to the last
    query head and the KV head it reads (slice_h1)."""
    q, k, v, dout = whole.q, whole.k, whole.v, whole.dout
    if probe.name == "slice_b1":
        b = problem.B - 1
        q, k, v, dout = q[b:b + 1], k[b:b + 1], v[b:b + 1], dout[b:b + 1]
    else:
        h = problem.H - 1
        g = h // problem.group
        q, k, v, dout = q[:, h:h + 1], k[:, g:g + 1], v[:, g:g + 1], dout[:, h:h + 1]
    return ProbeInputs(q.contiguous(), k.contiguous(), v.contiguous(), dout.contiguous(), whole.seed)


def make_inputs(probe: Probe, device: str, seed: int) -> ProbeInputs:
    """The probe's Q, K, V, dO on `device` in its dtype and layout, drawn from `seed`.

    Each probe's values are made on the per-sequence grid (q [B, H, Sq, D], k and v [B, Hkv, Sk, D]:
    query head h's pattern is built on its KV head h // (H // Hkv)), then laid out as the problem
    says (`to_layout`: a packed batch keeps each sequence's first tokens, a paged cache scatters
    them into a shuffled pool)."""
    import torch

    p = probe.problem
    if probe.name in ("seq_boundary", "paged_partial"):
        return _layout_inputs(probe, device, seed)
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, H, Hkv, Sq, Sk, D = p.B, p.H, p.kv_heads, p.Sq, p.Sk, p.D
    G = p.group
    scale = p.softmax_scale

    def randn(*shape: int) -> Any:
        return torch.randn(shape, generator=g, dtype=torch.float32)

    def signs(*shape: int) -> Any:
        return torch.randint(0, 2, shape, generator=g).float() * 2 - 1

    q, k, v = randn(B, H, Sq, D), randn(B, Hkv, Sk, D), randn(B, Hkv, Sk, D)
    if probe.name == "large_scores":
        # query row i points along its winning key (key i where it exists, else a random one) with the
        # length that makes that score the row's level; other keys score ~level/sqrt(D) at most
        x = signs(B, Hkv, Sk, D)
        k = LARGE_KEY * x
        win = torch.arange(Sq) % Sk if not p.causal else torch.clamp(torch.arange(Sq), max=Sk - 1)
        if Sq > Sk:
            win[Sk:] = torch.randint(0, Sk, (Sq - Sk,), generator=g)
        level = torch.tensor(LARGE_SCORES)[torch.randint(0, len(LARGE_SCORES), (Sq,), generator=g)]
        alpha = level / (abs(scale) * LARGE_KEY * D)
        xq = x.repeat_interleave(G, dim=1) if G > 1 else x
        q = xq[:, :, win, :] * alpha[None, None, :, None] * math.copysign(1.0, scale)
    elif probe.name == "dominant_key":
        j = 0 if p.causal else Sk - 1
        u = signs(D)
        beta = DOMINANT_SCORE / (abs(scale) * LARGE_KEY * D)
        k[:, :, j, :] = LARGE_KEY * u
        q = q + beta * u * math.copysign(1.0, scale)
    elif probe.name == "constant":
        c = math.sqrt(CONSTANT_SCORE / (abs(scale) * D))
        q = torch.full((B, H, Sq, D), c * math.copysign(1.0, scale))
        k = torch.full((B, Hkv, Sk, D), c)
    elif probe.name == "window_edges":
        q, k = _window_edge_qk(p, _key_directions(Sk, D, signs).expand(B, Hkv, Sk, D))
    elif probe.name == "kv_heads":
        v = v * 0.1 + torch.arange(1, Hkv + 1, dtype=torch.float32)[None, :, None, None]
    dout = randn(B, H, Sq, D)
    q, k, v, dout, args = to_layout(p, q, k, v, dout, g)
    dt = torch_dtype(p.dtype)
    q, k, v, dout = (t.to(device=device, dtype=dt) for t in (q, k, v, dout))
    return ProbeInputs(q, k, v, dout, seed, args.to(device))


def to_layout(problem: AttentionProblem, q: Any, k: Any, v: Any, dout: Any, generator: Any) -> tuple[Any, ...]:
    """(q, k, v, dout, AttnArgs) in the problem's layout from per-sequence grids (q and dout [B, H, Sq, D],
    k and v [B, Hkv, Sk, D], on the CPU): dense as given; packed: each sequence's first seqlens tokens
    concatenated; paged: each sequence's keys written block by block into a pool whose blocks the
    block table shuffles (spare blocks keep random values). Draws the block order from `generator`."""
    import torch

    args = layouts.index_tensors(problem, generator, "cpu")
    if problem.layout == "varlen":
        def pack(t: Any, lens: tuple[int, ...]) -> Any:
            return torch.cat([t[b, :, :n].transpose(0, 1) for b, n in enumerate(lens)], dim=0).contiguous()
        ql, kl = problem.q_lens(), problem.k_lens()
        return pack(q, ql), pack(k, kl), pack(v, kl), pack(dout, ql), args
    if problem.layout == "paged":
        shape = layouts.shapes(problem)["k"]
        pools = []
        for t in (k, v):
            pool = torch.randn(shape, generator=generator, dtype=torch.float32)
            P = problem.page_size
            for b, n in enumerate(problem.blocks_per_seq()):
                for j in range(n):
                    keys = t[b, :, j * P:min((j + 1) * P, problem.k_lens()[b])].transpose(0, 1)
                    pool[int(args.block_table[b, j]), :keys.shape[0]] = keys
            pools.append(pool)
        return q, pools[0], pools[1], dout, args
    return q, k, v, dout, args


def _key_directions(Sk: int, D: int, signs: Callable[..., Any]) -> Any:
    """[Sk, D] sign vectors: key j gets Hadamard row j mod D (D a power of two: keys D apart share a
    direction, nearer ones are orthogonal, so a query aimed at four nearby keys scores exactly those and
    their residues), else random signs (orthogonal only on average)."""
    import torch

    if D & (D - 1):
        return signs(Sk, D)
    h = torch.ones(1, 1)
    while h.shape[0] < D:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h[torch.arange(Sk) % D]


def _window_edge_qk(p: AttentionProblem, u: Any) -> tuple[Any, Any]:
    """window_edges' Q and K: keys are sign vectors (x LARGE_KEY); query i is the sum of the vectors of the
    keys at its window's edges and just outside them, scaled so each of those scores EDGE_SCORE."""
    import torch

    left, right = p.window if p.window is not None else (-1, -1)
    off = p.Sk - p.Sq if p.mask_align == "bottom_right" else 0
    i = torch.arange(p.Sq)
    targets = []
    if left >= 0:
        targets += [i + off - left, i + off - left - 1]
    if right >= 0:
        targets += [i + off + right, i + off + right + 1]
    beta = EDGE_SCORE / (abs(p.softmax_scale) * LARGE_KEY * p.D) * math.copysign(1.0, p.softmax_scale)
    q = torch.zeros(u.shape[0], u.shape[1], p.Sq, p.D)
    for t in targets:
        ok = (t >= 0) & (t < p.Sk)
        q[:, :, ok] += beta * u[:, :, t[ok]]
    return q.repeat_interleave(p.group, dim=1), LARGE_KEY * u


@dataclass
class ProbeSet:
    """The probes of one problem with their inputs and references, made once and shared by every
    variant checked on that problem (the worker keeps one per shape, like the randn reference)."""

    problem: AttentionProblem
    device: str
    reference: Callable[[AttentionProblem, Any], Any]
    """(probe problem, probe inputs) -> the reference (faprof.correctness.reference.compute_reference)."""
    seed: int
    inputs: Any = None
    """The randn check's inputs (q, k, v, dout, seed attributes): given, the slicing probes cut them."""
    _made: dict[str, tuple[ProbeInputs, Any]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[tuple[Probe, ProbeInputs, Any]]:
        for i, pr in enumerate(probes(self.problem, sliced=self.inputs is not None)):
            if pr.name not in self._made:
                inputs = (slice_inputs(pr, self.inputs, self.problem) if pr.name.startswith("slice_") else
                          make_inputs(pr, self.device, (self.seed + 7919 * (i + 1)) % 2**32))
                self._made[pr.name] = (inputs, self.reference(pr.problem, inputs))
            inputs, ref = self._made[pr.name]
            yield pr, inputs, ref


def is_cuda_fault(e: BaseException) -> bool:
    """Whether an exception is a CUDA error (an illegal address, a launch failure: the kernel ran and
    broke), not a refusal raised before anything ran."""
    return type(e).__name__ == "AcceleratorError" or "CUDA error" in str(e)


def run(probe_set: ProbeSet, supports: Callable[[AttentionProblem], tuple[bool, str]],
        check: Callable[[Probe, ProbeInputs, Any], dict[str, Any]]) -> dict[str, Any]:
    """Check one variant on every probe it supports.

    Args:
        probe_set: the problem's probes. supports: the variant's support test (problem -> (ok, why)).
        check: (probe, inputs, reference) -> faprof.correctness.check_correctness's result on them.

    Returns:
        {'probes': one record per probe (name, shape_id, what, status 'ok' / 'wrong' / 'skipped' (its
        support test says no) / 'refused' (it raised a Python error: a shape it was not asked for) /
        'error' (a CUDA fault), reason), 'failed': names of the wrong and faulting ones, 'reasons':
        their check reasons, 'error_map': their map records, 'signatures': their signature dicts}. A
        refused probe is recorded, not held against the variant: the scenario's problem is what the
        row is; a CUDA fault is a bug, and the probes after it are not run.
    """
    out: dict[str, Any] = {"probes": [], "failed": [], "reasons": [], "error_map": [], "signatures": []}
    fault = ""
    for pr, inputs, ref in probe_set:
        rec = {"name": pr.name, "shape_id": pr.problem.shape_id, "what": pr.what, "status": "ok", "reason": ""}
        ok, why = supports(pr.problem)
        if not ok:
            rec.update(status="skipped", reason=why)
            out["probes"].append(rec)
            continue
        if fault:
            rec.update(status="skipped", reason=f"not run: a CUDA fault on {fault} left the context unusable")
            out["probes"].append(rec)
            continue
        try:
            res = check(pr, inputs, ref)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if not is_cuda_fault(e):  # a clean refusal of a shape it was never asked for: not a bug
                rec.update(status="refused", reason=f"{type(e).__name__}: {first}")
                out["probes"].append(rec)
                continue
            # a fault on an input the variant accepted is a bug (an out-of-bounds access at a partial
            # tile, say), and the context is gone: the remaining probes are not run
            fault = pr.name
            rec.update(status="error", reason=f"{type(e).__name__}: {first}")
            out["probes"].append(rec)
            out["failed"].append(pr.name)
            out["reasons"].append(f"on {pr.name} ({pr.problem.label}): a CUDA fault ({first})")
            continue
        if not res["correct"]:
            rec.update(status="wrong", reason=res.get("check_reason", ""))
            out["failed"].append(pr.name)
            out["reasons"].append(f"on {pr.name} ({pr.problem.label}): {res.get('check_reason', '')}")
            out["error_map"] += res.get("error_map", [])
            out["signatures"] += res.get("signatures", [])
        out["probes"].append(rec)
    return out
