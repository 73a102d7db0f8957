"""Benchmark of the split-KV decode kernel (decode_splitkv) against PyTorch's decode paths (issue 36).

Per shape (q [B, Hq, Sq, D], K/V [B, Hkv, Sk, D], D = 128): decode_splitkv on the contiguous cache and
on a paged copy of it (page size 16 by default; blocks shuffled in the pool), SDPA with each backend
that runs (cuDNN, flash, efficient, math; enable_gqa=True), FlexAttention (torch.compile'd once per
shape before timing, compile time excluded) when torch.nn.attention.flex_attention exists, and a
device-to-device copy of the K/V bytes. The mask is none (at Sq = 1 bottom-right causal is the same
mask); at Sq > 1 decode_splitkv also runs causal bottom-right (`+causal_br`), which SDPA's is_causal
(top-left) cannot express without an explicit mask.

Timing: faprof's harness (faprof.measure.harness.time_cuda) with CUDA events around each call, after
faprof's L2 flush (write a 2x-L2 buffer, read another) and a GPU-side lead, repeats until the median's
CI is tight or the per-variant budget is spent; the median is reported. TB/s counts the K/V bytes read
once per KV head (2 * B * Hkv * Sk * D * elt) over the time; the HBM ceiling is a 1 GiB device copy
(bytes read + written over its time) in the same run; "% ceil" is a row's TB/s over it. Every kernel
row is also checked against SDPA's output (max |diff|), so a fast wrong kernel cannot pass.

Then a split-count sweep at three shapes: decode_splitkv with forced split counts around the
heuristic's choice (marked *).

    python scripts/gpu_decode_bench.py [--out FILE.json] [--dtypes bf16,fp16] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Decode shapes of llama3_70b_decode (Hq 64, Hkv 8, D 128; Sq 1 and 4; Sk 1k-32k; B 1-64).
GRID = [(B, 64, 8, Sq, Sk) for Sq in (1, 4) for Sk in (1024, 8192, 32768) for B in (1, 16, 64)]
#: The issue's headline shape (B16 Hq32 Hkv8 Sq1 Sk8192), run in every dtype and two page sizes.
HEADLINE = (16, 32, 8, 1, 8192)
SWEEP_SHAPES = [(16, 32, 8, 1, 8192), (1, 64, 8, 1, 32768), (16, 64, 8, 4, 8192)]
SWEEP_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
D = 128
#: The math backend repeats K/V per query head (enable_gqa) and materializes the scores: only below this.
MATH_MAX_KV_BYTES = 256 * 2**20
#: The HBM ceiling: a copy of this many bytes (read, and as many written).
CEILING_BYTES = 2**30
#: Time budget per (variant, shape) for the repeats, seconds.
BUDGET_S = 0.2
#: Flex compiles take seconds each; past this much wall time the remaining shapes skip Flex.
FLEX_WALL_BUDGET_S = 100.0


def timer(l2_bytes: int):
    import torch

    from faprof.measure import harness
    from faprof.model.scenarios import TimingSettings

    settings = TimingSettings(warmup_ms=10, budget_s=BUDGET_S, min_repeats=10, max_repeats=200, timer="events",
                              graph=False)
    flusher = harness.L2Flusher(l2_bytes)

    def time_us(fn) -> float:
        r = harness.time_cuda(fn, settings, flusher)
        torch.cuda.synchronize()
        return r["stats"]["median"] * 1e3

    return time_us


def make_inputs(B, H, Hkv, Sq, Sk, dt, gen):
    """q [B, H, Sq, D] and a dense cache k, v [B, Hkv, Sk, D]."""
    import torch

    q = torch.randn(B, H, Sq, D, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt, generator=gen)
    return q, k, v


def paged_copy(k, v, page: int, gen):
    """The same cache as a pool [num_blocks, page, Hkv, D] with its blocks in a random order."""
    import torch

    B, Hkv, Sk, _ = k.shape
    nb = -(-Sk // page)
    pad = nb * page - Sk
    perm = torch.randperm(B * nb, device="cuda", generator=gen)
    pools = []
    for t in (k, v):
        t = torch.nn.functional.pad(t, (0, 0, 0, pad)) if pad else t
        blocks = t.view(B, Hkv, nb, page, D).permute(0, 2, 3, 1, 4).reshape(B * nb, page, Hkv, D)
        pool = torch.empty_like(blocks)
        pool[perm] = blocks
        pools.append(pool)
    table = perm.view(B, nb).to(torch.int32)
    lens = torch.full((B,), Sk, dtype=torch.int32, device="cuda")
    return pools[0], pools[1], table, lens


def kernel_fn(q, k, v, table, lens, causal_br: bool, splits: int = 0):
    import torch

    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(q.shape[-1])

    def call():
        return torch.ops.faprof.decode_splitkv_fwd(q, k, v, out, lse, table, lens, causal_br, causal_br, scale, splits)

    return call, out


def torch_fns(q, k, v, kv_bytes: int, group: int, flex_ok: bool):
    """name -> (callable, output holder) of PyTorch's paths; a name -> str entry says why one cannot run."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    scale = 1.0 / math.sqrt(q.shape[-1])
    res: dict = {}
    for name, backend in (("sdpa_cudnn", "CUDNN_ATTENTION"), ("sdpa_flash", "FLASH_ATTENTION"),
                          ("sdpa_efficient", "EFFICIENT_ATTENTION"), ("sdpa_math", "MATH")):
        if name == "sdpa_math" and kv_bytes * group > MATH_MAX_KV_BYTES:
            res[name] = f"skipped: K/V repeated per query head would be {kv_bytes * group / 2**30:.1f} GiB"
            continue

        chosen = getattr(SDPBackend, backend)

        def call(b=chosen):
            with sdpa_kernel(b):
                return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

        res[name] = call
    if flex_ok:
        try:
            from torch.nn.attention.flex_attention import flex_attention

            compiled = torch.compile(flex_attention)
            res["flex"] = lambda: compiled(q, k, v, scale=scale, enable_gqa=True)
        except ImportError as e:
            res["flex"] = f"unavailable: {e}"
    return res


