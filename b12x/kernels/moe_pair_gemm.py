"""The grouped trellis GEMM over QSRT pair payloads (spec §4.2): :class:`MoePairGemmKernel`.

Layout
------
The launch, liveness, work split, K groups and epilogue follow
:class:`b12x.kernels.moe_gemm.MoeGroupedGemmKernel`, composed from the same pieces rather than
inherited (:func:`~b12x.kernels.moe_gemm.block_liveness`, the :mod:`b12x.kernels.mainloop`
primitives, :func:`~b12x.kernels.moe_gemm.reduce_groups`). A paired spec (``MoeGemmSpec.pair``
set, ``bits`` the base 3) differs in where each tile's rate comes from:

* **FC1, records on the N axis.** One 256-column pair per CTA; warps take their tiles in LLHH
  order (:func:`_n_axis_tiles`), so every warp decodes the same mix of rates and the rate of
  each tile loop is compile-time.
* **FC2, records on the K axis.** The absolute K16 row ``16p + kt`` of A selects the record:
  rows 0..7 of a pair at ``b_lo``, 8..15 at ``b_hi``.
* One :class:`~b12x.kernels.moe_gemm.MainloopBundle` per record rate; every tile calls the
  shared body :func:`b12x.kernels.dense_gemm.decode_and_accumulate` by keyword.
* ``"dynamic"`` reads ``modes[local]`` (0 = P33, 1 = P24) once per live CTA and branches
  CTA-uniformly into two fully specialised bodies.
* **K groups** (``k_split > 1``): a group's slice is ``K/16/k_split`` K16 rows (N axis) or
  whole pairs (K axis); the reduction buffer is allocated once, before a dynamic launch
  branches; the shared decode folds at the same boundaries (:mod:`b12x.kernels.pair_decode`).

Invariants
----------
* Inactive blocks never read ``descriptors``, ``modes`` or ``payload`` and never write ``out``.
* Payload offsets are byte offsets from ``(b_lo, b_hi)``; every index × stride product is 64-bit.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from b12x.abi import abi_entry
from b12x.formats import resolve_format
from b12x.kernels.dense_gemm import decode_and_accumulate
from b12x.kernels.dependent_launch import await_upstream, launch_options
from b12x.kernels.mainloop import (
    accumulate_staged,
    lane_coords,
    load_tile_words,
    ring_word_pointers,
    routed_a_pointers,
    routed_epilogue,
    stage_rows,
    tile_row_words,
    zero_accumulators,
)
from b12x.kernels.moe_gemm import (
    DYNAMIC,
    LOCAL_MASK,
    PAIR_KINDS,
    RECORD_TILES,
    TIER_SHIFT,
    MainloopBundle,
    MoeGemmSpec,
    block_liveness,
    reduce_buffer,
    reduce_groups,
    shared_block_epilogue,
    shared_slot_source,
    shared_unit_live,
)
from b12x.kernels.pair_decode import PairWgmmaDecode
from b12x.kernels.trellis_decode import lane_ring_start

__all__ = ["MoePairGemmKernel"]


@dataclasses.dataclass(frozen=True)
class _Records:
    """Per-record (0 = ``b_lo``, 1 = ``b_hi``) inputs of one body: rate, the lane's first ring
    word and window offset, the mainloop bundle; plus the pair's u32 words per K16 row."""

    rates: tuple
    firsts: tuple
    offs: tuple
    bundles: tuple
    pair_words: int


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


