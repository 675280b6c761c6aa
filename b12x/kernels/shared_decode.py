"""The shared-decode mainloop: a CTA decodes each K16 row's weights once, all its warps multiply.

Used by the dense GEMM (:mod:`b12x.kernels.dense_gemm`, ``m_warps`` >= 1) and the grouped MoE
GEMM (:mod:`b12x.kernels.moe_gemm`, ``MoeGemmSpec.m_warps`` >= 1). The two differ only in where
the CTA's activation rows come from (dense: rows ``cta_row0 ..`` clamped to M; MoE: the route
block's slots gathered through ``route_rows``), where its payload run starts (MoE: the block's
expert) and their epilogues; everything between the first copy and the last drain is here.

Layout and schedule:
A CTA covers ``cta_tiles = n_tiles·warps`` N16 tiles and ``cta_m = 16·m_tiles·m_warps`` rows.
Its shared memory (:mod:`b12x.kernels.shared_layout`): ``smem_stages`` cp.async slots of
``shared_rows`` K16 rows (each row: the CTA's payload run, then its A blocks), then two fragment
buffers. A *step* is ``shared_rows`` K16 rows. Software-pipelined with one barrier per step:

1. ``wait_group`` (step + 1 has landed) and a CTA barrier, which also proves every warp is done
   with step - 1 (its slot and its fragment buffer);
2. refill the slot of step - 1 with step + ``smem_stages`` - 1 (rows past the end copy zero
   bytes from a clamped address: no global read), ``commit_group``;
3. each warp decodes its ``n_tiles`` N16 tiles of step + 1 into fragment buffer ``(s+1) % 2``,
   each lane storing its four B registers as 16 B at ``16·lane`` of the tile's 512-byte block
   (a reader lane gets exactly its own B fragment back, conflict-free);
4. warp ``w = wm·(warps/m_warps) + wn`` multiplies its ``m_tiles`` M16 blocks (A fragments from
   the slot, bank-swizzled by :func:`b12x.kernels.mainloop.a_chunk_offset`) by the
   ``n_tiles·m_warps`` N16 tiles ``wn·n_tiles·m_warps ..`` of buffer ``s % 2``.

The prologue fills ``smem_stages - 1`` slots and decodes step 0; the loop body unrolls
``lcm(smem_stages, 2)`` steps so slot and buffer offsets are immediates; the CTA drains every
copy group before it returns. A warp whose rows are all dead (``live_rows`` false, warp-uniform)
skips its MMAs; the barriers stay outside the branch.

Summation order:
Each output element sees the same ``mma.sync`` operands in the same K order as the per-warp
mainloops. With ``k_split`` > 1 (the MoE's intra-CTA K split, ``K/16/k_split`` rows per slice)
the accumulators restart from zero at every slice boundary and the slices are added in slice
order, ``((s_0 + s_1) + s_2) + …``: exactly the per-warp grouped kernel's fixed-order
reduction, so a route's result does not depend on which mainloop ran it (the MoE's batch
invariance). The running sum lives in the layout's fold region (each thread its own 16-byte
groups, no barrier), not in a second register set: 64 more registers would halve the CTAs per
SM. Without a split (dense) one chain runs over the whole K range.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64, Uint32

from b12x.formats import DecodeFormat
from b12x.kernels import ptx
from b12x.kernels.mainloop import (
    a_chunk_offset,
    a_fragment_offsets,
    mma_accumulate,
    ring_word_indices,
    zero_accumulators,
)
from b12x.kernels.shared_layout import (
    A_BLOCK_BYTES,
    FRAG_TILE_BYTES,
    check_shared_decode,
    shared_decode_layout,
)
from b12x.kernels.trellis_decode import (
    decode_states_to_half2x4,
    lane_windows,
)
from b12x.kernels.wgmma import fence_proxy_async

__all__ = ["SharedDecodeMainloop"]


class SharedDecodeMainloop:
    """One shared-decode geometry's mainloop (module docstring); built at trace time.

    ``setup`` returns the lane's addresses, ``run`` the accumulators. The caller owns the CTA's
    coordinates, the payload run's address and the activation row source, and runs its own
    epilogue over ``mma_tiles`` N16 tiles starting at tile ``cta_tile0 + wn·mma_tiles``.
    """

    #: Decode-only helper warps (only the ``wgmma`` mainloop has them): none here.
    helpers = 0

    def __init__(
        self,
        fmt: DecodeFormat,
        bits: int,
        *,
        bf16: bool,
        m_tiles: int,
        n_tiles: int,
        warps: int,
        m_warps: int,
        rows: int,
        stages: int,
        k_split: int = 1,
    ):
        check_shared_decode(warps=warps, m_warps=m_warps, rows=rows, smem_stages=stages)
        if m_warps < 1:
            raise ValueError(f"m_warps: the shared decode needs m_warps >= 1, got {m_warps}")
        self.fmt = fmt
        self.bits = bits
        self.bf16 = bf16
        self.m_tiles = m_tiles
        self.n_tiles = n_tiles
        self.warps = warps
        self.m_warps = m_warps
        self.rows = rows
        self.stages = stages
        self.k_split = k_split
        self.layout = self._build_layout()

    def _build_layout(self):
        """The geometry's shared-memory layout (:func:`shared_decode_layout`; a mainloop with
        another layout overrides this)."""
        return shared_decode_layout(
            bits=self.bits, m_tiles=self.m_tiles, n_tiles=self.n_tiles, warps=self.warps,
            m_warps=self.m_warps, rows=self.rows, stages=self.stages, fold=self.k_split > 1,
        )  # fmt: skip

    def warp_coords(self, warp):
        """``(wm, wn)``: the warp's M group (rows ``wm·16·m_tiles ..`` of the CTA) and N group
        (MMA tiles ``wn·mma_tiles ..``)."""
        n_warps = self.warps // self.m_warps
        return warp // n_warps, warp % n_warps

    def setup(self, *, tid, lane, warp, g, r, first, pay_cta, a, a_row_source, smem=None):
        """The lane's copy plan and read addresses, as one tuple for :meth:`run`.

        ``pay_cta``: byte address (Int64) of the CTA's payload run in K16 row 0 (``cta_tiles``
        tiles, ``cta_tiles·32·bits`` contiguous bytes). ``a``: the activations (int32 ``[rows,
        K/2]``). ``a_row_source(local)`` maps the CTA's tile row ``local`` (0 .. cta_m - 1) to
        ``(row, live)``: the activation row to copy and whether it is real (a dead row is
        zero-filled without a read; ``row`` must still be a valid index).

        Payload chunks: chunk ``tid + j·threads`` of the run (16 B), the partial round's
        predicate built once. A chunks: ``c = tid + j·threads`` is half ``c % 2`` of tile row
        ``c // 2``, stored at :meth:`_a_chunk_offset` of the row's A region. The tuple ends with
        the shared-memory base address (a subclass derives its own addresses from it). ``smem``:
        that base when the caller allocated it (a kernel tracing two bodies allocates once),
        else :meth:`allocate` here.
        """
        lay = self.layout
        bits = self.bits
        if smem is None:
            smem = self.allocate()
        fill = self._copy_plan(smem, tid=tid, pay_cta=pay_cta, a=a, a_row_source=a_row_source)
        wm, wn = self.warp_coords(warp)
        warp_run = smem + Uint32(warp * (self.n_tiles * 32 * bits))  # its tiles in a row
        word_rd = [warp_run + Uint32(idx * 4) for idx in ring_word_indices(first, bits)]
        warp_a = smem + Uint32(wm * (self.m_tiles * A_BLOCK_BYTES))  # its M blocks in a row
        a_rd = tuple(warp_a + Uint32(o) for o in a_fragment_offsets(g, r))
        frag = smem + Uint32(lay.frag_offset + lane * 16)
        frag_st = frag + Uint32(warp * (self.n_tiles * FRAG_TILE_BYTES))
        frag_rd = frag + Uint32(wn * (lay.mma_tiles * FRAG_TILE_BYTES))
        fold = smem + Uint32(lay.fold_offset + tid * 16)  # its partial sums (k_split > 1)
        return fill, word_rd, a_rd, frag_st, frag_rd, fold, smem

    def allocate(self):
        """The CTA's shared memory for this layout (16-byte aligned): its base address."""
        allocator = cutlass.memory.SmemAllocator()
        return Uint32(allocator.allocate(self.layout.total, byte_alignment=16).toint())

    def live_row0(self, warp):
        """First CTA row of the unit whose MMAs are skipped together when all its rows are dead
        (the caller's ``live_rows``): the warp's own M blocks here."""
        return self.warp_coords(warp)[0] * (16 * self.m_tiles)

    def _a_chunk_offset(self, c):
        """Where A chunk ``c`` lands in a K16 row's A region (:func:`a_chunk_offset`)."""
        return a_chunk_offset(c)

    def _copy_plan(self, smem, *, tid, pay_cta, a, a_row_source):
        """``(pay, chunks)``: the thread's payload and A copies (:meth:`setup`)."""
        lay = self.layout
        threads = 32 * self.warps
        pay = []
        for j in range(lay.pay_rounds):
            c = tid + j * threads
            en = None  # a full round: every thread copies
            if (j + 1) * threads > lay.pay_chunks:
                en = Uint32(cutlass.select_(c < lay.pay_chunks, 1, 0))
            pay.append((smem + Uint32(c * 16), pay_cta + Int64(c) * 16, en))
        a_base = a.iterator.toint()
        a_row_bytes = Int64(a.shape[1]) * 4
        chunks = []
        for j in range(lay.a_rounds):
            c = tid + j * threads
            row, live = a_row_source(c // 2)
            dst = smem + Uint32(lay.a_offset + self._a_chunk_offset(c))
            src = a_base + Int64(row) * a_row_bytes + (c % 2) * 16
            size = Uint32(cutlass.select_(live, Uint32(16), Uint32(0)))
            en = None
            if (j + 1) * threads > lay.a_chunks:
                en = Uint32(cutlass.select_(c < lay.a_chunks, 1, 0))
            chunks.append((dst, src, size, en))
        return pay, chunks

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
    ):
        """The mainloop over K16 rows ``[k_begin, k_end)`` (module docstring); returns the
        accumulators (``m_tiles·mma_tiles·8`` fp32 per lane, the per-warp kernels' order).
        ``lanes``: :meth:`setup`'s tuple; ``row_bytes``: bytes of one payload K16 row (Int64);
        ``off``: the lane's window-0 bit offset; with ``k_split`` > 1 the accumulators fold
        every ``slice_rows`` K16 rows (a multiple of ``shared_rows``, ``k_split·slice_rows`` =
        the K range) in the fixed slice order (module docstring, "Summation order")."""
        lay = self.layout
        fill, word_rd, a_rd, frag_st, frag_rd, fold, _ = lanes
        acc = zero_accumulators(self.m_tiles, lay.mma_tiles)
        stages = self.stages
        rows = self.rows
        self._prologue(k_begin, k_end, row_bytes, fill)
        for i in cutlass.range_constexpr(rows):
            if k_begin + i < k_end:
                self._decode(0, 0, i, word_rd, lut_addr, off, frag_st)
        for k0 in cutlass.range(k_begin, k_end, lay.period * rows, unroll=1):
            for s in cutlass.range_constexpr(lay.period):
                step = k0 + s * rows
                # step + 1 has landed; every warp is done with step - 1 (its slot and buffer)
                ptx.cp_async_wait(stages - 3)
                cute.arch.sync_threads()
                refill = (s + stages - 1) % stages
                self._fill(refill, step + (stages - 1) * rows, k_end, row_bytes, fill)
                ptx.cp_async_commit()
                nxt = step + rows
                for i in cutlass.range_constexpr(rows):
                    if nxt + i < k_end:
                        self._decode((s + 1) % stages, (s + 1) % 2, i, word_rd, lut_addr, off,
                                     frag_st)  # fmt: skip
                if live_rows:
                    for i in cutlass.range_constexpr(rows):
                        if step + i < k_end:
                            self._multiply(s % stages, s % 2, i, a_rd, frag_rd, acc)
                    if cutlass.const_expr(self.k_split > 1):
                        self._slice_end(acc, fold, nxt=nxt, k_begin=k_begin, k_end=k_end,
                                        slice_rows=slice_rows)  # fmt: skip
        # No copy may still be writing shared memory when the CTA exits.
        ptx.cp_async_wait(0)
        if cutlass.const_expr(self.k_split > 1):  # noqa: SIM102 (trace-time if)
            if live_rows:
                self._fold_finish(acc, fold)
        return acc

    def _prologue(self, k_begin, k_end, row_bytes, fill, *, landed: int = 1,
                  proxy_fence: bool = False) -> None:  # fmt: skip
        """Fill the first ``smem_stages - 1`` slots (one copy group each), wait until the first
        ``landed`` steps have landed, then the CTA barrier that makes them every thread's (with
        ``proxy_fence``, after a ``fence.proxy.async``: a ``wgmma`` reads them before the
        loop's first fence)."""
        for d in range(self.stages - 1):
            self._fill(d, k_begin + d * self.rows, k_end, row_bytes, fill)
            ptx.cp_async_commit()
        ptx.cp_async_wait(self.stages - 1 - landed)  # pending groups once they have landed
        if proxy_fence:
            fence_proxy_async()
        cute.arch.sync_threads()

    @cute.jit
    def _slice_end(self, acc, fold, *, nxt, k_begin, k_end, slice_rows):
        """Fold the accumulators when a K slice ends before K16 row ``nxt`` (not the last slice:
        it stays in registers): :meth:`_settle` first, then :meth:`_fold`."""
        if (nxt - k_begin) % slice_rows == 0 and nxt < k_end:
            self._settle(acc)
            if nxt - k_begin == slice_rows:
                self._fold(acc, fold, add=False)
            else:
                self._fold(acc, fold, add=True)

    def _settle(self, acc) -> None:
        """Make the accumulators final before they are read: nothing to do for ``mma.sync``
        (its results are in registers when it retires); the wgmma mainloop waits here."""

    def _fold(self, acc, fold, *, add: bool) -> None:
        """End of a K slice: the lane's partial sums = ``acc`` (first slice) or partial sums +
        ``acc`` (later slices), stored to its fold region; then ``acc = 0``."""
        stride = 32 * self.warps * 16
        for q in range(self.m_tiles * self.layout.mma_tiles * 2):
            vals = [acc[4 * q + j] for j in range(4)]
            if add:
                old = ptx.ld_shared_v4(fold, offset=q * stride)
                vals = [ptx.u32_as_f32(old[j]) + vals[j] for j in range(4)]
            ptx.st_shared_v4(fold, [ptx.f32_as_u32(v) for v in vals], offset=q * stride)
            for j in range(4):
                acc[4 * q + j] = Float32(0.0)

    def _fold_finish(self, acc, fold) -> None:
        """After the last slice: ``acc`` = partial sums + ``acc`` (the fold's last addition)."""
        stride = 32 * self.warps * 16
        for q in range(self.m_tiles * self.layout.mma_tiles * 2):
            old = ptx.ld_shared_v4(fold, offset=q * stride)
            for j in range(4):
                acc[4 * q + j] = ptx.u32_as_f32(old[j]) + acc[4 * q + j]

    def _fill(self, slot: int, k0, k_end, row_bytes, fill) -> None:
        """Issue the copies of K16 rows ``k0 .. k0 + shared_rows - 1`` into ``slot`` (no
        commit). A row past the end copies zero bytes from a clamped address: it reads no global
        memory and is never decoded."""
        lay = self.layout
        pay, chunks = fill
        for i in range(self.rows):
            kt = k0 + i
            live = kt < k_end
            k_row = cutlass.min(kt, k_end - 1)
            self._fill_payload(pay, slot * lay.slot_bytes + i * lay.row_pay, k_row, live, row_bytes)
            a_off = slot * lay.slot_bytes + i * lay.row_a
            for dst, src, a_size, en in chunks:
                a_live = Uint32(cutlass.select_(live, a_size, Uint32(0)))
                ptx.cp_async_16(
                    dst, src + Int64(k_row) * 32, a_live, dst_offset=a_off, cache_global=False,
                    enable=en,
                )  # fmt: skip

    def _fill_payload(self, pay, pay_off: int, k_row, live, row_bytes) -> None:
        """Copy K16 row ``k_row``'s payload run to ``pay_off`` (zero bytes when not ``live``):
        rows ``row_bytes`` apart."""
        size = Uint32(cutlass.select_(live, Uint32(16), Uint32(0)))
        for dst, src, en in pay:
            src_k = src + Int64(k_row) * row_bytes
            ptx.cp_async_16(dst, src_k, size, dst_offset=pay_off, enable=en)

    def _decode(self, slot: int, buf: int, row: int, word_rd, lut_addr, off, frag_st) -> None:
        """Decode the warp's N16 tiles of K16 row ``row`` of ``slot`` (ring words read from
        shared memory) and store each lane's four B registers (16 B, lane l at 16·l) in
        fragment buffer ``buf``."""
        lay = self.layout
        for nt in range(self.n_tiles):
            regs = self._tile_regs(self._tile_words(slot, row, nt, word_rd), lut_addr, off)
            frag_off = buf * lay.frag_bytes + (row * lay.cta_tiles + nt) * FRAG_TILE_BYTES
            self._store_tile(frag_st, regs, frag_off)

    def _tile_words(self, slot: int, row: int, nt: int, word_rd) -> list:
        """The lane's ring words of the warp's N16 tile ``nt`` of K16 row ``row`` of ``slot``."""
        base = slot * self.layout.slot_bytes + row * self.layout.row_pay + nt * 32 * self.bits
        return [ptx.ld_shared_u32_imm(w, base) for w in word_rd]

    def _tile_regs(self, words, lut_addr, off) -> list:
        """A tile's eight windows decoded to the lane's four packed B registers."""
        states = lane_windows(words, off, self.bits)
        return decode_states_to_half2x4(
            self.fmt, self.bits, states, lut_addr, lut_in_smem=False, to_bf16=self.bf16
        )

    def _store_tile(self, frag_st, regs, frag_off: int) -> None:
        """Store a lane's four B registers of one decoded tile: 16 B at ``16·lane``."""
        ptx.st_shared_v4(frag_st, regs, offset=frag_off)

    def _multiply(self, slot: int, buf: int, row: int, a_rd, frag_rd, acc) -> None:
        """Accumulate the warp's M blocks (A fragments from the slot's A region) against its
        ``n_tiles·m_warps`` decoded N16 tiles of K16 row ``row`` (the lane reads its own B
        fragment from the fragment buffer)."""
        lay = self.layout
        a_frags = []
        for mt in range(self.m_tiles):
            base = slot * lay.slot_bytes + row * lay.row_a + lay.a_offset + mt * A_BLOCK_BYTES
            a_frags.append(
                [ptx.ld_shared_u32_imm(a_rd[q // 2], base + 256 * (q % 2)) for q in range(4)]
            )
        for j in range(lay.mma_tiles):
            frag_off = buf * lay.frag_bytes + (row * lay.cta_tiles + j) * FRAG_TILE_BYTES
            b = ptx.ld_shared_v4(frag_rd, offset=frag_off)
            mma_accumulate(a_frags, b, acc, j * self.m_tiles * 8, self.m_tiles, self.bf16)