def run_shape(shape, dt, dtype: str, pages, time_us, ceiling_tbs: float, flex_ok: bool, gen) -> list[dict]:
    import torch

    B, H, Hkv, Sq, Sk = shape
    q, k, v = make_inputs(B, H, Hkv, Sq, Sk, dt, gen)
    kv_bytes = 2 * k.numel() * k.element_size()
    label = f"B{B} Hq{H} Hkv{Hkv} Sq{Sq} Sk{Sk} {dtype}"
    rows: list[dict] = []

    def add(variant, fn, out=None, ref=None, note="", traffic=1):
        try:
            res = fn()  # first call: compiles (Flex), checks it runs
            torch.cuda.synchronize()
            us = time_us(fn)
        except Exception as e:  # noqa: BLE001 (a backend that refuses the shape is a row, not the end of the run)
            rows.append(dict(shape=label, variant=variant, us=None, note=f"did not run: {str(e).splitlines()[0][:90]}"))
            return None
        got = out if out is not None else res
        err = (got.float() - ref.float()).abs().max().item() if ref is not None and got is not None else None
        tbs = traffic * kv_bytes / (us * 1e-6) / 1e12
        rows.append(dict(shape=label, variant=variant, us=us, tbs=tbs, pct=100 * tbs / ceiling_tbs, err=err,
                         note=note))
        return got

    fns = torch_fns(q, k, v, kv_bytes, H // Hkv, flex_ok)
    ref = None
    for name, fn in fns.items():
        if isinstance(fn, str):
            rows.append(dict(shape=label, variant=name, us=None, note=fn))
            continue
        got = add(name, fn)
        ref = got if ref is None and got is not None else ref
    call, out = kernel_fn(q, k, v, None, None, False)
    add("decode_splitkv", call, out, ref, note=f"{call()} splits")
    for page in pages:
        pk, pv, table, lens = paged_copy(k, v, page, gen)
        call, out = kernel_fn(q, pk, pv, table, lens, False)
        add(f"decode_splitkv paged{page}", call, out, ref, note=f"{call()} splits, blocks shuffled")
    if Sq > 1:
        call, out = kernel_fn(q, k, v, None, None, True)
        add("decode_splitkv +causal_br", call, None, None, note="bottom-right causal (SDPA rows: no mask)")
    src = torch.cat([k.view(-1), v.view(-1)])
    dst = torch.empty_like(src)
    add("copy of the K/V bytes", lambda: dst.copy_(src), traffic=2, note="TB/s counts read + written")
    return rows


def ceiling(time_us) -> float:
    """TB/s of a device-to-device copy of CEILING_BYTES (read + written)."""
    import torch

    src = torch.empty(CEILING_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src))
    return 2 * CEILING_BYTES / (us * 1e-6) / 1e12


