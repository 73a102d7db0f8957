"""Benchmark of the split-KV decode kernel (decode_splitkv) against PyTorch's decode paths (issue 36).

Shapes: every problem of scenarios/llama3_70b_decode.toml (Hq 64, Hkv 8, D 128, bf16, Sq 1 and 4,
Sk 1k-32k, B 1-64, bottom-right causal; its paged problems with 256-token pages), then the issue's
headline B16 Hq32 Hkv8 Sq1 Sk8192 in each dtype with 16- and 256-token pages. Per shape:

- decode_splitkv on the contiguous cache with the scenario's mask (and without it at Sq > 1), and on a
  paged copy of the cache (blocks shuffled in the pool, every sequence full);
- faprof's own baselines as the harness calls them on the scenario's problem (sdpa_cudnn, sdpa_flash,
  sdpa_efficient, sdpa_auto: bottom-right causal through CausalBias, enable_gqa; flex: a block mask,
  and on the pool for the paged problems), torch.compile'd once per shape before timing (compile time
  excluded);
- SDPA per backend (cuDNN, flash, efficient, math where it fits) with enable_gqa and no mask: at
  Sq = 1 the same mask, at Sq > 1 less work than the causal one, so a lower bound for PyTorch;
- a device-to-device copy of the K/V bytes.

Timing: faprof's harness (faprof.timing.harness.time_cuda) with CUDA events around each call, after
faprof's L2 flush (write a 2x-L2 buffer, read another) and a GPU-side lead, repeats until the median's
CI is tight or the per-variant budget is spent; the median is reported. TB/s counts the K/V bytes read
once per KV head (2 * B * Hkv * Sk * D * elt) over the time; the HBM ceiling is a 1 GiB device copy
(bytes read + written over its time) in the same run; "%ceil" is a row's TB/s over it; "vs best torch"
is the fastest PyTorch row of the shape (masked or not) over the kernel's time. max|err| compares each
output with decode_splitkv's (same mask only), so a disagreement shows on the rows.

Then a split-count sweep at the SWEEP_SHAPES: decode_splitkv with forced split counts around the
heuristic's choice (marked *).

    python scripts/gpu/gpu_decode_bench.py [--out FILE.json] [--dtypes bf16,fp16] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: The scenario whose decode shapes are benchmarked (Hq 64, Hkv 8, D 128; Sq 1 and 4; Sk 1k-32k; B 1-64).
SCENARIO = "llama3_70b_decode"
#: The issue's headline shape (B16 Hq32 Hkv8 Sq1 Sk8192), run in every dtype and with HEADLINE_PAGES.
HEADLINE = (16, 32, 8, 1, 8192)
HEADLINE_PAGES = (16, 256)
SWEEP_SHAPES = [(16, 32, 8, 1, 8192), (16, 32, 8, 1, 1024), (1, 32, 8, 1, 8192), (1, 32, 8, 1, 1024),
                (1, 64, 8, 1, 32768), (16, 64, 8, 1, 8192), (16, 64, 8, 1, 32768), (64, 64, 8, 1, 1024),
                (16, 64, 8, 4, 8192), (16, 64, 8, 4, 1024), (1, 64, 8, 4, 32768)]
SWEEP_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
D = 128
#: The math backend repeats K/V per query head (enable_gqa) and materializes the scores: only below this.
MATH_MAX_KV_BYTES = 256 * 2**20
#: The HBM ceiling: a copy of this many bytes (read, and as many written).
CEILING_BYTES = 2**30
#: Time budget per (variant, shape) for the repeats, seconds.
BUDGET_S = 0.15
#: Flex compiles take seconds each; past this much wall time the remaining shapes skip Flex.
FLEX_WALL_BUDGET_S = 180.0
#: Past this much wall time the remaining shapes are skipped (and said so), so the sweep and the tables
#: always come out within the shell script's time limit.
WALL_BUDGET_S = 300.0


def timer(l2_bytes: int):
    import torch

    from faprof.model.settings import TimingSettings
    from faprof.timing import gpu_clock, harness

    settings = TimingSettings(warmup_ms=10, budget_s=BUDGET_S, min_repeats=10, max_repeats=200, timer="events",
                              graph=False)
    flusher = gpu_clock.L2Flusher(l2_bytes)

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
        pool = torch.empty(blocks.shape, dtype=blocks.dtype, device=blocks.device)  # empty_like keeps a view's strides
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


def raw_sdpa(q, k, v, kv_bytes: int, group: int) -> dict:
    """SDPA per backend with enable_gqa and no mask (at Sq = 1 the same mask as bottom-right causal; at
    Sq > 1 less work than it, so a lower bound for PyTorch's causal time); name -> callable, or the reason."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    scale = 1.0 / math.sqrt(q.shape[-1])
    res: dict = {}
    for name, backend in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION"),
                          ("efficient", "EFFICIENT_ATTENTION"), ("math", "MATH")):
        if name == "math" and kv_bytes * group > MATH_MAX_KV_BYTES:
            res[f"sdpa_{name} nomask"] = f"skipped: K/V repeated per query head: {kv_bytes * group / 2**30:.1f} GiB"
            continue
        chosen = getattr(SDPBackend, backend)

        def call(b=chosen):
            with sdpa_kernel(b):
                return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

        res[f"sdpa_{name} nomask"] = call
    return res


