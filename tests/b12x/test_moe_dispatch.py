"""CPU: the MoE's host decisions are the tables of ``b12x.ops.moe.dispatch`` (docs/architecture.md).

* Each table passes ``oracle.judge.dispatch``'s generic checks: both sides of every declared
  boundary pick the expected row (whose own predicate holds), every row is reachable, ``explain`` is
  deterministic and does not mutate the case.
* The boundaries are literal: changing a threshold constant (planted below, then removed) makes
  the table's own boundary check fail instead of moving along with it — the tile predicate's
  shared-memory reserve included (the FC2 tile goes through ``b12x.ops.dense.tiles.qualify``).
* Cases are validated: an unknown or missing field, a wrong type or value names the field.
* ``plan_moe`` takes every decision from the tables: on a grid of problems (uniform, tiers,
  pairs, pinned m_tiles, every decoder family, both compute dtypes, no device and simulated
  devices) the plan's block size and every launch spec equal what this test derives from the
  tables itself, and the plan's recorded decisions replay. A plan that re-decides a geometry
  outside the tables (planted) is caught.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from b12x.formats import resolve_format
from b12x.kernels.shared_layout import fitting_slots
from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.moe import dispatch as D
from b12x.ops.moe import fc2_tile as FT
from b12x.ops.moe import mainloop as ML
from b12x.ops.moe import plan as plan_mod
from b12x.ops.moe.plan import plan_moe
from oracle.judge.dispatch import check_boundaries, check_table
from oracle.judge.tiles import SimulatedDevice

F16, BF16 = torch.float16, torch.bfloat16
H200 = SimulatedDevice("H200", 132, 232448, (9, 0))
SMALL = SimulatedDevice("small-sm80", 8, 49152, (8, 0))
TINY_SMEM = SimulatedDevice("tiny-smem", 4, 41727, (8, 6))
BIG = SimulatedDevice("big-sm120", 4000, 101376, (12, 0))
DEVICES = (None, H200, SMALL, TINY_SMEM, BIG)

# A few interior points per table (the boundaries add both sides of every threshold).
GRIDS = {
    "moe_route_block": [
        {"m": m, "top_k": k, "num_experts": e}
        for m, k, e in itertools.product((1, 17, 200, 4096), (1, 8), (8, 128))
    ],
    "moe_mainloop": [
        ML._mainloop_case(m=m, num_experts=e, max_shared_mem=smem)
        for m, e, smem in itertools.product((1, 512, 1024, 4096), (8, 128), (None, 101376, 232448))
    ],
    "moe_k_split": [{"k": k} for k in (128, 512, 896, 1536, 3072, 5120, 7168)],
    "moe_gemm_geometry": [
        {"m_tiles": mt, "n": n, "k_split": ks, "wide_tile_cap": f}
        for mt, n, ks, f in itertools.product((1, 2, 4), (128, 384, 5120), (1, 4), D.WIDE_TILE_CAPS)
    ],
    "moe_pair_geometry": [
        {"phase": ph, "m_tiles": mt, "n": n}
        for ph, mt, n in itertools.product(("fc1", "fc2"), (1, 2, 4), (256, 384, 1024))
    ],
    "moe_fc2_tile": [
        {**FT._ft(), "sm_count": None, "max_shared_mem": None},
        FT._ft(m=4096, m_tiles=4, k_split=1, default_n_group=256),
    ],
}


def test_tables_are_exported_in_plan_order():
    assert [t.name for t in D.TABLES] == [
        "moe_mainloop", "moe_route_block", "moe_k_split", "moe_gemm_geometry",
        "moe_pair_geometry", "moe_fc2_tile",
    ]  # fmt: skip
    assert dict(D.TABLES_BY_NAME) == {t.name: t for t in D.TABLES}


@pytest.mark.parametrize("table", D.TABLES, ids=lambda t: t.name)
def test_every_table_passes_the_generic_checks(table):
    outcomes = check_table(table, GRIDS[table.name])
    assert all(o.passed for o in outcomes), [o.failures for o in outcomes if not o.passed]
    reach = next(o for o in outcomes if o.check == "dispatch.reachability")
    # every row is reached by the declared boundaries alone, not only by the interior grid
    sides = {b.expect_below for b in table.boundaries} | {b.expect_above for b in table.boundaries}
    assert sides == {row.name for row in table.paths}, sides
    assert all(count > 0 for count in reach.metrics["hits"].values())


@pytest.mark.parametrize("table", D.TABLES, ids=lambda t: t.name)
def test_explain_gives_one_reason_per_row_considered(table):
    for boundary in table.boundaries:
        for side in ("below", "above"):
            case = {**boundary.base, boundary.field: getattr(boundary, side)}
            got = table.explain(case)
            names = [row.name for row in table.paths]
            considered = names[: names.index(got.path) + 1]
            assert [r.split(":")[0] for r in got.reasons] == considered
            assert got.reasons[-1] == f"{got.path}: selected"
            assert got.value == table.decide(case)


# Each plant moves one threshold of one table; its literal boundary must catch it. The planted
# value is removed when the monkeypatch context ends, and the table passes again.
PLANTS = [
    ("moe_route_block", D, "M_TILES_1_MAX_ROUTES", 25, "m_tiles_1_max_routes"),
    ("moe_route_block", D, "M_TILES_2_MAX_ROUTES", 47, "m_tiles_2_max_routes"),
    ("moe_k_split", D, "MIN_K_SLICE", 384, "k_split_8_min_slice"),
    ("moe_k_split", D, "MIN_K_SLICE_FOUR_GROUPS", 512, "k_split_4_min_slice"),
    ("moe_k_split", D, "K_UNIT", 64, "k_split_4_whole_units"),
    ("moe_gemm_geometry", D, "WIDE_CTA_WARPS", 8, "geometry_group_width"),
    ("moe_gemm_geometry", D, "WIDE_TILE_CAP", 2, "geometry_tile_cap"),
    ("moe_pair_geometry", D, "PAIR_CHANNELS", 128, "pair_k_axis_2_n"),
    ("moe_fc2_tile", dense_tiles, "SMEM_RESERVE", 0, "fc2_tile_shared_memory"),
    ("moe_fc2_tile", FT, "WAVE_FC2_MIN_ROUTES", 1033, "fc2_tile_measured_routes"),
    ("moe_mainloop", ML, "SHARED_MIN_ROUTES", 65, "mainloop_min_routes"),
    ("moe_mainloop", ML, "SHARED_WIDE_SMEM", 114689, "mainloop_smem"),
]


@pytest.mark.parametrize("table_name, module, constant, planted, boundary", PLANTS)
def test_a_moved_threshold_fails_its_boundary(table_name, module, constant, planted, boundary):
    table = D.TABLES_BY_NAME[table_name]
    assert check_boundaries(table).passed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, constant, planted)
        outcome = check_boundaries(table)
        assert not outcome.passed, f"moving {constant} to {planted!r} went unnoticed"
        assert any(f"boundary {boundary} " in f for f in outcome.failures), outcome.failures
    assert check_boundaries(table).passed  # the plant is removed


@pytest.mark.parametrize(
    "table, case, error, match",
    [
        (D.ROUTE_BLOCK, {"m": 1, "top_k": 1, "num_experts": 1, "tokens": 3}, ValueError, "tokens"),
        (D.ROUTE_BLOCK, {"m": 1, "top_k": 1}, ValueError, "num_experts: missing"),
        (D.ROUTE_BLOCK, {"m": True, "top_k": 1, "num_experts": 1}, TypeError, "m: expected int"),
        (D.ROUTE_BLOCK, {"m": 0, "top_k": 1, "num_experts": 1}, ValueError, "m: expected a pos"),
        (D.ROUTE_BLOCK, {"m": 1, "top_k": 1, "num_experts": 1, "m_tiles": 3}, ValueError,
         r"m_tiles: expected None or one of \(1, 2, 4\)"),
        (D.ROUTE_BLOCK, {"m": 1, "top_k": 1, "num_experts": 1, "m_tiles": True}, TypeError,
         "m_tiles"),
        (D.K_SPLIT, {"k": 4096.0}, TypeError, "k: expected int, got float"),
        (D.K_SPLIT, [("k", 128)], TypeError, "case: expected a mapping"),
        (D.GEMM_GEOMETRY, {"m_tiles": 1, "n": 128, "k_split": 3}, ValueError, "k_split"),
        (D.GEMM_GEOMETRY, {"m_tiles": 1, "n": 128, "k_split": 1, "wide_tile_cap": 3},
         ValueError, "wide_tile_cap: expected one of"),
        (D.GEMM_GEOMETRY, {"m_tiles": 1, "n": 128, "k_split": 1, "compute_dtype": torch.float32},
         ValueError, "compute_dtype"),
        (D.GEMM_GEOMETRY, {"m_tiles": 1, "n": 128, "k_split": 1, "compute_dtype": 16}, TypeError,
         "compute_dtype"),
        (D.PAIR_GEOMETRY, {"phase": "fc3", "m_tiles": 1, "n": 256}, ValueError,
         r"phase: expected one of \('fc1', 'fc2'\)"),
        (D.PAIR_GEOMETRY, {"phase": 1, "m_tiles": 1, "n": 256}, TypeError, "phase"),
        (D.FC2_TILE, {**FT._ft(), "pair": "P55"}, ValueError, "pair: expected None or one of"),
        (D.FC2_TILE, {**FT._ft(), "sm_count": 0}, ValueError, "sm_count"),
        (D.FC2_TILE, {**FT._ft(), "max_shared_mem": "big"}, TypeError, "max_shared_mem"),
    ],
)  # fmt: skip
def test_cases_are_validated_naming_the_field(table, case, error, match):
    with pytest.raises(error, match=match):
        table.explain(case)


def test_case_validation_accepts_dtypes_and_defaults():
    geo = {"m_tiles": 2, "n": 3072, "k_split": 1}
    assert D.GEMM_GEOMETRY.normalize_case({**geo, "compute_dtype": BF16})["compute_dtype"] == (
        "bfloat16"
    )
    assert D.GEMM_GEOMETRY.normalize_case(geo) == {
        **geo,
        "wide_tile_cap": 4,
        "compute_dtype": "float16",
    }
    assert D.ROUTE_BLOCK.normalize_case({"m": 1, "top_k": 1, "num_experts": 1})["m_tiles"] is None


@pytest.mark.parametrize(
    "table, base",
    [(D.GEMM_GEOMETRY, D._geo(m_tiles=m)) for m in (1, 2, 4)]
    + [(D.PAIR_GEOMETRY, D._pg(phase=p, m_tiles=m)) for p in ("fc1", "fc2") for m in (1, 2, 4)],
)
def test_compute_dtype_never_changes_a_geometry(table, base):
    half, bf16 = ({**base, "compute_dtype": cd} for cd in ("float16", "bfloat16"))
    assert table.explain(half).path == table.explain(bf16).path
    assert table.decide(half) == table.decide(bf16)


# ------------------------------------------------------------------ plan_moe follows the tables


def _expected_spec(*, codebook, bits, compute_dtype, m_tiles, phase, pair, k, n):
    """(k_split, n_tiles, warps, depth, rate_axis) of one launch, from the tables directly."""
    cd = str(compute_dtype).removeprefix("torch.")
    if pair is not None:
        g = D.PAIR_GEOMETRY.decide(
            {"phase": phase, "m_tiles": m_tiles, "n": n, "compute_dtype": cd}
        )
        return 1, g.n_tiles, g.warps, g.depth, g.rate_axis
    k_split = D.K_SPLIT.decide({"k": k})
    cap = resolve_format(codebook, bits).wide_tile_cap
    case = {"m_tiles": m_tiles, "n": n, "k_split": k_split, "wide_tile_cap": cap}
    case["compute_dtype"] = cd
    g = D.GEMM_GEOMETRY.decide(case)
    return k_split, g.n_tiles, g.warps, g.depth, None


def _check_plan_against_tables(problem, device):
    plan = plan_moe(**problem, device=device)
    bits = problem["bits"] if isinstance(problem["bits"], tuple) else (problem["bits"],)
    experts = problem["num_experts"]
    e = sum(experts) if isinstance(experts, tuple) else experts
    m, top_k, h, i = problem["m"], problem["top_k"], problem["hidden"], problem["intermediate"]
    route_case = {"m": m, "top_k": top_k, "num_experts": e, "m_tiles": problem.get("m_tiles")}
    m_tiles = D.ROUTE_BLOCK.decide(route_case)
    fc1_n = 2 * i if problem["w13_layout"] == "packed" else i
    paired = (problem.get("fc1_pair"), problem.get("fc2_pair")) != (None, None)
    shared = ML.MAINLOOP.decide({
        **route_case, "shared_decode": problem.get("shared_decode"), "paired": paired,
        "fc1_pair_odd": problem.get("fc1_pair") == "P43",
        "fc1_n": fc1_n, "fc2_n": h, "max_shared_mem": device and device.max_shared_mem,
        "capability": device and tuple(device.capability),
    })  # fmt: skip
    if shared is not None:
        return _check_shared_plan(plan, shared, problem, bits, fc1_n)
    assert plan.routes.block_size == 16 * m_tiles
    for phase, specs, k, n in (("fc1", plan.fc1_spec, h, fc1_n), ("fc2", plan.fc2_spec, i, h)):
        pair = problem.get(f"{phase}_pair")
        assert len(specs) == (1 if pair is not None else len(bits))
        for spec, b in zip(specs, bits, strict=False):
            assert spec.m_warps == 0, spec
            want = _expected_spec(
                codebook=problem["codebook"], bits=b, compute_dtype=problem["compute_dtype"],
                m_tiles=m_tiles, phase=phase, pair=pair, k=k, n=n,
            )  # fmt: skip
            if phase == "fc2":
                tile_case = {
                    "sm_count": None if device is None else device.sm_count,
                    "max_shared_mem": None if device is None else device.max_shared_mem,
                    "m": m, "top_k": top_k, "num_experts": e, "hidden": h, "intermediate": i,
                    "bits": spec.bits, "m_tiles": m_tiles, "k_split": want[0],
                    "default_n_group": 16 * want[1] * want[2], "pair": pair,
                }  # fmt: skip
                tile = D.FC2_TILE.decide(tile_case)
                if tile is not None:
                    want = (want[0], *tile, None)
            got = (spec.k_split, spec.n_tiles, spec.warps, spec.depth, spec.rate_axis)
            assert got == want, (phase, problem, device, got, want)
            assert spec.m_tiles == m_tiles and spec.bf16 == (problem["compute_dtype"] == BF16)
    return _check_replay(plan)


def _check_replay(plan):
    for d in plan.decisions:  # the record replays: same table, same case, same path and value
        replay = D.TABLES_BY_NAME[d.table].explain(dict(d.case))
        assert (replay.path, replay.value) == (d.path, d.value), d
    return plan


def _check_shared_plan(plan, shared, problem, bits, fc1_n):
    """The shared decode: 128-slot blocks, the geometry of the mainloop table (wgmma included),
    the K split of K_SPLIT (its fold order), slots as the geometry fixes them or fitted to each
    tier's bits; no route block, geometry or FC2 tile decision (none of them would be used)."""
    assert plan.routes.block_size == shared.block_size
    h, i = problem["hidden"], problem["intermediate"]
    for phase, specs, k in (("fc1", plan.fc1_spec, h), ("fc2", plan.fc2_spec, i)):
        pair = problem.get(f"{phase}_pair")
        assert len(specs) == (1 if pair is not None else len(bits))
        for spec, b in zip(specs, bits, strict=False):
            rows, stages = shared.slots or fitting_slots(
                bits=b, m_tiles=shared.m_tiles, n_tiles=shared.n_tiles, warps=shared.warps,
                m_warps=shared.m_warps,
            )  # fmt: skip
            got = (spec.m_tiles, spec.n_tiles, spec.warps, spec.m_warps, spec.wgmma, spec.k_split)
            # a pair launch (the pair shared decode) has no K split
            want = (*shared[:5], 1 if pair is not None else D.K_SPLIT.decide({"k": k}))
            assert spec.pair == pair
            assert got == want and (spec.shared_rows, spec.smem_stages) == (rows, stages)
            assert spec.block_size == plan.routes.block_size
    tables = {d.table for d in plan.decisions}
    assert not tables & {"moe_route_block", "moe_gemm_geometry", "moe_fc2_tile"}, tables
    return _check_replay(plan)


