"""The grid a GPU job runs, and one case's run (the gpu family of :mod:`oracle.checks.gpu` and
every shard of :mod:`oracle.run.sharding` share it).

Selection (:func:`select_grid`, the ONE place that decides it, shared by the one-GPU job and
every shard of a multi-GPU run): the default job is a stratified sample
(:func:`oracle.cases.sampling.stratified_sample`) of :data:`DEFAULT_JOB_CASES` non-heavy cases of
the variants b12x declares — every declared variant, every M bucket edge of every op and both
compute dtypes at least once; ``--heavy`` (or a filter naming ``heavy``) selects the heavy shapes;
``--max-cases`` samples the same stratified way. Variants b12x does not declare are one ``skip``
line per reason.

A pinned tile (``python -m oracle run --tile KxNxT``, ``CheckContext.tile``): :func:`pinned_cases`
keeps the dense cases whose problem the tile qualifies for — each planned through the contract's
graph op with ``tile=`` (``plan_dense`` pins it through THE predicate
``b12x.ops.dense.tiles.qualify``; a ``tile:`` refusal means it does not qualify) — and the runner
plans each with the same ``tile=`` (results ``….tile_<KxNxT>``). The wave-balanced FC2 tile pins
nothing on the dense linear (FC2 only): it is judged through the MoE runner on the uniform,
unpaired MoE cases whose plan on this device takes it (a ``moe_fc2_tile`` decision on the
``wave_balanced`` row). No qualifying case is a ``fail`` naming the tile, never a pass. A pinned
run judges the grid in-process and leaves the graph protocol (not tile-pinned) out, one ``skip``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from b12x.ops.dense.tiles import WAVE_BALANCED_FC2, serialize
from oracle.cases import declared
from oracle.cases.grids import cases, parse_case_id
from oracle.cases.sampling import stratified_sample
from oracle.judge.tiles import parse_tile
from oracle.report.report import CheckResult
from oracle.run.runners import DIFFERENTIAL_OPS, run_case, runners_for
from oracle.run.runners import dense as dense_runner
from oracle.run.runners import inputs as case_inputs
from oracle.run.runners import moe as moe_runner
from oracle.run.runners.graph import run_targets

__all__ = [
    "DEFAULT_JOB_CASES",
    "case_results",
    "graph_results",
    "pinned_cases",
    "select_grid",
    "tile_label",
    "unrunnable_reason",
]

DEFAULT_JOB_CASES = 1200


def unrunnable_reason(case: Any) -> str | None:
    """None when a runner judges this case, else why not (the variant is not declared, or its op
    has no differential runner)."""
    v = case.variant
    if v.kernel_coverage is None:
        return v.no_coverage_reason or "not declared by b12x.support"
    if v.op not in DIFFERENTIAL_OPS or not runners_for(v):
        return f"no runner in the oracle for {v.name}"
    return None


def select_grid(
    *,
    case: str | None = None,
    filter: str | None = None,  # noqa: A002 - the CLI's name
    max_cases: int | None = None,
    heavy: bool = False,
    tile: str | None = None,
    device: Any = None,
) -> tuple[list[Any], list[CheckResult]]:
    """The grid cases a GPU run executes, and one skip line per reason for those it leaves out
    (module docstring). ``tile`` (``KxNxT``) keeps the cases pinned to it (:func:`pinned_cases`,
    planned for ``device``); none is one ``fail`` line naming the tile."""
    notes: list[CheckResult] = []
    if case:
        pool = [parse_case_id(case)]
    else:
        clauses = [c for c in (filter, "heavy=true" if heavy else None) if c]
        if not any("heavy" in c for c in clauses):
            clauses.append("heavy=false")
            count = len(cases(tier="gpu", filter="heavy=true"))
            why = f"{count} heavy case(s) not in this run: add --heavy to run them"
            notes.append(CheckResult("gpu.heavy", "gpu", "skip", why))
        pool = cases(tier="gpu", filter=",".join(clauses))
    runnable, skipped = [], Counter()
    for item in pool:
        why = unrunnable_reason(item)
        if why is None:
            runnable.append(item)
        else:
            skipped[(item.variant.op, why)] += 1
    notes += [
        CheckResult(f"gpu.unrunnable.{op}.{i}", "gpu", "skip", f"{count} case(s): {why}")
        for i, ((op, why), count) in enumerate(sorted(skipped.items()))
    ]
    if tile is not None:
        runnable, why = pinned_cases(runnable, tile, device=device)
        if not runnable:
            label = tile_label(tile)
            reason = f"tile {label}: no grid case of this selection qualifies ({why})"
            notes.append(CheckResult(f"gpu.tile_{label}", "gpu", "fail", reason))
    if not case:
        budget = max_cases if max_cases is not None else (None if filter else DEFAULT_JOB_CASES)
        if budget is not None and len(runnable) > budget:
            runnable = stratified_sample(runnable, budget)
    return runnable, notes


def tile_label(tile: str) -> str:
    """``KxNxT`` of a tile spec text (``oracle.judge.tiles.parse_tile``)."""
    return "x".join(map(str, parse_tile(tile)))


def _takes_wave_fc2(plan: Any) -> bool:
    return any(
        d.role.endswith("fc2_tile") and d.path == "wave_balanced"
        for d in getattr(plan, "decisions", ())
    )


def pinned_cases(pool: list[Any], tile: str, *, device: Any = None) -> tuple[list[Any], str]:
    """``(cases, "")``: the cases of ``pool`` a run pinned to ``tile`` judges (module
    docstring), planned for ``device`` (``None``: the current CUDA device; a simulated part
    works on CPU); or ``([], why)``."""
    spec = list(parse_tile(tile))
    kept: list[Any] = []
    if spec == serialize(WAVE_BALANCED_FC2):
        contract = declared.op_contract("moe")
        op = contract.graph_op()
        moe = [c for c in pool if c.variant.op == "moe" and c.variant.tier_layout is None
               and c.variant.pair_kind is None]  # fmt: skip
        for case in moe:
            choices = case_inputs.moe_choices(case)
            problem = moe_runner.moe_problem(case, None, choices, device or torch.device("cuda"))
            if _takes_wave_fc2(op.plan(problem)):
                kept.append(case)
        why = (
            f"FC2-only tile: judged through the MoE runner; none of {len(moe)} uniform unpaired "
            "MoE case(s) plans its FC2 with it on this device"
        )
        return kept, "" if kept else why
    contract = declared.op_contract("dense")
    first = ""
    dense = [c for c in pool if c.variant.op == "dense"]
    for case in dense:
        callback = dense_runner.identity_h128 if case.variant.rotation == "none" else None
        problem = {**dense_runner.dense_problem(case), "tile": spec}
        try:
            contract.graph_op(device=device, hadamard_128=callback).plan(problem)
        except ValueError as exc:
            if not str(exc).startswith("tile:"):
                raise
            first = first or f"e.g. {case.case_id}: {exc}"
            continue
        kept.append(case)
    why = f"the tile qualifies for none of {len(dense)} dense case(s); {first or 'no dense case'}"
    return kept, "" if kept else why


def case_results(case: Any, ctx: Any) -> list[CheckResult]:
    """Every judged execution of one case on the current CUDA device (pinned to ``ctx.tile``)."""
    return run_case(
        case,
        device=torch.device("cuda"),
        results_dir=Path(ctx.results_dir),
        tile=getattr(ctx, "tile", None),
    )


def graph_results(ctx: Any) -> list[CheckResult]:

    return run_targets(torch.device("cuda"))