def registered(names, problem, q, k, v, args) -> dict:
    """faprof's own baselines (faprof/variants), called as the harness calls them on `problem`."""
    from faprof.variants import get

    res: dict = {}
    for name in names:
        var = get(name)
        ok, why = var.supports(problem)
        if not ok:
            res[name] = f"unsupported: {why[:80]}"
            continue
        res[name] = (lambda f=var.fn: f(q, k, v, problem.causal, problem.softmax_scale, attn=args))
    return res


class Shape:
    """One benchmark shape: its rows, timed against one ceiling, with one reference output."""

    def __init__(self, label: str, kv_bytes: int, time_us, ceiling_tbs: float):
        self.label, self.kv_bytes, self.time_us, self.ceiling_tbs = label, kv_bytes, time_us, ceiling_tbs
        self.rows: list[dict] = []
        self.ref = None

    def add(self, variant: str, fn, out=None, note: str = "", traffic: int = 1, check: bool = True):
        """Run fn once (compiles, checks it runs), time it, and compare its output with the reference."""
        import torch

        if isinstance(fn, str):
            self.rows.append(dict(shape=self.label, variant=variant, us=None, note=fn))
            return
        try:
            res = fn()
            torch.cuda.synchronize()
            us = self.time_us(fn)
        except Exception as e:  # noqa: BLE001 (a backend that refuses the shape is a row, not the end of the run)
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self.rows.append(dict(shape=self.label, variant=variant, us=None, note=f"did not run: {msg[:90]}"))
            return
        got = out if out is not None else res
        err = None
        if check and isinstance(got, torch.Tensor):
            if self.ref is None:
                self.ref = got
            else:
                err = (got.float() - self.ref.float()).abs().max().item()
        tbs = traffic * self.kv_bytes / (us * 1e-6) / 1e12
        self.rows.append(dict(shape=self.label, variant=variant, us=us, tbs=tbs, pct=100 * tbs / self.ceiling_tbs,
                              err=err, note=note))


