"""The H128 rotation used on both sides of every trellis layer (spec §3.1).

Layout and invariants:

* ``H128[i][j] = (-1)**popcount(i & j) / sqrt(128)``: the natural-order (Sylvester)
  Walsh-Hadamard matrix. It is symmetric, orthogonal and its own inverse.
* Rotations are applied **blockwise** over a feature axis: block ``beta`` covers features
  ``[128*beta, 128*beta + 128)`` and each block is multiplied as a row vector,
  ``v_block @ H128``. Because H128 is symmetric, ``blockdiag(H) @ W`` (a left product over the
  rows of ``W``) equals :func:`apply_blockwise` along ``dim=0``.
* Two flavours:

  - :func:`apply_blockwise` is the exact one: one matmul in the input's dtype (callers pass
    float64 for the exact reference).
  - :func:`apply_blockwise_faithful` replays the kernel's fp32 data flow (exllamav3
    ``hadamard_inner``, b12x ``_had128_quad``): a warp per (row, block), lane ``l`` holds
    elements ``4l .. 4l+3``; an in-thread H4 in natural order; five xor-shuffle butterflies
    with lane offsets 1, 2, 4, 8, 16; a final ``* 0.088388347648`` in fp32. Every add, subtract
    and multiply rounds to fp32 exactly once, as on the device. It returns float32; the caller
    rounds (to fp16 in the layer pipelines).

The spec does not fix the association of the in-thread H4; this module uses the two-stage
butterfly ``s = a+b, d = a-b, t = c+d, e = c-d`` then ``(s+t, d+e, s-t, d-e)`` (element bit 0,
then bit 1, then lane bits 0..4), which is the order exllamav3's ``had_hf_r_128_inner`` uses.
The device's ``partner - self`` is formed as ``(-self) + partner`` (a sign flip, then one add),
which is the same fp32 value.
"""

from __future__ import annotations

import functools

import torch

from reference._checks import check_int, check_tensor

BLOCK = 128
LANES = 32
ELEMENTS_PER_LANE = 4
SHUFFLE_OFFSETS = (1, 2, 4, 8, 16)
KERNEL_SCALE_FP32 = 0.088388347648
"""1/sqrt(128) as the kernels write it; it rounds to the same fp32 as 1/sqrt(128)."""


@functools.cache
def _sylvester_unnormalised(size: int) -> torch.Tensor:
    """The +-1 matrix ``(-1)**popcount(i & j)`` of order ``size`` (a power of two), float64."""
    index = torch.arange(size, dtype=torch.int64)
    both = index[:, None] & index[None, :]
    parity = torch.zeros_like(both)
    while bool(both.any()):
        parity ^= both & 1
        both = both >> 1
    return (1 - 2 * parity).to(torch.float64)


def hadamard(size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The normalised natural-order Walsh-Hadamard matrix of order ``size`` (a power of two)."""
    size = check_int(size, "size")
    if size < 1 or size & (size - 1):
        raise ValueError(f"size: expected a power of two, got {size}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    matrix = _sylvester_unnormalised(size) / (size**0.5)
    return matrix.to(dtype)


def h128(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``H128[i][j] = (-1)**popcount(i & j) / sqrt(128)`` as a fresh ``[128, 128]`` tensor."""
    return hadamard(BLOCK, dtype)


def _check_floating(x: object, name: str) -> torch.Tensor:
    tensor = check_tensor(x, name)
    if not tensor.is_floating_point():
        raise TypeError(f"{name}: expected a floating dtype, got {tensor.dtype}")
    return tensor


def _check_feature_dim(x: torch.Tensor, dim: int, block: int, name: str) -> int:
    if x.dim() == 0:
        raise ValueError(f"{name}: expected at least one dimension, got a scalar")
    dim = check_int(dim, "dim")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim: {dim} is out of range for a {x.dim()}-d tensor")
    size = x.shape[dim]
    if size == 0 or size % block:
        raise ValueError(
            f"{name}: feature dimension {dim} has size {size}, expected a positive multiple of "
            f"{block}"
        )
    return dim % x.dim()


def apply_blockwise(x: torch.Tensor, dim: int = -1, block: int = BLOCK) -> torch.Tensor:
    """Rotate every ``block``-wide slice of ``x`` along ``dim`` as ``v_block @ H``, exactly.

    The matmul runs in ``x.dtype`` (pass float64 for the exact reference). ``block`` is 128 for
    every trellis layer; other powers of two are accepted for tests and for H512 builders.
    """
    x = _check_floating(x, "x")
    block = check_int(block, "block")
    if block < 1 or block & (block - 1):
        raise ValueError(f"block: expected a power of two, got {block}")
    dim = _check_feature_dim(x, dim, block, "x")
    moved = x.movedim(dim, -1)
    blocks = moved.reshape(*moved.shape[:-1], moved.shape[-1] // block, block)
    rotated = blocks @ hadamard(block, x.dtype).to(x.device)
    return rotated.reshape(moved.shape).movedim(-1, dim)


def _butterfly(values: torch.Tensor, axis: int) -> torch.Tensor:
    """One radix-2 stage over ``axis`` of size 2: ``(lo, hi) -> (lo + hi, lo - hi)`` in fp32.

    On the device the lane without the offset bit keeps ``partner + self`` = ``hi + lo`` and the
    lane with it keeps ``partner - self`` = ``lo - hi``; fp32 addition is commutative, so this is
    bit-identical.
    """
    low, high = values.unbind(axis)
    return torch.stack((high + low, low - high), dim=axis)


def apply_blockwise_faithful(x: torch.Tensor) -> torch.Tensor:
    """H128 over the last dimension with the kernel's fp32 butterfly; returns float32.

    ``x`` is converted to float32 first (exact for fp16 and bf16 inputs). Per 128-block the data
    is viewed as ``[32 lanes, 4 elements]``:

    1. in-thread H4 (natural order): ``(a+b+c+d, a-b+c-d, a+b-c-d, a-b-c+d)``, computed as two
       pairwise stages (element bit 0, then bit 1);
    2. five xor-shuffle stages with lane offsets 1, 2, 4, 8, 16: the lane whose offset bit is set
       keeps ``partner - self``, the other keeps ``partner + self``;
    3. multiply by ``0.088388347648`` in fp32.
    """
    x = _check_floating(x, "x")
    _check_feature_dim(x, -1, BLOCK, "x")
    shape = x.shape
    values = x.to(torch.float32).reshape(-1, shape[-1] // BLOCK, LANES, ELEMENTS_PER_LANE)
    rows, blocks = values.shape[0], values.shape[1]
    # In-thread H4: element index i = 2*i1 + i0; stage over i0 then over i1.
    for element_offset in (1, 2):
        grouped = values.reshape(
            rows, blocks, LANES, ELEMENTS_PER_LANE // (2 * element_offset), 2, element_offset
        )
        values = _butterfly(grouped, axis=-2).reshape(rows, blocks, LANES, ELEMENTS_PER_LANE)
    # Cross-lane xor butterflies: lane l = (upper, bit, lower) with `bit` the offset bit.
    for lane_offset in SHUFFLE_OFFSETS:
        grouped = values.reshape(
            rows, blocks, LANES // (2 * lane_offset), 2, lane_offset, ELEMENTS_PER_LANE
        )
        values = _butterfly(grouped, axis=3).reshape(rows, blocks, LANES, ELEMENTS_PER_LANE)
    scale = torch.tensor(KERNEL_SCALE_FP32, dtype=torch.float32, device=values.device)
    return (values * scale).reshape(shape)
