"""The tile registry: one predicate for auto-selection and pins (R3), on simulated devices.

Footprints are recomputed here by hand from spec §5.4; the GB10 numbers are the spec's
(48 SMs, 101,376 B opt-in shared memory).
"""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from b12x.ops.dense import tiles as T
from oracle.judge.tiles import (
    DEVICES,
    SimulatedDevice,
    check_pin_matches_qualify,
    check_registry,
    check_round_trip,
    find_duplicated_floors,
)
from oracle.pytest_plugin import scaled_examples

GB10 = SimulatedDevice("gb10", 48, 101_376, (12, 1))
RTX = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))
TINY = SimulatedDevice("tiny_48k", 16, 48 * 1024, (8, 0))
WAVE = T.Tile(32, 512, 256)
# The bs=2-style FC2 problem: 4 M16 blocks x 16 N256 tiles = 64 tiles > 48 SMs; half fits.
FC2_WAVE = T.TileProblem("fc2", 64, 512, 4096, 4, fc1_threads=256, fc1_mn_tiles=40)
FC1 = T.TileProblem("fc1", 64, 4096, 1024, 4)


def test_footprints_match_the_spec_formula_by_hand():
    # (32,512,256), bits 4, cta_m 16: B = 4*32*512*4/8 = 32768, A = 4*16*32*2 = 4096,
    # red = 16*520*2 = 16640, tmp = max(32768, 16640, 16640+1024) = 32768, S = 1*512*8 = 4096.
    assert T.footprint(WAVE, FC2_WAVE) == 32768 + 4096 + 4096 + 256
    # (64,256,256), bits 6: B = 4*64*256*6/8 = 49152, A = 8192, S = 2*256*8 = 4096.
    dense6 = T.TileProblem("dense", 1, 2048, 4096, 6)
    assert T.footprint(T.Tile(64, 256, 256), dense6) == 49152 + 8192 + 4096 + 256
    # bits below 4 stage as 4-bit: K2 and K4 footprints are equal.
    k2 = T.TileProblem("dense", 1, 2048, 4096, 2)
    k4 = T.TileProblem("dense", 1, 2048, 4096, 4)
    assert T.footprint(T.Tile(64, 256, 256), k2) == T.footprint(T.Tile(64, 256, 256), k4)


def test_oracle_generic_checks_pass_on_every_simulated_device():
    outcomes = check_registry(T.REGISTRY, devices=(*DEVICES, TINY))
    assert [o.failures for o in outcomes] == [(), ()]
    selected = outcomes[0].metrics["selected"]
    assert repr(WAVE) in selected  # the wave tile is really auto-selected somewhere


def test_gb10_auto_selects_the_wave_tile_and_its_pin_round_trips():
    tile = T.auto_select(FC2_WAVE, GB10)
    assert tile == WAVE
    spec = T.serialize(tile)
    assert spec == [32, 512, 256]
    assert T.pin(spec, FC2_WAVE, GB10) == WAVE
    assert T.key(T.pin(spec, FC2_WAVE, GB10), FC2_WAVE, GB10) == T.key(tile, FC2_WAVE, GB10)


def test_wave_rule_does_not_fire_on_a_188_sm_part():
    assert T.auto_select(FC2_WAVE, RTX) != WAVE  # 64 tiles fit in one wave of 188 SMs


def test_wave_tile_qualified_for_fc2_only():
    ok, _ = T.qualify(WAVE, FC2_WAVE, GB10)
    assert ok
    fc1 = T.TileProblem("fc1", 64, 512, 4096, 4)
    dense = T.TileProblem("dense", 64, 512, 4096, 4)
    for problem in (fc1, dense):
        ok, reason = T.qualify(WAVE, problem, GB10)
        assert not ok and "fc2 only" in reason
        with pytest.raises(ValueError, match="fc2 only"):
            T.pin([32, 512, 256], problem, GB10)


