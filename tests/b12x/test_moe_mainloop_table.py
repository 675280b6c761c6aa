"""CPU: the grouped GEMMs' shared decode — plan, spec, layout and compile (issue 15).

The table's generic checks (boundaries, reachability, moved thresholds) run with every MoE table
in ``test_moe_dispatch.py``; here: what ``plan_moe`` does with the table's answer (block size,
specs, the device's shared memory, pins), the spec's refusals, the fold region's layout, and
the compiled kernel (spill-free, registers for two CTAs per SM, the fold's shared-memory
traffic in the PTX). Bit-identity with the per-warp mainloop is a GPU test
(``test_moe_shared_decode_gpu.py``).
"""

from __future__ import annotations

import re

import pytest
import torch

from b12x import support
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.kernels.shared_layout import SMEM_LIMIT, fold_bytes, shared_decode_layout
from b12x.ops.moe.plan import plan_moe
from b12x.ops.moe.tiers import plan_tiered_moe
from oracle.judge.tiles import SimulatedDevice

H200 = SimulatedDevice("H200", 132, 232448, (9, 0))
A100 = SimulatedDevice("A100", 108, 166912, (8, 0))
SM120 = SimulatedDevice("sm120", 188, 101376, (12, 0))
GLM = dict(
    top_k=8, hidden=5120, intermediate=1536, codebook="mcg", bits=4, num_experts=128,
    w13_layout="packed", x_dtype=torch.bfloat16,
)  # fmt: skip
WIDE_K4 = MoeGemmSpec(
    "mcg", 4, False, m_tiles=2, n_tiles=1, warps=8, m_warps=4, shared_rows=2, smem_stages=3,
    k_split=4,
)  # fmt: skip


def _mainloop(plan):
    (decision,) = [d for d in plan.decisions if d.role == "mainloop"]
    return decision


def test_glm_prefill_plans_the_wgmma_shared_decode_on_an_h200():
    plan = plan_moe(m=1024, **GLM, device=H200)  # 64 routes per expert
    assert _mainloop(plan).path == "tensor_core"
    assert plan.routes.block_size == 128
    fc1, fc2 = plan.fc1_spec[0], plan.fc2_spec[0]
    assert all(s.wgmma for s in (fc1, fc2))
    assert (fc1.m_tiles, fc1.n_tiles, fc1.warps, fc1.m_warps) == (1, 2, 8, 8)  # 128 x 256
    assert (fc1.shared_rows, fc1.smem_stages, fc1.k_split, fc2.k_split) == (2, 4, 8, 4)
    # 4 slots x 2 rows x (2 KB payload + 4 KB rows) + 2 x 2 x 16 decoded tiles + the fold
    # (128 accumulators x 256 threads x 4 B)
    assert fc1.smem_bytes == 4 * 2 * (2048 + 4096) + 2 * 2 * 16 * 512 + 128 * 1024
    # from 48 routes per expert on sm_90 (the tensor row's own measured threshold)
    assert _mainloop(plan_moe(m=768, **GLM, device=H200)).path == "tensor_core"
    below = plan_moe(m=767, **GLM, device=H200)
    assert _mainloop(below).path == "few_routes"
    assert not any(s.wgmma or s.m_warps for s in below.kernel_specs)


def test_glm_prefill_plans_the_shared_decode_on_an_sm80():
    plan = plan_moe(m=1024, **GLM, device=A100)  # 64 routes per expert
    assert _mainloop(plan).path == "shared_wide"
    assert plan.routes.block_size == 128
    fc1, fc2 = plan.fc1_spec[0], plan.fc2_spec[0]
    assert (fc1.m_warps, fc1.k_split, fc2.k_split) == (4, 8, 4)  # K_SPLIT: the fold order
    assert fc1.block_size == fc2.block_size == 128
    assert fc1.smem_bytes == fc2.smem_bytes == SMEM_LIMIT - 2048 + 64 * 1024  # 46 KB + fold
    below = plan_moe(m=1023, **GLM, device=A100)
    assert _mainloop(below).path == "few_routes"
    assert all(s.m_warps == 0 for s in below.kernel_specs)
    assert below.routes.block_size == 64  # the route-block table's m_tiles 4


@pytest.mark.parametrize(
    "device, path",
    [(None, "no_room"), (SM120, "no_room"), (A100, "shared_wide"), (H200, "tensor_core")],
)
def test_the_device_must_grant_the_fold(device, path):
    plan = plan_moe(m=4096, **GLM, device=device)
    assert _mainloop(plan).path == path
    assert all((s.m_warps > 0) == (path != "no_room") for s in plan.kernel_specs)
    assert all(s.wgmma == (path == "tensor_core") for s in plan.kernel_specs)


