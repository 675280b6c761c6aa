"""The MoE as a torch custom op and as a plan/bind/run op object for the CUDA-graph protocol.

Layout
------
* ``b12x::trellis_moe(Tensor x, Tensor topk_weights, Tensor topk_ids, Tensor[] w13, Tensor[] w2,
  Tensor gate_suh, Tensor? up_suh, Tensor intermediate_rotations, Tensor down_svh, str codebook,
  str w13_layout, Tensor? global_to_combined=None, Tensor? descriptor_map=None,
  ScalarType? compute_dtype=None, str? fc1_pair=None, str? fc2_pair=None, Tensor? fc1_modes=None,
  Tensor? fc2_modes=None) -> Tensor`` — ``[M, H]`` in ``x.dtype``. One payload in
  ``w13``/``w2`` is a uniform stack; two are K3/K4 tiers (then the two maps are required and the
  codebook must be ``"mcg"``). ``fc1_pair``/``fc2_pair`` select QSRT pairs per phase
  (:mod:`b12x.ops.moe.pairs`): the phase's payload is then a pair payload and a ``"dynamic"`` phase
  takes its int32 ``[E]`` mode table. The CUDA implementation plans, allocates the plan's
  buffers (an eager op may: it is plan time for this call), binds and runs; graph consumers call
  plan / bind / run themselves (:class:`MoeOp`).
* The fake implementation runs the same :func:`check_moe_op_args` (metadata only) and returns an
  empty ``[M, H]``; the CPU implementation runs it too, then raises ``ValueError`` naming ``x``
  (the kernels need CUDA tensors).
* :class:`MoeOp` — ``plan(problem)`` / ``bind(plan, buffers)`` / ``run(bound, inputs)`` /
  ``freeze()`` / ``compile_unwarmed(plan)`` over mappings (``oracle.run.graph_protocol``).

Invariants: the op is functional (mutates nothing), inference only; registration at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from b12x.formats import resolve_format
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch.kinds import compiled
from b12x.ops.moe.pairs import PAIR_BASE_BITS, PAIR_CHANNELS, check_pair_choice, pair_rate_sum
from b12x.ops.moe.plan import MoePlan, allocate_moe_buffers, bind_moe, check_moe_problem, plan_moe
from b12x.ops.moe.routing import check_route_ids
from b12x.ops.moe.run import MoeInputs, check_rotation_table, payload_shapes, run_moe
from b12x.ops.moe.tiers import TIER_CODEBOOK, plan_tiered_moe
from b12x.runtime import compile_cache
from b12x.runtime.validate import HALF_DTYPES, check_dtype_choice, check_tensor

__all__ = ["OP_NAME", "MoeOp", "check_moe_op_args", "trellis_moe"]

OP_NAME = "b12x::trellis_moe"


def check_moe_op_args(
    x, topk_weights, topk_ids, w13, w2, codebook, w13_layout, global_to_combined, descriptor_map,
    fc1_pair=None, fc2_pair=None, compute_dtype=None, *, tables=None,
) -> dict[str, Any]:  # fmt: skip
    """Metadata-only validation shared by the real, the fake and the CPU op; returns the plan
    keywords (less ``compute_dtype``). The tensors are read for their metadata, then the problem
    goes through :func:`b12x.ops.moe.plan.check_moe_problem`, the validator the plan runs.
    ``tables`` (the op's ``gate_suh``, ``up_suh``, ``intermediate_rotations``, ``down_svh``,
    ``fc1_modes``, ``fc2_modes`` by name) are checked for dtype, shape and device as ``run``
    will (mode values are read at run time only)."""
    if compute_dtype is not None:
        check_dtype_choice("compute_dtype", compute_dtype, HALF_DTYPES)
    if not isinstance(w13, list | tuple) or not isinstance(w2, list | tuple):
        raise TypeError("w13/w2: expected a list of payload tensors (one per tier)")
    fc1_pair = check_pair_choice("fc1_pair", fc1_pair)
    fc2_pair = check_pair_choice("fc2_pair", fc2_pair)
    check_tensor("x", x, dtypes=HALF_DTYPES, ndim=2)
    check_route_ids(topk_ids, device=x.device)
    if topk_ids.shape[0] != x.shape[0] or x.shape[0] == 0:
        raise ValueError(f"topk_ids: {topk_ids.shape[0]} rows, but x has {x.shape[0]} (M >= 1)")
    if not isinstance(topk_weights, torch.Tensor) or not topk_weights.is_floating_point():
        raise TypeError("topk_weights: expected a floating tensor")
    check_tensor(
        "topk_weights", topk_weights, dtypes=(topk_weights.dtype,), shape=tuple(topk_ids.shape),
        device=x.device, aligned=False,
    )  # fmt: skip
    if w13_layout not in ("packed", "proj"):
        raise ValueError(f"w13_layout: expected 'packed' or 'proj', got {w13_layout!r}")
    if not isinstance(codebook, str):
        raise TypeError(f"codebook: expected str, got {type(codebook).__name__}")
    if len(w13) not in (1, 2) or len(w2) != len(w13):
        raise ValueError(f"w13/w2: expected 1 (uniform) or 2 (tiers) payloads each, got {len(w13)}")
    bits, experts = [], []
    for t, (a, b) in enumerate(zip(w13, w2, strict=True)):
        check_tensor(f"w13[{t}]", a, dtypes=(torch.int16,), device=x.device)
        ndim = 2 if fc2_pair is not None else 4
        check_tensor(f"w2[{t}]", b, dtypes=(torch.int16,), ndim=ndim, device=x.device)
        # static: specialised under tracing; a paired FC2 compiles on the base rate
        bits.append(PAIR_BASE_BITS if fc2_pair is not None else int(b.shape[-1]) // 16)
        experts.append(b.shape[0])
    tiered = len(w13) == 2
    if fc2_pair is None:
        hidden, intermediate = w2[0].shape[2] * 16, w2[0].shape[1] * 16
    else:
        hidden = x.shape[1]
        per_pair = (hidden // 16) * 128 * pair_rate_sum(fc2_pair)
        if hidden % 128 or w2[0].shape[1] % per_pair or w2[0].shape[1] == 0:
            raise ValueError(
                f"w2: a {fc2_pair} FC2 payload holds whole pairs of {per_pair} words for H = "
                f"{hidden}, got shape {tuple(w2[0].shape)}"
            )
        intermediate = PAIR_CHANNELS * (w2[0].shape[1] // per_pair)
    if tiered and (fc1_pair is not None or fc2_pair is not None):
        raise ValueError("fc1_pair/fc2_pair: QSRT pairs run on a uniform stack, not on tiers")
    if tiered and (global_to_combined is None or descriptor_map is None):
        raise ValueError("global_to_combined: two tiers need global_to_combined and descriptor_map")
    if tiered:
        check_tensor(
            "global_to_combined", global_to_combined, dtypes=(torch.int32,), ndim=1,
            device=x.device,
        )  # fmt: skip
        check_tensor(
            "descriptor_map", descriptor_map, dtypes=(torch.int32,), shape=(sum(experts),),
            device=x.device,
        )  # fmt: skip
    elif global_to_combined is not None or descriptor_map is not None:
        raise ValueError("global_to_combined: only two tiers take tier maps")
    keywords = dict(
        m=x.shape[0], top_k=topk_ids.shape[1], hidden=hidden, intermediate=intermediate,
        w13_layout=w13_layout, x_dtype=x.dtype,
    )  # fmt: skip
    if tiered:
        if not resolve_format(codebook).tiered:
            raise ValueError(f"codebook: mixed tiers are EXL3 MCG tiers, got {codebook!r}")
        keywords.update(
            tier0_bits=bits[0], tier1_bits=bits[1], tier0_experts=experts[0],
            tier1_experts=experts[1], num_global_experts=global_to_combined.shape[0],
        )  # fmt: skip
    else:
        keywords.update(bits=bits[0], num_experts=experts[0], codebook=codebook)
        if fc1_pair is not None or fc2_pair is not None:
            keywords.update(fc1_pair=fc1_pair, fc2_pair=fc2_pair)
    if tables is not None:
        _check_tables(
            tables, x.device, experts=sum(experts), hidden=hidden, intermediate=intermediate,
            w13_layout=w13_layout, pairs={"fc1": fc1_pair, "fc2": fc2_pair},
        )  # fmt: skip
    problem = check_moe_problem(
        m=keywords["m"], top_k=keywords["top_k"], hidden=hidden, intermediate=intermediate,
        codebook=codebook, bits=tuple(bits), num_experts=tuple(experts), w13_layout=w13_layout,
        x_dtype=x.dtype, compute_dtype=compute_dtype or torch.float16,
        num_global_experts=keywords.get("num_global_experts"), m_tiles=None, fc1_pair=fc1_pair,
        fc2_pair=fc2_pair,
    )  # fmt: skip
    if x.shape[1] != hidden:
        raise ValueError(f"x: expected {hidden} features (H of the w2 payload), got {x.shape[1]}")
    for t, (want13, want2) in enumerate(payload_shapes(problem)):
        check_tensor(f"w13[{t}]", w13[t], dtypes=(torch.int16,), shape=want13, device=x.device)
        check_tensor(f"w2[{t}]", w2[t], dtypes=(torch.int16,), shape=want2, device=x.device)
    return keywords


def _check_tables(tables, device, *, experts, hidden, intermediate, w13_layout, pairs) -> None:
    check_rotation_table("gate_suh", tables["gate_suh"], experts, hidden, device, broadcast=True)
    if w13_layout == "proj" or tables["up_suh"] is not None:
        check_rotation_table("up_suh", tables["up_suh"], experts, hidden, device, broadcast=True)
    check_rotation_table(
        "intermediate_rotations", tables["intermediate_rotations"], experts, 3 * intermediate,
        device, broadcast=False,
    )  # fmt: skip
    check_rotation_table("down_svh", tables["down_svh"], experts, hidden, device, broadcast=True)
    for phase, choice in pairs.items():
        name, modes = f"{phase}_modes", tables[f"{phase}_modes"]
        if choice == "dynamic":
            check_tensor(name, modes, dtypes=(torch.int32,), shape=(experts,), device=device)
        elif modes is not None:
            raise ValueError(f"{name}: only a dynamic {phase} pair layout takes a mode table")


def _plan_tiers(problem: Mapping[str, Any], compute_dtype: torch.dtype) -> MoePlan:
    """The tier plan with every keyword spelled out (the contract checker binds each one)."""
    return plan_tiered_moe(
        m=problem["m"],
        top_k=problem["top_k"],
        hidden=problem["hidden"],
        intermediate=problem["intermediate"],
        codebook="mcg",
        tier0_bits=problem["tier0_bits"],
        tier1_bits=problem["tier1_bits"],
        tier0_experts=problem["tier0_experts"],
        tier1_experts=problem["tier1_experts"],
        num_global_experts=problem["num_global_experts"],
        w13_layout=problem["w13_layout"],
        x_dtype=problem["x_dtype"],
        compute_dtype=compute_dtype,
    )


def _op_keywords(args: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`check_moe_op_args` over the op's arguments by schema name (``locals()`` on entry
    of the real, the fake and the CPU implementation): one validation call for all three, bound
    by name."""
    return check_moe_op_args(
        **{name: args[name] for name in _CHECKED_ARGS},
        tables={name: args[name] for name in _TABLE_ARGS},
    )


