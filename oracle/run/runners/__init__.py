"""The oracle's GPU runners: every op b12x declares, judged through its plan / bind / run.

Layout
------
* :mod:`oracle.run.runners.dense` — dense linear (rotation ``full``) and raw GEMM (rotation
  ``none``, an identity external H128), on the native dispatch path and on the paths of simulated
  parts (the K6/MCG small-M row planned on an SM120).
* :mod:`oracle.run.runners.decode` — decode exactness: the decode op, the dense GEMM at the case's M
  and over the whole weight, and the grouped MoE GEMM (bit for bit, both compute dtypes).
* :mod:`oracle.run.runners.moe` — the fused MoE: uniform, K3/K4 tiers, QSRT pairs (static and
  dynamic), both layouts, inactive route ids; judged per route and per row.
* :mod:`oracle.run.runners.graph` — the CUDA-graph protocol over every op.

:func:`runners_for` says, without a GPU, which runners judge a registry variant (the coverage
report reads it); :func:`run_case` runs one grid case and returns one CheckResult per execution.

Invariants
----------
* A runner exists for a variant exactly when its op is declared by ``b12x.support`` and the
  runner module handles the variant's shape of payload (pairs, tiers); a declared variant
  without one fails the coverage check (:mod:`oracle.run.coverage`), never silently skips.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from oracle.cases import declared
from oracle.judge.tiles import parse_tile
from oracle.report.report import CheckResult
from oracle.run.runners import decode, dense, moe
from oracle.run.runners import inputs as case_inputs
from oracle.run.runners.common import crash, to_result
from oracle.run.runners.graph import target_variants
from reference import linear
from reference import moe as reference_moe
from reference.trellis import decode as decode_weight

__all__ = ["DIFFERENTIAL_OPS", "exact_output", "run_case", "runners_for", "saved_inputs"]

#: Grid ops that have a differential runner (module docstring).
DIFFERENTIAL_OPS = ("decode", "dense", "moe")


def runners_for(variant: Any) -> tuple[str, ...]:
    """Names of the runners that judge ``variant`` (CPU only; nothing is launched)."""
    if variant.kernel_coverage is None:
        return ()
    out: list[str] = []
    if variant.op == "decode":
        if variant.compute_dtype == "fp16":
            out.append("decode_op")
        out += ["decode_through_gemm", "decode_through_full_gemm"]
        if _grouped_declares(variant):
            out.append("decode_through_grouped_gemm")
    elif (variant.op, variant.rotation) in (("dense", "full"), ("dense", "none"), ("moe", "full")):
        out.append("differential")
    out += [f"graph:{t}" for t in target_variants().get(variant.name, ())]
    return tuple(out)


def _grouped_declares(variant: Any) -> bool:

    try:
        contract = declared.op_contract("moe_gemm")
    except ValueError:
        return False
    return any(d.codebook == variant.codebook and d.bits == variant.bits for d in contract.variants)


def _module(op: str) -> Any:
    return {"decode": decode, "dense": dense, "moe": moe}[op]


def run_case(
    case: Any, *, device: Any, results_dir: Path, tile: str | None = None
) -> list[CheckResult]:
    """Every execution of one grid case, judged; a crash is a failure of that case.

    ``tile`` (``KxNxT``, ``run --tile``): a dense case is planned with it pinned; a MoE case
    (the FC2-only wave tile) runs as planned, its FC2 taking the tile
    (:func:`oracle.run.grid.pinned_cases`). Result names end in ``.tile_<KxNxT>``."""
    label = "" if tile is None else "x".join(map(str, parse_tile(tile)))
    name = f"gpu.{case.variant.op}.{case.case_id}" + (f".tile_{label}" if tile else "")
    if case.variant.op not in DIFFERENTIAL_OPS:
        return [crash(name, ValueError(f"no runner for op {case.variant.op!r}"))]
    start = time.perf_counter()
    try:
        if tile is not None and case.variant.op == "dense":
            outcomes = _module("dense").run_case(case, device, tile=tile)
        else:
            outcomes = _module(case.variant.op).run_case(case, device)
        if tile is not None and case.variant.op != "dense":
            outcomes = [dataclasses.replace(o, name=f"{o.name}.tile_{label}") for o in outcomes]
    except Exception as exc:  # noqa: BLE001 - the case fails with the exception's text
        return [crash(name, exc)]
    wall = time.perf_counter() - start  # every execution, reference and judge of the case
    results = [to_result(o, results_dir) for o in outcomes]
    for result in results:  # where a job's time goes: oracle.report.report's slowest-case summary
        result.metrics["case_wall_s"] = round(wall, 4)
    return results


def saved_inputs(case: Any, device: Any = "cpu") -> dict[str, torch.Tensor]:
    """The named input tensors a failing execution of ``case`` saves (beside its output ``y``),
    exactly as the runner regenerates them from the case id: decode ``trellis``; dense ``x``,
    ``trellis``, ``suh``, ``svh``; MoE the op's inputs (tier payloads flattened)."""
    if case.variant.op not in DIFFERENTIAL_OPS:
        raise ValueError(f"case: op {case.variant.op!r} has no runner; known: {DIFFERENTIAL_OPS}")
    return _module(case.variant.op).regenerate(case, device)


def exact_output(case: Any, device: Any = "cpu") -> torch.Tensor:
    """The float64 reference output of ``case`` from its regenerated inputs (the error maps of
    ``report --tile-map`` and ``drift`` measure against it): decode the weight ``[K, N]``, dense
    ``[M, N]`` (the exact linear for rotation ``full``, ``x @ W`` for ``none``), MoE ``[M, H]``."""
    v = case.variant
    if v.op == "moe":
        t = case_inputs.moe_inputs(case, device)
        return reference_moe.stack_moe_forward(
            t["x"], t["experts"], t["topk_weights"], t["topk_ids"], precision="exact",
            compute_dtype=case_inputs.compute_dtype(case),
        )  # fmt: skip
    t = saved_inputs(case, device)
    weight = decode_weight(t["trellis"], v.codebook)
    if v.op == "decode":
        return weight.double()
    if v.rotation == "none":
        return t["x"].double() @ weight.double()
    return linear.forward_decoded(
        t["x"], weight, t["suh"], t["svh"], precision="exact",
        compute_dtype=case_inputs.compute_dtype(case),
    )  # fmt: skip
