"""The dense runner: one dense case through ``b12x``'s dense plan → bind → run, judged.

Executions of one case (each a separate check, ``gpu.dense.<case id>[.<path>@<part>]``):

* **native** — planned for the GPU it runs on; the dispatch table picks the path (``generic``
  below M 64, ``decode_matmul`` from there on the H200).
* **simulated parts** — planned on each part of :data:`SIMULATED_PARTS` whose dispatch takes a
  *different* path for this problem (the K6/MCG small-M row exists only on capability (12, 0)), then
  bound and run on the real GPU. This is how the K6 row is judged on a device that is not an
  SM120: same plan, same buffers, same launches as there.

Rotation ``full`` is the EXL3 linear (judged by :func:`oracle.judge.tolerance.judge_linear` with the
observed ``rotated`` and ``gemm`` stages); rotation ``none`` is the raw GEMM: the same front door
with an external H128 callback that only applies its (all-ones) scale
(:func:`identity_h128`), judged by :func:`oracle.judge.tolerance.judge_gemm` on the GEMM stage, and
the output must be that stage rounded to fp16 exactly.

**Pinned tile** (``run_case(..., tile="KxNxT")``, ``python -m oracle run --tile``): the problem
carries ``tile`` (``plan_dense(..., tile=)``: the generic path with that tile, validated by the
one tile predicate), every execution plans with it, the plan must report it (else the execution
fails), and the result is named ``gpu.dense.<case>.tile_<KxNxT>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from oracle.cases import declared
from oracle.judge import tolerance
from oracle.judge.tiles import DEVICES, parse_tile
from oracle.run.runners import inputs as case_inputs
from oracle.run.runners.common import Outcome, require_equal, run_op
from reference.trellis import decode

__all__ = [
    "SIMULATED_PARTS",
    "dense_problem",
    "executions",
    "identity_h128",
    "planned_product_spec",
    "run_case",
]


def _simulated_parts() -> tuple[Any, ...]:
    return tuple(d for d in DEVICES if tuple(d.capability) == (12, 0))[:1]


SIMULATED_PARTS = _simulated_parts()


def identity_h128(inp, out, pre_scale, post_scale, scale) -> None:
    """An external-H128 callback (``had_r_128(input, output, pre_scale, post_scale, scale)``)
    that rotates nothing: ``out = inp · (pre_scale or post_scale)`` without allocating."""
    factor = pre_scale if pre_scale is not None else post_scale
    torch.mul(inp, factor, out=out)


def dense_problem(case: Any, tile: list[int] | None = None) -> dict[str, Any]:
    """The dense op's problem (plan keywords) of one case; ``tile`` pins the GEMM tile."""
    v = case.variant
    dtype = case_inputs.compute_dtype(case)
    pinned = {} if tile is None else {"tile": list(tile)}
    return pinned | {
        "m": case.m,
        "k": case.k,
        "n": case.n,
        "bits": v.bits,
        "codebook": v.codebook,
        "x_dtype": dtype,
        "compute_dtype": dtype,
        "external_rotation": v.rotation == "none",
    }


@dataclasses.dataclass(frozen=True)
class Execution:
    label: str  # "" for native, else "<path>@<part>"
    device: Any  # None = the real device; else a simulated part for the plan


def executions(case: Any, contract: Any, tile: list[int] | None = None) -> list[Execution]:
    """Native, plus every simulated part whose dispatch path differs (module docstring)."""
    problem = dense_problem(case, tile)
    callback = identity_h128 if case.variant.rotation == "none" else None
    native = contract.graph_op(device=None, hadamard_128=callback).plan(problem).path
    out = [Execution("", None)]
    for part in SIMULATED_PARTS:
        path = contract.graph_op(device=part, hadamard_128=callback).plan(problem).path
        if path != native:
            out.append(Execution(f"{path}@{part.name.replace(' ', '_')}", part))
    return out


def planned_product_spec(case: Any, device: Any) -> Any:
    """The kernel specialisation that computes the product in the plan of ``case`` on ``device``
    (a CUDA device or index, or a simulated part): the trellis GEMM, plain or stream-K, or the
    decode kernel on the decode-then-GEMM path (the rotations and reductions around it are shared
    by many cases). ``None`` when the plan launches neither."""

    callback = identity_h128 if case.variant.rotation == "none" else None
    op = declared.op_contract("dense").graph_op(device=device, hadamard_128=callback)
    specs = op.plan(dense_problem(case)).kernel_specs
    for kinds in (("gemm", "gemm_stream_k"), ("decode",)):
        for spec in specs:
            if spec.kind in kinds:
                return spec
    return None


