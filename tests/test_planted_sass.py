"""The planted defects are in the machine code (tests/planted): each new kernel's SASS, from the
planted extension's nvcc flags, is checked against its control's per key-tile iteration (or per
16-key chunk) for the instructions its defect adds, so that a compiler that optimised a defect away
(a fence or barrier dropped, a dependency chain reassociated, a predicate turned into a branch)
fails here and not as a puzzling profile on the GPU. Needs nvcc and cuobjdump (+ nvdisasm); skipped
without them. The figures quoted in tests/planted/planted_variants.py come from the same census
(`python3 tests/planted/sass_census.py`)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nvcc_cache
import pytest

from faprof.variants import build

PLANTED = Path(__file__).parent / "planted"
_spec = importlib.util.spec_from_file_location("faprof_planted_sass_census", PLANTED / "sass_census.py")
assert _spec and _spec.loader
sc = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sc  # dataclasses look their module up by name
_spec.loader.exec_module(sc)

pytestmark = pytest.mark.skipif(
    (build.find_cuda_home() is None and shutil.which("nvcc") is None) or sc.find_cuobjdump() is None,
    reason="needs nvcc and cuobjdump/nvdisasm (CUDA toolkit) to disassemble the planted kernels",
)

#: Fault codes (planted_mma.cu's and planted_rowthread.cu's Fault enums).
MMA = {"clean": 0, "barrier": 6, "fence": 7, "transcendental": 8, "fp64": 9, "tf32_mma": 13}
RT = {"clean": 0, "dependency": 1, "index_math": 2, "divergence": 3, "predicated_off": 4, "scalar_loads": 5}
#: kScalarLoads: at least this many shared-memory load instructions per chunk over the control's (the
#: compiler keeps LDS.128 for the rows it proves aligned: 704 / 256 in the sm_90 SASS).
SCALAR_LOADS_MIN_RATIO = 2.5
#: fa2_mma's warps per block: kBarrier's turns per phase.
MMA_WARPS = sc.MMA_WARPS
#: kBarrier's key tile has the control's instructions but for its turn loops' counters, branches and
#: barriers and ptxas' register moves around the loops (-1.4% at D=128, sm_90): within this share.
BARRIER_MAX_DIFF = 0.03
#: fa2_mma's tile configs: (KQ k16 steps of QKᵀ, NT n8 key tiles, KP k16 steps of PV, DT n8 dim tiles,
#: softmax weights per thread and tile) for D = 64 (128x128 tiles) and D = 128 (128x64 tiles).
MMA_TILES = {64: (4, 16, 8, 8, 128), 128: (8, 8, 4, 16, 64)}
#: planted_rowthread: keys per chunk, head-dim elements per thread, threads per row.
KC, DS = 16, 32
TPR = {64: 2, 128: 4}
#: Integer instructions one V float4 address costs at least under kIndexMath (64-bit signed / and %
#: by D, the tile row, the byte address: 13 in the sm_90 SASS); the control needs none per load.
INDEX_MATH_MIN_INT_PER_LOAD = 8


def _sass_text(source: Path, arch: str) -> str:
    """cuobjdump's SASS of one planted file, cached by its sources, nvcc, cuobjdump and nvdisasm
    (tests/nvcc_cache.py): compiled again whenever any of them changes."""
    cuobjdump = sc.find_cuobjdump()
    assert cuobjdump is not None  # the module is skipped without it
    nvdisasm = shutil.which("nvdisasm", path=f"{Path(cuobjdump).parent}:{os.environ.get('PATH', '')}")
    nvcc = build.find_nvcc()
    tools = [nvcc, cuobjdump, *([nvdisasm] if nvdisasm else [])]
    flags = sc.sass_command("nvcc", Path(source.name), arch, Path("k.cubin"))[1:]
    # planted_mma.cu includes kernels/mma_ptx.cuh by a relative path: kernels/' headers are in the key too
    key = nvcc_cache.cache_key("sass", tools, flags, source, [build.KERNELS_DIR])
    return nvcc_cache.cached("sass", key, lambda: sc.sass_text(source, arch))


@pytest.fixture(scope="module")
def sass():
    """Both planted files' SASS, compiled side by side (nvcc is single-threaded; the test machine has two cores)."""
    files = {"mma": "planted_mma.cu", "rt": "planted_rowthread.cu"}
    with ThreadPoolExecutor(len(files)) as ex:
        futures = {k: ex.submit(_sass_text, PLANTED / "kernels" / f, "sm_90") for k, f in files.items()}
        return {k: sc.parse_sass(fut.result()) for k, fut in futures.items()}


@pytest.fixture(scope="module")
def mma(sass):
    return sass["mma"]


@pytest.fixture(scope="module")
def rt(sass):
    return sass["rt"]


