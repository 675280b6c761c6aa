"""CPU: the shared decode on Hopper tensor cores (``wgmma``) — geometry rules, operand layout,
target arch, and the compiled shape.

What a GPU cannot be trusted to show by a passing number, these show without one: the A-region
permutation puts every activation row where the warpgroup MMA's descriptor reads it (a
bijection onto core matrices, each warp's rows in its own 16-row slice of the MMA); bad
geometries are refused by spec, launcher and kernel alike; a ``wgmma`` spec compiles only for
the arch-specific sm_90a target; and the compiled kernel keeps the MMAs asynchronous (ptxas
reports no serialization, the C7520 remark), spill-free, at most 128 registers (two CTAs of
256 threads per SM), with the async-proxy fence and one ``stmatrix`` per decoded tile. The
numerics (against a float32 reference, every codebook) are GPU checks:
``tests/b12x/test_dense_wgmma_gpu.py``.
"""

from __future__ import annotations

import re

import pytest
import torch

from b12x import support
from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.shared_layout import check_wgmma_geometry, fitting_slots
from b12x.launch import host
from b12x.launch.specs import KernelSpec, build_kernel, target_arch

HEADLINE = dict(m_tiles=1, n_tiles=1, warps=8, m_warps=8, shared_rows=2, smem_stages=3)


def _mainloop(m_tiles: int = 1, n_tiles: int = 1):
    from b12x.formats import resolve_format
    from b12x.kernels.wgmma_decode import WgmmaDecodeMainloop

    rows, stages = fitting_slots(bits=4, m_tiles=m_tiles, n_tiles=n_tiles, warps=8, m_warps=8)
    return WgmmaDecodeMainloop(
        resolve_format("mcg", 4), 4, bf16=True, m_tiles=m_tiles, n_tiles=n_tiles, warps=8,
        rows=rows, stages=stages,
    )  # fmt: skip


@pytest.mark.parametrize("m_tiles", [1, 2])
def test_a_rows_land_where_the_warpgroup_mma_reads_them(m_tiles):
    """Chunk c (half c % 2 of CTA row c // 2) must land in the core matrix the descriptor of
    its warpgroup's A tile addresses for that row, and no two chunks may share a slot."""
    from b12x.kernels.wgmma_decode import A_TILE_BYTES

    loop = _mainloop(m_tiles)
    cta_m = loop.layout.cta_m
    assert cta_m == 16 * m_tiles * 8 and loop.layout.row_a == cta_m * 32
    seen = {}
    for c in range(2 * cta_m):
        row, half = divmod(c, 2)
        warp = row // (16 * m_tiles)  # the warp whose accumulators hold this row
        mt = (row % (16 * m_tiles)) // 16
        tile = (warp // 4) * m_tiles + mt  # its warpgroup's MMA number mt
        i = 16 * (warp % 4) + row % 16  # warp q of a warpgroup owns MMA rows 16q..16q+15
        want = tile * A_TILE_BYTES + (i // 8) * 256 + half * 128 + (i % 8) * 16
        got = loop._a_chunk_offset(c)
        assert got == want, (c, got, want)
        assert got not in seen, (c, seen.get(got))
        seen[got] = c
    assert sorted(seen) == list(range(0, loop.layout.row_a, 16))  # a bijection onto the region


def test_live_rows_are_skipped_per_warpgroup():
    loop = _mainloop(m_tiles=2)
    assert [loop.live_row0(w) for w in range(8)] == [0] * 4 + [128] * 4


@pytest.mark.parametrize(
    ("geometry", "field"),
    [
        (dict(n_tiles=1, warps=6, m_warps=6), "warps"),  # not whole warpgroups
        (dict(n_tiles=1, warps=8, m_warps=2), "m_warps"),  # multiplying warps: warpgroups
        (dict(n_tiles=1, warps=8, m_warps=4), "warps"),  # 4 helpers: 256 registers at launch
        (dict(n_tiles=4, warps=8, m_warps=8), "n_tiles"),  # 512 columns > one wgmma
    ],
)
def test_bad_wgmma_geometry_refused_by_spec_launcher_and_kernel(geometry, field):
    from b12x.formats import resolve_format
    from b12x.kernels.dense_gemm import DenseTrellisGemmKernel

    with pytest.raises(ValueError, match=field):
        check_wgmma_geometry(**geometry, helpers=True)
    geo = {**HEADLINE, **geometry, "smem_stages": 4, "shared_rows": 1}
    with pytest.raises(ValueError, match=field):
        KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=True, **geo))
    with pytest.raises(ValueError, match=field):
        DenseTrellisGemmKernel(
            resolve_format("mcg", 4),
            4,
            GemmGeometry(wgmma=True, **geo),
            bf16=True,
            write_partials=False,
        )
    a = torch.zeros(16, 256, dtype=torch.bfloat16)  # CPU tensors: refused before any device
    payload = torch.zeros(16, 16 * geo["n_tiles"] * geo["warps"] // 16, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match=field):
        host.trellis_matmul(
            a, payload, "mcg", tiles=(geo["m_tiles"], geo["n_tiles"]), warps=geo["warps"],
            m_warps=geo["m_warps"], shared_rows=geo["shared_rows"],
            smem_stages=geo["smem_stages"], wgmma=True,
        )  # fmt: skip


def test_the_launcher_wants_explicit_tiles_for_wgmma():
    a = torch.zeros(16, 256, dtype=torch.bfloat16)  # CPU tensors: refused before any device
    payload = torch.zeros(16, 16, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match="tiles"):
        host.trellis_matmul(
            a, payload, "mcg", warps=8, m_warps=8, shared_rows=2, smem_stages=3, wgmma=True
        )
    with pytest.raises(ValueError, match="wgmma"):
        host.trellis_matmul(a, payload, "mcg", tiles=(1, 2), warps=8, m_warps=8, smem_stages=3,
                            wgmma="yes")  # fmt: skip


def test_wgmma_is_a_gemm_shared_decode_only():
    with pytest.raises(ValueError, match="geometry: only a gemm"):
        KernelSpec("decode", "mcg", 4, geometry=GemmGeometry(wgmma=True, **HEADLINE))
    with pytest.raises(ValueError, match="wgmma"):
        KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=1))
    with pytest.raises(ValueError, match="m_warps"):  # the per-warp decode has no wgmma
        KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=True, warps=8))