def test_the_tensor_row_needs_sm90_even_where_its_fold_would_fit():
    big = SimulatedDevice("sm80-big", 108, 232448, (8, 0))  # the H200's opt-in, not its arch
    plan = plan_moe(m=4096, **GLM, device=big)
    assert _mainloop(plan).path == "shared_wide"
    assert not any(s.wgmma for s in plan.kernel_specs)


def test_an_h200_short_of_the_tensor_fold_takes_the_wide_geometry():
    short = SimulatedDevice("H200-short", 132, 229375, (9, 0))  # 1 B below the K8 tensor need
    assert _mainloop(plan_moe(m=4096, **GLM, device=short)).path == "shared_wide"


def test_the_tensor_pin_needs_an_sm90_device():
    for device in (None, A100, SM120):
        with pytest.raises(ValueError, match="shared_decode: 'tensor' multiplies with wgmma"):
            plan_moe(m=4096, **GLM, shared_decode="tensor", device=device)
    plan = plan_moe(m=8, **GLM, shared_decode="tensor", device=H200)
    assert _mainloop(plan).path == "pinned" and all(s.wgmma for s in plan.kernel_specs)


def test_a_pin_is_refused_before_launch_where_it_cannot_run():
    with pytest.raises(ValueError, match=r"shared_decode: .*112640 B.*101376 B"):
        plan_moe(m=4096, **GLM, shared_decode="wide", device=SM120)
    # unknown device: the pin is the caller's word; a known one that grants it: planned
    for device in (None, H200, A100):
        plan = plan_moe(m=8, **GLM, shared_decode="wide", device=device)
        assert _mainloop(plan).path == "pinned" and plan.routes.block_size == 128
    off = plan_moe(m=4096, **GLM, shared_decode="off", device=H200)
    assert not any(s.wgmma for s in off.kernel_specs)
    assert _mainloop(off).path == "pinned" and all(s.m_warps == 0 for s in off.kernel_specs)
    with pytest.raises(ValueError, match="shared_decode"):
        plan_moe(m=8, **GLM, shared_decode="thin", device=H200)


def test_pairs_pins_and_tiers():
    paired = plan_moe(m=4096, **{**GLM, "bits": 3}, fc2_pair="P33", device=H200)
    assert _mainloop(paired).path == "tensor_core"  # the pair shared decode (pair_decode)
    assert all(s.wgmma and s.m_warps == 8 for s in paired.kernel_specs)
    odd = plan_moe(m=4096, **{**GLM, "bits": 3}, fc1_pair="P43", device=H200)
    assert _mainloop(odd).path == "paired_odd" and not any(s.m_warps for s in odd.kernel_specs)
    pinned = plan_moe(m=4096, **GLM, m_tiles=2, device=H200)
    assert _mainloop(pinned).path == "pinned_m_tiles" and pinned.routes.block_size == 32
    tiers = plan_tiered_moe(
        m=4096, top_k=8, hidden=5120, intermediate=1536, codebook="mcg", tier0_bits=3,
        tier1_bits=4, tier0_experts=64, tier1_experts=64, num_global_experts=128,
        w13_layout="packed", x_dtype=torch.bfloat16, compute_dtype=torch.float16, device=H200,
    )  # fmt: skip
    assert [s.bits for s in tiers.fc1_spec] == [3, 4]
    assert all(s.wgmma and s.m_warps == 8 and s.block_size == 128 for s in tiers.kernel_specs)


def test_spec_refusals_name_the_field():
    base = dict(codebook="mcg", bits=4, bf16=False, m_tiles=2, n_tiles=1, warps=8)
    with pytest.raises(ValueError, match="smem_stages: the shared-decode mainloop needs 3..4"):
        MoeGemmSpec(**base, m_warps=4, smem_stages=0)
    with pytest.raises(ValueError, match="smem_stages: the per-warp grouped GEMM"):
        MoeGemmSpec(**base, smem_stages=3)
    with pytest.raises(ValueError, match="m_warps: 3 does not divide warps=8"):
        MoeGemmSpec(**base, m_warps=3, smem_stages=3)
    with pytest.raises(
        ValueError, match="m_warps: the paired kernel.s shared decode multiplies with wgmma"
    ):
        MoeGemmSpec(
            "mcg", 3, False, m_tiles=1, n_tiles=2, warps=8, pair="P33", rate_axis="n",
            m_warps=2, smem_stages=3,
        )  # fmt: skip
    with pytest.raises(ValueError, match="warps/k_split"):  # 3 x 3 K6 slots: past the 48 KB
        MoeGemmSpec(**{**base, "bits": 6}, m_warps=4, shared_rows=4, smem_stages=4)


