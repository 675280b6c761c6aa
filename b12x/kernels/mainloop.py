"""Shared device primitives of the trellis GEMM mainloops (dense, grouped MoE, QSRT pairs).

The dense (:mod:`b12x.kernels.dense_gemm`), grouped (:mod:`b12x.kernels.moe_gemm`) and pair
(:mod:`b12x.kernels.moe_pair_gemm`) kernels compose these pieces instead of repeating them:

* **Lane setup** (:func:`lane_coords`): lane, warp and the ``mma.sync`` fragment coordinates
  ``r = lane % 4`` (column pair) and ``g = lane // 4`` (row group).
* **Accumulators** (:func:`zero_accumulators`): ``m_tiles·n_tiles·8`` fp32 registers, zeroed.
* **A pointers**: :func:`clamped_a_pointers` (dense: rows past M read row M-1) and
  :func:`routed_a_pointers` (MoE: slot rows gathered through ``route_rows``; a padding slot reads
  row 0 and is never stored).
* **Payload pointers** (:func:`ring_word_indices`, :func:`ring_word_pointers`): the lane's 2–3
  ring words of a tile, as indices or as byte pointers.
* **Shared A blocks** (:func:`a_chunk_offset`, :func:`a_fragment_offsets`): where a 16-byte
  copy of activation rows lands in a shared A block, and where a lane reads its fragment back
  (one bank swizzle, used by the ring and the shared decode alike).
* **MMA** (:func:`mma_accumulate`): one N16 tile's B registers against every M16 block.
* **Staged loads** (:func:`load_tile_words`, :func:`load_a_frags`, :func:`stage_rows`): every
  load of ``depth`` K16 rows is issued before the first decode.
* **Decode and accumulate** (:func:`accumulate_staged`): the staged rows through the shared body
  :func:`b12x.kernels.dense_gemm.decode_and_accumulate` (passed in as ``accumulate``; this module
  imports no kernel module, so the kernels may import it without an import circle).
* **Epilogue** (:func:`store_pair`, :func:`routed_epilogue`): a lane's C pair rounded to the
  compute dtype and stored, and the MoE scatter of every live route row.

Every helper is either plain Python (inlined while the kernel is traced) or a ``@cute.jit``
function called during tracing: each emits exactly the ops, in the order, that the kernels
emitted inline before, so the generated PTX is byte-identical (checked by dumping it).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from b12x.kernels import ptx
from b12x.kernels.trellis_decode import ring_words_per_lane

__all__ = [
    "accumulate_staged",
    "clamped_a_pointers",
    "lane_coords",
    "load_a_frags",
    "load_tile_words",
    "ring_word_indices",
    "ring_word_pointers",
    "a_chunk_offset",
    "a_fragment_offsets",
    "mma_accumulate",
    "routed_a_pointers",
    "routed_epilogue",
    "routed_rows",
    "stage_rows",
    "tile_row_words",
    "store_pair",
    "zero_accumulators",
]


def lane_coords(tid):
    """``(lane, warp, r, g)`` of thread ``tid``: ``r`` picks the fragment's column pair, ``g``
    its row group (rows ``g`` and ``g + 8`` of an M16 block)."""
    lane = tid % 32
    warp = tid // 32
    return lane, warp, lane % 4, lane // 4


def zero_accumulators(m_tiles: int, n_tiles: int):
    """The lane's fp32 accumulators (``acc[nt·m_tiles·8 + mt·8 + nb·4 + c]``), zeroed."""
    acc = cute.make_rmem_tensor((m_tiles * n_tiles * 8,), Float32)
    for i in range(m_tiles * n_tiles * 8):
        acc[i] = Float32(0.0)
    return acc


def clamped_a_pointers(a, row_base, m, m_tiles: int, g, r):
    """``(a_base, a_row_bytes, a_ptrs)``: ``a_ptrs[2·mt + half]`` addresses the lane's A words
    (row ``row_base + 16·mt + 8·half + g``, k = 2r) of K16 row 0. Rows >= M read row M-1 and are
    never stored: MMA rows are independent, so their C rows are don't-care values."""
    a_base = a.iterator.toint()
    a_row_bytes = Int64(a.shape[1]) * 4
    a_ptrs = []
    for mt in range(m_tiles):
        for half in range(2):
            row = row_base + mt * 16 + half * 8 + g
            a_ptrs.append(a_base + Int64(cutlass.min(row, m - 1)) * a_row_bytes + r * 4)
    return a_base, a_row_bytes, a_ptrs


