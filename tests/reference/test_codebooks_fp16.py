"""Tests for reference.codebooks (registry, legality) and the fp16 hash codebooks (spec §2.0–§2.3).

The element-wise expectations are rebuilt here with plain Python ints and the standard library's
IEEE half-precision codec (``struct`` format ``'e'``, which rounds to nearest-even), exactly as the
spec words them; spot values and statistics come from fixtures/fingerprints.json.
"""

from __future__ import annotations

import functools
import json
import struct
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.pytest_plugin import scaled_examples
from reference import codebooks
from reference.codebooks import fp16_hash

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "fingerprints.json"
HASH_CODEBOOKS = ("3inst", "mcg", "mul1")
LEGAL = {
    "3inst": set(range(1, 9)),
    "mcg": set(range(1, 9)),
    "mul1": set(range(1, 9)),
    "sqg_e4m3": {2, 3, 4},
    "sqg_fp16": {5, 6},
}


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def _half(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]


def _half_bits_of(value: float) -> int:
    return struct.unpack("<H", struct.pack("<e", value))[0]


def _py_lop3_value(x: int) -> int:
    """§2.0 on Python ints; returns the fp16 bit pattern of the sum (one RN rounding)."""
    h = (x & 0x8FFF8FFF) ^ 0x3B603B60
    exact = Fraction(_half(h & 0xFFFF)) + Fraction(_half(h >> 16))
    return _half_bits_of(float(exact))  # exact sum fits a double; struct rounds it to fp16 RN


def _py_value_bits(codebook: str, s: int) -> int:
    if codebook == "3inst":
        return _py_lop3_value((s * 89226354 + 64248484) % 2**32)
    if codebook == "mcg":
        return _py_lop3_value((s * 0xCBAC1FED) % 2**32)
    x = (s * 0x83DCD12D) % 2**32
    bsum = sum((x >> (8 * i)) & 0xFF for i in range(4))
    exact = Fraction(_half(0x6400 + bsum)) * Fraction(_half(0x1EEE)) + Fraction(_half(0xC931))
    return _half_bits_of(float(exact))  # exact value is a short dyadic; float() is exact


@functools.cache
def _table_bits(codebook: str) -> torch.Tensor:
    return codebooks.state_values(codebook, 4).view(torch.int16).to(torch.int64) & 0xFFFF


# --- registry and legality ---------------------------------------------------------------


def test_codebook_names_and_legal_bits():
    assert codebooks.CODEBOOKS == ("3inst", "mcg", "mul1", "sqg_e4m3", "sqg_fp16")
    for name, legal in LEGAL.items():
        assert set(codebooks.legal_bits(name)) == legal


@pytest.mark.parametrize("codebook", sorted(LEGAL))
@pytest.mark.parametrize("bits", range(0, 10))
def test_validate_codebook_bits(codebook, bits):
    if bits in LEGAL[codebook]:
        assert codebooks.validate_codebook_bits(codebook, bits) == (codebook, bits)
    else:
        with pytest.raises(ValueError) as info:
            codebooks.validate_codebook_bits(codebook, bits)
        assert codebook in str(info.value) and f"bits={bits}" in str(info.value)
        with pytest.raises(ValueError, match=codebook):
            codebooks.state_values(codebook, bits)


def test_unknown_codebook_and_wrong_types():
    with pytest.raises(ValueError, match="codebook"):
        codebooks.validate_codebook_bits("e8p", 4)
    with pytest.raises(ValueError, match="codebook"):
        codebooks.legal_bits("MCG")
    with pytest.raises(TypeError, match="codebook"):
        codebooks.state_values(None, 4)
    with pytest.raises(TypeError, match="bits"):
        codebooks.state_values("mcg", 4.0)
    with pytest.raises(TypeError, match="bits"):
        codebooks.state_values("mcg", True)


@pytest.mark.parametrize("codebook", HASH_CODEBOOKS)
def test_state_values_is_a_private_copy(codebook):
    first = codebooks.state_values(codebook, 3)
    assert first.dtype == torch.float16 and first.shape == (65536,)
    saved = first.clone()
    first.fill_(0)
    assert torch.equal(codebooks.state_values(codebook, 3), saved)