@pytest.mark.parametrize("spec", [[32, 256, 128], [16, 512, 128]])
def test_other_sub_64_k_tiles_are_rejected_even_for_fc2(spec):
    ok, reason = T.qualify(T.deserialize(spec), FC2_WAVE, GB10)
    assert not ok
    with pytest.raises(ValueError, match="rejected"):
        T.pin(spec, FC2_WAVE, GB10)


def test_the_k_floor_itself_names_tile_k():
    ok, reason = T.qualify(T.Tile(32, 256, 128), FC2_WAVE, GB10)
    assert not ok and "tile_k=32 is below the floor 64" in reason


def test_shared_memory_limit_comes_from_the_device():
    dense6 = T.TileProblem("dense", 1, 2048, 4096, 6)
    ok, reason = T.qualify(T.Tile(64, 256, 256), dense6, TINY)  # 61,696 B > 48 KiB - 512
    assert not ok and "shared memory" in reason
    assert T.qualify(T.Tile(64, 256, 256), dense6, GB10)[0]
    # (64,128,128) bits 6: B 24576 + A 8192 + S 2048 + 256 = 35,072 B fits the small part.
    assert T.auto_select(dense6, TINY) == T.Tile(64, 128, 128)


def test_dense_defaults_follow_n_divisibility():
    assert T.auto_select(T.TileProblem("dense", 8, 2048, 4096, 4), RTX) == T.Tile(64, 256, 256)
    assert T.auto_select(T.TileProblem("dense", 8, 2048, 1152, 4), RTX) == T.Tile(64, 128, 128)


def test_one_predicate_no_duplicated_floors():
    assert find_duplicated_floors(inspect.getsource(T), "qualify") == []


def test_pin_rejects_non_entries_and_bad_specs():
    with pytest.raises(ValueError, match="not a registry entry"):
        T.pin([256, 64, 256], T.TileProblem("dense", 1, 4096, 4096, 4), RTX)
    with pytest.raises(ValueError, match="tile_k, tile_n, cta_threads"):
        T.deserialize([64, 256])
    with pytest.raises(TypeError, match="three ints"):
        T.deserialize([64.0, 256, 256])


def test_a_disagreeing_pin_is_caught_by_the_oracle_check():
    """Mutant: a pin with its own tile_k floor (the 9bbae67 bug) fails the round trip on GB10."""

    class DuplicatedFloor(type(T.REGISTRY)):
        def pin(self, spec, problem, device):
            tile = T.deserialize(spec)
            if tile.tile_k < 64:
                raise ValueError("tile_k below 64")
            return T.pin(spec, problem, device)

    mutant = DuplicatedFloor()
    assert not check_round_trip(mutant, [FC2_WAVE], [GB10]).passed
    assert not check_pin_matches_qualify(mutant, [FC2_WAVE], [GB10]).passed


PROBLEMS = st.builds(
    T.TileProblem,
    phase=st.sampled_from(T.PHASES),
    m=st.sampled_from([1, 8, 16, 64, 128, 129, 512]),
    k=st.sampled_from([512, 2048, 6144]),
    n=st.sampled_from([1024, 1152, 4096, 6144]),
    bits=st.sampled_from([2, 3, 4, 5, 6]),
    cta_m_blocks=st.sampled_from([1, 2]),
    fc1_threads=st.sampled_from([None, 128, 256]),
    fc1_mn_tiles=st.sampled_from([None, 16, 40, 96]),
)


@settings(deadline=None, max_examples=scaled_examples(40))
@given(problem=PROBLEMS, device=st.sampled_from((*DEVICES, TINY)))
def test_auto_select_round_trips_through_pin(problem, device):
    tile = T.auto_select(problem, device)
    assert tile in T.ENTRIES
    assert T.qualify(tile, problem, device) == (True, "ok")
    assert T.pin(T.serialize(tile), problem, device) == tile
