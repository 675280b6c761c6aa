"""Tests for reference.hadamard: the H128 matrix, exact blockwise rotation, fp32 butterfly.

Expectations come from the spec (§3.1) rebuilt here independently: an entry-wise popcount
matrix, torch.block_diag products, and a scalar per-lane emulation of the kernel's butterfly.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.pytest_plugin import scaled_examples
from reference.hadamard import apply_blockwise, apply_blockwise_faithful, h128

SCALE_FP32 = np.float32(0.088388347648)


@functools.cache
def popcount_matrix() -> torch.Tensor:
    """(-1)^popcount(i & j) as float64, entry by entry (unnormalised)."""
    rows = [[(-1.0) ** bin(i & j).count("1") for j in range(128)] for i in range(128)]
    return torch.tensor(rows, dtype=torch.float64)


def lane_emulation(block: np.ndarray) -> np.ndarray:
    """Scalar emulation of §3.1 for one 128-vector in numpy float32, lane by lane."""
    lanes = [[np.float32(v) for v in block[4 * lane : 4 * lane + 4]] for lane in range(32)]
    for lane, (a, b, c, d) in enumerate(lanes):
        s, e, t, f = a + b, a - b, c + d, c - d
        lanes[lane] = [s + t, e + f, s - t, e - f]
    for offset in (1, 2, 4, 8, 16):
        new = []
        for lane in range(32):
            partner = lanes[lane ^ offset]
            own = lanes[lane]
            if lane & offset:
                new.append([p - o for p, o in zip(partner, own, strict=True)])
            else:
                new.append([p + o for p, o in zip(partner, own, strict=True)])
        lanes = new
    return np.array([v * SCALE_FP32 for lane in lanes for v in lane], dtype=np.float32)


def test_h128_matches_entrywise_popcount_definition():
    expected = popcount_matrix() / np.sqrt(128.0)
    assert torch.equal(h128(), expected)
    assert h128().dtype == torch.float64


def test_h128_symmetric_orthogonal_self_inverse():
    h = h128()
    eye = torch.eye(128, dtype=torch.float64)
    assert torch.equal(h, h.T)
    assert (h @ h.T - eye).abs().max() < 1e-14
    assert (h @ h - eye).abs().max() < 1e-14


def test_h128_dtype_argument_rounds_the_fp64_matrix():
    assert torch.equal(h128(torch.float32), h128().to(torch.float32))
    with pytest.raises(TypeError, match="dtype"):
        h128(torch.int32)


def test_h128_returns_a_fresh_tensor():
    h = h128()
    h.zero_()
    assert h128().abs().min() > 0


def test_apply_blockwise_equals_block_diagonal_product():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 384, generator=g, dtype=torch.float64)
    blockdiag = torch.block_diag(*[popcount_matrix() / np.sqrt(128.0)] * 3)
    assert torch.allclose(apply_blockwise(x), x @ blockdiag, rtol=0, atol=1e-13)
    # Along dim 0 it is the left product blockdiag(H) @ W.
    w = torch.randn(256, 5, generator=g, dtype=torch.float64)
    left = torch.block_diag(*[popcount_matrix() / np.sqrt(128.0)] * 2) @ w
    assert torch.allclose(apply_blockwise(w, dim=0), left, rtol=0, atol=1e-13)


def test_apply_blockwise_is_an_involution_and_keeps_dtype():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 256, generator=g, dtype=torch.float64)
    assert torch.allclose(apply_blockwise(apply_blockwise(x, dim=2), dim=-1), x, atol=1e-13)
    assert apply_blockwise(x.float()).dtype == torch.float32


def test_faithful_matches_scalar_lane_emulation_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 256, generator=g) * 3).to(torch.float16)
    got = apply_blockwise_faithful(x)
    assert got.dtype == torch.float32
    x32 = x.float().numpy()
    for row in range(2):
        for block in range(2):
            expected = lane_emulation(x32[row, 128 * block : 128 * block + 128])
            assert np.array_equal(got[row, 128 * block : 128 * block + 128].numpy(), expected)


@settings(deadline=None, max_examples=scaled_examples(15))
@given(
    rows=st.sampled_from([1, 3, 8]),
    blocks=st.sampled_from([1, 2, 5]),
    magnitude=st.sampled_from([1, 50, 1000]),
    seed=st.integers(0, 2**16),
)
def test_faithful_is_exact_on_small_integers(rows, blocks, magnitude, seed):
    # Integer inputs keep every butterfly sum exact in fp32, so the only rounding left is the
    # final fp32 multiply by 0.088388347648: compare with the exact +-1 product times that scale.
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-magnitude, magnitude + 1, (rows, blocks * 128), generator=g).float()
    sums = (x.double().reshape(rows, blocks, 128) @ popcount_matrix()).reshape(rows, -1)
    expected = torch.from_numpy(sums.to(torch.float32).numpy() * SCALE_FP32)
    assert torch.equal(apply_blockwise_faithful(x), expected)


def test_faithful_within_fp32_rounding_of_exact():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(16, 512, generator=g).to(torch.float16)
    exact = apply_blockwise(x.double())
    got = apply_blockwise_faithful(x).double()
    # Seven fp32 rounding stages plus the scale: error <= 8 * 2^-24 * sum|x_block| / sqrt(128).
    bound = 8 * 2.0**-24 * x.double().abs().reshape(16, 4, 128).sum(-1) / np.sqrt(128.0)
    err = (got - exact).abs().reshape(16, 4, 128)
    assert bool((err <= bound[..., None]).all())
    assert bool((err > 0).any())  # it really computes in fp32, not fp64


def test_faithful_accepts_leading_dims_and_bf16():
    x = torch.ones(2, 3, 128, dtype=torch.bfloat16)
    out = apply_blockwise_faithful(x)
    assert out.shape == (2, 3, 128)
    expected = torch.zeros(128)
    expected[0] = float(np.float32(128) * SCALE_FP32)
    assert torch.equal(out[1, 2], expected)


@pytest.mark.parametrize("fn", [apply_blockwise, apply_blockwise_faithful])
def test_rejects_feature_dim_not_multiple_of_128(fn):
    with pytest.raises(ValueError, match="x"):
        fn(torch.zeros(2, 192))


@pytest.mark.parametrize("fn", [apply_blockwise, apply_blockwise_faithful])
def test_rejects_integer_input(fn):
    with pytest.raises(TypeError, match="x"):
        fn(torch.zeros(2, 128, dtype=torch.int32))


def test_apply_blockwise_rejects_bad_dim_and_block():
    with pytest.raises(ValueError, match="dim"):
        apply_blockwise(torch.zeros(2, 128), dim=2)
    with pytest.raises(ValueError, match="block"):
        apply_blockwise(torch.zeros(2, 128), block=96)