def _gemm_operand(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The GEMM's A operand of the raw path: fp16(x) (the ``input_f16`` staging), then the
    compute dtype."""
    return x.to(torch.float16).to(dtype)


def _judge(case, inputs, weight, y, observed):
    dtype = case_inputs.compute_dtype(case)
    if case.variant.rotation == "full":
        return tolerance.judge_linear(
            y, x=inputs["x"], weight=weight, suh=inputs["suh"], svh=inputs["svh"],
            compute_dtype=dtype, observed=observed, tolerance=case.variant.tolerance,
        )  # fmt: skip
    gemm = observed.get("gemm")
    if gemm is None:  # the raw path always has its GEMM stage; missing is a contract drift
        raise RuntimeError("dense plan for an external rotation exposes no `gemm` stage")
    return _judge_raw(case, inputs, weight, y, gemm)


def _judge_raw(case, inputs, weight, y, gemm):
    dtype = case_inputs.compute_dtype(case)
    verdict = tolerance.judge_gemm(
        gemm, _gemm_operand(inputs["x"], dtype), weight,
        compute_dtype=dtype, tolerance=case.variant.tolerance,
    )  # fmt: skip
    stored = gemm.to(torch.float16).to(y.dtype)  # run_dense: output = x.dtype(fp16(gemm))
    return require_equal(verdict, y, stored, what="output = x.dtype(fp16(gemm stage))")


def regenerate(case: Any, device: Any) -> dict[str, torch.Tensor]:
    """The case's inputs as the runner builds them (replay compares saved tensors with these)."""
    return case_inputs.dense_inputs(case, device)


def judge_saved(case: Any, label: str, y: torch.Tensor, device: Any) -> Any:
    """Re-judge a saved output of execution ``label`` from regenerated inputs (no kernel runs;
    no intermediate stages: the judge composes them)."""
    tensors = regenerate(case, device)
    weight = decode(tensors["trellis"], case.variant.codebook)
    y = y.to(device)
    if case.variant.rotation == "none":
        return _judge_raw(case, tensors, weight, y, y.to(case_inputs.compute_dtype(case)))
    return _judge(case, tensors, weight, y, {})


def run_case(case: Any, device: Any, *, tile: str | None = None) -> list[Outcome]:
    """Every execution of one dense case (module docstring); ``tile`` ``KxNxT`` pins the tile."""
    pinned = None if tile is None else list(parse_tile(tile))
    suffix = "" if pinned is None else ".tile_" + "x".join(map(str, pinned))
    contract = declared.op_contract("dense")
    tensors = case_inputs.dense_inputs(case, device)
    weight = decode(tensors["trellis"], case.variant.codebook)
    callback = identity_h128 if case.variant.rotation == "none" else None
    problem = dense_problem(case, pinned)
    outcomes = []
    for execution in executions(case, contract, pinned):
        op = contract.graph_op(device=execution.device, hadamard_128=callback)
        result = run_op(contract, op, problem, tensors, device)
        y = result.buffers["output"][: case.m]
        verdict = _judge(case, tensors, weight, y, {k: v[: case.m] for k, v in
                                                    result.observed.items()})  # fmt: skip
        note = f"path {result.plan.path}"
        if pinned is not None:
            planned = getattr(result.plan, "tile", None)
            got = None if planned is None else [planned.tile_k, planned.tile_n, planned.cta_threads]
            note += f", tile {suffix[6:]}"
            if got != pinned:
                why = f"pinned tile {pinned} but the plan ran tile {got}"
                verdict = dataclasses.replace(
                    verdict, passed=False, reasons=(*verdict.reasons, why)
                )
        name = f"gpu.dense.{case.case_id}" + (f".{execution.label}" if execution.label else "")
        outcomes.append(
            Outcome(
                name + suffix,
                verdict,
                case,
                tensors,
                y.detach(),
                note=note,
                extra={"path": result.plan.path} | ({"tile": pinned} if pinned else {}),
            )  # fmt: skip
        )
    return outcomes
