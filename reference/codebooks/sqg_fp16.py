"""``sqg_fp16``: SQG FP16-D3L, the K5/K6 codebook of b12x (spec §2.4, §2.7, App. D).

Decoding a 16-bit state at b = 5 or 6:

1. **Graph**: the same XOR graph as ``sqg_e4m3``
   (:func:`reference.codebooks.sqg_e4m3.xor_graph_rank`); for ``w = 16 - b <= 11`` its xorshift
   pair is the identity, which the tests check rather than assume.
2. **Coordinates** (:func:`d3l_coordinates`, integer only): from the magnitude index
   ``m = (rank & 0x7FFF) ^ (0x7FFF if rank < 0x8000)`` form the odd ``v = 65535 - 2m``; with
   ``e = floor(log2 v)`` the 8 smallest ``v`` (``e <= 3``) each own a descriptor (``x = 0``),
   and every higher octave ``[2^e, 2^(e+1))`` is cut into 8 dyadic sub-segments of width
   ``2^(e-3)``, giving descriptor ``idx`` in 8..103 and an in-segment offset ``x`` in 0..2047.
3. **Law** (:func:`values`): ``(base, slope)`` is the fp16 pair :data:`D3L_DESCRIPTORS[idx]`;
   the magnitude is the single-rounding fp16 FMA ``fma_f16(slope, fp16(x), base)``; its sign
   bit is XORed with 0x8000 when ``rank < 0x8000``.

Descriptor layout: :data:`D3L_DESCRIPTORS` holds 104 ``(base, slope)`` fp16 **bit patterns**
transcribed from Appendix D; :func:`descriptor_bytes` serialises them as 416 little-endian bytes,
interleaved ``base, slope`` in index order (the table the kernel reads with ``addr + 4 * idx``).

Invariants: value tables are built once (``functools.cache``) and returned as clones; the FMA is
emulated exactly (see :func:`_fma_f16_single_rounding`), never through torch's float64 -> float16
cast, which rounds via float32 and so rounds twice.
"""

from __future__ import annotations

import functools
import struct

import numpy as np
import torch

from reference.codebooks.sqg_e4m3 import xor_graph_rank

__all__ = [
    "D3L_DESCRIPTORS",
    "LEGAL_BITS",
    "d3l_coordinates",
    "descriptor_bytes",
    "descriptor_tensors",
    "values",
    "values_fp32_path",
]

