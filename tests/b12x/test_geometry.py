"""The one GEMM geometry value: what it accepts and refuses, validated at construction.

Its range is the kernels' own: ``depth`` 0 is the per-warp mainloop without a register stage
(the GPU identity tests run it), so it must construct; zero warps or tiles, a bool, a stream-K
schedule without the wgmma mainloop must not.
"""

from __future__ import annotations

import pytest

from b12x.kernels.geometry import GemmGeometry, choose_tiles


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_register_stage_depth_from_zero(depth):
    assert GemmGeometry(depth=depth).depth == depth


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"depth": -1}, "depth: expected an int >= 0"),
        ({"depth": True}, "depth: expected an int >= 0"),
        ({"warps": 0}, "warps: expected a positive int"),
        ({"m_tiles": 0}, "m_tiles: expected a positive int"),
        ({"unroll": 0}, "unroll: expected a positive int"),
        ({"stream_k": True}, "stream_k: the stream-K schedule runs a wgmma mainloop"),
    ],
)
def test_refused_geometries_name_the_field(fields, match):
    with pytest.raises(ValueError, match=match):
        GemmGeometry(**fields)


def test_choose_tiles_is_the_per_warp_rule_by_m_and_n():
    assert [choose_tiles(m, 512) for m in (1, 16, 17, 32, 33)] == [
        (1, 4), (1, 4), (2, 4), (2, 4), (4, 2)
    ]  # fmt: skip
    assert choose_tiles(8, 384) == (1, 2) and choose_tiles(8) == (1, 2)
