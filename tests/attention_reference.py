"""The float64 attention reference shared by the GPU kernel tests (one definition, not one per file)."""

from __future__ import annotations


def reference(q, k, v, causal: bool, scale: float):
    """float64 attention with the top-left causal mask (SDPA's is_causal).

    Returns (O, lse, row max, row sum), lse in natural log, per query row.
    """
    import torch

    q64, k64, v64 = q.double(), k.double(), v.double()
    s = torch.matmul(q64, k64.transpose(-2, -1)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        visible = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1)
    p = torch.exp(s - m[..., None])
    l = p.sum(dim=-1)  # noqa: E741
    o = torch.matmul(p / l[..., None], v64)
    return o, m + torch.log(l), m, l
