"""Swap-AB on Hopper tensor cores: weights decoded into ``wgmma``'s register A operand.

The shared decode (:mod:`b12x.kernels.wgmma_decode`) stores a decoded K16 row to shared memory
and multiplies it as ``wgmma``'s B operand. Here the product is computed transposed,
``C^T[N, M] = Wq^T[N, K] · A^T[K, M]``: each warp decodes its weights straight into the **A
registers** of an ``m64nMk16`` ``wgmma`` (the decoded N16 x K16 tile is the ``mma.sync`` A
fragment of 16 weight rows: no shared memory, no shuffle), and the CTA's token rows are the
**B** operand in shared memory. A weight is decoded once per CTA of up to 256 tokens.

Geometry: ``warps`` (whole warpgroups) each own ``n_tiles`` N16 tiles of the CTA's
``cta_tiles = n_tiles·warps``; warpgroup ``v``'s MMA ``nt`` has the 64 weight rows of tiles
``(4v + q)·n_tiles + nt``, q = 0..3. ``cta_m = 16·m_tiles`` tokens per CTA (<= 256); a thread
holds ``n_tiles·8·m_tiles`` fp32 accumulators (<= :data:`~b12x.kernels.shared_layout.
SWAP_MAX_ACCUMULATORS`). Register ``8t + 4nb + c`` of MMA ``nt`` is weight row ``16·tile + g +
8·(c // 2)``, token ``16t + 8nb + 2r + c % 2`` (:mod:`b12x.kernels.wgmma`, transposed).

Shared memory (:func:`~b12x.kernels.shared_layout.swap_ab_layout`): ``stages`` cp.async slots of
``rows`` K16 rows; a row is the CTA's payload run then its tokens as one K-major ``cta_m x 16``
operand in core matrices (token ``i``, k-half ``h`` at ``256·(i // 8) + 128·h + 16·(i % 8)``:
LBO 128, SBO 256). Tokens past M are zero-filled without a read; K16 rows past the range copy
zero bytes (exact zero products, spec §2). The step schedule: :meth:`SwapAbMainloop._run_copied`;
token sharing in CTA clusters (TMA multicast): :meth:`SwapAbMainloop._run_shared`. What bounds
it: docs/evidence/dense-swap-ab-bounds.md.

Summation order: every output element gets one K16 product per ``wgmma`` in K order, fp32, as
in every other dense mainloop (whether the tensor core sums a K16 product in the same order for
A from registers as for ``mma.sync`` is measured by ``tests/b12x/test_dense_swap_ab_gpu.py``;
PTX does not promise it).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int16, Int64, Uint32
from cutlass.cute.nvgpu import cpasync

from b12x.kernels import ptx, wgmma
from b12x.kernels.mainloop import ring_word_indices, zero_accumulators
from b12x.kernels.shared_decode import SharedDecodeMainloop
from b12x.kernels.shared_layout import TOKEN_TILE_ALIGN, check_swap_ab, swap_ab_layout

__all__ = ["SwapAbMainloop", "A_REGISTER_ORDER"]

#: The decoded tile's registers ``(g, 2r), (g, 2r+8), (g+8, 2r), (g+8, 2r+8)`` (the ``mma.sync``
#: B fragment of weight rows g, g+8) in the A fragment's order ``(g, 2r), (g+8, 2r), (g, 2r+8),
#: (g+8, 2r+8)``: register ``A_REGISTER_ORDER[j]`` of the tile is A word ``j``.
A_REGISTER_ORDER = (0, 2, 1, 3)
#: MMA groups each step leaves in flight (its own): step ``s - 1``'s have retired, so the
#: decode of step ``s + 1`` may overwrite their A registers.
IN_FLIGHT = 1


class SwapAbMainloop(SharedDecodeMainloop):
    """One swap-AB geometry's mainloop (module docstring); built at trace time. It reuses the
    shared decode's copy plan, slot fills and tile decode; it has no fragment buffers."""

    def __init__(self, fmt, bits: int, *, bf16: bool, m_tiles: int, n_tiles: int, warps: int,
                 rows: int, stages: int, cluster: int = 1):  # fmt: skip
        check_swap_ab(
            True, wgmma=True, bits=bits, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
            m_warps=warps, rows=rows, stages=stages, cluster=cluster,
        )  # fmt: skip
        self.cluster = cluster
        #: Tokens of a token tile each CTA of the cluster copies.
        self.share = 16 * m_tiles // cluster
        super().__init__(
            fmt, bits, bf16=bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps, m_warps=warps,
            rows=rows, stages=stages,
        )  # fmt: skip

    def _build_layout(self):
        """:func:`~b12x.kernels.shared_layout.swap_ab_layout` (its ``cta_m``, the tokens per
        CTA, is one ``wgmma``'s N)."""
        return swap_ab_layout(
            bits=self.bits, m_tiles=self.m_tiles, n_tiles=self.n_tiles, warps=self.warps,
            rows=self.rows, stages=self.stages, cluster=self.cluster,
        )  # fmt: skip

    def allocate(self):
        """The CTA's shared memory: 16-byte aligned, or :data:`TOKEN_TILE_ALIGN` when TMA writes
        swizzled token tiles into it."""
        if self.cluster == 1:
            return super().allocate()
        allocator = cutlass.memory.SmemAllocator()
        return Uint32(
            allocator.allocate(self.layout.total, byte_alignment=TOKEN_TILE_ALIGN).toint()
        )

    def token_share_layout(self):
        """One CTA's share of a K16 row's token tile: ``share`` tokens x 16 elements, 32 B per
        token, 32-byte swizzle (``Swizzle<1, 4, 3>`` on byte addresses)."""
        inner = cute.make_layout((self.share, 16), stride=(16, 1))
        return cute.make_composed_layout(cute.make_swizzle(1, 4, 3), 0, inner)

    def make_token_tma(self, a):
        """Host side (``cluster`` > 1): the TMA atom and coordinate tensor over the activations
        ``a`` (``[M, K/2]`` packed pairs, viewed as ``[M, K]`` 16-bit), one share per copy."""
        a16 = cute.recast_tensor(a, cutlass.BFloat16)
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SMulticastOp(), a16, self.token_share_layout(),
            (self.share, 16),
        )  # fmt: skip

    def _a_chunk_offset(self, c):
        """Token chunk ``c`` (half ``c % 2`` of token ``i = c // 2``: two lanes copy one token's
        32 contiguous bytes) in core-matrix order: ``SBO·(i // 8) + LBO·(c % 2) + 16·(i % 8)``.
        (Copying one k-half of 8 tokens per 8-lane phase instead, so each phase writes a whole
        core matrix, was slower: docs/evidence/dense-swap-ab.md.)"""
        i = c // 2
        return (i // 8) * wgmma.CORE_SBO + (c % 2) * wgmma.CORE_LBO + (i % 8) * 16

    def setup(self, *, tid, lane, warp, first, pay_cta, a, a_row_source, smem=None):
        """``(fill, word_rd, b_desc)``: the thread's copy plan (the shared decode's, tokens in
        core matrices), the lane's ring-word addresses in its warp's run of a slot row, and the
        B descriptor of slot 0, row 0's tokens. ``a_row_source(local)`` maps token ``local``
        (0 .. cta_m - 1) to ``(row, live)`` as in :meth:`SharedDecodeMainloop.setup`."""
        if smem is None:
            smem = self.allocate()
        fill = self._copy_plan(smem, tid=tid, pay_cta=pay_cta, a=a, a_row_source=a_row_source)
        warp_run = smem + Uint32(warp * (self.n_tiles * 32 * self.bits))
        word_rd = [warp_run + Uint32(idx * 4) for idx in ring_word_indices(first, self.bits)]
        if self.cluster == 1:
            b_desc = wgmma.descriptor(smem + Uint32(self.layout.a_offset))
        else:
            b_desc = wgmma.descriptor_swizzle32(smem + Uint32(self.layout.a_offset))
        return fill, word_rd, b_desc

    def _decode_step(self, slot: int, buf: int, word_rd, lut_addr, off, a_regs) -> None:
        """Decode the warp's ``n_tiles`` tiles of every K16 row of ``slot`` into register
        buffer ``buf`` (all ring-word loads first, then the decodes)."""
        tiles = [(row, nt) for row in range(self.rows) for nt in range(self.n_tiles)]
        words = [self._tile_words(slot, row, nt, word_rd) for row, nt in tiles]
        for (row, nt), tile_words in zip(tiles, words, strict=True):
            regs = self._tile_regs(tile_words, lut_addr, off)
            base = self._a_base(buf, row, nt)
            for j, src in enumerate(A_REGISTER_ORDER):
                a_regs[base + j] = regs[src]

    def _a_base(self, buf: int, row: int, nt: int) -> int:
        return ((buf * self.rows + row) * self.n_tiles + nt) * 4

    def _mma_step(self, slot: int, buf: int, b_desc, a_regs, acc) -> None:
        """The warpgroup's MMAs of one step: per K16 row, one ``m64n{cta_m}k16`` per N16 tile
        slot ``nt`` of its warps."""
        lay = self.layout
        count = 8 * self.m_tiles
        for row in range(self.rows):
            desc = wgmma.descriptor_at(b_desc, self._token_offset(slot, row))
            for nt in range(self.n_tiles):
                base = self._a_base(buf, row, nt)
                idx = range(nt * count, (nt + 1) * count)
                out = wgmma.mma_rs(
                    [acc[i] for i in idx], [a_regs[base + j] for j in range(4)], desc,
                    n=lay.cta_m, bf16=self.bf16,
                )  # fmt: skip
                for i, v in zip(idx, out, strict=True):
                    acc[i] = v

    def _token_offset(self, slot: int, row: int) -> int:
        """Bytes from the first token tile to ``(slot, row)``'s (the layout's addressing)."""
        lay = self.layout
        if self.cluster == 1:
            return slot * lay.slot_bytes + row * lay.row_a
        return (slot * self.rows + row) * lay.row_a

    def _wait(self, acc, pending: int) -> None:
        """``wgmma.wait_group pending``; the accumulators pass through it."""
        wgmma.wait_in_place(acc, 8 * self.m_tiles * self.n_tiles, pending)

    @cute.jit
    def run(self, *, lanes, k_begin, k_end, row_bytes, lut_addr, off, tokens=None):
        """The mainloop over K16 rows ``[k_begin, k_end)`` (schedules: :meth:`_run_copied`,
        :meth:`_run_shared`); returns the accumulators (``n_tiles·8·m_tiles`` fp32, MMA ``nt``
        at ``nt·8·m_tiles``). ``tokens``: :meth:`token_copier`'s bundle when ``cluster`` > 1."""
        if cutlass.const_expr(self.cluster == 1):
            acc = self._run_copied(lanes=lanes, k_begin=k_begin, k_end=k_end, row_bytes=row_bytes,
                                   lut_addr=lut_addr, off=off)  # fmt: skip
        else:
            acc = self._run_shared(lanes=lanes, k_begin=k_begin, k_end=k_end, row_bytes=row_bytes,
                                   lut_addr=lut_addr, off=off, tokens=tokens)  # fmt: skip
        return acc

    @cute.jit
    def _run_copied(self, *, lanes, k_begin, k_end, row_bytes, lut_addr, off):
        """``cluster`` 1: every CTA copies its own tokens with its payload (cp.async).

        Schedule (one CTA barrier per step of ``rows`` K16 rows; register buffers ``s % 2``):

        1. ``wgmma.fence``, the step's MMAs (A: buffer ``s % 2``, B: slot ``s % stages``), commit;
        2. ``wgmma.wait_group 1``: step ``s - 1``'s MMAs have retired, so buffer ``(s + 1) % 2`` and
           slot ``s - 1`` are free for this warpgroup;
        3. decode step ``s + 1`` (its slot landed before the previous barrier) into buffer ``(s + 1)
           % 2``: the ALUs decode while the tensor cores run step ``s``;
        4. ``cp.async.wait_group stages - 4`` (step ``s + 2`` has landed), ``fence.proxy.async``,
           the CTA barrier (every warpgroup is past step 2, every copy of step ``s + 2`` is
           visible);
        5. refill slot ``s - 1`` with step ``s - 1 + stages``, commit.
        """
        lay = self.layout
        fill, word_rd, b_desc = lanes
        stages = self.stages
        rows = self.rows
        acc = zero_accumulators(self.m_tiles, self.n_tiles)
        a_regs = cute.make_rmem_tensor((2 * rows * self.n_tiles * 4,), Uint32)
        # steps 0 and 1 land first: step 0's MMAs precede the loop's first proxy fence
        self._prologue(k_begin, k_end, row_bytes, fill, landed=2, proxy_fence=True)
        self._decode_step(0, 0, word_rd, lut_addr, off, a_regs)
        for k0 in cutlass.range(k_begin, k_end, lay.period * rows, unroll=1):
            for s in cutlass.range_constexpr(lay.period):
                step = k0 + s * rows
                wgmma.fence()  # this step's A registers were written by the decode
                self._mma_step(s % stages, s % 2, b_desc, a_regs, acc)
                wgmma.commit()
                self._wait(acc, IN_FLIGHT)  # step - 1 retired: buffer (s + 1) % 2 and its slot free
                self._decode_step((s + 1) % stages, (s + 1) % 2, word_rd, lut_addr, off, a_regs)
                ptx.cp_async_wait(stages - 4)  # step + 2 has landed
                wgmma.fence_proxy_async()
                cute.arch.sync_threads()
                refill = (s + stages - 1) % stages
                self._fill(refill, step + (stages - 1) * rows, k_end, row_bytes, fill)
                ptx.cp_async_commit()
        self._wait(acc, 0)
        ptx.cp_async_wait(0)  # no copy may still be writing shared memory at exit
        return acc

    # ---- token sharing (cluster > 1): _run_shared's docstring

    @cute.jit
    def token_copier(self, *, tid, warp, smem, tma, tok_block, k_rows):
        """The CTA's token-copy bundle (``cluster`` > 1): ``(tma, tok_block, rank, is thread 0,
        barriers, its share's first tile, is warp 0, k_rows)``. ``tma`` is
        :meth:`make_token_tma`'s ``(atom, coordinate tensor)``; ``tok_block`` the CTA's token
        tile (``by``); ``k_rows`` the K16 rows of A (a row index past every split: wholly out of
        bounds). Thread 0 initialises the slots' mbarriers (full: one arrival plus the bytes;
        empty: one arrival per CTA of the cluster); the cluster barrier that follows makes them
        every CTA's before any copy or release can reach one."""
        lay = self.layout
        bars = smem + Uint32(lay.barrier_offset)
        if tid == 0:
            for slot in cutlass.range_constexpr(self.stages):
                cute.arch.mbarrier_init(self._full(bars, slot), 1)
                cute.arch.mbarrier_init(self._empty(bars, slot), self.cluster)
        cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        rank = cute.arch.block_idx_in_cluster()
        tiles = smem + Uint32(lay.a_offset) + Uint32(rank * (self.share * 32))
        return tma, tok_block, rank, tid == 0, bars, tiles, warp == 0, k_rows

    def _full(self, bars, slot: int):
        """``slot``'s full barrier: its token tile of the current phase has landed here."""
        return cute.make_ptr(Int64, bars + Uint32(8 * slot), cute.AddressSpace.smem,
                             assumed_align=8)  # fmt: skip

    def _empty(self, bars, slot: int):
        """``slot``'s empty barrier: every CTA of the cluster has retired its last use."""
        return cute.make_ptr(Int64, bars + Uint32(8 * (self.stages + slot)),
                             cute.AddressSpace.smem, assumed_align=8)  # fmt: skip

    @cute.jit
    def _issue_tokens(self, tokens, step, k0, k_end) -> None:
        """Warp 0: step ``step`` (its K16 rows ``k0 ..``) into slot ``step % stages``. From
        the second use of the slot on, first wait until every CTA of the cluster released the
        previous use (the empty barrier's phase ``(step // stages - 1) & 1``); then thread 0
        arms the full barrier for the whole tile and the warp issues this CTA's share of each
        K16 row (a row past ``k_end`` reads row ``k_rows``: zeros), multicast to the cluster."""
        (atom, coords), tok_block, rank, first_thread, bars, tiles, copies, k_rows = tokens
        slot = step % self.stages
        if copies:
            if step >= self.stages:
                cute.arch.mbarrier_wait(self._empty(bars, slot), (step // self.stages - 1) % 2)
            bar = self._full(bars, slot)
            if first_thread:
                cute.arch.mbarrier_arrive_and_expect_tx(bar, self.rows * self.layout.row_a)
            for row in cutlass.range_constexpr(self.rows):
                kt = k0 + row
                k_tile = cutlass.select_(kt < k_end, kt, k_rows)
                tile = tiles + Uint32(self.rows * self.layout.row_a) * Uint32(slot)
                dst = cute.make_ptr(
                    cutlass.BFloat16, tile + Uint32(row * self.layout.row_a),
                    cute.AddressSpace.smem, assumed_align=256,
                )  # fmt: skip
                s_tile = cute.make_tensor(dst, self.token_share_layout())
                g_tile = cute.local_tile(
                    coords, (self.share, 16), (tok_block * self.cluster + rank, k_tile)
                )
                s_part, g_part = cpasync.tma_partition(
                    atom, 0, cute.make_layout(1), cute.group_modes(s_tile, 0, 2),
                    cute.group_modes(g_tile, 0, 2),
                )  # fmt: skip
                cute.copy(atom, g_part, s_part, tma_bar_ptr=bar,
                          mcast_mask=Int16((1 << self.cluster) - 1))  # fmt: skip

    @cute.jit
    def _release_tokens(self, tokens, slot: int) -> None:
        """Thread 0, after the CTA barrier that follows every warp's retirement of ``slot``'s
        MMAs: one arrival on ``slot``'s empty barrier in every CTA of the cluster."""
        bars, first_thread = tokens[4], tokens[3]
        if first_thread:
            for peer in cutlass.range_constexpr(self.cluster):
                cute.arch.mbarrier_arrive(self._empty(bars, slot), peer)

    @cute.jit
    def _run_shared(self, *, lanes, k_begin, k_end, row_bytes, lut_addr, off, tokens):
        """``cluster`` > 1: payload by cp.async (``stages - 1`` steps ahead, the CTA barrier
        publishes it), tokens by TMA multicast (``stages - 2`` steps ahead, full and empty
        mbarriers).

        Token sharing (``cluster`` 2 or 4): The CTAs of a cluster along N (``cluster`` consecutive
        weight-row tiles, the same token tile and K range) share one token tile: per K16 row, CTA
        rank ``q`` copies tokens ``q·share ..`` (``share = cta_m / cluster``) with one TMA
        (``cp.async.bulk.tensor``, 32-byte swizzle, box ``16 x share``) multicast into every CTA of
        the cluster, so L2 serves each token tile once per cluster instead of once per CTA. The
        token tiles leave the cp.async slots (:func:`~b12x.kernels.shared_layout.swap_ab_layout`,
        ``cluster`` > 1) and are read through :func:`~b12x.kernels.wgmma.descriptor_swizzle32`.
        Ordering:

        * slot ``t % stages`` has an mbarrier; thread 0 arms it (``arrive.expect_tx`` of the whole
          tile's ``rows·32·cta_m`` bytes, every rank's copy landing in this CTA), warp 0 issues the
          CTA's copies; every thread waits on its phase ``(t // stages) & 1`` before step ``t``'s
          MMAs;
        * the step barrier is a cluster barrier (``barrier.cluster.arrive`` / ``wait``, release /
          acquire): after it every warp of every CTA of the cluster has retired step ``s - 1``, so
          its slot may be overwritten in all of them. No ``fence.proxy.async``: tokens are written
          and read by the async proxy only, and the payload (cp.async) is read by ordinary loads;
        * a K16 row past the split's end is copied from K16 row ``K / 16`` (wholly out of bounds:
          TMA writes zeros and still counts the bytes), and a step past the loop's last is never
          issued, so every copy into a CTA is one that CTA waits for before it exits.
        """
        lay = self.layout
        fill, word_rd, b_desc = lanes
        stages = self.stages
        rows = self.rows
        acc = zero_accumulators(self.m_tiles, self.n_tiles)
        a_regs = cute.make_rmem_tensor((2 * rows * self.n_tiles * 4,), Uint32)
        span = lay.period * rows
        steps = (k_end - k_begin + span - 1) // span * lay.period  # every step the loop runs
        for d in cutlass.range_constexpr(stages - 1):
            self._fill(d, k_begin + d * rows, k_end, row_bytes, fill)
            ptx.cp_async_commit()
        for d in cutlass.range_constexpr(stages - 2):
            if d < steps:
                self._issue_tokens(tokens, d, k_begin + d * rows, k_end)
        ptx.cp_async_wait(stages - 3)  # the payload of steps 0 and 1 has landed
        cute.arch.sync_threads()
        self._decode_step(0, 0, word_rd, lut_addr, off, a_regs)
        for k0 in cutlass.range(k_begin, k_end, span, unroll=1):
            t0 = (k0 - k_begin) // rows  # the loop body's first step
            for s in cutlass.range_constexpr(lay.period):
                step = k0 + s * rows
                t = t0 + s
                cute.arch.mbarrier_wait(self._full(tokens[4], s % stages), (t // stages) % 2)
                wgmma.fence()  # this step's A registers were written by the decode
                self._mma_step(s % stages, s % 2, b_desc, a_regs, acc)
                wgmma.commit()
                self._wait(acc, IN_FLIGHT)  # step - 1 retired: buffer (s + 1) % 2 and its slot free
                self._decode_step((s + 1) % stages, (s + 1) % 2, word_rd, lut_addr, off, a_regs)
                ptx.cp_async_wait(stages - 4)  # step + 2's payload has landed
                cute.arch.sync_threads()
                # step t - 1's tokens are free in this CTA; released only where a refill waits
                if t >= 1 and t - 1 + stages < steps:
                    self._release_tokens(tokens, (s + stages - 1) % stages)
                self._fill((s + stages - 1) % stages, step + (stages - 1) * rows, k_end,
                           row_bytes, fill)  # fmt: skip
                ptx.cp_async_commit()
                if t + stages - 2 < steps:
                    self._issue_tokens(tokens, t + stages - 2, step + (stages - 2) * rows, k_end)
        self._wait(acc, 0)
        ptx.cp_async_wait(0)  # no copy may still be writing shared memory at exit
        return acc