#: The 104 D3L ``(base, slope)`` pairs as fp16 bit patterns (spec Appendix D), index order.
D3L_DESCRIPTORS: tuple[tuple[int, int], ...] = (
    (0x467D, 0x0000), (0x461D, 0x0000), (0x45EF, 0x0000), (0x45D0, 0x0000),  # 0
    (0x45B8, 0x0000), (0x45A5, 0x0000), (0x4595, 0x0000), (0x4587, 0x0000),
    (0x457B, 0x0000), (0x4570, 0x0000), (0x4566, 0x0000), (0x455D, 0x0000),  # 8
    (0x4554, 0x0000), (0x454C, 0x0000), (0x4545, 0x0000), (0x453E, 0x0000),
    (0x4532, 0x2600), (0x4527, 0x2500), (0x451C, 0x2500), (0x4513, 0x2500),  # 16
    (0x450A, 0x2500), (0x4502, 0x2400), (0x44FB, 0x2400), (0x44F4, 0x2200),
    (0x44E7, 0x2200), (0x44DB, 0x2200), (0x44D1, 0x20CD), (0x44C7, 0x20CD),  # 24
    (0x44BE, 0x209A), (0x44B5, 0x209A), (0x44AE, 0x1E66), (0x44A6, 0x2000),
    (0x4499, 0x1E92), (0x448C, 0x1E55), (0x4481, 0x1DAB), (0x4477, 0x1D25),  # 32
    (0x446E, 0x1C92), (0x4465, 0x1C00), (0x445C, 0x1C92), (0x4455, 0x1ADB),
    (0x4446, 0x1B4B), (0x4439, 0x1A85), (0x442D, 0x19DF), (0x4422, 0x19A3),  # 40
    (0x4418, 0x192A), (0x440F, 0x18D6), (0x4406, 0x185D), (0x43FB, 0x1848),
    (0x43DD, 0x178D), (0x43C1, 0x16F0), (0x43A7, 0x1650), (0x4390, 0x15CD),  # 48
    (0x437A, 0x1571), (0x4366, 0x1513), (0x4353, 0x14BF), (0x4341, 0x1472),
    (0x431F, 0x1424), (0x4301, 0x1380), (0x42E6, 0x12E0), (0x42CD, 0x125A),  # 56
    (0x42B5, 0x11EE), (0x429F, 0x1187), (0x428A, 0x112B), (0x4276, 0x10E7),
    (0x4252, 0x108B), (0x4231, 0x1022), (0x4212, 0x0F93), (0x41F6, 0x0F05),  # 64
    (0x41DC, 0x0E8F), (0x41C4, 0x0E23), (0x41AC, 0x0DC7), (0x4197, 0x0D74),
    (0x416E, 0x0D13), (0x4149, 0x0CA1), (0x4127, 0x0C44), (0x4107, 0x0BEE),  # 72
    (0x40E9, 0x0B68), (0x40CD, 0x0AF9), (0x40B3, 0x0A98), (0x409A, 0x0A40),
    (0x406B, 0x09D2), (0x4041, 0x0957), (0x4019, 0x08F4), (0x3FE8, 0x08A0),  # 80
    (0x3FA3, 0x0859), (0x3F61, 0x081C), (0x3F22, 0x07D0), (0x3EE7, 0x0774),
    (0x3E76, 0x06FD), (0x3E0F, 0x067B), (0x3DAE, 0x0611), (0x3D52, 0x05B9),  # 88
    (0x3CFB, 0x056F), (0x3CA8, 0x0531), (0x3C59, 0x04FC), (0x3C0C, 0x04CD),
    (0x3AF2, 0x0493), (0x39DD, 0x0456), (0x38D3, 0x0427), (0x37A5, 0x0403),  # 96
    (0x35B1, 0x03E9), (0x338C, 0x03D6), (0x2F86, 0x03C9), (0x004C, 0x03C3),
)  # fmt: skip

#: Bitrates of the sqg_fp16 codebook.
LEGAL_BITS: tuple[int, ...] = (5, 6)

_NUM_STATES = 1 << 16


