"""Whether an FC2 launch takes the wave-balanced tile, as a declarative table (issue 15).

:data:`FC2_TILE` ``moe_fc2_tile`` (the last table :data:`b12x.ops.moe.dispatch.TABLES` lists;
machinery :mod:`b12x.ops.tables`): whether an FC2 launch takes the registry's wave-balanced
tile :data:`b12x.ops.dense.tiles.WAVE_BALANCED_FC2` (512 columns per CTA, 256 threads per K
group → (4, 8, 2)):
``wave_balanced`` when a device is known (``sm_count``, ``max_shared_mem``), the phase is
unpaired, the decoder takes the tile's four N16 tiles per warp (``wide_tile_cap`` >= 4: the
D3L decoder's cap 2 spills 400-700 B in the wave tile at ``m_tiles`` 4 or ``k_split`` 4,
sm_80/sm_90/sm_120, ``python -m oracle run --tile 32x512x256 --codebook sqg_fp16``), the CTA
is not both split and wide (``k_split > 1`` with ``m_tiles > 1``: 256·k_split
threads cannot keep wide accumulators), THE tile predicate :func:`b12x.ops.dense.tiles.qualify`
accepts the tile for this FC2 (``K = intermediate``, ``N = hidden``, M = the packed capacity,
``cta_m_blocks = m_tiles``) on that device, the step has at least :data:`WAVE_FC2_MIN_ROUTES`
routes (``m·top_k``; fewer measured faster on the default geometry, H200), and the default
launch has a second wave: its live CTAs ``min(blocks, m·top_k) · hidden/default_n_group``
exceed ``sm_count``; else ``default``
(value None: keep the geometry table's answer). Simulated devices enter through the two
integer fields.

Conditions read :data:`WAVE_FC2_MIN_ROUTES` and the tile registry (:mod:`b12x.ops.dense.tiles`)
when a case is decided, so a planted value reaches the table.
"""

from __future__ import annotations

from typing import Any

from b12x.kernels.moe_gemm import K_SPLITS, PAIR_CHOICES
from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.moe.geometry import WIDE_TILE_CAP, WIDE_TILE_CAPS, GemmGeometry
from b12x.ops.moe.routing import capacity_bound
from b12x.ops.tables import (
    Boundary,
    Condition,
    DecisionTable,
    Field,
    int_choice,
    optional,
    positive_int,
    str_choice,
)

__all__ = ["FC2_TILE", "WAVE_FC2_MIN_ROUTES"]

#: Fewest routes (``M·top_k``) at which an FC2 takes the wave-balanced tile.
#: Chosen by measurement: docs/evidence/moe-fc2-wave-balanced-tile.md
WAVE_FC2_MIN_ROUTES = 1025

_cond = Condition
_table = DecisionTable.build


def _fc2_device(c) -> dense_tiles.DeviceLimits:
    return dense_tiles.DeviceLimits("device", c["sm_count"], c["max_shared_mem"], (0, 0))


def _fc2_tile_problem(c) -> dense_tiles.TileProblem:
    capacity = capacity_bound(c["m"], c["top_k"], c["num_experts"], 16 * c["m_tiles"])
    return dense_tiles.TileProblem(
        "fc2", capacity, c["intermediate"], c["hidden"], c["bits"], cta_m_blocks=c["m_tiles"]
    )


def _fc2_qualifies(c) -> tuple[bool, str]:
    return dense_tiles.qualify(dense_tiles.WAVE_BALANCED_FC2, _fc2_tile_problem(c), _fc2_device(c))


