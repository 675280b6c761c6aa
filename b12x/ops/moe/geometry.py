"""The value types and decoder tile hints the MoE geometry tables share.

:mod:`b12x.ops.moe.dispatch` (route block, K split, GEMM and pair geometry) and
:mod:`b12x.ops.moe.fc2_tile` (the wave-balanced FC2 tile) both answer with a
:class:`GemmGeometry` and read the tile hints; they live here so neither table module imports
the other's module (dispatch lists every table, so it imports the FC2 tile's).
"""

from __future__ import annotations

from typing import NamedTuple

# the tile hints are defined with the dense tile predicates that read them (one definition)
from b12x.ops.dense.tiles import WIDE_TILE_CAP, WIDE_TILE_CAPS

__all__ = ["WIDE_TILE_CAP", "WIDE_TILE_CAPS", "GemmGeometry", "PairGeometry"]


class GemmGeometry(NamedTuple):
    """``(n_tiles, warps, depth)``: N16 tiles per warp, warps per K group, K16 rows in flight."""

    n_tiles: int
    warps: int
    depth: int


class PairGeometry(NamedTuple):
    """A pair launch's geometry and its rate axis (``"n"``: FC1, ``"k"``: FC2)."""

    n_tiles: int
    warps: int
    depth: int
    rate_axis: str
