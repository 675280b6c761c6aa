"""Dense trellis GEMM: ``C[M, N] = A[M, K] · Wq[K, N]`` with Wq decoded in registers (mma.sync).

Layout (the full account: docs/notes/b12x.md, "b12x/kernels/dense_gemm.py"):
* **Operands.** ``a`` ``int32[M, K/2]`` (rotated activations, two halves per word); ``payload``
  ``int32[K/16, N/16, 8b]`` (ring words, spec §1.2); out: the compute dtype ``int32[M, N/2]``, or
  fp32 partials ``[S, M, N]`` that :class:`b12x.kernels.split_k_reduce.SplitKReduceKernel` sums
  in split order.
* **Work split.** Warp w of CTA (x, y, z) owns N16 tiles ``(x·warps + w)·n_tiles + [0,
  n_tiles)``, M16 blocks ``y·m_tiles + [0, m_tiles)`` and K16 rows ``[z·kps, (z+1)·kps)``.
* **Mainloop** (:func:`decode_and_accumulate`, a shared body called by keyword): per K16 row a lane
  loads its A fragments and 2–3 ring words per N16 tile, decodes eight weights into four B
  registers (the EXL3 tile order is the B-fragment order, §1.5) and issues two
  ``mma.sync.m16n8k16`` per M16 block, fp32 accumulation, loads ``depth`` rows ahead.
* **Shared-memory ring** (opt-in ``smem_stages``): a warp streams its rows through cp.async
  slots.
* **Shared decode** (opt-in ``m_warps``): the CTA decodes each weight once into shared memory and
  all its warps multiply it (:class:`b12x.kernels.shared_decode.SharedDecodeMainloop`), with the
  per-warp mainloops' operands in the same K order (bit-identical results).
* **Epilogue.** Lane holds C rows ``g, g+8``, columns ``2r, 2r+1`` of each n-block; rows ``>= M``
  are computed on a clamped A row and never stored.

Invariants:
* The codebook, bitrate, compute dtype and tile shape are compile-time (a
  :class:`~b12x.formats.DecodeFormat` plus ints); the LUT arrives in one Int64 slot (§2.8).
* Requirements checked by the host: K % 16 == 0, N % (16·n_tiles·warps) == 0, buffers contiguous
  and 16-byte aligned, one payload K16 row (``2·b·N`` bytes) below 2^31 (``check_row_stride``).
* Split-K partial sums are reduced in a fixed order: results are bitwise reproducible, and on
  one-hot activations every split-K setting gives bit-identical outputs.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32

from b12x.abi import abi_entry, shared_body
from b12x.formats import DecodeFormat
from b12x.kernels import ptx
from b12x.kernels.dependent_launch import await_upstream, launch_options
from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.mainloop import (
    a_chunk_offset,
    a_fragment_offsets,
    clamped_a_pointers,
    lane_coords,
    mma_accumulate,
    ring_word_indices,
    ring_word_pointers,
    zero_accumulators,
)
from b12x.kernels.shared_decode import SharedDecodeMainloop
from b12x.kernels.shared_layout import (
    A_BLOCK_BYTES,
    FRAG_TILE_BYTES,
    SHARED_ROWS,
    SMEM_LIMIT,
    SMEM_STAGES,
    WGMMA_SMEM_LIMIT,
    check_shared_decode,
    shared_decode_layout,
)
from b12x.kernels.trellis_decode import (
    decode_states_to_half2x4,
    lane_ring_start,
    lane_windows,
    ring_words_per_lane,
)
from b12x.kernels.wgmma_decode import WgmmaDecodeMainloop
from b12x.kernels.wgmma_swap import SwapAbMainloop

__all__ = [
    "DenseTrellisGemmKernel",
    "decode_and_accumulate",
    "SMEM_STAGES",
    "SMEM_LIMIT",
    "ring_smem_bytes",
    "FRAG_TILE_BYTES",
    "SHARED_ROWS",
    "check_shared_decode",
    "shared_decode_layout",
]


def ring_smem_bytes(bits: int, *, m_tiles: int, n_tiles: int, warps: int, stages: int) -> int:
    """Shared memory per CTA of the ``cp.async`` ring (0 for the register path).

    A slot holds one K16 row of one warp: its ``n_tiles`` payload tiles (``32·bits`` B each)
    then ``m_tiles`` A blocks (:data:`A_BLOCK_BYTES`), so a warp owns ``stages`` slots and the
    CTA ``warps·stages`` of them. Headline tile (4 warps, 1 M16 x 4 N16): K4 1 KB per slot,
    12 KB per CTA at 3 stages, 16 KB at 4; the largest legal shape (4 M16 x 2 N16, K8, 4 stages)
    needs 40 KB.
    """
    return warps * stages * (n_tiles * 32 * bits + m_tiles * A_BLOCK_BYTES)


@shared_body
def decode_and_accumulate(
    *,
    fmt: DecodeFormat,
    bits: int,
    bf16: bool,
    lut_in_smem: bool,
    lut_addr,
    a_frags: list,
    words: list,
    lane_off,
    acc,
    acc_base: int,
    m_tiles: int,
):
    """Decode one N16 tile of one K16 row into B fragments and accumulate every M16 block.

    ``a_frags[mt]`` is the 4-register A fragment of M16 block ``mt``; ``words`` are the lane's
    2–3 ring words of the tile (from :func:`load_lane_words`), ``lane_off`` the bit offset of its
    window 0; accumulators live in the register tensor ``acc`` at ``acc_base + mt·8 + nb·4 + c``
    (nb = n-block, c = C register).
    """
    states = lane_windows(words, lane_off, bits)
    regs = decode_states_to_half2x4(
        fmt, bits, states, lut_addr, lut_in_smem=lut_in_smem, to_bf16=bf16
    )
    mma_accumulate(a_frags, regs, acc, acc_base, m_tiles, bf16)


class DenseTrellisGemmKernel:
    """One compiled specialisation of the dense trellis GEMM (see the module docstring)."""

    def __init__(
        self, fmt: DecodeFormat, bits: int, geometry: GemmGeometry, *, bf16: bool,
        write_partials: bool,
    ):  # fmt: skip
        fmt.check_bits(bits)
        if not isinstance(geometry, GemmGeometry):
            raise TypeError(f"geometry: expected a GemmGeometry, got {type(geometry).__name__}")
        geometry.check(bits=bits)
        self.fmt = fmt
        self.bits = bits
        self.bf16 = bf16
        self.geometry = geometry
        self.write_partials = write_partials
        # the geometry's fields, read by the device code as compile-time constants
        self.m_tiles = m_tiles = geometry.m_tiles
        self.n_tiles = n_tiles = geometry.n_tiles
        self.warps = warps = geometry.warps
        self.unroll = geometry.unroll
        self.depth = geometry.depth
        self.smem_stages = smem_stages = geometry.smem_stages
        self.m_warps = m_warps = geometry.m_warps
        self.shared_rows = shared_rows = geometry.shared_rows
        self.swap_ab = swap_ab = geometry.swap_ab
        self.cluster = cluster = geometry.cluster
        wgmma = geometry.wgmma
        #: The shared-decode mainloop and its byte layout (None for the per-warp mainloops).
        self.shared = None
        self.layout = None
        if swap_ab:
            self.shared = SwapAbMainloop(
                fmt, bits, bf16=bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
                rows=shared_rows, stages=smem_stages, cluster=cluster,
            )  # fmt: skip
        elif wgmma:
            self.shared = WgmmaDecodeMainloop(
                fmt, bits, bf16=bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
                m_warps=m_warps, rows=shared_rows, stages=smem_stages,
            )  # fmt: skip
        elif m_warps:
            self.shared = SharedDecodeMainloop(
                fmt, bits, bf16=bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
                m_warps=m_warps, rows=shared_rows, stages=smem_stages,
            )  # fmt: skip
        if self.shared is not None:
            self.layout = self.shared.layout
            self.smem_bytes = self.layout.total
        else:
            self.smem_bytes = ring_smem_bytes(
                bits, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps, stages=smem_stages
            )
        limit = WGMMA_SMEM_LIMIT if wgmma else SMEM_LIMIT
        if self.smem_bytes > limit:
            raise ValueError(
                f"smem_stages: {smem_stages} stages need {self.smem_bytes} B of shared memory "
                f"per CTA (limit {limit})"
            )

    @abi_entry
    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        lut_addr: Int64,
        k_rows_per_split: Int32,
        splits: Int32,
        stream,
    ):
        m = a.shape[0]
        n16 = payload.shape[1]
        grid_x = n16 // (self.n_tiles * self.warps)
        cta_m = self.cta_m
        grid_y = (m + cta_m - 1) // cta_m
        if cutlass.const_expr(self.cluster == 1):
            self.kernel(a, payload, out, lut_addr, k_rows_per_split).launch(
                grid=(grid_x, grid_y, splits),
                block=(32 * self.warps, 1, 1),
                smem=self.smem_bytes,
                stream=stream,
                **launch_options(),
            )
        else:  # tokens shared by a cluster along N (grid_x % cluster == 0: the launcher's rule)
            atom, coords = self.shared.make_token_tma(a)
            self.cluster_kernel(a, payload, out, lut_addr, k_rows_per_split, atom, coords).launch(
                grid=(grid_x, grid_y, splits),
                block=(32 * self.warps, 1, 1),
                cluster=(self.cluster, 1, 1),
                smem=self.smem_bytes,
                stream=stream,
                **launch_options(),
            )

    @property
    def cta_m(self) -> int:
        """Rows (tokens) of A one CTA covers: its mainloop layout's, or one warp's M blocks."""
        return 16 * self.m_tiles if self.layout is None else self.layout.cta_m

    def _k_slice(self, payload, bz, k_rows_per_split):
        """``(k_begin, k_end, row_bytes)``: split ``bz``'s K16 rows and the bytes of one payload
        K16 row. 2bN < 2^31 (N < 2^27, module docstring): a 32-bit factor, so each row offset is
        one 32x32->64 multiply (IMAD.WIDE) per pointer; the product itself is formed in 64
        bits."""
        k_begin = bz * k_rows_per_split
        k_end = cutlass.min(k_begin + k_rows_per_split, payload.shape[0])
        return k_begin, k_end, self._row_bytes(payload)

    def _row_bytes(self, payload):
        """Bytes of one payload K16 row (``N/16`` tiles of ``32·bits`` B): a 32-bit value (the
        plan refuses a row of 2^31 bytes or more), sign-extended so that ``Int64(kt) * row_bytes``
        is one 32 x 32 -> 64 multiply in the mainloop, not a 64-bit one."""
        # lint-ok widened-after-product: plan_dense's check_row_stride bounds it below 2^31
        return Int64(payload.shape[1] * (4 * 8 * self.bits))

    def _cta_payload_run(self, payload, bx):
        """Byte address of CTA column ``bx``'s payload run in K16 row 0 (a shared mainloop's
        ``cta_tiles`` N16 tiles, contiguous)."""
        return payload.iterator.toint() + Int64(bx) * (self.layout.cta_tiles * 32 * self.bits)

    def _load_stage(self, kt, word_ptrs, row_bytes, a_ptrs):
        """Issue the loads of K16 row ``kt``: (ring words of every N16 tile, A words).

        ``word_ptrs[i]`` is the lane's ring word i of its first N16 tile in K16 row 0; tile nt of
        row kt is ``kt·row_bytes + nt·32b`` bytes further (an immediate). ``a_ptrs[idx]`` points
        at the lane's A words (row, k = 2r) of K16 row 0.
        """
        nw = ring_words_per_lane(self.bits)
        row_off = Int64(kt) * row_bytes
        words = [None] * (self.n_tiles * nw)
        for i in range(nw):
            ptr = word_ptrs[i] + row_off
            for nt in range(self.n_tiles):
                words[nt * nw + i] = ptx.ld_global_nc_u32_imm(ptr, nt * 32 * self.bits)
        a_off = Int64(kt) * 32
        a_vals = []
        for mt in range(self.m_tiles):
            for q in range(4):
                ptr = a_ptrs[2 * mt + q % 2] + a_off
                a_vals.append(ptx.ld_global_nc_u32_imm(ptr, 16 * (q // 2)))
        return words, a_vals

    def _accumulate_row(self, words, a_vals, lut_addr, off, acc):
        """Decode every N16 tile of one K16 row (the lane's ring ``words`` of each tile, in
        tile order) and accumulate against its A fragments (``a_vals``, 4 per M16 block)."""
        nw = ring_words_per_lane(self.bits)
        a_frags = [a_vals[4 * mt : 4 * mt + 4] for mt in range(self.m_tiles)]
        for nt in range(self.n_tiles):
            decode_and_accumulate(
                fmt=self.fmt,
                bits=self.bits,
                bf16=self.bf16,
                lut_in_smem=False,
                lut_addr=lut_addr,
                a_frags=a_frags,
                words=words[nt * nw : nt * nw + nw],
                lane_off=off,
                acc=acc,
                acc_base=nt * self.m_tiles * 8,
                m_tiles=self.m_tiles,
            )

    def _slot_bytes(self) -> int:
        return self.n_tiles * 32 * self.bits + self.m_tiles * A_BLOCK_BYTES

    def _fill_slot(self, slot: int, kt, k_end, lane, fill, row_bytes, a_fill):
        """Issue the ``cp.async`` copies of K16 row ``kt`` into ring slot ``slot`` (no commit).

        ``fill = (dst, src)``: the lane's payload chunk (16 B chunk ``lane`` of the warp's
        contiguous ``n_tiles·32b``-byte run in K16 row 0; chunk ``lane + 32j`` is ``512j`` further
        on both sides, lanes past the run's end are predicated off). ``a_fill[j] = (dst, src,
        size)``: the lane's A chunk of M16 block j (16 B half ``lane % 2`` of tile row
        ``lane // 2``; size 0 for rows >= M). A row past the split's end (``kt >= k_end``)
        copies zero bytes from a clamped address: it zero-fills, reads no global memory and is
        never decoded.
        """
        base = slot * self._slot_bytes()
        live = kt < k_end
        k_row = cutlass.min(kt, k_end - 1)
        size = Uint32(cutlass.select_(live, Uint32(16), Uint32(0)))
        dst, src = fill
        src = src + Int64(k_row) * row_bytes
        chunks = self.n_tiles * 2 * self.bits
        for j in range((chunks + 31) // 32):
            rest = chunks - 32 * j
            enable = None if rest >= 32 else Uint32(cutlass.select_(lane < rest, 1, 0))
            ptx.cp_async_16(dst, src + 512 * j, size, dst_offset=base + 512 * j, enable=enable)
        a_off = Int64(k_row) * 32
        pay = self.n_tiles * 32 * self.bits
        for mt in range(self.m_tiles):
            a_dst, a_src, a_size = a_fill[mt]
            a_live = Uint32(cutlass.select_(live, a_size, Uint32(0)))
            ptx.cp_async_16(
                a_dst,
                a_src + a_off,
                a_live,
                dst_offset=base + pay + mt * A_BLOCK_BYTES,
                cache_global=False,
            )

    def _read_slot(self, slot: int, word_rd, a_rd):
        """The lane's ring words (tile-major, like :meth:`_load_stage`) and A words of slot
        ``slot``: ``word_rd[i]`` addresses ring word i of tile 0, ``a_rd = (lo, hi)`` the lane's
        A words (row g, k-half 0) and (row g, k-half 1); row g+8 is 256 B further."""
        base = slot * self._slot_bytes()
        nw = ring_words_per_lane(self.bits)
        words = [None] * (self.n_tiles * nw)
        for i in range(nw):
            for nt in range(self.n_tiles):
                off = base + nt * 32 * self.bits
                words[nt * nw + i] = ptx.ld_shared_u32_imm(word_rd[i], off)
        pay = base + self.n_tiles * 32 * self.bits
        a_vals = []
        for mt in range(self.m_tiles):
            for q in range(4):
                off = pay + mt * A_BLOCK_BYTES + 256 * (q % 2)
                a_vals.append(ptx.ld_shared_u32_imm(a_rd[q // 2], off))
        return words, a_vals

    @cute.kernel
    def kernel(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        lut_addr: Int64,
        k_rows_per_split: Int32,
    ):
        await_upstream()
        if cutlass.const_expr(self.swap_ab):
            self._swap_ab_kernel(a, payload, out, lut_addr, k_rows_per_split)
        elif cutlass.const_expr(self.m_warps > 0):
            self._shared_decode_kernel(a, payload, out, lut_addr, k_rows_per_split)
        else:
            self._warp_decode_kernel(a, payload, out, lut_addr, k_rows_per_split)

    @cute.kernel
    def cluster_kernel(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        lut_addr: Int64,
        k_rows_per_split: Int32,
        token_atom: cute.CopyAtom,
        token_coords: cute.Tensor,
    ):
        """The swap-AB kernel whose cluster shares its token tiles
        (:mod:`b12x.kernels.wgmma_swap`, "Token sharing")."""
        await_upstream()
        self._swap_ab_kernel(a, payload, out, lut_addr, k_rows_per_split,
                             tma=(token_atom, token_coords))  # fmt: skip

    @cute.jit
    def _warp_decode_kernel(self, a, payload, out, lut_addr: Int64, k_rows_per_split: Int32):
        """Each warp decodes the weights it multiplies (register stages or the ring)."""
        tid = cute.arch.thread_idx()[0]
        bx, by, bz = cute.arch.block_idx()
        lane, warp, r, g = lane_coords(tid)
        m = a.shape[0]
        tile0 = (bx * self.warps + warp) * self.n_tiles
        row_base = by * (16 * self.m_tiles)
        k_begin, k_end, row_bytes = self._k_slice(payload, bz, k_rows_per_split)
        acc = zero_accumulators(self.m_tiles, self.n_tiles)
        a_base, a_row_bytes, a_ptrs = clamped_a_pointers(a, row_base, m, self.m_tiles, g, r)
        first, off = lane_ring_start(lane, self.bits)
        pay_base = payload.iterator.toint()
        word_ptrs = ring_word_pointers(pay_base, first, self.bits, tile0=tile0)
        if cutlass.const_expr(self.smem_stages == 0):
            self._register_mainloop(
                k_begin=k_begin, k_end=k_end, word_ptrs=word_ptrs, row_bytes=row_bytes,
                a_ptrs=a_ptrs, lut_addr=lut_addr, off=off, acc=acc,
            )  # fmt: skip
        else:
            ring = _SmemRing(
                lane=lane, warp=warp, r=r, g=g, m=m, row_base=row_base, tile0=tile0,
                a_base=a_base, a_row_bytes=a_row_bytes, pay_base=pay_base, first=first,
            )  # fmt: skip
            self._smem_mainloop(
                k_begin=k_begin, k_end=k_end, ring=ring, row_bytes=row_bytes,
                lut_addr=lut_addr, off=off, acc=acc,
            )  # fmt: skip
        self._epilogue(
            out=out, acc=acc, m=m, row_base=row_base, tile0=tile0, bz=bz, g=g, r=r,
            n_tiles=self.n_tiles,
        )  # fmt: skip

    @cute.jit
    def _shared_decode_kernel(self, a, payload, out, lut_addr: Int64, k_rows_per_split: Int32):
        """The CTA decodes each K16 row's weights once into shared memory; every warp then
        multiplies its M blocks by its share of them (:mod:`b12x.kernels.shared_decode`)."""
        tid = cute.arch.thread_idx()[0]
        bx, by, bz = cute.arch.block_idx()
        lane, warp, r, g = lane_coords(tid)
        row0 = by * self.layout.cta_m
        k_begin, k_end, row_bytes = self._k_slice(payload, bz, k_rows_per_split)
        first, off = lane_ring_start(lane, self.bits)
        loop, live_rows, store = self._shared_decode_parts(
            a=a, payload=payload, out=out, smem=None, tid=tid, lane=lane, warp=warp, g=g, r=r,
            first=first, off=off, bx=bx, row0=row0, bz=bz, k_begin=k_begin, k_end=k_end,
            row_bytes=row_bytes, lut_addr=lut_addr,
        )  # fmt: skip
        if cutlass.const_expr(self.shared.helpers):
            # Warp specialised (warpgroup-uniform roles): warps < m_warps decode and multiply,
            # the helpers only decode; each role keeps the registers it needs (setmaxnreg).
            mma_regs, helper_regs = self.shared.registers
            if warp < self.m_warps:
                cute.arch.setmaxregister_increase(mma_regs)
                self._multiply_and_store(loop=loop, live_rows=live_rows, store=store)
            else:
                cute.arch.setmaxregister_decrease(helper_regs)
                self.shared.run(**loop, live_rows=False, multiply=False)
        else:
            self._multiply_and_store(loop=loop, live_rows=live_rows, store=store)

    @cute.jit
    def _shared_decode_parts(self, *, a, payload, out, smem, tid, lane, warp, g, r, first, off,
                             bx, row0, bz, k_begin, k_end, row_bytes, lut_addr):  # fmt: skip
        """``(loop, live_rows, store)`` of CTA column ``bx`` and CTA rows ``row0 ..`` over K16
        rows ``[k_begin, k_end)``: the shared mainloop's arguments (``self.shared.run(**loop,
        live_rows=...)``; ``smem`` None: allocated here), whether the warp's warpgroup holds
        rows below M (past M: idle), and the :meth:`_epilogue` arguments besides the
        accumulators and the tile count."""
        lay = self.layout
        m = a.shape[0]
        wm, wn = self.shared.warp_coords(warp)
        row_base = row0 + wm * (16 * self.m_tiles)
        lanes = self.shared.setup(
            tid=tid, lane=lane, warp=warp, g=g, r=r, first=first, a=a, smem=smem,
            pay_cta=self._cta_payload_run(payload, bx),
            a_row_source=lambda local: (cutlass.min(row0 + local, m - 1), row0 + local < m),
        )  # fmt: skip
        loop = dict(
            lanes=lanes, k_begin=k_begin, k_end=k_end, row_bytes=row_bytes, lut_addr=lut_addr,
            off=off,
        )  # fmt: skip
        live_rows = row0 + self.shared.live_row0(warp) < m
        store = dict(
            out=out, m=m, row_base=row_base, tile0=bx * lay.cta_tiles + wn * lay.mma_tiles,
            bz=bz, g=g, r=r,
        )  # fmt: skip
        return loop, live_rows, store

    @cute.jit
    def _swap_ab_kernel(self, a, payload, out, lut_addr: Int64, k_rows_per_split: Int32,
                        tma=None):  # fmt: skip
        """Each warp decodes its weights into ``wgmma``'s register A operand; the CTA's tokens
        are the B operand in shared memory (:mod:`b12x.kernels.wgmma_swap`); ``tma``: the
        token copy atom and coordinates when the cluster shares them."""
        tid = cute.arch.thread_idx()[0]
        bx, by, bz = cute.arch.block_idx()
        lane, warp, r, g = lane_coords(tid)
        lay = self.layout
        m = a.shape[0]
        tok0 = by * lay.cta_m
        k_begin, k_end, row_bytes = self._k_slice(payload, bz, k_rows_per_split)
        first, off = lane_ring_start(lane, self.bits)
        acc = self._swap_ab_mainloop(
            a=a, payload=payload, smem=self.shared.allocate(), tid=tid, lane=lane, warp=warp,
            first=first, off=off, bx=bx, by=by, k_begin=k_begin, k_end=k_end,
            row_bytes=row_bytes, lut_addr=lut_addr, tma=tma,
        )  # fmt: skip
        self._swap_ab_epilogue(out=out, acc=acc, m=m, tok0=tok0, bx=bx, warp=warp, bz=bz, g=g, r=r)

    @cute.jit
    def _swap_ab_mainloop(self, *, a, payload, smem, tid, lane, warp, first, off, bx, by,
                          k_begin, k_end, row_bytes, lut_addr, tma):  # fmt: skip
        """The swap-AB mainloop of CTA column ``bx`` and token tile ``by`` over K16 rows
        ``[k_begin, k_end)``, from zero accumulators (the cluster's token copier set up first:
        its mbarriers start afresh); returns the accumulators."""
        m = a.shape[0]
        tok0 = by * self.layout.cta_m
        lanes = self.shared.setup(
            tid=tid, lane=lane, warp=warp, first=first, a=a, smem=smem,
            pay_cta=self._cta_payload_run(payload, bx),
            a_row_source=lambda local: (cutlass.min(tok0 + local, m - 1), tok0 + local < m),
        )  # fmt: skip
        tokens = None
        if cutlass.const_expr(self.cluster > 1):
            tokens = self.shared.token_copier(
                tid=tid, warp=warp, smem=smem, tma=tma, tok_block=by,
                k_rows=payload.shape[0],
            )  # fmt: skip
        return self.shared.run(
            lanes=lanes, k_begin=k_begin, k_end=k_end, row_bytes=row_bytes, lut_addr=lut_addr,
            off=off, tokens=tokens,
        )  # fmt: skip

    @cute.jit
    def _swap_ab_epilogue(self, *, out, acc, m, tok0, bx, warp, bz, g, r):
        """Store the transposed accumulators of CTA column ``bx``'s warp ``warp`` (its N16
        tiles from ``bx·cta_tiles + warp·n_tiles``) for tokens ``tok0 ..``
        (:mod:`b12x.kernels.wgmma_swap`, "Geometry"): the lane holds weight rows ``g, g + 8``
        of each of its N16 tiles for tokens ``2r, 2r + 1``
        of each n-block. fp32 partials are stored one element at a time; the compute dtype is
        stored as column pairs: lanes ``g`` and ``g ^ 1`` (``lane ^ 4``) swap one value, so the
        even lane stores columns ``(g, g + 1)`` of token ``2r`` and the odd one of token
        ``2r + 1``. Tokens ``>= M`` are never stored."""
        odd = g % 2
        tile0 = bx * self.layout.cta_tiles + warp * self.n_tiles
        for nt in cutlass.range_constexpr(self.n_tiles):
            for t in cutlass.range_constexpr(self.m_tiles):
                for nb in cutlass.range_constexpr(2):
                    for half in cutlass.range_constexpr(2):
                        base = nt * self.m_tiles * 8 + t * 8 + nb * 4 + 2 * half
                        lo = acc[base]  # token j
                        hi = acc[base + 1]  # token j + 1
                        col = (tile0 + nt) * 16 + half * 8 + g
                        tok = tok0 + t * 16 + nb * 8 + 2 * r
                        if cutlass.const_expr(self.write_partials):
                            if tok < m:
                                out[bz, tok, col] = lo
                            if tok + 1 < m:
                                out[bz, tok + 1, col] = hi
                        else:
                            sent = cutlass.select_(odd == 1, lo, hi)
                            got = cute.arch.shuffle_sync_bfly(sent, 4)
                            first = cutlass.select_(odd == 1, got, lo)
                            second = cutlass.select_(odd == 1, hi, got)
                            store_row = tok + odd
                            if store_row < m:
                                if cutlass.const_expr(self.bf16):
                                    word = ptx.f32x2_to_bfloat2(first, second)
                                else:
                                    word = ptx.f32x2_to_half2(first, second)
                                out[store_row, (col - odd) // 2] = Int32(word)

    @cute.jit
    def _multiply_and_store(self, *, loop, live_rows, store):
        """The shared mainloop of a multiplying warp, then its epilogue (``store``: the
        :meth:`_epilogue` arguments besides the accumulators and the tile count)."""
        acc = self.shared.run(**loop, live_rows=live_rows)
        self._epilogue(acc=acc, n_tiles=self.layout.mma_tiles, **store)

    @cute.jit
    def _register_mainloop(
        self, *, k_begin, k_end, word_ptrs, row_bytes, a_ptrs, lut_addr, off, acc
    ):  # fmt: skip
        """Register stages: ``depth`` K16 rows are in flight while one is decoded. The loop body
        covers depth + 1 rows so every stage lives in fixed registers (no copies between
        iterations): step s loads row g0 + s + depth into stage (s + depth) % stages, then
        decodes stage s (row g0 + s; past the split's end in the last group, skipped). Loads
        past the end are clamped to the last row (re-reads, never used)."""
        nw = ring_words_per_lane(self.bits)
        stages = self.depth + 1
        zero = Uint32(0)
        buf = [([zero] * (self.n_tiles * nw), [zero] * (4 * self.m_tiles))] * stages
        for d in cutlass.range_constexpr(self.depth):
            k_load = cutlass.min(k_begin + d, k_end - 1)
            buf[d] = self._load_stage(k_load, word_ptrs, row_bytes, a_ptrs)
        for g0 in cutlass.range(k_begin, k_end, stages, unroll=self.unroll):
            for s in cutlass.range_constexpr(stages):
                k_next = cutlass.min(g0 + s + self.depth, k_end - 1)
                nxt = (s + self.depth) % stages
                buf[nxt] = self._load_stage(k_next, word_ptrs, row_bytes, a_ptrs)
                if g0 + s < k_end:  # always true for s = 0 (the loop bound), folded
                    words, a_vals = buf[s]
                    self._accumulate_row(words, a_vals, lut_addr, off, acc)

    def _ring_pointers(self, ring: _SmemRing):
        """``(fill, a_fill, word_rd, a_rd)`` of the lane in its warp's ring (module docstring).

        A chunks: tile row lane // 2 (+16 per M16 block), 16 B half lane % 2, stored with the
        halves swapped in rows 4..7 mod 8 so the fragment reads (rows g, words r / r + 4) hit
        32 distinct banks. (The slot's payload run, ``n_tiles·32b`` bytes, is added as the
        immediate offset by _fill_slot / _read_slot; adding it here too put A past its slot:
        docs/evidence/dense-smem-ring.md.)
        """
        stages = self.smem_stages
        slot_bytes = self._slot_bytes()
        lane, g, r = ring.lane, ring.g, ring.r
        allocator = cutlass.memory.SmemAllocator()
        ring_smem = allocator.allocate(self.warps * stages * slot_bytes, byte_alignment=16)
        warp_base = Uint32(ring_smem.toint()) + Uint32(ring.warp * (stages * slot_bytes))
        fill = (
            warp_base + Uint32(lane * 16),
            ring.pay_base + Int64(ring.tile0) * (8 * self.bits) * 4 + lane * 16,
        )
        a_dst = warp_base + Uint32(a_chunk_offset(lane))
        a_fill = []
        for mt in range(self.m_tiles):
            a_row = ring.row_base + mt * 16 + lane // 2
            a_src = (
                ring.a_base
                + Int64(cutlass.min(a_row, ring.m - 1)) * ring.a_row_bytes
                + (lane % 2) * 16
            )
            a_size = Uint32(cutlass.select_(a_row < ring.m, Uint32(16), Uint32(0)))
            a_fill.append((a_dst, a_src, a_size))
        word_rd = [warp_base + Uint32(idx * 4) for idx in ring_word_indices(ring.first, self.bits)]
        a_rd = tuple(warp_base + Uint32(o) for o in a_fragment_offsets(g, r))
        return fill, a_fill, word_rd, a_rd

    @cute.jit
    def _smem_mainloop(self, *, k_begin, k_end, ring, row_bytes, lut_addr, off, acc):
        """Shared-memory ring (module docstring): each warp streams its own K16 rows through
        ``stages`` slots with cp.async, so only warp barriers are needed. Row k_begin + i lives
        in slot i % stages. Step s of a group: wait until the row of slot s has landed (at most
        stages - 2 newer groups pending), barrier (every lane's copies visible; every lane done
        reading slot s - 1), refill slot s - 1 with the row stages - 1 ahead, commit (one group
        per step, also past the end: the counting stays uniform), then read slot s and decode
        it."""
        stages = self.smem_stages
        lane = ring.lane
        fill, a_fill, word_rd, a_rd = self._ring_pointers(ring)
        for d in cutlass.range_constexpr(stages - 1):
            self._fill_slot(d, k_begin + d, k_end, lane, fill, row_bytes, a_fill)
            ptx.cp_async_commit()
        for g0 in cutlass.range(k_begin, k_end, stages, unroll=self.unroll):
            for s in cutlass.range_constexpr(stages):
                k_row = g0 + s
                ptx.cp_async_wait(stages - 2)
                cute.arch.sync_warp()
                refill = (s + stages - 1) % stages
                self._fill_slot(refill, k_row + stages - 1, k_end, lane, fill, row_bytes, a_fill)
                ptx.cp_async_commit()
                if k_row < k_end:
                    words, a_vals = self._read_slot(s, word_rd, a_rd)
                    self._accumulate_row(words, a_vals, lut_addr, off, acc)
        # No copy may still be writing the ring when the CTA exits.
        ptx.cp_async_wait(0)

    @cute.jit
    def _epilogue(self, *, out, acc, m, row_base, tile0, bz, g, r, n_tiles: cutlass.Constexpr):
        """Lane holds C rows g, g+8 and columns 2r, 2r+1 of each n-block; rows >= M are never
        stored (fp32 partials ``[bz, row, col]`` under split-K, else the compute dtype)."""
        for mt in cutlass.range_constexpr(self.m_tiles):
            for half in cutlass.range_constexpr(2):
                row = row_base + mt * 16 + half * 8 + g
                if row < m:
                    for nt in cutlass.range_constexpr(n_tiles):
                        for nb in cutlass.range_constexpr(2):
                            base = nt * self.m_tiles * 8 + mt * 8 + nb * 4 + 2 * half
                            col = (tile0 + nt) * 16 + nb * 8 + 2 * r
                            lo = acc[base]
                            hi = acc[base + 1]
                            if cutlass.const_expr(self.write_partials):
                                out[bz, row, col] = lo
                                out[bz, row, col + 1] = hi
                            elif cutlass.const_expr(self.bf16):
                                out[row, col // 2] = Int32(ptx.f32x2_to_bfloat2(lo, hi))
                            else:
                                out[row, col // 2] = Int32(ptx.f32x2_to_half2(lo, hi))


@dataclasses.dataclass(frozen=True)
class _SmemRing:
    """The lane's coordinates and base addresses the shared-memory ring is set up from."""

    lane: object
    warp: object
    r: object
    g: object
    m: object
    row_base: object
    tile0: object
    a_base: object
    a_row_bytes: object
    pay_base: object
    first: object
