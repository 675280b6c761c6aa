"""GPU (sm_90): the swap-AB mainloop whose cluster shares each token tile by TMA multicast
(:mod:`b12x.kernels.wgmma_swap`, "Token sharing") computes what the unshared one does.

* **Identity activations** (``I @ Wq == Wq`` bit for bit) through clusters of 2 and 4, every
  window regime and every geometry: a token each CTA copies lands where every CTA's B
  descriptor reads it (the 32-byte swizzle agrees between TMA and ``wgmma``), tokens past M
  arrive as zeros (TMA's out-of-bounds fill), and split 3 of 7 K16 rows multiplies rows past a
  split's end as zero tokens (the out-of-bounds row, not the next split's tokens).
* **Random activations** within the rounding bound and bit-identical to the ``mma.sync`` shared
  decode (:func:`tests.b12x.conftest.tensor_core_gemm_judge`), at M = 1 .. 1000 (up to four
  token tiles), unsplit and split 4: K ranges whose last loop body runs past the end.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host
from oracle.run.runners import inputs as case_inputs
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

K_ROWS = 7
#: (m_tiles, n_tiles, warps, shared_rows, smem_stages, cluster): the planned 256-token shape
#: (4 K16 rows per step, 4 slots), 256 and 128 tokens at clusters 2 and 4 with 2 rows per step,
#: one warpgroup with 16 tokens per CTA share.
GEOMETRIES = [
    (16, 1, 8, 4, 4, 2), (16, 1, 8, 2, 6, 4), (8, 2, 8, 2, 6, 2), (8, 1, 8, 2, 6, 4),
    (4, 1, 4, 2, 4, 4), (16, 1, 8, 2, 6, 2),
]  # fmt: skip


def _geometry_id(geometry) -> str:
    return "x".join(map(str, geometry[:5])) + f"c{geometry[5]}"


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the swap-AB mainloop runs on sm_90 only")


def _payload(bits: int, seed: int, n: int = 1024) -> torch.Tensor:
    return case_inputs.payload(torch.Generator().manual_seed(seed), K_ROWS, n // 16, 16 * bits)


def _shared(a, payload, codebook, geometry, *, split_k):
    mt, nt, warps, rows, stages, cluster = geometry
    return host.trellis_matmul(
        a, payload, codebook, split_k=split_k, tiles=(mt, nt), warps=warps, m_warps=warps,
        shared_rows=rows, smem_stages=stages, wgmma=True, swap_ab=True, cluster=cluster,
    )  # fmt: skip


@pytest.mark.parametrize("m", [112, 48])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("codebook", "bits"), case_inputs.WINDOW_REGIMES)
def test_identity_every_window_regime(codebook, bits, split_k, m):
    payload = _payload(bits, seed=90 + bits)
    expected = ref_trellis.decode(payload, codebook).to(torch.float16)[:m]
    eye = torch.eye(16 * K_ROWS, dtype=torch.float16, device="cuda")[:m]
    got = _shared(eye, payload.cuda(), codebook, GEOMETRIES[0], split_k=split_k)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bits", [2, 4, 6])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=_geometry_id)
def test_identity_every_geometry(geometry, bits, dtype):
    payload = _payload(bits, seed=40 + bits)
    expected = ref_trellis.decode(payload, "mcg").to(dtype)[:112]
    eye = torch.eye(16 * K_ROWS, dtype=dtype, device="cuda")[:112]
    got = _shared(eye, payload.cuda(), "mcg", geometry, split_k=1)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("m", [1, 64, 100, 200, 300, 1000])
@pytest.mark.parametrize("geometry", [GEOMETRIES[0], GEOMETRIES[1]], ids=_geometry_id)
def test_random_activations(tensor_core_gemm_judge, geometry, m, split_k):
    mt = geometry[0] if m > 128 else 8

    def launch(a, payload, split):
        return _shared(a, payload, "mcg", (mt, *geometry[1:]), split_k=split)

    tensor_core_gemm_judge(launch, m=m, split_k=split_k)
