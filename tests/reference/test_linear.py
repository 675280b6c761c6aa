"""Tests for reference.linear: validation, reconstruction, exact and faithful forward (§3.2-3.3).

Expectations are built here independently: the explicit matrix product
diag(suh) . blockdiag(H) . Wq . blockdiag(H) . diag(svh) with an entry-wise H128, numpy fp16
arithmetic for the fp16 rounding points, and math identities (bias, identity activations).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from reference import linear
from reference.hadamard import apply_blockwise_faithful
from reference.linear import TrellisLinear, decoded_weight, forward, reconstruct
from reference.trellis import decode


@functools.cache
def entrywise_h128() -> torch.Tensor:
    rows = [[(-1.0) ** bin(i & j).count("1") for j in range(128)] for i in range(128)]
    return torch.tensor(rows, dtype=torch.float64) / np.sqrt(128.0)


def blockdiag_h(size: int) -> torch.Tensor:
    return torch.block_diag(*[entrywise_h128()] * (size // 128))


def make_layer(k=256, n=128, bits=3, codebook="mcg", seed=0, bias=False) -> TrellisLinear:
    g = torch.Generator().manual_seed(seed)
    trellis = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 16 * bits), generator=g)
    # Non-sign scales, as EXL3's regularize produces (RMS-folded, not pure +-1).
    suh = (torch.randn(k, generator=g) * 0.05).to(torch.float16)
    svh = (torch.randn(n, generator=g) * 0.02).to(torch.float16)
    b = (torch.randn(n, generator=g) * 0.01).to(torch.float16) if bias else None
    return TrellisLinear(trellis.to(torch.int16), suh, svh, codebook, b)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_decoded_weight_is_the_trellis_decode():
    layer = make_layer()
    wq = decoded_weight(layer)
    assert wq.dtype == torch.float16 and wq.shape == (256, 128)
    assert torch.equal(wq, decode(layer.trellis, "mcg"))


@pytest.mark.parametrize(
    ("k", "n", "bits", "codebook"), [(256, 128, 3, "mcg"), (128, 256, 2, "sqg_e4m3")]
)
def test_reconstruct_matches_explicit_matrix_formula(k, n, bits, codebook):
    layer = make_layer(k, n, bits, codebook)
    wq = decode(layer.trellis, codebook).double()
    expected = (
        torch.diag(layer.suh.double())
        @ blockdiag_h(k)
        @ wq
        @ blockdiag_h(n)
        @ torch.diag(layer.svh.double())
    )
    got = reconstruct(layer)
    assert got.dtype == torch.float64
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_exact_forward_equals_x_at_reconstruct(dtype):
    layer = make_layer(bias=True)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 256, generator=g).to(dtype)
    y = forward(x, layer, "exact")
    assert y.dtype == torch.float64 and y.shape == (2, 3, 128)
    expected = x.double() @ reconstruct(layer) + layer.bias.double()
    assert torch.allclose(y, expected, rtol=1e-10, atol=1e-12)


def test_bias_is_applied_in_both_precisions():
    with_bias = make_layer(bias=True)
    no_bias = TrellisLinear(with_bias.trellis, with_bias.suh, with_bias.svh, "mcg")
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(6)).to(torch.float16)
    exact_diff = forward(x, with_bias) - forward(x, no_bias)
    assert torch.allclose(exact_diff, with_bias.bias.double().expand(4, -1), atol=1e-12)
    # Faithful: the bias is added in fp32 to the fp16 pre-bias output and rounded once.
    pre = forward(x, no_bias, "faithful").numpy().astype(np.float32)
    expected = (pre + with_bias.bias.numpy().astype(np.float32)).astype(np.float16)
    assert np.array_equal(forward(x, with_bias, "faithful").numpy(), expected)


def test_faithful_forward_replays_the_rounding_table():
    # Rebuild §3.2's table step by step: numpy fp16 for the scale multiplies, the (separately
    # verified) fp32 butterfly for H128, a float32 torch matmul for the fp32-accumulating GEMM.
    layer = make_layer(bias=True)
    x = (torch.randn(5, 256, generator=torch.Generator().manual_seed(7)) * 4).to(torch.float16)
    xs = x.numpy() * layer.suh.numpy()  # numpy fp16 multiply: correctly rounded
    rotated = apply_blockwise_faithful(torch.from_numpy(xs)).to(torch.float16)
    gemm = (rotated.float() @ decode(layer.trellis, "mcg").float()).to(torch.float16)
    out = apply_blockwise_faithful(gemm).to(torch.float16).numpy() * layer.svh.numpy()
    out = (out.astype(np.float32) + layer.bias.numpy().astype(np.float32)).astype(np.float16)
    assert np.array_equal(forward(x, layer, "faithful").numpy(), out)


def test_faithful_close_to_exact_and_bf16_compute_is_not_fp16():
    layer = make_layer(k=512, n=256)
    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(8)).to(torch.float16)
    exact = forward(x, layer, "exact")
    f16 = forward(x, layer, "faithful")
    b16 = forward(x, layer, "faithful", compute_dtype=torch.bfloat16)
    assert f16.dtype == torch.float16 and b16.dtype == torch.float16
    err16, errb = rel_l2(f16, exact), rel_l2(b16, exact)
    # fp16 compute: a few fp16 half-ulps (2^-11 ~ 4.9e-4); bf16 compute: a few 2^-8 ~ 3.9e-3.
    assert 0 < err16 < 4 * 2.0**-11
    assert err16 < errb < 4 * 2.0**-8
    assert not torch.equal(f16, b16)


def test_faithful_bf16_input_returns_bf16_via_fp16():
    layer = make_layer()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    y = forward(x, layer, "faithful", compute_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    # The bf16 input is first converted to fp16 (input_f16): same result as passing fp16 x.
    y16 = forward(x.to(torch.float16), layer, "faithful", compute_dtype=torch.bfloat16)
    assert torch.equal(y, y16.to(torch.bfloat16))
    assert rel_l2(y, forward(x, layer, "exact")) < 4 * 2.0**-8


@pytest.mark.parametrize("compute_dtype", [torch.float16, torch.bfloat16])
def test_faithful_gemm_identity_activations_return_rounded_weights(compute_dtype):
    wq = decode(make_layer().trellis, "mcg")
    eye = torch.eye(256, dtype=torch.float16)
    got = linear.faithful_gemm(eye, wq, compute_dtype)
    assert torch.equal(got, wq.to(compute_dtype).to(torch.float16))
    # The bf16 case is a real test only if some weights are not bf16-representable.
    assert not torch.equal(wq.to(torch.bfloat16).to(torch.float16), wq)


def test_faithful_propagates_nan_without_raising():
    layer = make_layer()
    x = torch.zeros(2, 256, dtype=torch.float16)
    x[1, 7] = float("nan")
    y = forward(x, layer, "faithful")
    assert bool(torch.isnan(y[1]).all()) and not bool(torch.isnan(y[0]).any())


# ---- validation -------------------------------------------------------------------------


def _parts(k=256, n=128, bits=3):
    trellis = torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16)
    return trellis, torch.ones(k, dtype=torch.float16), torch.ones(n, dtype=torch.float16)


def test_rejects_wrong_trellis_dtype():
    trellis, suh, svh = _parts()
    with pytest.raises(TypeError, match="trellis"):
        TrellisLinear(trellis.to(torch.int32), suh, svh, "mcg")


def test_rejects_wrong_scale_dtype_and_shape():
    trellis, suh, svh = _parts()
    with pytest.raises(TypeError, match="suh"):
        TrellisLinear(trellis, suh.float(), svh, "mcg")
    with pytest.raises(ValueError, match="svh"):
        TrellisLinear(trellis, suh, svh[:64], "mcg")
    with pytest.raises(TypeError, match="bias"):
        TrellisLinear(trellis, suh, svh, "mcg", torch.zeros(128))


@pytest.mark.parametrize(("k", "n"), [(64, 128), (256, 64), (192, 128), (128, 320)])
def test_rejects_k_or_n_not_multiple_of_128(k, n):
    trellis, _, _ = _parts(k, n)
    suh, svh = torch.ones(k, dtype=torch.float16), torch.ones(n, dtype=torch.float16)
    with pytest.raises(ValueError, match="trellis"):
        TrellisLinear(trellis, suh, svh, "mcg")


@pytest.mark.parametrize("name", ["suh", "svh"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_rejects_non_finite_scales(name, bad):
    trellis, suh, svh = _parts()
    scale = suh if name == "suh" else svh
    scale[3] = bad
    with pytest.raises(ValueError, match=name):
        TrellisLinear(trellis, suh, svh, "mcg")


@pytest.mark.parametrize(("codebook", "bits"), [("sqg_e4m3", 5), ("sqg_fp16", 4), ("nope", 3)])
def test_rejects_illegal_codebook_bits(codebook, bits):
    trellis, suh, svh = _parts(bits=bits)
    with pytest.raises(ValueError, match="codebook"):
        TrellisLinear(trellis, suh, svh, codebook)


def test_rejects_bad_forward_arguments():
    layer = make_layer()
    with pytest.raises(ValueError, match="x"):
        forward(torch.zeros(2, 128, dtype=torch.float16), layer)
    with pytest.raises(TypeError, match="x"):
        forward(torch.zeros(2, 256, dtype=torch.int32), layer)
    with pytest.raises(TypeError, match="x"):
        forward(torch.zeros(2, 256), layer, "faithful")  # fp32 x: the kernel takes fp16/bf16
    with pytest.raises(ValueError, match="precision"):
        forward(torch.zeros(2, 256), layer, "fast")
    with pytest.raises(ValueError, match="compute_dtype"):
        forward(
            torch.zeros(2, 256, dtype=torch.float16), layer, "faithful", compute_dtype=torch.float32
        )
    with pytest.raises(TypeError, match="layer"):
        forward(torch.zeros(2, 256), object())
