"""Check and time the tensor-core FlashAttention-2 kernels (fa2_wmma, fa2_mma) against PyTorch SDPA.

Method (one process, one GPU):
  * Kernels come from a shared library built with -DFAPROF_TC_CTYPES (scripts/gpu/tc_bench.sh build)
    and are called through ctypes on torch's current stream, so no torch extension build is needed.
  * Correctness: fresh torch.randn inputs for every case, outputs (and a guard tail past them)
    poisoned with NaN, compared with a float64 reference (explicit softmax, top-left causal mask):
    relative error ||o - ref|| / ||ref||, max abs error, max lse error, every element written.
    SDPA flash's error on the same inputs is printed beside ours as the yardstick.
  * Timing: CUDA events around one call; before each repeat a buffer of 2x the L2 size is written
    (L2 flush) and the GPU is kept busy with torch.cuda._sleep so host launch overhead never shows
    in the event interval; warm-up (WARMUP_MS of back-to-back calls) first, then the median of REPEATS. ROUNDS
    rounds, variants interleaved in a rotating order, so round-to-round spread is visible.
  * FLOPs = 4*B*H*Sq*Sk*D, halved when causal (FlashAttention's convention).

Prints a short table last; writes every number to $OUT/tc_bench.json when OUT is set.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[2]
LIB_PATH = ROOT / ".device" / "tc" / "libtc.so"

#: Relative-error limits per dtype: fp16 keeps 11 mantissa bits (P and O are rounded once each),
#: bf16 keeps 8; SDPA flash lands near 3e-4 / 3e-3 on these inputs.
REL_TOL = {"fp16": 2e-3, "bf16": 1.5e-2}
#: lse is accumulated in fp32 from fp16/bf16 scores: absolute error limit in nats.
LSE_TOL = {"fp16": 5e-3, "bf16": 3e-2}
WARMUP_MS = 300  # back-to-back calls before each timing, so clocks settle to this variant's load
REPEATS = 50
ROUNDS = 3  # timing rounds, variants interleaved (rotating order): the spread between rounds is the noise
GUARD = 4096  # elements of NaN past each output, to catch stores beyond Sq

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Lib:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        common = (
            [ctypes.c_void_p] * 4
            + [ctypes.c_void_p]
            + [ctypes.c_int] * 5
            + [ctypes.c_float]
            + [ctypes.c_int] * 2
        )
        self.lib.faprof_tc_mma_fwd.argtypes = common + [ctypes.c_int, ctypes.c_void_p]
        self.lib.faprof_tc_mma_fwd.restype = ctypes.c_int
        self.lib.faprof_tc_wmma_fwd.argtypes = common + [ctypes.c_void_p]
        self.lib.faprof_tc_wmma_fwd.restype = ctypes.c_int

    def call(self, kernel: str, q, k, v, o, lse, causal: bool, scale: float, config: int = -1) -> int:
        B, H, Sq, D = q.shape
        Sk = k.shape[2]
        bf16 = int(q.dtype == torch.bfloat16)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        args = [
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            o.data_ptr(),
            lse.data_ptr(),
            B,
            H,
            Sq,
            Sk,
            D,
            ctypes.c_float(scale),
            int(causal),
            bf16,
        ]
        if kernel == "fa2_mma":
            return self.lib.faprof_tc_mma_fwd(*args, config, stream)
        return self.lib.faprof_tc_wmma_fwd(*args, stream)


def reference(q, k, v, causal: bool, scale: float):
    """float64 attention and its log-sum-exp (natural log), top-left causal like SDPA is_causal."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = torch.matmul(q64, k64.transpose(-2, -1)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.softmax(s, dim=-1), v64), lse


def rel_err(x, ref) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def check_case(lib: Lib, kernel: str, config: int, dtype: str, B, H, Sq, Sk, D, causal) -> dict:
    dt = DTYPES[dtype]
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=dt)
    k = torch.randn(B, H, Sk, D, device="cuda", dtype=dt)
    v = torch.randn(B, H, Sk, D, device="cuda", dtype=dt)
    scale = 1.0 / math.sqrt(D)
    n_o, n_l = B * H * Sq * D, B * H * Sq
    o_buf = torch.full((n_o + GUARD,), float("nan"), device="cuda", dtype=dt)
    l_buf = torch.full((n_l + GUARD,), float("nan"), device="cuda", dtype=torch.float32)
    o, lse = o_buf[:n_o].view(B, H, Sq, D), l_buf[:n_l].view(B, H, Sq)
    rc = lib.call(kernel, q, k, v, o, lse, causal, scale, config)
    torch.cuda.synchronize()
    row = {
        "kernel": kernel,
        "config": config,
        "dtype": dtype,
        "B": B,
        "H": H,
        "Sq": Sq,
        "Sk": Sk,
        "D": D,
        "causal": causal,
        "rc": rc,
    }
    if rc != 0:
        row.update(ok=False, why=f"launcher returned cudaError {rc}")
        return row
    ref, ref_lse = reference(q, k, v, causal, scale)
    guard_ok = bool(torch.isnan(o_buf[n_o:]).all() and torch.isnan(l_buf[n_l:]).all())
    finite = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
    r = rel_err(o, ref) if finite else float("nan")
    mx = float((o.double() - ref).abs().max()) if finite else float("nan")
    le = float((lse.double() - ref_lse).abs().max()) if finite else float("nan")
    ok = finite and guard_ok and r <= REL_TOL[dtype] and le <= LSE_TOL[dtype]
    try:
        warnings.filterwarnings("ignore", category=UserWarning)  # SDPA explains each refusal
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref_flash = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        flash_r = rel_err(ref_flash, ref)
    except RuntimeError:
        flash_r = float("nan")
    row.update(
        ok=ok,
        rel=r,
        max_abs=mx,
        lse_err=le,
        finite=finite,
        guard_ok=guard_ok,
        flash_rel=flash_r,
        why=""
        if ok
        else ("unwritten/NaN" if not finite else "guard overwritten" if not guard_ok else "error"),
    )
    return row