def test_target_arch():
    spec = KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=True, **HEADLINE))
    assert target_arch(spec, "sm_90") == "sm_90a"
    assert (
        target_arch(KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(**HEADLINE)), "sm_90")
        == "sm_90"
    )
    for arch in ("sm_80", "sm_120"):
        with pytest.raises(ValueError, match="sm_90"):
            target_arch(spec, arch)


def _remarks(spec):
    from b12x.launch.toolchain import compile_with_remarks

    return compile_with_remarks(*build_kernel(spec), target_arch(spec, "sm_90"), ptx=True)


@pytest.mark.deep
def test_compiled_shape():
    spec = KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(wgmma=True, **HEADLINE), bf16=True)
    remarks = _remarks(spec)
    assert remarks.spills and max(remarks.spills) == 0, remarks.spills
    assert remarks.registers and max(remarks.registers) <= 128  # 2 CTAs of 256 per SM
    # ptxas serializes wgmma it cannot prove safe (e.g. issued on a divergent path): the
    # decode would no longer overlap the tensor cores
    assert "C7520" not in remarks.log and "serialized" not in remarks.log
    ptx = remarks.ptx
    assert ".target sm_90a" in ptx
    period, rows = 6, 2  # lcm(3 slots, 2 buffers) steps of 2 K16 rows per loop iteration
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == period * rows
    assert ptx.count("wgmma.commit_group.sync.aligned") == period
    # each step waits for the previous MMAs before its barrier, and once more at the exit
    assert ptx.count("wgmma.wait_group.sync.aligned 0") == period + 1
    assert ptx.count("fence.proxy.async.shared::cta") == period
    assert ptx.count("bar.sync") == 1 + period
    # one stmatrix per decoded tile: prologue rows + every step's next rows
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == rows + period * rows
    assert "mma.sync" not in ptx


@pytest.mark.deep
def test_tall_and_wide_geometries_compile_spill_free():
    for m_tiles, n_tiles, n in ((2, 1, 128), (1, 2, 256)):
        rows, stages = fitting_slots(bits=4, m_tiles=m_tiles, n_tiles=n_tiles, warps=8, m_warps=8)
        spec = KernelSpec(
            "gemm",
            "mcg",
            4,
            geometry=GemmGeometry(
                wgmma=True,
                m_tiles=m_tiles,
                n_tiles=n_tiles,
                warps=8,
                m_warps=8,
                shared_rows=rows,
                smem_stages=stages,
            ),
            bf16=False,
        )
        report = support.compile_specialization(spec, "sm_90")
        assert report.spill_bytes == 0, (m_tiles, n_tiles, report.spill_bytes)
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in report.ptx


