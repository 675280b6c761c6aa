"""CPU: the MoE's refusals are clear errors that name the argument and what it accepts.

* ``plan_moe``: a float ``bits``, a bool wherever an int is expected, an unknown or non-string
  layout / pair / codebook, and a device that is neither CUDA nor simulated each raise
  ``TypeError``/``ValueError`` naming the argument (and the accepted values), never a Python or
  torch error from deeper down.
* ``plan_tiered_moe``: its tier arguments are named as such; tiers keep accepting both FC1
  layouts and both compute dtypes (supported by b12x).
* ``bind_moe`` refuses meta buffers, naming ``output``; ``run_moe`` on a plan bound to CPU
  buffers (no emulated grouped GEMM installed) refuses before anything is packed or launched,
  naming ``bound``.
"""

from __future__ import annotations

import pytest
import torch

from b12x.ops.moe import run as run_mod
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from b12x.ops.moe.tiers import plan_tiered_moe
from oracle.judge.tiles import SimulatedDevice

F16, BF16 = torch.float16, torch.bfloat16
H, I = 256, 128
UNIFORM = dict(
    m=4, top_k=2, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
    w13_layout="packed", x_dtype=F16,
)  # fmt: skip
TIERS = dict(
    m=4, top_k=2, hidden=H, intermediate=I, codebook="mcg", tier0_bits=3, tier1_bits=4,
    tier0_experts=3, tier1_experts=5, num_global_experts=10, w13_layout="proj", x_dtype=F16,
    compute_dtype=F16,
)  # fmt: skip


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"bits": 4.0}, TypeError, r"bits: expected an int \(uniform\) or a tuple"),
        ({"bits": "4"}, TypeError, "bits: expected an int"),
        ({"bits": (3.0, 4), "num_experts": (4, 4), "num_global_experts": 8}, TypeError,
         "bits: expected int, got float"),
        ({"num_experts": 8.0}, TypeError, "num_experts: expected an int"),
        ({"bits": True}, TypeError, "bits: expected int, got bool"),
        ({"m": True}, TypeError, "m: expected int, got bool"),
        ({"top_k": True}, TypeError, "top_k: expected int, got bool"),
        ({"hidden": False}, TypeError, "hidden: expected int, got bool"),
        ({"intermediate": True}, TypeError, "intermediate: expected int, got bool"),
        ({"num_experts": True}, TypeError, "num_experts: expected int, got bool"),
        ({"m_tiles": True}, TypeError, "m_tiles: expected int, got bool"),
        ({"m_tiles": 3}, ValueError, r"m_tiles: expected None or one of \(1, 2, 4\)"),
        ({"m_tiles": 2.0}, TypeError, "m_tiles: expected int, got float"),
        ({"bits": (3, 4), "num_experts": (4, 4), "num_global_experts": True}, TypeError,
         "num_global_experts: expected int, got bool"),
        ({"w13_layout": "fused"}, ValueError, r"w13_layout: expected one of \('packed', 'proj'\)"),
        ({"w13_layout": None}, TypeError, r"w13_layout: expected one of \('packed', 'proj'\)"),
        ({"codebook": "mcg2"}, ValueError, r"codebook: unknown codebook 'mcg2'; known: \["),
        ({"codebook": 1}, TypeError, "codebook: expected str"),
        ({"fc1_pair": "P25", "bits": 3}, ValueError, r"fc1_pair: expected None or one of \('P22'"),
        ({"fc2_pair": 24, "bits": 3}, TypeError, r"fc2_pair: expected None or one of \('P22'"),
        ({"compute_dtype": torch.float32}, TypeError, "compute_dtype: expected torch.float16"),
        ({"device": "cpu"}, ValueError, "device: expected a CUDA device or a simulated device"),
        ({"device": "meta"}, ValueError, "device: expected a CUDA device or a simulated device"),
        ({"device": object()}, TypeError, "device: simulated device lacks `name`"),
    ],
)  # fmt: skip
def test_plan_moe_names_the_bad_argument(overrides, error, match):
    with pytest.raises(error, match=match):
        plan_moe(**{**UNIFORM, **overrides})


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"codebook": "sqg_e4m3"}, ValueError, "codebook: .*expected 'mcg', got 'sqg_e4m3'"),
        ({"tier0_bits": 4.0}, TypeError, "tier0_bits: expected int, got float"),
        ({"tier1_bits": True}, TypeError, "tier1_bits: expected int, got bool"),
        ({"tier1_bits": 9}, ValueError, r"tier1_bits: bits: codebook 'mcg' supports bits \(1,"),
        ({"tier0_experts": 0}, ValueError, "tier0_experts: expected a positive int"),
        ({"tier1_experts": 257}, ValueError, "tier1_experts: a tier holds at most 256"),
        ({"w13_layout": "fused"}, ValueError, r"w13_layout: expected one of \('packed', 'proj'\)"),
    ],
)  # fmt: skip
def test_plan_tiered_moe_names_the_bad_argument(overrides, error, match):
    with pytest.raises(error, match=match):
        plan_tiered_moe(**{**TIERS, **overrides})


