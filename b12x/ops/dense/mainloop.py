"""Which mainloop the dense generic GEMM runs, as a declarative table (issue 14; design §4).

The generic path's GEMM kernel (:mod:`b12x.kernels.dense_gemm`) has two mainloops: the
**per-warp decode** (each warp decodes the weights it multiplies; the tile registry's geometry)
and the **shared decode** (``m_warps`` >= 1: the CTA decodes each K16 row once into shared
memory and ``m_warps`` x ``warps / m_warps`` warps multiply it, so a weight is decoded once per
M tile of up to 128 rows instead of once per warp and M16 block). This table picks one, and for
the shared decode its geometry and the split-K it was measured at.

Layout
------
* A *case*: ``path`` (the dense dispatch row), ``m``, ``n``, ``bits``, ``pinned`` (an explicit
  tile was given). :data:`SCHEMA` validates every field.
* :data:`ROWS`, in priority order (the value is a :class:`SharedDecode` or ``None`` = per-warp):

  1. ``off_generic_path`` — K6 and decode_matmul run no generic GEMM: ``None``.
  2. ``pinned_tile`` — a pinned tile fixes the per-warp kernel's geometry (§5.4): ``None``.
  3. ``small_m`` — M <= :data:`SHARED_MIN_M` - 1 (16): one M16 block, nothing to share;
     the per-warp decode is faster (H200: 92.7 vs 99.4 us GEMM at M = 16): ``None``.
  4. ``n_not_128`` — N % 128 != 0: both shared geometries cover 128 columns per CTA: ``None``.
  5. ``shared_thin`` — M <= :data:`THIN_MAX_M` (32): :data:`THIN` (4 warps, 32 rows, 128
     columns per CTA), split 4.
  6. ``tensor_core_deep`` — capability (9, 0), N % 256 == 0, a decoder whose tile hint
     ``wide_tile_cap`` is at least :data:`~b12x.ops.dense.tiles.TENSOR_CORE_MIN_TILE_CAP` (4:
     D3L, sqg_fp16, spills 48-1152 B in all three tensor-core geometries and takes
     ``shared_wide``) and M <= :data:`DEEP_MAX_M` (64):
     :data:`TENSOR_DEEP`, the tensor-core CTA below with 4 K16 rows per step (slots 4 x 4), on
     the stream-K schedule.
  7. ``tensor_swap`` — capability (9, 0), N % 256 == 0, the same decoder hint (so M >= 65,
     past the deep row, up to
     the dispatch table's sm_90 threshold,
     :data:`b12x.ops.dense.dispatch.HOPPER_DECODE_MATMUL_MIN_M`): the swap-AB mainloop
     (:mod:`b12x.kernels.wgmma_swap`: every warp decodes its weights into the ``wgmma`` A
     registers, the CTA's tokens are the B operand), :func:`swap_geometry`: 128 tokens x 256
     weight rows per CTA up to M = 128 (:data:`SWAP_WIDE`, slots 2 x 6), else 256 x 128
     (:data:`SWAP_TALL`, CTA pairs sharing each token tile by TMA multicast, slots 4 x 4),
     split 1, both on the stream-K schedule. It replaced the ``tensor_core`` row
     (:data:`TENSOR`: 128 rows x 256 columns decoded into shared memory), which it beats at
     M = 128 (161.0 against 192.9 us, H100, GEMM alone); on sm_90 the dispatch table's
     decode_matmul row starts at M = 257 (:mod:`b12x.ops.dense.dispatch`).
  8. ``shared_wide`` — :data:`WIDE` (8 warps, 128 rows, 128 columns per CTA), split 1.

  The slots of a shared geometry (``shared_rows`` x ``smem_stages``) are the first of
  :data:`SLOT_CHOICES` whose layout fits :data:`~b12x.kernels.shared_layout.SMEM_LIMIT` at the
  case's bits (2 x 3 up to K5, 1 x 4 from K6): :func:`slots_for`.
* :data:`BOUNDARIES` put both sides of every threshold (M 16/17, 32/33 and 64/65, N
  128-multiple, pinned, path, the decoder's tile hint 4/2) as data; :data:`TABLE` bundles it
  all for :mod:`oracle.dispatch`.

What bounds ``small_m`` (the issue table's M = 1 row): decode instruction issue. The planned
per-warp loop (1 M16 block x 2 N16 tiles per warp, fp16 compute) costs, per decoded weight,
6.47 / 7.06 / 6.28 / 7.19 SASS instructions at K2 / K3 / K4 / K6 (``benchmarks/sass_budget.py
--codebooks mcg --bits 2,3,4,6 --tiles 1x2``; integer ALU 2.6-3.4 of them: window cuts and
the hash's LOP3), and the whole linear at M = 1 scales with it, not with the payload bytes
(K6 reads 3x the bytes of K2): 84.9 / 92.0 / 84.5 / 98.7 us (H100, 2026-12-06,
``benchmarks/dense_trellis.py``), i.e. 1.00 / 1.09 / 1.00 / 1.17 x K4 against SASS ratios
1.03 / 1.12 / 1.00 / 1.14.

The same bound holds at M = 16 (the row's other end; its split is the split-K table's
``fill_mid_m``, 8 slices). ncu (``--clock-control none``, ``scripts/profile_small_m.sh``, H100,
2026-12-06) of the GEMM at M = 16, 8 slices: K6 113.3 us for 56.1 M warp instructions, K4 (at
9 slices) 94.6 us for 47.0 M; the ratio 1.19 matches the whole linear's 121.1 / 100.5 = 1.20
(the table run), 0.58-0.59 issued per scheduler with 40-42 % of cycles issuing nothing at 50 %
theoretical occupancy (61-64 registers: four 8-warp CTAs per SM), ALU 48-51 % and FMA-heavy
53-58 % of peak, DRAM 41-49 %: no pipe and no memory path is full, so the time follows the
instructions per weight.

Evidence (H200, 2026-12-03, ``benchmarks/dense_shared_decode_sweep.py``, 8192 x 28672 MCG K4,
bf16, GEMM alone, graphed, payloads rotated past the L2; us):

====  ===========  =================  =================  ===========  =======================
M     cuBLAS bf16  per-warp (auto S)  shared best        geometry     whole linear today
====  ===========  =================  =================  ===========  =======================
16    110.9        92.7               99.4 (S 4)         thin         114.6 (generic)
32    114.1        170.0              123.8 (S 4)        thin         212.9 (generic)
64    115.8        354.1              207.3 (S 1)        wide         315.6 (decode_matmul)
128   202.2        566.5              300.3 (S 1)        wide         407.0 (decode_matmul)
256   176.1        1102.1             587.5 (S 2)        wide         401.9 (decode_matmul)
====  ===========  =================  =================  ===========  =======================

So the shared decode takes 17 <= M <= 128 (one wide M tile), and the dispatch table's
``decode_matmul`` row starts at M = 129 (:data:`b12x.ops.dense.dispatch.DECODE_MATMUL_MIN_M`):
two M tiles cost twice the decode and lose to decode + cuBLAS. (On sm_90 the swap-AB row below
keeps one 256-token tile fused, so there it starts at M = 257,
:data:`b12x.ops.dense.dispatch.HOPPER_DECODE_MATMUL_MIN_M`.)

The ``wgmma`` geometry (H200, 2026-12-04, same sweep with ``--geometries 1x2x8x8w,...``, GEMM
alone, us; ratio to cuBLAS bf16 in the same run): M = 64: 155.0 at 2 x 4 slots (144.1 at
4 x 3; the mma.sync wide 207.3 above), M = 128: 195.3 (0.95x cuBLAS; wide 300.3), M = 256:
379.3 (two M tiles; decode + cuBLAS's whole linear 396.7), M = 1024: 1358.8, M = 4096: 5389.2
(decode_matmul's whole linear 962.2 and 3542.3 stay ahead). It is bit-identical to the mma.sync
shared decode (``tests/b12x/test_dense_wgmma_gpu.py``), so the row changes speed, not results.
A 128 x 128 CTA (two per SM) and a 256 x 128 CTA were slower at every M (the decode of a
warp's two N16 tiles per K16 row is the ILP that hides its latency); ncu at M = 128: issued IPC
1.73 of 4 with 8 warps per SM (180 registers), tensor pipe 39 %, L1/shared 74 %: the decode is
latency-bound, so M <= 32 keeps the thin mma.sync geometry.

Step depth and warp specialisation (H100 80GB, 2026-12-06, same sweep, ``--m 32,64,128,256
--geometries 1x2x8x8w,1x1x16x8w --slots 2x4,4x4 --splits 1``, GEMM alone, us; cuBLAS bf16
159.0 / 162.7 / 165.9 / 188.4 in the same run):

====  ==============  ==============  ==================  ==================
M     tensor 2 x 4    tensor 4 x 4    16 warps, 2 x 4     16 warps, 4 x 4
====  ==============  ==============  ==================  ==================
32    147.1           131.4           146.3               138.3
64    156.2           **139.9**       157.5               149.7
128   **192.9**       208.0           199.6               189.6
256   377.6           401.4           390.2               376.5
====  ==============  ==============  ==================  ==================

Four K16 rows per step (half the barriers and ``wgmma`` waits per K16 row) win by 10 % while
one warpgroup multiplies (M <= 64) and lose at M = 128, hence ``tensor_core_deep``. The
warp-specialised geometry (``1x1x16x8w``: 16 warps decode, only warps 0-7 multiply, setmaxnreg
184 / 72; :mod:`b12x.kernels.wgmma_decode`, "Decode-only helper warps") doubles the decoding
warps and gains nothing beyond noise: the step is not bound by how many warps decode. It stays
a kernel geometry (GPU-tested bit-identical) and is not planned. M = 32 stays ``shared_thin``
(its whole linear took 122.8 us in the same run). With the deep row, the whole K4 linear at
M = 64 took 141.3 us (0.87x cuBLAS; ``benchmarks/dense_trellis.py``, H100, one run), and ncu
(``--clock-control none``) of its GEMM: 135.2 us, 8 warps per SM (234 registers), 0.49 issued
per scheduler with 51 % of cycles issuing nothing, ALU 42 % / FMA-heavy 43 % / tensor 29 % of
peak, L1/shared 74 %, DRAM 27 %, 0.85 waves (112 CTAs on 132 SMs): latency-bound, no pipe full.

The swap-AB mainloop (H100 80GB, 2026-12-06, ``benchmarks/dense_shared_decode_sweep.py --m
16,64,128,256,1024,4096 --geometries 0x1x8x8s,0x2x8x8s,0x1x4x4s --slots 2x6,4x6 --splits 1``,
GEMM alone, us; ``0x..`` = tokens per CTA fit to M; cuBLAS bf16 in the same run):

====  ======  ==========================  ==========================  ==================
M     cuBLAS  128 weight rows (1 tile)    256 weight rows (2 tiles)   front door today
====  ======  ==========================  ==========================  ==================
16    165.8   106.9 (4 x 6)               104.3 (4 x 6)               107.6 (whole)
64    162.4   140.0 (4 x 6)               129.7 (4 x 6)               138.8 (deep, whole)
128   166.6   196.4 (2 x 6)               **161.0** (2 x 6)           193.5 (whole)
256   185.3   **327.8** (2 x 6)           (256 accumulators)          415.4 (decode_matmul)
1024  589.9   1385.7 (2 x 6)              --                          875.9 (decode_matmul)
4096  2728.1  5111.1 (2 x 6)              --                          3219.6 (decode_matmul)
====  ======  ==========================  ==========================  ==================

Each weight is decoded once per token tile and never leaves the registers, so from M = 65 to one
256-token tile it beats both the shared decode and decode + cuBLAS; M = 64 stays deep (2 %
apart, within the run-to-run spread) and M <= 16 per-warp. ncu at M = 256 (256 x 128, 331.6 us):
8 warps per SM (181 registers), 0.29 issued per scheduler, top stall long scoreboard (3.1 cycles
per issue: the token copies, 2.8 TB/s of L2 reads, since every 128-row CTA re-reads its 256
tokens), 54 % excess shared wavefronts in those copies. Copying one k-half of 8 tokens per
8-lane phase instead was slower at every M (448 us at M = 256), so the copy stays per token.

Two CTAs per SM at M = 64 do not help either (H100 80GB, 2026-12-07,
``dense_shared_decode_sweep.py --m 64 --bits 4 --geometries 0x2x8x8s,0x1x8x8s --slots 2x4,4x4
--splits 1,2``, GEMM alone, us; cuBLAS bf16 162.4, the planned deep row's whole linear 137.5):
with 256 weight rows per CTA, 2 K16 rows per step compile to 124 registers (4 rows: 158; a
128-row CTA takes 94 at 4 rows, ``sass_budget.py --swap-ab``), so two CTAs may share an SM,
but 2 rows ran at 174.2 / 171.9 (256 / 128 weight rows per CTA, split 1) against 145.6 /
142.5 at 4 rows, and split 2 (224 or 448 CTAs) was slower still (190.5 / 200.4 at 2 rows,
155.2 / 167.4 at 4). The deep row's 112 CTAs leave 20 of 132 SMs idle, but every finer grid
of 64-row warpgroup tiles still puts 256 weight rows on the busiest SM (448 tiles over 132
SMs); only 32-row granularity (224 rows) or a stream-K split would cut it, by at most 12.5 %.

Whole linear with this row planned (H100, ``benchmarks/dense_trellis.py``, K4, fp16 compute,
time / cuBLAS bf16 in the same run): M = 128 156.3 us (0.96; 159.5 with
``B12X_DEPENDENT_LAUNCH=0``), M = 256 344.2 us (1.83; 347.0 without PDL), both from ``--m
128,256 --bits 4 --no-peer``; the full table run of the same build measured M = 256 at
396.7 us (2.10; the tensor_core row + decode_matmul gave 414.8 the session before). With
:data:`SWAP_TALL`'s CTA pairs and 4 x 4 slots the full table run measured M = 256 at 257.7 /
270.0 / 265.0 / 273.6 us for K2 / K3 / K4 / K6 (1.36 - 1.44 x cuBLAS bf16's 189.4; quack 176.5). The
profiler's launch table at M = 256 (``profile_launches.py --m 256 --only dense``): GEMM
336.2 us; its output rotation shows 170.7 us of device time because, launched early (PDL), it
waits resident while the GEMM's second partial wave (224 CTAs on 132 SMs) runs.

Stream-K (H200, 2026-12-07, ``benchmarks/dense_shared_decode_sweep.py --m 32,64 --bits 2,4,6
--geometries 1x2x8x8w,1x2x8x8wk --slots 4x4`` and ``--m 128,256 --bits 4 --geometries
16x1x8x8s2,16x1x8x8s2k,0x2x8x8s,0x2x8x8sk --slots 4x4,2x6``, GEMM alone, bf16, us; every
stream-K geometry checked against float32 first, and ``tests/b12x/test_dense_stream_k_gpu.py``
passed: identity = decode bit for bit, bounded, reproducible, graph replay):

====  ===========================  ==============  ==============
M     geometry                     per tile        stream-K
====  ===========================  ==============  ==============
32    deep 1x2x8x8w, K2 / K4 / K6  135.2 / 136.7 / 163.0   124.8 / 124.2 / 152.5
64    deep 1x2x8x8w, K2 / K4 / K6  153.4 / 144.1 / 185.9   139.0 / 128.1 / 165.2
128   swap 0x2x8x8s (2 x 6), K4    164.2           149.4
256   swap pairs 16x1x8x8s2 (4x4)  263.1           234.7
====  ===========================  ==============  ==============

The tiles' K ranges shared over one CTA per SM take the idle SMs of the deep row's 0.85 waves
and of the swap pairs' 1.70 (9-12 %). Whole linear with the stream-K rows planned (H100 80GB,
``benchmarks/dense_trellis.py``, one run, time / cuBLAS bf16 in the same run, K2 / K3 / K4 /
K6): M = 64 0.755 / 0.776 / 0.773 / 0.939 (the per-tile rows' run of the same day, another
H100: 0.865 / 0.876 / 0.829 / 0.973); M = 256 1.258 / 1.338 / 1.278 / 1.348 (1.344 / 1.388 /
1.355 / 1.405). The oracle's curated GPU cases and graph targets passed through these plans.
What bounds the deep row now: its loop's decode issue at 8 warps per SM. SASS per decoded weight
of the stream-K loop (``benchmarks/sass_budget.py --codebooks mcg --bits 4,6 --tiles 1x2 --wgmma
--stream-k --shared-rows 4 --smem-stages 4``): 6.34 at K4, 7.26 at K6 (1.15x; the per-tile
kernel's loop: 7.06 / 7.98, K2 7.20, K3 7.83), and the M = 64 whole linear follows it (K6 / K4
1.21 in the run above; the profile at K4 before stream-K: 0.49 issued per scheduler, no pipe
full). At M = 32 the thin row's whole linear (125.4 us at K4, rotations included) stays ahead of
the deep GEMM alone, so ``shared_thin`` keeps M <= 32. At M = 128 the 4 x 4 slots lose on
stream-K (193.6), so the wide swap row keeps 2 x 6.

The planned stream-K rows profiled (H100 80GB, 2026-12-07, ncu ``--clock-control none``,
``DENSE_M="64 256" DENSE_BITS="4 6" LAUNCHES=0 bash scripts/profile_small_m.sh``, the whole
linear's GEMM, 132 CTAs of 256 threads, one per SM: 12.5 % occupancy, bound by registers
(250-255) and shared memory):

====  ====  ========  ===========  =========  ========  =========  ==========================
M     K     us        warp instr   issued/    no        tensor     top stalls (per issue)
                                   scheduler  eligible  pipe
====  ====  ========  ===========  =========  ========  =========  ==========================
64    4     122.8     47.3 M       0.45       55 %      28 %       long scoreboard 0.82, short
                                                                   scoreboard 0.55
64    6     155.2     54.0 M       0.39       61 %      21 %       MIO throttle 1.10, wait
                                                                   0.85, short scoreboard 0.63
256   4     234.3     65.6 M       0.33       67 %      58 %       wait 1.44, barrier 1.13,
                                                                   gmma 0.75, dispatch 0.71
256   6     244.0     71.5 M       0.34       66 %      56 %       wait 1.50, barrier 1.08,
                                                                   gmma 0.66
====  ====  ========  ===========  =========  ========  =========  ==========================

No pipe and no memory level is full (DRAM 21-38 %). M = 64: K6 issues 1.14x K4's instructions
(the SASS ratio 1.15 above) and takes 1.26x the time: at K6 its 8 warps also stall on a full
MIO queue (the decode's shared-memory instructions), which K4 does not show. M = 256: latency
at one 8-warp CTA per SM, the consumers waiting on the ``wgmma`` pipeline and the slot
barriers; the tensor pipe is 58 % busy. More warps per SM (fewer registers or a smaller token
tile) is the lever for both rows.

Invariants
----------
* ``explain`` is a pure function of the case; every field is validated before any row runs.
* A geometry this table returns is one the kernel accepts (:func:`slots_for` checks the layout
  against the shared-memory limit; ``tests/b12x/test_dense_mainloop_table.py`` compiles them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.shared_layout import SLOT_CHOICES, WGMMA_CAPABILITY, fitting_slots
from b12x.ops import tables
from b12x.ops.dense.dispatch import PATH_NAMES, check_capability
from b12x.ops.dense.tiles import (
    TENSOR_CORE_MIN_TILE_CAP,
    WIDE_TILE_CAP,
    WIDE_TILE_CAPS,
    tensor_core_takes_decoder,
)
from b12x.ops.tables import Boundary, Condition, DecisionTable, Explanation, Row
from b12x.runtime.validate import check_bool, check_choice, check_positive_int

__all__ = [
    "BOUNDARIES",
    "DEFAULT_CASE",
    "ROWS",
    "SCHEMA",
    "SHARED_MIN_M",
    "SLOT_CHOICES",
    "TABLE",
    "THIN",
    "THIN_MAX_M",
    "WIDE",
    "TENSOR",
    "TENSOR_CTA_N",
    "TENSOR_DEEP",
    "DEEP_MAX_M",
    "SWAP_TALL",
    "SWAP_WIDE",
    "SWAP_WIDE_MAX_M",
    "swap_geometry",
    "SharedDecode",
    "explain",
    "slots_for",
]

#: Smallest M the shared decode takes (M <= 16 is one M16 block: the per-warp decode wins).
SHARED_MIN_M = 17
#: Largest M of the thin geometry.
THIN_MAX_M = 32
#: Columns one CTA of either shared geometry covers.
CTA_N = 128
#: Columns one CTA of the ``wgmma`` geometry covers.
TENSOR_CTA_N = 256


@dataclasses.dataclass(frozen=True)
class SharedDecode(GemmGeometry):
    """A named shared-decode :class:`~b12x.kernels.geometry.GemmGeometry` and the split it was
    measured at (a planning fact: :meth:`~b12x.kernels.geometry.GemmGeometry.geometry` drops
    it for the kernel spec)."""

    split_k: int = 1
    shared_rows: int = 2
    smem_stages: int = 3


#: 4 warps as 2 (M) x 2 (N): 32 rows x 128 columns per CTA, 4 N16 tiles per MMA warp.
THIN = SharedDecode(m_tiles=1, n_tiles=2, warps=4, m_warps=2, split_k=4)
#: 8 warps as 4 (M) x 2 (N): 128 rows x 128 columns per CTA, 2 M16 blocks x 4 N16 tiles per
#: MMA warp (120 registers: two CTAs per SM).
WIDE = SharedDecode(m_tiles=2, n_tiles=1, warps=8, m_warps=4, split_k=1)
#: sm_90: 8 warps decode, two warpgroups multiply with ``wgmma``: 128 rows x 256 columns per CTA
#: (one m64n256k16 per warpgroup and K16 row; 180 registers, one CTA per SM), 2 K16 rows per
#: step in 4 slots (88 KB at K6, 96 KB at K8: it fits every rate, :data:`WGMMA_SMEM_LIMIT`).
TENSOR = SharedDecode(
    m_tiles=1, n_tiles=2, warps=8, m_warps=8, split_k=1, shared_rows=2, smem_stages=4, wgmma=True
)
#: :data:`TENSOR` with 4 K16 rows per step (the same 4 slots; 192 KB at K8): at M <= 64 one
#: warpgroup multiplies, and the deeper step halves the barriers per K16 row.
#: On the stream-K schedule (:mod:`b12x.kernels.stream_k`): its 112 tiles at N = 28672 leave 20
#: of 132 SMs idle otherwise (module docstring, "Stream-K").
TENSOR_DEEP = dataclasses.replace(TENSOR, shared_rows=4, stream_k=True)
#: Largest M of :data:`TENSOR_DEEP` (H100 sweep in the module docstring).
DEEP_MAX_M = 64
#: Tokens per CTA of a swap-AB launch at M <= :data:`SWAP_WIDE_MAX_M`: 128 tokens x 256 weight
#: rows (two N16 tiles per warp, 128 accumulators per thread), 2 K16 rows per step, 6 slots.
#: Stream-K, as every swap-AB row (module docstring, "Stream-K").
SWAP_WIDE = SharedDecode(
    m_tiles=8, n_tiles=2, warps=8, m_warps=8, split_k=1, shared_rows=2, smem_stages=6,
    wgmma=True, swap_ab=True, stream_k=True,
)  # fmt: skip
#: Largest M of :data:`SWAP_WIDE`.
SWAP_WIDE_MAX_M = 128
#: Beyond it: 256 tokens x 128 weight rows (one N16 tile per warp; more tokens per CTA would
#: need more than 128 accumulators per thread); M > 256 takes several token tiles. Pairs of
#: CTAs share each token tile (cluster 2, TMA multicast; N % 256 == 0 makes the CTAs along N
#: even), 4 K16 rows per step in 4 slots (164 KB at K8). H100 80GB, 2026-12-06, GEMM alone at
#: M = 256 (``dense_shared_decode_sweep.py --geometries 16x1x8x8s,16x1x8x8s2 --slots
#: 2x6,4x5,4x4,2x8``), us: unshared 330.2 / 347.9 / 439.5 / 339.6, shared 308.2 / 272.5 /
#: **266.1** / 305.0 (cluster 4 at 2 x 6: 311.4).
SWAP_TALL = dataclasses.replace(
    SWAP_WIDE, m_tiles=16, n_tiles=1, cluster=2, shared_rows=4, smem_stages=4
)


def swap_geometry(m: int) -> SharedDecode:
    """The swap-AB geometry at ``m`` (:data:`SWAP_WIDE` up to M = 128, else :data:`SWAP_TALL`)."""
    return SWAP_WIDE if m <= SWAP_WIDE_MAX_M else SWAP_TALL


def slots_for(bits: int, geometry: SharedDecode) -> SharedDecode:
    """``geometry`` with the first slot shape of :data:`SLOT_CHOICES` that fits at ``bits``
    (a ``wgmma`` geometry keeps its own: they fit every rate in the opt-in shared memory)."""
    if geometry.wgmma:
        return geometry
    rows, stages = fitting_slots(
        bits=bits, m_tiles=geometry.m_tiles, n_tiles=geometry.n_tiles, warps=geometry.warps,
        m_warps=geometry.m_warps,
    )  # fmt: skip
    return dataclasses.replace(geometry, shared_rows=rows, smem_stages=stages)


SCHEMA = tables.Schema(
    "dense_mainloop",
    (
        tables.Field(
            "path",
            lambda name, v: check_choice(name, v, PATH_NAMES),
            "generic",
            "the dense dispatch row",
        ),
        tables.Field("m", check_positive_int, 64),
        tables.Field("n", check_positive_int, 28672),
        tables.Field("bits", tables.int_choice(tuple(range(1, 9))), 4),
        tables.Field("pinned", check_bool, False, "an explicit tile was given"),
        tables.Field("capability", check_capability, (9, 0), "(major, minor) of the device"),
        tables.Field(
            "wide_tile_cap",
            tables.int_choice(WIDE_TILE_CAPS),
            WIDE_TILE_CAP,
            "the decoder's tile hint (b12x.formats.DecodeFormat.wide_tile_cap)",
        ),
    ),
    unknown=tables.UNKNOWN_SORTED,
)
DEFAULT_CASE: Mapping[str, Any] = SCHEMA.defaults()

_GENERIC = Condition(
    "path==generic", lambda c: c["path"] == "generic", lambda c: f"path={c['path']}"
)
_NOT_PINNED = Condition("not_pinned", lambda c: not c["pinned"], lambda c: "a tile is pinned")
_SHARED_M = Condition(
    "m>=17", lambda c: c["m"] >= SHARED_MIN_M, lambda c: f"m={c['m']} < {SHARED_MIN_M}"
)
_HOPPER = Condition(
    "capability==9.0",
    lambda c: c["capability"] == WGMMA_CAPABILITY,
    lambda c: f"capability={c['capability']} has no wgmma",
)
_N_256 = Condition(
    "n%256==0",
    lambda c: c["n"] % TENSOR_CTA_N == 0,
    lambda c: f"n={c['n']} is not a multiple of {TENSOR_CTA_N}",
)
_TENSOR_DECODER = Condition(
    "wide_tile_cap>=4",
    lambda c: tensor_core_takes_decoder(c["wide_tile_cap"]),
    lambda c: (
        f"wide_tile_cap={c['wide_tile_cap']} < {TENSOR_CORE_MIN_TILE_CAP}: the decoder "
        "spills in the tensor-core mainloops"
    ),
)
_N_128 = Condition(
    "n%128==0", lambda c: c["n"] % CTA_N == 0, lambda c: f"n={c['n']} is not a multiple of 128"
)


def _row(name: str, description: str, conditions: tuple[Condition, ...], value: Any) -> Row:
    return Row(name, description, SCHEMA, conditions, value)


ROWS: tuple[Row, ...] = (
    _row(
        "off_generic_path",
        "K6 and decode_matmul run no generic GEMM",
        (Condition("path!=generic", lambda c: c["path"] != "generic", lambda c: "path=generic"),),
        None,
    ),
    _row(
        "pinned_tile",
        "a pinned tile fixes the per-warp kernel's geometry",
        (Condition("pinned", lambda c: c["pinned"], lambda c: "no tile is pinned"),),
        None,
    ),
    _row(
        "small_m",
        "M <= 16: one M16 block, the per-warp decode is faster",
        (Condition("m<=16", lambda c: c["m"] < SHARED_MIN_M, lambda c: f"m={c['m']} > 16"),),
        None,
    ),
    _row(
        "n_not_128",
        "the shared geometries cover 128 columns per CTA",
        (Condition("n%128!=0", lambda c: c["n"] % CTA_N != 0, lambda c: "n is a multiple of 128"),),
        None,
    ),
    _row(
        "shared_thin",
        "M <= 32: 4 warps, 32 x 128 per CTA, split 4",
        (
            _GENERIC,
            _NOT_PINNED,
            _SHARED_M,
            _N_128,
            Condition(
                "m<=32", lambda c: c["m"] <= THIN_MAX_M, lambda c: f"m={c['m']} > {THIN_MAX_M}"
            ),
        ),
        lambda c: slots_for(c["bits"], THIN),
    ),
    _row(
        "tensor_core_deep",
        "sm_90, M <= 64: the tensor-core CTA with 4 K16 rows per step, stream-K",
        (
            _GENERIC,
            _NOT_PINNED,
            _SHARED_M,
            _HOPPER,
            _N_256,
            _TENSOR_DECODER,
            Condition(
                "m<=64", lambda c: c["m"] <= DEEP_MAX_M, lambda c: f"m={c['m']} > {DEEP_MAX_M}"
            ),
        ),
        TENSOR_DEEP,
    ),
    _row(
        "tensor_swap",
        "sm_90, M >= 65: swap-AB, weights decoded into the wgmma A registers, stream-K",
        (_GENERIC, _NOT_PINNED, _SHARED_M, _HOPPER, _N_256, _TENSOR_DECODER),
        lambda c: swap_geometry(c["m"]),
    ),
    _row(
        "shared_wide",
        "8 warps, 128 x 128 per CTA, split 1",
        (_GENERIC, _NOT_PINNED, _SHARED_M, _N_128),
        lambda c: slots_for(c["bits"], WIDE),
    ),
)


def explain(case: Mapping[str, Any]) -> Explanation:
    """The row that decides, one reason per row considered, and its :class:`SharedDecode` (or
    ``None`` for the per-warp decode)."""
    return TABLE.explain(case)


def _case(**changes: Any) -> dict:
    return {**DEFAULT_CASE, **changes}


BOUNDARIES: tuple[Boundary, ...] = (
    Boundary("generic_path", _case(), "path", "generic", "decode_matmul", "tensor_core_deep",
             "off_generic_path"),
    Boundary("pinned", _case(), "pinned", False, True, "tensor_core_deep", "pinned_tile"),
    Boundary("shared_min_m", _case(), "m", 16, 17, "small_m", "shared_thin"),
    Boundary("thin_max_m", _case(), "m", 32, 33, "shared_thin", "tensor_core_deep"),
    Boundary("deep_max_m", _case(), "m", 64, 65, "tensor_core_deep", "tensor_swap"),
    Boundary("hopper", _case(), "capability", (9, 0), (8, 0), "tensor_core_deep",
             "shared_wide"),
    Boundary("hopper_large_m", _case(m=128), "capability", (9, 0), (8, 0), "tensor_swap",
             "shared_wide"),
    Boundary("hopper_sm120", _case(), "capability", (9, 0), (12, 0), "tensor_core_deep",
             "shared_wide"),
    Boundary("n_256", _case(), "n", 28672, 28800, "tensor_core_deep", "shared_wide"),
    Boundary("n_256_large_m", _case(m=128), "n", 28672, 28800, "tensor_swap", "shared_wide"),
    Boundary("n_128", _case(capability=(8, 0)), "n", 28672, 28736, "shared_wide",
             "n_not_128"),
    Boundary("tensor_decoder", _case(), "wide_tile_cap", 4, 2, "tensor_core_deep",
             "shared_wide"),
    Boundary("tensor_decoder_large_m", _case(m=128), "wide_tile_cap", 4, 2, "tensor_swap",
             "shared_wide"),
)  # fmt: skip


TABLE = DecisionTable(
    "dense_mainloop",
    "the dense generic GEMM's mainloop: per-warp decode, or shared decode and its geometry",
    SCHEMA,
    ROWS,
    BOUNDARIES,
    refusal="no mainloop row matches",
    current_rows=lambda: ROWS,  # explain reads ROWS at every call (a test may replace it)
)
