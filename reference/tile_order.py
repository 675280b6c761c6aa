"""Weight order inside a 16×16 trellis tile (spec §1.5) and the tile grid of a layer (§1.1).

Step ``t = 8·lane + j`` (lane 0..31, j 0..7) of a tile holds weight ``W_tile[k_local, n_local]``::

    r = lane % 4 ; g = lane // 4
    k_local = (2r, 2r+1, 2r+8, 2r+9)[j % 4]
    n_local = g + 8·(j // 4)

This is the B-operand fragment of ``mma.m16n8k16``. The map is a bijection between the 256 steps
and the 256 positions of the tile.

A layer's tiles form a ``[K/16, N/16]`` grid stored kt-major: tile ``(kt, nt)`` covers
``W[16kt:16kt+16, 16nt:16nt+16]``. :func:`tiles_to_matrix` takes per-step values
``[..., K/16, N/16, 256]`` (step order) to the matrix ``[..., K, N]``; :func:`matrix_to_tiles` is
its exact inverse. Leading dimensions (experts, batches) pass through; dtype and device are kept.
"""

from __future__ import annotations

import functools

import torch

from reference._checks import check_last_dim, check_min_ndim, check_tensor

TILE = 16
STEPS_PER_TILE = 256


@functools.cache
def _step_positions() -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(STEPS_PER_TILE, dtype=torch.int64)
    lane, j = t // 8, t % 8
    r, g = lane % 4, lane // 4
    k_offset = torch.tensor([0, 1, 8, 9], dtype=torch.int64)[j % 4]
    k_local = 2 * r + k_offset
    n_local = g + 8 * (j // 4)
    return k_local, n_local


def step_to_tile_position() -> tuple[torch.Tensor, torch.Tensor]:
    """``(k_local, n_local)``: two int64[256] tensors, the tile position of each step."""
    k_local, n_local = _step_positions()
    return k_local.clone(), n_local.clone()


@functools.cache
def _flat_position_of_step() -> torch.Tensor:
    """int64[256]: ``16·k_local + n_local`` of step t (row-major position inside the tile)."""
    k_local, n_local = _step_positions()
    return k_local * TILE + n_local


@functools.cache
def _step_of_flat_position() -> torch.Tensor:
    """int64[256]: the step that holds row-major tile position p (inverse permutation)."""
    inverse = torch.empty(STEPS_PER_TILE, dtype=torch.int64)
    inverse[_flat_position_of_step()] = torch.arange(STEPS_PER_TILE, dtype=torch.int64)
    return inverse


def step_of_tile_position() -> torch.Tensor:
    """int64[256]: the step index for row-major tile position ``16·k_local + n_local``."""
    return _step_of_flat_position().clone()


def tiles_to_matrix(values: torch.Tensor) -> torch.Tensor:
    """``[..., K/16, N/16, 256]`` per-step values -> the matrix ``[..., K, N]``."""
    values = check_tensor(values, "values")
    check_min_ndim(values, 3, "values")
    check_last_dim(values, STEPS_PER_TILE, "values")
    *lead, k_tiles, n_tiles, _ = values.shape
    index = _step_of_flat_position().to(values.device)
    tiles = values.index_select(-1, index).reshape(*lead, k_tiles, n_tiles, TILE, TILE)
    return tiles.transpose(-3, -2).reshape(*lead, k_tiles * TILE, n_tiles * TILE)


def matrix_to_tiles(matrix: torch.Tensor) -> torch.Tensor:
    """``[..., K, N]`` (K, N multiples of 16) -> per-step values ``[..., K/16, N/16, 256]``."""
    matrix = check_tensor(matrix, "matrix (W)")
    check_min_ndim(matrix, 2, "matrix (W)")
    *lead, k_dim, n_dim = matrix.shape
    if k_dim == 0 or n_dim == 0 or k_dim % TILE or n_dim % TILE:
        raise ValueError(
            f"matrix (W): expected K and N to be positive multiples of {TILE}, got shape "
            f"{tuple(matrix.shape)}"
        )
    k_tiles, n_tiles = k_dim // TILE, n_dim // TILE
    tiles = matrix.reshape(*lead, k_tiles, TILE, n_tiles, TILE).transpose(-3, -2)
    flat = tiles.reshape(*lead, k_tiles, n_tiles, STEPS_PER_TILE)
    return flat.index_select(-1, _flat_position_of_step().to(matrix.device))
