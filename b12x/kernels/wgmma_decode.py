"""The shared decode on Hopper tensor cores: decode each K16 row once, multiply with ``wgmma``.

The same mainloop as :class:`b12x.kernels.shared_decode.SharedDecodeMainloop` (cp.async slots, one
barrier per step, every warp decodes its ``n_tiles`` N16 tiles of the next step while the current
one is multiplied) with a different consumer: instead of each warp issuing ``mma.sync`` from
fragments, each *warpgroup* (4 warps) issues asynchronous ``wgmma`` over the whole CTA width, both
operands read from shared memory (:mod:`b12x.kernels.wgmma`). The MMA of step ``s`` runs on the
tensor cores while the same warps decode step ``s + 1`` on the ALUs.

Geometry: Every warp multiplies (``m_warps == warps``, a multiple of 4): warp ``w`` owns CTA rows
``16·m_tiles·w ..`` (the shared decode's ``wm = w``, ``wn = 0``), so the per-warp epilogues apply
unchanged; the CTA covers ``cta_tiles = n_tiles·warps`` N16 tiles, one ``wgmma`` of ``N =
16·cta_tiles`` (<= 256) per warpgroup, M16 block and K16 row. Warpgroup ``v`` runs ``m_tiles`` MMAs
of 64 rows: its *A tile* ``t = v·m_tiles + mt`` holds rows ``16·m_tiles·w + 16·mt ..`` of its warps
``w = 4v + q`` (q = 0..3), as the accumulator layout wants (warp q of the warpgroup owns rows 16q..
of the MMA).

**Decode-only helper warps** (the dense GEMM only; ``m_warps < warps``): every warp still decodes
its ``n_tiles`` N16 tiles, but only warps ``0 .. m_warps - 1`` multiply and own rows; warps
``m_warps ..`` run :meth:`WgmmaDecodeMainloop.run` with ``multiply=False`` (the same copies, fences
and one CTA barrier per step, no accumulators, no MMAs). The kernel splits the roles
warpgroup-uniformly and moves registers between them with ``setmaxnreg``
(:func:`~b12x.kernels.shared_layout.helper_registers`: at 16 warps, 184 for a multiplying thread and
72 for a helper, from the launch's 128), so a CTA of 128 x 256 decodes with 16 warps instead of 8
while keeping its 128 accumulators per multiplying thread. ptxas sizes one instruction's operands by
the launch's register count (128 at 512 threads; an m64n256 fp32 ``wgmma`` needs 154), so the helper
geometries issue the CTA width as m64n128 ``wgmma`` s (:data:`HELPER_MMA_N`); each output element
still gets one K16 product per instruction, in K order. Twice the decoding warps did not make the
step faster (docs/evidence/dense-tensor-core-deep.md), so the dense table does not plan it; it is
kept as a GPU-tested geometry for the next experiment.

Shared memory (the :class:`~b12x.kernels.shared_layout.SharedDecodeLayout` byte counts):
* **A region** of a K16 row: A tiles of 2048 B (64 rows x 32 B), tile ``t`` at ``2048·t``, each in
  core matrices (:mod:`b12x.kernels.wgmma`): row ``i`` of the tile, k-half ``h`` at ``256·(i // 8) +
  128·h + 16·(i % 8)`` (:meth:`WgmmaDecodeMainloop._a_chunk_offset`).
* **Fragment buffers**: a K16 row's ``cta_tiles`` decoded tiles of 512 B, each its four core
  matrices in ``(n-block, k-half)`` order (one ``stmatrix.x4`` per lane and tile): the row is one
  K-major ``N x 16`` operand with LBO 128, SBO 256.

Ordering per step ``s``: ``wgmma.wait_group 0`` (this warpgroup's MMAs of step ``s - 1`` are done,
so their slot and buffer may be reused), ``cp.async.wait_group``, ``fence.proxy.async`` (this
thread's decoded tiles and landed copies become visible to the MMA's async proxy), the CTA barrier,
the refill, then the MMAs of step ``s`` (``wgmma.fence`` ... ``commit_group``), then the decode of
step ``s + 1``. A warpgroup whose rows are all dead skips its MMAs (the caller's ``live_rows`` must
be uniform over the warpgroup: :meth:`live_row0`).

Summation order: within an output element, K16 rows in order, fp32, and with ``k_split`` > 1 the
shared decode's K-slice fold (the MMAs of a slice's last step are waited for, then folded): the same
order as the ``mma.sync`` mainloops. A K16 product is summed inside the tensor core; on the H200
``wgmma`` and ``mma.sync`` give bit-identical results (measured by
``tests/b12x/test_dense_wgmma_gpu.py``; PTX does not promise it, so that test watches it).

Rows past the end of the K range (the last unrolled iteration, a split's tail) are still
decoded and multiplied: their payload and activations are zero-filled copies, so their products
are exact zeros (every codebook decodes a zero payload to finite weights). With the
``mma.sync`` mainloop's per-row K tests around the prologue decode, the step decodes and the
MMAs, ptxas serialized the MMAs (remark C7520, "WG.AR in divergent path"; a CPU compile check
fails on it); without them, and with the warpgroup-uniform ``live_rows`` branch, it does not.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Uint32

from b12x.kernels import ptx, wgmma
from b12x.kernels.mainloop import zero_accumulators
from b12x.kernels.shared_decode import SharedDecodeMainloop
from b12x.kernels.shared_layout import (
    A_BLOCK_BYTES,
    FRAG_TILE_BYTES,
    WARPGROUP,
    check_wgmma_geometry,
    helper_registers,
)
from b12x.kernels.trellis_decode import decode_states_to_half2x4, lane_windows

__all__ = ["A_TILE_BYTES", "WgmmaDecodeMainloop"]

#: Bytes of one 64-row A tile in one K16 row.
A_TILE_BYTES = 4 * A_BLOCK_BYTES
#: Widest ``wgmma`` a geometry with decode-only helper warps issues (``mma_n``).
HELPER_MMA_N = 128


class WgmmaDecodeMainloop(SharedDecodeMainloop):
    """One ``wgmma`` shared-decode geometry (module docstring); built at trace time."""

    def __init__(self, fmt, bits: int, *, bf16: bool, m_tiles: int, n_tiles: int, warps: int,
                 rows: int, stages: int, k_split: int = 1, m_warps: int | None = None):  # fmt: skip
        m_warps = warps if m_warps is None else m_warps
        check_wgmma_geometry(n_tiles=n_tiles, warps=warps, m_warps=m_warps, helpers=True)
        if m_warps < warps and k_split > 1:
            raise ValueError("k_split: a geometry with decode-only helper warps has no K split")
        super().__init__(
            fmt, bits, bf16=bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps, m_warps=m_warps,
            rows=rows, stages=stages, k_split=k_split,
        )  # fmt: skip
        #: Columns of one ``wgmma`` (the CTA width).
        self.n = 16 * self.layout.cta_tiles
        #: Decode-only helper warps (warps ``m_warps ..``), 0 when every warp multiplies.
        self.helpers = warps - m_warps
        #: Columns of one issued ``wgmma``: the CTA width, or with helpers at most
        #: :data:`HELPER_MMA_N` (ptxas sizes an instruction's operands by the launch's register
        #: count, 128 at 16 warps, and an m64n256 takes 154; the fp32 order is the same).
        self.mma_n = min(self.n, HELPER_MMA_N) if self.helpers else self.n
        #: ``(mma, helper)`` registers per thread the two roles set (``setmaxnreg``), or None.
        self.registers = helper_registers(warps=warps, m_warps=m_warps) if self.helpers else None

    def _build_layout(self):
        """The shared decode's layout, with every multiplying warp's accumulators spanning the
        CTA width (one ``wgmma`` per warpgroup: ``mma_tiles = cta_tiles``)."""
        layout = super()._build_layout()
        return dataclasses.replace(layout, mma_tiles=layout.cta_tiles)

    def warp_coords(self, warp):
        """``(wm, wn)``: a multiplying warp owns CTA rows ``wm·16·m_tiles ..`` over the whole
        CTA width (``wn = 0``); a helper warp's coordinates are never used."""
        return warp, 0

    def live_row0(self, warp):
        """First CTA row of the warp's warpgroup (its MMAs are skipped together)."""
        return (warp // WARPGROUP) * (WARPGROUP * 16 * self.m_tiles)

    def _a_chunk_offset(self, c):
        """A chunk ``c`` (half ``c % 2`` of CTA row ``R = c // 2``) in core-matrix order: row
        ``R`` of warp ``w = R // (16·m_tiles)``, block ``mt``, is row ``16·(w % 4) + R % 16`` of
        A tile ``(w // 4)·m_tiles + mt``."""
        rows_per_warp = 16 * self.m_tiles
        row = c // 2
        warp = row // rows_per_warp
        mt = (row // 16) % self.m_tiles
        tile = (warp // WARPGROUP) * self.m_tiles + mt
        i = (warp % WARPGROUP) * 16 + row % 16
        return (
            tile * A_TILE_BYTES
            + (i // 8) * wgmma.CORE_SBO
            + (c % 2) * wgmma.CORE_LBO
            + (i % 8) * 16
        )

    def setup(self, *, tid, lane, warp, g, r, first, pay_cta, a, a_row_source, smem=None):
        """:meth:`SharedDecodeMainloop.setup`'s tuple plus the warpgroup's A descriptor (its
        first A tile in slot 0, K16 row 0) and the fragment buffers' B descriptor."""
        lanes = super().setup(
            tid=tid, lane=lane, warp=warp, g=g, r=r, first=first, pay_cta=pay_cta, a=a,
            a_row_source=a_row_source, smem=smem,
        )  # fmt: skip
        lay = self.layout
        smem = lanes[-1]
        a_tile0 = (warp // WARPGROUP) * (self.m_tiles * A_TILE_BYTES)
        a_desc = wgmma.descriptor(smem + Uint32(lay.a_offset) + Uint32(a_tile0))
        b_desc = wgmma.descriptor(smem + Uint32(lay.frag_offset))
        return (*lanes, a_desc, b_desc)

    def _decode_step(self, slot: int, buf: int, step, word_rd, lut_addr, off, frag_st) -> None:
        """Decode the warp's ``n_tiles`` tiles of every K16 row of the step that starts at K16
        row ``step`` (one rate: the step does not matter; the pair decode overrides this)."""
        tiles = [
            (row, word_rd, nt * 32 * self.bits, self.fmt, self.bits, off, nt)
            for row in range(self.rows)
            for nt in range(self.n_tiles)
        ]
        self._decode_tiles(slot, buf, tiles, lut_addr, frag_st)

    def _decode_tiles(self, slot: int, buf: int, tiles, lut_addr, frag_st) -> None:
        """Decode ``tiles`` of ``slot`` into fragment buffer ``buf``: all ring-word loads first
        (the shared loads and stores are ordered, so a load issued after a store would wait for
        it), then every decode, then one ``stmatrix`` per tile. A tile is ``(row, word_rd,
        word_off, fmt, bits, off, t)``: its K16 row in the step, the lane's ring-word addresses
        and the tile's byte offset from them in the row's run, its decoder, rate and window
        offset, and ``t``, its N16 tile index from the warp's first fragment tile."""
        lay = self.layout
        words = [
            [ptx.ld_shared_u32_imm(w, slot * lay.slot_bytes + row * lay.row_pay + w_off)
             for w in word_rd]
            for row, word_rd, w_off, *_ in tiles
        ]  # fmt: skip
        for (row, _, _, fmt, bits, off, t), tile_words in zip(tiles, words, strict=True):
            regs = decode_states_to_half2x4(
                fmt, bits, lane_windows(tile_words, off, bits), lut_addr, lut_in_smem=False,
                to_bf16=self.bf16,
            )  # fmt: skip
            frag_off = buf * lay.frag_bytes + (row * lay.cta_tiles + t) * FRAG_TILE_BYTES
            self._store_tile(frag_st, regs, frag_off)

    def _store_tile(self, frag_st, regs, frag_off: int) -> None:
        """The tile's four core matrices: lane ``l`` addresses ``16·l`` (module docstring)."""
        wgmma.stmatrix_x4(frag_st, regs, offset=frag_off)

    def _settle(self, acc) -> None:
        """Wait for this warpgroup's MMAs; the accumulators pass through the wait."""
        wgmma.wait_in_place(acc, self.m_tiles * self.layout.mma_tiles * 8, 0)

    def _mma_row(self, slot: int, buf: int, row: int, a_desc, b_desc, acc) -> None:
        """The warpgroup's ``m_tiles`` MMAs of K16 row ``row`` of ``slot`` / ``buf``."""
        lay = self.layout
        b_off = buf * lay.frag_bytes + row * lay.cta_tiles * FRAG_TILE_BYTES
        chunk_tiles = self.mma_n // 16
        for mt in range(self.m_tiles):
            a_off = slot * lay.slot_bytes + row * lay.row_a + mt * A_TILE_BYTES
            for t0 in range(0, lay.cta_tiles, chunk_tiles):
                idx = [
                    nt * self.m_tiles * 8 + mt * 8 + j
                    for nt in range(t0, t0 + chunk_tiles)
                    for j in range(8)
                ]
                out = wgmma.mma(
                    [acc[i] for i in idx], wgmma.descriptor_at(a_desc, a_off),
                    wgmma.descriptor_at(b_desc, b_off + t0 * FRAG_TILE_BYTES),
                    n=self.mma_n, bf16=self.bf16,
                )  # fmt: skip
                for i, v in zip(idx, out, strict=True):
                    acc[i] = v

    @cute.jit
    def run(
        self,
        *,
        lanes,
        k_begin,
        k_end,
        row_bytes,
        lut_addr,
        off,
        live_rows,
        slice_rows=None,
        multiply: bool = True,
    ):
        """The mainloop over K16 rows ``[k_begin, k_end)``; returns the accumulators (the
        shared decode's order). ``live_rows`` must be warpgroup-uniform. ``multiply=False`` is a
        helper warp's loop (``m_warps < warps``): the same copies, barriers and decodes, no
        accumulators and no MMAs (returns None), so its registers stay few."""
        lay = self.layout
        fill, word_rd, _, frag_st, _, fold, _, a_desc, b_desc = lanes
        acc = None
        if cutlass.const_expr(multiply):
            acc = zero_accumulators(self.m_tiles, lay.mma_tiles)
        stages = self.stages
        rows = self.rows
        self._prologue(k_begin, k_end, row_bytes, fill)
        self._decode_step(0, 0, k_begin, word_rd, lut_addr, off, frag_st)
        for k0 in cutlass.range(k_begin, k_end, lay.period * rows, unroll=1):
            for s in cutlass.range_constexpr(lay.period):
                step = k0 + s * rows
                if cutlass.const_expr(multiply):
                    self._settle(acc)  # step - 1's MMAs are done: its slot and buffer are free
                ptx.cp_async_wait(stages - 3)  # step + 1 has landed
                wgmma.fence_proxy_async()
                cute.arch.sync_threads()
                refill = (s + stages - 1) % stages
                self._fill(refill, step + (stages - 1) * rows, k_end, row_bytes, fill)
                ptx.cp_async_commit()
                if cutlass.const_expr(multiply):  # noqa: SIM102 (trace-time if)
                    if live_rows:
                        wgmma.fence()
                        for i in cutlass.range_constexpr(rows):
                            self._mma_row(s % stages, s % 2, i, a_desc, b_desc, acc)
                        wgmma.commit()
                        if cutlass.const_expr(self.k_split > 1):
                            self._slice_end(acc, fold, nxt=step + rows, k_begin=k_begin,
                                            k_end=k_end, slice_rows=slice_rows)  # fmt: skip
                self._decode_step(
                    (s + 1) % stages, (s + 1) % 2, step + rows, word_rd, lut_addr, off, frag_st
                )
        if cutlass.const_expr(multiply):
            self._settle(acc)
        ptx.cp_async_wait(0)  # no copy may still be writing shared memory at exit
        if cutlass.const_expr(self.k_split > 1):  # noqa: SIM102 (trace-time if)
            if live_rows:
                self._fold_finish(acc, fold)
        return acc
