"""CPU: QSRT pairs on the ``wgmma`` shared decode (:mod:`b12x.kernels.pair_decode`).

* The plan on a simulated sm_90 device puts every paired launch of a step with many routes per
  expert on the pair shared decode, except a step whose FC1 is P43 (odd rate sum); the pins
  that cannot run pairs fail before any launch, naming the cause.
* The spec sizes the slots at :func:`pair_layout_bits` and refuses what the kernel cannot run.
* Compiled for sm_90a: spill-free, the MMAs asynchronous (no C7520 remark), a CTA that fits the
  register file, one ``wgmma`` per 64 rows, K16 row and body in the unrolled loop.
* The GPU default job's grid reaches the pair shared decode through the runner's own problem.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.kernels.pair_decode import pair_layout_bits
from b12x.launch.specs import target_arch
from b12x.launch.toolchain import compile_with_remarks
from b12x.ops.dense.tiles import DeviceLimits
from b12x.ops.moe.plan import plan_moe

H100 = DeviceLimits("H100", 132, 232448, (9, 0))
A100 = DeviceLimits("A100", 108, 166912, (8, 0))
STEP = dict(
    top_k=8, hidden=1024, intermediate=512, codebook="mcg", bits=3, num_experts=16,
    w13_layout="proj", x_dtype=torch.float16, compute_dtype=torch.float16,
)  # fmt: skip


def _pair_spec(pair, axis, *, bf16=False, codebook="mcg"):
    return MoeGemmSpec(
        codebook, 3, bf16, m_tiles=1, n_tiles=2, warps=8, pair=pair, rate_axis=axis, m_warps=8,
        shared_rows=2, smem_stages=4, wgmma=True,
    )  # fmt: skip


@pytest.mark.parametrize("fc1, fc2", [("P33", "P33"), ("P22", "P44"), ("dynamic", "P43"),
                                      (None, "dynamic"), ("P24", None)])  # fmt: skip
def test_many_routes_on_sm90_take_the_pair_shared_decode(fc1, fc2):
    plan = plan_moe(m=128, fc1_pair=fc1, fc2_pair=fc2, device=H100, **STEP)
    assert plan.routes.block_size == 128
    for spec in plan.kernel_specs:
        assert (spec.m_warps, spec.wgmma, spec.block_size) == (8, True, 128), spec
    paired = [s for s in plan.kernel_specs if s.pair is not None]
    assert [s.rate_axis for s in paired] == [a for a, c in (("n", fc1), ("k", fc2)) if c]


@pytest.mark.parametrize("m, device", [(128, A100), (64, H100), (128, None)])
def test_pairs_stay_per_warp_off_sm90_below_the_routes_or_without_a_device(m, device):
    plan = plan_moe(m=m, fc1_pair="P33", fc2_pair="P24", device=device, **STEP)
    assert not any(s.m_warps for s in plan.kernel_specs), plan.kernel_specs
    (mainloop,) = [d for d in plan.decisions if d.role == "mainloop"]
    assert mainloop.path == "paired", mainloop


def test_an_odd_fc1_pair_keeps_the_whole_step_per_warp():
    plan = plan_moe(m=128, fc1_pair="P43", fc2_pair="P33", device=H100, **STEP)
    assert not any(s.m_warps for s in plan.kernel_specs)
    (mainloop,) = [d for d in plan.decisions if d.role == "mainloop"]
    assert mainloop.path == "paired_odd", mainloop


@pytest.mark.parametrize("pin, fc1", [("wide", "P33"), ("tensor", "P43")])
def test_pins_that_cannot_run_pairs_fail_before_launch(pin, fc1):
    with pytest.raises(ValueError, match="cannot run QSRT pairs"):
        plan_moe(m=128, fc1_pair=fc1, fc2_pair="P33", device=H100, shared_decode=pin, **STEP)


def test_layout_bits_and_spec_checks():
    assert pair_layout_bits("n", ((3, 3), (2, 4))) == 3
    assert pair_layout_bits("n", ((4, 4),)) == 4
    assert pair_layout_bits("k", ((3, 3), (2, 4))) == 4
    assert pair_layout_bits("k", ((4, 3),)) == 4
    with pytest.raises(ValueError, match="even rate sum"):
        pair_layout_bits("n", ((4, 3),))
    with pytest.raises(ValueError, match="even rate sum"):
        _pair_spec("P43", "n")
    # the slot row of an N-axis pair is the pair's run: 16 tiles x 32 B x (b_lo + b_hi) / 2
    assert _pair_spec("P24", "n").shared_layout.row_pay == 8 * 32 * 6
    assert _pair_spec("dynamic", "k").shared_layout.row_pay == 16 * 32 * 4
    with pytest.raises(ValueError, match="wgmma"):
        MoeGemmSpec("mcg", 3, False, m_tiles=2, n_tiles=1, warps=8, pair="P33", rate_axis="k",
                    m_warps=4, smem_stages=3)  # fmt: skip


@pytest.mark.deep
@pytest.mark.parametrize(
    "pair, axis, bf16, codebook",
    [("P24", "n", True, "mcg"), ("dynamic", "k", False, "mcg"), ("P43", "k", True, "mcg"),
     ("P22", "n", False, "sqg_e4m3")],
)  # fmt: skip
def test_pair_spec_compiles_spill_free_with_asynchronous_mmas(pair, axis, bf16, codebook):
    from b12x.launch.kinds import kind_of

    spec = _pair_spec(pair, axis, bf16=bf16, codebook=codebook)
    remarks = compile_with_remarks(*kind_of(spec).build(spec), target_arch(spec, "sm_90"), ptx=True)
    assert remarks.spills and max(remarks.spills) == 0
    assert max(remarks.registers) * spec.cta_threads <= 65536, remarks.registers
    assert "C7520" not in remarks.log
    dtype = "bf16" if bf16 else "f16"
    mma = remarks.ptx.count(f"wgmma.mma_async.sync.aligned.m64n256k16.f32.{dtype}.{dtype}")
    bodies = 2 if pair == "dynamic" else 1
    assert mma == bodies * spec.shared_layout.period * spec.shared_rows, mma
    assert "mma.sync" not in remarks.ptx


def test_the_gpu_default_job_judges_the_pair_shared_decode():
    """The default job's GPU grid (oracle.run.grid.select_grid), planned through the MoE
    runner's own problem on an sm_90 device, must put paired cases of both axes and of dynamic
    kinds on the pair shared decode."""
    from oracle.run.grid import select_grid
    from oracle.run.runners.inputs import moe_choices
    from oracle.run.runners.moe import moe_problem

    runnable, _ = select_grid()
    axes, kinds = set(), set()
    for case in runnable:
        choices = moe_choices(case)
        if case.variant.op != "moe" or (choices.fc1_pair, choices.fc2_pair) == (None, None):
            continue
        plan = plan_moe(**moe_problem(case, None, choices, device=H100))
        for spec in plan.kernel_specs:
            if spec.pair is not None and spec.m_warps:
                axes.add(spec.rate_axis)
                kinds.add(spec.pair)
    assert axes == {"n", "k"}, axes
    assert kinds >= {"P22", "P33", "P24", "P43", "P44", "dynamic"}, kinds


@pytest.mark.deep
@pytest.mark.parametrize("axis", ["n", "k"])
def test_a_dynamic_launch_allocates_its_shared_memory_once(axis, smem_allocations):
    """Both bodies of a dynamic launch run one layout, so the kernel allocates it once: the
    launch grants ``spec.smem_bytes`` and an allocation per body would use twice that (the DSL
    then reports it at run time and the second body writes past the grant)."""
    from b12x.launch.kinds import kind_of

    spec = _pair_spec("dynamic", axis)
    compile_with_remarks(*kind_of(spec).build(spec), target_arch(spec, "sm_90"))
    assert smem_allocations == [spec.smem_bytes], smem_allocations


@pytest.mark.deep
@pytest.mark.parametrize("axis", ["n", "k"])
def test_a_folding_pair_shared_decode_compiles_within_the_grant(axis, smem_allocations):
    """``k_split`` 2 on the pair shared decode (the per-warp pair kernel's K-group order as a
    fold): spill-free, one allocation of ``spec.smem_bytes`` with the fold region inside the
    sm_90 opt-in limit, and more code than the unsplit spec (the fold is compiled in). Planted:
    the kernel not passing ``k_split`` to the decode compiles the unsplit code, whose PTX is
    the same length as the unsplit spec's."""
    from b12x.launch.kinds import kind_of

    plain = _pair_spec("dynamic", axis)
    spec = dataclasses.replace(plain, k_split=2)
    assert spec.smem_bytes > plain.smem_bytes and spec.smem_bytes <= 227 * 1024
    r = compile_with_remarks(*kind_of(spec).build(spec), target_arch(spec, "sm_90"))
    assert sum(r.spills) == 0 and max(r.registers) <= 255
    assert smem_allocations == [spec.smem_bytes], smem_allocations
    base = compile_with_remarks(*kind_of(plain).build(plain), target_arch(plain, "sm_90"))
    assert len(r.ptx) > len(base.ptx)