def run_shape(shape, dt, dtype: str, pages, time_us, ceiling_tbs: float, flex_ok: bool, gen) -> list[dict]:
    """Every row of one shape. The scenario's mask is bottom-right causal; `nomask` rows drop it."""
    import torch

    from faprof.model.problem import AttentionProblem
    from faprof.variants.definition import AttnArgs

    B, H, Hkv, Sq, Sk = shape
    q, k, v = make_inputs(B, H, Hkv, Sq, Sk, dt, gen)
    kv_bytes = 2 * k.numel() * k.element_size()
    sh = Shape(f"B{B} Hq{H} Hkv{Hkv} Sq{Sq} Sk{Sk} {dtype}", kv_bytes, time_us, ceiling_tbs)
    problem = AttentionProblem(B=B, H=H, Sq=Sq, Sk=Sk, D=D, dtype=dtype, Hkv=Hkv, causal=True,
                               mask_align="bottom_right")
    mask = "causal_br" if Sq > 1 else "causal_br = none at Sq 1"
    # the kernel first: its output is the reference the others are compared with (the GPU tests check
    # it against the definition); SDPA's rows then show their own agreement
    call, out = kernel_fn(q, k, v, None, None, True)
    sh.add("decode_splitkv", call, out, note=f"{mask}; {call()} splits")
    if Sq > 1:
        call, out = kernel_fn(q, k, v, None, None, False)
        sh.add("decode_splitkv nomask", call, out, note=f"{call()} splits", check=False)
    names = ["sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_auto"] + (["flex"] if flex_ok else [])
    for name, fn in registered(names, problem, q, k, v, AttnArgs(problem)).items():
        sh.add(name, fn, note=f"{mask} (faprof's baseline)")
    for name, fn in raw_sdpa(q, k, v, kv_bytes, H // Hkv).items():
        sh.add(name, fn, note="no mask" + ("" if Sq == 1 else ": a lower bound for causal"), check=Sq == 1)
    for page in pages:
        pk, pv, table, lens = paged_copy(k, v, page, gen)
        call, out = kernel_fn(q, pk, pv, table, lens, True)
        sh.add(f"decode_splitkv paged{page}", call, out, note=f"{call()} splits, blocks shuffled")
        pp = problem.with_(page_size=page)
        if flex_ok:
            for name, fn in registered(["flex"], pp, q, pk, pv, AttnArgs(pp, seqlens_k=lens, block_table=table)).items():
                sh.add(f"{name} paged{page}", fn, note="faprof's flex baseline on the pool")
    src = torch.cat([k.view(-1), v.view(-1)])
    dst = torch.empty_like(src)
    sh.add("copy of the K/V bytes", lambda: dst.copy_(src), traffic=2, note="TB/s counts read + written",
           check=False)
    return sh.rows


def scenario_shapes() -> dict[tuple, set[int]]:
    """(B, Hq, Hkv, Sq, Sk) -> page sizes, from scenarios/llama3_70b_decode.toml (its bf16 problems)."""
    import faprof.variants  # noqa: F401 (registers the variants the scenario names)
    from faprof.model.scenarios import load_scenario

    shapes: dict[tuple, set[int]] = {}
    for p in load_scenario(SCENARIO).problems:
        key = (p.B, p.H, p.kv_heads, p.Sq, p.Sk)
        shapes.setdefault(key, set())
        if p.page_size:
            shapes[key].add(p.page_size)
    return shapes


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
    print(f"\n== split-count sweep ({device}; splits:µs, * = the heuristic's choice, best last)")
    by: dict[str, list[dict]] = {}
    for r in sweep_rows:
        by.setdefault(r["shape"], []).append(r)
    for shape, rs in by.items():
        cells = " ".join(f"{r['splits']}{'*' if r['chosen'] else ''}:{r['us']:.1f}" for r in rs)
        best = min(rs, key=lambda r: r["us"])
        print(f"{shape:<34} {cells}  | best {best['splits']} {best['us']:.1f} us {best['tbs']:.2f} TB/s")
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
    ap.add_argument("--dtypes", default="bf16,fp16", help="the headline runs in each; the scenario in the first")
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
    plan = [(HEADLINE, d, HEADLINE_PAGES) for d in dtypes]
    if not a.quick:  # then the scenario's shapes, Sq = 4 first (where Flex, compiled per shape, matters most)
        shapes = scenario_shapes()
        plan += [(s, dtypes[0], tuple(sorted(shapes[s]))) for s in sorted(shapes, key=lambda s: -s[3])]
    for shape, dtype, pages in plan:
        if time.perf_counter() - t0 > WALL_BUDGET_S:
            rows.append(dict(shape=f"{shape} {dtype}", variant="(all)", us=None,
                             note=f"skipped: the benchmark's {WALL_BUDGET_S:.0f} s budget was spent"))
            continue
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