def _problems():
    glm = dict(
        top_k=8, hidden=5120, intermediate=1536, codebook="mcg", bits=4, num_experts=128,
        w13_layout="packed", x_dtype=BF16, compute_dtype=F16,
    )  # fmt: skip
    small = dict(glm, hidden=512, intermediate=256, num_experts=8, top_k=2)
    out = []
    for m in (1, 8, 64, 256, 385, 4096):  # M = 256: 2048 routes, past WAVE_FC2_MIN_ROUTES
        out.append(dict(glm, m=m))
    for m, cd, layout in itertools.product((1, 200), (F16, BF16), ("packed", "proj")):
        out.append(dict(small, m=m, compute_dtype=cd, w13_layout=layout))
    for codebook, bits in (("sqg_fp16", 5), ("sqg_e4m3", 3), ("mul1", 6), ("3inst", 2)):
        out.append(dict(glm, m=4096, codebook=codebook, bits=bits))  # the shared decode (H200)
        # m_tiles 4 per-warp: the D3L row
        out.append(dict(glm, m=4096, codebook=codebook, bits=bits, shared_decode="off"))
        out.append(dict(small, m=3, codebook=codebook, bits=bits))
    for pin in (1, 2, 4):
        out.append(dict(glm, m=8, m_tiles=pin))
        out.append(dict(small, m=100, m_tiles=pin, intermediate=768))  # k_split 1 at FC2
    out.append(dict(glm, m=64, bits=(3, 4), num_experts=(64, 64), num_global_experts=128))
    out.append(dict(small, m=100, w13_layout="proj", intermediate=384))  # N % 256 != 0, wide
    for m, (fc1, fc2) in itertools.product((1, 400, 4096), (("P24", "dynamic"), (None, "P33"))):
        out.append(dict(glm, m=m, bits=3, fc1_pair=fc1, fc2_pair=fc2, w13_layout="proj"))
    # per-warp pairs at m_tiles 4 (on sm_90 the table plans the pair shared decode there)
    out.append(dict(glm, m=4096, bits=3, fc1_pair="P24", fc2_pair="dynamic", w13_layout="proj",
                    shared_decode="off"))  # fmt: skip
    out.append(dict(glm, m=4096, bits=3, fc1_pair="P43", fc2_pair="P33", w13_layout="proj"))
    out.append(dict(glm, m=60, bits=3, num_experts=16, fc2_pair="P44", hidden=5248))
    return out


