"""The MoE runner: one MoE case through ``b12x``'s MoE plan → bind → run, judged per route and row.

The case's variant fixes the stack (uniform, K3/K4 tiers, or QSRT pairs of one kind) and the
compute dtype; :func:`oracle.run.runners.inputs.moe_choices` fixes the execution choices inside it
(``w13`` layout, x dtype, route-id dtype, paired phases, static or dynamic pair modes), so every
variant meets each of them across its M buckets. Inputs carry inactive route ids with NaN
weights. The judge is :func:`oracle.judge.tolerance.judge_moe` over the reference stack, with the
stages the contract makes observable (route-order rotations, FC1, the activated intermediate,
FC2), so a wrong route or row is located, not only detected.

Where the judge runs: on the case's device, except for cases of at least
:data:`HOST_JUDGE_EXPERTS` experts, judged on the host from the host inputs the run's were moved
from (the kernel still runs on the GPU; its output and observed stages are copied over). The
reference's per-expert loop issues hundreds of small kernels per expert; with the default job's
shard processes time-slicing one GPU, a many-expert case judges faster on the host
(docs/evidence/oracle-sharding.md). The judge is device-agnostic (the CPU tier runs it), so this
moves only where it computes. The judge runs its envelope once per batch of experts with equal
route counts (``oracle.judge.moe_judge``); the per-expert reference forwards and decodes remain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from oracle.cases import declared
from oracle.judge import tolerance
from oracle.run.runners import inputs as case_inputs
from oracle.run.runners.common import Outcome, run_op

__all__ = [
    "HOST_JUDGE_EXPERTS",
    "flat_tensors",
    "judge_inputs",
    "moe_op_inputs",
    "moe_problem",
    "run_case",
]

#: MoE cases with at least this many experts are judged on the host (module docstring).
HOST_JUDGE_EXPERTS = 64


def moe_problem(case: Any, experts: Any, choices: Any, device: Any = None) -> dict[str, Any]:
    """The MoE op's problem (plan keywords) for one case. ``device`` is handed to a uniform or
    paired plan as a serving engine does (it lets an unpaired FC2 take the wave-balanced tile
    of ``b12x.ops.moe.dispatch``'s ``moe_fc2_tile`` table); a tiered plan takes none."""
    v = case.variant
    common = {
        "m": case.m,
        "top_k": case.top_k,
        "hidden": case.k,
        "intermediate": case.n,
        "w13_layout": choices.layout,
        "x_dtype": choices.x_dtype,
        "compute_dtype": case_inputs.compute_dtype(case),
    }
    if v.tier_layout is not None:
        return {
            **common,
            "codebook": v.codebook,
            "tier0_bits": experts.tier0_bits,
            "tier1_bits": experts.tier1_bits,
            "tier0_experts": experts.tier0.num_experts,
            "tier1_experts": experts.tier1.num_experts,
            "num_global_experts": experts.num_global_experts,
        }
    problem = {**common, "codebook": v.codebook, "bits": v.bits, "num_experts": case.experts}
    if device is not None:  # a CUDA device (name or index), or a simulated part (planning only)
        problem["device"] = torch.device(device) if isinstance(device, str | int) else device
    if v.pair_kind is not None:
        problem.update(fc1_pair=choices.fc1_pair, fc2_pair=choices.fc2_pair)
    return problem


def moe_op_inputs(tensors: dict[str, Any]) -> dict[str, Any]:
    """The MoE op's named inputs (``MoeInputs`` fields) from a reference stack and a batch."""
    experts = tensors["experts"]
    out = {k: tensors[k] for k in ("x", "topk_weights", "topk_ids")}
    if hasattr(experts, "tier0"):  # MixedTierExperts: combined-namespace tables, two payloads
        rot = experts.rotations
        layout = experts.tier0.w13_layout
        out.update(
            w13=(experts.tier0.w13, experts.tier1.w13),
            w2=(experts.tier0.w2, experts.tier1.w2),
            gate_suh=rot.gate_suh.contiguous(),
            up_suh=rot.up_suh.contiguous() if layout == "proj" else None,
            intermediate_rotations=rot.intermediate_rotations.contiguous(),
            down_svh=rot.down_svh.contiguous(),
            global_to_combined=experts.global_to_combined,
            descriptor_map=experts.descriptor_map,
        )
        return out
    out.update(
        w13=experts.w13,
        w2=experts.w2,
        gate_suh=experts.gate_suh,
        up_suh=experts.up_suh if experts.w13_layout == "proj" else None,
        intermediate_rotations=experts.intermediate_rotations,
        down_svh=experts.down_svh,
        fc1_modes=getattr(experts, "fc1_modes", None),
        fc2_modes=getattr(experts, "fc2_modes", None),
    )
    return out


def flat_tensors(op_inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The op inputs' tensors by name, a tier tuple flattened to ``<name>_tier<t>`` (what a
    saved case stores and a graph capture binds)."""
    out = {}
    for name, value in op_inputs.items():
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, tuple):
            out.update({f"{name}_tier{t}": x for t, x in enumerate(value)})
    return out


def regenerate(case: Any, device: Any) -> dict[str, torch.Tensor]:
    """The op's named input tensors as the runner builds them (tier payloads flattened)."""
    return flat_tensors(moe_op_inputs(case_inputs.moe_inputs(case, device)))


def judge_saved(case: Any, label: str, y: torch.Tensor, device: Any) -> Any:
    """Re-judge a saved MoE output from regenerated inputs (no observed stages)."""
    tensors = case_inputs.moe_inputs(case, device)
    return tolerance.judge_moe(
        y.to(device), x=tensors["x"], experts=tensors["experts"],
        topk_weights=tensors["topk_weights"], topk_ids=tensors["topk_ids"],
        compute_dtype=case_inputs.compute_dtype(case), tolerance=case.variant.tolerance,
    )  # fmt: skip


def judge_inputs(
    case: Any,
    host: Mapping[str, Any],
    run: Mapping[str, Any],
    y: torch.Tensor,
    observed: Mapping[str, Any],
    device: Any,
) -> tuple[Mapping[str, Any], torch.Tensor, Mapping[str, Any]]:
    """``(inputs, y, observed)`` the judge reads: the run's inputs, or for a case of at least
    :data:`HOST_JUDGE_EXPERTS` experts run off the host, the host inputs the run's were moved
    from, with ``y`` and the observed stages copied there (module docstring)."""
    if (case.experts or 0) < HOST_JUDGE_EXPERTS or torch.device(device).type == "cpu":
        return run, y, observed
    return host, y.cpu(), {name: stage.cpu() for name, stage in observed.items()}


def run_case(case: Any, device: Any) -> list[Outcome]:
    """The one execution of a MoE case (module docstring)."""
    contract = declared.op_contract("moe")
    host = case_inputs.moe_inputs(case, "cpu")  # generated on the host, then moved
    tensors = case_inputs.moved(host, device)
    choices = tensors["choices"]
    problem = moe_problem(case, tensors["experts"], choices, device)
    op_inputs = moe_op_inputs(tensors)
    result = run_op(contract, contract.graph_op(), problem, op_inputs, device)
    y = result.buffers["output"][: case.m]
    judged, y_judged, observed = judge_inputs(case, host, tensors, y, result.observed, device)
    verdict = tolerance.judge_moe(
        y_judged,
        x=judged["x"],
        experts=judged["experts"],
        topk_weights=judged["topk_weights"],
        topk_ids=judged["topk_ids"],
        compute_dtype=case_inputs.compute_dtype(case),
        observed=observed,
        tolerance=case.variant.tolerance,
    )
    return [
        Outcome(
            f"gpu.moe.{case.case_id}",
            verdict,
            case,
            flat_tensors(op_inputs),
            y.detach(),
            note=choices.describe(),
            extra={
                "choices": choices.describe(),
                "judged_on": str(y_judged.device),
                # which rows of b12x.ops.moe.dispatch served the case (the wave-balanced FC2
                # tile...)
                "paths": ",".join(
                    sorted({f"{d.table}={d.path}" for d in getattr(result.plan, "decisions", ())})
                ),
            },
        )
    ]
