"""GPU checks (oracle_contract.md §2): decode exactness, the differential grid, the graph protocol.

On a machine without CUDA every family is ONE ``skip`` line with reason ``"no CUDA device"``
(:data:`FAMILY_NAMES`), never thousands; ``--tier gpu`` / ``--require-gpu`` turn that into a
failure in the CLI. With CUDA every case runs through :mod:`oracle.runners` — the contract's
plan / bind / run of each op b12x declares — and is judged with the one tolerance model:

* ``gpu.decode.<case>.<execution>`` — decode exactness through the decode op, the dense GEMM
  and the grouped MoE GEMM (:mod:`oracle.runners.decode`);
* ``gpu.dense.<case>[.<path>@<part>]`` — the dense linear and the raw GEMM on every dispatch path
  the case reaches, natively or planned on a simulated part (:mod:`oracle.runners.dense`);
* ``gpu.moe.<case>`` — the fused MoE: uniform, tiers and pairs (:mod:`oracle.runners.moe`);
* ``gpu.graph.<target>`` — the CUDA-graph protocol over every op (:mod:`oracle.runners.graph`).

Selection (:func:`select_grid`, the ONE place that decides it, shared by the one-GPU job and
every shard of a multi-GPU run): the default job is a stratified sample
(:func:`oracle.sampling.stratified_sample`) of :data:`DEFAULT_JOB_CASES` non-heavy cases of the
variants b12x declares — every declared variant, every M bucket edge of every op and both compute
dtypes at least once; ``--heavy`` (or a filter naming ``heavy``) selects the heavy shapes;
``--max-cases`` samples the same stratified way. Variants b12x does not declare are one ``skip``
line per reason. A failing case is saved and its reason carries the exact replay command;
:func:`replay_saved` re-judges a saved case.

A pinned tile (``python -m oracle run --tile KxNxT``): :func:`pinned_cases` keeps the cases the
tile qualifies for; none is a ``fail`` naming the tile (details: docs/notes/oracle.md).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from oracle.report import CheckResult

__all__ = [
    "DEFAULT_JOB_CASES",
    "FAMILY_NAMES",
    "pinned_cases",
    "case_results",
    "graph_results",
    "replay_saved",
    "run",
    "select_grid",
]

FAMILY_NAMES = ("gpu.decode_exactness", "gpu.differential_grid", "gpu.graph_protocol")
DEFAULT_JOB_CASES = 1200
WORKER_ENV = "B12X_SHARD"  # set in every shard process (oracle.sharding.launch_shards)


def default_workers() -> int:
    """Worker processes of a one-GPU job: half the CPU cores, at most 8 (compiles are
    CPU-bound; ``--workers 1`` runs in-process)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def unrunnable_reason(case: Any) -> str | None:
    """None when a runner judges this case, else why not (the variant is not declared, or its op
    has no differential runner)."""
    from oracle.runners import DIFFERENTIAL_OPS, runners_for

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
    from oracle.grids import cases, parse_case_id
    from oracle.sampling import stratified_sample

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
    """``KxNxT`` of a tile spec text (``oracle.checks.dispatch_tiles.parse_tile``)."""
    from oracle.checks.dispatch_tiles import parse_tile

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
    from b12x.ops.dense.tiles import WAVE_BALANCED_FC2, serialize
    from oracle.checks.dispatch_tiles import parse_tile
    from oracle.declared import op_contract
    from oracle.runners import dense as dense_runner
    from oracle.runners import inputs as case_inputs
    from oracle.runners import moe as moe_runner

    spec = list(parse_tile(tile))
    kept: list[Any] = []
    if spec == serialize(WAVE_BALANCED_FC2):
        contract = op_contract("moe")
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
    contract = op_contract("dense")
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
    from oracle.runners import run_case

    return run_case(
        case,
        device=torch.device("cuda"),
        results_dir=Path(ctx.results_dir),
        tile=getattr(ctx, "tile", None),
    )


def graph_results(ctx: Any) -> list[CheckResult]:
    from oracle.runners.graph import run_targets

    return run_targets(torch.device("cuda"))


def _grid(ctx: Any) -> list[CheckResult]:
    tile = getattr(ctx, "tile", None)
    runnable, out = select_grid(
        case=ctx.case, filter=ctx.filter, max_cases=ctx.max_cases, heavy=ctx.heavy, tile=tile,
        device=torch.device("cuda") if tile else None,
    )  # fmt: skip
    advance = ctx.advance("differential grid", len(runnable))
    for case in runnable:
        out += case_results(case, ctx)
        advance()
    return out


def _in_workers(ctx: Any) -> list[CheckResult]:
    """The grid and the graph protocol in ``ctx.workers`` processes on this one GPU (the shard
    machinery of :mod:`oracle.sharding`, every shard pinned to the same device): compiles are
    CPU-bound and a cold job is dominated by them, so the workers split the specialisations
    (shards group cases by kernel) and share the disk compile cache; one merged result list."""
    from oracle import sharding

    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    gpu = gpu or str(torch.cuda.current_device())
    selection = sharding.select_cases(
        filter=ctx.filter, case=ctx.case, max_cases=ctx.max_cases, heavy=ctx.heavy
    )
    plan = sharding.plan_shards(selection.runnable, ctx.workers)
    passthrough = ["--tier", "gpu", "--results", str(ctx.results_dir)]
    for flag, value in (("--filter", ctx.filter), ("--case", ctx.case),
                        ("--max-cases", ctx.max_cases)):  # fmt: skip
        if value is not None:
            passthrough += [flag, str(value)]
    if ctx.heavy:
        passthrough.append("--heavy")
    report, _ = sharding.run_multi_gpu(
        [gpu] * ctx.workers,
        Path(ctx.results_dir) / "workers",
        serial=bool(plan.serial),
        passthrough=passthrough,
    )
    return list(report.checks)


def in_workers(ctx: Any) -> bool:
    """True when :func:`run` hands the grid to ``ctx.workers`` processes (a parent with CUDA,
    tier gpu, no pinned tile, more than one worker): the caller only waits on them."""
    return bool(
        ctx.cuda
        and ctx.tier == "gpu"
        and not getattr(ctx, "tile", None)
        and ctx.workers > 1
        and WORKER_ENV not in os.environ
    )


def skipped(ctx: Any, suffix: str = "") -> list[CheckResult]:
    """One ``skip`` per GPU check family (names + ``suffix``) with why no GPU runs them: no CUDA
    device, or ``--tier cpu``."""
    why = "no CUDA device" if not ctx.cuda else "tier cpu selected (--tier)"
    return [CheckResult(f"{n}{suffix}", "gpu", "skip", why) for n in FAMILY_NAMES]


def run(ctx: Any) -> list[CheckResult]:
    if not (ctx.cuda and ctx.tier == "gpu"):
        return skipped(ctx)
    if getattr(ctx, "tile", None):  # in-process; the graph protocol pins no tile
        why = f"the graph protocol is not tile-pinned (--tile {ctx.tile})"
        return _grid(ctx) + [CheckResult("gpu.graph_protocol", "gpu", "skip", why)]
    if in_workers(ctx):
        return _in_workers(ctx)
    return _grid(ctx) + graph_results(ctx)


def replay_saved(path: str | Path, *, cuda: bool) -> tuple[CheckResult, Any]:
    """Re-judge a saved grid case: with CUDA its case is rerun through the runners; without, the
    saved kernel output is judged against references recomputed from the saved inputs
    (:mod:`oracle.runners.replay`)."""
    from oracle.runners.replay import replay

    return replay(path, cuda=cuda)