def _tile(funcs, D, causal, fault):
    ins = sc.mma_kernel(funcs, D, causal, fault)
    return ins, sc.counts(ins, sc.tile_loop(ins))


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_mma_defects_add_what_they_plant_per_key_tile(mma, D, causal):
    kq, nt, kp, dt, weights = MMA_TILES[D]
    _, clean = _tile(mma, D, causal, MMA["clean"])
    assert sc.total(clean, "HMMA") == 2 * (kq * nt + kp * dt) and sc.total(clean, "BAR.SYNC") == 2
    assert (
        sc.total(clean, "MEMBAR") == 0 and sc.total(clean, "MUFU.RCP") == 0 and sc.total(clean, "DFMA") == 0
    )

    ins, c = _tile(mma, D, causal, MMA["barrier"])
    # the control's instructions (the turns' loop counters, branches and barriers aside)
    assert sc.total(c, "HMMA") == sc.total(clean, "HMMA") and sc.total(c, "MUFU") == sc.total(clean, "MUFU")
    assert abs(sum(c.values()) - sum(clean.values())) <= BARRIER_MAX_DIFF * sum(clean.values())
    # two rolled loops of WARPS turns (QKᵀ + softmax, then PV), each ended by a block barrier: the
    # pipeline's 2 barriers per key tile, then 2 x WARPS
    turns = sorted(sc.nested(ins, sc.tile_loop(ins)))
    assert len(turns) == 2 and sc.total(c, "BAR.SYNC") == 2 + len(turns)
    for span, hmma in zip(turns, (2 * kq * nt, 2 * kp * dt), strict=True):
        body = [i for i in ins if span[0] <= i.addr <= span[1]]
        assert sum(i.op.startswith("HMMA") for i in body) == hmma  # the phase's code, once
        assert sum(i.op.startswith("BAR.SYNC") for i in body) == 1
        assert any(i.op.startswith(("ISETP", "UISETP")) and f", {MMA_WARPS:#x}," in i.text for i in body), (
            f"no compare of the turn counter with WARPS = {MMA_WARPS}"
        )
        # the warps whose turn it is not jump over the phase to the barrier (a branch, not predicated
        # HMMAs, which would issue every warp's MMAs in every turn)
        last_hmma = max(i.addr for i in body if i.op.startswith("HMMA"))
        bar = next(i.addr for i in body if i.op.startswith("BAR.SYNC"))
        assert not any(i.pred for i in body if i.op.startswith("HMMA"))
        assert any(i.op.startswith("BRA") and i.pred and last_hmma < _target(i) <= bar for i in body)

    _, c = _tile(mma, D, causal, MMA["fence"])
    assert sc.total(c, "MEMBAR.SC.GPU") == kq + kp  # __threadfence() = fence.sc.gpu, one per k16 step
    assert sc.total(c, "HMMA") == sc.total(clean, "HMMA")

    _, c = _tile(mma, D, causal, MMA["transcendental"])
    # per weight (and per row rescale): an IEEE division (MUFU.RCP + FCHK) and expf's MUFU.EX2
    assert sc.total(c, "MUFU.RCP") >= weights and sc.total(c, "FCHK") >= weights
    assert sc.total(c, "MUFU.EX2") == sc.total(clean, "MUFU.EX2")
    assert sum(c.values()) >= 2 * sum(clean.values())

    ins, c = _tile(mma, D, causal, MMA["fp64"])
    fp64 = sc.total(c, "DFMA", "DADD")
    assert fp64 >= 12 * weights and sc.total(c, "MUFU.EX2") == 0  # 11 DFMA + 3 DADD + the sum per weight
    local = sc.total(c, "STL", "LDL")
    assert local <= 0.005 * sum(c.values()), f"{local} local-memory accesses per tile: spills, not fp64"

    _, c = _tile(mma, D, causal, MMA["tf32_mma"])
    # every fp16 product on the TF32 path: two m16n8k8 TF32 MMAs per m16n8k16 one, none left on fp16
    assert sc.total(c, "HMMA.1688.F32.TF32") == 2 * sc.total(clean, "HMMA") and sc.total(c, "HMMA.16816") == 0
    assert sc.total(c, "MUFU.EX2") == sc.total(clean, "MUFU.EX2")  # the softmax untouched
    local = sc.total(c, "STL", "LDL")
    assert local <= 0.005 * sum(c.values()), f"{local} local-memory accesses per tile: spills, not the TF32 path"


def _target(ins) -> int:
    """A branch's target address."""
    return int(ins.text.rsplit("0x", 1)[1], 16)


def _reg(operand: str) -> str:
    return operand.strip().split(".")[0]