#: The op arguments :func:`check_moe_op_args` reads as metadata, and those it checks as tables.
_CHECKED_ARGS = (
    "x", "topk_weights", "topk_ids", "w13", "w2", "codebook", "w13_layout",
    "global_to_combined", "descriptor_map", "fc1_pair", "fc2_pair", "compute_dtype",
)  # fmt: skip
_TABLE_ARGS = ("gate_suh", "up_suh", "intermediate_rotations", "down_svh", "fc1_modes", "fc2_modes")


def _plan(keywords: Mapping[str, Any], compute_dtype: torch.dtype) -> MoePlan:
    if "tier0_bits" in keywords:
        return _plan_tiers(keywords, compute_dtype)
    return plan_moe(compute_dtype=compute_dtype, **keywords)


@torch.library.custom_op(OP_NAME, mutates_args=(), device_types="cuda")
def trellis_moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: list[torch.Tensor],
    w2: list[torch.Tensor],
    gate_suh: torch.Tensor,
    up_suh: torch.Tensor | None,
    intermediate_rotations: torch.Tensor,
    down_svh: torch.Tensor,
    codebook: str,
    w13_layout: str,
    global_to_combined: torch.Tensor | None = None,
    descriptor_map: torch.Tensor | None = None,
    compute_dtype: torch.dtype | None = None,
    fc1_pair: str | None = None,
    fc2_pair: str | None = None,
    fc1_modes: torch.Tensor | None = None,
    fc2_modes: torch.Tensor | None = None,
) -> torch.Tensor:
    keywords = _op_keywords(locals())
    plan = _plan(keywords, compute_dtype or torch.float16)
    bound = bind_moe(plan, **allocate_moe_buffers(plan, x.device))
    inputs = MoeInputs(
        x, topk_weights, topk_ids, tuple(w13), tuple(w2), gate_suh, up_suh,
        intermediate_rotations, down_svh, global_to_combined, descriptor_map, fc1_modes,
        fc2_modes,
    )  # fmt: skip
    return run_moe(bound, inputs).clone()


