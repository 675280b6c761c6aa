"""CPU: the swap-AB dense mainloop (:mod:`b12x.kernels.wgmma_swap`) — geometry rules, operand
layout and the compiled shape.

Without a GPU these show: every token chunk lands where the B descriptor reads it (a bijection
onto core matrices, 32 lanes writing 512 contiguous bytes); the decoded tile's registers are
the ``wgmma`` A fragment once reordered (derived here from the two fragment layouts, not from
the kernel's constant); bad geometries are refused by spec, launcher and kernel alike; and the
compiled kernel keeps its MMAs asynchronous (no serialization remark), spill-free, with A in
registers, one ``wait_group 1`` (decode of the next step overlapping the MMAs) and one CTA
barrier per step, and no shared-memory round trip of the weights (no ``stmatrix``). The
numerics are GPU checks: ``tests/b12x/test_dense_swap_ab_gpu.py``.
"""

from __future__ import annotations

import re

import pytest
import torch

from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.shared_layout import check_swap_ab, swap_ab_layout
from b12x.launch import host
from b12x.launch.specs import KernelSpec, build_kernel, target_arch

#: The 128 tokens x 128 weight rows CTA (8 warps, 2 K16 rows per step, 6 slots).
HEADLINE = dict(m_tiles=8, n_tiles=1, warps=8, m_warps=8, shared_rows=2, smem_stages=6)


def _mainloop(**geometry):
    from b12x.formats import resolve_format
    from b12x.kernels.wgmma_swap import SwapAbMainloop

    geo = {**HEADLINE, **geometry}
    return SwapAbMainloop(
        resolve_format("mcg", 4), 4, bf16=True, m_tiles=geo["m_tiles"], n_tiles=geo["n_tiles"],
        warps=geo["warps"], rows=geo["shared_rows"], stages=geo["smem_stages"],
    )  # fmt: skip


@pytest.mark.parametrize("m_tiles", [1, 8, 16])
def test_tokens_land_where_the_b_descriptor_reads_them(m_tiles):
    """The B operand is ``cta_m`` tokens x K16, K-major, no swizzle: token i, k-half h in core
    matrix (i // 8, h) at ``SBO·(i // 8) + LBO·h``, row ``i % 8`` 16 B in (LBO 128, SBO 256)."""
    loop = _mainloop(m_tiles=m_tiles)
    cta_m = 16 * m_tiles
    assert loop.layout.cta_m == cta_m and loop.layout.row_a == 32 * cta_m
    seen = set()
    for c in range(2 * cta_m):
        token, half = divmod(c, 2)  # the copy plan's source (SharedDecodeMainloop._copy_plan)
        got = loop._a_chunk_offset(c)
        assert got == 256 * (token // 8) + 128 * half + 16 * (token % 8), c
        seen.add(got)
    assert sorted(seen) == list(range(0, 32 * cta_m, 16))  # a bijection onto the row
    for first in range(0, 2 * cta_m, 32):  # one copy round of a warp: 512 contiguous bytes
        offs = sorted(loop._a_chunk_offset(c) for c in range(first, first + 32))
        assert offs == list(range(offs[0], offs[0] + 512, 16))


def test_the_decoded_tile_is_the_a_fragment():
    """The decode yields the ``mma.sync`` B fragment of weight rows (n) g, g+8: registers
    ``(n, k) = (g, 2r), (g, 2r+8), (g+8, 2r), (g+8, 2r+8)``; the A fragment of those rows wants
    ``(g, 2r), (g+8, 2r), (g, 2r+8), (g+8, 2r+8)`` (PTX ``mma.m16n8k16`` / ``wgmma`` register
    A). The kernel's constant must map the one onto the other for every lane."""
    from b12x.kernels.wgmma_swap import A_REGISTER_ORDER

    for lane in range(32):
        g, r = lane // 4, lane % 4
        decoded = [(g, 2 * r), (g, 2 * r + 8), (g + 8, 2 * r), (g + 8, 2 * r + 8)]
        a_frag = [(g, 2 * r), (g + 8, 2 * r), (g, 2 * r + 8), (g + 8, 2 * r + 8)]
        assert [decoded[i] for i in A_REGISTER_ORDER] == a_frag


def test_layout_has_no_fragment_buffers():
    lay = swap_ab_layout(bits=4, m_tiles=16, n_tiles=1, warps=8, rows=2, stages=6)
    assert lay.row_pay == 8 * 128 and lay.row_a == 256 * 32 and lay.frag_bytes == 0
    assert lay.total == 6 * 2 * (lay.row_pay + lay.row_a) and lay.period == 6


@pytest.mark.parametrize(
    ("geometry", "field"),
    [
        (dict(warps=6, m_warps=6), "warps"),  # not whole warpgroups
        (dict(m_warps=4), "m_warps"),  # every warp multiplies
        (dict(m_tiles=17), "tiles"),  # 272 tokens > one wgmma's N
        (dict(m_tiles=16, n_tiles=2), "tiles"),  # 256 accumulators per thread
        (dict(smem_stages=3), "smem_stages"),  # the schedule commits 2 steps ahead
        (dict(shared_rows=3), "shared_rows"),
        (dict(m_tiles=16, shared_rows=4, smem_stages=8), "smem_stages"),  # 288 KB
    ],
)
def test_bad_swap_geometry_refused_by_spec_launcher_and_kernel(geometry, field):
    from b12x.formats import resolve_format
    from b12x.kernels.dense_gemm import DenseTrellisGemmKernel

    geo = {**HEADLINE, **geometry}
    with pytest.raises(ValueError, match=field):
        check_swap_ab(
            True, wgmma=True, bits=4, m_tiles=geo["m_tiles"], n_tiles=geo["n_tiles"],
            warps=geo["warps"], m_warps=geo["m_warps"], rows=geo["shared_rows"],
            stages=geo["smem_stages"],
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
    payload = torch.zeros(16, 8 * geo["n_tiles"] * geo["warps"] // 8, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match=field):
        host.trellis_matmul(
            a, payload, "mcg", tiles=(geo["m_tiles"], geo["n_tiles"]), warps=geo["warps"],
            m_warps=geo["m_warps"], shared_rows=geo["shared_rows"],
            smem_stages=geo["smem_stages"], wgmma=True, swap_ab=True,
        )  # fmt: skip


def test_swap_ab_needs_wgmma_a_bool_and_a_gemm():
    with pytest.raises(ValueError, match="wgmma"):
        KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(swap_ab=True, **HEADLINE))
    with pytest.raises(ValueError, match="swap_ab"):
        KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=True, swap_ab=1, **HEADLINE))
    swap = GemmGeometry(wgmma=True, swap_ab=True, **{**HEADLINE, "smem_stages": 6})
    with pytest.raises(ValueError, match="geometry: only a gemm"):
        KernelSpec("decode", "mcg", 4, geometry=swap)
    a = torch.zeros(16, 256, dtype=torch.bfloat16)
    payload = torch.zeros(16, 8, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match="tiles"):
        host.trellis_matmul(a, payload, "mcg", warps=8, m_warps=8, smem_stages=6, wgmma=True,
                            swap_ab=True)  # fmt: skip
    spec = KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=True, swap_ab=True, **HEADLINE))
    assert target_arch(spec, "sm_90") == "sm_90a"
    with pytest.raises(ValueError, match="sm_90"):
        target_arch(spec, "sm_120")


