"""wgmma building blocks on the GPU, before any attention: one warpgroup GEMM per case against torch.

Runs torch.ops.faprof_test.wgmma_gemm_test (tests/kernels/wgmma_test.cu, built as the test-only
extension by tests/kernels/testonly_variants.py) over every form the fa3 kernels use:
SS (A and B from shared-memory descriptors) and RS (A from registers), B K-major (as K in Q·Kᵀ) and
MN-major (transpose-B, as V in P·V), and, for the backward (kernels/fa3_bwd.cuh), an MN-major A read
through the transpose-A bit (as dS from the dSᵀ tile in dQ = dS·K); K = 16 (one instruction), 64
(one 128-byte swizzle block of 4 steps: the backward's dV/dK at D=128 and its Sᵀ at D=64) and 128
(8 steps over two blocks), N = 64 and 128, fp16 and bf16; C = A·B in fp32 against float64
torch.matmul of the same rounded inputs. Each line names the kernel GEMMs that use its form, so a
failing case points at the kernels (and gradients) it breaks.

For a case that fails, it says where the error is (how many of C's 64 rows and N columns are right,
whether C matches A·Bᵀ instead) and retries B's descriptor (or an MN-major A's) with other
leading/stride byte offsets, printing the ones that pass: a wrong LBO/SBO shows up as "passes with
lbo=…, sbo=…". Prints one line per case and a summary; writes the same as JSON with --out. Exit 0 when
every default case passes, 1 otherwise, 2 when the GPU is not compute capability 9.0.

    PYTHONPATH=. python3 scripts/gpu/wgmma_diag.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
from pathlib import Path

#: The test-only kernels' variants file, whose module builds and loads torch.ops.faprof_test.
TESTONLY_VARIANTS = Path(__file__).resolve().parents[2] / "tests" / "kernels" / "testonly_variants.py"


def _testonly_ops():
    """torch.ops.faprof_test, the test-only extension built (or loaded from faprof's build cache)."""
    spec = importlib.util.spec_from_file_location("faprof_testonly_variants", TESTONLY_VARIANTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ops()

#: Which kernel GEMMs use a (A form, B MN-major, N, K) case; both dtypes alike. fwd: kernels/fa3_wgmma*.cu
#: (QKᵀ: N = 128 keys, K = D; PV: N = D, K = 128 keys); bwd: kernels/fa3_bwd.cuh (D=128 takes BM = 64
#: query rows, D=64 BM = 128; the key tile is 128 rows).
USED_BY: dict[tuple[str, bool, int, int], list[str]] = {
    ("SS", False, 128, 128): ["fwd QKᵀ D=128"],
    ("SS", False, 128, 64): ["fwd QKᵀ D=64", "bwd Sᵀ, dPᵀ D=64"],
    ("RS", True, 128, 128): ["fwd PV D=128"],
    ("RS", True, 64, 128): ["fwd PV D=64", "bwd dV, dK D=64"],
    ("SS", False, 64, 128): ["bwd Sᵀ, dPᵀ D=128"],
    ("RS", True, 128, 64): ["bwd dV, dK D=128"],
    ("SS-At", True, 64, 128): ["bwd dQ D=64, D=128"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("wgmma_diag: needs a compute capability 9.0 GPU (H100/H200)")
        return 2
    op = _testonly_ops().wgmma_gemm_test
    torch.manual_seed(0)
    rows: list[dict] = []

    def run(a, b, N, mn, rs, lbo=-1, sbo=-1, amn=False, a_lbo=-1, a_sbo=-1):
        c = torch.full((64, N), float("nan"), device="cuda")
        op(a, b, c, mn, rs, lbo, sbo, amn, a_lbo, a_sbo)
        torch.cuda.synchronize()
        return c

    def err(c, ref):
        return float(((c.double() - ref).abs() / (1 + ref.abs())).max())

    tol = 1e-3  # fp32 accumulation of K <= 128 products of exactly representable inputs: ~1e-6
    # A forms: K-major from shared memory (SS), from registers (RS), MN-major from shared memory (SS-At).
    for dtype, N, K, mn, form in itertools.product((torch.float16, torch.bfloat16), (64, 128), (16, 64, 128),
                                                   (False, True), ("SS", "RS", "SS-At")):
        rs, amn = form == "RS", form == "SS-At"
        a = torch.randn(K, 64, device="cuda", dtype=dtype) if amn else torch.randn(64, K, device="cuda", dtype=dtype)
        amat = a.double().t() if amn else a.double()  # [64, K]
        b = torch.randn(K, N, device="cuda", dtype=dtype) if mn else torch.randn(N, K, device="cuda", dtype=dtype)
        bmat = b.double() if mn else b.double().t()  # [K, N]
        ref = amat @ bmat
        c = run(a, b, N, mn, rs, amn=amn)
        e = err(c, ref)
        ok = e <= tol
        name = (f"{'bf16' if dtype == torch.bfloat16 else 'fp16'} {form:5s} "
                f"B {'MN-major' if mn else 'K-major '} N={N:3d} K={K:3d}")
        row = dict(case=name, ok=ok, max_err=e, nan=int(torch.isnan(c).sum()), used_by=USED_BY.get((form, mn, N, K), []))
        if not ok:
            good = (c.double() - ref).abs() <= tol * (1 + ref.abs())
            row["rows_ok"] = int(good.all(dim=1).sum())
            row["cols_ok"] = int(good.all(dim=0).sum())
            if N == K:
                row["matches_A_Bt"] = err(c, amat @ bmat.t()) <= tol
            alts = []
            cands = {(16, 1024), (1024, 16), (1024, 1024), (16, 2048), (2048, 1024), (1024, 2048),
                     (K * 128, 1024), (1024, K * 128), (N * 128, 1024), (1024, N * 128), (16, 128), (128, 16)}
            for lbo, sbo in sorted(cands):
                if err(run(a, b, N, mn, rs, lbo, sbo, amn=amn), ref) <= tol:
                    alts.append(f"lbo={lbo},sbo={sbo}")
                if amn and err(run(a, b, N, mn, rs, amn=True, a_lbo=lbo, a_sbo=sbo), ref) <= tol:
                    alts.append(f"a_lbo={lbo},a_sbo={sbo}")
            row["passes_with"] = alts
        rows.append(row)
        extra = "" if ok else (f"  rows_ok={row['rows_ok']}/64 cols_ok={row['cols_ok']}/{N} nan={row['nan']}"
                               f"{' (C = A·Bᵀ!)' if row.get('matches_A_Bt') else ''}"
                               f"  passes with: {', '.join(row['passes_with']) or 'none tried'}")
        uses = f"  [{'; '.join(row['used_by'])}]" if row["used_by"] else ""
        print(f"{'ok  ' if ok else 'FAIL'} {name}  max_err={e:.2e}{uses}{extra}")
    n_fail = sum(not r["ok"] for r in rows)
    print(f"wgmma_diag: {len(rows) - n_fail}/{len(rows)} GEMM cases pass")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
