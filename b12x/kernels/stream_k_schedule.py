"""The stream-K schedule's integer math (:mod:`b12x.kernels.stream_k`), in plain Python.

The same functions run in the kernel (on DSL integers: only ``+``, ``-``, ``*`` and ``//`` of
non-negative values) and on the host (:func:`segments`, the tests' mirror of what each CTA
runs), so the two cannot drift. Importing this module loads nothing but the standard library.

Terms: a *unit* is one trip of the mainloop's unrolled body (``span`` K16 rows); ``units`` per
tile; ``total = tiles·units`` in tile-major order; ``ctas <= total``.
"""

from __future__ import annotations

__all__ = ["head_owner", "segments", "stream_k_range", "stream_k_units"]


def stream_k_units(k_rows, span):
    """Units (mainloop trips of ``span`` K16 rows) of one tile's K range of ``k_rows``."""
    return (k_rows + span - 1) // span


def stream_k_range(c, total, ctas):
    """``(start, end)``: the units CTA ``c`` of ``ctas`` owns out of ``total`` (ranges differ
    by at most one unit)."""
    return c * total // ctas, (c + 1) * total // ctas


def head_owner(u, total, ctas):
    """The CTA whose range holds unit ``u``: the largest ``c`` with ``c·total // ctas <= u``
    (``c·total // ctas <= u`` iff ``c·total < (u + 1)·ctas``)."""
    return ((u + 1) * ctas + total - 1) // total - 1


def segments(c: int, total: int, ctas: int, units: int) -> list[tuple[int, int, int, list]]:
    """What CTA ``c`` runs, in order: ``(tile, u0, u1, peers)`` per segment (units ``[u0,
    u1)`` of ``tile``), ``peers`` the CTAs whose partials a head adds, in order (empty for a
    whole tile; ``None`` for a piece, which writes a partial instead)."""
    if not 0 < ctas <= total:
        raise ValueError(f"ctas: expected 1..{total} (one unit at least per CTA), got {ctas}")
    start, end = stream_k_range(c, total, ctas)
    out = []
    for tile in range(start // units, (end - 1) // units + 1):
        u0 = max(start, tile * units) - tile * units
        u1 = min(end, (tile + 1) * units) - tile * units
        if u0 > 0:
            out.append((tile, u0, u1, None))
        else:
            last = head_owner(tile * units + units - 1, total, ctas)
            out.append((tile, u0, u1, list(range(c + 1, last + 1))))
    return out
