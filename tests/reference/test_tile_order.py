"""Tests for reference.tile_order (spec §1.5 weight order, §1.1 tile grid).

The expected step -> position map is rebuilt here from the m16n8k16 B-fragment definition:
lane l owns B[k = 2r, 2r+1] (register b0) and B[k = 2r+8, 2r+9] (register b1) of column n = l/4
(r = l % 4); weights w0..w3 feed column n and w4..w7 feed column n + 8.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.pytest_plugin import scaled_examples
from reference import tile_order


def _fragment_map() -> dict[int, tuple[int, int]]:
    """step t = 8·lane + j -> (k_local, n_local), from the MMA B-fragment layout."""
    mapping = {}
    for lane in range(32):
        r, column = lane % 4, lane // 4
        b0_rows = (2 * r, 2 * r + 1)
        b1_rows = (2 * r + 8, 2 * r + 9)
        fragment_rows = b0_rows + b1_rows  # (w0, w1) = b0, (w2, w3) = b1
        for j in range(8):
            n_local = column if j < 4 else column + 8
            mapping[8 * lane + j] = (fragment_rows[j % 4], n_local)
    return mapping


def test_step_to_tile_position_matches_fragment_definition():
    k_local, n_local = tile_order.step_to_tile_position()
    assert k_local.dtype == torch.int64 and n_local.dtype == torch.int64
    assert k_local.shape == (256,) and n_local.shape == (256,)
    expected = _fragment_map()
    assert [(int(k), int(n)) for k, n in zip(k_local, n_local, strict=True)] == [
        expected[t] for t in range(256)
    ]


def test_step_to_tile_position_is_a_bijection_and_returns_copies():
    k_local, n_local = tile_order.step_to_tile_position()
    assert len({(int(k), int(n)) for k, n in zip(k_local, n_local, strict=True)}) == 256
    k_local.fill_(0)
    again, _ = tile_order.step_to_tile_position()
    assert int(again.max()) == 15


def test_step_of_tile_position_inverts_the_map():
    k_local, n_local = tile_order.step_to_tile_position()
    inverse = tile_order.step_of_tile_position()
    assert torch.equal(inverse[k_local * 16 + n_local], torch.arange(256))


def test_tiles_to_matrix_places_every_step_where_the_spec_says():
    k_tiles, n_tiles = 2, 3
    t = torch.arange(256)
    kt = torch.arange(k_tiles).reshape(k_tiles, 1, 1)
    nt = torch.arange(n_tiles).reshape(1, n_tiles, 1)
    code = kt * 100_000 + nt * 1_000 + t  # unique tag per (kt, nt, step)
    matrix = tile_order.tiles_to_matrix(code)
    assert matrix.shape == (16 * k_tiles, 16 * n_tiles)
    expected = _fragment_map()
    for a in range(k_tiles):
        for b in range(n_tiles):
            for step, (k, n) in expected.items():
                assert int(matrix[16 * a + k, 16 * b + n]) == a * 100_000 + b * 1_000 + step


@settings(deadline=None, max_examples=scaled_examples(25))
@given(
    lead=st.sampled_from(((), (1,), (3,), (2, 2))),
    grid=st.sampled_from(((1, 1), (1, 4), (3, 2), (2, 5))),
    dtype=st.sampled_from((torch.float16, torch.float32, torch.int64)),
    seed=st.integers(0, 2**31),
)
def test_matrix_tiles_round_trip(lead, grid, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    k_dim, n_dim = 16 * grid[0], 16 * grid[1]
    matrix = torch.randint(-1000, 1000, (*lead, k_dim, n_dim), generator=gen).to(dtype)
    tiles = tile_order.matrix_to_tiles(matrix)
    assert tiles.shape == (*lead, grid[0], grid[1], 256) and tiles.dtype == dtype
    assert torch.equal(tile_order.tiles_to_matrix(tiles), matrix)
    # tile (kt, nt) covers W[16kt:16kt+16, 16nt:16nt+16], row-major inside in the fragment order
    k_local, n_local = tile_order.step_to_tile_position()
    last_tile = matrix[..., k_dim - 16 :, n_dim - 16 :]
    assert torch.equal(tiles[..., -1, -1, :], last_tile[..., k_local, n_local])


def test_bad_arguments_raise_naming_the_argument():
    with pytest.raises(TypeError, match="values"):
        tile_order.tiles_to_matrix([0] * 256)
    with pytest.raises(ValueError, match="values"):
        tile_order.tiles_to_matrix(torch.zeros(2, 256))
    with pytest.raises(ValueError, match="values"):
        tile_order.tiles_to_matrix(torch.zeros(1, 2, 255))
    with pytest.raises(ValueError, match="W"):
        tile_order.matrix_to_tiles(torch.zeros(16, 24))
    with pytest.raises(ValueError, match="W"):
        tile_order.matrix_to_tiles(torch.zeros(16))