def routed_rows(route_rows, row_base, m_tiles: int, g):
    """Yield the routes of the lane's C rows: slot ``row_base + 16·mt + 8·half + g`` for every
    M16 block ``mt`` and ``half`` (rows g, g+8), in that order. A generator, so a caller that
    turns each route into a pointer emits its ops route by route."""
    for mt in range(m_tiles):
        for half in range(2):
            yield route_rows[row_base + mt * 16 + half * 8 + g]


def routed_a_pointers(a, route_rows, row_base, m_tiles: int, g, r):
    """``(a_ptrs, rows, n_rows)`` of a route block: slot ``row_base + 16·mt + 8·half + g``
    computes route ``rows[2·mt + half]`` (:func:`routed_rows`); a route ``>= n_rows`` is a
    padding slot (the sentinel), whose pointer reads row 0 and whose result is never stored."""
    a_base = a.iterator.toint()
    a_row_bytes = Int64(a.shape[1]) * 4
    n_rows = a.shape[0]
    a_ptrs = []
    rows = []
    for route in routed_rows(route_rows, row_base, m_tiles, g):
        rows.append(route)  # >= n_rows: a padding slot (the sentinel), never stored
        safe = Int32(cutlass.select_(route < n_rows, route, Int32(0)))
        a_ptrs.append(a_base + Int64(safe) * a_row_bytes + r * 4)
    return a_ptrs, rows, n_rows


def ring_word_indices(first, bits: int):
    """Yield the lane's ring word indices ``first, first+1, ...`` (mod ``8·bits``) within a
    tile: its 2–3 words, wherever the tile lives (global memory or a shared-memory slot). A
    generator, so a caller that turns each index into a pointer emits its ops word by word."""
    ring = 8 * bits
    for i in range(ring_words_per_lane(bits)):
        idx = first + i
        yield Int32(cutlass.select_(idx >= ring, idx - ring, idx))


def ring_word_pointers(base, first, bits: int, tile0=None) -> list:
    """Byte pointers of the lane's ring words ``first, first+1, ...`` (mod ``8·bits``) of a
    tile: the tile's ring starts at byte address ``base`` (Int64), or, with ``tile0``, at
    ``base + tile0·32·bits``."""
    ring = 8 * bits
    ptrs = []
    for idx in ring_word_indices(first, bits):
        word = idx if tile0 is None else tile0 * ring + idx
        ptrs.append(base + Int64(word) * 4)
    return ptrs