def _check_bits(bits: object, who: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits: expected an int, got {type(bits).__name__} ({who})")
    if bits not in LEGAL_BITS:
        raise ValueError(f"bits: codebook sqg_fp16 accepts bits in {LEGAL_BITS}, got {bits}")
    return bits


def descriptor_bytes() -> bytes:
    """The 416-byte descriptor table: 104 little-endian ``(base, slope)`` fp16 pairs."""
    flat = [half for pair in D3L_DESCRIPTORS for half in pair]
    return struct.pack(f"<{len(flat)}H", *flat)


def descriptor_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """``(base, slope)`` as float16[104] tensors (bit-exact views of :data:`D3L_DESCRIPTORS`)."""
    halves = _u16_to_half(torch.tensor(D3L_DESCRIPTORS, dtype=torch.int32))  # [104, 2]
    return halves[:, 0].clone(), halves[:, 1].clone()


def _u16_to_half(bits: torch.Tensor) -> torch.Tensor:
    """Reinterpret integer bit patterns 0..65535 as float16 (two's-complement wrap to int16)."""
    return (bits - ((bits & 0x8000) << 1)).to(torch.int16).view(torch.float16)


def d3l_coordinates(rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Descriptor index (0..103) and in-segment offset x (0..2047) of each rank, both int64."""
    if not isinstance(rank, torch.Tensor):
        raise TypeError(f"rank: expected a torch.Tensor, got {type(rank).__name__}")
    if rank.dtype.is_floating_point or rank.dtype.is_complex or rank.dtype == torch.bool:
        raise TypeError(f"rank: expected an integer dtype, got {rank.dtype}")
    rank = rank.to(torch.int64)
    if rank.numel() and (int(rank.min()) < 0 or int(rank.max()) >= _NUM_STATES):
        raise ValueError("rank: values must lie in [0, 65535] (d3l_coordinates)")
    negative = rank < 0x8000
    m = (rank & 0x7FFF) ^ torch.where(negative, 0x7FFF, 0)
    v = 65535 - 2 * m  # odd, 1..65535
    e = torch.zeros_like(v)  # floor(log2 v), the device's bfind
    for k in range(1, 16):
        e += (v >= (1 << k)).to(torch.int64)
    pow_e = torch.ones_like(v) << e
    # Exact head, v <= 15: descriptors 0..7; ">>" on int64 tensors is arithmetic (v=1 -> 0).
    head_idx = (torch.ones_like(v) << (e - 1).clamp(min=0)) + ((v - pow_e - 1) >> 1)
    # Octaves e >= 4: 8 dyadic sub-segments of width 2^sh.
    sh = (e - 3).clamp(min=0)
    sub = (v - pow_e) >> sh
    tail_idx = 8 * sh + sub
    tail_x = (pow_e + (sub << sh) + (torch.ones_like(v) << sh) - 1 - v) >> 1
    is_head = e <= 3
    idx = torch.where(is_head, head_idx, tail_idx)
    x = torch.where(is_head, torch.zeros_like(v), tail_x)
    return idx, x


def _fma_f16_single_rounding(
    slope: torch.Tensor, x: torch.Tensor, base: torch.Tensor
) -> torch.Tensor:
    """``fma_f16(slope, fp16(x), base)`` with one round-to-nearest-even, as float16.

    Exactness: ``slope`` and ``base`` are fp16, so each is an integer multiple of 2^-24 (the
    fp16 subnormal quantum) below 2^16; ``x`` is an integer in 0..2047. Hence
    ``slope * x + base`` is an integer multiple of 2^-24 below 2^16 * 2^11 + 2^16 < 2^28, i.e.
    it needs at most 52 significant bits, and float64 (53) holds the product and the sum
    exactly. The one rounding is numpy's float64 -> float16 cast, which rounds the double
    directly (torch's cast goes through float32 and would round twice).
    """
    exact = slope.to(torch.float64) * x.to(torch.float64) + base.to(torch.float64)
    rounded = exact.numpy().astype(np.float16)
    return torch.from_numpy(rounded)


def _apply_sign(mag: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    bits = mag.view(torch.int16).to(torch.int32) & 0xFFFF
    return _u16_to_half(bits ^ torch.where(negative, 0x8000, 0))


def _ranks(bits: int) -> torch.Tensor:
    return xor_graph_rank(torch.arange(_NUM_STATES, dtype=torch.int64), bits)


@functools.cache
def _values(bits: int) -> torch.Tensor:
    rank = _ranks(bits)
    idx, x = d3l_coordinates(rank)
    base, slope = descriptor_tensors()
    mag = _fma_f16_single_rounding(slope[idx], x, base[idx])
    return _apply_sign(mag, rank < 0x8000)


def values(bits: int) -> torch.Tensor:
    """fp16 value (float16[65536]) of every state at bitrate ``bits`` in 5..6."""
    bits = _check_bits(bits, "sqg_fp16.values")
    return _values(bits).clone()


def values_fp32_path(bits: int) -> torch.Tensor:
    """The torch builder's formulation: ``slope * x + base`` in float32, then one cast to fp16.

    Kept beside :func:`values` so the spec's claim that both agree for every rank is testable.
    """
    bits = _check_bits(bits, "sqg_fp16.values_fp32_path")
    rank = _ranks(bits)
    idx, x = d3l_coordinates(rank)
    base, slope = descriptor_tensors()
    mag32 = slope[idx].to(torch.float32) * x.to(torch.float32) + base[idx].to(torch.float32)
    return _apply_sign(mag32.to(torch.float16), rank < 0x8000)
