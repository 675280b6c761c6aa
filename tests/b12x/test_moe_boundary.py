"""CPU: the MoE boundary kernels (:mod:`b12x.kernels.moe_boundary`) compile spill-free for sm_90
(sm_80 / sm_120 in the slow sweep) with uncontracted ``.rn`` fp32 arithmetic, their specs
validate, they resolve through the runtime compile cache, the launch wrappers reject bad
arguments before any compile, and the kernels' lane butterfly order is bit-identical to the
torch path's :func:`b12x.ops.moe.boundary.h128_fp32_` (an fp32 emulation of the lane algorithm).
"""

from __future__ import annotations

import collections
import re

import pytest
import torch

from b12x.kernels.butterfly import GROUP_LANES, GROUP_OFFSETS, lane_words
from b12x.kernels.moe_boundary import H128_SCALE_FP32, MoeBoundarySpec
from b12x.launch import kinds
from b12x.launch.moe_boundary import build_moe_boundary
from b12x.launch.toolchain import compile_with_remarks
from b12x.ops.moe import boundary, routing
from b12x.ops.moe.plan import plan_moe
from b12x.runtime import compile_cache
from oracle.pytest_plugin import slow_sweep

ARCHES = ("sm_80", "sm_90", "sm_120")
SPECS = (
    MoeBoundarySpec("rotate", False, False),
    MoeBoundarySpec("rotate", True, True, proj=True),
    MoeBoundarySpec("activate", False, False),
    MoeBoundarySpec("activate", True, True),
    MoeBoundarySpec("reduce", False, False, top_k=8),
    MoeBoundarySpec("reduce", True, False, top_k=3),
    MoeBoundarySpec("pack", False, False),
)


def _compile(spec: MoeBoundarySpec, arch: str):
    """(PTX, registers, spill bytes) of ``spec`` compiled for ``arch`` with ptxas remarks."""
    r = compile_with_remarks(*build_moe_boundary(spec), arch)
    return r.ptx, list(r.registers), list(r.spills)


def _spec_id(spec: MoeBoundarySpec) -> str:
    return f"{spec.kind}-{spec.in_bf16}-{spec.out_bf16}"


@pytest.mark.deep
@pytest.mark.parametrize("spec", SPECS, ids=_spec_id)
def test_boundary_kernels_compile_without_spills(spec):
    _check_boundary_compile(spec, "sm_90")


@pytest.mark.slow
@slow_sweep(
    ("spec", "arch"), [(s, a) for a in ARCHES if a != "sm_90" for s in SPECS],
    lambda p: f"{_spec_id(p[0])}-{p[1]}",
    reason="the boundary kernels' other arches run only when selected with -m slow",
)  # fmt: skip
def test_boundary_kernels_compile_without_spills_on_other_arches(spec, arch):
    _check_boundary_compile(spec, arch)


def _check_boundary_compile(spec: MoeBoundarySpec, arch: str) -> None:
    ptx, regs, spills = _compile(spec, arch)
    assert re.search(rf"\.target {arch}\b", ptx)
    assert regs and 0 < max(regs) <= 128, regs
    assert spills and sum(spills) == 0, spills
    if spec.kind == "pack":  # integer work only: the scan's five up-shuffles, no float op
        assert ptx.count("shfl.sync.up") == 5 and ".f32" not in ptx and "fma" not in ptx
        # ranks come from ordered walks: no atomic or reduction instruction
        assert not re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", ptx, re.M)
        return
    # Three xor-shuffle stages of a lane's 16 values per H128 (b12x.kernels.butterfly; activate
    # runs three butterflies per route, reduce one per slot, rotate one per projection), each
    # value's stage one shuffle and one explicit fma with a ±1 sign.
    butterflies = {"rotate": 1 + spec.proj, "activate": 3, "reduce": spec.top_k}[spec.kind]
    shuffles = ptx.count("shfl.sync.bfly")
    assert shuffles == 48 * butterflies
    assert "add.rn.f32" in ptx and "sub.rn.f32" in ptx and "mul.rn.f32" in ptx
    if spec.kind == "activate":
        assert "div.rn.f32" in ptx  # silu's IEEE division, as torch's
        assert "ex2.approx" in ptx  # the accurate libm exp (range reduction + ex2), not removed
    else:
        # Nothing else to contract: every other product and sum rounds on its own, as the torch
        # glue does; the only fmas are the butterfly stages, one per shuffle.
        fmas = re.findall(r"^\s*(?:@%p\d+\s+)?fma\.(\S+)", ptx, re.M)
        assert fmas == ["rn.f32"] * shuffles, collections.Counter(fmas)
    mma = ptx.count("mma.sync")
    assert mma == 0


