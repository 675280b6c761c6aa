"""The fused MoE's host decisions as declarative tables (docs/architecture.md; R2, R12, R15).

Every launch geometry :func:`b12x.ops.moe.plan.plan_moe` and
:func:`b12x.ops.moe.gemm_op.plan_moe_gemm` choose comes from one of six tables (five here,
``moe_mainloop`` in :mod:`b12x.ops.moe.mainloop`); the planners build a case, take the chosen
row's ``value`` and nothing else re-decides it (``MoePlan.decisions`` records each). The
machinery is :mod:`b12x.ops.tables`, as for :mod:`b12x.ops.dense.dispatch`; this module holds data.

Layout: a **case** is a plain mapping of the table's fields, each validated (``ValueError`` /
``TypeError`` naming it; optional fields take defaults; ``compute_dtype`` accepts the name or the
``torch.dtype``). A row is a named conjunction of named conditions (the first failed one is the
rejection reason) and a ``value``; rows are in priority order; ``explain`` returns
``(path, reasons, value)`` and a case no row accepts raises with every reason (fail closed).
``boundaries`` hold both sides of EVERY threshold with **literal** values. The tables
(:data:`TABLES`, in the order a plan consults them):

0. ``moe_mainloop`` — per-warp or shared decode for the whole step (its own module).
1. :data:`ROUTE_BLOCK` — M16 tiles per route block by routes per expert ``m·top_k/E``, or a pin.
2. :data:`K_SPLIT` — the intra-CTA K split by K alone (never M or routing: batch invariance),
   whole 128-K units per group, no slice below :data:`MIN_K_SLICE`.
3. :data:`GEMM_GEOMETRY` — ``(n_tiles, warps, depth)`` of an unpaired grouped GEMM.
4. :data:`PAIR_GEOMETRY` — ``(n_tiles, warps, depth, rate_axis)`` of a QSRT pair launch by phase.
5. :data:`FC2_TILE` — the wave-balanced FC2 tile (:mod:`b12x.ops.moe.fc2_tile`).

The compute dtype enters no decision (a boundary per table pins it); it reaches the kernel as
``MoeGemmSpec.bf16``. Each row's thresholds and values: docs/notes/b12x.md.

Invariants: ``explain`` is a pure function of the case; every threshold constant lives in one
:class:`Condition` of one row, read at call time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.moe.fc2_tile import FC2_TILE
from b12x.ops.moe.geometry import WIDE_TILE_CAP, WIDE_TILE_CAPS, GemmGeometry, PairGeometry
from b12x.ops.moe.mainloop import MAINLOOP
from b12x.ops.tables import (
    Boundary,
    Condition,
    DecisionTable,
    Explanation,
    Field,
    Row,
    int_choice,
    positive_int,
    str_choice,
)

__all__ = [
    "FC2_TILE",
    "GEMM_GEOMETRY",
    "K_SPLIT",
    "PAIR_GEOMETRY",
    "ROUTE_BLOCK",
    "TABLES",
    "TABLES_BY_NAME",
    "Boundary",
    "Condition",
    "DecisionTable",
    "Explanation",
    "Field",
    "GemmGeometry",
    "PairGeometry",
    "Row",
]

# ---------------------------------------------------------------------------- thresholds

#: Route blocks are one M16 tile while an expert sees at most this many routes on average.
M_TILES_1_MAX_ROUTES = 24
#: ... two M16 tiles up to this many, four beyond.
M_TILES_2_MAX_ROUTES = 48
M_TILES = dense_tiles.GROUPED_M_TILES
#: K rows of one whole 8-row unit (every mainloop ``depth`` divides 8 K16 rows).
K_UNIT = 128
#: The intra-CTA K split never leaves a warp group fewer K elements than this (32 K16 rows).
MIN_K_SLICE = 512
#: ... except with four groups: GLM-like FC2 (K = 1536) sums in four slices of 24 K16 rows
#: (measured with :data:`SPLIT_GROUP_WARPS`).
MIN_K_SLICE_FOUR_GROUPS = 384
#: Largest planned K split (the kernel's largest too).
MAX_K_SPLIT = 8
#: K splits a geometry case may carry (the kernel's ``K_SPLITS``).
K_SPLITS = (1, 2, 4, 8)
#: Warps of a CTA at m_tiles ≥ 2 (all groups together): the 255-register budget per thread that
#: the wide accumulators need holds only for 128-thread CTAs on sm_90.
WIDE_CTA_WARPS = 4
#: Columns of one QSRT pair (two 128-channel records).
PAIR_CHANNELS = 256
#: Warps per K group of a single-block launch whose K splits (``single_block_split``): the same
#: per-warp work and K order as 4-warp groups (bit-identical), twice the CTAs at half the size
#: (512 threads at k_split 8, where 4 warps would be 1024).
#: Chosen by measurement: docs/evidence/moe-k-split-groups.md
SPLIT_GROUP_WARPS = 2
PHASES = ("fc1", "fc2")
PAIR_CHOICES = ("P22", "P33", "P24", "P43", "P44", "dynamic")
COMPUTE_DTYPES = ("float16", "bfloat16")


# ---------------------------------------------------------------------------- machinery


def _compute_dtype(name: str, value: Any) -> str:
    if isinstance(value, torch.dtype):
        value = str(value).removeprefix("torch.")
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a dtype name or torch.dtype, got {type(value).__name__}")
    if value not in COMPUTE_DTYPES:
        raise ValueError(f"{name}: expected one of {COMPUTE_DTYPES}, got {value!r}")
    return value


_cond = Condition
_table = DecisionTable.build


# ---------------------------------------------------------------------------- 1. route block


def _routes_at_most(per_expert: int):
    return lambda c: c["m"] * c["top_k"] <= per_expert * c["num_experts"]


def _routes_per_expert(c) -> str:
    return f"m·top_k/E = {c['m']}·{c['top_k']}/{c['num_experts']}"


_UNPINNED = _cond(
    "m_tiles_not_pinned",
    lambda c: c["m_tiles"] is None,
    lambda c: f"m_tiles={c['m_tiles']} is pinned",
)

_ROUTE_BLOCK_ROWS = (
    (
        "pinned_m_tiles",
        "an explicit m_tiles (1, 2 or 4) wins over the routes-per-expert rule",
        (
            _cond(
                "m_tiles_pinned",
                lambda c: c["m_tiles"] is not None,
                lambda c: "m_tiles is not pinned",
            ),
        ),
        lambda c: c["m_tiles"],
    ),
    (
        "m_tiles_1",
        "one M16 tile per route block while an expert sees ≤ 24 routes on average",
        (
            _UNPINNED,
            _cond(
                "routes_per_expert<=24",
                lambda c: _routes_at_most(M_TILES_1_MAX_ROUTES)(c),
                lambda c: f"{_routes_per_expert(c)} > {M_TILES_1_MAX_ROUTES}",
            ),
        ),
        1,
    ),
    (
        "m_tiles_2",
        "two M16 tiles while an expert sees ≤ 48 routes on average",
        (
            _UNPINNED,
            _cond(
                "routes_per_expert<=48",
                lambda c: _routes_at_most(M_TILES_2_MAX_ROUTES)(c),
                lambda c: f"{_routes_per_expert(c)} > {M_TILES_2_MAX_ROUTES}",
            ),
        ),
        2,
    ),
    ("m_tiles_4", "four M16 tiles beyond 48 routes per expert", (_UNPINNED,), 4),
)


def _rb(**changes: Any) -> dict:
    return {"m": 1, "top_k": 1, "num_experts": 1, "m_tiles": None, **changes}


ROUTE_BLOCK = _table(
    "moe_route_block",
    "M16 tiles per route block (m_tiles; block size 16·m_tiles) by routes per expert",
    (
        Field("m", positive_int, doc="planned tokens"),
        Field("top_k", positive_int),
        Field("num_experts", positive_int, doc="experts of the combined namespace"),
        Field("m_tiles", int_choice(M_TILES, optional=True), None, "an explicit pin"),
    ),
    _ROUTE_BLOCK_ROWS,
    (
        Boundary("m_tiles_1_max_routes", _rb(), "m", 24, 25, "m_tiles_1", "m_tiles_2"),
        Boundary("m_tiles_2_max_routes", _rb(), "m", 48, 49, "m_tiles_2", "m_tiles_4"),
        # GLM-like routing (E = 128, top_k = 8): 16 tokens per routes-per-expert unit
        Boundary(
            "m_tiles_1_glm", _rb(top_k=8, num_experts=128), "m", 384, 385, "m_tiles_1", "m_tiles_2"
        ),
        Boundary(
            "m_tiles_2_glm", _rb(top_k=8, num_experts=128), "m", 768, 769, "m_tiles_2", "m_tiles_4"
        ),
        # a fractional average: 200 routes over 9 experts (22.2) vs over 8 (25)
        Boundary(
            "m_tiles_1_by_experts",
            _rb(m=25, top_k=8),
            "num_experts",
            9,
            8,
            "m_tiles_1",
            "m_tiles_2",
        ),
        Boundary(
            "m_tiles_1_by_top_k", _rb(m=96, num_experts=8), "top_k", 2, 3, "m_tiles_1", "m_tiles_2"
        ),
        Boundary("pin_over_m_tiles_1", _rb(), "m_tiles", None, 4, "m_tiles_1", "pinned_m_tiles"),
        Boundary(
            "pin_over_m_tiles_4", _rb(m=4096), "m_tiles", None, 1, "m_tiles_4", "pinned_m_tiles"
        ),
        Boundary(
            "pin_over_m_tiles_2", _rb(m=30), "m_tiles", None, 2, "m_tiles_2", "pinned_m_tiles"
        ),
    ),
)

# ---------------------------------------------------------------------------- 2. K split


def _split_rows(k_split: int, min_slice: str = "MIN_K_SLICE"):
    """The two conditions of ``k_split`` groups; ``min_slice`` names the module constant (read
    when a case is decided, so a planted value reaches the table)."""
    unit = K_UNIT * k_split
    return (
        _cond(
            f"k%{unit}==0",
            lambda c: c["k"] % (K_UNIT * k_split) == 0,
            lambda c: (
                f"K={c['k']} is not whole {K_UNIT}-row units per group "
                f"(K % {K_UNIT * k_split} = {c['k'] % (K_UNIT * k_split)})"
            ),
        ),
        _cond(
            f"k/{k_split}>={globals()[min_slice]}",
            lambda c: c["k"] // k_split >= globals()[min_slice],
            lambda c: (
                f"K/{k_split} = {c['k'] // k_split} < {globals()[min_slice]} (slice too shallow)"
            ),
        ),
    )


K_SPLIT = _table(
    "moe_k_split",
    "intra-CTA K split of a grouped GEMM by its reduction length K alone (batch invariance)",
    (Field("k", positive_int, doc="reduction length (FC1: hidden, FC2: intermediate)"),),
    (
        ("k_split_8", "eight K groups: whole units, slices ≥ 512", _split_rows(8), 8),
        (
            "k_split_4",
            "four K groups: whole units, slices ≥ 384",
            _split_rows(4, "MIN_K_SLICE_FOUR_GROUPS"),
            4,
        ),
        ("k_split_2", "two K groups: whole units, slices ≥ 512", _split_rows(2), 2),
        ("k_split_1", "a single K group", (), 1),
    ),
    (
        Boundary("k_split_8_min_slice", {}, "k", 3072, 4096, "k_split_4", "k_split_8"),
        Boundary("k_split_8_whole_units", {}, "k", 4608, 5120, "k_split_4", "k_split_8"),
        Boundary("k_split_4_min_slice", {}, "k", 1024, 1536, "k_split_2", "k_split_4"),
        Boundary("k_split_4_whole_units", {}, "k", 2304, 2560, "k_split_2", "k_split_4"),
        Boundary("k_split_2_min_slice", {}, "k", 768, 1024, "k_split_1", "k_split_2"),
        Boundary("k_split_2_whole_units", {}, "k", 1152, 1280, "k_split_1", "k_split_2"),
    ),
)

# ---------------------------------------------------------------------------- 3. GEMM geometry


def _group_warps(c) -> int:
    return max(1, WIDE_CTA_WARPS // c["k_split"])


_WIDE = _cond(
    "m_tiles>=2",
    lambda c: c["m_tiles"] > 1,
    lambda c: f"m_tiles={c['m_tiles']} is a single M16 block",
)


def _geo(**changes: Any) -> dict:
    base = {"m_tiles": 2, "n": 3072, "k_split": 1, "wide_tile_cap": WIDE_TILE_CAP}
    return {**base, "compute_dtype": "float16", **changes}


GEMM_GEOMETRY = _table(
    "moe_gemm_geometry",
    "(n_tiles, warps, depth) of an unpaired grouped GEMM",
    (
        Field("m_tiles", int_choice(M_TILES)),
        Field("n", positive_int, doc="output columns of the launch"),
        Field("k_split", int_choice(K_SPLITS)),
        Field(
            "wide_tile_cap",
            int_choice(WIDE_TILE_CAPS),
            WIDE_TILE_CAP,
            "the decoder's tile hint: most N16 tiles per warp at four M16 blocks",
        ),
        Field("compute_dtype", _compute_dtype, "float16", "does not enter"),
    ),
    (
        (
            "single_block_split",
            "one M16 block, K in groups: 2 warps × 2 tiles per group, deep loads "
            "(64·k_split threads)",
            (
                _cond(
                    "m_tiles==1",
                    lambda c: c["m_tiles"] == 1,
                    lambda c: f"m_tiles={c['m_tiles']} != 1",
                ),
                _cond(
                    "k_split>1",
                    lambda c: c["k_split"] > 1,
                    lambda c: f"k_split={c['k_split']} (a single K group)",
                ),
            ),
            GemmGeometry(2, SPLIT_GROUP_WARPS, 8),
        ),
        (
            "single_block",
            "one M16 block: 4 warps × 2 tiles per group, deep loads (128·k_split threads)",
            (
                _cond(
                    "m_tiles==1",
                    lambda c: c["m_tiles"] == 1,
                    lambda c: f"m_tiles={c['m_tiles']} != 1",
                ),
            ),
            GemmGeometry(2, 4, 8),
        ),
        (
            "wide_capped_tiles",
            "four M16 blocks of a decoder whose tile hint caps the tiles (D3L: 2, as 4 × 4 "
            "spills), 128-thread CTA",
            (
                _cond(
                    "m_tiles==4",
                    lambda c: c["m_tiles"] == 4,
                    lambda c: f"m_tiles={c['m_tiles']} != 4",
                ),
                _cond(
                    "wide_tile_cap<4",
                    lambda c: c["wide_tile_cap"] < WIDE_TILE_CAP,
                    lambda c: f"wide_tile_cap={c['wide_tile_cap']} is not below {WIDE_TILE_CAP}",
                ),
            ),
            lambda c: GemmGeometry(c["wide_tile_cap"], _group_warps(c), 2),
        ),
        (
            "wide_four_tiles",
            "wide blocks, N a multiple of 64·W: 4 tiles per warp, 128-thread CTA",
            (
                _WIDE,
                _cond(
                    "n%(64·W)==0",
                    lambda c: c["n"] % (64 * _group_warps(c)) == 0,
                    lambda c: f"N={c['n']} is not a multiple of 64·W = {64 * _group_warps(c)}",
                ),
            ),
            lambda c: GemmGeometry(4, _group_warps(c), 2),
        ),
        (
            "wide_two_tiles",
            "wide blocks otherwise: 2 tiles per warp, 128-thread CTA",
            (_WIDE,),
            lambda c: GemmGeometry(2, _group_warps(c), 2),
        ),
    ),
    (
        Boundary(
            "geometry_single_block", _geo(), "m_tiles", 1, 2, "single_block", "wide_four_tiles"
        ),
        Boundary(
            "geometry_single_block_unsplit",
            _geo(m_tiles=1),
            "k_split",
            1,
            2,
            "single_block",
            "single_block_split",
        ),
        Boundary(
            "geometry_split_single_block_only",
            _geo(k_split=2),
            "m_tiles",
            1,
            2,
            "single_block_split",
            "wide_four_tiles",
        ),
        Boundary("geometry_wide_n", _geo(), "n", 3072, 3200, "wide_four_tiles", "wide_two_tiles"),
        # k_split narrows the group (W = 4 / k_split), so 64·W divides more N
        Boundary(
            "geometry_group_width",
            _geo(n=3200),
            "k_split",
            1,
            2,
            "wide_two_tiles",
            "wide_four_tiles",
        ),
        Boundary(
            "geometry_tile_cap",
            _geo(m_tiles=4),
            "wide_tile_cap",
            2,
            4,
            "wide_capped_tiles",
            "wide_four_tiles",
        ),
        Boundary(
            "geometry_cap_needs_four_blocks",
            _geo(wide_tile_cap=2),
            "m_tiles",
            2,
            4,
            "wide_four_tiles",
            "wide_capped_tiles",
        ),
        Boundary(
            "geometry_compute_dtype_does_not_enter",
            _geo(),
            "compute_dtype",
            "float16",
            "bfloat16",
            "wide_four_tiles",
            "wide_four_tiles",
        ),
    ),
)


# ---------------------------------------------------------------------------- 4. pair geometry


def _phase_is(phase: str) -> Condition:
    return _cond(
        f"phase=={phase}",
        lambda c: c["phase"] == phase,
        lambda c: f"phase={c['phase']!r} != {phase!r}",
    )


def _m_tiles_is(m_tiles: int) -> Condition:
    return _cond(
        f"m_tiles=={m_tiles}",
        lambda c: c["m_tiles"] == m_tiles,
        lambda c: f"m_tiles={c['m_tiles']} != {m_tiles}",
    )


def _pg(**changes: Any) -> dict:
    return {"phase": "fc1", "m_tiles": 1, "n": 512, "compute_dtype": "float16", **changes}


PAIR_GEOMETRY = _table(
    "moe_pair_geometry",
    "(n_tiles, warps, depth, rate_axis) of a QSRT pair launch by phase",
    (
        Field("phase", str_choice(PHASES)),
        Field("m_tiles", int_choice(M_TILES)),
        Field("n", positive_int, doc="output columns of the launch"),
        Field("compute_dtype", _compute_dtype, "float16", "does not enter"),
    ),
    (
        (
            "n_axis_single",
            "FC1 records on N, one M16 block: one pair per CTA, 8 warps × 2 tiles, deep loads",
            (_phase_is("fc1"), _m_tiles_is(1)),
            PairGeometry(2, 8, 8, "n"),
        ),
        (
            "n_axis_wide",
            "FC1 records on N, wider blocks: one pair per CTA, 4 warps × 4 tiles",
            (_phase_is("fc1"),),
            PairGeometry(4, 4, 2, "n"),
        ),
        (
            "k_axis_single",
            "FC2 records on K, one M16 block: the unpaired single-block geometry",
            (_phase_is("fc2"), _m_tiles_is(1)),
            PairGeometry(2, 4, 8, "k"),
        ),
        (
            "k_axis_2_four_tiles",
            "FC2, two M16 blocks, N a multiple of 256: 4 warps × 4 tiles",
            (
                _phase_is("fc2"),
                _m_tiles_is(2),
                _cond(
                    "n%256==0",
                    lambda c: c["n"] % PAIR_CHANNELS == 0,
                    lambda c: f"N={c['n']} is not a multiple of {PAIR_CHANNELS}",
                ),
            ),
            PairGeometry(4, 4, 2, "k"),
        ),
        (
            "k_axis_2_two_tiles",
            "FC2, two M16 blocks otherwise: 4 warps × 2 tiles",
            (_phase_is("fc2"), _m_tiles_is(2)),
            PairGeometry(2, 4, 2, "k"),
        ),
        (
            "k_axis_4",
            "FC2, four M16 blocks: 2 tiles, one row in flight (4 × 4 and P44 2 × 2 spill)",
            (_phase_is("fc2"),),
            PairGeometry(2, 4, 1, "k"),
        ),
    ),
    (
        Boundary("pair_phase", _pg(), "phase", "fc1", "fc2", "n_axis_single", "k_axis_single"),
        Boundary("pair_n_axis_wide", _pg(), "m_tiles", 1, 2, "n_axis_single", "n_axis_wide"),
        Boundary(
            "pair_k_axis_single",
            _pg(phase="fc2"),
            "m_tiles",
            1,
            2,
            "k_axis_single",
            "k_axis_2_four_tiles",
        ),
        Boundary(
            "pair_k_axis_2_n",
            _pg(phase="fc2", m_tiles=2),
            "n",
            512,
            640,
            "k_axis_2_four_tiles",
            "k_axis_2_two_tiles",
        ),
        Boundary(
            "pair_k_axis_4",
            _pg(phase="fc2"),
            "m_tiles",
            2,
            4,
            "k_axis_2_four_tiles",
            "k_axis_4",
        ),
        Boundary(
            "pair_compute_dtype_does_not_enter",
            _pg(),
            "compute_dtype",
            "float16",
            "bfloat16",
            "n_axis_single",
            "n_axis_single",
        ),
    ),
)


#: Every MoE decision table, in the order a plan consults them.
TABLES: tuple[DecisionTable, ...] = (
    MAINLOOP, ROUTE_BLOCK, K_SPLIT, GEMM_GEOMETRY, PAIR_GEOMETRY, FC2_TILE,
)  # fmt: skip
TABLES_BY_NAME: Mapping[str, DecisionTable] = {t.name: t for t in TABLES}