CHECK_SHAPES = [  # (B, H, Sq, Sk)
    (1, 1, 1, 1),
    (1, 1, 17, 17),
    (1, 2, 113, 113),
    (2, 1, 128, 128),
    (1, 2, 203, 203),
    (3, 5, 1000, 1000),
    (1, 2, 113, 203),
    (1, 2, 203, 113),
    (2, 1, 1, 1000),
    (1, 1, 1000, 17),
    (3, 5, 128, 1000),
    (1, 1, 17, 1),
    (1, 3, 300, 257),
]

# Alternative fp16 configs compiled into the ctypes build (see faprof_tc_mma_fwd): (config, D, label)
TUNE_CONFIGS = [
    (0, 128, "mma lazy rescale"),
    (1, 64, "mma lazy rescale"),
]


def run_checks(lib: Lib, quick: bool) -> list[dict]:
    rows = []
    shapes = CHECK_SHAPES[:6] if quick else CHECK_SHAPES
    for kernel in ("fa2_mma", "fa2_wmma"):
        for dtype in ("fp16", "bf16"):
            for D in (64, 128, 256):
                for causal in (False, True):
                    for B, H, Sq, Sk in shapes:
                        rows.append(check_case(lib, kernel, -1, dtype, B, H, Sq, Sk, D, causal))
    for config, D, _label in TUNE_CONFIGS:
        for causal in (False, True):
            for B, H, Sq, Sk in [(1, 2, 113, 203), (1, 2, 203, 113), (3, 5, 1000, 1000), (1, 1, 17, 1)]:
                rows.append(check_case(lib, "fa2_mma", config, "fp16", B, H, Sq, Sk, D, causal))
    return rows


def summarize_checks(rows: list[dict]) -> None:
    bad = [r for r in rows if not r["ok"]]
    print(f"\n== correctness: {len(rows) - len(bad)}/{len(rows)} cases pass ==")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["config"], r["dtype"], r["D"]), []).append(r)
    print(
        f"{'kernel':9s} {'cfg':>3s} {'dtype':5s} {'D':>4s} {'n':>3s} {'fail':>4s} {'max rel':>9s} "
        f"{'flash rel':>9s} {'max abs':>9s} {'lse err':>9s}"
    )
    for key, rs in groups.items():
        good = [r for r in rs if r.get("finite")]

        def mx(f, rs=good):
            vals = [r[f] for r in rs if not math.isnan(r.get(f, float("nan")))]
            return max(vals) if vals else float("nan")

        print(
            f"{key[0]:9s} {key[1]:3d} {key[2]:5s} {key[3]:4d} {len(rs):3d} {sum(not r['ok'] for r in rs):4d} "
            f"{mx('rel'):9.2e} {mx('flash_rel'):9.2e} {mx('max_abs'):9.2e} {mx('lse_err'):9.2e}"
        )
    for r in bad[:30]:
        print(
            "FAIL",
            {
                k: r.get(k)
                for k in (
                    "kernel",
                    "config",
                    "dtype",
                    "B",
                    "H",
                    "Sq",
                    "Sk",
                    "D",
                    "causal",
                    "rc",
                    "rel",
                    "lse_err",
                    "why",
                )
            },
        )


class Timer:
    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
        self.ev = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(REPEATS)
        ]

    def time(self, fn) -> list[float]:
        torch.cuda.synchronize()
        t_end = time.perf_counter() + WARMUP_MS / 1e3
        while time.perf_counter() < t_end:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        for s, e in self.ev:
            self.flush.zero_()
            torch.cuda._sleep(200_000)  # keep the GPU busy while the host enqueues the call
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in self.ev]


def _sdpa(q, k, v, causal: bool, scale: float, backend):
    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    return fn


