"""Stream-K over the ``wgmma`` mainloops: a persistent grid shares every tile's K range.

Why: the deep row's 112 tiles at N = 28672 are 0.85 waves on 132 SMs and the swap-AB pairs' 224 CTAs
at M = 256 are 1.70; ``ctas`` CTAs (one per SM) share the tiles' K ranges evenly instead, each
running about ``tiles / ctas`` of a tile (docs/evidence/dense-stream-k-geometry.md).

Which mainloop: the ``wgmma`` shared decode (every warp multiplies) or swap-AB, unshared or in
clusters. A cluster's CTAs share each token tile, so they must run the same K16 rows: the schedule
below runs over CTA *groups* of ``cluster`` (group ``c // cluster``; rank ``c % cluster`` takes its
CTA of each pair tile), and each segment starts the slots' mbarriers afresh
(:meth:`~b12x.kernels.wgmma_swap.SwapAbMainloop.token_copier`: every use of the last segment's
barriers was waited for, and its cluster barrier makes both CTAs ready).

Planned by the dense table's deep and swap-AB rows (:mod:`b12x.ops.dense.mainloop`); GPU test:
``tests/b12x/test_dense_stream_k_gpu.py``.

Schedule (:mod:`b12x.kernels.stream_k_schedule`: pure integer math, the same functions run in the
kernel and on the host for the tests):
* A *unit* is one trip of the mainloop's unrolled body (``period·shared_rows`` K16 rows, 16 for the
  deep row and the swap-AB pairs), so a K range never ends inside a trip; ``units = ceil(K16 /
  span)`` per tile, ``total = tiles·units`` in tile-major order (tile ``t`` = N column block ``t %
  tiles_n``, M block ``t // tiles_n``; with clusters a tile is a pair tile, as below a CTA is a
  group).
* CTA ``c`` of ``ctas`` (``ctas <= total``: every range is non-empty) owns units ``[c·total // ctas,
  (c+1)·total // ctas)``: ranges differ by at most one unit. It walks its tiles in order; for each
  it runs the mainloop over that tile's K16 rows of the range (a segment), from zero accumulators.
* A segment that starts at the tile's K16 row 0 is the tile's *head*. A non-head segment can only be
  its CTA's first, so each CTA writes at most one partial: its accumulators go to ``partials[c]``
  (thread ``tid``'s registers ``4j .. 4j + 3`` at float ``4·(j·threads + tid)``: the reader is the
  same thread index of another CTA of the same geometry, so no layout is translated;
  :meth:`DenseStreamKGemmKernel._partial`), then every thread fences, the CTA synchronises and
  thread 0 raises ``flags[c]`` (release).
* The head's CTA, if the tile is not wholly its own, adds the partials of CTAs ``c + 1 ..
  head_owner(last unit of the tile)`` in that order (K order): thread 0 waits for each flag
  (acquire), the CTA synchronises, every thread adds the partial from L2 (in chunks of
  :data:`FIXUP_LOADS` loads between CTA barriers, which keeps the compile spill-free), and thread 0
  clears the flag for the next launch. Then it stores the tile as a whole segment would (the plain
  kernel's epilogue). The sum is fixed by the schedule (head, then the pieces in K order), so
  results are **bitwise reproducible**; on one-hot activations every product but one is an exact
  zero, so they equal the unsplit GEMM's bit for bit.

Progress: a CTA waits only on higher-numbered CTAs, whose flags come from their *first* segments,
and CTA ``ctas - 1`` never waits (its range ends at the last tile's end). With at most one CTA per
SM and ``ctas`` no more than the SMs, every CTA becomes resident once the upstream grid drains
(:mod:`b12x.kernels.dependent_launch`), so the waits cannot deadlock.

Flags: int32 ``[ctas]``, zero before the first launch (a zeroed buffer); every raised flag is
cleared by its reader, so the buffer is zero again after each launch (CUDA-graph replay keeps
working). Partials: fp32 ``[ctas, accumulators·threads]``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from b12x.abi import abi_entry
from b12x.kernels import ptx
from b12x.kernels.dense_gemm import DenseTrellisGemmKernel
from b12x.kernels.dependent_launch import await_upstream, launch_options
from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.mainloop import lane_coords
from b12x.kernels.stream_k_schedule import head_owner, stream_k_range, stream_k_units
from b12x.kernels.trellis_decode import lane_ring_start

__all__ = ["DenseStreamKGemmKernel", "FIXUP_LOADS"]

#: 16-byte partial loads a thread has in flight per fix-up chunk (a CTA barrier between chunks).
FIXUP_LOADS = 4


class DenseStreamKGemmKernel(DenseTrellisGemmKernel):
    """A ``wgmma`` mainloop of :class:`DenseTrellisGemmKernel` on a stream-K schedule (module
    docstring): the shared decode (every warp multiplies) or swap-AB (``cluster`` CTAs along N
    sharing each token tile take their K ranges together). No split-K partials: the output is
    the compute dtype."""

    def __init__(self, fmt, bits: int, geometry: GemmGeometry, *, bf16: bool):
        super().__init__(fmt, bits, geometry, bf16=bf16, write_partials=False)
        if not geometry.stream_k:  # the geometry's rule: wgmma, every warp multiplies
            raise ValueError("stream_k: the geometry is not on the stream-K schedule")
        #: K16 rows of one unit: one trip of the mainloop's unrolled body.
        self.span = self.layout.period * self.shared_rows
        #: Accumulators per thread (one partial holds ``threads`` of each).
        self.acc_count = self.m_tiles * self.layout.mma_tiles * 8
        self.threads = 32 * self.warps

    @abi_entry
    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        partials: cute.Tensor,
        flags: cute.Tensor,
        lut_addr: Int64,
        ctas: Int32,
        stream,
    ):
        if cutlass.const_expr(self.cluster == 1):
            self.stream_k_kernel(a, payload, out, partials, flags, lut_addr).launch(
                grid=(ctas, 1, 1),
                block=(self.threads, 1, 1),
                smem=self.smem_bytes,
                stream=stream,
                **launch_options(),
            )
        else:  # ctas % cluster == 0: the launcher's rule
            atom, coords = self.shared.make_token_tma(a)
            self.cluster_stream_k_kernel(
                a, payload, out, partials, flags, lut_addr, atom, coords
            ).launch(
                grid=(ctas, 1, 1),
                block=(self.threads, 1, 1),
                cluster=(self.cluster, 1, 1),
                smem=self.smem_bytes,
                stream=stream,
                **launch_options(),
            )

    @cute.kernel
    def stream_k_kernel(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        partials: cute.Tensor,
        flags: cute.Tensor,
        lut_addr: Int64,
    ):
        await_upstream()
        self._stream_k(a, payload, out, partials, flags, lut_addr)

    @cute.kernel
    def cluster_stream_k_kernel(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        partials: cute.Tensor,
        flags: cute.Tensor,
        lut_addr: Int64,
        token_atom: cute.CopyAtom,
        token_coords: cute.Tensor,
    ):
        """Swap-AB CTAs sharing their token tiles in clusters (:mod:`b12x.kernels.wgmma_swap`,
        "Token sharing"): the schedule runs over clusters, every CTA of one takes the same
        segments."""
        await_upstream()
        self._stream_k(a, payload, out, partials, flags, lut_addr, tma=(token_atom, token_coords))

    @cute.jit
    def _stream_k(self, a, payload, out, partials, flags, lut_addr: Int64, tma=None):
        """The CTA's segments (module docstring, "Schedule"), over CTA groups of ``cluster``:
        group ``c // cluster`` owns the units, rank ``c % cluster`` its CTA of each tile."""
        tid = cute.arch.thread_idx()[0]
        c = cute.arch.block_idx()[0]
        groups = cute.arch.grid_dim()[0] // self.cluster
        group = c // self.cluster
        rank = c % self.cluster
        lane, warp, r, g = lane_coords(tid)
        lay = self.layout
        m = a.shape[0]
        k_rows = payload.shape[0]
        tiles_n = payload.shape[1] // (lay.cta_tiles * self.cluster)
        units = stream_k_units(k_rows, self.span)
        total = tiles_n * ((m + lay.cta_m - 1) // lay.cta_m) * units
        start, end = stream_k_range(group, total, groups)
        row_bytes = self._row_bytes(payload)
        first, off = lane_ring_start(lane, self.bits)
        smem = self.shared.allocate()
        for tile in cutlass.range(start // units, (end - 1) // units + 1, unroll=1):
            u0 = cutlass.max(start, tile * units) - tile * units
            u1 = cutlass.min(end, (tile + 1) * units) - tile * units
            bx = (tile % tiles_n) * self.cluster + rank
            row0 = (tile // tiles_n) * lay.cta_m
            live_rows, acc, store = self._segment(
                a=a, payload=payload, out=out, smem=smem, tid=tid, lane=lane, warp=warp, g=g, r=r,
                first=first, off=off, bx=bx, row0=row0, by=tile // tiles_n,
                k_begin=u0 * self.span, k_end=cutlass.min(u1 * self.span, k_rows),
                row_bytes=row_bytes, lut_addr=lut_addr, tma=tma,
            )  # fmt: skip
            if u0 > 0:  # a tail or middle piece: hand it to the tile's head
                if live_rows:
                    mine = self._partial(partials, c, tid)
                    for j in cutlass.range_constexpr(self.acc_count // 4):
                        ptx.st_global_cg_v4_f32(
                            mine, [acc[4 * j + q] for q in range(4)], offset=16 * j * self.threads
                        )
                ptx.fence_acq_rel_gpu()
                cute.arch.sync_threads()
                if tid == 0:
                    ptx.st_release_gpu_u32(self._flag(flags, c), Uint32(1))
            else:
                last = head_owner(tile * units + units - 1, total, groups)
                for peer_group in cutlass.range(group + 1, last + 1, unroll=1):
                    peer = peer_group * self.cluster + rank
                    if tid == 0:
                        ptx.wait_acquire_gpu_u32(self._flag(flags, peer), Uint32(1))
                        ptx.st_release_gpu_u32(self._flag(flags, peer), Uint32(0))
                    theirs = self._partial(partials, peer, tid)
                    for j0 in cutlass.range_constexpr(0, self.acc_count // 4, FIXUP_LOADS):
                        # every thread adds (a dead warpgroup's sums are never stored); the
                        # barrier bounds the loads in flight, so ptxas keeps them in registers
                        cute.arch.sync_threads()
                        for j in cutlass.range_constexpr(j0, j0 + FIXUP_LOADS):
                            got = ptx.ld_global_cg_v4_f32(theirs, offset=16 * j * self.threads)
                            for q in cutlass.range_constexpr(4):
                                acc[4 * j + q] = acc[4 * j + q] + got[q]
                self._store(acc, store)
            cute.arch.sync_threads()  # every warp is done with the slots before the next prologue

    @cute.jit
    def _segment(self, *, a, payload, out, smem, tid, lane, warp, g, r, first, off, bx, row0, by,
                 k_begin, k_end, row_bytes, lut_addr, tma):  # fmt: skip
        """One K range of one tile from zero accumulators: ``(live_rows, accumulators,
        store)``, ``live_rows`` whether the warp's warpgroup holds rows below M (always true
        for swap-AB, whose tokens past M are zero-filled), ``store`` the plain kernel's
        epilogue arguments besides the accumulators (:meth:`_store`)."""
        if cutlass.const_expr(self.swap_ab):
            # the slots' mbarriers start afresh each segment (every use of the last segment's
            # was waited for, so no arrival or byte is pending)
            acc = self._swap_ab_mainloop(
                a=a, payload=payload, smem=smem, tid=tid, lane=lane, warp=warp, first=first,
                off=off, bx=bx, by=by, k_begin=k_begin, k_end=k_end, row_bytes=row_bytes,
                lut_addr=lut_addr, tma=tma,
            )  # fmt: skip
            store = dict(out=out, m=a.shape[0], tok0=row0, bx=bx, warp=warp, bz=0, g=g, r=r)
            return True, acc, store
        loop, live_rows, store = self._shared_decode_parts(
            a=a, payload=payload, out=out, smem=smem, tid=tid, lane=lane, warp=warp, g=g, r=r,
            first=first, off=off, bx=bx, row0=row0, bz=0, k_begin=k_begin, k_end=k_end,
            row_bytes=row_bytes, lut_addr=lut_addr,
        )  # fmt: skip
        return live_rows, self.shared.run(**loop, live_rows=live_rows), store

    @cute.jit
    def _store(self, acc, store):
        """The whole tile's epilogue (the plain kernel's, compute dtype)."""
        if cutlass.const_expr(self.swap_ab):
            self._swap_ab_epilogue(acc=acc, **store)
        else:
            self._epilogue(acc=acc, n_tiles=self.layout.mma_tiles, **store)

    def _partial(self, partials, cta, tid):
        """Byte address of thread ``tid``'s first accumulators in CTA ``cta``'s partial (its
        registers ``4j .. 4j + 3`` at ``16·(j·threads + tid)``: one coalesced 16-byte access per
        thread and ``j``)."""
        row = Int64(4 * self.acc_count * self.threads)
        return partials.iterator.toint() + Int64(cta) * row + Int64(tid) * 16

    def _flag(self, flags, cta):
        """Byte address of CTA ``cta``'s flag."""
        return flags.iterator.toint() + Int64(cta) * 4
