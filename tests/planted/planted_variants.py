"""TEST ONLY: the planted-fault kernels as hidden user variants (never part of `faprof list`).

Each kernel is a FlashAttention forward with one deliberate performance defect (results stay within
rounding, so they pass faprof's correctness check), beside a clean control of the same design; the
diagnosis must name each defect as its primary finding from the hardware counters alone
(tests/test_advise_planted.py, on a bundle recorded on an H100 by scripts/record/record_planted.sh). The
kernels are built as their own small extension (`faprof_planted_ext`, ops torch.ops.faprof_planted.*)
the first time one runs, so faprof's own build does not grow. Three designs:

- kernels/planted_mma.cu: kernels/fa2_mma.cu (mma.sync, ldmatrix, swizzled shared memory, cp.async;
  fp16) with a fault per template value (`PLANTED FAULT`); control planted_clean.
- kernels/planted_cuda_core.cu: kernels/fa2.cu reading and writing fp16 (planted_no_tensor_cores).
- kernels/planted_rowthread.cu: an fp32 CUDA-core design unlike faprof's kernels (a query row owned by
  D/32 threads holding q and O slices in registers, K/V tiles broadcast from shared memory, xor
  shuffles summing a row's partial dot products, one block of 8 warps per SM); control
  planted_rowthread_clean.

Load with

    faprof profile --scenario tests/planted/planted.toml --user-variants tests/planted/planted_variants.py

=========================  ===================================================  ======================
variant                    defect                                               expected cause
=========================  ===================================================  ======================
planted_clean              none (the control: fa2_mma as it is)                 not a defect
planted_bank_conflicts     shared-memory rows not swizzled (8-way ldmatrix)     smem_bank_conflicts
planted_spills             registers capped at 128/thread: local-memory spills  register_spills
planted_uncoalesced        lanes walk down rows, 4-byte plain loads             uncoalesced_global
planted_no_tensor_cores    fp16 attention on CUDA cores (fa2 with fp16 I/O)     tensor_cores_unused
planted_no_causal_skip     causal blocks visit tiles above the diagonal         wasted_work
planted_few_ctas           one block per (b, h): grid (1, H, B)                 too_few_ctas
planted_launch_per_head    the clean kernel launched once per (b, h)            launch_split
planted_barrier            warps take turns at block barriers, one computing    stall:barrier
planted_fence              __threadfence() after every k16 MMA step             stall:membar
planted_transcendental     softmax weights as expf((s - m) / temperature)       pipe:xu
planted_fp64               softmax weights (2^x) and row sums in double         pipe:fp64
planted_rowthread_clean    none (the row-thread control)                        not a defect
planted_dependency         QKᵀ one score at a time, one FFMA chain per score    stall:wait
planted_index_math         64-bit signed / and % per V float4 address           pipe:alu
planted_divergence         QKᵀ once per owner (if part == 0 ... else if ...)    threads:inactive
planted_predicated_off     PV walks every chunk of V, acts on its own only      threads:predicated_off
planted_scalar_loads       K/V rows at a runtime stride: unaligned, split LDS   pipe:lsu
planted_l2_thrash          grid (H, B, query tiles): K/V working set > L2       none on the H100 (no
                           (2.4-3.0x the DRAM bytes, no time: see below)        gap to explain)
planted_global_rmw         O accumulators stored to global and reloaded per     global_rmw
                           key tile (fp32 scratch, through L2)
planted_small_tile         64 query rows x 32 keys per block (fa2_mma's D=256   excess_onchip_bytes
                           tile) at D=64 and D=128
planted_tf32_mma           every fp16 m16n8k16 MMA as two m16n8k8 TF32 MMAs     slower_math_path
                           on the operands widened to fp32 (the same products)
planted_kv_repeat          GQA decode through an MHA kernel: K/V repeated per   excess_dram_bytes
                           query head on every call (Hugging Face's repeat_kv
                           pattern), then decode_splitkv on the copies;
                           twin decode_splitkv (tests/planted/planted_decode.toml)
=========================  ===================================================  ======================

The last five (issue 33: evidence classes read from bytes by memory level, and math by path) were
recorded on the H100 on 2026-11-28 (tests/data/planted: the first four in the 22-kind bundle beside the
others, planted_kv_repeat in its own against decode_splitkv). The byte kinds' expected costs are not
estimated here: they depend on the L2's replacement and the memory system's queues, which only the
recording measures. Measured there against planted_clean: planted_global_rmw 1.72-3.16x, planted_small_tile
1.34-1.39x, planted_tf32_mma 1.75-1.79x, planted_l2_thrash 0.87-1.01x (its 2.4-3.0x DRAM bytes cost
nothing: see EXPECTED_CAUSE); planted_kv_repeat 16.6-17.2x decode_splitkv (two repeat copies of K/V of
1.09 ms each at B=16 Sk=8192, then the decode kernel reading 4x the bytes). planted_tf32_mma's expected
cost is below (the fa2_mma table).

The new kinds' evidence: what each adds to the instruction stream (SASS of sm_90, nvcc 13.0, the
extension's flags; `python3 tests/planted/sass_census.py` prints it, tests/test_planted_sass.py keeps
it true), and the cost that implies on an H100 (estimates, not measurements: each SM sub-partition
issues one warp instruction per cycle, an FFMA per cycle, a DFMA/DADD per 2 (16 fp64 lanes), an ALU
instruction per 2, a MUFU per 8 (4 XU lanes), an HMMA.16816 per 6 (ncu's 360,448 fp16 FLOP/cycle per
GPU); both families run 2 warps per sub-partition, so two warps' work is what one sub-partition issues).

fa2_mma family, per warp and key tile (D=64: 128 keys; D=128: 64 keys), non-causal; the control is
tensor-bound: 256 HMMA = 1,536 tensor cycles per warp, 3,072 per sub-partition.

==============  ==============================================  ========================================
kind            SASS per warp and key tile (control -> fault)   expected cost on the planted shapes
==============  ==============================================  ========================================
barrier         BAR.SYNC 2 -> 10 (D64 and D128): QKᵀ + softmax  the block's 4 warps compute one at a
                in 4 turns, then PV in 4, one warp computing    time, so a tile takes the sum of their
                in each, a barrier ending each turn; the rest   phases: >= 4 x (768 tensor + 1,056 XU +
                as the control (1,334 -> 1,341 instructions,    768 tensor) = 10,368 cycles at D64
                D128 1,039 -> 1,040)                            (8,320 at D128: 544 XU) against the
                                                                control's ~6,200 (5,700) per tile in
                                                                the 2026-11-25 recording: >= 1.67x
                                                                (1.46x); ~2-3x with latencies. Each
                                                                warp waits at BAR for 3 turns of 4.
                                                                (Symmetric extra barriers cost nothing:
                                                                66 a tile, one between each LDSM and
                                                                its HMMAs, measured 0.95-1.01x.)
fence           MEMBAR.SC.GPU 0 -> 12 (+ERRBAR, CGAERRBAR)      a GPU-scope fence waits until the warp's
                                                                memory operations, the next tile's
                                                                cp.async copies included, are visible;
                                                                hundreds of cycles each: >= 2x
transcendental  D64: MUFU.RCP 0 -> 132, FCHK 0 -> 132, FFMA     issue 8,230 vs 3,072 cycles per sub-
                136 -> 1,192; 1,334 -> 4,115 instructions.      partition (D64, ~2.7x) and 5,050 vs
                D128: MUFU.RCP 0 -> 68; 1,039 -> 2,525          3,072 (D128, ~1.6x); the XU runs 2 MUFU
                                                                per weight instead of 1 (2,112 vs 1,056
                                                                cycles per warp, D64)
fp64            D64: DFMA 0 -> 1,460, DADD 0 -> 524, F2F 64 ->  FP64 pipe 3,968 cycles per warp, 7,936
                337, MUFU.EX2 132 -> 0; 1,334 -> 3,964          per sub-partition vs 3,072 (D64,
                instructions. D128: DFMA 0 -> 756, DADD 0 ->    ~2.6x); 4,096 vs 3,072 (D128, ~1.3x)
                268; 1,039 -> 2,411
tf32_mma        HMMA.16816.F32 256 -> 0, HMMA.1688.F32.TF32     a TF32 m16n8k8 (2,048 FLOPs) takes the
                0 -> 512, HADD2.F32 (fp16 -> fp32) 0 -> 960;    tensor cycles of an fp16 m16n8k16
                1,334 -> 2,631 instructions (D128: 1,039 ->     (4,096): 6,144 tensor cycles per sub-
                2,317); S in one m16 tile at a time (two at     partition vs 3,072, issue 5,262 (D64)
                once in the control) to stay within 255        and 4,634 (D128): tensor-bound, ~2x
                registers: 20 bytes spilled at D64 (fa2_mma:
                8), none at D128
==============  ==============================================  ========================================

Row-thread family, per warp and 16-key chunk (D=64: 4 chunks a tile; D=128: 2), non-causal; the
control issues 1,439 (D64) / 1,436 (D128) instructions, 1,034 / 1,030 of them FFMA, 256 LDS.128 and
9 / 5 MUFU.EX2 (each score's exp2 once: KC/TPR per thread, and the rescale factor): ~2,880 issue
cycles per sub-partition. (The recording of 2026-11-25, before the exp2 fix, found the control held
by shared-memory wavefronts, 84% of peak at D64 and 92% at D128, with issue active 59% / 34%; the
issue estimates below assume issue-bound.)

==============  ==============================================  ========================================
kind            SASS per warp and chunk (control -> fault)      expected cost on the planted shapes
==============  ==============================================  ========================================
dependency      QKᵀ becomes a rolled loop of 16 iterations of   16 x (LDS latency ~30 + 32 x 4 cycles)
                8 LDS.128 + 32 FFMA each reading the previous   = ~2,500 cycles per warp for QKᵀ (the
                one's result (+1 STS, 1 LDS); FFMA count equal  two warps overlap) vs 1,280 issue
                                                                cycles: ~1.4x, the added cycles fixed-
                                                                latency waits
index_math      +1,250 ALU (IADD3, LEA, LOP3, SHF) and +380     issue 6,150 vs 2,880 cycles (~2.1x);
                IMAD for the 128 V loads; 1,439 -> 3,075        the ALU pipe (2 cycles a warp) busy
                (D128: 1,436 -> 3,082)                          ~80% of the time
divergence      QKᵀ FFMA 512 -> 512 x TPR (TPR = 2 / 4 copies   D64: 1,439 -> 2,101 instructions, the
                behind branches on the owner, none predicated)  QKᵀ part at 16 of 32 lanes (~1.45x);
                                                                D128: 1,436 -> 3,384, at 8 lanes (~2.3x)
predicated_off  PV: every FFMA and LDS.128 guarded; 512 ->      D64: 1,439 -> 2,081 instructions, half
                512 x TPR FFMA                                  the PV threads predicated off (~1.4x);
                                                                D128: 1,436 -> 3,360, 3/4 off (~2.3x)
scalar_loads    shared loads 256 LDS.128 -> 64 LDS.128 + 128    704 shared-load instructions per warp
                LDS.64 + 512 LDS (rows the compiler cannot      and chunk, 5,632 per SM (8 warps) at
                prove 16-byte aligned); 1,439 -> 1,933          ~1 a cycle, vs ~2,880 issue cycles:
                instructions                                    LSU-bound, ~1.9x (more if a broadcast
                                                                LDS.64 takes two wavefronts)
==============  ==============================================  ========================================

Side effects a diagnosis could mistake for the defect, kept small and stated: planted_fp64 spills
8-100 bytes (0-11 local-memory accesses per key tile against 2,400-4,000 instructions; fa2_mma itself
spills up to 20 bytes); planted_index_math spills 4-40 bytes (at most one local load and one store
per 16-key chunk against ~3,100 instructions, up to 4 more loads per key tile); planted_dependency
adds one STS and one LDS per score (a rolled loop cannot index registers). The weakest
expected costs are ~1.3-1.45x (dependency; divergence and predicated_off at D=64, where TPR = 2; fp64
at D=128): those shapes test whether the accounting finds a defect worth a quarter of the time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from faprof.model.problem import AttentionProblem
from faprof.variants import Variant, build, decode, register

KERNELS = Path(__file__).resolve().parent / "kernels"
SOURCES = ("planted_binding.cpp", "planted_mma.cu", "planted_cuda_core.cu", "planted_rowthread.cu")
EXTENSION_NAME = "faprof_planted_ext"

#: Fault codes of torch.ops.faprof_planted.mma_fwd (kernels/planted_kernels.h).
MMA_FAULTS = {"clean": 0, "bank_conflicts": 1, "spills": 2, "uncoalesced": 3, "no_causal_skip": 4, "few_ctas": 5,
              "barrier": 6, "fence": 7, "transcendental": 8, "fp64": 9, "l2_thrash": 10, "global_rmw": 11,
              "small_tile": 12, "tf32_mma": 13}
#: Fault codes of torch.ops.faprof_planted.rowthread_fwd (kernels/planted_kernels.h).
ROWTHREAD_FAULTS = {"clean": 0, "dependency": 1, "index_math": 2, "divergence": 3, "predicated_off": 4,
                    "scalar_loads": 5}

#: Variant name -> the cause its defect must be diagnosed as (None: a control). The causes of the
#: first eight are the advisor's rule causes; the later ones name the term of the accounting (issue
#: 24) the defect must come out as: `stall:<ncu stall reason>`, `pipe:<pipe>`, `threads:inactive`
#: (few active threads per executed instruction: divergence), `threads:predicated_off` (active
#: threads whose predicate is false). One dict, so that settling the final names is one edit.
EXPECTED_CAUSE: dict[str, str | None] = {
    "planted_clean": None,
    "planted_bank_conflicts": "smem_bank_conflicts",
    "planted_spills": "register_spills",
    "planted_uncoalesced": "uncoalesced_global",
    "planted_no_tensor_cores": "tensor_cores_unused",
    "planted_no_causal_skip": "wasted_work",
    "planted_few_ctas": "too_few_ctas",
    "planted_launch_per_head": "launch_split",
    # fa2_mma family (fp16, tensor cores); control planted_clean
    # planted_barrier: the warps take turns; H100 2026-11-25 (tests/data/planted): 2.14-2.47x its control,
    # barrier stalls the primary cause on every shape (the earlier extra-barrier kernel cost nothing)
    "planted_barrier": "stall:barrier",
    "planted_fence": "stall:membar",
    "planted_transcendental": "transcendentals",
    "planted_fp64": "fp64_arithmetic",
    # bytes by memory level (issue 33), fa2_mma family.
    # planted_l2_thrash: on the H100 (2026-11-28 recording) it reads 2.4-3.0x its control's DRAM bytes at
    # 22-25% of DRAM throughput and costs nothing (0.87-1.01x): a FlashAttention forward with 64-row query
    # tiles needs 1/64 byte of K/V per FLOP even with no L2 reuse at all, 1.2 TB/s at this kernel's rate,
    # under the H100's ~3 TB/s. No gap, so no cause: it checks that extra bytes which cost nothing are not
    # blamed. The decode plant below is the one whose extra DRAM bytes cost time.
    "planted_l2_thrash": None,
    "planted_global_rmw": "global_rmw",
    "planted_small_tile": "excess_onchip_bytes",
    # math by path (issue 33): the same FLOPs on the TF32 tensor path, half the fp16 one's rate
    "planted_tf32_mma": "slower_math_path",
    # bytes by memory level (issue 33), decode: a memory-bound kernel reading (and a copy writing) K/V once
    # per query head instead of once per KV head; twin decode_splitkv on tests/planted/planted_decode.toml
    "planted_kv_repeat": "excess_dram_bytes",
    "decode_splitkv": None,  # faprof's decode kernel: the decode plant's control
    # row-thread family (fp32, CUDA cores); control planted_rowthread_clean
    "planted_rowthread_clean": None,
    "planted_dependency": "stall:wait",
    "planted_index_math": "pipe:alu",
    "planted_divergence": "lanes:inactive",
    "planted_predicated_off": "lanes:predicated_off",
    "planted_scalar_loads": "pipe:lsu",
}

#: Planted variant -> the clean kernel of its design that it must be compared with (its control
#: twin; a control maps to itself). planted_no_tensor_cores has no twin of its own design (fa2 with
#: fp16 I/O is the defect): it is compared with the tensor-core control. planted_launch_per_head
#: runs planted_clean's kernel.
CONTROL_OF: dict[str, str] = {
    **{name: "planted_clean" for name in (
        "planted_clean", "planted_bank_conflicts", "planted_spills", "planted_uncoalesced",
        "planted_no_tensor_cores", "planted_no_causal_skip", "planted_few_ctas", "planted_launch_per_head",
        "planted_barrier", "planted_fence", "planted_transcendental", "planted_fp64", "planted_l2_thrash",
        "planted_global_rmw", "planted_small_tile", "planted_tf32_mma")},
    "planted_kv_repeat": "decode_splitkv",
    "decode_splitkv": "decode_splitkv",
    **{name: "planted_rowthread_clean" for name in (
        "planted_rowthread_clean", "planted_dependency", "planted_index_math", "planted_divergence",
        "planted_predicated_off", "planted_scalar_loads")},
}

_LOCK = threading.Lock()
_LOADED = False


def extension() -> build.ExtensionSpec:
    """The planted kernels' extension: their own sources, faprof's PTX wrappers (mma_ptx.cuh) from kernels/."""
    return build.ExtensionSpec(EXTENSION_NAME, tuple(KERNELS / s for s in SOURCES), (KERNELS, build.KERNELS_DIR),
                               (KERNELS, build.KERNELS_DIR), build_prefix="planted-",
                               what="the planted-fault kernels")


def load_extension() -> None:
    """Build (once per source/flag/torch/arch combination, cached like faprof's) and load the ops."""
    global _LOADED
    with _LOCK:
        if _LOADED:
            return
        build.build_extension(extension())
        _LOADED = True


def _ops() -> Any:
    import torch

    load_extension()
    return torch.ops.faprof_planted


def _mma(fault: str, per_head: bool = False):
    code = MMA_FAULTS[fault]

    def fn(q, k, v, causal: bool, scale: float, out=None):
        import torch

        out = torch.empty_like(q) if out is None else out
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        _ops().mma_fwd(q, k, v, out, lse, bool(causal), float(scale), code, per_head)
        return out

    return fn


def _rowthread(fault: str):
    code = ROWTHREAD_FAULTS[fault]

    def fn(q, k, v, causal: bool, scale: float, out=None):
        import torch

        out = torch.empty_like(q) if out is None else out
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        _ops().rowthread_fwd(q, k, v, out, lse, bool(causal), float(scale), code)
        return out

    return fn


def _cuda_core(q, k, v, causal: bool, scale: float, out=None):
    import torch

    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    _ops().cuda_core_fwd(q, k, v, out, lse, bool(causal), float(scale))
    return out


def _kv_repeat(q, k, v, causal: bool, scale: float, out=None, attn=None):
    """GQA decode as code written for multi-head attention does it: K/V repeated to one copy per query head
    (`repeat_interleave` on the head dimension, as Hugging Face's `repeat_kv`) on every call, then faprof's
    decode kernel on the copies. The result is exact; the bytes are not: the copy reads K/V once and writes
    them `group` times, and the kernel reads every copy, where the problem needs K/V read once per KV head."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return decode.decode_splitkv_fwd(q, k, v, causal, scale, out=out, attn=attn)


def _check(problem: AttentionProblem) -> str | None:
    if problem.D not in (64, 128):
        return f"the planted kernels take D = 64 or 128, not {problem.D}"
    if problem.softmax_scale <= 0:
        return "the planted kernels need scale > 0"
    if problem.B > 65535 or problem.H > 65535:
        return "the planted kernels launch a (tiles, H, B) grid: B and H must be at most 65535"
    return None


def _register() -> None:
    common: dict[str, Any] = dict(directions=("fwd",), device="cuda", hidden=True, check=_check,
                                  source="tests/planted/kernels", tags=("test", "planted"))
    descriptions = {
        "clean": "TEST ONLY: the planted kernels' control (fa2_mma as it is)",
        "bank_conflicts": "TEST ONLY: fa2_mma with unswizzled shared-memory rows (bank conflicts)",
        "spills": "TEST ONLY: fa2_mma capped at 128 registers/thread (register spills)",
        "uncoalesced": "TEST ONLY: fa2_mma loading tiles with uncoalesced 4-byte loads",
        "no_causal_skip": "TEST ONLY: fa2_mma computing causal tiles above the diagonal",
        "few_ctas": "TEST ONLY: fa2_mma with one block per (b, h) (too few CTAs)",
        "barrier": "TEST ONLY: fa2_mma whose warps compute one at a time, taking turns at block barriers",
        "fence": "TEST ONLY: fa2_mma with a __threadfence() after every k16 MMA step",
        "transcendental": "TEST ONLY: fa2_mma computing softmax weights with an IEEE division and expf",
        "fp64": "TEST ONLY: fa2_mma computing softmax weights and row sums in double precision",
        "l2_thrash": "TEST ONLY: fa2_mma with the query tile as the slowest grid dimension (K/V working set > L2)",
        "global_rmw": "TEST ONLY: fa2_mma storing and reloading its O accumulators through global memory per key tile",
        "small_tile": "TEST ONLY: fa2_mma with 64x32 tiles at D=64 and D=128 (more on-chip bytes per FLOP)",
        "tf32_mma": "TEST ONLY: fa2_mma doing its products as TF32 MMAs on fp32-widened operands (a slower tensor path)",
    }
    for fault, text in descriptions.items():
        register(Variant(f"planted_{fault}", "user", text, _mma(fault), dtypes=("fp16",), compute="tensor",
                         **common), replace=True)
    register(Variant("planted_launch_per_head", "user", "TEST ONLY: fa2_mma launched once per (b, h)",
                     _mma("clean", per_head=True), dtypes=("fp16",), compute="tensor", **common), replace=True)
    register(Variant("planted_no_tensor_cores", "user", "TEST ONLY: FlashAttention-2 on fp16 with CUDA cores only",
                     _cuda_core, dtypes=("fp16",), compute="cuda_core", **common), replace=True)
    register(Variant("planted_kv_repeat", "user", "TEST ONLY: GQA decode with K/V repeated per query head, then "
                     "decode_splitkv on the copies (the repeat_kv pattern)", _kv_repeat, dtypes=("fp16", "bf16"),
                     compute="tensor", features=decode.DECODE_FEATURES - {"paged"}, check=decode._check,
                     needs_extension=True, source="kernels/decode_splitkv.cu", directions=("fwd",), device="cuda",
                     hidden=True, tags=("test", "planted")), replace=True)
    rowthread = {
        "rowthread_clean": ("clean", "TEST ONLY: the row-thread fp32 kernels' control (rows owned by D/32 threads)"),
        "dependency": ("dependency", "TEST ONLY: row-thread fp32 kernel, QKᵀ as one dependent FFMA chain per score"),
        "index_math": ("index_math", "TEST ONLY: row-thread fp32 kernel, 64-bit / and % per V element address"),
        "divergence": ("divergence", "TEST ONLY: row-thread fp32 kernel, QKᵀ in a lane-dependent switch"),
        "predicated_off": ("predicated_off", "TEST ONLY: row-thread fp32 kernel, PV walking all chunks, predicated"),
        "scalar_loads": ("scalar_loads", "TEST ONLY: row-thread fp32 kernel, K/V rows at a runtime stride (scalar LDS)"),
    }
    for name, (fault, text) in rowthread.items():
        register(Variant(f"planted_{name}", "user", text, _rowthread(fault), dtypes=("fp32",), compute="cuda_core",
                         **common), replace=True)


_register()