@pytest.mark.parametrize("codebook", HASH_CODEBOOKS)
def test_hash_tables_do_not_depend_on_bits(codebook):
    reference_table = codebooks.state_values(codebook, 1)
    for bits in range(2, 9):
        assert torch.equal(codebooks.state_values(codebook, bits), reference_table)


# --- element-wise against the spec's arithmetic --------------------------------------------


@pytest.mark.parametrize("codebook", HASH_CODEBOOKS)
def test_fixed_states_match_python_construction(codebook):
    table = _table_bits(codebook)
    for s in (0, 1, 2, 255, 256, 0x1234, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF):
        assert int(table[s]) == _py_value_bits(codebook, s), hex(s)


@settings(deadline=None, max_examples=scaled_examples(60))
@given(codebook=st.sampled_from(HASH_CODEBOOKS), s=st.integers(0, 0xFFFF))
def test_random_states_match_python_construction(codebook, s):
    assert int(_table_bits(codebook)[s]) == _py_value_bits(codebook, s)


def test_mul1_tiny_values_round_like_fp16():
    # states whose exact MUL1 value is closest to zero exercise fp16 subnormal/small rounding
    x = (torch.arange(65536, dtype=torch.int64) * 0x83DCD12D) & 0xFFFFFFFF
    bsum = fp16_hash.mul1_byte_sum(x)
    table = _table_bits("mul1")
    for s in torch.nonzero((bsum - 510).abs() <= 1).reshape(-1)[:20].tolist():
        assert int(table[s]) == _py_value_bits("mul1", s)


@settings(deadline=None, max_examples=scaled_examples(40))
@given(x=st.integers(0, 2**32 - 1))
def test_lop3_pair_is_and_then_xor(x):
    got = fp16_hash.lop3_fp16_pair(torch.tensor([x]))
    assert int(got.view(torch.int16)[0]) & 0xFFFF == _py_lop3_value(x)
    assert got.dtype == torch.float16


def test_lop3_is_not_or():
    # With OR, x = 0xFFFFFFFF would keep exponent bits 14..12 and give huge halves; with the
    # spec's AND/XOR every half lies in ±[0.125, 2) and the sum in (-4, 4).
    x = torch.tensor([0xFFFFFFFF, 0x0, 0x70007000, 0x8FFF8FFF])
    values = fp16_hash.lop3_fp16_pair(x).double()
    assert bool((values.abs() < 4).all())
    assert float(values[1]) == 2 * _half(0x3B60)


def test_mul1_byte_sum_and_accumulator():
    x = torch.tensor([0, 0xFFFFFFFF, 0x01020304, 0x83DCD12D])
    assert fp16_hash.mul1_byte_sum(x).tolist() == [0, 1020, 10, 0x83 + 0xDC + 0xD1 + 0x2D]
    # 0x6400 + bsum read as fp16 is exactly 1024 + bsum
    sums = torch.arange(1021)
    assert torch.equal(fp16_hash.fp16_from_bits(0x6400 + sums).double(), 1024.0 + sums.double())


# --- spot values and statistics from the spec ---------------------------------------------


@pytest.mark.parametrize("codebook", HASH_CODEBOOKS)
def test_spot_values(codebook):
    table = codebooks.state_values(codebook, 4)
    bits = _table_bits(codebook)
    for spot in _fixture()["spot_values"][codebook]:
        s = int(spot["state"], 16)
        assert int(bits[s]) == int(spot["fp16_bits"], 16)
        assert float(table[s]) == pytest.approx(spot["value"], abs=5e-5)


@pytest.mark.parametrize("codebook", HASH_CODEBOOKS)
def test_statistics(codebook):
    stats = _fixture()["statistics"][codebook]
    values = codebooks.state_values(codebook, 4).double()
    rms = float(values.pow(2).mean().sqrt())
    assert round(rms, stats["rms_decimals"]) == stats["rms"]
    if "mean" in stats:
        assert round(float(values.mean()), stats["mean_decimals"]) == stats["mean"]
    if "min" in stats:
        assert round(float(values.min()), stats["range_decimals"]) == stats["min"]
        assert round(float(values.max()), stats["range_decimals"]) == stats["max"]
    assert bool((values.abs() < 4).all())