class MoePairGemmKernel:
    """The grouped GEMM over QSRT pair payloads (spec §4.2): FC1 on the N axis, FC2 on K.

    Arguments are the grouped kernel's plus ``modes`` (int32 ``[E]``, 0 = P33, 1 = P24), read
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
        self.spec = spec
        self.n_tiles = spec.n_tiles
        self.warps = spec.warps
        self.m_tiles = spec.m_tiles
        self.depth = spec.depth
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
        #: Per body, its ``wgmma`` shared decode (``spec.m_warps`` set), else None.
        self.shared_bodies = None
        if spec.m_warps:
            self.shared_bodies = tuple(
                PairWgmmaDecode(
                    tuple(resolve_format(spec.codebook, rate) for rate in rates),
                    rates,
                    axis=spec.rate_axis,
                    layout_bits=spec.shared_bits,
                    bf16=spec.bf16,
                    m_tiles=spec.m_tiles,
                    n_tiles=spec.n_tiles,
                    warps=spec.warps,
                    rows=spec.shared_rows,
                    stages=spec.smem_stages,
                    k_split=spec.k_split,
                )  # fmt: skip
                for rates in self.body_rates
            )

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
            block=(self.spec.cta_threads, 1, 1),
            smem=self.spec.smem_bytes,
            stream=stream,
            **launch_options(),
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
        await_upstream()
        smem = None  # both bodies of a dynamic launch share one allocation (the spec's layout)
        if cutlass.const_expr(self.shared_bodies is not None):
            smem = self.shared_bodies[0].allocate()
        elif cutlass.const_expr(self.spec.k_split > 1):
            smem = reduce_buffer(self.spec)
        tid = cute.arch.thread_idx()[0]
        bx, by, _ = cute.arch.block_idx()
        row_base = by * self.spec.block_size
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
                            bx=bx, tid=tid, out_col_word=out_col_word, body=1, smem=smem,
                        )  # fmt: skip
                    else:
                        self._pair_tile(
                            a=a, payload=payload, out=out, route_rows=route_rows,
                            lut_addr=lut_addr, payload_expert=payload_expert, row_base=row_base,
                            bx=bx, tid=tid, out_col_word=out_col_word, body=0, smem=smem,
                        )  # fmt: skip
                else:
                    self._pair_tile(
                        a=a, payload=payload, out=out, route_rows=route_rows, lut_addr=lut_addr,
                        payload_expert=payload_expert, row_base=row_base, bx=bx, tid=tid,
                        out_col_word=out_col_word, body=0, smem=smem,
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
        smem=None,
    ):
        """One live block with the rates of body ``body`` (compile-time); ``smem``: the shared
        decode's allocation, or the per-warp K reduction's buffer (None without a K split)."""
        if cutlass.const_expr(self.shared_bodies is not None):
            self._shared_pair_tile(a=a, payload=payload, out=out, route_rows=route_rows,
                                   lut_addr=lut_addr, payload_expert=payload_expert,
                                   row_base=row_base, bx=bx, tid=tid, out_col_word=out_col_word,
                                   body=body, smem=smem)  # fmt: skip
        else:
            self._per_warp_pair_tile(a=a, payload=payload, out=out, route_rows=route_rows,
                                     lut_addr=lut_addr, payload_expert=payload_expert,
                                     row_base=row_base, bx=bx, tid=tid,
                                     out_col_word=out_col_word, body=body, red=smem)  # fmt: skip

    @cute.jit
    def _shared_pair_tile(
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
        smem,
    ):
        """One route block of body ``body`` through the pair ``wgmma`` shared decode
        (:mod:`b12x.kernels.pair_decode`): the slots gathered, each K16 row decoded once at its
        records' rates, then the scatter epilogue of the CTA's 16 N16 tiles."""
        shared = self.shared_bodies[body]
        lay = shared.layout
        b_lo, b_hi = self.body_rates[body]
        lane, warp, r, g = lane_coords(tid)
        k_rows = a.shape[1] // 8
        n_rows = a.shape[0]
        first_lo, off_lo = lane_ring_start(lane, b_lo)
        first_hi, off_hi = lane_ring_start(lane, b_hi)
        pay = payload.iterator.toint()
        pair_bytes = 4 * self.spec.pair_words

        if cutlass.const_expr(self.n_axis):
            # [E·K/16, pairs, 64·s]: K16 row kt of the expert holds every pair's run
            row_bytes = Int64(payload.shape[1]) * pair_bytes
            pay_cta = pay + Int64(payload_expert) * Int64(k_rows) * row_bytes
            pay_cta = pay_cta + Int64(bx) * pair_bytes
        else:
            # [E·pairs, N/16, 64·s]: per pair the record planes, row t of record rc at t·plane
            n16 = payload.shape[1]
            pair_run = Int64(n16) * pair_bytes
            plane_lo = Int64(n16) * (32 * b_lo)
            plane_hi = Int64(n16) * (32 * b_hi)
            expert = pay + Int64(payload_expert) * Int64(k_rows // 16) * pair_run
            tile0 = Int64(bx) * lay.cta_tiles
            row_bytes = (
                expert + tile0 * (32 * b_lo),
                expert + plane_lo * RECORD_TILES + tile0 * (32 * b_hi),
                pair_run,
                plane_lo,
                plane_hi,
            )
            pay_cta = Int64(0)
        lanes = shared.setup(
            tid=tid, lane=lane, warp=warp, g=g, r=r, first=(first_lo, first_hi), a=a,
            a_row_source=shared_slot_source(route_rows, row_base, n_rows), pay_cta=pay_cta,
            smem=smem,
        )  # fmt: skip
        live = shared_unit_live(shared, route_rows, row_base, n_rows, warp)
        acc = shared.run(
            lanes=lanes, k_begin=0, k_end=k_rows, row_bytes=row_bytes, lut_addr=lut_addr,
            off=(off_lo, off_hi), live_rows=live, slice_rows=k_rows // self.spec.k_split,
        )  # fmt: skip
        shared_block_epilogue(
            shared, self.spec, out=out, acc=acc, route_rows=route_rows,
            warp_row0=row_base + warp * (16 * self.m_tiles), n_rows=n_rows,
            tile0=bx * lay.cta_tiles, r=r, g=g, out_col_word=out_col_word,
        )  # fmt: skip

    @cute.jit
    def _per_warp_pair_tile(
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
        red=None,
    ):
        """One live block of body ``body`` through the per-warp pair mainloop: warp ``group·
        warps + c`` runs column warp ``c`` over K slice ``group``; with a K split the groups
        fold into group 0 (``red``: the reduction buffer), which alone stores."""
        b_lo, b_hi = self.body_rates[body]
        lane, warp, r, g = lane_coords(tid)
        col_warp = warp % self.warps
        group = warp // self.warps
        acc = zero_accumulators(self.m_tiles, self.n_tiles)
        a_ptrs, rows, n_rows = routed_a_pointers(a, route_rows, row_base, self.m_tiles, g, r)
        first_lo, off_lo = lane_ring_start(lane, b_lo)
        first_hi, off_hi = lane_ring_start(lane, b_hi)
        rec = _Records(
            rates=(b_lo, b_hi),
            firsts=(first_lo, first_hi),
            offs=(off_lo, off_hi),
            bundles=(self.rate_bundles[b_lo], self.rate_bundles[b_hi]),
            pair_words=64 * (b_lo + b_hi),
        )
        pay = payload.iterator.toint()
        if cutlass.const_expr(self.n_axis):
            col_word = self._n_axis_body(a=a, payload=payload, pay=pay, a_ptrs=a_ptrs, acc=acc,
                                         rec=rec, lut_addr=lut_addr,
                                         payload_expert=payload_expert, bx=bx, warp=col_warp,
                                         group=group, r=r,
                                         out_col_word=out_col_word)  # fmt: skip
        else:
            col_word = self._k_axis_body(a=a, payload=payload, pay=pay, a_ptrs=a_ptrs, acc=acc,
                                         rec=rec, lut_addr=lut_addr,
                                         payload_expert=payload_expert, bx=bx, warp=col_warp,
                                         group=group, r=r,
                                         out_col_word=out_col_word)  # fmt: skip
        if cutlass.const_expr(self.spec.k_split > 1):
            reduce_groups(acc, red, group, col_warp * 32 + lane, self.spec)
        if group == 0:
            routed_epilogue(out, acc, rows, n_rows, col_word, self.m_tiles, self.n_tiles,
                            self.spec.bf16)  # fmt: skip

    def _accumulate_rows(self, staged, rec: _Records, record_of, lut_addr, acc) -> None:
        """Decode and accumulate staged rows; ``record_of(nt)`` is tile ``nt``'s record."""
        accumulate_staged(
            staged,
            self.n_tiles,
            lambda a_frags, words, nt: self._accumulate(
                rec.bundles[record_of(nt)], lut_addr, a_frags, words, rec.offs[record_of(nt)],
                acc, nt,
            ),
        )  # fmt: skip

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

    @cute.jit
    def _n_axis_body(
        self, *, a, payload, pay, a_ptrs, acc, rec, lut_addr, payload_expert, bx, warp, group, r,
        out_col_word,
    ):  # fmt: skip
        """FC1: one pair per CTA; K16 row kt of the expert holds ``pairs`` pair spans; the
        group's K16 rows ``group·S + [0, S)``. Returns the epilogue's column-word map."""
        b_lo, b_hi = rec.rates
        k_rows = a.shape[1] // 8
        slice_rows = k_rows // self.spec.k_split  # a multiple of 8 (K % 128·k_split == 0)
        k_begin = group * slice_rows
        half_tiles = self.n_tiles // 2
        row_bytes = Int64(payload.shape[1]) * (4 * rec.pair_words)
        pair_base = pay + Int64(payload_expert) * Int64(k_rows) * row_bytes
        pair_base = pair_base + Int64(bx) * (4 * rec.pair_words)
        slab = Int64(warp) * half_tiles
        lo_base = pair_base + slab * (32 * b_lo)
        hi_base = pair_base + RECORD_TILES * 32 * b_lo + slab * (32 * b_hi)
        ptrs = (
            ring_word_pointers(lo_base, rec.firsts[0], b_lo),
            ring_word_pointers(hi_base, rec.firsts[1], b_hi),
        )
        tiles = _n_axis_tiles(self.n_tiles)
        for kt0 in cutlass.range(k_begin, k_begin + slice_rows, self.depth):
            staged = stage_rows(
                self.depth,
                lambda d, kt0=kt0: self._n_row_words(
                    ptrs, Int64(kt0 + d) * row_bytes, tiles, rec.rates
                ),
                a_ptrs,
                lambda d, kt0=kt0: Int64(kt0 + d) * 32,
                self.m_tiles,
            )
            self._accumulate_rows(staged, rec, lambda nt: tiles[nt][0], lut_addr, acc)
        col0 = bx * 128 + warp * (8 * half_tiles) + r + out_col_word
        return lambda nt, nb: col0 + (tiles[nt][2] + nb * 4)

    def _n_row_words(self, ptrs, row_off, tiles, rates) -> list:
        """LLHH ring words of one K16 row: tile ``nt`` is tile ``j`` of record ``rec``."""
        words = []
        for nt in range(self.n_tiles):
            rec, j, _ = tiles[nt]
            words.append(load_tile_words(ptrs[rec], row_off, j, rates[rec]))
        return words

    @cute.jit
    def _k_axis_body(
        self, *, a, payload, pay, a_ptrs, acc, rec, lut_addr, payload_expert, bx, warp, group, r,
        out_col_word,
    ):  # fmt: skip
        """FC2: pairs along the reduction; record 0 = absolute K16 rows 16p + 0..7; the group's
        pairs ``group·P + [0, P)``. Returns the epilogue's column-word map."""
        b_lo, b_hi = rec.rates
        pairs = a.shape[1] // 128
        group_pairs = pairs // self.spec.k_split  # whole pairs (K % 256·k_split == 0)
        p_begin = group * group_pairs
        n16 = payload.shape[1]
        tile0 = (bx * self.warps + warp) * self.n_tiles
        pair_bytes = Int64(n16) * (4 * rec.pair_words)
        plane_rows = (Int64(n16) * (32 * b_lo), Int64(n16) * (32 * b_hi))
        expert_addr = pay + Int64(payload_expert) * Int64(pairs) * pair_bytes
        lo_base = expert_addr + Int64(tile0) * (32 * b_lo)
        hi_base = expert_addr + plane_rows[0] * RECORD_TILES + Int64(tile0) * (32 * b_hi)
        ptrs = (
            ring_word_pointers(lo_base, rec.firsts[0], b_lo),
            ring_word_pointers(hi_base, rec.firsts[1], b_hi),
        )
        for p in cutlass.range(p_begin, p_begin + group_pairs):
            pair_off = Int64(p) * pair_bytes
            for rc in cutlass.range_constexpr(2):
                for kt0 in cutlass.range(0, RECORD_TILES, self.depth):
                    staged = self._k_rows(ptrs, pair_off, plane_rows, rec.rates, rc, p, kt0, a_ptrs)
                    self._accumulate_rows(staged, rec, lambda nt, rc=rc: rc, lut_addr, acc)
        return lambda nt, nb: ((tile0 + nt) * 16 + nb * 8 + 2 * r) // 2 + out_col_word

    def _k_rows(self, ptrs, pair_off, plane_rows, rates, rc: int, p, kt0, a_ptrs) -> list:
        """Stage ``depth`` K16 rows of record ``rc`` of pair ``p``: absolute K16 row
        ``16p + 8rc + kt0 + d`` of A against row ``kt0 + d`` of the record's plane."""
        return stage_rows(
            self.depth,
            lambda d: tile_row_words(
                ptrs[rc], pair_off + Int64(kt0 + d) * plane_rows[rc], rates[rc], self.n_tiles
            ),
            a_ptrs,
            lambda d: (Int64(p) * 16 + (rc * RECORD_TILES) + Int64(kt0 + d)) * 32,
            self.m_tiles,
        )