PROBLEMS = _problems()


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: "none" if d is None else d.name)
def test_plan_moe_takes_every_decision_from_the_tables(device):
    paths = set()
    for problem in PROBLEMS:
        plan = _check_plan_against_tables(problem, device)
        paths |= {(d.table, d.path) for d in plan.decisions}
    if device is H200:  # the grid exercises the wave-balanced tile and every geometry row
        assert ("moe_fc2_tile", "wave_balanced") in paths
        reached = {p for t, p in paths if t in ("moe_gemm_geometry", "moe_pair_geometry")}
        assert reached == {r.name for t in (D.GEMM_GEOMETRY, D.PAIR_GEOMETRY) for r in t.paths}


def test_plan_records_roles_per_phase_and_tier():
    (tiers,) = [p for p in PROBLEMS if isinstance(p["bits"], tuple)]
    plan = plan_moe(**tiers, device=H200)
    roles = [d.role for d in plan.decisions]
    assert roles == [
        "mainloop", "route_block",
        "fc1[0].k_split", "fc1[0].geometry", "fc1[1].k_split", "fc1[1].geometry",
        "fc2[0].k_split", "fc2[0].geometry", "fc2[0].fc2_tile",
        "fc2[1].k_split", "fc2[1].geometry", "fc2[1].fc2_tile",
    ]  # fmt: skip
    assert plan_mod.describe(plan)["decisions"][:2] == [
        ("mainloop", "moe_mainloop", "few_routes"),
        ("route_block", "moe_route_block", "m_tiles_1"),
    ]


