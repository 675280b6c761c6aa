"""CPU: the swap-AB mainloop whose cluster shares each token tile by TMA multicast
(:mod:`b12x.kernels.wgmma_swap`, "Token sharing") — its layout, its rules and its compiled
shape. The numerics are GPU checks: ``tests/b12x/test_dense_swap_cluster_gpu.py``.

Without a GPU these show: the token tiles leave the cp.async slots for their own aligned region
(every CTA's share of every (slot, row) tile disjoint and swizzle-aligned, the barriers after
them); a cluster the kernel cannot run is refused by spec, launcher and kernel alike before any
launch; and the compiled kernel issues one TMA per K16 row and share, waits on a full barrier
before each step's MMAs, releases each slot to every CTA of the cluster, keeps one CTA barrier
per step (no cluster barrier, no proxy fence in the loop), spill-free and unserialized.
"""

from __future__ import annotations

import re

import pytest
import torch

from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.shared_layout import (
    SWAP_CLUSTERS,
    TOKEN_TILE_ALIGN,
    WGMMA_SMEM_LIMIT,
    check_swap_ab,
)
from b12x.launch import host
from b12x.launch.specs import KernelSpec, build_kernel, target_arch

#: The planned 256-token CTA (:data:`b12x.ops.dense.mainloop.SWAP_TALL`).
TALL = dict(m_tiles=16, n_tiles=1, warps=8, m_warps=8, shared_rows=2, smem_stages=6)


@pytest.mark.parametrize("bits", [1, 4, 8])
@pytest.mark.parametrize("cluster", [2, 4])
@pytest.mark.parametrize(("m_tiles", "n_tiles"), [(16, 1), (8, 2), (2, 1)])
def test_token_tiles_are_disjoint_aligned_and_fit(m_tiles, n_tiles, cluster, bits):
    from b12x.formats import resolve_format
    from b12x.kernels.wgmma_swap import SwapAbMainloop

    rows, stages = 2, 6
    loop = SwapAbMainloop(
        resolve_format("mcg", bits), bits, bf16=True, m_tiles=m_tiles, n_tiles=n_tiles, warps=8,
        rows=rows, stages=stages, cluster=cluster,
    )  # fmt: skip
    lay = loop.layout
    assert lay.slot_bytes == rows * lay.row_pay and lay.a_chunks == 0 and lay.a_rounds == 0
    assert lay.a_offset % TOKEN_TILE_ALIGN == 0 and lay.a_offset >= stages * lay.slot_bytes
    share_bytes = 32 * loop.share
    assert loop.share * cluster == 16 * m_tiles
    spans = []
    for slot in range(stages):
        for row in range(rows):
            tile = lay.a_offset + loop._token_offset(slot, row)
            for rank in range(cluster):
                start = tile + rank * share_bytes
                assert start % 256 == 0  # the 32-byte swizzle's period
                spans.append((start, start + share_bytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # disjoint
    assert spans[-1][1] <= lay.barrier_offset
    assert lay.total == lay.barrier_offset + 16 * stages + TOKEN_TILE_ALIGN <= WGMMA_SMEM_LIMIT


@pytest.mark.parametrize(
    ("geometry", "field"),
    [
        (dict(cluster=3), "cluster"),
        (dict(cluster=True), "cluster"),
        (dict(cluster=4, m_tiles=1), "cluster"),  # 4 tokens per CTA: less than a swizzle atom
    ],
)
def test_bad_cluster_refused_by_spec_launcher_and_kernel(geometry, field):
    from b12x.formats import resolve_format
    from b12x.kernels.dense_gemm import DenseTrellisGemmKernel

    geo = {**TALL, **geometry}
    with pytest.raises(ValueError, match=field):
        check_swap_ab(
            True, wgmma=True, bits=4, m_tiles=geo["m_tiles"], n_tiles=geo["n_tiles"],
            warps=geo["warps"], m_warps=geo["m_warps"], rows=geo["shared_rows"],
            stages=geo["smem_stages"], cluster=geo["cluster"],
        )  # fmt: skip
    with pytest.raises(ValueError, match=field):
        KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=True, swap_ab=True, **geo))
    with pytest.raises(ValueError, match=field):
        DenseTrellisGemmKernel(
            resolve_format("mcg", 4),
            4,
            GemmGeometry(wgmma=True, swap_ab=True, **geo),
            bf16=True,
            write_partials=False,
        )
    a = torch.zeros(16, 256, dtype=torch.bfloat16)  # CPU tensors: refused before any device
    payload = torch.zeros(16, 32, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match=field):
        host.trellis_matmul(
            a, payload, "mcg", tiles=(geo["m_tiles"], geo["n_tiles"]), warps=geo["warps"],
            m_warps=geo["m_warps"], shared_rows=geo["shared_rows"],
            smem_stages=geo["smem_stages"], wgmma=True, swap_ab=True, cluster=geo["cluster"],
        )  # fmt: skip