@trellis_moe.register_fake
def _trellis_moe_fake(
    x, topk_weights, topk_ids, w13, w2, gate_suh, up_suh, intermediate_rotations, down_svh,
    codebook, w13_layout, global_to_combined=None, descriptor_map=None, compute_dtype=None,
    fc1_pair=None, fc2_pair=None, fc1_modes=None, fc2_modes=None,
):  # fmt: skip
    keywords = _op_keywords(locals())
    return x.new_empty((keywords["m"], keywords["hidden"]))


@trellis_moe.register_kernel("cpu")
def _trellis_moe_cpu(
    x, topk_weights, topk_ids, w13, w2, gate_suh, up_suh, intermediate_rotations, down_svh,
    codebook, w13_layout, global_to_combined=None, descriptor_map=None, compute_dtype=None,
    fc1_pair=None, fc2_pair=None, fc1_modes=None, fc2_modes=None,
):  # fmt: skip
    _op_keywords(locals())
    raise ValueError(
        f"x: {OP_NAME} runs on CUDA tensors; got device {x.device} (move every tensor argument "
        "to a CUDA device)"
    )


class MoeOp:
    """plan / bind / run over mappings (the op protocol of ``oracle.run.graph_protocol``).

    ``plan(problem)`` takes :func:`~b12x.ops.moe.plan.plan_moe`'s keywords (or
    :func:`~b12x.ops.moe.tiers.plan_tiered_moe`'s, recognised by ``tier0_bits``; its codebook is
    always ``"mcg"``); ``run(bound, inputs)`` reads the :class:`~b12x.ops.moe.run.MoeInputs` fields
    by name (``w13``/``w2``: one tensor, a tuple, or ``w13_tier0``/``w13_tier1`` entries)."""

    name = "trellis_moe"

    def __init__(self, device: Any = None) -> None:
        self.device = device  # the arch of compile_unwarmed (None: the current CUDA device)

    def plan(self, problem: Mapping[str, Any]) -> MoePlan:
        if not isinstance(problem, Mapping):
            raise TypeError(f"problem: expected a mapping, got {type(problem).__name__}")
        if "tier0_bits" in problem:
            if not resolve_format(problem.get("codebook", TIER_CODEBOOK)).tiered:
                raise ValueError(
                    f"codebook: mixed tiers are MCG tiers, got {problem['codebook']!r}"
                )
            return _plan_tiers(problem, problem.get("compute_dtype", torch.float16))
        return plan_moe(**problem)

    def bind(self, plan: MoePlan, buffers: Mapping[str, torch.Tensor]):
        return bind_moe(plan, **{name: buffers.get(name) for name in plan.buffer_names})

    def run(self, bound, inputs: Mapping[str, Any]) -> None:
        fields = (
            "x", "topk_weights", "topk_ids", "w13", "w2", "gate_suh", "up_suh",
            "intermediate_rotations", "down_svh", "global_to_combined", "descriptor_map",
            "fc1_modes", "fc2_modes",
        )  # fmt: skip
        values = {f: inputs.get(f) for f in fields}
        for name in ("w13", "w2"):  # one tensor (uniform) or `<name>_tier0`/`<name>_tier1`
            given = values[name]
            if given is None:
                values[name] = tuple(inputs[f"{name}_tier{t}"] for t in (0, 1))
            elif isinstance(given, torch.Tensor):
                values[name] = (given,)
            else:
                values[name] = tuple(given)
        run_moe(bound, MoeInputs(**values))

    def freeze(self) -> Any:
        return compile_cache.frozen()

    def compile_unwarmed(self, plan: MoePlan) -> None:
        from b12x.ops.dense.plan import device_limits

        major, minor = device_limits(self.device).capability
        spec = plan.fc2_spec[0]
        never = MoeGemmSpec(spec.codebook, spec.bits, spec.bf16, m_tiles=spec.m_tiles, warps=2)
        compiled(never, f"sm_{major}{minor}")
