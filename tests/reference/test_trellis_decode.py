"""Tests for reference.trellis: pack/states/bits_of/decode (spec §1.2–§1.5, Appendix A).

decode is checked against an index map built independently here: states from the §1.3 window
definition evaluated on plain Python ints (SWAP16 undone by hand), positions from the m16n8k16
B-fragment definition, values from the codebook LUT (whose bytes are pinned separately by the
§2.9 fingerprints).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.pytest_plugin import scaled_examples
from reference import bitstream, trellis
from reference.codebooks import state_values

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"
BITS = tuple(range(1, 9))
HASH_CODEBOOKS = ("3inst", "mcg", "mul1")
SQG_PAIRS = (("sqg_e4m3", 2), ("sqg_e4m3", 3), ("sqg_e4m3", 4), ("sqg_fp16", 5), ("sqg_fp16", 6))


def _random_payload(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-32768, 32768, shape, generator=gen, dtype=torch.int16)


def _py_tile_states(stored: list[int], bits: int) -> list[int]:
    """States of one tile from its stored int16 words, bit by bit (§1.2, §1.3)."""
    stream_words = [stored[j ^ 1] & 0xFFFF for j in range(len(stored))]
    stream = [(word >> (15 - i)) & 1 for word in stream_words for i in range(16)]
    total = 256 * bits
    states = []
    for t in range(256):
        end = (t + 1) * bits
        value = 0
        for i in range(16):
            value = (value << 1) | stream[(end - 16 + i) % total]
        states.append(value)
    return states


def _fragment_position(step: int) -> tuple[int, int]:
    lane, j = divmod(step, 8)
    r = lane % 4
    rows = (2 * r, 2 * r + 1, 2 * r + 8, 2 * r + 9)
    return rows[j % 4], lane // 4 + (8 if j >= 4 else 0)


def _expected_decode(payload: torch.Tensor, codebook: str, bits: int) -> torch.Tensor:
    *lead, k_tiles, n_tiles, _ = payload.shape
    lut = state_values(codebook, bits)
    flat = payload.reshape(-1, k_tiles, n_tiles, 16 * bits)
    out = torch.empty(flat.shape[0], 16 * k_tiles, 16 * n_tiles, dtype=torch.float16)
    for e in range(flat.shape[0]):
        for kt in range(k_tiles):
            for nt in range(n_tiles):
                states = _py_tile_states(flat[e, kt, nt].tolist(), bits)
                for step, state in enumerate(states):
                    k, n = _fragment_position(step)
                    out[e, 16 * kt + k, 16 * nt + n] = lut[state]
    return out.reshape(*lead, 16 * k_tiles, 16 * n_tiles)


@pytest.mark.parametrize("bits", BITS)
def test_decode_mcg_matches_independent_index_map(bits):
    payload = _random_payload((2, 3, 16 * bits), seed=bits)
    got = trellis.decode(payload, "mcg")
    assert got.dtype == torch.float16 and got.shape == (32, 48)
    assert torch.equal(got, _expected_decode(payload, "mcg", bits))


@pytest.mark.parametrize("codebook", HASH_CODEBOOKS)
def test_decode_with_leading_expert_dim_matches_index_map(codebook):
    bits = 3
    payload = _random_payload((2, 1, 2, 16 * bits), seed=42)
    got = trellis.decode(payload, codebook)
    assert got.shape == (2, 16, 32)
    assert torch.equal(got, _expected_decode(payload, codebook, bits))
    # each expert decodes on its own, as a 3-D layer
    for e in range(2):
        assert torch.equal(got[e], trellis.decode(payload[e], codebook))


@pytest.mark.parametrize(("codebook", "bits"), SQG_PAIRS)
def test_decode_sqg_codebooks_match_index_map(codebook, bits):
    payload = _random_payload((1, 2, 16 * bits), seed=7 * bits)
    assert torch.equal(trellis.decode(payload, codebook), _expected_decode(payload, codebook, bits))


def _half(bits_text: str) -> float:
    return struct.unpack("<e", struct.pack("<H", int(bits_text, 16)))[0]


def _constant_state_cases() -> list[tuple[str, int, int, float]]:
    """(codebook, bits, state, expected value) from the spec's spot values and sample decodes."""
    data = json.loads(FIXTURE.read_text())
    cases = []
    for codebook, bit_rates in (("mcg", (2, 4, 8)), ("3inst", (3,)), ("mul1", (5,))):
        for spot in data["spot_values"][codebook]:
            for bits in bit_rates:
                cases.append((codebook, bits, int(spot["state"], 16), _half(spot["fp16_bits"])))
    for codebook, table in (
        ("sqg_e4m3", data["sqg_e4m3_sample_decodes"]),
        ("sqg_fp16", data["sqg_fp16_sample_decodes"]),
    ):
        for bits_text, row in table.items():
            if not bits_text.isdigit():
                continue
            for state_text, entry in row.items():
                value = _half(entry["fp16_bits"]) if "fp16_bits" in entry else entry["value"]
                cases.append((codebook, int(bits_text), int(state_text, 16), value))
    return [case for case in cases if case[2] in (0x0000, 0xFFFF)]


