"""Tests for reference.bitstream: the §1.2 stream, SWAP16 storage, §1.3 states, §1.4 windows.

Expectations come from the spec's worked example (fixtures/fingerprints.json), from plain-Python
bit-by-bit constructions written here, and from identities the spec states (state overlap,
shift-register recurrence, little-endian u32 view).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.pytest_plugin import scaled_examples
from reference import bitstream

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"
BITS = tuple(range(1, 9))
LEAD_SHAPES = ((), (1,), (3,), (2, 3))


def _worked_example() -> dict:
    return json.loads(FIXTURE.read_text())["bitstream_worked_example"]


def _random_symbols(lead: tuple[int, ...], bits: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << bits, (*lead, 256), generator=gen, dtype=torch.int64)


def _u16(payload: torch.Tensor) -> list[int]:
    return [int(v) & 0xFFFF for v in payload.reshape(-1)]


# --- plain-Python model of the format (independent of the code under test) -------------------


def _py_stream_bits(symbols: list[int], bits: int) -> list[int]:
    out: list[int] = []
    for sym in symbols:
        out.extend((sym >> (bits - 1 - i)) & 1 for i in range(bits))
    return out


def _py_stored_words(symbols: list[int], bits: int) -> list[int]:
    stream = _py_stream_bits(symbols, bits)
    words = [int("".join(map(str, stream[16 * j : 16 * j + 16])), 2) for j in range(16 * bits)]
    stored = [0] * len(words)
    for j, word in enumerate(words):
        stored[j ^ 1] = word  # SWAP16: stream word j lives at int16 index j XOR 1
    return stored


def _py_states(symbols: list[int], bits: int) -> list[int]:
    stream = _py_stream_bits(symbols, bits)
    total = len(stream)
    states = []
    for t in range(256):
        end = (t + 1) * bits  # window = stream bits [end-16, end), cyclically
        window = [stream[(end - 16 + i) % total] for i in range(16)]
        states.append(int("".join(map(str, window)), 2))
    return states


# --- §1.3 worked example --------------------------------------------------------------------


def test_worked_example_stored_words_and_stream():
    example = _worked_example()
    bits = example["bits"]
    symbols = torch.arange(256) % 8
    payload = bitstream.pack_symbols(symbols, bits)
    assert payload.dtype == torch.int16 and payload.shape == (16 * bits,)
    stored = [int(h, 16) for h in example["stored_u16_prefix"]]
    assert _u16(payload)[: len(stored)] == stored
    stream = [int(h, 16) for h in example["stream16_prefix"]]
    assert [int(v) for v in bitstream.stream_words(payload)[: len(stream)]] == stream


def test_worked_example_states_all_three_constructions():
    example = _worked_example()
    bits = example["bits"]
    symbols = torch.arange(256) % 8
    payload = bitstream.pack_symbols(symbols, bits)
    cyclic = bitstream.cyclic_states(symbols, bits)
    windows = bitstream.window_state(bitstream.ring_u32(payload), torch.arange(256), bits)
    for t_text, state_text in example["states"].items():
        t, expected = int(t_text), int(state_text, 16)
        assert int(cyclic[t]) == expected
        assert int(windows[t]) == expected
        assert int(bitstream.window_state(bitstream.ring_u32(payload), t, bits)) == expected


# --- SWAP16 and ring words against plain Python --------------------------------------------


@pytest.mark.parametrize("bits", BITS)
def test_pack_matches_bit_by_bit_python_construction(bits):
    rng = random.Random(1000 + bits)
    symbols = [rng.randrange(1 << bits) for _ in range(256)]
    payload = bitstream.pack_symbols(torch.tensor(symbols), bits)
    assert _u16(payload) == _py_stored_words(symbols, bits)


@pytest.mark.parametrize("bits", BITS)
def test_states_match_python_window_definition(bits):
    rng = random.Random(2000 + bits)
    symbols = [rng.randrange(1 << bits) for _ in range(256)]
    expected = _py_states(symbols, bits)
    assert bitstream.cyclic_states(torch.tensor(symbols), bits).tolist() == expected
    ring = bitstream.ring_u32(bitstream.pack_symbols(torch.tensor(symbols), bits))
    assert bitstream.window_state(ring, torch.arange(256), bits).tolist() == expected


@pytest.mark.parametrize("bits", BITS)
def test_ring_u32_is_the_little_endian_u32_view_of_the_payload(bits):
    payload = bitstream.pack_symbols(_random_symbols((2,), bits, seed=bits), bits)
    little_endian = payload.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(bitstream.ring_u32(payload), little_endian)
    stream16 = bitstream.stream_words(payload)
    expected = (stream16[..., 0::2] << 16) | stream16[..., 1::2]
    assert torch.equal(bitstream.ring_u32(payload), expected)


def test_each_span_of_16_symbols_fills_whole_words():
    # Span s (symbols 16s..16s+15) is exactly stream words [b·s, b·s+b): changing one span's
    # symbols must change no word outside that range.
    bits = 5
    base = _random_symbols((), bits, seed=7)
    changed = base.clone()
    changed[16 * 3 : 16 * 4] = (changed[16 * 3 : 16 * 4] + 1) % (1 << bits)
    diff = bitstream.stream_words(bitstream.pack_symbols(base, bits)) != bitstream.stream_words(
        bitstream.pack_symbols(changed, bits)
    )
    assert diff[3 * bits : 4 * bits].any()
    assert not diff[: 3 * bits].any() and not diff[4 * bits :].any()


# --- round trips and identities (hypothesis) ----------------------------------------------


@settings(deadline=None, max_examples=scaled_examples(30))
@given(bits=st.sampled_from(BITS), lead=st.sampled_from(LEAD_SHAPES), seed=st.integers(0, 2**31))
def test_pack_unpack_round_trip(bits, lead, seed):
    symbols = _random_symbols(lead, bits, seed)
    payload = bitstream.pack_symbols(symbols, bits)
    assert payload.shape == (*lead, 16 * bits) and payload.dtype == torch.int16
    assert torch.equal(bitstream.unpack_symbols(payload, bits), symbols)


@settings(deadline=None, max_examples=scaled_examples(30))
@given(bits=st.sampled_from(BITS), seed=st.integers(0, 2**31))
def test_unpack_pack_round_trip_on_random_payload(bits, seed):
    gen = torch.Generator().manual_seed(seed)
    payload = torch.randint(-32768, 32768, (2, 16 * bits), generator=gen, dtype=torch.int16)
    symbols = bitstream.unpack_symbols(payload, bits)
    assert torch.equal(bitstream.pack_symbols(symbols, bits), payload)


@settings(deadline=None, max_examples=scaled_examples(30))
@given(bits=st.sampled_from(BITS), lead=st.sampled_from(LEAD_SHAPES), seed=st.integers(0, 2**31))
def test_window_rule_equals_cyclic_states(bits, lead, seed):
    symbols = _random_symbols(lead, bits, seed)
    ring = bitstream.ring_u32(bitstream.pack_symbols(symbols, bits))
    windows = bitstream.window_state(ring, torch.arange(256), bits)
    assert windows.shape == (*lead, 256)
    assert torch.equal(windows, bitstream.cyclic_states(symbols, bits))


@settings(deadline=None, max_examples=scaled_examples(30))
@given(bits=st.sampled_from(BITS), seed=st.integers(0, 2**31))
def test_state_overlap_recurrence_and_tail_biting(bits, seed):
    symbols = _random_symbols((), bits, seed)
    states = bitstream.cyclic_states(symbols, bits)
    keep = (1 << (16 - bits)) - 1
    # consecutive states overlap in 16 - b bits, including the wrap 255 -> 0 (tail-biting)
    nxt = torch.roll(states, -1)
    assert torch.equal(nxt >> bits, states & keep)
    # the newest symbol sits in the low b bits
    assert torch.equal(states & ((1 << bits) - 1), symbols)
    # shift register: state[t] = ((state[t-1] << b) | sym[t]) & 0xFFFF, for t = 0 from t = 255
    prev = torch.roll(states, 1)
    assert torch.equal(((prev << bits) | symbols) & 0xFFFF, states)
    # state[0]: the stream's last 16 - b bits followed by sym[0]
    stream = _py_stream_bits(symbols.tolist(), bits)
    tail = int("".join(map(str, stream[len(stream) - (16 - bits) :])), 2)
    assert int(states[0]) == (tail << bits) | int(symbols[0])


def test_window_state_accepts_any_shape_of_t():
    bits = 4
    symbols = _random_symbols((3,), bits, seed=11)
    ring = bitstream.ring_u32(bitstream.pack_symbols(symbols, bits))
    t = torch.tensor([[0, 255], [17, 128]])
    got = bitstream.window_state(ring, t, bits)
    states = bitstream.cyclic_states(symbols, bits)
    assert got.shape == (3, 2, 2)
    assert torch.equal(got, states[:, t])


# --- argument validation -----------------------------------------------------------------


def test_bad_arguments_raise_naming_the_argument():
    symbols = torch.zeros(256, dtype=torch.int64)
    with pytest.raises(TypeError, match="symbols"):
        bitstream.pack_symbols(symbols.float(), 3)
    with pytest.raises(ValueError, match="bits"):
        bitstream.pack_symbols(symbols, 0)
    with pytest.raises(ValueError, match="bits"):
        bitstream.pack_symbols(symbols, 9)
    with pytest.raises(TypeError, match="bits"):
        bitstream.pack_symbols(symbols, 3.0)
    with pytest.raises(ValueError, match="symbols"):
        bitstream.pack_symbols(torch.full((256,), 8), 3)
    with pytest.raises(ValueError, match="symbols"):
        bitstream.pack_symbols(torch.zeros(255, dtype=torch.int64), 3)
    with pytest.raises(TypeError, match="payload"):
        bitstream.stream_words(torch.zeros(48, dtype=torch.int32))
    with pytest.raises(ValueError, match="payload"):
        bitstream.stream_words(torch.zeros(40, dtype=torch.int16))
    with pytest.raises(ValueError, match="payload"):
        bitstream.unpack_symbols(torch.zeros(48, dtype=torch.int16), 4)
    with pytest.raises(ValueError, match="ring"):
        bitstream.window_state(torch.zeros(20, dtype=torch.int64), 0, 3)
    with pytest.raises(ValueError, match=r"^t: "):
        bitstream.window_state(torch.zeros(24, dtype=torch.int64), 256, 3)
