"""The fused MoE's host decisions as declarative tables (design §4 "Dispatch"; R2, R12, R15).

Every launch geometry :func:`b12x.ops.moe.plan.plan_moe` and
:func:`b12x.ops.moe.gemm_op.plan_moe_gemm` choose comes from one of the six tables below (five
here, ``moe_mainloop`` in :mod:`b12x.ops.moe.mainloop`); the planners build a case, take the
chosen row's ``value`` and nothing else re-decides it (:attr:`b12x.ops.moe.plan.MoePlan.decisions`
records every case, path and value). The style is :mod:`b12x.ops.dense.dispatch`'s, and so is
the machinery: :mod:`b12x.ops.tables` (fields, conditions, rows,
:class:`~b12x.ops.tables.DecisionTable`); this module holds the tables' data.

Layout
------
* A **case** is a plain mapping of the table's fields (``fields``); an unknown field or a missing
  required one raises ``ValueError``, a wrong type ``TypeError``, an out-of-range value
  ``ValueError``, each naming the field. Optional fields take the documented default.
  ``compute_dtype`` accepts ``"float16"``/``"bfloat16"`` or the ``torch.dtype``.
* A :class:`~b12x.ops.tables.Row` is a path: a name, a description, named
  :class:`~b12x.ops.tables.Condition` s (their conjunction is the row's ``predicate``; the first
  failed condition is the rejection reason) and the row's answer ``value`` (a constant, or
  ``value(case)`` where noted). Rows are in priority order.
* :meth:`~b12x.ops.tables.DecisionTable.explain` returns an
  :class:`~b12x.ops.tables.Explanation` ``(path, reasons, value)``: one reason per row
  considered, ``"<row>: <failed condition>"`` or ``"<row>: selected"``; a case no row accepts
  raises ``ValueError`` with every reason (fail closed).
* ``boundaries``: both sides of EVERY threshold as :class:`Boundary` records (the fields of
  ``oracle.judge.dispatch.Boundary``) with **literal** values, so moving a threshold fails the
  table's own boundary check instead of moving along with it.

The tables (:data:`TABLES`, in the order a plan consults them)
--------------------------------------------------------------
0. ``moe_mainloop`` — per-warp or shared decode for the whole step (its module's docstring); on
   the shared decode the route block is its geometry's and ROUTE_BLOCK is not consulted.
1. :data:`ROUTE_BLOCK` ``moe_route_block`` — M16 tiles per route block (``m_tiles``; block size
   ``16·m_tiles``) by routes per expert ``m·top_k/E`` (compared in integers): ``pinned_m_tiles``
   (``m_tiles`` given: 1, 2 or 4) → the pin; ``m_tiles_1`` while ``m·top_k ≤ 24·E``;
   ``m_tiles_2`` while ``m·top_k ≤ 48·E``; ``m_tiles_4``. Fields ``m, top_k, num_experts``,
   ``m_tiles`` (None).
2. :data:`K_SPLIT` ``moe_k_split`` — the intra-CTA K split by K alone (never M, m_tiles or
   routing: it fixes each output's fp32 summation order, so the MoE stays batch invariant):
   ``k_split_8`` (``K % 1024 == 0`` and ``K/8 ≥ 512``), ``k_split_4`` (``K % 512 == 0`` and
   ``K/4 ≥ 384``), ``k_split_2`` (``K % 256 == 0`` and ``K/2 ≥ 512``), ``k_split_1``. Whole
   8-row units (128 K) per group, never a slice below :data:`MIN_K_SLICE` = 512 (32 K16 rows per
   warp), :data:`MIN_K_SLICE_FOUR_GROUPS` = 384 with four groups. Field ``k``.
3. :data:`GEMM_GEOMETRY` ``moe_gemm_geometry`` — ``(n_tiles, warps, depth)`` of an unpaired
   grouped GEMM (``warps`` per K group; a CTA has ``32·warps·k_split`` threads):
   ``single_block_split`` (m_tiles 1, ``k_split`` > 1) → (2, :data:`SPLIT_GROUP_WARPS` = 2,
   8); ``single_block`` (m_tiles 1) → (2, 4, 8); wider blocks
   share :data:`WIDE_CTA_WARPS` = 4 warps over the groups (``W = max(1, 4 // k_split)``,
   128-thread CTAs: the wide accumulators need ~220 registers; at ``k_split`` 8, one warp per
   group, 256 threads and one CTA per SM) at depth 2: ``wide_capped_tiles`` (m_tiles 4 and a
   decoder tile hint below 4, the D3L decoder's 2: 4 × 4 spills) → (cap, W, 2),
   ``wide_four_tiles`` (``N % (64·W) == 0``)
   → (4, W, 2), ``wide_two_tiles`` → (2, W, 2). Fields ``m_tiles, n, k_split``,
   ``wide_tile_cap`` (the format's tile hint :attr:`b12x.formats.DecodeFormat.wide_tile_cap`,
   default 4), ``compute_dtype``.
4. :data:`PAIR_GEOMETRY` ``moe_pair_geometry`` — ``(n_tiles, warps, depth, rate_axis)`` of a QSRT
   pair launch by phase: FC1 = N axis (one 256-column pair per CTA): ``n_axis_single`` (m_tiles
   1) → (2, 8, 8, n), ``n_axis_wide`` → (4, 4, 2, n); FC2 = K axis: ``k_axis_single`` (m_tiles 1)
   → (2, 4, 8, k), ``k_axis_2_four_tiles`` (m_tiles 2, ``N % 256 == 0``) → (4, 4, 2, k),
   ``k_axis_2_two_tiles`` (m_tiles 2) → (2, 4, 2, k), ``k_axis_4`` → (2, 4, 1, k) (4 × 4 at depth
   2 spills, and P44's two record planes at 2 × 2 depth 2). Fields ``phase, m_tiles, n``,
   ``compute_dtype``.
5. :data:`FC2_TILE` ``moe_fc2_tile`` — whether an FC2 launch takes the wave-balanced tile; its
   own module, :mod:`b12x.ops.moe.fc2_tile` (rows, threshold and measurements there).

How the compute dtype enters
----------------------------
It does not enter any decision: the geometry tables take ``compute_dtype`` only to say so (a
boundary per table pins both sides to the same path); it reaches the kernel as
``MoeGemmSpec.bf16`` (operand and epilogue type), never as a geometry.

Invariants
----------
* ``explain`` is a pure function of the case (reads, never mutates; equal cases, equal answers).
* Every threshold constant lives in one :class:`Condition` of one row; conditions read the
  module constants at call time.
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
#: (512 threads at k_split 8, where 4 warps would be 1024). Measured (2026-12-05, H100 80GB
#: HBM3, ``benchmarks/moe_geometry_sweep.py --m 1,8,64``, GLM-like MoE, MCG K4, graphed, us)
#: against (2, 4, 8): FC2 (K = 1536, N = 5120) at k_split 2, M = 1: 42.2 / 48.6, 8: 148.2 /
#: 150.2, 64: 329.3 / 335.0; at k_split 4: 38.3 / 39.1 (M = 1); FC1 (K = 5120, N = 3072) at
#: k_split 8: 58.8 / 281.4 / 655.3 at M = 1 / 8 / 64 (k_split 4 with 4 warps: 70.0 / 289.7 /
#: 645.8). The one loss seen: FC1 at k_split 4 ran 72.7 / 70.0 at M = 1 (GLM-like FC1 now takes
#: eight groups; four-group FC1s are K = 2048 .. 3584, 4608).
#:
#: The K_SPLIT and geometry rows of 2026-12-05 (FC1 K = 5120 in eight groups, FC2 K = 1536 in
#: four, a split single block at two warps per group), whole GLM-like step, H200,
#: ``moe_trellis.py --m 1,8,64,256,512,1024,4096 --no-tiers --no-pair``, graphed, same run, us,
#: against the rows before (FC1 four groups, FC2 two): M = 1: 94.1 / 113.8, 8: 436.6 / 435.6,
#: 64: 1001.8 / 988.0, 256: 1653.8 / 1657.2, 512 (wide blocks; FC1 one warp per group, 256
#: threads, one CTA per SM): 1946.5 / 1876.0, 1024 and 4096 (shared decode, eight and four
#: slices folded): 2421.8 / 2326.4, 6567.3 / 6361.2. Taken for M = 1 (2.22x -> 2.68x of bf16);
#: prefill pays 3-4 % (the folds and the 256-thread wide CTA), recorded in the session note.
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
