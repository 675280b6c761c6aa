"""GPU: the decode kernel and the GEMM's in-register decode are bit-exact against the reference.

* Decode kernel: ``torch.equal(decode_weight(payload), reference.trellis.decode(payload))`` for
  every (codebook, bits) the kernels support, in fp16 and (rounded from it) bf16.
* GEMM decode: identity activations make ``I @ Wq == Wq`` exactly (one non-zero product per
  output, fp32 accumulation, Wq representable in the compute dtype), so the GEMM output must
  equal the reference decode (rounded to bf16 for bf16 compute), for every tile shape.
* Split-K on one-hot activations gives bit-identical results for every split count, and
  repeated runs are bitwise deterministic.
"""

from __future__ import annotations

import pytest
import torch

from b12x.formats import FORMATS
from b12x.launch import host
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

CASES = [(name, bits) for name, fmt in FORMATS.items() for bits in fmt.legal_bits]


def _payload(k: int, n: int, bits: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 16 * bits), generator=gen)
    return words.to(torch.int16)


@pytest.mark.parametrize(("codebook", "bits"), CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_kernel_bit_exact(codebook, bits, dtype):
    """fp16, and bf16 (the decode_matmul path's bf16 weight): each fp16 weight rounded to
    nearest even, the reference decode's ``.to(bf16)``."""
    payload = _payload(64, 128, bits, seed=bits)
    expected = ref_trellis.decode(payload, codebook).to(dtype)
    out = torch.full((64, 128), float("nan"), dtype=dtype, device="cuda")
    got = host.decode_weight(payload.cuda(), codebook, out=out)
    assert got is out and torch.equal(got.cpu(), expected)


@pytest.mark.parametrize(("codebook", "bits"), CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_identity_returns_decoded_weight(codebook, bits, dtype):
    k, n = 64, 256
    payload = _payload(k, n, bits, seed=100 + bits)
    expected = ref_trellis.decode(payload, codebook).to(dtype)
    eye = torch.eye(k, dtype=dtype, device="cuda")
    got = host.trellis_matmul(eye, payload.cuda(), codebook, split_k=1)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("tiles", [(1, 2), (2, 2), (4, 2)])
@pytest.mark.parametrize("split_k", [1, 3])
def test_gemm_identity_every_tile_shape(tiles, split_k):
    k, n = 96, 128  # K = 6 K16 rows: split 3 gives 2 rows per split
    payload = _payload(k, n, 4, seed=7)
    expected = ref_trellis.decode(payload, "mcg")
    eye = torch.zeros(k + 5, k, dtype=torch.float16, device="cuda")  # rows past K stay zero
    eye[:k] = torch.eye(k, dtype=torch.float16, device="cuda")
    got = host.trellis_matmul(eye, payload.cuda(), "mcg", split_k=split_k, tiles=tiles)
    assert torch.equal(got[:k].cpu(), expected)
    assert torch.count_nonzero(got[k:]) == 0


@pytest.mark.parametrize("codebook", ["mcg", "sqg_e4m3", "sqg_fp16"])
def test_split_k_bit_equal_on_one_hot(codebook):
    bits = FORMATS[codebook].legal_bits[-1]
    k, n, m = 256, 256, 24
    payload = _payload(k, n, bits, seed=3).cuda()
    gen = torch.Generator().manual_seed(5)
    hot = torch.randint(0, k, (m,), generator=gen)
    x = torch.zeros(m, k, dtype=torch.float16)
    x[torch.arange(m), hot] = 1.0
    x = x.cuda()
    results = [host.trellis_matmul(x, payload, codebook, split_k=s) for s in (1, 2, 4, 16)]
    for r in results[1:]:
        assert torch.equal(r, results[0])
    expected = ref_trellis.decode(payload.cpu(), codebook)[hot]
    assert torch.equal(results[0].cpu(), expected)


def test_repeated_runs_are_bitwise_deterministic():
    k, n, m = 512, 256, 40
    payload = _payload(k, n, 3, seed=11).cuda()
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(m, k, generator=gen).to(torch.float16).cuda()
    first = host.trellis_matmul(x, payload, "mcg", split_k=8)
    for _ in range(5):
        assert torch.equal(host.trellis_matmul(x, payload, "mcg", split_k=8), first)
