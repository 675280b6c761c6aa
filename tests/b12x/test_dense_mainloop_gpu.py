"""GPU: the dense GEMM mainloop's stage groups and window plans are bit-exact in every shape.

The mainloop covers ``depth + 1`` K16 rows per iteration and skips a row past the split's end
(odd row counts), and the window extraction has three regimes (compile-time offset: b = 4, 8;
lane-dependent offset: b = 2, 3, 6, 7; lanes that start one word early: b = 1, 5). Identity
activations make ``I @ Wq == Wq`` exactly (one non-zero product per output, fp32 accumulation,
zero partials from the other splits), so each case must return the reference decode bit for bit:

* every window regime and decoder family at the headline tile (1 M16 block x 4 N16 tiles per
  warp), with 7 K16 rows unsplit and split 4 + 3 and 3 + 3 + 1 (odd rows per split);
* the register-stage knobs (``depth`` 0, 1, 2 and ``unroll`` 1, 2) on a lane-invariant (K4), a
  lane-dependent (K6) and an early-start (K5) bitrate, split 3 + 3 + 1;
* the cp.async shared-memory ring (``smem_stages`` 2, 3, 4) at K3 (partial copy round), K4 (one
  chunk per lane) and K6 (partial second round), unsplit and split 4 + 3, 3 + 3 + 1 and seven
  one-row splits (every ring slot but one is a zero-size tail copy), ``unroll`` 1 and 2, fp16
  and bf16, and every window regime and decoder family at 3 stages;
* the ring against the register path on dense random activations with M = 1, 5, 33 (A rows
  past M zero-filled in the ring, clamped in registers): the two paths issue the same MMAs in
  the same order, so they must agree bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host
from oracle.run.runners import inputs as case_inputs
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

K_ROWS = 7  # odd: the last stage group of a split is partial
N = 256  # one CTA column of 4 warps x 4 N16 tiles


def _payload(bits: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**15), 2**15, (K_ROWS, N // 16, 16 * bits), generator=gen)
    return words.to(torch.int16)


def _identity_gemm(
    codebook, bits, *, split_k, depth=1, unroll=1, smem_stages=0, dtype=torch.float16
):
    payload = _payload(bits, seed=40 + bits)
    expected = ref_trellis.decode(payload, codebook).to(dtype)
    eye = torch.eye(16 * K_ROWS, dtype=dtype, device="cuda")
    got = host.trellis_matmul(
        eye,
        payload.cuda(),
        codebook,
        split_k=split_k,
        tiles=(1, 4),
        depth=depth,
        unroll=unroll,
        smem_stages=smem_stages,
    )
    return got.cpu(), expected


REGIMES = case_inputs.WINDOW_REGIMES


@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize(("codebook", "bits"), REGIMES)
def test_identity_gemm_every_window_regime_odd_rows(codebook, bits, split_k):
    got, expected = _identity_gemm(codebook, bits, split_k=split_k)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(("depth", "unroll"), [(0, 1), (0, 2), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("bits", [4, 5, 6])
def test_identity_gemm_register_stage_knobs(bits, depth, unroll):
    got, expected = _identity_gemm("mcg", bits, split_k=3, depth=depth, unroll=unroll)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("split_k", [1, 2, 3, 7])
@pytest.mark.parametrize("bits", [3, 4, 6])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_identity_gemm_smem_ring(stages, bits, split_k):
    got, expected = _identity_gemm("mcg", bits, split_k=split_k, smem_stages=stages)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("bits", [3, 4, 6])
def test_identity_gemm_smem_ring_unrolled(stages, bits):
    got, expected = _identity_gemm("mcg", bits, split_k=3, unroll=2, smem_stages=stages)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("bits", [3, 4, 6])
@pytest.mark.parametrize("stages", [2, 3])
def test_identity_gemm_smem_ring_bf16(stages, bits, split_k):
    got, expected = _identity_gemm(
        "mcg", bits, split_k=split_k, smem_stages=stages, dtype=torch.bfloat16
    )
    assert torch.equal(got, expected)


@pytest.mark.parametrize(("codebook", "bits"), REGIMES)
def test_identity_gemm_smem_ring_every_window_regime(codebook, bits):
    got, expected = _identity_gemm(codebook, bits, split_k=3, smem_stages=3)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(("m", "tiles"), [(1, (1, 4)), (5, (1, 4)), (33, (2, 4)), (33, (4, 2))])
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_smem_ring_matches_register_path_on_dense_activations(m, tiles, stages, split_k, dtype):
    payload = _payload(6, seed=11).cuda()
    gen = torch.Generator().manual_seed(12 + m)
    x = torch.randn(m, 16 * K_ROWS, generator=gen).to(dtype).cuda()
    kw = dict(split_k=split_k, tiles=tiles)
    ring = host.trellis_matmul(x, payload, "mcg", smem_stages=stages, **kw)
    regs = host.trellis_matmul(x, payload, "mcg", **kw)
    assert torch.isfinite(regs).all()
    assert torch.equal(ring, regs)