def test_a_zero_payload_decodes_to_finite_weights_in_every_format():
    """The wgmma mainloop multiplies rows past the K range (zero-filled activations) against a
    decoded zero-filled payload instead of branching around them: 0 x w is an exact zero only
    if every codebook decodes the all-zero stream to finite weights (no inf/NaN)."""
    from b12x.formats import resolve_format
    from reference import trellis as ref_trellis

    checked = 0
    for codebook in ("3inst", "mcg", "mul1", "sqg_e4m3", "sqg_fp16"):
        for bits in resolve_format(codebook).legal_bits:
            zeros = torch.zeros(1, 1, 16 * bits, dtype=torch.int16)
            weights = ref_trellis.decode(zeros, codebook)
            assert weights.shape == (16, 16)
            assert torch.isfinite(weights.float()).all(), (codebook, bits)
            checked += 1
    assert checked >= 5 * 3


def test_only_a_kernel_with_helpers_takes_them():
    """The MoE GEMM runs no decode-only helper warps: without ``helpers`` every warp must
    multiply (the MoE kernel's own check), with it the dense GEMM's 8 + 8 geometry passes."""
    with pytest.raises(ValueError, match="m_warps"):
        check_wgmma_geometry(n_tiles=1, warps=16, m_warps=8)
    check_wgmma_geometry(n_tiles=1, warps=16, m_warps=8, helpers=True)


def test_helper_registers_split_one_register_file():
    """Multiplying threads ask for 184 registers, helpers share the rest of one SM's 64 K; each
    role's count must be reachable from the launch's (setmaxnreg only raises or only lowers)."""
    from b12x.kernels.shared_layout import SM_REGISTERS, helper_registers

    for warps, m_warps in ((16, 8), (12, 8)):
        mma, helper = helper_registers(warps=warps, m_warps=m_warps)
        launch = SM_REGISTERS // (32 * warps) // 8 * 8
        assert mma % 8 == 0 and helper % 8 == 0 and helper <= launch <= mma
        assert 32 * (m_warps * mma + (warps - m_warps) * helper) <= SM_REGISTERS
    assert helper_registers(warps=16, m_warps=8) == (184, 72)
    with pytest.raises(ValueError, match="warps"):  # 12 x 184 leaves the helpers nothing
        helper_registers(warps=16, m_warps=12)


@pytest.mark.deep
def test_helper_geometry_compiles_warp_specialised():
    """8 multiplying warps and 8 decode-only helpers (128 x 256 per CTA): spill-free at the
    launch's 128 registers, the two roles set 184 / 72 with setmaxnreg, each role's loop
    meets the CTA barrier and fences its shared-memory writes once per step (a role that
    skipped one would deadlock or race), and no MMA is serialized (C7520)."""
    spec = KernelSpec(
        "gemm",
        "mcg",
        4,
        geometry=GemmGeometry(
            wgmma=True, m_tiles=1, n_tiles=1, warps=16, m_warps=8, shared_rows=2, smem_stages=4
        ),
        bf16=True,
    )
    remarks = _remarks(spec)
    assert remarks.spills and max(remarks.spills) == 0, remarks.spills
    assert remarks.registers and max(remarks.registers) <= 128  # 512 threads: 128 at launch
    assert "C7520" not in remarks.log and "C7508" not in remarks.log  # serialized / ignored
    ptx = remarks.ptx
    assert re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx) == [
        ("inc", "184"),
        ("dec", "72"),
    ]
    period, rows = 4, 2  # lcm(4 slots, 2 buffers) steps of 2 K16 rows per loop iteration
    # the 256 columns as two m64n128 per K16 row (an m64n256 needs 154 registers at launch)
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16") == 2 * period * rows
    assert "m64n256k16" not in ptx
    assert ptx.count("bar.sync") == 2 * (1 + period)  # prologue + every step, in both roles
    assert ptx.count("fence.proxy.async.shared::cta") == 2 * period
    # every warp decodes its N16 tile: prologue rows + every step's next rows, in both roles
    assert ptx.count("stmatrix.sync.aligned.m8n8.x4.shared.b16") == 2 * (rows + period * rows)