@pytest.mark.parametrize(("codebook", "bits", "state", "expected"), _constant_state_cases())
def test_all_zero_and_all_one_payloads_decode_to_spec_values(codebook, bits, state, expected):
    # An all-zero (all-one) stream makes every window 0x0000 (0xFFFF), so the whole matrix is
    # the spec's value for that state.
    fill = 0 if state == 0 else -1
    payload = torch.full((2, 2, 16 * bits), fill, dtype=torch.int16)
    got = trellis.decode(payload, codebook)
    assert got.shape == (32, 32)
    assert bool((got.double() == expected).all())


def test_decode_handles_chunking_of_many_row_blocks(monkeypatch):
    monkeypatch.setattr(trellis, "_CHUNK_ELEMENTS", 1)  # one 16-row block per chunk
    payload = _random_payload((3, 2, 2, 64), seed=5)
    got = trellis.decode(payload, "mcg")
    assert torch.equal(got, _expected_decode(payload, "mcg", 4))


def test_decode_accepts_non_contiguous_and_broadcast_payloads():
    base = _random_payload((3, 2, 48), seed=21)  # stored [N/16, K/16, 16b]
    strided = base.transpose(0, 1)  # a non-contiguous [K/16, N/16, 16b] view
    assert not strided.is_contiguous()
    assert torch.equal(trellis.decode(strided, "mcg"), _expected_decode(strided, "mcg", 3))
    broadcast = strided.contiguous().expand(2, 2, 3, 48)  # stride-0 expert dim
    got = trellis.decode(broadcast, "mcg")
    assert torch.equal(got[0], got[1]) and torch.equal(got[1], trellis.decode(strided, "mcg"))


def test_decode_does_not_modify_its_input_or_the_codebook_cache():
    payload = _random_payload((1, 2, 64), seed=9)
    before = payload.clone()
    lut_before = state_values("mcg", 4)
    out = trellis.decode(payload, "mcg")
    out.fill_(0)
    assert torch.equal(payload, before)
    assert torch.equal(state_values("mcg", 4), lut_before)


@settings(deadline=None, max_examples=scaled_examples(30))
@given(
    bits=st.sampled_from(BITS),
    lead=st.sampled_from(((), (2,), (2, 3))),
    seed=st.integers(0, 2**31),
)
def test_pack_then_states_equals_cyclic_states_and_window_rule(bits, lead, seed):
    gen = torch.Generator().manual_seed(seed)
    symbols = torch.randint(0, 1 << bits, (*lead, 256), generator=gen)
    packed = trellis.pack(symbols, bits)
    got = trellis.states(packed, bits)
    assert got.dtype == torch.int64 and got.shape == (*lead, 256)
    assert torch.equal(got, bitstream.cyclic_states(symbols, bits))
    ring = bitstream.ring_u32(packed)
    assert torch.equal(got, bitstream.window_state(ring, torch.arange(256), bits))
    # the low b bits of each state are the symbols: pack/states round trip
    assert torch.equal(got & ((1 << bits) - 1), symbols)


@pytest.mark.parametrize("bits", BITS)
def test_states_match_python_definition_on_random_payload(bits):
    payload = _random_payload((16 * bits,), seed=100 + bits)
    assert trellis.states(payload, bits).tolist() == _py_tile_states(payload.tolist(), bits)


@pytest.mark.parametrize("bits", BITS)
def test_bits_of(bits):
    assert trellis.bits_of(torch.zeros(1, 1, 16 * bits, dtype=torch.int16)) == bits


def test_bad_arguments_raise_naming_the_argument():
    good = torch.zeros(1, 1, 64, dtype=torch.int16)
    with pytest.raises(TypeError, match="trellis"):
        trellis.decode(good.to(torch.int32), "mcg")
    with pytest.raises(TypeError, match="trellis"):
        trellis.decode(good.numpy(), "mcg")
    with pytest.raises(ValueError, match="trellis"):
        trellis.decode(torch.zeros(1, 64, dtype=torch.int16), "mcg")
    with pytest.raises(ValueError, match="trellis"):
        trellis.decode(torch.zeros(1, 1, 40, dtype=torch.int16), "mcg")
    with pytest.raises(ValueError, match="trellis"):
        trellis.decode(torch.zeros(1, 1, 144, dtype=torch.int16), "mcg")  # bits = 9
    with pytest.raises(ValueError, match="sqg_e4m3"):
        trellis.decode(torch.zeros(1, 1, 80, dtype=torch.int16), "sqg_e4m3")  # bits = 5
    with pytest.raises(ValueError, match="sqg_fp16"):
        trellis.decode(good, "sqg_fp16")  # bits = 4
    with pytest.raises(ValueError, match="trellis"):
        trellis.decode(torch.zeros(0, 2, 64, dtype=torch.int16), "mcg")
    with pytest.raises(ValueError, match="codebook"):
        trellis.decode(good, "MCG")
    with pytest.raises(TypeError, match="codebook"):
        trellis.decode(good, 1)
    with pytest.raises(ValueError, match="packed"):
        trellis.states(good, 3)
    with pytest.raises(TypeError, match="packed"):
        trellis.states(good.float(), 4)
    with pytest.raises(ValueError, match="bits"):
        trellis.states(torch.zeros(144, dtype=torch.int16), 9)
    with pytest.raises(ValueError, match="trellis"):
        trellis.bits_of(torch.zeros(0, dtype=torch.int16))
    with pytest.raises(TypeError, match="symbols"):
        trellis.pack(torch.zeros(256), 3)