def test_specs_validate():
    with pytest.raises(ValueError, match="kind"):
        MoeBoundarySpec("rotate_in", False, False)
    with pytest.raises(ValueError, match="proj"):
        MoeBoundarySpec("activate", False, False, proj=True)
    with pytest.raises(ValueError, match="top_k"):
        MoeBoundarySpec("reduce", False, False)
    with pytest.raises(ValueError, match="top_k"):
        MoeBoundarySpec("rotate", False, False, top_k=2)
    with pytest.raises(ValueError, match="warps"):
        MoeBoundarySpec("rotate", False, False, warps=3)
    with pytest.raises(TypeError, match="in_bf16"):
        MoeBoundarySpec("rotate", 1, False)
    with pytest.raises(ValueError, match="pack kernel"):
        MoeBoundarySpec("pack", True, False)


@pytest.mark.parametrize(
    "x_dtype, cd, layout, top_k",
    [
        (torch.float16, torch.float16, "packed", 8),
        (torch.bfloat16, torch.bfloat16, "proj", 2),
        (torch.bfloat16, torch.float16, "proj", 1),
    ],
)
def test_boundary_specs_follow_the_problem(x_dtype, cd, layout, top_k):
    plan = plan_moe(
        m=4, top_k=top_k, hidden=256, intermediate=256, codebook="mcg", bits=3, num_experts=8,
        w13_layout=layout, x_dtype=x_dtype, compute_dtype=cd,
    )  # fmt: skip
    rotate, act, reduce, pack = boundary.boundary_specs(plan.problem)
    x_bf16, cd_bf16 = x_dtype == torch.bfloat16, cd == torch.bfloat16
    assert rotate == MoeBoundarySpec("rotate", x_bf16, cd_bf16, proj=layout == "proj")
    assert act == MoeBoundarySpec("activate", cd_bf16, cd_bf16)
    assert reduce == MoeBoundarySpec("reduce", cd_bf16, x_bf16, top_k=top_k)
    assert pack == MoeBoundarySpec("pack", False, False)  # 4·top_k routes: the device packer


@pytest.mark.parametrize(
    "m, top_k, experts, packs",
    [(128, 8, 128, True), (129, 8, 128, False), (1, 1, 1024, True), (1, 1, 1025, False)],
)
def test_the_device_packer_takes_plans_within_its_bounds(m, top_k, experts, packs):
    """1024 routes and 1024 experts at most; the warm-up set lists the packer exactly then."""
    plan = plan_moe(
        m=m, top_k=top_k, hidden=256, intermediate=256, codebook="mcg", bits=3,
        num_experts=experts, w13_layout="packed", x_dtype=torch.float16,
        compute_dtype=torch.float16,
    )  # fmt: skip
    assert boundary.device_packs(plan.routes) is packs
    assert (boundary.PACK_SPEC in boundary.boundary_specs(plan.problem)) is packs


def test_the_pack_wrapper_refuses_a_plan_past_its_bounds_before_writing(monkeypatch):
    def no_compile(spec, arch):
        raise AssertionError(f"compiled {spec}")

    monkeypatch.setattr(boundary, "compiled", no_compile)
    plan = routing.plan_routes(m=129, top_k=8, num_experts=16, block_size=16)
    buffers = {
        s.name: torch.full(s.shape, 7, dtype=s.dtype) for s in routing.route_buffer_specs(plan)
    }
    before = {name: t.clone() for name, t in buffers.items()}
    with pytest.raises(ValueError, match="device packer's bounds"):
        boundary.pack_routes(
            arch="sm_90", plan=plan, topk_ids=torch.zeros(3, 8, dtype=torch.int32), buffers=buffers
        )
    assert all(torch.equal(t, before[name]) for name, t in buffers.items())  # nothing written
    with pytest.raises(TypeError, match="topk_ids"):
        boundary.pack_routes(arch="sm_90", plan=plan, topk_ids=torch.zeros(3, 8), buffers=buffers)
    small = routing.plan_routes(m=4, top_k=2, num_experts=16, block_size=16)
    # pack() without an arch (a CPU-bound plan) is the torch packer, never the kernel
    zeros = {s.name: torch.zeros(s.shape, dtype=s.dtype) for s in routing.route_buffer_specs(small)}
    live = boundary.pack(
        arch=None, plan=small, topk_ids=torch.tensor([[0, 3], [3, -1]]), buffers=zeros
    )
    assert live.routes == 4


def test_boundary_kernels_resolve_through_the_runtime_cache(monkeypatch):
    spec = MoeBoundarySpec("reduce", False, True, top_k=5, warps=1)
    key = kinds.launch_key(spec, "sm_90")
    other = kinds.launch_key(MoeBoundarySpec("reduce", False, True, top_k=6, warps=1), "sm_90")
    assert key.kernel == "moe_boundary" and key != other  # top_k is a codegen input
    assert dict(key.codegen)["top_k"] == 5
    empty = compile_cache.CompileCache()
    monkeypatch.setattr(compile_cache, "CACHE", empty)
    frozen = pytest.raises(compile_cache.KernelResolutionFrozen, match="moe_boundary")
    with compile_cache.frozen(), frozen:
        kinds.compiled(spec, "sm_90")
    assert len(empty) == 0 and empty.misses == 0