def test_spec_geometry_of_the_shared_decode():
    assert (WIDE_K4.block_size, WIDE_K4.cta_threads, WIDE_K4.n_group) == (128, 256, 128)
    layout = WIDE_K4.shared_layout
    plain = shared_decode_layout(bits=4, m_tiles=2, n_tiles=1, warps=8, m_warps=4, rows=2, stages=3)
    assert layout.fold_bytes == fold_bytes(m_tiles=2, n_tiles=1, warps=8, m_warps=4) == 65536
    assert layout.fold_offset == plain.total and layout.fold_offset % 16 == 0
    assert WIDE_K4.smem_bytes == layout.total == plain.total + 65536
    unsplit = MoeGemmSpec(
        "mcg", 4, False, m_tiles=2, n_tiles=1, warps=8, m_warps=4, smem_stages=3, k_split=1
    )
    assert unsplit.shared_layout.fold_bytes == 0 and unsplit.smem_bytes == plain.total


@pytest.mark.deep
def test_wide_spec_compiles_for_two_ctas_per_sm_without_spills():
    """The fold lives in shared memory, not in a second accumulator set: in registers it took
    169 per thread (one 256-thread CTA per SM, H200: 18.3 ms per step at M = 4096 against 15.0 ms
    with the fold in shared memory)."""
    report = support.compile_specialization(WIDE_K4, "sm_90")
    assert report.spill_bytes == 0
    assert report.registers <= 128, report.registers  # 2 x 256 threads in 64K registers
    unsplit = support.compile_specialization(
        MoeGemmSpec("mcg", 4, False, m_tiles=2, n_tiles=1, warps=8, m_warps=4, smem_stages=3),
        "sm_90",
    )

    def count(ptx, op):
        return len(re.findall(op, ptx))

    # the fold: 16 groups of 4 accumulators stored at a slice end (two code paths: first slice,
    # later slices; in each of the loop body's unrolled steps) and loaded by the later-slice path
    # and by the final addition; the unsplit spec has none of it
    steps = WIDE_K4.shared_layout.period
    stores = count(report.ptx, r"st\.shared\.v4") - count(unsplit.ptx, r"st\.shared\.v4")
    loads = count(report.ptx, r"ld\.shared\.v4") - count(unsplit.ptx, r"ld\.shared\.v4")
    assert (stores, loads) == (steps * 2 * 16, steps * 16 + 16), (stores, loads)


def test_the_gpu_default_job_judges_the_shared_decode():
    """The default job's GPU grid (oracle.run.grid.select_grid) must reach the shared decode
    through the MoE runner's own problem (which hands the device to the plan, as a serving engine
    does): on an H200, every codebook family, both compute dtypes and M up to 4096."""
    from oracle.run.grid import select_grid
    from oracle.run.runners.inputs import moe_choices
    from oracle.run.runners.moe import moe_problem

    runnable, _ = select_grid()
    shared = []
    for case in runnable:
        v = case.variant
        if v.op != "moe" or v.tier_layout is not None:
            continue  # tiered plans take no device in the runner
        plan = plan_moe(**moe_problem(case, None, moe_choices(case), device=H200))
        if any(spec.m_warps for spec in plan.kernel_specs):
            # on an H200 it is the wgmma tensor geometry (the wide one: GPU tests, pinned)
            assert all(spec.wgmma for spec in plan.kernel_specs), case.case_id
            shared.append(case)
    assert len(shared) >= 20, len(shared)
    assert {c.variant.codebook for c in shared} >= {"mcg", "3inst", "mul1", "sqg_e4m3", "sqg_fp16"}
    assert {c.variant.compute_dtype for c in shared} == {"fp16", "bf16"}
    assert max(c.m for c in shared) == 4096


@pytest.mark.deep
def test_tensor_spec_compiles_spill_free_with_asynchronous_mmas():
    """The wgmma fold waits for the slice's MMAs inside the live-rows branch; ptxas must still
    keep the MMAs asynchronous (no C7520 serialization remark) and spill nothing."""
    from b12x.launch.specs import target_arch
    from b12x.launch.toolchain import compile_with_remarks

    spec = MoeGemmSpec(
        "mcg", 4, True, m_tiles=1, n_tiles=2, warps=8, m_warps=8, shared_rows=2, smem_stages=4,
        k_split=4, wgmma=True,
    )  # fmt: skip
    remarks = compile_with_remarks(*spec_build(spec), target_arch(spec, "sm_90"), ptx=True)
    assert remarks.spills and max(remarks.spills) == 0
    assert "C7520" not in remarks.log
    ptx = remarks.ptx
    steps, rows = spec.shared_layout.period, 2
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") == steps * rows
    # the fold: 32 groups of 4 accumulators (128 per thread) per slice end, two code paths per
    # unrolled step, like the mma.sync fold
    assert ptx.count("st.shared.v4") == steps * 2 * 32
    assert "mma.sync" not in ptx


def spec_build(spec):
    from b12x.launch.kinds import kind_of

    return kind_of(spec).build(spec)
