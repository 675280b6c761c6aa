"""GPU (sm_90): the ``wgmma`` mainloops on the stream-K schedule (:mod:`b12x.kernels.stream_k`):
the dense table's deep row, and swap-AB alone and in CTA pairs sharing their token tiles.

* **Identity activations**: ``I @ Wq == Wq`` bit for bit. Every output is one product plus
  exact zeros, so a partial added to the wrong tile, a piece added twice or missed, a stale
  partial from the previous launch or a K range shifted by a unit all change it. Shapes where
  every unit is its own CTA (a tile in 5 pieces) and where 132 CTAs share 512 units unevenly.
* **Random activations**: within the output's rounding plus an fp32 accumulation bound against
  float64, **bitwise reproducible** over repeated launches and inside a CUDA graph, and the
  flags are all zero again after every launch (the next launch's precondition).
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host
from b12x.ops.dense import mainloop as mainloop_table
from oracle.run.runners import inputs as case_inputs
from reference import trellis as ref_trellis

pytestmark = pytest.mark.gpu

L = mainloop_table
#: The geometries (the dense table's rows) and the M each identity case runs at.
GEOMETRIES = {"deep": (L.TENSOR_DEEP, (48, 112)), "swap": (L.SWAP_WIDE, (100,)),
              "swap_pair": (L.SWAP_TALL, (200,))}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma mainloop runs on sm_90 only")


def _payload(bits: int, seed: int, k_rows: int, n: int) -> torch.Tensor:
    return case_inputs.payload(torch.Generator().manual_seed(seed), k_rows, n // 16, 16 * bits)


def _flags() -> torch.Tensor:
    """One zeroed flag per SM: the launch runs one CTA per SM (at most)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return torch.zeros(sms, dtype=torch.int32, device="cuda")


def _stream_k(a, payload, codebook="mcg", *, geometry=L.TENSOR_DEEP, flags=None, scratch=None,
              out=None):  # fmt: skip
    g = geometry
    return host.trellis_matmul(
        a, payload, codebook, tiles=(g.m_tiles, g.n_tiles), warps=g.warps, m_warps=g.m_warps,
        shared_rows=g.shared_rows, smem_stages=g.smem_stages, wgmma=True, swap_ab=g.swap_ab,
        cluster=g.cluster, stream_k=True, flags=flags, scratch=scratch, out=out,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("codebook", "bits", "k_rows", "n"),
    [("mcg", 4, 80, 512), ("3inst", 2, 80, 512), ("mul1", 6, 80, 512), ("mcg", 4, 512, 4096)],
)
@pytest.mark.parametrize("name", GEOMETRIES)
def test_identity_is_the_decode(name, codebook, bits, k_rows, n, dtype):
    """(80, 512): 5 units per tile, one CTA (or pair) per unit, so every tile is 5 pieces;
    (512, 4096): 132 CTAs share the units unevenly."""
    geometry, ms = GEOMETRIES[name]
    payload = _payload(bits, seed=11 + bits, k_rows=k_rows, n=n)
    expected = ref_trellis.decode(payload, codebook).to(dtype)
    for m in ms:
        for row0 in (0, 16 * k_rows - m):  # the first and the last K rows of the identity
            eye = torch.eye(16 * k_rows, dtype=dtype, device="cuda")[row0 : row0 + m]
            got = _stream_k(eye, payload.cuda(), codebook, geometry=geometry)
            assert torch.equal(got.cpu(), expected[row0 : row0 + m]), (m, row0)


@pytest.mark.parametrize(
    ("name", "m"), [("deep", 1), ("deep", 64), ("deep", 200), ("swap", 100), ("swap_pair", 256)]
)
def test_random_activations_reproducible_and_bounded(name, m):
    geometry = GEOMETRIES[name][0]
    k_rows, n = 512, 4096
    k = 16 * k_rows
    payload = _payload(4, seed=3, k_rows=k_rows, n=n)
    a = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 0.5).to(torch.bfloat16)
    w = ref_trellis.decode(payload, "mcg").to(torch.bfloat16).double()
    exact = a.double() @ w
    flags = _flags()
    got = _stream_k(a.cuda(), payload.cuda(), geometry=geometry, flags=flags)
    assert not flags.any(), "a raised flag was left set"
    ulp = torch.finfo(torch.bfloat16).eps * exact.abs()
    bound = 0.5 * ulp + k * 2.0**-23 * (a.double().abs() @ w.abs()) + 1e-30
    err = (got.cpu().double() - exact).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3f}"
    for _ in range(3):
        again = _stream_k(a.cuda(), payload.cuda(), geometry=geometry, flags=flags)
        assert torch.equal(again, got)
        assert not flags.any()


@pytest.mark.graph
@pytest.mark.parametrize(("name", "m"), [("deep", 64), ("swap_pair", 256)])
def test_graph_replay_with_caller_buffers(name, m):
    geometry = GEOMETRIES[name][0]
    k_rows, n = 512, 4096
    payload = _payload(4, seed=5, k_rows=k_rows, n=n).cuda()
    a = (torch.randn(m, 16 * k_rows, generator=torch.Generator().manual_seed(9)) * 0.5).to(
        torch.bfloat16
    ).cuda()  # fmt: skip
    flags = _flags()
    scratch = torch.empty(8 << 20, dtype=torch.float32, device="cuda")
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    run = dict(geometry=geometry, flags=flags, scratch=scratch, out=out)
    eager = _stream_k(a, payload, **run).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _stream_k(a, payload, **run)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        assert not flags.any()
