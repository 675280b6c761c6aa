"""The grouped trellis GEMM over QSRT pair payloads (spec §4.2): :class:`MoePairGemmKernel`.

Layout
------
The launch, liveness, work split and epilogue are those of
:class:`b12x.kernels.moe_gemm.MoeGroupedGemmKernel` (see that module); a paired spec
(``MoeGemmSpec.pair`` set, ``bits`` the base 3, ``k_split = 1``) differs in where each tile's
rate comes from:

* **FC1, records on the N axis.** One 256-column pair per CTA; warps take their tiles in LLHH
  order (:func:`_n_axis_tiles`), so every warp decodes the same mix of rates and the rate of
  each tile loop is compile-time.
* **FC2, records on the K axis.** The absolute K16 row ``16p + kt`` of A selects the record:
  rows 0..7 of a pair at ``b_lo``, 8..15 at ``b_hi``.
* One :class:`~b12x.kernels.moe_gemm.MainloopBundle` per record rate; every tile calls the
  shared body :func:`b12x.kernels.dense_gemm.decode_and_accumulate` by keyword.
* ``"dynamic"`` reads ``modes[local]`` (0 = P33, 1 = P24) once per live CTA and branches
  CTA-uniformly into two fully specialised bodies.

Invariants
----------
* Inactive blocks never read ``descriptors``, ``modes`` or ``payload`` and never write ``out``.
* Payload offsets are byte offsets from ``(b_lo, b_hi)``; every index × stride product is 64-bit.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from b12x.abi import abi_entry
from b12x.formats import resolve_format
from b12x.kernels import ptx
from b12x.kernels.dense_gemm import decode_and_accumulate
from b12x.kernels.moe_gemm import (
    DYNAMIC,
    LOCAL_MASK,
    PAIR_KINDS,
    RECORD_TILES,
    TIER_SHIFT,
    MainloopBundle,
    MoeGemmSpec,
    MoeGroupedGemmKernel,
    block_liveness,
)
from b12x.kernels.trellis_decode import lane_ring_start, ring_words_per_lane

__all__ = ["MoePairGemmKernel"]


def _lane_word_ptrs(base, first, bits: int) -> list:
    """Byte pointers of the lane's ring words ``first, first+1, ...`` (mod ``8·bits``) of the
    tile whose ring starts at byte address ``base`` (Int64); plain Python, inlined at trace."""
    ring = 8 * bits
    ptrs = []
    for i in range(ring_words_per_lane(bits)):
        idx = first + i
        idx = Int32(cutlass.select_(idx >= ring, idx - ring, idx))
        ptrs.append(base + Int64(idx) * 4)
    return ptrs


def _load_tile_words(ptrs: list, row_off, tile: int, bits: int) -> list:
    """The lane's ring words of tile ``tile`` (an immediate ``tile·32·bits`` bytes further)."""
    return [Uint32(ptx.ld_global_nc_u32_imm(p + row_off, tile * 32 * bits)) for p in ptrs]


def _n_axis_tiles(n_tiles: int) -> list[tuple[int, int, int]]:
    """LLHH: ``(record, tile within the warp's record slab, output word offset)`` per ``nt``.

    Warp w of a one-pair CTA owns record-0 tiles ``w·h + [0, h)`` and record-1 tiles
    ``w·h + [0, h)`` (h = n_tiles/2): the first h of its ``nt`` are low, the rest high, so
    every warp decodes the same mix of rates and the rate of each ``nt`` is compile-time. The
    word offset is the tile's column inside the pair (record 1 starts at column 128) over 2,
    relative to ``8·w·h``.
    """
    half = n_tiles // 2
    out = []
    for nt in range(n_tiles):
        record, j = (0, nt) if nt < half else (1, nt - half)
        out.append((record, j, 64 * record + 8 * j))
    return out


