"""CPU: the dense GEMM's shared-decode mainloop — geometry checks, layout, and its compiled shape.

The mainloop (``m_warps`` >= 1, :mod:`b12x.kernels.dense_gemm` "Shared decode") is checked here
without a GPU: bad geometries are refused before any compile or launch (by the spec, the
launcher and the kernel alike), the shared-memory layout matches a hand count, and the compiled
kernel has the shape the docstring promises — spill-free, one barrier per pipelined step
(``1 + period`` in all: the prologue's and one per unrolled step), the decoded fragments stored
and read back as 16-byte vectors, activations and payload brought in by ``cp.async``. Its
numerics (bit-identical to the per-warp mainloop) are GPU checks:
``tests/b12x/test_dense_shared_decode_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from b12x import support
from b12x.kernels.geometry import GemmGeometry
from b12x.launch import host
from b12x.launch.specs import KernelSpec

HEADLINE = dict(m_tiles=2, n_tiles=1, warps=8, m_warps=4, shared_rows=2, smem_stages=3)


def test_one_rule_for_kernel_and_layout():
    from b12x.kernels import dense_gemm, shared_layout

    assert dense_gemm.check_shared_decode is shared_layout.check_shared_decode
    assert dense_gemm.shared_decode_layout is shared_layout.shared_decode_layout


def test_layout_matches_a_hand_count():
    from b12x.kernels.dense_gemm import shared_decode_layout

    lay = shared_decode_layout(bits=4, m_tiles=2, n_tiles=1, warps=8, m_warps=4, rows=2, stages=3)
    # 8 N16 tiles x 32·4 B of payload and 128 rows x 32 B of A per K16 row; 2 rows per slot
    assert (lay.cta_tiles, lay.mma_tiles, lay.cta_m) == (8, 4, 128)
    assert (lay.row_pay, lay.row_a, lay.a_offset) == (1024, 4096, 2048)
    assert lay.slot_bytes == 2 * (1024 + 4096)
    assert lay.frag_offset == 3 * 10240
    assert lay.frag_bytes == 2 * 8 * 512
    assert lay.total == 30720 + 2 * 8192 == 47104
    assert (lay.pay_chunks, lay.pay_rounds, lay.a_chunks, lay.a_rounds) == (64, 1, 256, 1)
    assert lay.period == 6  # lcm(3 slots, 2 fragment buffers)
    k6 = shared_decode_layout(bits=6, m_tiles=1, n_tiles=2, warps=4, m_warps=2, rows=1, stages=4)
    # 8 tiles x 192 B = 96 chunks on 128 threads; 32 rows x 2 halves = 64 A chunks
    assert (k6.pay_chunks, k6.pay_rounds, k6.a_chunks, k6.a_rounds) == (96, 1, 64, 1)
    assert k6.period == 4


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"m_warps": 3}, "m_warps"),  # does not divide 8 warps
        ({"m_warps": -1}, "m_warps"),
        ({"m_warps": True}, "m_warps"),
        ({"shared_rows": 3}, "shared_rows"),
        ({"smem_stages": 2}, "smem_stages"),  # the pipeline needs a slot for step + 1
        ({"smem_stages": 0}, "smem_stages"),
    ],
)
def test_bad_geometry_refused_by_spec_launcher_and_kernel(change, field):
    from b12x.formats import resolve_format
    from b12x.kernels.dense_gemm import DenseTrellisGemmKernel

    geo = {**HEADLINE, **change}
    with pytest.raises(ValueError, match=field):
        KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(**geo))
    with pytest.raises(ValueError, match=field):
        DenseTrellisGemmKernel(
            resolve_format("mcg", 4), 4, GemmGeometry(**geo), bf16=True, write_partials=False
        )
    # the launcher refuses before it looks at a device (CPU tensors here)
    a = torch.zeros(16, 256, dtype=torch.bfloat16)
    payload = torch.zeros(16, 8, 64, dtype=torch.int16)
    with pytest.raises(ValueError, match=field):
        host.trellis_matmul(
            a, payload, "mcg", tiles=(geo["m_tiles"], geo["n_tiles"]), warps=geo["warps"],
            m_warps=geo["m_warps"], shared_rows=geo["shared_rows"], smem_stages=geo["smem_stages"],
        )  # fmt: skip


def test_oversized_layout_refused():
    from b12x.formats import resolve_format
    from b12x.kernels.dense_gemm import DenseTrellisGemmKernel

    # 2 x 2 tiles per warp, 2 rows per slot, 3 slots: 68 KB, past the 48 KB a launch gets
    with pytest.raises(ValueError, match="69632 B of shared memory"):
        DenseTrellisGemmKernel(
            resolve_format("mcg", 4),
            4,
            GemmGeometry(**{**HEADLINE, "n_tiles": 2}),
            bf16=True,
            write_partials=False,
        )


@pytest.mark.deep
def test_compiled_shape():
    spec = KernelSpec("gemm", "mcg", 4, geometry=GemmGeometry(**HEADLINE), bf16=True)
    report = support.compile_specialization(spec, "sm_90")
    assert report.spill_bytes == 0, report.spill_bytes
    assert report.registers is not None and report.registers <= 128  # 2 CTAs of 256 per SM
    ptx = report.ptx
    # the prologue's barrier, then one per unrolled step (period = lcm(3, 2) = 6)
    assert ptx.count("bar.sync") == 1 + 6, ptx.count("bar.sync")
    # three slots: the prologue waits until step 0 has landed (1 pending group), every step
    # until step + 1 has (0 pending), the exit drains (0): one group short would be a race
    assert ptx.count("cp.async.wait_group 1") == 1
    assert ptx.count("cp.async.wait_group 0") == 6 + 1
    assert "st.shared.v4.u32" in ptx and "ld.shared.v4.u32" in ptx
    assert "cp.async.ca.shared.global" in ptx  # activations (several warps re-read them)
    assert "cp.async.cg.shared.global" in ptx  # payload (streamed)
    # per step: 2 M16 blocks x 4 N16 tiles x 2 n-blocks per warp, six steps per iteration
    assert ptx.count("mma.sync.aligned.m16n8k16") >= 6 * 2 * 4 * 2
