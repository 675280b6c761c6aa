"""The fp16-arithmetic hash codebooks: 3INST, MCG and MUL1 (spec §2.0–§2.3).

Each maps a 16-bit state ``s`` to one fp16 value through integer hashing and fp16 arithmetic:

* **3INST** (EXL3 ``cb=0``): ``x = (s·89226354 + 64248484) mod 2^32``, then the LOP3 pair (§2.0).
* **MCG** (EXL3 ``cb=1``, b12x ``mcg``): ``x = (s·0xCBAC1FED) mod 2^32``, then the LOP3 pair.
* **MUL1** (EXL3 ``cb=2``): ``x = (s·0x83DCD12D) mod 2^32``; ``bsum`` = sum of x's four bytes;
  ``value = fma_f16(1024 + bsum, fp16(0x1EEE), fp16(0xC931))`` with a single rounding.

The LOP3 pair (§2.0) is ``h = (x AND 0x8FFF8FFF) XOR 0x3B603B60`` (immLut 0x6A = ``(a & b) ^ c``;
XOR, not OR), then one round-to-nearest-even fp16 add of the two halves read as fp16.

None of the three depends on the bit rate: the table is a function of the 16-bit state only.
u32 arithmetic is done in int64 tensors and masked with 0xFFFFFFFF (every product below is under
2^63: a 16-bit state times a 32-bit multiplier is under 2^48). Tables are ``float16[65536]``
indexed by state; builders are cached, so callers must not modify what they get (the public
accessor :func:`reference.codebooks.state_values` hands out clones).
"""

from __future__ import annotations

import functools

import torch

from reference._checks import check_integer_tensor

U32_MASK = 0xFFFFFFFF
NUM_STATES = 1 << 16

INST3_MULTIPLIER = 89226354  # 0x05517C72
INST3_ADDEND = 64248484  # 0x03D45AA4
MCG_MULTIPLIER = 0xCBAC1FED
MUL1_MULTIPLIER = 0x83DCD12D

LOP3_MASK = 0x8FFF8FFF
LOP3_XOR = 0x3B603B60

MUL1_ACCUMULATOR_BASE = 0x6400  # fp16 bits of 1024.0
MUL1_SCALE_BITS = 0x1EEE  # fp16 0.00676727294921875
MUL1_BIAS_BITS = 0xC931  # fp16 -10.3828125


def fp16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Read u16 bit patterns (held in any integer tensor) as fp16 values."""
    bits = check_integer_tensor(bits, "bits")
    signed = ((bits.to(torch.int64) & 0xFFFF) ^ 0x8000) - 0x8000
    return signed.to(torch.int16).view(torch.float16)


def all_states() -> torch.Tensor:
    """int64[65536]: the states 0..65535."""
    return torch.arange(NUM_STATES, dtype=torch.int64)


def lop3_fp16_pair(x_u32: torch.Tensor) -> torch.Tensor:
    """§2.0: ``h = (x & 0x8FFF8FFF) ^ 0x3B603B60``; return ``fp16(h_lo) + fp16(h_hi)`` (one RN add).

    Each half is a normal fp16 with biased exponent 12..15, i.e. magnitude in [0.125, 2). Their
    sum is formed exactly in float64 (both operands are multiples of 2^-13 below 2^1, so the sum
    needs at most 15 significant bits) and then rounded once to fp16 — exactly an fp16 RN add.
    """
    x = check_integer_tensor(x_u32, "x_u32").to(torch.int64) & U32_MASK
    h = (x & LOP3_MASK) ^ LOP3_XOR
    low = fp16_from_bits(h & 0xFFFF).to(torch.float64)
    high = fp16_from_bits(h >> 16).to(torch.float64)
    return (low + high).to(torch.float16)


@functools.cache
def _values_3inst() -> torch.Tensor:
    x = (all_states() * INST3_MULTIPLIER + INST3_ADDEND) & U32_MASK
    return lop3_fp16_pair(x)


@functools.cache
def _values_mcg() -> torch.Tensor:
    x = (all_states() * MCG_MULTIPLIER) & U32_MASK
    return lop3_fp16_pair(x)


def mul1_byte_sum(x_u32: torch.Tensor) -> torch.Tensor:
    """Sum of the four bytes of each u32 (0..1020); equals ``dp4a(x, 0x01010101, 0)``."""
    x = check_integer_tensor(x_u32, "x_u32").to(torch.int64) & U32_MASK
    return sum((x >> shift) & 0xFF for shift in (0, 8, 16, 24))


@functools.cache
def _values_mul1() -> torch.Tensor:
    x = (all_states() * MUL1_MULTIPLIER) & U32_MASK
    # 0x6400 + bsum read as fp16 is exactly 1024 + bsum (the fp16 ulp in [1024, 2048) is 1).
    accumulator = fp16_from_bits(MUL1_ACCUMULATOR_BASE + mul1_byte_sum(x)).to(torch.float64)
    scale = fp16_from_bits(torch.tensor(MUL1_SCALE_BITS)).to(torch.float64)
    bias = fp16_from_bits(torch.tensor(MUL1_BIAS_BITS)).to(torch.float64)
    # Single-rounding fp16 FMA, emulated exactly. 1024 + bsum is an integer below 2^11, the scale
    # 0x1EEE is 1774·2^-18 and the bias 0xC931 is -10.3828125 = -2721792·2^-18. So the exact
    # a·b + c is an integer multiple of 2^-18 of magnitude below 2^23·2^-18: it needs at most 23
    # significant bits, and float64 (53 bits; float32 would do too) forms the product and the sum
    # without rounding. The only rounding is the final conversion to fp16 (RN-even, subnormals
    # included), which is exactly what fma.rn.f16 does. Even if the conversion passed through
    # float32 first, that step is exact, so no double rounding can occur.
    exact = accumulator * scale + bias
    return exact.to(torch.float16)


def values_3inst() -> torch.Tensor:
    """float16[65536]: the 3INST value of every state (a fresh copy)."""
    return _values_3inst().clone()


def values_mcg() -> torch.Tensor:
    """float16[65536]: the MCG value of every state (a fresh copy)."""
    return _values_mcg().clone()


def values_mul1() -> torch.Tensor:
    """float16[65536]: the MUL1 value of every state (a fresh copy)."""
    return _values_mul1().clone()
