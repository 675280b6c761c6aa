"""GPU checks (oracle_contract.md §2): decode exactness, the differential grid, the graph protocol.

On a machine without CUDA every family is ONE ``skip`` line with reason ``"no CUDA device"``
(:data:`FAMILY_NAMES`), never thousands; ``--tier gpu`` / ``--require-gpu`` turn that into a
failure in the CLI. With CUDA every case runs through :mod:`oracle.run.runners` — the contract's
plan / bind / run of each op b12x declares — and is judged with the one tolerance model:

* ``gpu.decode.<case>.<execution>`` — decode exactness through the decode op, the dense GEMM
  and the grouped MoE GEMM (:mod:`oracle.run.runners.decode`);
* ``gpu.dense.<case>[.<path>@<part>]`` — the dense linear and the raw GEMM on every dispatch path
  the case reaches, natively or planned on a simulated part (:mod:`oracle.run.runners.dense`);
* ``gpu.moe.<case>`` — the fused MoE: uniform, tiers and pairs (:mod:`oracle.run.runners.moe`);
* ``gpu.graph.<target>`` — the CUDA-graph protocol over every op (:mod:`oracle.run.runners.graph`).

Which cases run, and one case's run, are :mod:`oracle.run.grid` (shared with every shard of
:mod:`oracle.run.sharding`). A failing case is saved and its reason carries the exact replay
command; :func:`replay_saved` re-judges a saved case.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from oracle.report.report import CheckResult
from oracle.run import grid, sharding
from oracle.run.replay import replay

__all__ = ["FAMILY_NAMES", "default_workers", "in_workers", "replay_saved", "run", "skipped"]

FAMILY_NAMES = ("gpu.decode_exactness", "gpu.differential_grid", "gpu.graph_protocol")
WORKER_ENV = "B12X_SHARD"  # set in every shard process (oracle.run.sharding.launch_shards)


def default_workers() -> int:
    """Worker processes of a one-GPU job: half the CPU cores, at most 8 (compiles are
    CPU-bound; ``--workers 1`` runs in-process)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def _grid(ctx: Any) -> list[CheckResult]:
    tile = getattr(ctx, "tile", None)
    runnable, out = grid.select_grid(
        case=ctx.case, filter=ctx.filter, max_cases=ctx.max_cases, heavy=ctx.heavy, tile=tile,
        device=torch.device("cuda") if tile else None,
    )  # fmt: skip
    advance = ctx.advance("differential grid", len(runnable))
    for case in runnable:
        out += grid.case_results(case, ctx)
        advance()
    return out


def _in_workers(ctx: Any) -> list[CheckResult]:
    """The grid and the graph protocol in ``ctx.workers`` processes on this one GPU (the shard
    machinery of :mod:`oracle.run.sharding`, every shard pinned to the same device): compiles are
    CPU-bound and a cold job is dominated by them, so the workers split the specialisations
    (shards group cases by kernel) and share the disk compile cache; one merged result list."""
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
    return _grid(ctx) + grid.graph_results(ctx)


def replay_saved(path: str | Path, *, cuda: bool) -> tuple[CheckResult, Any]:
    """Re-judge a saved grid case: with CUDA its case is rerun through the runners; without, the
    saved kernel output is judged against references recomputed from the saved inputs
    (:mod:`oracle.run.replay`)."""
    return replay(path, cuda=cuda)