def _remarks(spec):
    from b12x.launch.toolchain import compile_with_remarks

    return compile_with_remarks(*build_kernel(spec), target_arch(spec, "sm_90"), ptx=True)


#: A ``wgmma`` whose A operand is four 32-bit registers and whose B is a descriptor.
REGISTER_A = re.compile(
    r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*"
    r"\{%r\d+, %r\d+, %r\d+, %r\d+\},\s*%rd\d+"
)


@pytest.mark.deep
@pytest.mark.parametrize(("m_tiles", "n_tiles"), [(8, 1), (4, 2)])
def test_compiled_shape(m_tiles, n_tiles):
    spec = KernelSpec(
        "gemm",
        "mcg",
        4,
        geometry=GemmGeometry(
            wgmma=True, swap_ab=True, **{**HEADLINE, "m_tiles": m_tiles, "n_tiles": n_tiles}
        ),
        bf16=True,
    )
    remarks = _remarks(spec)
    assert remarks.spills and max(remarks.spills) == 0, remarks.spills
    # ptxas serializes a wgmma it cannot prove safe (its A registers or accumulators touched
    # while it is in flight): the decode would no longer overlap the tensor cores
    for remark in ("C7510", "C7520", "serialized"):
        assert remark not in remarks.log, remark
    ptx = remarks.ptx
    assert ".target sm_90a" in ptx
    period, rows = 6, 2  # lcm(6 slots, 2 register buffers) steps of 2 K16 rows
    mmas = REGISTER_A.findall(ptx)
    assert mmas == [str(16 * m_tiles)] * (period * rows * n_tiles)
    assert ptx.count("wgmma.mma_async") == len(mmas)  # every MMA reads A from registers
    assert ptx.count("wgmma.fence.sync.aligned") == period
    assert ptx.count("wgmma.commit_group.sync.aligned") == period
    # each step retires the previous step's MMAs (not its own) before decoding the next step
    assert ptx.count("wgmma.wait_group.sync.aligned 1") == period
    assert ptx.count("wgmma.wait_group.sync.aligned 0") == 1  # at the exit
    assert ptx.count("bar.sync") == 1 + period  # prologue + one per step
    # the prologue waits for steps 0 and 1 (6 slots: 5 groups, 3 pending), every step for
    # step + 2 (2 pending), the exit for all
    waits = re.findall(r"cp\.async\.wait_group (\d+);", ptx)
    assert sorted(waits) == sorted(["3"] + ["2"] * period + ["0"]), waits
    assert ptx.count("fence.proxy.async.shared::cta") == 1 + period
    assert "stmatrix" not in ptx and "mma.sync" not in ptx  # weights never touch shared memory
    # the column-pair epilogue: one butterfly swap per pair of stored values
    assert ptx.count("shfl.sync.bfly") == n_tiles * m_tiles * 4