def test_a_geometry_decided_outside_the_tables_is_caught(monkeypatch):
    """Plant: the planner builds its pair spec with a hard-coded 2-tile geometry instead of the
    table's answer (a re-decision). The plan-vs-table comparison must flag it; without the plant
    the same problem passes."""
    problem = dict(PROBLEMS[0], bits=3, fc2_pair="P33", m=64, m_tiles=2)  # k_axis_2_four_tiles
    _check_plan_against_tables(problem, None)
    real = plan_mod.pair_spec

    def re_decided(**kwargs):
        kwargs["geometry"] = kwargs["geometry"]._replace(n_tiles=2)
        return real(**kwargs)

    monkeypatch.setattr(plan_mod, "pair_spec", re_decided)
    with pytest.raises(AssertionError, match="fc2"):
        _check_plan_against_tables(problem, None)
    monkeypatch.undo()
    _check_plan_against_tables(problem, None)


def test_legacy_helpers_answer_from_the_tables(monkeypatch):
    from b12x.ops.moe import pairs

    assert plan_mod.choose_m_tiles(385, 8, 128) == 2
    assert plan_mod.choose_k_split(5120, 1) == 8
    assert plan_mod.gemm_geometry(4, 3072, 1, wide_tile_cap=2) == (2, 4, 2)
    assert pairs.pair_geometry(phase="fc2", m_tiles=4, n=512) == (2, 4, 1, "k")
    spec = plan_moe(**dict(PROBLEMS[3], device=H200)).fc2_spec[0]  # M = 256: 2048 routes
    assert spec.n_group == 512  # the wave-balanced tile
    default = dataclasses.replace(spec, n_tiles=2, warps=4, depth=8)
    p = plan_moe(**PROBLEMS[3])
    assert plan_mod.wave_balanced_fc2(p.problem, p.routes, default, H200)
    monkeypatch.setattr(D, "M_TILES_1_MAX_ROUTES", 8)  # the helpers read the table, live
    assert plan_mod.choose_m_tiles(9, 1, 1) == 2