def a_chunk_offset(c):
    """Byte offset, in shared A blocks of 16 rows x 32 B, of 16-byte chunk ``c``: half ``c % 2``
    of tile row ``c // 2``, with the halves of rows 4..7 mod 8 swapped so that the fragment
    reads of :func:`a_fragment_offsets` hit 32 distinct banks. (Chunks of later M16 blocks
    continue the rows: block ``c // 32`` starts ``512`` B further.)"""
    return (c // 2) * 32 + ((c % 2) ^ ((c // 8) % 2)) * 16


def a_fragment_offsets(g, r) -> tuple:
    """``(lo, hi)``: byte offsets of the lane's A words (row ``g``, k-half 0 and 1, column pair
    ``r``) in an A block written by :func:`a_chunk_offset`; row ``g + 8`` is 256 B further."""
    swap = ((g // 4) % 2) * 16
    return g * 32 + r * 4 + swap, g * 32 + r * 4 + (16 - swap)


def mma_accumulate(a_frags: list, b_regs, acc, acc_base: int, m_tiles: int, bf16: bool) -> None:
    """Accumulate one N16 tile: ``b_regs`` are its four packed B registers (n-block 0 =
    ``b_regs[0:2]``, n-block 1 = ``b_regs[2:4]``), ``a_frags[mt]`` the A fragment of M16 block
    ``mt``; two ``mma.sync.m16n8k16`` per block into ``acc[acc_base + mt·8 + nb·4 + c]``."""
    for mt in range(m_tiles):
        for nb in range(2):
            base = acc_base + mt * 8 + nb * 4
            c = [acc[base + i] for i in range(4)]
            d = ptx.mma_m16n8k16(a_frags[mt], (b_regs[2 * nb], b_regs[2 * nb + 1]), c, bf16=bf16)
            for i in range(4):
                acc[base + i] = d[i]


def load_tile_words(ptrs: list, row_off, tile: int, bits: int) -> list:
    """The lane's ring words of tile ``tile`` (an immediate ``tile·32·bits`` bytes further)."""
    return [Uint32(ptx.ld_global_nc_u32_imm(p + row_off, tile * 32 * bits)) for p in ptrs]


def tile_row_words(ptrs: list, row_off, bits: int, n_tiles: int) -> list:
    """The lane's ring words of N16 tiles ``0 .. n_tiles-1`` of one K16 row (``row_off`` bytes
    from row 0), one list per tile."""
    return [load_tile_words(ptrs, row_off, nt, bits) for nt in range(n_tiles)]


def load_a_frags(a_ptrs: list, a_off, m_tiles: int) -> list:
    """A fragments of one K16 row (byte offset ``a_off`` from row 0) for every M16 block."""
    frags = []
    for mt in range(m_tiles):
        frag = []
        for q in range(4):
            ptr = a_ptrs[2 * mt + q % 2] + a_off
            frag.append(Uint32(ptx.ld_global_nc_u32_imm(ptr, 16 * (q // 2))))
        frags.append(frag)
    return frags


def stage_rows(depth: int, row_words, a_ptrs: list, a_row, m_tiles: int) -> list:
    """Issue every load of ``depth`` K16 rows before the first decode: per row ``d``,
    ``row_words(d)`` (the ring words of each N16 tile) then the A fragments at byte offset
    ``a_row(d)``. Returns ``[(words, a_frags)]`` per row."""
    staged = []
    for d in range(depth):
        words = row_words(d)
        staged.append((words, load_a_frags(a_ptrs, a_row(d), m_tiles)))
    return staged


def accumulate_staged(staged: list, n_tiles: int, accumulate) -> None:
    """Decode and accumulate the staged rows in order: ``accumulate(a_frags, words, nt)`` per
    N16 tile ``nt`` of each row."""
    for words, a_frags in staged:
        for nt in range(n_tiles):
            accumulate(a_frags, words[nt], nt)


def store_pair(out, row, col_word, lo, hi, bf16: bool) -> None:
    """Round the fp32 pair ``(lo, hi)`` to the compute dtype and store it as one int32 word."""
    if bf16:
        out[row, col_word] = Int32(ptx.f32x2_to_bfloat2(lo, hi))
    else:
        out[row, col_word] = Int32(ptx.f32x2_to_half2(lo, hi))


@cute.jit
def routed_epilogue(
    out: cute.Tensor,
    acc: cute.Tensor,
    rows: list,
    n_rows: Int32,
    col_word,
    m_tiles: cutlass.Constexpr,
    n_tiles: cutlass.Constexpr,
    bf16: cutlass.Constexpr,
):
    """The MoE scatter: C rows ``g, g+8`` of every M16 block to their routes ``rows`` (padding
    slots, ``>= n_rows``, are never stored); ``col_word(nt, nb)`` is the output word of the
    lane's column pair in n-block ``nb`` of tile ``nt``."""
    for mt in cutlass.range_constexpr(m_tiles):
        for half in cutlass.range_constexpr(2):
            row = rows[2 * mt + half]
            if row < n_rows:
                for nt in cutlass.range_constexpr(n_tiles):
                    for nb in cutlass.range_constexpr(2):
                        base = nt * m_tiles * 8 + mt * 8 + nb * 4 + 2 * half
                        store_pair(out, row, col_word(nt, nb), acc[base], acc[base + 1], bf16)
