"""The generic tile checks pass on a good registry and CATCH broken ones (R3, R15).

The double mirrors spec §5.4: candidates (64,256,256), (128,128,256), (64,128,128), (128,64,128)
and the wave-balanced FC2 tile (tile_k 32, tile_n 512, 256 threads), qualified for FC2 only by
the single predicate. Auto-selection takes the wave tile when the 256-wide tile would need a
second wave on the device and the 512-wide one fits in one (so: GB10, not the 188-SM part).
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap

import pytest

from oracle.judge.tiles import (
    DEVICES,
    SimulatedDevice,
    check_pin_matches_qualify,
    check_registry,
    check_round_trip,
    find_duplicated_floors,
    validate_registry,
)


@dataclasses.dataclass(frozen=True)
class Tile:
    tile_k: int
    tile_n: int
    threads: int


@dataclasses.dataclass(frozen=True)
class Problem:
    phase: str  # "fc1" | "fc2"
    m_blocks: int
    n: int
    k: int


WAVE_FC2 = Tile(32, 512, 256)
STANDARD = (Tile(64, 256, 256), Tile(128, 128, 256), Tile(64, 128, 128), Tile(128, 64, 128))
GB10 = next(d for d in DEVICES if d.name == "gb10")
RTX = next(d for d in DEVICES if d.name == "rtx_pro_6000")


class GoodRegistry:
    name = "double"
    entries = (*STANDARD, WAVE_FC2)
    problems = tuple(
        Problem(phase, m_blocks, n, k)
        for phase in ("fc1", "fc2")
        for m_blocks in (1, 4)
        for n, k in ((4096, 512), (2048, 1024), (1536, 768))
    )

    def qualify(self, tile, problem, device):
        if problem.n % tile.tile_n or problem.k % tile.tile_k:
            return False, f"{problem.n}x{problem.k} not divisible by {tile.tile_n}x{tile.tile_k}"
        if tile.tile_k < 64 and not (tile == WAVE_FC2 and problem.phase == "fc2"):
            return False, f"tile_k {tile.tile_k} < 64 (only the FC2 wave tile is exempt)"
        smem = (
            4 * 16 * tile.tile_k * 2
            + 4 * tile.tile_k * tile.tile_n // 2
            + 16 * (tile.tile_n + 8) * 2
        )
        if smem > device.max_shared_mem - 512:
            return False, f"shared memory {smem} B > {device.max_shared_mem - 512} B"
        return True, "fits"

    def auto_select(self, problem, device):
        fitting = [t for t in STANDARD if self.qualify(t, problem, device)[0]]
        if not fitting:
            raise ValueError(f"no tile fits {problem}")
        best = fitting[0]
        tasks = problem.m_blocks * problem.n // best.tile_n
        wave_tasks = problem.m_blocks * problem.n // WAVE_FC2.tile_n
        if (
            best.tile_n == 256
            and tasks > device.sm_count >= wave_tasks
            and self.qualify(WAVE_FC2, problem, device)[0]
        ):
            return WAVE_FC2
        return best

    def serialize(self, tile):
        return (tile.tile_k, tile.tile_n, tile.threads)

    def deserialize(self, spec):
        return Tile(*spec)

    def pin(self, spec, problem, device):
        tile = self.deserialize(spec)
        ok, reason = self.qualify(tile, problem, device)
        if not ok:
            raise ValueError(f"pinned tile {tile} rejected: {reason}")
        return tile


class DuplicatedFloorRegistry(GoodRegistry):
    """The R3 bug: the pin re-validates with its own generic floor, tile_k >= 64."""

    def pin(self, spec, problem, device):
        tile = self.deserialize(spec)
        if tile.tile_k < 64:
            raise ValueError(f"tile_k {tile.tile_k} below the floor 64")
        return super().pin(spec, problem, device)


class LossySerializationRegistry(GoodRegistry):
    """The custom-op schema drops the thread count (R15: the pin loses a field)."""

    def serialize(self, tile):
        return (tile.tile_k, tile.tile_n)

    def deserialize(self, spec):
        return Tile(spec[0], spec[1], 128 if len(spec) == 2 else spec[2])


class PermissivePinRegistry(GoodRegistry):
    """The pin skips the predicate entirely."""

    def pin(self, spec, problem, device):
        return self.deserialize(spec)


def test_the_double_exercises_the_wave_branch_only_on_small_parts():
    reg = GoodRegistry()
    fc2 = Problem("fc2", 4, 4096, 512)  # 64 tasks of 256 wide; 32 of 512 wide
    assert reg.auto_select(fc2, GB10) == WAVE_FC2  # 64 > 48 >= 32
    assert reg.auto_select(fc2, RTX) == Tile(64, 256, 256)  # 64 <= 188
    assert reg.auto_select(Problem("fc1", 4, 4096, 512), GB10) == Tile(64, 256, 256)
    assert reg.qualify(WAVE_FC2, Problem("fc1", 4, 4096, 512), GB10)[0] is False


def test_good_registry_passes():
    outcomes = check_registry(GoodRegistry())
    assert all(o.passed for o in outcomes), [o.failures for o in outcomes]
    rt = outcomes[0]
    assert rt.metrics["combos"] == len(GoodRegistry.problems) * len(DEVICES)
    assert rt.metrics["selected"].get(repr(WAVE_FC2), 0) > 0


def test_duplicated_floor_is_caught_by_round_trip_on_gb10_only():
    reg = DuplicatedFloorRegistry()
    out = check_round_trip(reg, reg.problems)
    assert not out.passed
    assert "pin rejects the auto-selected" in out.failures[0]
    big_parts = [d for d in DEVICES if d.sm_count >= 120]
    assert check_round_trip(reg, reg.problems, big_parts).passed  # why nobody upstream saw it
    assert not check_pin_matches_qualify(reg, reg.problems).passed


def test_lossy_serialization_is_caught():
    reg = LossySerializationRegistry()
    out = check_round_trip(reg, reg.problems)
    assert any("serialize/deserialize changed" in f for f in out.failures)


def test_pin_without_predicate_is_caught():
    reg = PermissivePinRegistry()
    assert check_round_trip(reg, reg.problems).passed  # auto tiles are fine ...
    out = check_pin_matches_qualify(reg, reg.problems)
    assert any("pin accepts" in f and "qualify rejects" in f for f in out.failures)


def test_undeclared_auto_tile_and_unplain_spec_are_caught():
    class Rogue(GoodRegistry):
        def auto_select(self, problem, device):
            return Tile(16, 16, 32)

    assert "undeclared tile" in check_round_trip(Rogue(), Rogue.problems).failures[0]

    class ObjectSpec(GoodRegistry):
        def serialize(self, tile):
            return tile

    assert "not plain" in check_round_trip(ObjectSpec(), ObjectSpec.problems).failures[0]


def test_static_duplicated_floor_detector():
    source = textwrap.dedent(
        """
        def qualify(tile, problem, device):
            return tile.tile_k >= 64 or tile == WAVE

        def pin(tile):
            if tile.tile_k < 64:
                raise ValueError("floor")
            if tile.tile_k == 32:
                pass
        """
    )
    found = find_duplicated_floors(source, "qualify")
    assert len(found) == 1 and found[0].startswith("line 6:") and "in pin" in found[0]
    good_src = textwrap.dedent(inspect.getsource(GoodRegistry))
    assert find_duplicated_floors(good_src, "qualify") == []
    bad_src = textwrap.dedent(inspect.getsource(DuplicatedFloorRegistry))
    assert len(find_duplicated_floors(bad_src, "qualify")) == 1


def test_validation_errors_name_the_argument():
    with pytest.raises(ValueError, match="sm_count"):
        SimulatedDevice("x", 0, 1024, (8, 0))
    with pytest.raises(ValueError, match="capability"):
        SimulatedDevice("x", 1, 1024, "8.0")

    class NoPin:
        name = "x"
        entries = ()

        def qualify(self, *a):
            return True, ""

    with pytest.raises(TypeError, match="`auto_select`"):
        validate_registry(NoPin())
    with pytest.raises(ValueError, match="no problems"):
        check_registry(type("R", (GoodRegistry,), {"problems": None})())


def test_qualify_tile_reports_where_the_one_predicate_accepts_the_pin():
    from oracle.checks.dispatch_tiles import qualify_tile
    from oracle.judge.tiles import parse_tile

    assert parse_tile("32x512x256") == (32, 512, 256)
    with pytest.raises(ValueError, match="--tile"):
        parse_tile("32by512")
    (good,) = qualify_tile("32x512x256", [GoodRegistry()])
    assert good.status == "pass"
    # every FC2 problem (all three N are multiples of 512, K of 32) x 2 M on every device; no FC1
    assert good.metrics["accepted"] == 3 * 2 * len(DEVICES)
    assert "rejected at 36" in good.reason
    (bad,) = qualify_tile("32x512x256", [DuplicatedFloorRegistry()])
    assert bad.status == "fail" and "pin and qualify disagree" in bad.reason
    (unknown,) = qualify_tile("16x16x32", [GoodRegistry()])
    assert unknown.status == "fail" and "not a declared entry" in unknown.reason


def test_the_wave_fc2_tile_pins_moe_cases_planned_for_a_simulated_h200():
    """``run --tile 32x512x256`` keeps the uniform unpaired MoE cases whose FC2 plans the wave
    tile on the device: a simulated part plans like a real one (no CUDA needed), and only cases
    past ``WAVE_FC2_MIN_ROUTES`` routes take it."""
    from b12x.ops.moe.fc2_tile import WAVE_FC2_MIN_ROUTES
    from oracle.cases import grids
    from oracle.judge.tiles import DEVICES
    from oracle.run.grid import pinned_cases

    h200 = next(d for d in DEVICES if d.name == "h200")
    pool = grids.select_cases(filter="op=moe,heavy=false,m=129", tier="gpu")
    kept, why = pinned_cases(pool, "32x512x256", device=h200)
    assert kept and why == ""
    assert all(c.variant.tier_layout is None and c.variant.pair_kind is None for c in kept)
    assert all(c.m * c.top_k >= WAVE_FC2_MIN_ROUTES for c in kept)
    few = [c for c in pool if c.m * c.top_k < WAVE_FC2_MIN_ROUTES]
    assert few and pinned_cases(few, "32x512x256", device=h200)[0] == []
