"""Dense trellis GEMM: ``C[M, N] = A[M, K] · Wq[K, N]`` with Wq decoded in registers (mma.sync).

Layout
------
* **Operands.** ``a``: the (already rotated) activations, fp16 or bf16 ``[M, K]`` viewed as
  ``int32[M, K/2]`` (two elements per word). ``payload``: ``int32[K/16, N/16, 8b]`` (the int16
  trellis viewed as int32; ring words, spec §1.2). Output: either the compute dtype ``[M, N]``
  viewed as ``int32[M, N/2]`` (no split-K) or fp32 partials ``[S, M, N]`` (split-K), summed by
  :class:`SplitKReduceKernel` in split order (deterministic).
* **Work split.** A CTA has ``warps`` warps; warp w of CTA (x, y, z) owns N16 tiles
  ``(x·warps + w)·n_tiles + [0, n_tiles)``, M16 blocks ``y·m_tiles + [0, m_tiles)`` and K16 rows
  ``[z·kps, min((z+1)·kps, K/16))`` (``kps`` = K16 rows per split, a runtime argument).
* **Mainloop** (:func:`decode_and_accumulate`, a shared body): per K16 row, each lane loads its
  A fragments (rows g, g+8; k = 2r.., 2r+8..) and, per N16 tile, its 2–3 ring words, cuts its eight
  windows, decodes them to four packed registers ``(w0,w1),(w2,w3),(w4,w5),(w6,w7)`` and issues
  two ``mma.sync.m16n8k16`` per M16 block: n-block 0 with B = ``(w0w1, w2w3)`` and n-block 1 with
  B = ``(w4w5, w6w7)`` (the EXL3 tile order is the B-fragment order, §1.5). fp32 accumulation.
  Loads go through register stages ``depth`` rows ahead (ring words via per-lane byte pointers
  with immediate per-tile offsets, ``ld.global.nc``; one ``IMAD.WIDE`` per pointer and row). The
  loop body covers ``depth + 1`` rows, so each stage lives in fixed registers and no register is
  copied between iterations; a row past the split's end (last group only) is skipped.
* **Epilogue.** Lane holds C rows ``g, g+8`` and columns ``2r, 2r+1`` of each n-block; rows
  ``>= M`` read row M-1 (clamped A pointers) and are never stored (MMA rows are independent, so
  their C rows are don't-care values).

Invariants
----------
* The codebook, bitrate, compute dtype and tile shape are compile-time (a
  :class:`~b12x.formats.DecodeFormat` plus ints); the LUT arrives in one Int64 slot (§2.8).
* Requirements checked by the host wrapper: K % 16 == 0, N % (16·n_tiles·warps) == 0, all
  buffers contiguous and 16-byte aligned. One K16 row of the payload (``2·b·N`` bytes) must fit
  in 31 bits (N < 2^27), which every real layer does by six orders of magnitude.
* Split-K partial sums are reduced in a fixed order, so results are bitwise reproducible, and on
  one-hot activations every split-K setting gives bit-identical outputs.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from b12x.abi import shared_body
from b12x.formats import DecodeFormat
from b12x.kernels import ptx
from b12x.kernels.trellis_decode import (
    decode_states_to_half2x4,
    lane_ring_start,
    lane_windows,
    ring_words_per_lane,
)

__all__ = ["DenseTrellisGemmKernel", "SplitKReduceKernel", "decode_and_accumulate"]


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
    for mt in range(m_tiles):
        for nb in range(2):
            base = acc_base + mt * 8 + nb * 4
            c = [acc[base + i] for i in range(4)]
            d = ptx.mma_m16n8k16(a_frags[mt], (regs[2 * nb], regs[2 * nb + 1]), c, bf16=bf16)
            for i in range(4):
                acc[base + i] = d[i]


class DenseTrellisGemmKernel:
    """One compiled specialisation of the dense trellis GEMM (see the module docstring)."""

    def __init__(
        self,
        fmt: DecodeFormat,
        bits: int,
        *,
        bf16: bool,
        m_tiles: int,
        n_tiles: int,
        warps: int,
        write_partials: bool,
        unroll: int = 1,
        depth: int = 1,
    ):
        fmt.check_bits(bits)
        self.fmt = fmt
        self.bits = bits
        self.bf16 = bf16
        self.m_tiles = m_tiles
        self.n_tiles = n_tiles
        self.warps = warps
        self.write_partials = write_partials
        self.unroll = unroll
        self.depth = depth

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
        grid_y = (m + 16 * self.m_tiles - 1) // (16 * self.m_tiles)
        self.kernel(a, payload, out, lut_addr, k_rows_per_split).launch(
            grid=(grid_x, grid_y, splits), block=(32 * self.warps, 1, 1), stream=stream
        )

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

    @cute.kernel
    def kernel(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        lut_addr: Int64,
        k_rows_per_split: Int32,
    ):
        tid = cute.arch.thread_idx()[0]
        bx, by, bz = cute.arch.block_idx()
        lane = tid % 32
        warp = tid // 32
        r = lane % 4
        g = lane // 4
        m = a.shape[0]
        k_rows = payload.shape[0]
        tile0 = (bx * self.warps + warp) * self.n_tiles
        row_base = by * (16 * self.m_tiles)
        k_begin = bz * k_rows_per_split
        k_end = cutlass.min(k_begin + k_rows_per_split, k_rows)

        acc = cute.make_rmem_tensor((self.m_tiles * self.n_tiles * 8,), Float32)
        for i in cutlass.range_constexpr(self.m_tiles * self.n_tiles * 8):
            acc[i] = Float32(0.0)

        # A rows >= M read row M-1 (clamped) and are never stored: MMA rows are independent, so
        # their C rows are don't-care values and need no zeroing.
        a_base = a.iterator.toint()
        a_row_bytes = Int64(a.shape[1]) * 4
        a_ptrs = []
        for mt in cutlass.range_constexpr(self.m_tiles):
            for half in cutlass.range_constexpr(2):
                row = row_base + mt * 16 + half * 8 + g
                a_ptrs.append(a_base + Int64(cutlass.min(row, m - 1)) * a_row_bytes + r * 4)

        first, off = lane_ring_start(lane, self.bits)
        nw = ring_words_per_lane(self.bits)
        ring = 8 * self.bits
        # Bytes of one K16 row of the payload, 2bN < 2^31 (N < 2^27, module docstring): a 32-bit
        # factor, so each row offset is one 32x32->64 multiply (IMAD.WIDE) per pointer; the
        # product itself is formed in 64 bits.
        row_bytes = Int64(payload.shape[1] * (4 * ring))
        pay_base = payload.iterator.toint()
        word_ptrs = []
        for i in cutlass.range_constexpr(nw):
            idx = first + i
            idx = Int32(cutlass.select_(idx >= ring, idx - ring, idx))
            word_ptrs.append(pay_base + Int64(tile0 * ring + idx) * 4)
        # Register stages: ``depth`` K16 rows are in flight while one is decoded. The loop body
        # covers depth + 1 rows so every stage lives in fixed registers (no copies between
        # iterations): step s loads row g0 + s + depth into stage (s + depth) % stages, then
        # decodes stage s (row g0 + s; past the split's end in the last group, skipped). Loads
        # past the end are clamped to the last row (re-reads, never used).
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
                    a_frags = [a_vals[4 * mt : 4 * mt + 4] for mt in range(self.m_tiles)]
                    for nt in cutlass.range_constexpr(self.n_tiles):
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

        for mt in cutlass.range_constexpr(self.m_tiles):
            for half in cutlass.range_constexpr(2):
                row = row_base + mt * 16 + half * 8 + g
                if row < m:
                    for nt in cutlass.range_constexpr(self.n_tiles):
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


class SplitKReduceKernel:
    """``out[m, n] = Σ_s partials[s, m, n]`` in split order, rounded to the compute dtype.

    ``partials``: fp32 ``[S, M, N]``; ``out``: compute dtype ``[M, N]`` viewed as int32
    ``[M, N/2]``. One thread per output pair.
    """

    def __init__(self, *, bf16: bool, threads: int = 256):
        self.bf16 = bf16
        self.threads = threads

    @cute.jit
    def __call__(self, partials: cute.Tensor, out: cute.Tensor, stream):
        pairs = out.shape[0] * out.shape[1]
        grid = (pairs + self.threads - 1) // self.threads
        self.kernel(partials, out).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, partials: cute.Tensor, out: cute.Tensor):
        idx = cute.arch.block_idx()[0] * self.threads + cute.arch.thread_idx()[0]
        half_n = out.shape[1]
        if idx < out.shape[0] * half_n:
            row = idx // half_n
            pair = idx - row * half_n
            lo = Float32(0.0)
            hi = Float32(0.0)
            for s in range(partials.shape[0]):
                lo = lo + partials[s, row, 2 * pair]
                hi = hi + partials[s, row, 2 * pair + 1]
            if cutlass.const_expr(self.bf16):
                out[row, pair] = Int32(ptx.f32x2_to_bfloat2(lo, hi))
            else:
                out[row, pair] = Int32(ptx.f32x2_to_half2(lo, hi))