class MoePairGemmKernel(MoeGroupedGemmKernel):
    """The grouped GEMM over QSRT pair payloads (spec §4.2): FC1 on the N axis, FC2 on K.

    Arguments are the unpaired kernel's plus ``modes`` (int32 ``[E]``, 0 = P33, 1 = P24), read
    once per live CTA at ``modes[local]`` only for ``pair == "dynamic"`` (a static kind never
    reads it; the host passes any int32 tensor there). The mode picks one of two fully
    specialised bodies by a CTA-uniform branch, so every inner loop has compile-time rates.

    Payload views (int32, every ``(b_lo, b_hi)`` of a launch has the same ``s = b_lo + b_hi``):

    * N axis: ``[E_payload·K/16, pairs, 64·s]``: per expert and K16 row, the prepared order
      ``[pair p: record 0 (8 tiles × 8·b_lo) ‖ record 1 (8 tiles × 8·b_hi)]``. One CTA per
      pair (``grid_x = pairs``), warps in LLHH order (:func:`_n_axis_tiles`).
    * K axis: ``[E_payload·pairs, N/16, 64·s]``: per expert, pair-major ``[record 0 plane
      (8 K16 rows × N/16 tiles × 8·b_lo) ‖ record 1 plane (8 × N/16 × 8·b_hi)]`` (the view's
      last two dims only size the pair; the planes are read by byte offsets). K16 row
      ``16p + kt`` of A is the absolute row: ``kt < 8`` reads record 0 at ``b_lo``, rows 8..15
      record 1 at ``b_hi``.
    """

    def __init__(self, spec: MoeGemmSpec):
        super().__init__(spec)
        self.body_rates = tuple(PAIR_KINDS[kind] for kind in spec.body_kinds)
        self.rate_bundles = {
            rate: MainloopBundle(
                fmt=resolve_format(spec.codebook, rate),
                bits=rate,
                bf16=spec.bf16,
                m_tiles=spec.m_tiles,
            )
            for rates in self.body_rates
            for rate in rates
        }
        self.dynamic = spec.pair == DYNAMIC
        self.n_axis = spec.rate_axis == "n"

    @abi_entry
    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        block_expert_ids: cute.Tensor,
        route_count: cute.Tensor,
        route_rows: cute.Tensor,
        descriptors: cute.Tensor,
        modes: cute.Tensor,
        lut_addr: Int64,
        tier: Int32,
        expert_base: Int32,
        out_col_word: Int32,
        stream,
    ):
        grid_x = payload.shape[1]
        if cutlass.const_expr(not self.n_axis):
            grid_x = payload.shape[1] // (self.n_tiles * self.warps)
        self.kernel(
            a,
            payload,
            out,
            block_expert_ids,
            route_count,
            route_rows,
            descriptors,
            modes,
            lut_addr,
            tier,
            expert_base,
            out_col_word,
        ).launch(
            grid=(grid_x, block_expert_ids.shape[0], 1),
            block=(32 * self.warps, 1, 1),
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        block_expert_ids: cute.Tensor,
        route_count: cute.Tensor,
        route_rows: cute.Tensor,
        descriptors: cute.Tensor,
        modes: cute.Tensor,
        lut_addr: Int64,
        tier: Int32,
        expert_base: Int32,
        out_col_word: Int32,
    ):
        tid = cute.arch.thread_idx()[0]
        bx, by, _ = cute.arch.block_idx()
        row_base = by * (16 * self.m_tiles)
        expert, live = block_liveness(block_expert_ids, route_count, descriptors, by, row_base)
        if live == 1:
            descriptor = descriptors[expert]
            if (descriptor >> TIER_SHIFT) == tier:
                local = descriptor & LOCAL_MASK
                payload_expert = expert_base + local
                if cutlass.const_expr(self.dynamic):
                    if modes[local] == 1:
                        self._pair_tile(
                            a=a, payload=payload, out=out, route_rows=route_rows,
                            lut_addr=lut_addr, payload_expert=payload_expert, row_base=row_base,
                            bx=bx, tid=tid, out_col_word=out_col_word, body=1,
                        )  # fmt: skip
                    else:
                        self._pair_tile(
                            a=a, payload=payload, out=out, route_rows=route_rows,
                            lut_addr=lut_addr, payload_expert=payload_expert, row_base=row_base,
                            bx=bx, tid=tid, out_col_word=out_col_word, body=0,
                        )  # fmt: skip
                else:
                    self._pair_tile(
                        a=a, payload=payload, out=out, route_rows=route_rows, lut_addr=lut_addr,
                        payload_expert=payload_expert, row_base=row_base, bx=bx, tid=tid,
                        out_col_word=out_col_word, body=0,
                    )  # fmt: skip

    @cute.jit
    def _pair_tile(
        self,
        *,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        route_rows: cute.Tensor,
        lut_addr: Int64,
        payload_expert: Int32,
        row_base: Int32,
        bx: Int32,
        tid: Int32,
        out_col_word: Int32,
        body: cutlass.Constexpr,
    ):
        """One live block with the rates of body ``body`` (compile-time)."""
        b_lo, b_hi = self.body_rates[body]
        lane = tid % 32
        warp = tid // 32
        r = lane % 4
        g = lane // 4
        acc = cute.make_rmem_tensor((self.m_tiles * self.n_tiles * 8,), Float32)
        for i in cutlass.range_constexpr(self.m_tiles * self.n_tiles * 8):
            acc[i] = Float32(0.0)

        a_base = a.iterator.toint()
        a_row_bytes = Int64(a.shape[1]) * 4
        n_rows = a.shape[0]
        a_ptrs = []
        rows = []
        for mt in cutlass.range_constexpr(self.m_tiles):
            for half in cutlass.range_constexpr(2):
                route = route_rows[row_base + mt * 16 + half * 8 + g]
                rows.append(route)  # >= n_rows: a padding slot (the sentinel), never stored
                safe = Int32(cutlass.select_(route < n_rows, route, Int32(0)))
                a_ptrs.append(a_base + Int64(safe) * a_row_bytes + r * 4)
        first_lo, off_lo = lane_ring_start(lane, b_lo)
        first_hi, off_hi = lane_ring_start(lane, b_hi)
        offs = (off_lo, off_hi)
        rates = (b_lo, b_hi)
        bundles = (self.rate_bundles[b_lo], self.rate_bundles[b_hi])
        pay = payload.iterator.toint()
        pair_words = 64 * (b_lo + b_hi)

        if cutlass.const_expr(self.n_axis):
            # N axis: one pair per CTA; K16 row kt of the expert holds `pairs` pair spans.
            k_rows = a.shape[1] // 8
            half_tiles = self.n_tiles // 2
            row_bytes = Int64(payload.shape[1]) * (4 * pair_words)
            pair_base = pay + Int64(payload_expert) * Int64(k_rows) * row_bytes
            pair_base = pair_base + Int64(bx) * (4 * pair_words)
            slab = Int64(warp * half_tiles)
            lo_base = pair_base + slab * (32 * b_lo)
            hi_base = pair_base + RECORD_TILES * 32 * b_lo + slab * (32 * b_hi)
            ptrs = (
                _lane_word_ptrs(lo_base, first_lo, b_lo),
                _lane_word_ptrs(hi_base, first_hi, b_hi),
            )
            tiles = _n_axis_tiles(self.n_tiles)
            for kt0 in cutlass.range(0, k_rows, self.depth):
                staged = []
                for d in cutlass.range_constexpr(self.depth):
                    row_off = Int64(kt0 + d) * row_bytes
                    words = []
                    for nt in cutlass.range_constexpr(self.n_tiles):
                        rec, j, _ = tiles[nt]
                        words.append(_load_tile_words(ptrs[rec], row_off, j, rates[rec]))
                    staged.append((words, self._a_frags(a_ptrs, Int64(kt0 + d) * 32)))
                for d in cutlass.range_constexpr(self.depth):
                    words, a_frags = staged[d]
                    for nt in cutlass.range_constexpr(self.n_tiles):
                        rec = tiles[nt][0]
                        self._accumulate(bundles[rec], lut_addr, a_frags, words[nt], offs[rec],
                                         acc, nt)  # fmt: skip
            col0 = bx * 128 + warp * (8 * half_tiles) + r + out_col_word
            for mt in cutlass.range_constexpr(self.m_tiles):
                for half in cutlass.range_constexpr(2):
                    row = rows[2 * mt + half]
                    if row < n_rows:
                        for nt in cutlass.range_constexpr(self.n_tiles):
                            for nb in cutlass.range_constexpr(2):
                                base = nt * self.m_tiles * 8 + mt * 8 + nb * 4 + 2 * half
                                col_word = col0 + (tiles[nt][2] + nb * 4)
                                self._store(out, row, col_word, acc[base], acc[base + 1])
        else:
            # K axis: pairs along the reduction; record 0 = absolute K16 rows 16p + 0..7.
            pairs = a.shape[1] // 128
            n16 = payload.shape[1]
            tile0 = (bx * self.warps + warp) * self.n_tiles
            pair_bytes = Int64(n16) * (4 * pair_words)
            plane_rows = (Int64(n16) * (32 * b_lo), Int64(n16) * (32 * b_hi))
            expert_addr = pay + Int64(payload_expert) * Int64(pairs) * pair_bytes
            lo_base = expert_addr + Int64(tile0) * (32 * b_lo)
            hi_base = expert_addr + plane_rows[0] * RECORD_TILES + Int64(tile0) * (32 * b_hi)
            ptrs = (
                _lane_word_ptrs(lo_base, first_lo, b_lo),
                _lane_word_ptrs(hi_base, first_hi, b_hi),
            )
            for p in cutlass.range(pairs):
                pair_off = Int64(p) * pair_bytes
                for rec in cutlass.range_constexpr(2):
                    for kt0 in cutlass.range(0, RECORD_TILES, self.depth):
                        staged = []
                        for d in cutlass.range_constexpr(self.depth):
                            row_off = pair_off + Int64(kt0 + d) * plane_rows[rec]
                            words = []
                            for nt in cutlass.range_constexpr(self.n_tiles):
                                words.append(_load_tile_words(ptrs[rec], row_off, nt, rates[rec]))
                            k16 = Int64(p) * 16 + (rec * RECORD_TILES) + Int64(kt0 + d)
                            staged.append((words, self._a_frags(a_ptrs, k16 * 32)))
                        for d in cutlass.range_constexpr(self.depth):
                            words, a_frags = staged[d]
                            for nt in cutlass.range_constexpr(self.n_tiles):
                                self._accumulate(bundles[rec], lut_addr, a_frags, words[nt],
                                                 offs[rec], acc, nt)  # fmt: skip
            for mt in cutlass.range_constexpr(self.m_tiles):
                for half in cutlass.range_constexpr(2):
                    row = rows[2 * mt + half]
                    if row < n_rows:
                        for nt in cutlass.range_constexpr(self.n_tiles):
                            for nb in cutlass.range_constexpr(2):
                                base = nt * self.m_tiles * 8 + mt * 8 + nb * 4 + 2 * half
                                col_word = ((tile0 + nt) * 16 + nb * 8 + 2 * r) // 2 + out_col_word
                                self._store(out, row, col_word, acc[base], acc[base + 1])

    def _a_frags(self, a_ptrs: list, a_off) -> list:
        """A fragments of one K16 row (byte offset ``a_off`` from row 0) for every M16 block."""
        frags = []
        for mt in range(self.m_tiles):
            frag = []
            for q in range(4):
                ptr = a_ptrs[2 * mt + q % 2] + a_off
                frag.append(Uint32(ptx.ld_global_nc_u32_imm(ptr, 16 * (q // 2))))
            frags.append(frag)
        return frags

    def _accumulate(self, bundle, lut_addr, a_frags, words, lane_off, acc, nt: int) -> None:
        """The shared mainloop body for N16 tile ``nt`` at the bundle's record rate."""
        decode_and_accumulate(
            fmt=bundle.fmt,
            bits=bundle.bits,
            bf16=bundle.bf16,
            lut_in_smem=bundle.lut_in_smem,
            lut_addr=lut_addr,
            a_frags=a_frags,
            words=words,
            lane_off=lane_off,
            acc=acc,
            acc_base=nt * self.m_tiles * 8,
            m_tiles=bundle.m_tiles,
        )

    def _store(self, out, row, col_word, lo, hi) -> None:
        if self.spec.bf16:
            out[row, col_word] = Int32(ptx.f32x2_to_bfloat2(lo, hi))
        else:
            out[row, col_word] = Int32(ptx.f32x2_to_half2(lo, hi))
