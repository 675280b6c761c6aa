"""Swap-AB on Hopper tensor cores: weights decoded into ``wgmma``'s register A operand.

The shared decode (:mod:`b12x.kernels.wgmma_decode`) decodes a K16 row into shared memory and
multiplies it as ``wgmma``'s B operand: two shared-memory passes per weight (the ``stmatrix``
store and the MMA's read) and a barrier between the decode and the MMA. Here the product is
computed transposed, ``C^T[N, M] = Wq^T[N, K] · A^T[K, M]``: each warp decodes its weights
straight into the **A registers** of an ``m64nMk16`` ``wgmma`` (the decoded N16 x K16 tile is
the ``mma.sync`` A fragment of 16 weight rows: no shared memory, no shuffle), and the CTA's
token rows are the MMA's **B** operand in shared memory. A weight is decoded once per CTA of up
to 256 tokens and never leaves its thread's registers.

Geometry
--------
* ``warps`` (whole warpgroups) each own ``n_tiles`` N16 tiles of the CTA's
  ``cta_tiles = n_tiles·warps`` (warp ``w``: CTA tiles ``w·n_tiles ..``, its payload run).
  Warpgroup ``v``'s MMA ``nt`` has the 64 weight rows of tiles ``(4v + q)·n_tiles + nt``,
  q = 0..3 (warp q of a warpgroup supplies rows ``16q ..`` of the A operand).
* ``cta_m = 16·m_tiles`` tokens per CTA (``wgmma``'s N, <= 256); a thread holds
  ``n_tiles·8·m_tiles`` fp32 accumulators (<= 128,
  :data:`~b12x.kernels.shared_layout.SWAP_MAX_ACCUMULATORS`). Register ``8t + 4nb + c`` of MMA
  ``nt`` is weight row ``16·tile + g + 8·(c // 2)``, token ``16t + 8nb + 2r + c % 2``
  (:mod:`b12x.kernels.wgmma`, "Accumulators", with rows and columns swapped).

Shared memory (:func:`~b12x.kernels.shared_layout.swap_ab_layout`): ``stages`` cp.async slots of
``rows`` K16 rows; a row is the CTA's payload run then its token rows as one K-major
``cta_m x 16`` operand in core matrices (token ``i``, k-half ``h`` at ``256·(i // 8) + 128·h +
16·(i % 8)``: LBO 128, SBO 256, :func:`~b12x.kernels.wgmma.descriptor`). Tokens past M are
zero-filled without a read; K16 rows past the range copy zero bytes (their products are exact
zeros: a zero payload decodes to finite weights, spec §2).

Schedule (one CTA barrier per step of ``rows`` K16 rows; register buffers ``s % 2``):

1. ``wgmma.fence``, the step's MMAs (A: buffer ``s % 2``, B: slot ``s % stages``), commit;
2. ``wgmma.wait_group 1``: step ``s - 1``'s MMAs have retired, so buffer ``(s + 1) % 2`` and
   slot ``s - 1`` are free for this warpgroup;
3. decode step ``s + 1`` (its slot landed before the previous barrier) into buffer
   ``(s + 1) % 2``: the ALUs decode while the tensor cores run step ``s``;
4. ``cp.async.wait_group stages - 4`` (step ``s + 2`` has landed), ``fence.proxy.async``,
   the CTA barrier (every warpgroup is past step 2, every copy of step ``s + 2`` is visible);
5. refill slot ``s - 1`` with step ``s - 1 + stages``, commit.

What bounds it (H100 80GB, 2026-12-06; :mod:`b12x.ops.dense.mainloop` has the sweep)
-------------------------------------------------------------------------------------
* **256 tokens per CTA (M > 128): the token copies' L2 bandwidth.** Every CTA covers only 128
  weight rows (more would need more than 128 accumulators per thread), so at M = 256 the 224
  CTAs read the 256 x 8192 token tile 224 times: 940 MB in the GEMM's 328 us = 2.9 TB/s of L2
  reads, and M = 4096 reads 16 times that in 5111 us, the same 2.9 TB/s. ncu at M = 256: top
  stall long scoreboard (3.1 cycles per issue), 0.29 issued per scheduler, L2 hit 82 %. The
  lever is fewer copies of a token tile per SM: a cluster sharing it (TMA multicast), not more
  decode work per CTA.
* **128 tokens (65..128): decode issue.** 8 warps per SM at 2 N16 tiles each; ncu at M = 64
  (64 x 256): 0.55 issued per scheduler, no pipe above 45 %. SASS per decoded weight of the
  steady loop (``benchmarks/sass_budget.py --swap-ab``, MCG K4; fp16 / bf16): 128 x 256
  6.60 / 7.60, 256 x 128 8.73 / 9.71, against 5.83 / 6.83 for the per-warp kernel (``--tiles
  1x4``): the copies and their addresses cost 0.8 per weight at 128 tokens and 2.9 at 256
  (twice the tokens for half the weight rows).
* Each step's ``fence.proxy.async`` compiles to ``MEMBAR.ALL.CTA`` + ``FENCE.VIEW.ASYNC.S``
  (checked by compiling without it: 7 MEMBARs become 1); ncu shows no membar stall above 0.1
  cycles per issue, so it is not what bounds the loop today, but a TMA copy (async proxy, an
  mbarrier instead of the fence) would remove it together with the copies' address math.

Summation order: every output element gets one K16 product per ``wgmma`` in K order, fp32, as
in every other dense mainloop (whether the tensor core sums a K16 product in the same order for
A from registers as for ``mma.sync`` is measured by ``tests/b12x/test_dense_swap_ab_gpu.py``;
PTX does not promise it).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Uint32

from b12x.kernels import ptx, wgmma
from b12x.kernels.mainloop import ring_word_indices, zero_accumulators
from b12x.kernels.shared_decode import SharedDecodeMainloop
from b12x.kernels.shared_layout import check_swap_ab, swap_ab_layout

__all__ = ["SwapAbMainloop", "A_REGISTER_ORDER"]

#: The decoded tile's registers ``(g, 2r), (g, 2r+8), (g+8, 2r), (g+8, 2r+8)`` (the ``mma.sync``
#: B fragment of weight rows g, g+8) in the A fragment's order ``(g, 2r), (g+8, 2r), (g, 2r+8),
#: (g+8, 2r+8)``: register ``A_REGISTER_ORDER[j]`` of the tile is A word ``j``.
A_REGISTER_ORDER = (0, 2, 1, 3)


class SwapAbMainloop(SharedDecodeMainloop):
    """One swap-AB geometry's mainloop (module docstring); built at trace time. It reuses the
    shared decode's copy plan, slot fills and tile decode; it has no fragment buffers."""

    def __init__(self, fmt, bits: int, *, bf16: bool, m_tiles: int, n_tiles: int, warps: int,
                 rows: int, stages: int):  # fmt: skip
        check_swap_ab(
            True, wgmma=True, bits=bits, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
            m_warps=warps, rows=rows, stages=stages,
        )  # fmt: skip
        super().__init__(
            fmt, bits, bf16=bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps, m_warps=warps,
            rows=rows, stages=stages,
        )  # fmt: skip

    def _build_layout(self):
        """:func:`~b12x.kernels.shared_layout.swap_ab_layout` (its ``cta_m``, the tokens per
        CTA, is one ``wgmma``'s N)."""
        return swap_ab_layout(
            bits=self.bits, m_tiles=self.m_tiles, n_tiles=self.n_tiles, warps=self.warps,
            rows=self.rows, stages=self.stages,
        )  # fmt: skip

    def _a_chunk_offset(self, c):
        """Token chunk ``c`` (half ``c % 2`` of token ``i = c // 2``: two lanes copy one token's
        32 contiguous bytes) in core-matrix order: ``SBO·(i // 8) + LBO·(c % 2) + 16·(i % 8)``.
        (Copying one k-half of 8 tokens per 8-lane phase instead, so each phase writes a whole
        core matrix, was slower at every M on the H100: 448 against 328 us at M = 256.)"""
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
        b_desc = wgmma.descriptor(smem + Uint32(self.layout.a_offset))
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
            desc = wgmma.descriptor_at(b_desc, slot * lay.slot_bytes + row * lay.row_a)
            for nt in range(self.n_tiles):
                base = self._a_base(buf, row, nt)
                idx = range(nt * count, (nt + 1) * count)
                out = wgmma.mma_rs(
                    [acc[i] for i in idx], [a_regs[base + j] for j in range(4)], desc,
                    n=lay.cta_m, bf16=self.bf16,
                )  # fmt: skip
                for i, v in zip(idx, out, strict=True):
                    acc[i] = v

    def _wait(self, acc, pending: int) -> None:
        """``wgmma.wait_group pending``; the accumulators pass through it."""
        wgmma.wait_in_place(acc, 8 * self.m_tiles * self.n_tiles, pending)

    @cute.jit
    def run(self, *, lanes, k_begin, k_end, row_bytes, lut_addr, off):
        """The mainloop over K16 rows ``[k_begin, k_end)`` (module docstring, "Schedule");
        returns the accumulators (``n_tiles·8·m_tiles`` fp32, MMA ``nt`` at ``nt·8·m_tiles``)."""
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
                self._wait(acc, 1)  # step - 1 retired: buffer (s + 1) % 2 and its slot free
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
