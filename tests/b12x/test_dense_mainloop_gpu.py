"""GPU: the dense GEMM mainloop's stage groups and window plans are bit-exact in every shape.

The mainloop covers ``depth + 1`` K16 rows per iteration and skips a row past the split's end
(odd row counts), and the window extraction has three regimes (compile-time offset: b = 4, 8;
lane-dependent offset: b = 2, 3, 6, 7; lanes that start one word early: b = 1, 5). Identity
activations make ``I @ Wq == Wq`` exactly (one non-zero product per output, fp32 accumulation,
zero partials from the other splits), so each case must return the reference decode bit for bit:

* every window regime and decoder family at the headline tile (1 M16 block x 4 N16 tiles per
  warp), with 7 K16 rows unsplit and split 4 + 3 and 3 + 3 + 1 (odd rows per split);
* the register-stage knobs (``depth`` 0, 1, 2 and ``unroll`` 1, 2) on a lane-invariant (K4), a
  lane-dependent (K6) and an early-start (K5) bitrate, split 3 + 3 + 1.
"""

from __future__ import annotations

import pytest
import torch

from b12x.kernels import host
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

K_ROWS = 7  # odd: the last stage group of a split is partial
N = 256  # one CTA column of 4 warps x 4 N16 tiles


def _payload(bits: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**15), 2**15, (K_ROWS, N // 16, 16 * bits), generator=gen)
    return words.to(torch.int16)


def _identity_gemm(codebook, bits, *, split_k, depth=1, unroll=1):
    payload = _payload(bits, seed=40 + bits)
    expected = ref_trellis.decode(payload, codebook)
    eye = torch.eye(16 * K_ROWS, dtype=torch.float16, device="cuda")
    got = host.trellis_matmul(
        eye, payload.cuda(), codebook, split_k=split_k, tiles=(1, 4), depth=depth, unroll=unroll
    )
    return got.cpu(), expected


REGIMES = [
    ("mcg", 1),
    ("mcg", 2),
    ("3inst", 3),
    ("mcg", 4),
    ("mul1", 5),
    ("mcg", 6),
    ("3inst", 7),
    ("mul1", 8),
    ("sqg_e4m3", 3),
    ("sqg_fp16", 5),
]


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