def _time_shape(lib: Lib, timer: Timer, B, H, S, D, dtype, causal, only: set[str] | None) -> list[dict]:
    dt = DTYPES[dtype]
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(D)

    def ours(kernel: str, config: int = -1):
        return lambda: lib.call(kernel, q, k, v, o, lse, causal, scale, config)

    variants = {"fa2_mma": ours("fa2_mma")}
    if dtype == "fp16":
        for config, cd, label in TUNE_CONFIGS:
            if cd == D:
                variants[label] = ours("fa2_mma", config)
    variants["fa2_wmma"] = ours("fa2_wmma")
    variants["sdpa_flash"] = _sdpa(q, k, v, causal, scale, SDPBackend.FLASH_ATTENTION)
    variants["sdpa_cudnn"] = _sdpa(q, k, v, causal, scale, SDPBackend.CUDNN_ATTENTION)
    if only:
        variants = {n: f for n, f in variants.items() if n in only or n.startswith("sdpa")}
    flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    samples: dict[str, list[float]] = {n: [] for n in variants}
    status: dict[str, str] = {}
    names = list(variants)
    for rnd in range(ROUNDS):
        # Rotate the order each round: whichever variant follows a heavy one (cuDNN) meets a
        # GPU still recovering its clocks, so no variant should always sit in that seat.
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            fn = variants[name]
            if name in status:
                continue
            try:
                rc = fn()
                if isinstance(rc, int) and rc != 0:
                    status[name] = f"cudaError {rc}"
                    continue
                samples[name].append(statistics.median(timer.time(fn)))
            except RuntimeError as exc:  # e.g. a backend that refuses the shape
                status[name] = str(exc).split("\n")[0][:80]
    results = []
    for name in variants:
        row = {"variant": name, "B": B, "H": H, "S": S, "D": D, "dtype": dtype, "causal": causal}
        if name in status:
            row["status"] = status[name]
        else:
            ms = statistics.median(samples[name])
            row.update(status="ok", ms=ms, round_ms=samples[name], tflops=flops / ms / 1e9)
        results.append(row)
    return results


def run_timing(lib: Lib, shapes, only: set[str] | None) -> list[dict]:
    timer = Timer()
    results = []
    for shape in shapes:
        results += _time_shape(lib, timer, *shape, only)
    return results


def print_timing(results: list[dict]) -> None:
    print(
        f"\n== timing: median of {REPEATS} per round, {ROUNDS} rounds, L2 flushed; TFLOP/s = 4BHS^2D (/2 causal) =="
    )
    print(
        f"{'shape':28s} {'variant':22s} {'ms':>8s} {'rounds ms':>22s} {'TFLOP/s':>8s} {'/flash':>7s} {'/cudnn':>7s}"
    )
    by_shape: dict[tuple, list[dict]] = {}
    for r in results:
        by_shape.setdefault((r["B"], r["H"], r["S"], r["D"], r["dtype"], r["causal"]), []).append(r)
    for key, rs in by_shape.items():
        base = {r["variant"]: r.get("tflops") for r in rs}
        label = f"B{key[0]} H{key[1]} S{key[2]} D{key[3]} {key[4]} {'causal' if key[5] else 'full'}"
        for r in rs:
            if r["status"] != "ok":
                print(f"{label:28s} {r['variant']:22s} {r['status']}")
                continue
            rf = r["tflops"] / base["sdpa_flash"] if base.get("sdpa_flash") else float("nan")
            rc = r["tflops"] / base["sdpa_cudnn"] if base.get("sdpa_cudnn") else float("nan")
            rounds = "/".join(f"{x:.3f}" for x in r["round_ms"])
            print(
                f"{label:28s} {r['variant']:22s} {r['ms']:8.3f} {rounds:>22s} {r['tflops']:8.1f} {rf:7.2f} {rc:7.2f}"
            )
            label = ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=str(LIB_PATH))
    ap.add_argument("--quick-checks", action="store_true", help="fewer correctness shapes")
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated variant names to time (SDPA always)")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    prop = torch.cuda.get_device_properties(0)
    print(
        f"device: {prop.name}, cc {prop.major}.{prop.minor}, {prop.multi_processor_count} SMs, "
        f"L2 {prop.L2_cache_size >> 20} MB; torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    lib = Lib(Path(args.lib))
    out: dict = {"device": prop.name}
    t0 = time.time()
    if not args.no_checks:
        rows = run_checks(lib, args.quick_checks)
        out["checks"] = rows
        summarize_checks(rows)
        print(f"(checks took {time.time() - t0:.0f} s)")
    if not args.no_timing:
        shapes = []
        for D in (128, 64):
            for dtype in ("fp16", "bf16"):
                for causal in (False, True):
                    shapes.append((4, 16, 4096, D, dtype, causal))
        only = set(filter(None, args.only.split(","))) or None
        res = run_timing(lib, shapes, only)
        out["timing"] = res
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "tc_bench.json").write_text(json.dumps(out, indent=1))
        print_timing(res)
    elif os.environ.get("OUT"):
        Path(os.environ["OUT"], "tc_bench.json").write_text(json.dumps(out, indent=1))
    ok = all(r["ok"] for r in out.get("checks", []))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
