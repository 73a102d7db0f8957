"""The leaderboard's ratios without faprof's harness: FlashInfer, faprof's kernels, SDPA cuDNN and FlashAttention-4
timed with triton.testing.do_bench on inputs built here with torch, each in its library's own layout.

Shapes: the problems of scenarios/llama3_70b_decode.toml (decode: bf16, Hq 64 on Hkv 8, D 128, bottom-right
causal, contiguous and 256-token paged caches) and of h100_headline.toml and llama3_8b_prefill.toml (prefill),
read from the scenario files (`scenario_shapes`). Per shape:

- decode (Sq = 1; FlashInfer's decode takes one query per sequence, so at Sq = 4 its column says so):
  FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` on a paged cache (NHD pages, shuffled in the pool; for a
  contiguous problem of B > 1 the same wrapper on pages of the whole sequence, as faprof does) or
  `single_decode_with_kv_cache` (B = 1, contiguous); faprof's `decode_splitkv` through faprof's variant
  registry (`faprof.variants.get(name).fn`, the harness's call); SDPA's cuDNN backend (contiguous only:
  SDPA has no paged cache); FA4 is not a decode kernel here (its paged cache is not in faprof yet).
- prefill: FlashInfer's `BatchPrefillWithRaggedKVCacheWrapper` on the batch packed as [B·S, H, D] (built
  packed, no copy timed) or `single_prefill_with_kv_cache` at B = 1; faprof's `fa3_wgmma_e` through the
  registry; SDPA cuDNN with enable_gqa; FA4's `flash_attn.cute.flash_attn_func` on [B, S, H, D].

Timing: `triton.testing.do_bench` (its own L2 flush before every call: it zeroes a 256 MB buffer), median
ms. Ceilings measured in the same run the same way: a device copy of COPY_BYTES (bytes read + written over
its time) and a bf16/fp16 matmul of MATMUL_N^3. A decode row's % is its K/V bytes (2·B·Hkv·Sk·D·elt, read
once per KV head; faprof also counts q, o and the log-sum-exp, under 0.1% at Sq = 1) over its time against the copy; a prefill
row's % is its FLOPs (4·B·H·D per visible (query, key) pair) over its time against the matmul. Compare them
with docs/kernels/leaderboard.md's % of the measured ceiling; the columns after them are each kernel's time
over cuDNN's (decode: over FlashInfer's where cuDNN cannot run). A library that is not installed, or a call
that raises, is a cell saying so; nothing stops the run.

    python scripts/gpu/libs_do_bench.py [--kind decode|prefill|all] [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DECODE_SCENARIOS = ("llama3_70b_decode",)
PREFILL_SCENARIOS = ("h100_headline", "llama3_8b_prefill")
#: The copy ceiling: a device copy of this many bytes (read, and as many written).
COPY_BYTES = 2**30
#: The matmul ceiling: an N x N x N matmul in the rows' dtype.
MATMUL_N = 8192
#: FlashInfer's float workspace (its recommended 128 MB, zeroed before first use).
WORKSPACE_BYTES = 128 * 2**20
#: --quick keeps this many shapes of each scenario.
QUICK = 2
KERNELS = {"decode": ("flashinfer", "decode_splitkv", "sdpa_cudnn"),
           "prefill": ("flashinfer", "fa3_wgmma_e", "sdpa_cudnn", "fa4")}


@dataclass(frozen=True)
class BenchShape:
    """One problem of a scenario file, as this script builds its inputs."""

    scenario: str
    kind: str  # "decode" or "prefill"
    B: int
    H: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    dtype: str
    causal: bool
    page_size: int | None = None

    @property
    def label(self) -> str:
        s = f"S={self.Sq}" if self.Sq == self.Sk else f"Sq={self.Sq} Sk={self.Sk}"
        heads = f"H={self.H}" if self.Hkv == self.H else f"H={self.H}/{self.Hkv}kv"
        page = f" paged/{self.page_size}" if self.page_size else ""
        return f"B={self.B} {heads} {s} D={self.D} {self.dtype}{' causal' if self.causal else ''}{page}"

    def kv_bytes(self) -> int:
        return 2 * self.B * self.Hkv * self.Sk * self.D * 2  # K and V, 16-bit elements

    def flops(self) -> float:
        """4·B·H·D per visible (query, key) pair; the causal mask bottom-right aligned (square: top-left alike)."""
        if not self.causal:
            pairs = self.Sq * self.Sk
        else:
            off = self.Sk - self.Sq
            pairs = sum(min(self.Sk, i + off + 1) for i in range(self.Sq))
        return 4.0 * self.B * self.H * self.D * pairs


def scenario_shapes(names=DECODE_SCENARIOS + PREFILL_SCENARIOS) -> list[BenchShape]:
    """The forward fp16/bf16 problems of the named scenario files (scenarios/*.toml) as BenchShapes; decode for
    DECODE_SCENARIOS, prefill for the others. Problems this script cannot build (packed batches, windows,
    top-left masks with Sq != Sk, backward) are refused with a ValueError naming them."""
    import faprof.variants  # noqa: F401 (registers the variants the scenarios name)
    from faprof.model.scenarios import SCENARIO_DIR, load_scenario

    out = []
    for name in names:
        scn = load_scenario(str(SCENARIO_DIR / f"{name}.toml"))
        for p in scn.problems:
            if p.direction != "fwd" or p.layout == "varlen" or p.window is not None or p.dtype not in ("fp16", "bf16"):
                raise ValueError(f"{name}: {p.shape_id} is not a dense or paged fp16/bf16 forward problem")
            if p.causal and p.Sq != p.Sk and p.mask_align != "bottom_right":
                raise ValueError(f"{name}: {p.shape_id} has a top-left causal mask with Sq != Sk")
            out.append(BenchShape(name, "decode" if name in DECODE_SCENARIOS else "prefill", p.B, p.H, p.kv_heads,
                                  p.Sq, p.Sk, p.D, p.dtype, p.causal, p.page_size if p.layout == "paged" else None))
    return out


# ------------------------------------------------------------------ the calls (GPU only below this line)
def _dtype(name: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def _missing(module: str) -> str | None:
    import importlib.util

    try:
        return None if importlib.util.find_spec(module) is not None else f"not installed ({module})"
    except (ImportError, ValueError):
        return f"not installed ({module})"


def _registry_call(name: str, problem, q, k, v, attn):
    """faprof's variant `name` as the harness calls it: var.fn(q, k, v, causal, scale, attn=...)."""
    from faprof.variants import get

    var = get(name)
    ok, why = var.supports(problem)
    if not ok:
        return f"unsupported: {why[:80]}"
    return lambda: var.fn(q, k, v, problem.causal, problem.softmax_scale, attn=attn)


def decode_calls(s: BenchShape, gen) -> dict:
    """name -> callable (or why not) for one decode shape; q [B, H, Sq, D], K/V [B, Hkv, Sk, D] or a pool."""
    import torch

    from faprof.model.problem import AttentionProblem
    from faprof.variants.definition import AttnArgs

    dt, scale = _dtype(s.dtype), 1.0 / math.sqrt(s.D)
    q = torch.randn(s.B, s.H, s.Sq, s.D, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(s.B, s.Hkv, s.Sk, s.D, device="cuda", dtype=dt, generator=gen)
    v = torch.randn_like(k)
    problem = AttentionProblem(B=s.B, H=s.H, Sq=s.Sq, Sk=s.Sk, D=s.D, dtype=s.dtype, Hkv=s.Hkv, causal=s.causal,
                               mask_align="bottom_right", page_size=s.page_size)
    calls: dict = {}
    group = s.H // s.Hkv
    if s.page_size:
        page = s.page_size
        nb = -(-s.Sk // page)
        perm = torch.randperm(s.B * nb, device="cuda", generator=gen)
        pools = []
        for t in (k, v):
            t = torch.nn.functional.pad(t, (0, 0, 0, nb * page - s.Sk))
            blocks = t.view(s.B, s.Hkv, nb, page, s.D).permute(0, 2, 3, 1, 4).reshape(s.B * nb, page, s.Hkv, s.D)
            pool = torch.empty(blocks.shape, dtype=dt, device="cuda")
            pool[perm] = blocks
            pools.append(pool)
        pk, pv = pools
        table = perm.view(s.B, nb).to(torch.int32)
        lens = torch.full((s.B,), s.Sk, dtype=torch.int32, device="cuda")
        calls["decode_splitkv"] = _registry_call("decode_splitkv", problem, q, pk, pv,
                                                 AttnArgs(problem, seqlens_k=lens, block_table=table))
        calls["sdpa_cudnn"] = "n/a: SDPA has no paged KV cache"
    else:
        calls["decode_splitkv"] = _registry_call("decode_splitkv", problem, q, k, v, AttnArgs(problem))

        def cudnn():
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # Sq = 1: no mask is the bottom-right causal one
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

        calls["sdpa_cudnn"] = cudnn if s.Sq == 1 else "n/a here: Sq > 1 needs the bottom-right mask (see faprof)"
    missing = _missing("flashinfer")
    if missing:
        calls["flashinfer"] = missing
    elif s.Sq != 1:
        calls["flashinfer"] = "n/a: FlashInfer's decode takes one query per sequence"
    else:
        import flashinfer

        tc = group > 4  # FlashInfer's CUDA-core decode takes 1-4, 6, 8 query heads per KV head; vLLM's rule
        qd = q[:, :, 0].contiguous()  # [B, H, D]
        if s.page_size:
            indptr = torch.arange(0, (s.B + 1) * nb, nb, dtype=torch.int32, device="cuda")
            indices = table.reshape(-1).contiguous()
            last = torch.full((s.B,), s.Sk - (nb - 1) * s.page_size, dtype=torch.int32, device="cuda")
            cache, layout, page = (pk, pv), "NHD", s.page_size
        elif s.B > 1:  # each sequence one HND page of Sk tokens: [B, Hkv, Sk, D] as it is
            indptr = torch.arange(s.B + 1, dtype=torch.int32, device="cuda")
            indices = torch.arange(s.B, dtype=torch.int32, device="cuda")
            last = torch.full((s.B,), s.Sk, dtype=torch.int32, device="cuda")
            cache, layout, page = (k, v), "HND", s.Sk
        else:
            calls["flashinfer"] = lambda: flashinfer.single_decode_with_kv_cache(
                qd[0], k[0], v[0], kv_layout="HND", use_tensor_cores=tc, sm_scale=scale)
            return calls
        ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=tc)
        w.plan(indptr, indices, last, s.H, s.Hkv, s.D, page, sm_scale=scale, q_data_type=dt, kv_data_type=dt)
        calls["flashinfer"] = lambda: w.run(qd, cache)
    return calls


def prefill_calls(s: BenchShape, gen) -> dict:
    """name -> callable (or why not) for one prefill shape, each library's inputs built in its own layout."""
    import torch

    from faprof.model.problem import AttentionProblem
    from faprof.variants.definition import AttnArgs

    dt, scale = _dtype(s.dtype), 1.0 / math.sqrt(s.D)
    # [B, S, H, D] contiguous: FA4's and FlashInfer's ragged layout (B·S rows); SDPA and faprof read the
    # [B, H, S, D] transpose of the same storage (strided views, as faprof's fa4 variant passes them)
    qs = torch.randn(s.B, s.Sq, s.H, s.D, device="cuda", dtype=dt, generator=gen)
    ks = torch.randn(s.B, s.Sk, s.Hkv, s.D, device="cuda", dtype=dt, generator=gen)
    vs = torch.randn_like(ks)
    q, k, v = (t.transpose(1, 2) for t in (qs, ks, vs))
    problem = AttentionProblem(B=s.B, H=s.H, Sq=s.Sq, Sk=s.Sk, D=s.D, dtype=s.dtype, Hkv=s.Hkv, causal=s.causal)
    qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()  # faprof's layout [B, H, S, D]
    calls: dict = {"fa3_wgmma_e": _registry_call("fa3_wgmma_e", problem, qc, kc, vc, AttnArgs(problem))}

    def cudnn():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=s.causal, scale=scale,
                                                                    enable_gqa=s.Hkv != s.H)

    calls["sdpa_cudnn"] = cudnn
    missing = _missing("flash_attn.cute") if _missing("flash_attn") is None else _missing("flash_attn")
    if missing:
        calls["fa4"] = missing
    else:
        from flash_attn.cute import flash_attn_func

        calls["fa4"] = lambda: flash_attn_func(qs, ks, vs, softmax_scale=scale, causal=s.causal)
    missing = _missing("flashinfer")
    if missing:
        calls["flashinfer"] = missing
    else:
        import flashinfer

        if s.B == 1:
            calls["flashinfer"] = lambda: flashinfer.single_prefill_with_kv_cache(
                qs[0], ks[0], vs[0], causal=s.causal, kv_layout="NHD", sm_scale=scale)
        else:
            ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
            w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
            qo = torch.arange(0, (s.B + 1) * s.Sq, s.Sq, dtype=torch.int32, device="cuda")
            kvp = torch.arange(0, (s.B + 1) * s.Sk, s.Sk, dtype=torch.int32, device="cuda")
            w.plan(qo, kvp, s.H, s.Hkv, s.D, causal=s.causal, sm_scale=scale, q_data_type=dt, kv_data_type=dt)
            qp, kp, vp = (t.view(-1, t.shape[2], s.D) for t in (qs, ks, vs))
            calls["flashinfer"] = lambda: w.run(qp, kp, vp)
    return calls


def ceilings(do_bench) -> dict:
    """The copy bandwidth (GB/s) and the matmul rate per dtype (TFLOP/s), measured with do_bench as the rows are."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    out = {"copy_gbs": 2 * COPY_BYTES / (ms * 1e-3) / 1e9}
    for name in ("fp16", "bf16"):
        a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=_dtype(name))
        ms = do_bench(lambda a=a: a @ a, return_mode="median")
        out[f"matmul_{name}_tflops"] = 2 * MATMUL_N**3 / (ms * 1e-3) / 1e12
    return out


def run(shapes: list[BenchShape]) -> tuple[dict, list[dict]]:
    import torch
    from triton.testing import do_bench

    from faprof.variants import build

    build.load()
    ceil = ceilings(do_bench)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for s in shapes:
        try:
            calls = (decode_calls if s.kind == "decode" else prefill_calls)(s, gen)
        except Exception as e:  # noqa: BLE001 (a library that fails to plan is a row, not the end of the run)
            calls = {n: f"set-up failed: {str(e).splitlines()[0][:90]}" for n in KERNELS[s.kind]}
        row = {"shape": asdict(s), "label": s.label}
        for name in KERNELS[s.kind]:
            fn = calls.get(name, "n/a")
            if isinstance(fn, str):
                row[name] = {"note": fn}
                continue
            try:
                fn()  # first call: JIT compile (FlashInfer, FA4, faprof's flex), never timed
                torch.cuda.synchronize()
                ms = do_bench(fn, return_mode="median")
            except Exception as e:  # noqa: BLE001
                row[name] = {"note": f"did not run: {(str(e).strip().splitlines() or [type(e).__name__])[0][:90]}"}
                continue
            if s.kind == "decode":
                pct = 100 * s.kv_bytes() / (ms * 1e-3) / 1e9 / ceil["copy_gbs"]
            else:
                pct = 100 * s.flops() / (ms * 1e-3) / 1e12 / ceil[f"matmul_{s.dtype}_tflops"]
            row[name] = {"ms": ms, "pct_ceiling": pct}
        rows.append(row)
        print(format_row(row, s.kind), flush=True)
    return ceil, rows


def format_row(row: dict, kind: str) -> str:
    names = KERNELS[kind]
    ref = next((n for n in ("sdpa_cudnn", "flashinfer") if "ms" in row.get(n, {})), None)
    cells = []
    for n in names:
        r = row.get(n, {})
        if "ms" not in r:
            cells.append(f"{n}: {r.get('note', '-')}")
            continue
        vs = f", {row[ref]['ms'] / r['ms']:.2f}x {ref}" if ref and n != ref else ""
        cells.append(f"{n} {r['ms']:.4f} ms {r['pct_ceiling']:.1f}%{vs}")
    return f"{row['label']:<52} " + " | ".join(cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("decode", "prefill", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help=f"the first {QUICK} shapes of each scenario only")
    ap.add_argument("--out", help="write the ceilings and rows as JSON here")
    ap.add_argument("--list", action="store_true", help="print the shapes (from the scenario files) and stop (no GPU)")
    a = ap.parse_args(argv)
    shapes = [s for s in scenario_shapes() if a.kind in ("all", s.kind)]
    if a.quick:
        shapes = [s for n in dict.fromkeys(x.scenario for x in shapes) for s in [x for x in shapes if x.scenario == n][:QUICK]]
    if a.list:
        for s in shapes:
            print(f"{s.scenario:<20} {s.kind:<8} {s.label}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("libs_do_bench: no CUDA GPU (--list prints the shapes without one)", file=sys.stderr)
        return 2
    if _missing("triton"):
        print("libs_do_bench: needs triton (triton.testing.do_bench)", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}; flashinfer: {_version('flashinfer-python')}; "
          f"flash-attn-4: {_version('flash-attn-4')}")
    ceil, rows = run(shapes)
    print("ceilings: " + ", ".join(f"{k} {v:,.1f}" for k, v in ceil.items()))
    if a.out:
        Path(a.out).write_text(json.dumps({"device": props.name, "ceilings": ceil, "rows": rows}, indent=1))
    return 0


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