def test_launch_wrappers_reject_bad_arguments_before_compiling(monkeypatch):
    def no_compile(spec, arch):
        raise AssertionError(f"compiled {spec}")

    monkeypatch.setattr(boundary, "compiled", no_compile)
    x = torch.zeros(2, 128, dtype=torch.float16)
    suh = torch.ones(1, 128, dtype=torch.float16)
    experts = torch.zeros(4, dtype=torch.int64)
    out = torch.zeros(4, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="up_suh/out_up"):
        boundary.rotate_inputs(
            arch="sm_90", x=x, gate_suh=suh, up_suh=suh, route_expert=experts, out_gate=out,
            out_up=None, top_k=2, num_experts=1,
        )  # fmt: skip
    with pytest.raises(TypeError, match="weights"):
        boundary.reduce_output(
            arch="sm_90", fc2=out, svh=suh, route_expert=experts,
            route_inactive=torch.zeros(4, dtype=torch.bool), weights=torch.ones(4).half(),
            out=x, top_k=2, num_experts=1,
        )  # fmt: skip


# ------------------------------------------------------------------ butterfly order (emulation)


def _moe_h4(v: torch.Tensor) -> torch.Tensor:
    a, b, c, d = v.unbind(-1)
    s0, s1, s2, s3 = a + b, a - b, c + d, c - d
    return torch.stack([s0 + s2, s1 + s3, s0 - s2, s1 - s3], dim=-1)


def _xor_stage(out: torch.Tensor, offset: int) -> torch.Tensor:
    """One cross-lane stage over dim 1 (lanes): the lower lane keeps lo + hi, the upper lo − hi."""
    lane = torch.arange(out.shape[1])
    partner = out[:, lane ^ offset]
    upper = ((lane & offset) != 0).view(1, -1, 1)
    return torch.where(upper, partner - out, out + partner)


def _lane_butterfly(block: torch.Tensor) -> torch.Tensor:
    """The four-elements-per-lane schedule in fp32 torch ops: ``block [R, 128]`` as 32 lanes × 4
    values, index bits 2..6 all across lanes."""
    out = _moe_h4(block.view(-1, 32, 4))
    for offset in (1, 2, 4, 8, 16):
        out = _xor_stage(out, offset)
    return (out * H128_SCALE_FP32).view(-1, 128)


def _group_butterfly(block: torch.Tensor) -> torch.Tensor:
    """The kernels' schedule (``b12x.kernels.butterfly.h128``) in fp32 torch ops: 8 lanes × 16
    values gathered with the kernels' own ``lane_words``, bits 2–4 across lanes, bits 5–6
    in-thread, then scattered back."""
    words = torch.tensor([lane_words(s) for s in range(GROUP_LANES)])  # [8 lanes, 8 words]
    index = torch.stack([2 * words, 2 * words + 1], dim=-1).view(GROUP_LANES, 16)
    out = _moe_h4(block[:, index].view(-1, GROUP_LANES, 4, 4)).view(-1, GROUP_LANES, 16)
    for offset in GROUP_OFFSETS:
        out = _xor_stage(out, offset)
    for step in (1, 2):  # value quads g and g + step
        quads = out.view(-1, GROUP_LANES, 4, 4).clone()
        lower = [g for g in range(4) if not g & step]
        lo, hi = quads[:, :, lower], quads[:, :, [g + step for g in lower]]
        quads[:, :, lower], quads[:, :, [g + step for g in lower]] = lo + hi, lo - hi
        out = quads.view(-1, GROUP_LANES, 16)
    result = torch.empty_like(block)
    result[:, index] = out * H128_SCALE_FP32
    return result


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("spread", [1.0, 1e-30, 1e30])
def test_both_lane_schedules_are_bit_identical_to_the_torch_path(spread):
    g = torch.Generator().manual_seed(7)
    rows, features = 6, 384
    x = torch.randn(rows, features, generator=g) * spread
    x *= torch.exp2(torch.randint(-20, 20, (rows, features), generator=g).float())
    x[0, :5] = torch.tensor([0.0, -0.0, 1e-45, -3.4e38, 3.4e38])  # subnormal, overflow paths
    src, tmp = x.clone(), torch.empty_like(x)
    want = boundary.h128_fp32_(src, tmp)
    for schedule in (_lane_butterfly, _group_butterfly):
        got = schedule(x.clone().view(-1, 128)).view(rows, features)
        assert torch.equal(_bits(got), _bits(want)), schedule.__name__
    # The order matters: the natural H4 ((a+b)+c)+d differs somewhere from the stage order.
    v = x.view(-1, 32, 4)
    a, b, c, d = v.unbind(-1)
    natural = a + b + c + d
    staged = (a + b) + (c + d)
    assert not torch.equal(_bits(natural), _bits(staged))
