"""TEST ONLY: planted CPU variants whose bug depends on where the work sits (issue 34 item 4).

`wrong_batch_rows` is the forward of Triton's fused-attention tutorial, TMA path, written the way that
kernel runs: one program per (query block, off_hz = z·H + h) over Q, K, V and O seen as [Z·H·N, D]
(the tutorial's tensor descriptors), each program reading its Q rows, its K/V rows (zeros past the end,
as TMA returns) and writing its O rows at

    offset_y = off_z + off_h * N_CTX        # PLANTED BUG (the tutorial's): off_hz * N_CTX is right

so at B = 1 it is right and at B > 1 batch z's programs read and write the rows of batch 0 shifted by
z (two programs write each of those rows; batch z's own rows are never written). The first call on
given inputs runs the programs in launch order; later calls on the same inputs run them in reverse,
as a GPU may schedule them: which write lands last changes (a race). `wrong_where_control` is the
same code with the offset right. Load with

    faprof profile --scenario tests/wrong/wrong_where.toml --user-variants tests/wrong/cpu_wrong_where.py
"""

from __future__ import annotations

from faprof.variants import Variant, register

#: The planted variant -> the bug family its signature must name first (None: the control).
EXPECTED: dict[str, str | None] = {"wrong_where_control": None, "wrong_batch_rows": "placement"}

#: Query rows per program (the tutorial's BLOCK_M on the H100).
BLOCK_M = 128

_CALLS: dict[tuple, int] = {}


def _tma_forward(q, k, v, causal: bool, scale: float, out, bug: bool):
    import torch

    Z, H, N, D = q.shape
    rows = Z * H * N
    qf, kf, vf = (t.reshape(rows, D).float() for t in (q, k, v))
    dst = torch.empty_like(q) if out is None else out
    flat = dst.view(rows, D)
    key = (bug, tuple(q.shape), float(q.reshape(-1)[0]), float(k.reshape(-1)[-1]))
    _CALLS[key] = _CALLS.get(key, 0) + 1
    programs = [(m, hz) for hz in range(Z * H) for m in range(0, N, BLOCK_M)]
    if _CALLS[key] > 1:
        programs.reverse()

    def take(t, idx):  # TMA: rows past the tensor read as zeros
        inside = idx < rows
        return torch.where(inside[:, None], t[idx.clamp(max=rows - 1)], torch.zeros(1, D))

    for m0, off_hz in programs:
        off_z, off_h = divmod(off_hz, H)
        offset_y = off_z + off_h * N if bug else off_hz * N  # PLANTED BUG: the batch index is not scaled
        local = torch.arange(m0, min(m0 + BLOCK_M, N))
        qr = take(qf, offset_y + local)
        kv_idx = offset_y + torch.arange(N)
        s = qr @ take(kf, kv_idx).T * scale
        if causal:
            s = s.masked_fill(torch.arange(N)[None, :] > local[:, None], float("-inf"))
        o = torch.softmax(s, dim=-1) @ take(vf, kv_idx)
        dest = offset_y + local
        keep = dest < rows  # TMA stores past the end are dropped
        flat[dest[keep]] = o[keep].to(dst.dtype)
    return dst


def batch_rows(q, k, v, causal, scale, out=None):
    return _tma_forward(q, k, v, causal, scale, out, bug=True)


def control(q, k, v, causal, scale, out=None):
    return _tma_forward(q, k, v, causal, scale, out, bug=False)


def _same_lengths(problem) -> str | None:
    return None if problem.Sq == problem.Sk else "the tutorial kernel takes one N_CTX for queries and keys (Sq == Sk)"


def _register() -> None:
    for name, fn in (("wrong_where_control", control), ("wrong_batch_rows", batch_rows)):
        register(Variant(name, "user", f"TEST ONLY: planted bug ({EXPECTED[name] or 'control'})", fn,
                         dtypes=("fp16", "bf16", "fp32"), device="cpu", compute="tensor", hidden=True,
                         check=_same_lengths, source="tests/wrong/cpu_wrong_where.py", tags=("test", "wrong"),
                         tile=(BLOCK_M, 64), deterministic=()),
                 replace=True)


_register()