@pytest.mark.parametrize("layout", ["packed", "proj"])
@pytest.mark.parametrize("compute_dtype", [F16, BF16])
def test_tiers_keep_both_layouts_and_both_compute_dtypes(layout, compute_dtype):
    plan = plan_tiered_moe(**{**TIERS, "w13_layout": layout, "compute_dtype": compute_dtype})
    assert plan.problem.w13_layout == layout and plan.problem.compute_dtype == compute_dtype
    assert [s.bits for s in plan.fc1_spec] == [3, 4]
    assert {s.bf16 for s in plan.kernel_specs} == {compute_dtype == BF16}


def test_simulated_devices_plan():
    device = SimulatedDevice("H200", 132, 232448, (9, 0))
    assert plan_moe(**UNIFORM, device=device).routes.block_size == 16


def test_bind_refuses_meta_buffers_naming_output():
    plan = plan_moe(**UNIFORM)
    with pytest.raises(ValueError, match="output: expected a buffer on a CUDA device .* got meta"):
        bind_moe(plan, **allocate_moe_buffers(plan, "meta"))
    buffers = allocate_moe_buffers(plan, "cpu")
    buffers["fc1"] = torch.empty(buffers["fc1"].shape, dtype=buffers["fc1"].dtype, device="meta")
    with pytest.raises(ValueError, match="`fc1`"):  # one meta buffer among CPU ones
        bind_moe(plan, **buffers)


class _Packed(Exception):
    pass


def test_run_refuses_a_cpu_bound_plan_before_anything_runs(monkeypatch):
    """Without the CPU tier's emulated grouped GEMM (which adds "cpu" to LAUNCH_DEVICE_TYPES), a
    CPU-bound plan is refused naming ``bound``; nothing is packed, rotated or launched."""
    calls = []

    def packer(*args):
        calls.append("pack")
        raise _Packed

    monkeypatch.setattr(run_mod, "compiled", lambda *a: calls.append("gemm"))
    monkeypatch.setattr(run_mod.routing, "pack_routes_into", packer)
    plan = plan_moe(**UNIFORM)
    bound = bind_moe(plan, **allocate_moe_buffers(plan, "cpu"))
    g = torch.Generator().manual_seed(0)

    def payload(*shape):
        return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)

    inputs = MoeInputs(
        torch.randn(4, H, generator=g).half(), torch.rand(4, 2, generator=g),
        torch.randint(0, 8, (4, 2), generator=g), (payload(8, H // 16, 2 * I // 16, 48),),
        (payload(8, I // 16, H // 16, 48),), torch.ones(1, H, dtype=F16), None,
        torch.ones(8, 3 * I, dtype=F16), torch.ones(1, H, dtype=F16),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"bound: run_moe launches CUDA kernels.* cpu buffers"):
        run_moe(bound, inputs)
    assert calls == []
    monkeypatch.setattr(run_mod, "LAUNCH_DEVICE_TYPES", ("cuda", "cpu"))  # the emulated tier
    monkeypatch.setattr(run_mod.launchers, "device_arch", lambda device: "sm_90")  # as it does
    with pytest.raises(_Packed):  # now it gets as far as the (stubbed) packer
        run_moe(bound, inputs)
    assert calls == ["pack"]
