"""GPU (sm_90): the dense shared decode with ``wgmma`` consumers is exact where the math is exact
and faithful where it is not.

* **Identity activations** (:mod:`b12x.kernels.wgmma_decode`): ``I @ Wq == Wq`` bit for bit
  (one non-zero product per output, fp32 accumulation), 7 K16 rows (a partial last step; split
  3 gives 3 + 3 + 1 rows, so rows past a split's end are multiplied as zero activations against
  a decoded zero payload), every window regime and decoder family, fp16 and bf16, every
  ``wgmma`` geometry. M = 112 leaves the second warpgroup partly live, M = 48 leaves it dead
  (its MMAs skipped), and both must still equal the decode.
* **Random activations against float64**: every element within the output's rounding (half an
  ulp of the fp16/bf16 result) plus an fp32 accumulation bound (``K·2^-23·Σ|a||w|``), at M = 1,
  64, 100 and 200 (a second, partial M tile), unsplit and split; and **bit-identical to the
  ``mma.sync`` shared decode** (H200, measured: the tensor core sums a K16 product the same way
  for both instructions). PTX does not promise that; the MoE's batch invariance across its
  mainloops relies on it, so this test is what would notice a device where it fails.
"""

from __future__ import annotations

import pytest
import torch

from b12x.kernels.shared_layout import fitting_slots
from b12x.launch import host
from b12x.ops.dense import mainloop as mainloop_table
from oracle.run.runners import inputs as case_inputs
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

K_ROWS = 7
N = 256
#: (m_tiles, n_tiles) of the warpgroup geometries (8 warps, every warp multiplies), and the
#: warp-specialised one: (m_tiles, n_tiles, warps, m_warps) = 8 multiplying warps and 8
#: decode-only helpers (the dense table's ``tensor_helpers`` geometry, 2 x 4 slots).
HELPERS = (1, 1, 16, 8)
GEOMETRIES = [(1, 1), (2, 1), (1, 2), HELPERS]


def _geometry_id(geometry) -> str:
    return "x".join(map(str, geometry))


REGIMES = case_inputs.WINDOW_REGIMES


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma mainloop runs on sm_90 only")


def _payload(bits: int, seed: int, k_rows: int = K_ROWS, n: int = N) -> torch.Tensor:
    """A random layer payload ``int16[k_rows, n/16, 16b]`` (the oracle's input generator)."""
    return case_inputs.payload(torch.Generator().manual_seed(seed), k_rows, n // 16, 16 * bits)


def _wgmma(a, payload, codebook, bits, geometry, *, split_k, slots=None):
    mt, nt, warps, m_warps = (*geometry, 8, 8) if len(geometry) == 2 else geometry
    if slots is not None:
        rows, stages = slots
    elif m_warps < warps:
        rows, stages = 2, 4  # opt-in shared memory
    else:
        rows, stages = fitting_slots(bits=bits, m_tiles=mt, n_tiles=nt, warps=8, m_warps=8)
    return host.trellis_matmul(
        a, payload, codebook, split_k=split_k, tiles=(mt, nt), warps=warps, m_warps=m_warps,
        shared_rows=rows, smem_stages=stages, wgmma=True,
    )  # fmt: skip


@pytest.mark.parametrize("geometry", [(1, 1), HELPERS], ids=_geometry_id)
@pytest.mark.parametrize("m", [112, 48])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("codebook", "bits"), REGIMES)
def test_identity_every_window_regime(codebook, bits, split_k, m, geometry):
    payload = _payload(bits, seed=90 + bits)
    expected = ref_trellis.decode(payload, codebook).to(torch.float16)[:m]
    eye = torch.eye(16 * K_ROWS, dtype=torch.float16, device="cuda")[:m]
    got = _wgmma(eye, payload.cuda(), codebook, bits, geometry, split_k=split_k)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bits", [2, 4, 6])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=_geometry_id)
def test_identity_every_geometry(geometry, bits, dtype):
    payload = _payload(bits, seed=40 + bits, n=512)
    expected = ref_trellis.decode(payload, "mcg").to(dtype)[:112]
    eye = torch.eye(16 * K_ROWS, dtype=dtype, device="cuda")[:112]
    got = _wgmma(eye, payload.cuda(), "mcg", bits, geometry, split_k=1)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("m", [1, 64, 100, 200])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=_geometry_id)
def test_random_activations_within_the_rounding_bound(
    tensor_core_gemm_judge, geometry, m, split_k
):  # fmt: skip
    tensor_core_gemm_judge(
        lambda a, payload, split: _wgmma(a, payload, "mcg", 4, geometry, split_k=split),
        m=m, split_k=split_k,
    )  # fmt: skip


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m", [1, 50, 64])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_the_deep_step_is_bit_identical(bits, m, split_k):
    """The dense table's M <= 64 row (``tensor_core_deep``: 128 x 256, 4 K16 rows per step in 4
    slots) against the mma.sync shared decode: the same products in the same K order, 45 K16
    rows (a partial last step; split 3 gives 15 + 15 + 15)."""
    k_rows, n = 45, 512
    payload = _payload(bits, seed=60 + bits, k_rows=k_rows, n=n)
    a = (torch.randn(m, 16 * k_rows, generator=torch.Generator().manual_seed(m)) * 0.5).to(
        torch.bfloat16
    )
    deep = mainloop_table.TENSOR_DEEP
    got = _wgmma(
        a.cuda(), payload.cuda(), "mcg", bits, (deep.m_tiles, deep.n_tiles), split_k=split_k,
        slots=(deep.shared_rows, deep.smem_stages),
    )  # fmt: skip
    rows, stages = fitting_slots(bits=bits, m_tiles=2, n_tiles=1, warps=8, m_warps=4)
    sync = host.trellis_matmul(
        a.cuda(), payload.cuda(), "mcg", split_k=split_k, tiles=(2, 1), warps=8, m_warps=4,
        shared_rows=rows, smem_stages=stages,
    )  # fmt: skip
    assert torch.equal(got.cpu(), sync.cpu())