def sweep(dt, dtype: str, time_us, gen) -> list[dict]:
    import torch

    rows = []
    for B, H, Hkv, Sq, Sk in SWEEP_SHAPES:
        q, k, v = make_inputs(B, H, Hkv, Sq, Sk, dt, gen)
        call, _ = kernel_fn(q, k, v, None, None, False)
        chosen = call()
        kv_bytes = 2 * k.numel() * k.element_size()
        tiles = -(-Sk // 64)
        for s in sorted({x for x in SWEEP_SPLITS if x <= tiles} | {chosen, max(1, chosen - 1), chosen + 1}):
            c, _ = kernel_fn(q, k, v, None, None, False, s)
            used = c()
            us = time_us(c)
            rows.append(dict(shape=f"B{B} Hq{H} Hkv{Hkv} Sq{Sq} Sk{Sk} {dtype}", splits=used, us=us,
                             tbs=kv_bytes / (us * 1e-6) / 1e12, chosen=used == chosen))
        torch.cuda.empty_cache()
    return rows


def print_tables(rows: list[dict], sweep_rows: list[dict], ceil_tbs: float, device: str) -> None:
    print(f"\n== split-count sweep ({device}; * = the heuristic's choice)")
    for r in sweep_rows:
        print(f"{r['shape']:<34} splits {r['splits']:>4}{'*' if r['chosen'] else ' '} {r['us']:>9.1f} us "
              f"{r['tbs']:>6.2f} TB/s")
    print(f"\n== decode: {device}; HBM ceiling (1 GiB device copy, read+write) {ceil_tbs:.2f} TB/s; "
          "TB/s = K/V bytes read once / time")
    print(f"{'shape':<34} {'variant':<28} {'us':>9} {'TB/s':>6} {'%ceil':>6} {'vs best torch':>13} "
          f"{'max|err|':>9}  note")
    by_shape: dict[str, list[dict]] = {}
    for r in rows:
        by_shape.setdefault(r["shape"], []).append(r)
    for shape, rs in by_shape.items():
        torch_us = [r["us"] for r in rs if r.get("us") and (r["variant"].startswith(("sdpa", "flex")))]
        best = min(torch_us) if torch_us else None
        for r in rs:
            if r.get("us") is None:
                print(f"{shape:<34} {r['variant']:<28} {'-':>9} {'':>6} {'':>6} {'':>13} {'':>9}  {r['note']}")
                continue
            vs = f"{best / r['us']:.2f}x" if best and r["variant"].startswith("decode") else ""
            err = f"{r['err']:.1e}" if r.get("err") is not None else ""
            print(f"{shape:<34} {r['variant']:<28} {r['us']:>9.1f} {r['tbs']:>6.2f} {r['pct']:>5.0f}% {vs:>13} "
                  f"{err:>9}  {r.get('note', '')}")


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dtypes", default="bf16,fp16", help="the headline runs in each; the grid in the first")
    ap.add_argument("--page", type=int, default=16, help="page size of the paged rows (the headline adds 64)")
    ap.add_argument("--quick", action="store_true", help="the headline and the sweep only")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_decode_bench: no CUDA GPU", file=sys.stderr)
        return 2
    import torch._dynamo

    for knob in ("cache_size_limit", "recompile_limit"):  # one Flex compile per shape, never the eager fallback
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    from faprof.variants import build

    build.load()
    props = torch.cuda.get_device_properties(0)
    device = f"{props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}"
    time_us = timer(props.L2_cache_size)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dts = {"fp16": torch.float16, "bf16": torch.bfloat16}
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    ceil_tbs = ceiling(time_us)
    t0 = time.perf_counter()
    rows: list[dict] = []
    plan = [(HEADLINE, d, (a.page, 64)) for d in dtypes]
    if not a.quick:
        plan += [(s, dtypes[0], (a.page,)) for s in GRID]
    for shape, dtype, pages in plan:
        flex_ok = time.perf_counter() - t0 < FLEX_WALL_BUDGET_S
        rows += run_shape(shape, dts[dtype], dtype, pages, time_us, ceil_tbs, flex_ok, gen)
        torch.cuda.empty_cache()
        print(f"  {shape} {dtype}: done at {time.perf_counter() - t0:.0f} s", flush=True)
    sweep_rows = sweep(dts[dtypes[0]], dtypes[0], time_us, gen)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(dict(device=device, ceiling_tbs=ceil_tbs, rows=rows, sweep=sweep_rows), indent=1))
    print_tables(rows, sweep_rows, ceil_tbs, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