def _live_ctas(c) -> int:
    """Live CTAs of the default FC2 launch: at most ``min(blocks, m·top_k)`` live route blocks."""
    blocks = capacity_bound(c["m"], c["top_k"], c["num_experts"], 16 * c["m_tiles"]) // (
        16 * c["m_tiles"]
    )
    return min(blocks, c["m"] * c["top_k"]) * (c["hidden"] // c["default_n_group"])


def _wave_geometry() -> GemmGeometry:
    warps, n_tiles = dense_tiles.kernel_geometry(dense_tiles.WAVE_BALANCED_FC2)
    return GemmGeometry(n_tiles, warps, dense_tiles.WAVE_BALANCED_FC2_DEPTH)


def _ft(**changes: Any) -> dict:
    """GLM-like FC2 on an H200 at M = 129 (1032 routes, past :data:`WAVE_FC2_MIN_ROUTES`): 215
    live blocks × 40 CTAs = 8600 > 132 SMs."""
    base = {
        "sm_count": 132,
        "max_shared_mem": 232448,
        "m": 129,
        "top_k": 8,
        "num_experts": 160,
        "hidden": 5120,
        "intermediate": 1536,
        "bits": 3,
        "m_tiles": 1,
        "k_split": 2,
        "default_n_group": 128,
        "pair": None,
    }
    return {**base, **changes}


FC2_TILE = _table(
    "moe_fc2_tile",
    "the wave-balanced FC2 tile (512 columns, 256 threads per K group) by the tile predicate "
    "and the device",
    (
        Field(
            "sm_count",
            optional(positive_int),
            None,
            "the device's SMs (None: no device)",
        ),
        Field(
            "max_shared_mem",
            optional(positive_int),
            None,
            "opt-in shared memory per block",
        ),
        Field("m", positive_int),
        Field("top_k", positive_int),
        Field("num_experts", positive_int),
        Field("hidden", positive_int, doc="FC2's N"),
        Field("intermediate", positive_int, doc="FC2's K"),
        Field("bits", positive_int),
        Field("m_tiles", int_choice(dense_tiles.GROUPED_M_TILES)),
        Field("k_split", int_choice(K_SPLITS)),
        Field("default_n_group", positive_int, doc="columns per CTA of the default geometry"),
        Field("pair", str_choice(PAIR_CHOICES, optional=True), None),
        Field(
            "wide_tile_cap",
            int_choice(WIDE_TILE_CAPS),
            WIDE_TILE_CAP,
            "the format's tile hint (b12x.formats.DecodeFormat.wide_tile_cap)",
        ),
    ),
    (
        (
            "wave_balanced",
            "FC2 takes WAVE_BALANCED_FC2: qualified on the device, and a second wave to balance",
            (
                _cond(
                    "device_known",
                    lambda c: c["sm_count"] is not None and c["max_shared_mem"] is not None,
                    lambda c: "no device (sm_count / max_shared_mem unknown)",
                ),
                _cond(
                    "unpaired",
                    lambda c: c["pair"] is None,
                    lambda c: f"pair={c['pair']!r}: a paired FC2 keeps the pair geometry",
                ),
                _cond(
                    "decoder_takes_four_tiles",
                    lambda c: dense_tiles.wave_fc2_takes_decoder(c["wide_tile_cap"]),
                    lambda c: (
                        f"wide_tile_cap={c['wide_tile_cap']}: the decoder spills at the wave "
                        f"tile's {_wave_geometry().n_tiles} N16 tiles per warp"
                    ),
                ),
                _cond(
                    "not_split_and_wide",
                    lambda c: dense_tiles.wave_fc2_fits(c["m_tiles"], c["k_split"]),
                    lambda c: (
                        f"k_split={c['k_split']} with m_tiles={c['m_tiles']}: 256·k_split "
                        "threads cannot keep wide accumulators"
                    ),
                ),
                _cond(
                    "tile_qualifies",
                    lambda c: _fc2_qualifies(c)[0],
                    lambda c: f"qualify: {_fc2_qualifies(c)[1]}",
                ),
                _cond(
                    "routes_past_measured_loss",
                    lambda c: c["m"] * c["top_k"] >= WAVE_FC2_MIN_ROUTES,
                    lambda c: (
                        f"M·top_k = {c['m'] * c['top_k']} < {WAVE_FC2_MIN_ROUTES}: the default "
                        "geometry measured faster (WAVE_FC2_MIN_ROUTES)"
                    ),
                ),
                _cond(
                    "second_wave",
                    lambda c: _live_ctas(c) > c["sm_count"],
                    lambda c: f"{_live_ctas(c)} live CTAs fit one wave of {c['sm_count']} SMs",
                ),
            ),
            lambda c: _wave_geometry(),
        ),
        ("default", "keep the geometry table's answer", (), None),
    ),
    (
        Boundary("fc2_tile_device", _ft(), "sm_count", 132, None, "wave_balanced", "default"),
        Boundary("fc2_tile_pair", _ft(), "pair", None, "P24", "wave_balanced", "default"),
        Boundary("fc2_tile_decoder", _ft(), "wide_tile_cap", 4, 2, "wave_balanced", "default"),
        Boundary("fc2_tile_hidden_512", _ft(), "hidden", 5120, 5248, "wave_balanced", "default"),
        Boundary(
            "fc2_tile_shared_memory",
            _ft(),
            "max_shared_mem",
            41728,
            41727,
            "wave_balanced",
            "default",
        ),
        Boundary(
            "fc2_tile_second_wave_sms", _ft(), "sm_count", 8599, 8600, "wave_balanced", "default"
        ),
        # top-1 over 2048 experts: every route its own block, 1026 vs 1025 live blocks × 40 CTAs
        # against 41000 SMs (both past the measured routes)
        Boundary(
            "fc2_tile_second_wave_blocks",
            _ft(top_k=1, num_experts=2048, sm_count=41000),
            "m",
            1026,
            1025,
            "wave_balanced",
            "default",
        ),
        Boundary("fc2_tile_measured_routes", _ft(), "m", 129, 128, "wave_balanced", "default"),
        Boundary(
            "fc2_tile_split_wide_k_split",
            _ft(m_tiles=2),
            "k_split",
            1,
            2,
            "wave_balanced",
            "default",
        ),
        Boundary("fc2_tile_split_wide_m_tiles", _ft(), "m_tiles", 1, 2, "wave_balanced", "default"),
    ),
)
