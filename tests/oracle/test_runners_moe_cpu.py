"""The MoE runner's judging on CPU, with the kernel replaced by a fake op behind a fake
contract: the reference's faithful output passes; a dropped route and a scaled token row fail
and are saved for replay. Uniform, mixed-tier and QSRT-paired cases, both compute dtypes.

The fake op writes the reference's faithful forward (``reference.moe.stack_moe_forward``, or
``reference.tiers.mixed_moe_forward`` for tiers) of the very
stack and batch the runner built for the case (captured from ``oracle.run.runners.inputs``), so
everything around the kernel — seeded inputs with inactive ids, the problem handed to plan,
the poisoned ``output``, ``judge_moe``, saving — runs as on a GPU.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import pytest
import torch

from oracle.cases.grids import cases

CASES = {
    "uniform": "op=moe,tier_layout=none,pair_kind=none,codebook=mcg,bits=4,k=256,n=256,experts=8",
    "tiers": "op=moe,tier_layout=k3k4,k=256,n=256,experts=8",
    "pairs": "op=moe,pair_kind=P24,codebook=mcg,k=512,n=256,experts=8",
}


@functools.cache  # a frozen Case: the grid walk runs once per (kind, dtype), not per test
def _case(kind: str, dtype: str):
    found = cases(op="moe", tier="gpu", filter=f"{CASES[kind]},dtype={dtype},m<=17")
    return max(found, key=lambda c: c.m)  # several tokens, so a single row can be singled out


def _fake_contract(batch: dict, fault: str | None):
    from b12x.support import OpContract
    from reference.moe import stack_moe_forward
    from reference.tiers import mixed_moe_forward

    class FakeMoeOp:
        def __init__(self, device=None):
            pass

        def plan(self, problem):
            return types.SimpleNamespace(problem=dict(problem), decisions=())

        def bind(self, plan, buffers):
            return plan, buffers

        def run(self, bound, inputs):
            plan, buffers = bound
            assert inputs["x"] is batch["x"]  # the op receives the batch the judge sees
            weights = batch["topk_weights"].clone()
            if fault == "dropped_route":  # the heaviest ACTIVE route of the first row with one
                ids, experts = batch["topk_ids"], batch["experts"]
                space = getattr(experts, "num_global_experts", None) or experts.num_experts
                active = (ids >= 0) & (ids < space)
                mapping = getattr(experts, "global_to_combined", None)  # tiers: unmapped = off
                if mapping is not None:
                    active &= mapping[ids.clamp(0, space - 1).long()] >= 0
                live = torch.where(active, weights.abs(), 0.0).nan_to_num(0.0)
                row = int(torch.nonzero(live.amax(dim=1) > 0)[0])
                weights[row, live[row].argmax()] = 0.0
            forward = mixed_moe_forward if "tier0_bits" in plan.problem else stack_moe_forward
            y = forward(
                batch["x"], batch["experts"], weights, batch["topk_ids"], precision="faithful",
                compute_dtype=plan.problem["compute_dtype"],
            ).to(buffers["output"].dtype)  # fmt: skip
            if fault == "scaled_row":
                y[1] *= 1.01
            buffers["output"][: y.shape[0]].copy_(y)

    def allocate(plan, device):
        p = plan.problem
        return {"output": torch.empty(p["m"], p["hidden"], dtype=p["x_dtype"], device=device)}

    def never(*args, **kwargs):
        raise AssertionError("the runner goes through the graph op")

    return OpContract(
        name="moe", plan=never, bind=never, run=never, allocate=allocate, graph_op=FakeMoeOp,
        custom_op=None, variants=(), dispatch=(), tiles=None, observables={},
    )  # fmt: skip


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("fault", [None, "dropped_route", "scaled_row"])
def test_moe_runner_passes_faithful_and_fails_planted_faults(
    monkeypatch, tmp_path, kind, dtype, fault
):
    from oracle.cases import declared
    from oracle.run.runners import inputs as case_inputs
    from oracle.run.runners import run_case

    batch: dict = {}
    build = case_inputs.moe_inputs

    def capture(case, device):
        batch.update(build(case, device))
        return batch

    monkeypatch.setattr(case_inputs, "moe_inputs", capture)
    monkeypatch.setattr(declared, "op_contract", lambda name: _fake_contract(batch, fault))
    case = _case(kind, dtype)
    (result,) = run_case(case, device="cpu", results_dir=tmp_path)
    assert result.name == f"gpu.moe.{case.case_id}"
    if fault is None:
        assert result.status == "pass", result.reason
    else:
        assert result.status == "fail", (fault, result.reason)
        assert "replay: python -m oracle replay" in result.reason


@functools.cache
def _many_expert_case():
    from oracle.run.runners.moe import HOST_JUDGE_EXPERTS

    found = cases(op="moe", tier="gpu", filter=f"experts>={HOST_JUDGE_EXPERTS},m<=16")
    assert found, "the grid has many-expert MoE cases"
    return found[0]


def test_a_many_expert_case_is_judged_on_the_host_inputs():
    """Off the host, a case of HOST_JUDGE_EXPERTS or more experts is judged from the host inputs
    the run's were moved from, with y and the observed stages copied to the host."""
    from oracle.run.runners import inputs as case_inputs
    from oracle.run.runners.moe import judge_inputs

    case = _many_expert_case()
    host = case_inputs.moe_inputs(case, "cpu")
    run = case_inputs.moved(host, "cpu")  # stands in for the GPU copy
    y = torch.randn(case.m, host["x"].shape[1]).to(host["x"].dtype)
    stage = torch.randn(case.m * case.top_k, 8)
    judged, y_judged, observed = judge_inputs(case, host, run, y, {"fc2": stage}, "cuda")
    assert judged is host
    assert torch.equal(y_judged, y) and torch.equal(observed["fc2"], stage)


def test_a_few_expert_case_and_a_host_run_keep_the_run_inputs():
    from oracle.run.runners.moe import judge_inputs

    host, run = {"x": torch.zeros(1)}, {"x": torch.zeros(1)}
    y = torch.zeros(1)
    assert judge_inputs(_case("uniform", "fp16"), host, run, y, {}, "cuda")[0] is run
    assert judge_inputs(_many_expert_case(), host, run, y, {}, "cpu")[0] is run


def test_moved_puts_every_tensor_and_the_stack_on_the_device_and_keeps_the_rest():
    import dataclasses

    from oracle.run.runners import inputs as case_inputs

    @dataclasses.dataclass(frozen=True)
    class Stack:  # the shape of a reference stack: tensor fields and a nested stack
        w13: torch.Tensor
        inner: Any = None

    choices = object()
    host = {
        "experts": Stack(torch.ones(2), Stack(torch.ones(3))),
        "x": torch.ones(4),
        "topk_ids": torch.zeros(2, dtype=torch.int32),
        "choices": choices,
    }
    meta = case_inputs.moved(host, "meta")
    assert meta["x"].is_meta and meta["topk_ids"].is_meta and meta["topk_ids"].dtype == torch.int32
    assert meta["experts"].w13.is_meta and meta["experts"].inner.w13.is_meta
    assert not host["experts"].w13.is_meta and not host["x"].is_meta
    assert meta["choices"] is choices
