"""The ``wgmma`` shared decode over QSRT pair payloads: :class:`PairWgmmaDecode`.

The mainloop of :class:`b12x.kernels.wgmma_decode.WgmmaDecodeMainloop` (cp.async slots, one
barrier per step, every warp decodes while two warpgroups multiply) with the pair kernel's rule
for where each tile's rate comes from (:mod:`b12x.kernels.moe_pair_gemm`, spec §4.2): only
which bytes a slot row holds and at which rate each tile is decoded change. The MMAs, A rows,
fragment buffers and summation order are the uniform mainloop's, so a route's bits do not
depend on which of the two pair mainloops ran it.

Layout per K16 row (``b_lo``, ``b_hi``: the record rates; a CTA covers 16 N16 tiles)
-----------------------------------------------------------------------------------
* **N axis (FC1), one pair per CTA.** The slot row is the pair's run of the prepared order,
  ``[record 0: 8 tiles x 32·b_lo B ‖ record 1: 8 tiles x 32·b_hi B]`` (``256·(b_lo + b_hi)`` B,
  so the layout is sized at ``bits = (b_lo + b_hi) / 2``, an even sum: P43 has none). Warp
  ``w`` decodes tile ``j`` of each record at ``w·h + j`` (``h = n_tiles / 2``), one half at each
  rate, so every warp does the same work; CTA tile ``8·record + w·h + j`` is columns ``16·``
  that of the pair (the uniform epilogue's order).
* **K axis (FC2).** K16 row ``16p + t`` of A is row ``t mod 8`` of record ``t // 8`` of pair
  ``p``: the slot row is that record plane's run of the CTA's 16 tiles (``16·32·b`` B at the
  record's rate; the layout is sized at the larger rate, the fill copies only the record's
  chunks). A step's rows share one record (``8 % shared_rows == 0``), picked CTA-uniformly at
  run time; both rates' decodes are compiled.

Invariants
----------
* The K range starts at row 0 (the K-axis record of a row is absolute); a ``k_split`` > 1
  folds every ``K/16/k_split`` rows, the per-warp pair kernel's group order.
* The fill reads nothing past a record's run: a chunk beyond it, like a row past the K range,
  is a zero-byte copy.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int64, Uint32

from b12x.kernels import ptx
from b12x.kernels.mainloop import ring_word_indices
from b12x.kernels.shared_layout import FRAG_TILE_BYTES
from b12x.kernels.wgmma_decode import WgmmaDecodeMainloop

__all__ = ["PAIR_AXES", "RECORD_ROWS", "PairWgmmaDecode", "pair_layout_bits"]

#: The rate axes of a pair launch: FC1 records on N, FC2 on K.
PAIR_AXES = ("n", "k")
#: K16 rows (K axis) or N16 tiles (N axis) of one record.
RECORD_ROWS = 8


def pair_layout_bits(axis: str, rates: tuple[tuple[int, int], ...]) -> int:
    """The rate the slots are sized at for a launch whose bodies have record ``rates``: the
    half sum on the N axis (a slot row is one whole pair; every body's sum must be the same and
    even), the largest rate on the K axis (a slot row is one record's run)."""
    if axis not in PAIR_AXES:
        raise ValueError(f"axis: expected one of {PAIR_AXES}, got {axis!r}")
    if axis == "k":
        return max(max(r) for r in rates)
    sums = {lo + hi for lo, hi in rates}
    if len(sums) != 1 or next(iter(sums)) % 2:
        raise ValueError(
            f"rates: an N-axis pair slot holds one whole pair, which needs one even rate sum, "
            f"got {rates}"
        )
    return next(iter(sums)) // 2


class PairWgmmaDecode(WgmmaDecodeMainloop):
    """One pair body's ``wgmma`` shared decode (module docstring); built at trace time.

    ``fmts`` / ``rates``: record 0 and record 1 decoders and rates; ``layout_bits``: the rate the
    slots are sized at (:func:`pair_layout_bits` over every body of the launch, so both bodies of
    a dynamic launch share one layout). :meth:`setup` takes ``first`` as the records' pair of
    first ring words, :meth:`run` ``off`` as their pair of window offsets; on the K axis
    ``row_bytes`` is ``(base_lo, base_hi, pair_bytes, plane_lo, plane_hi)`` (:meth:`_fill`).
    """

    def __init__(self, fmts, rates, *, axis: str, layout_bits: int, bf16: bool, m_tiles: int,
                 n_tiles: int, warps: int, rows: int, stages: int, k_split: int = 1):  # fmt: skip
        super().__init__(
            fmts[0], layout_bits, bf16=bf16, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
            rows=rows, stages=stages, k_split=k_split,
        )  # fmt: skip
        lay = self.layout
        if axis not in PAIR_AXES:
            raise ValueError(f"axis: expected one of {PAIR_AXES}, got {axis!r}")
        if lay.cta_tiles != 2 * RECORD_ROWS:
            raise ValueError(
                f"n_tiles x warps: a pair CTA covers 16 N16 tiles, got {lay.cta_tiles}"
            )
        if axis == "n" and (n_tiles % 2 or 8 * 32 * sum(rates) != lay.row_pay):
            raise ValueError(
                f"rates/layout_bits: an N-axis slot row is one pair ({8 * 32 * sum(rates)} B) "
                f"split evenly per warp, the layout holds {lay.row_pay} B at n_tiles={n_tiles}"
            )
        if axis == "k" and (RECORD_ROWS % rows or max(rates) > layout_bits):
            raise ValueError(
                f"rows/layout_bits: a K-axis step stays in one record ({RECORD_ROWS} % {rows}) "
                f"and the slot holds the larger rate ({max(rates)} <= {layout_bits})"
            )
        self.fmts = tuple(fmts)
        self.rates = tuple(rates)
        self.axis = axis

    def setup(self, *, tid, lane, warp, g, r, first, pay_cta, a, a_row_source, smem=None):
        """The uniform tuple with the ring-word addresses per record (``first`` is the pair of
        records' first ring words) and, on the N axis, the warp's fragment tiles at ``w·h``."""
        lanes = list(super().setup(
            tid=tid, lane=lane, warp=warp, g=g, r=r, first=first[0], pay_cta=pay_cta, a=a,
            a_row_source=a_row_source, smem=smem,
        ))  # fmt: skip
        smem = lanes[6]
        b_lo = self.rates[0]
        word_rd = []
        for rec, bits in enumerate(self.rates):
            if self.axis == "n":
                half = self.n_tiles // 2
                run = (
                    smem + Uint32(rec * RECORD_ROWS * 32 * b_lo) + Uint32(warp * (half * 32 * bits))
                )
            else:
                run = smem + Uint32(warp * (self.n_tiles * 32 * bits))
            word_rd.append([run + Uint32(idx * 4) for idx in ring_word_indices(first[rec], bits)])
        lanes[1] = tuple(word_rd)
        if self.axis == "n":
            frag = smem + Uint32(self.layout.frag_offset + lane * 16)
            lanes[3] = frag + Uint32(warp * (self.n_tiles // 2 * FRAG_TILE_BYTES))
        return tuple(lanes)

    def _record_tiles(self, rec: int):
        """``(word byte offset, CTA tile offset)`` of the warp's tiles of record ``rec``, relative
        to its ring-word and fragment addresses (:meth:`setup`)."""
        bits = self.rates[rec]
        if self.axis == "n":
            return [(j * 32 * bits, rec * RECORD_ROWS + j) for j in range(self.n_tiles // 2)]
        return [(nt * 32 * bits, nt) for nt in range(self.n_tiles)]

    def _decode_records(self, slot: int, buf: int, recs, word_rd, lut_addr, off, frag_st) -> None:
        """Decode the warp's tiles of records ``recs`` for every K16 row of the step, each at
        its record's decoder, rate and window offset (:meth:`_decode_tiles`)."""
        tiles = [
            (row, word_rd[rec], w_off, self.fmts[rec], self.rates[rec], off[rec], t)
            for row in range(self.rows)
            for rec in recs
            for w_off, t in self._record_tiles(rec)
        ]
        self._decode_tiles(slot, buf, tiles, lut_addr, frag_st)

    @cute.jit
    def _decode_step(self, slot: int, buf: int, step, word_rd, lut_addr, off, frag_st) -> None:
        """N axis: both records' tiles of every row. K axis: the step's record (absolute K16
        row ``step``: record ``(step // 8) % 2``), a CTA-uniform branch between the two rates."""
        if cutlass.const_expr(self.axis == "n"):
            self._decode_records(slot, buf, (0, 1), word_rd, lut_addr, off, frag_st)
        else:
            if (step // RECORD_ROWS) % 2 == 0:
                self._decode_records(slot, buf, (0,), word_rd, lut_addr, off, frag_st)
            else:
                self._decode_records(slot, buf, (1,), word_rd, lut_addr, off, frag_st)

    def _fill_payload(self, pay, pay_off: int, k_row, live, row_bytes) -> None:
        """N axis: the uniform copy (a row is the pair's run, ``row_bytes`` apart). K axis: K16
        row ``kt = 16p + t`` copies record ``t // 8``'s run of row ``t mod 8`` of pair ``p``
        (``row_bytes`` = ``(base_lo, base_hi, pair_bytes, plane_lo, plane_hi)``, the records'
        byte addresses of the CTA's first tile in pair 0, row 0), chunks past that run copying
        nothing (the setup's payload source is the chunk's byte offset, ``pay_cta`` = 0)."""
        if self.axis == "n":
            super()._fill_payload(pay, pay_off, k_row, live, row_bytes)
            return
        base_lo, base_hi, pair_bytes, plane_lo, plane_hi = row_bytes
        run_lo = Int64(2 * RECORD_ROWS * 32 * self.rates[0])
        run_hi = Int64(2 * RECORD_ROWS * 32 * self.rates[1])
        hi = (k_row % (2 * RECORD_ROWS)) >= RECORD_ROWS
        row_src = (
            cutlass.select_(hi, base_hi, base_lo)
            + Int64(k_row // (2 * RECORD_ROWS)) * pair_bytes
            + Int64(k_row % RECORD_ROWS) * cutlass.select_(hi, plane_hi, plane_lo)
        )
        run = cutlass.select_(hi, run_hi, run_lo)
        for dst, src, en in pay:
            in_run = Uint32(cutlass.select_(src < run, Uint32(16), Uint32(0)))
            size = Uint32(cutlass.select_(live, in_run, Uint32(0)))
            ptx.cp_async_16(dst, row_src + src, size, dst_offset=pay_off, enable=en)
