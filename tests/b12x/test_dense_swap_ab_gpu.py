"""GPU (sm_90): the swap-AB dense mainloop (:mod:`b12x.kernels.wgmma_swap`) is exact where the
math is exact and faithful where it is not.

* **Identity activations**: ``I @ Wq == Wq`` bit for bit (one non-zero product per output),
  7 K16 rows (a partial last step; split 3 gives 3 + 3 + 1 rows, so K16 rows past a split's
  end are multiplied as zero tokens against a decoded zero payload), every window regime and
  decoder family. M = 112 leaves tokens of the CTA dead (zero-filled, never stored), M = 48
  fills a 64-token CTA partly; fp16 and bf16 for every geometry.
* **Random activations against float64**: every element within the output's rounding plus an
  fp32 accumulation bound, at M = 1, 64, 100, 200 and 300 (two token tiles at 256 tokens per
  CTA), unsplit and split; and **bit-identical to the ``mma.sync`` shared decode**: the same
  products in the same K order, with the weight as the tensor core's A operand instead of B.
  PTX does not promise that the sum of a K16 product is the same; this test is what would
  notice a device where it is not.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host
from oracle.run.runners import inputs as case_inputs
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

K_ROWS = 7
#: (m_tiles, n_tiles, warps, shared_rows, smem_stages): 128 tokens x 128 weight rows (the
#: planned shape), 256 tokens, 64 tokens x 256 weight rows at 4 K16 rows per step, one
#: warpgroup at the fewest slots.
GEOMETRIES = [(8, 1, 8, 2, 6), (16, 1, 8, 2, 6), (4, 2, 8, 4, 6), (4, 1, 4, 2, 4)]


def _geometry_id(geometry) -> str:
    return "x".join(map(str, geometry))


REGIMES = case_inputs.WINDOW_REGIMES


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the swap-AB mainloop runs on sm_90 only")


def _payload(bits: int, seed: int, k_rows: int = K_ROWS, n: int = 512) -> torch.Tensor:
    """A random layer payload ``int16[k_rows, n/16, 16b]`` (the oracle's input generator)."""
    return case_inputs.payload(torch.Generator().manual_seed(seed), k_rows, n // 16, 16 * bits)


def _swap(a, payload, codebook, geometry, *, split_k):
    mt, nt, warps, rows, stages = geometry
    return host.trellis_matmul(
        a, payload, codebook, split_k=split_k, tiles=(mt, nt), warps=warps, m_warps=warps,
        shared_rows=rows, smem_stages=stages, wgmma=True, swap_ab=True,
    )  # fmt: skip


@pytest.mark.parametrize("m", [112, 48])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("codebook", "bits"), REGIMES)
def test_identity_every_window_regime(codebook, bits, split_k, m):
    payload = _payload(bits, seed=90 + bits)
    expected = ref_trellis.decode(payload, codebook).to(torch.float16)[:m]
    eye = torch.eye(16 * K_ROWS, dtype=torch.float16, device="cuda")[:m]
    got = _swap(eye, payload.cuda(), codebook, GEOMETRIES[0], split_k=split_k)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bits", [2, 4, 6])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=_geometry_id)
def test_identity_every_geometry(geometry, bits, dtype):
    payload = _payload(bits, seed=40 + bits)
    expected = ref_trellis.decode(payload, "mcg").to(dtype)[:112]
    eye = torch.eye(16 * K_ROWS, dtype=dtype, device="cuda")[:112]
    got = _swap(eye, payload.cuda(), "mcg", geometry, split_k=1)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("m", [1, 64, 100, 200, 300])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=_geometry_id)
def test_random_activations_within_the_rounding_bound(
    tensor_core_gemm_judge, geometry, m, split_k
):  # fmt: skip
    tensor_core_gemm_judge(
        lambda a, payload, split: _swap(a, payload, "mcg", geometry, split_k=split),
        m=m, split_k=split_k,
    )  # fmt: skip