def _chunk(funcs, D, causal, fault):
    """Instruction counts of one 16-key chunk of planted_rowthread, rolled inner loops x 16."""
    ins = sc.rt_kernel(funcs, D, causal, fault)
    span = sc.chunk_loop(ins)
    c = sc.counts(ins, span)
    inner = sc.nested(ins, span)
    for sub in inner:
        for op, n in sc.counts(ins, sub).items():
            c[op] += (KC - 1) * n
    return ins, span, inner, c


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_rowthread_defects_add_what_they_plant_per_chunk(rt, D, causal):
    tpr = TPR[D]
    qk = KC * DS  # FFMAs of one thread's QKᵀ slice per chunk (and of its PV)
    _, _, inner, clean = _chunk(rt, D, causal, RT["clean"])
    assert not inner and sc.total(clean, "FFMA") >= 2 * qk and sc.total(clean, "LDS.128") == 2 * KC * DS // 4

    # kDependency: QKᵀ in a rolled loop of KC iterations, each one chain of DS dependent FFMAs
    ins, _, inner, c = _chunk(rt, D, causal, RT["dependency"])
    assert len(inner) == 1
    body = sc.counts(ins, inner[0])
    assert sc.total(body, "FFMA") == DS and sc.total(body, "LDS.128") == DS // 4
    chain = [i for i in ins if inner[0][0] <= i.addr <= inner[0][1] and i.op.startswith("FFMA")]
    for prev, cur in zip(chain, chain[1:], strict=False):  # FFMA Rd, Ra, Rb, Rc: each Rc is the previous Rd
        assert _reg(cur.text.split(",")[3]) == _reg(prev.text.split(",")[0].split()[1]), (prev.text, cur.text)
    assert sc.total(c, "FFMA") == sc.total(clean, "FFMA")

    # kIndexMath: integer instructions per V float4 load, where the control has none
    _, _, _, c = _chunk(rt, D, causal, RT["index_math"])
    ints = sc.total(c, *sc.ALU_OPS, "IMAD") - sc.total(clean, *sc.ALU_OPS, "IMAD")
    assert ints >= INDEX_MATH_MIN_INT_PER_LOAD * KC * DS // 4
    assert sc.total(c, "FFMA") == sc.total(clean, "FFMA")

    # kDivergence: the QKᵀ slice code once per owner (TPR copies), behind branches on the owner
    ins, span, _, c = _chunk(rt, D, causal, RT["divergence"])
    assert sc.total(c, "FFMA") - sc.total(clean, "FFMA") == (tpr - 1) * qk
    assert sc.total(sc.counts(ins, span, predicated=True), "FFMA") == 0, (
        "the copies must branch, not predicate"
    )
    branches = [i for i in ins if span[0] <= i.addr <= span[1] and i.op.startswith("BRA") and i.pred]
    assert len(branches) >= tpr - 1

    # kPredicatedOff: PV over every chunk of the V row, all of it under the ownership predicate
    ins, span, _, c = _chunk(rt, D, causal, RT["predicated_off"])
    pred = sc.counts(ins, span, predicated=True)
    assert sc.total(pred, "FFMA") == tpr * qk and sc.total(pred, "LDS.128") == tpr * KC * DS // 4
    assert sc.total(c, "FFMA") - sc.total(clean, "FFMA") == (tpr - 1) * qk

    # kScalarLoads: the same FFMAs, the K and V float4 reads split into narrower shared loads
    _, _, _, c = _chunk(rt, D, causal, RT["scalar_loads"])
    assert sc.total(c, "FFMA") == sc.total(clean, "FFMA")
    assert sc.total(c, "LDS") >= SCALAR_LOADS_MIN_RATIO * sc.total(clean, "LDS")
    assert sc.total(c, "LDS.128") < sc.total(clean, "LDS.128") // 2


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_rowthread_family_computes_each_exp2_once(rt, D, causal):
    # A row's KC scores per chunk are split over its TPR threads: each thread's MUFU.EX2 are its KC/TPR
    # scores' plus the rescale factor, (KC + TPR) / KC per score and row (1.125 at D=64, 1.25 at
    # D=128, where every thread of the row computing every exp2 gave TPR + TPR/KC); the weights reach
    # the row's other threads by one indexed shuffle each. The same in the control and every fault.
    tpr = TPR[D]
    _, _, _, clean = _chunk(rt, D, causal, RT["clean"])
    ex2 = KC // tpr + 1
    assert sc.total(clean, "MUFU.EX2") == ex2, f"{sc.total(clean, 'MUFU.EX2') * tpr / KC:.2f} exp2 per score"
    assert sc.total(clean, "MUFU") == ex2  # no other special function
    assert sc.total(clean, "SHFL.IDX") == KC
    for fault, code in RT.items():
        _, _, _, c = _chunk(rt, D, causal, code)
        assert sc.total(c, "MUFU") == ex2 and sc.total(c, "SHFL.IDX") == KC, fault