def test_cluster_needs_the_swap_ab_mainloop():
    assert SWAP_CLUSTERS == (1, 2, 4)
    with pytest.raises(ValueError, match="cluster"):
        KernelSpec(
            "gemm",
            "mcg",
            4,
            geometry=GemmGeometry(
                m_tiles=2, n_tiles=1, warps=8, m_warps=4, shared_rows=2, smem_stages=3, cluster=2
            ),
        )


def test_cluster_must_divide_the_ctas_along_n():
    """N = 384 is three CTAs of 128 weight rows: no pair of them shares a token tile."""
    a = torch.zeros(16, 256, dtype=torch.bfloat16)
    payload = torch.zeros(16, 384 // 16, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match="cluster"):
        host.trellis_matmul(
            a, payload, "mcg", tiles=(16, 1), warps=8, m_warps=8, shared_rows=2, smem_stages=6,
            wgmma=True, swap_ab=True, cluster=2,
        )  # fmt: skip


@pytest.mark.deep
@pytest.mark.parametrize("cluster", [2, 4])
def test_compiled_shape(cluster):
    from b12x.launch.toolchain import compile_with_remarks

    spec = KernelSpec(
        "gemm",
        "mcg",
        4,
        geometry=GemmGeometry(wgmma=True, swap_ab=True, cluster=cluster, **TALL),
        bf16=True,
    )
    remarks = compile_with_remarks(*build_kernel(spec), target_arch(spec, "sm_90"), ptx=True)
    assert remarks.spills and max(remarks.spills) == 0, remarks.spills
    for remark in ("C7510", "C7520", "serialized"):
        assert remark not in remarks.log, remark
    ptx = remarks.ptx
    period, rows, stages = 6, 2, 6
    # one multicast TMA per K16 row: the prologue's stages - 2 steps, then one step per step
    tma = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.\S*multicast", ptx)
    assert len(tma) == rows * (stages - 2 + period)
    assert ptx.count("mbarrier.arrive.expect_tx") == stages - 2 + period
    # waits: one full barrier per step; one empty barrier per refill of the loop (the
    # prologue's steps fill each slot for the first time: nothing to wait for)
    assert ptx.count("mbarrier.try_wait.parity") == period + period
    # each step releases its predecessor's slot to every CTA of the cluster (remote arrivals)
    assert len(re.findall(r"mapa\.shared::cluster", ptx)) == period * cluster
    assert ptx.count("mbarrier.init") == 2 * stages
    assert ptx.count("barrier.cluster.arrive") == 1  # after the mbarrier init only
    assert ptx.count("bar.sync") == 1 + period
    assert "fence.proxy.async" not in ptx  # tokens: async proxy in and out; payload: ld.shared
    assert ptx.count("wgmma.mma_async") == period * rows
    # no thread copies tokens: per K16 row one 16-byte payload chunk per thread (1 KB at K4)
    assert ptx.count("cp.async.cg.shared.global") == rows * (stages - 1 + period)
