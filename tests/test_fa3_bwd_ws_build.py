"""The warp-specialized Hopper backward steps (issue 28: fa3_bwd_c, fa3_bwd_d; kernels/fa3_bwd_ws.cuh)
without a GPU. Method: compile kernels/fa3_bwd_c.cu and fa3_bwd_d.cu with nvcc for sm_80, sm_89 and
sm_90a and read ptxas' report of every instantiation (no spills; 384 threads, one block per SM; the
launch count of registers from which setmaxnreg's budgets are re-partitioned; the shared memory counted
from its parts); read the PTX for the instructions each step is about (setmaxnreg, named barriers, the
mbarrier ring, red.global.add in c, the bulk reduce-add in d) and ptxas' log for waits it had to inject
around the wgmmas; build a host program from the kernels' own address helpers and check the dSᵀ and dQ
store addresses against the documented layouts (a bijection onto the tile, the SW128 layout, step d's
chunk permutation and the convert kernel's inverse) and count bank conflicts per store instruction;
and check the registration and the autograd wiring with the ops replaced by a float64 CPU reference.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess

import pytest
from test_fa3_bwd_build import _ptx
from test_fa3_bwd_build import test_autograd_wiring_with_a_cpu_stand_in_for_the_ops as _autograd_check

from faprof.model.problem import AttentionProblem
from faprof.variants import build
from faprof.variants import ptxas as build_report

needs_nvcc = pytest.mark.skipif(
    build.find_cuda_home() is None and shutil.which("nvcc") is None,
    reason="nvcc (CUDA toolkit) not found: install it or set CUDA_HOME to compile the kernels",
)
STEPS = ("fa3_bwd_c", "fa3_bwd_d")
#: Query rows per tile by head dim, and the Q/dO ring depth by (step, head dim): WsCfgC / WsCfgD.
BM = {64: 128, 128: 64}
STAGES = {("fa3_bwd_c", 64): 3, ("fa3_bwd_c", 128): 3, ("fa3_bwd_d", 64): 2, ("fa3_bwd_d", 128): 3}
#: setmaxnreg budgets (kWsProducerRegs, kWsConsumerRegs) and the block's warpgroups.
PRODUCER_REGS, CONSUMER_REGS = 24, 240
THREADS = 384
#: The largest opt-in shared memory per block on Hopper (227 KiB).
SMEM_LIMIT = 227 * 1024
#: ptxas' messages for waits it added around wgmma (a register an in-flight wgmma owns was touched).
WGMMA_STALL_MESSAGES = ("warpgroup.wait is injected", "wgmma.mma_async instructions are serialized")


def smem_bytes(step: str, D: int) -> int:
    """Shared memory of a step, counted from its parts: K, V (128 keys); per ring stage Q and dO (BM
    rows) and lse2/delta (BM floats each); two dSᵀ buffers (128 x BM); step d's fp32 dQ tile (BM x D);
    1 KiB to align the tiles; 64 bytes of mbarriers."""
    bm, stages = BM[D], STAGES[(step, D)]
    tiles = 2 * 128 * D * 2 + stages * (2 * bm * D * 2 + 2 * bm * 4) + 2 * 128 * bm * 2
    return tiles + (bm * D * 4 if step == "fa3_bwd_d" else 0) + 1024 + 64


@pytest.fixture(scope="module")
def report():
    return build_report.resource_report(archs=("sm_80", "sm_89", "sm_90"),
                                        sources=[build.KERNELS_DIR / f"{s}.cu" for s in STEPS])


@needs_nvcc
def test_steps_compile_everywhere_and_fit_on_sm90a(report):
    for step in STEPS:
        rows = report[report.name == f"faprof_fa3_bwd::{step}_kernel"]
        for arch in ("sm_80", "sm_89", "sm_90a"):
            r = rows[rows.arch == arch]  # fp16/bf16 x causal/not x D in {64, 128}
            assert len(r) == 8 and sorted(set(r.D)) == [64, 128], (step, arch, r[["kernel", "D"]])
        hop = rows[rows.arch == "sm_90a"]
        assert (hop.spill_store_bytes == 0).all() and (hop.spill_load_bytes == 0).all(), hop
        assert (hop.stack_frame_bytes == 0).all(), hop.stack_frame_bytes
        assert (hop.threads == THREADS).all() and (hop.blocks_per_sm == 1).all()
        # setmaxnreg re-partitions the registers the block got at launch: the budgets must fit them,
        # or setmaxnreg.inc waits forever (a hang, not an error).
        assert (hop.registers * THREADS >= 128 * PRODUCER_REGS + 256 * CONSUMER_REGS).all(), hop.registers
        assert (hop.role_registers == f"producer {PRODUCER_REGS}, consumer {CONSUMER_REGS}").all()
        for D in (64, 128):
            assert set(hop[hop.D == D].dyn_smem_bytes) == {smem_bytes(step, D)}, (step, D)
            assert smem_bytes(step, D) <= SMEM_LIMIT
        assert (rows[rows.arch != "sm_90a"].registers < 32).all()  # empty, trapping bodies elsewhere
        assert rows[rows.arch != "sm_90a"].role_registers.isna().all()
    conv = report[report.name == "faprof_fa3_bwd::fa3_bwd_d_convert_kernel"]
    for arch in ("sm_80", "sm_89", "sm_90a"):
        c = conv[conv.arch == arch]
        assert len(c) == 4 and (c.threads == 256).all() and (c.spill_store_bytes == 0).all(), arch


@needs_nvcc
def test_setmaxnreg_annotations_agree_with_the_kernels():
    header = (build.KERNELS_DIR / "fa3_bwd_ws.cuh").read_text()
    consts = dict(re.findall(r"constexpr int (kWs\w+Regs) = (\d+);", header))
    assert (int(consts["kWsProducerRegs"]), int(consts["kWsConsumerRegs"])) == (PRODUCER_REGS, CONSUMER_REGS)
    for step in STEPS:
        ann = build_report.parse_setmaxnreg_annotations((build.KERNELS_DIR / f"{step}.cu").read_text())
        assert ann == {f"{step}_kernel": {"producer": PRODUCER_REGS, "consumer": CONSUMER_REGS}}


@needs_nvcc
def test_ptxas_injected_no_wgmma_waits(report):
    """A register that an in-flight wgmma owns, touched before its wait, makes ptxas insert a wait (and
    say so): the schedule's overlap would silently be lost. The report above filled ptxas' cache."""
    nvcc = build.find_nvcc()
    ident = build_report._nvcc_identity(nvcc)
    for step in STEPS:
        log, _ = build_report._cached_ptxas_log(nvcc, ident, build.KERNELS_DIR / f"{step}.cu", "sm_90a")
        assert "Compiling entry function" in log and step in log
        for message in WGMMA_STALL_MESSAGES:
            assert message not in log, (step, message)


@needs_nvcc
@pytest.mark.parametrize("step", STEPS)
def test_step_instructions_only_in_sm90a_code(step):
    ptx = _ptx("sm_90a", f"{step}.cu")
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.(b?f16)\.b?f16 [^;]*?"
                       r"(p, 1, 1(?:, \d)?, \d);", ptx)
    forms = {(shape, dtype, tail) for shape, dtype, tail in wgmma}
    for dtype in ("f16", "bf16"):  # the forms of steps a/b, unchanged
        assert ("m64n64k16", dtype, "p, 1, 1, 0, 0") in forms and ("m64n128k16", dtype, "p, 1, 1, 0, 0") in forms
        assert ("m64n64k16", dtype, "p, 1, 1, 1") in forms and ("m64n128k16", dtype, "p, 1, 1, 1") in forms
        assert ("m64n64k16", dtype, "p, 1, 1, 1, 1") in forms, forms
    # One block-wide barrier per instantiation (the prologue's); the rest are named barriers and mbarriers.
    assert len(re.findall(r"\bbar\.sync\s+0;", ptx)) == 8
    assert re.search(r"\bbar\.sync\s+%r\d+, %r\d+;", ptx), "named barriers (kBarDsReady)"
    assert ptx.count(f"setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};") == 8
    assert ptx.count(f"setmaxnreg.inc.sync.aligned.u32 {CONSUMER_REGS};") == 8
    for needed in ("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "mbarrier.arrive.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64",
                   "fence.proxy.async.shared::cta", "wgmma.wait_group.sync.aligned 1;"):
        assert needed in ptx, needed
    reduce_add = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    if step == "fa3_bwd_c":
        assert "red.global.add.v4.f32" in ptx and reduce_add not in ptx and "bar.arrive" not in ptx
    else:
        assert "red.global.add" not in ptx and reduce_add in ptx
        for needed in ("cp.async.bulk.commit_group;", "cp.async.bulk.wait_group.read 0;",
                       "cp.async.bulk.wait_group 0;", "bar.arrive", "st.shared.v2.f32"):
            assert needed in ptx, needed
    for arch in ("sm_80", "sm_90"):  # plain sm_90 lacks the arch-specific features
        other = _ptx(arch, f"{step}.cu")
        assert "wgmma.mma_async" not in other and "setmaxnreg" not in other and "trap" in other, arch


def test_launch_annotations_match_the_config():
    for step in STEPS:
        text = (build.KERNELS_DIR / f"{step}.cu").read_text()
        ann = build_report.parse_launch_annotations(text)[f"{step}_kernel"]
        for D in (64, 128):  # template integers: D, BM, STAGES, DQ_SMEM, causal
            args = (D, BM[D], STAGES[(step, D)], int(step == "fa3_bwd_d"), 1)
            assert build_report.eval_launch_expr(ann["dyn_smem"], None, args) == smem_bytes(step, D)
            assert build_report.eval_launch_expr(ann["threads"], None, args) == THREADS
            assert build_report.eval_launch_expr(ann["D"], None, args) == D
        cfg = re.search(rf"using WsCfg{step[-1].upper()} = BwdWsConfig<D, D == 128 \? 64 : 128, ([^,]+), (\w+)>;",
                        (build.KERNELS_DIR / "fa3_bwd_ws.cuh").read_text())
        assert cfg is not None, step
        expr = cfg.group(1)
        stages = {D: _ternary(expr, D) if "?" in expr else int(expr) for D in (64, 128)}
        assert stages == {D: STAGES[(step, D)] for D in (64, 128)}, (step, cfg.group(0))
        assert cfg.group(2) == ("true" if step == "fa3_bwd_d" else "false")


def _ternary(expr: str, D: int) -> int:
    """'D == 128 ? 3 : 2' evaluated for D (the configs' only form of a conditional)."""
    m = re.fullmatch(r"D == (\d+) \? (\d+) : (\d+)", expr.strip())
    assert m is not None, expr
    return int(m.group(2)) if int(m.group(1)) == D else int(m.group(3))


# ------------------------------------------------------------------------- store layouts, on the CPU
@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """The address helpers of kernels/fa3_bwd_ws.cuh, run on the host (tests/bwd_ws/fa3_bwd_ws_layout.cu)."""
    nvcc = build.find_nvcc()
    exe = tmp_path_factory.mktemp("layout") / "layout"
    src = build.KERNELS_DIR.parent / "tests" / "bwd_ws" / "fa3_bwd_ws_layout.cu"
    subprocess.run([nvcc, "-std=c++17", "-I", str(build.KERNELS_DIR), "-o", str(exe), str(src)], check=True,
                   capture_output=True, timeout=300)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout
    rows: dict[str, dict[int, list[tuple[int, ...]]]] = {"dq": collections.defaultdict(list),
                                                        "ds": collections.defaultdict(list),
                                                        "unswz": collections.defaultdict(list)}
    for line in out.splitlines():
        kind, D, *rest = line.split()
        rows[kind][int(D)].append(tuple(map(int, rest)))
    return rows


def _sw128(rows: int, r: int, c: int) -> int:
    """kernels/fa3_common.cuh's SW128 layout of 16-bit elements: [c/64 blocks][rows][64], the 16-byte
    chunk j of row r at j ^ (r mod 8) (the GPU-verified layout steps a/b store dSᵀ in)."""
    return (c >> 6) * rows * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2


def _dq_model(D: int, r: int, c: int) -> int:
    """Step d's dQ tile as documented: fp32 [rows][D], the 16-byte chunk k of row r at k ^ 2·(r mod 4)."""
    return r * D * 4 + (((c >> 2) ^ (2 * (r & 3))) << 4) + (c & 3) * 4


def _max_bank_load(addresses: list[int], width: int) -> int:
    """Most accesses any of the 32 four-byte banks takes among `addresses` (each `width` bytes)."""
    banks: collections.Counter[int] = collections.Counter()
    for a in addresses:
        for w in range(0, width, 4):
            banks[((a + w) // 4) % 32] += 1
    return max(banks.values())


@needs_nvcc
@pytest.mark.parametrize("D", (64, 128))
def test_dq_tile_stores_cover_the_tile_once_and_are_conflict_free(layout, D):
    seen, by_instr = collections.Counter(), collections.defaultdict(dict)
    for cw, warp, lane, nt, h, row, col, off in layout["dq"][D]:
        assert off == _dq_model(D, row, col), (cw, warp, lane, nt, h)
        seen[(row, col)] += 1
        seen[(row, col + 1)] += 1
        by_instr[(cw, warp, nt, h)][lane] = off
    assert set(seen) == {(r, c) for r in range(BM[D]) for c in range(D)} and set(seen.values()) == {1}
    offsets = sorted(_dq_model(D, r, c) for r, c in seen)
    assert offsets == list(range(0, BM[D] * D * 4, 4)), "the permutation stays inside the tile, one float each"
    # An 8-byte store is served per half-warp: 16 lanes x 8 bytes = 128 bytes, so conflict-free means each
    # bank once per half-warp (the TMA unit's 128-byte swizzle would give 2 here).
    for lanes in by_instr.values():
        for half in (range(16), range(16, 32)):
            assert _max_bank_load([lanes[x] for x in half], 8) == 1


@needs_nvcc
@pytest.mark.parametrize("D", (64, 128))
def test_the_convert_kernels_inverse_undoes_the_permutation(layout, D):
    table = {(r, k): c for r, k, c in layout["unswz"][D]}
    assert {r for r, _ in table} == set(range(8)) and {k for _, k in table} == set(range(D // 4))
    for (r, k), c in table.items():
        assert table[(r, c)] == k  # an involution
        assert _dq_model(D, r, 4 * c) == r * D * 4 + 16 * k  # chunk k of dq_accum's row holds columns 4c..4c+3


@needs_nvcc
@pytest.mark.parametrize("D", (64, 128))
def test_ds_stores_are_the_sw128_layout_and_conflict_free(layout, D):
    seen, by_instr = collections.Counter(), collections.defaultdict(dict)
    for cw, warp, lane, kk, r, off in layout["ds"][D]:
        g, t = lane // 4, lane % 4
        row, col = 64 * cw + 16 * warp + g + 8 * (r & 1), 8 * (2 * kk + (r >> 1)) + 2 * t
        assert off == _sw128(128, row, col), (cw, warp, lane, kk, r)
        seen[(row, col)] += 1
        by_instr[(cw, warp, kk, r)][lane] = off
    assert set(seen) == {(r, c) for r in range(128) for c in range(0, BM[D], 2)} and set(seen.values()) == {1}
    for lanes in by_instr.values():
        assert _max_bank_load(list(lanes.values()), 4) == 1


# ------------------------------------------------------------------------- registry and autograd
def test_variants_are_registered_like_steps_a_b(monkeypatch):
    import torch

    from faprof import variants
    from faprof.variants import backward as kernel_bwd
    from faprof.variants.kernels import FA3_ARCH_REASON

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok = AttentionProblem(2, 3, 1000, 77, 128, "bf16", causal=True, direction="bwd")
    for name in STEPS:
        v = variants.get(name)
        assert (v.kind, v.dtypes, v.compute, v.needs_extension) == ("cuda", ("fp16", "bf16"), "tensor", True)
        assert v.directions == kernel_bwd.ALL_DIRECTIONS and v.deterministic == ("fwd",)
        assert {"sm90a", "tma", "warp_specialized", "backward"} <= set(v.tags) and not v.hidden
        assert (build.KERNELS_DIR.parent / v.source).exists()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        assert v.supports(ok, cuda_available=True) == (True, "")
        assert v.supports(AttentionProblem(1, 1, 128, 128, 256, "fp16", direction="bwd"), cuda_available=True) == (
            False, f"D=256 not supported by {name} (supported: 64, 128)")
        ok_big, why = v.supports(AttentionProblem(1024, 1024, 2049, 64, 64, "fp16", direction="bwd"),
                                 cuda_available=True)
        assert not ok_big and "32-bit" in why, why
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
        assert v.supports(ok, cuda_available=True) == (False, FA3_ARCH_REASON)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autograd_wiring_with_a_cpu_stand_in_for_the_ops(monkeypatch, step, causal):
    """Steps a/b's check (tests/test_fa3_bwd_build.py) for c and d: the schema's arguments reach the op,
    the gradients it writes come back as q.grad, k.grad, v.grad."""
    _autograd_check(monkeypatch, step, causal)
