"""GPU: the shared-decode dense mainloop is bit-exact, in every window regime and every geometry.

Two kinds of check (``b12x.kernels.dense_gemm``, "Shared decode"):

* **Identity activations**: ``I @ Wq == Wq`` exactly (one non-zero product per output, fp32
  accumulation, zero partials from other splits), so the output must be the reference decode
  bit for bit. 7 K16 rows (odd: the last step of a split is partial; split 2 and 3 give 4 + 3
  and 3 + 3 + 1 rows), M = 112 (the last M16 block of a 128-row CTA tile lies past M, so a warp
  idles and the copies zero-fill), N = 256 (two CTA columns), every window regime and decoder
  family, at the planned wide geometry (slots as planned per rate); every geometry and slot
  shape at K4 (fp16 and bf16), K5 and K6 (a geometry whose slots do not fit at that rate must
  be refused, not launched).
* **Random activations against the per-warp mainloop**: both issue the same ``mma.sync``
  operands in the same K order per output element, so they must agree bit for bit at M = 1, 5,
  33 and 130 (a second, partial M tile), unsplit and split.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host
from oracle.run.runners import inputs as case_inputs
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

K_ROWS = 7
N = 256
M_IDENTITY = 112

#: (m_tiles, n_tiles, warps, m_warps) x (shared_rows, smem_stages)
GEOMETRIES = [
    ((2, 1, 8, 4), (2, 3)),
    ((2, 1, 8, 4), (1, 4)),
    ((1, 1, 8, 8), (1, 3)),
    ((4, 1, 8, 2), (2, 3)),
    ((1, 1, 4, 4), (4, 3)),
    ((1, 2, 4, 2), (1, 4)),
]
REGIMES = case_inputs.WINDOW_REGIMES


def _payload(bits: int, seed: int, k_rows: int = K_ROWS, n: int = N) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**15), 2**15, (k_rows, n // 16, 16 * bits), generator=gen)
    return words.to(torch.int16)


def _shared(a, payload, codebook, geometry, *, split_k):
    (mt, nt, warps, m_warps), (rows, stages) = geometry
    return host.trellis_matmul(
        a, payload, codebook, split_k=split_k, tiles=(mt, nt), warps=warps, m_warps=m_warps,
        shared_rows=rows, smem_stages=stages,
    )  # fmt: skip


def _identity_case(codebook, bits, geometry, split_k, dtype):
    payload = _payload(bits, seed=70 + bits)
    expected = ref_trellis.decode(payload, codebook).to(dtype)[:M_IDENTITY]
    eye = torch.eye(16 * K_ROWS, dtype=dtype, device="cuda")[:M_IDENTITY]
    got = _shared(eye, payload.cuda(), codebook, geometry, split_k=split_k)
    return got.cpu(), expected


@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize(("codebook", "bits"), REGIMES)
def test_identity_every_window_regime(codebook, bits, split_k):
    from b12x.ops.dense.mainloop import WIDE, slots_for

    planned = slots_for(bits, WIDE)  # the wide geometry as the plan runs it at this rate
    geometry = (
        (planned.m_tiles, planned.n_tiles, planned.warps, planned.m_warps),
        (planned.shared_rows, planned.smem_stages),
    )
    got, expected = _identity_case(codebook, bits, geometry, split_k, torch.float16)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(
    ("bits", "dtype"),
    [(4, torch.float16), (4, torch.bfloat16), (5, torch.float16), (6, torch.float16)],
    ids=str,
)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_identity_every_geometry(geometry, bits, dtype, split_k):
    from b12x.kernels.dense_gemm import SMEM_LIMIT, shared_decode_layout

    (mt, nt, warps, m_warps), (rows, stages) = geometry
    need = shared_decode_layout(
        bits=bits, m_tiles=mt, n_tiles=nt, warps=warps, m_warps=m_warps, rows=rows, stages=stages
    ).total
    if need > SMEM_LIMIT:  # e.g. K6 at 2 rows x 3 slots: refused before launch, not wrong
        with pytest.raises(ValueError, match="shared memory"):
            _identity_case("mcg", bits, geometry, split_k, dtype)
        return
    got, expected = _identity_case("mcg", bits, geometry, split_k, dtype)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("m", [1, 5, 33, 130])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_random_activations_match_the_per_warp_mainloop(geometry, m, split_k):
    k_rows, n = 64, 512
    payload = _payload(4, seed=5, k_rows=k_rows, n=n).cuda()
    gen = torch.Generator().manual_seed(m)
    a = (torch.randn(m, 16 * k_rows, generator=gen) * 0.5).to(torch.bfloat16).cuda()
    (mt, nt, warps, _), _ = geometry
    got = _shared(a, payload, "mcg", geometry, split_k=split_k)
    per_warp = host.trellis_matmul(a, payload, "mcg", split_k=split_k, tiles=(mt, nt), warps=warps)
    assert torch.equal(got, per_warp)
    reference = a.float() @ ref_trellis.decode(payload.cpu(), "mcg").float().cuda()
    scale = reference.abs().max()
    assert ((got.float() - reference).abs().max() / scale) < 1e-2
