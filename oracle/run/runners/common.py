"""What every runner shares: running one op through its contract, outcomes, saving failures.

Layout
------
* :func:`run_op` is the consumer's door: ``graph_op.plan(problem)`` → the contract's
  ``allocate(plan, device)`` (the oracle owns the buffers, exactly the plan's) → poison the output
  and every observable stage buffer (NaN for floats, 0xFF bytes otherwise, so an unwritten
  element shows) → ``graph_op.bind(plan, buffers)`` → ``graph_op.run(bound, inputs)``. It returns
  the plan, the buffers and the observed stages (``contract.observables`` maps a plan buffer onto
  a judge stage name, docs/oracle_contract.md §3).
* :class:`Outcome` is one judged execution (a case may have several: the dispatch path of the
  real device and, e.g., the K6 row planned on a simulated SM120). :func:`to_result` turns it into
  a :class:`~oracle.report.report.CheckResult`; a failing outcome saves its case (inputs, kernel
  output, verdict) and its reason carries the replay command.

Invariants
----------
* No runner calls a host launcher or a kernel directly: only the contract's plan/bind/run.
* A crash inside a runner is that execution's failure, never a skip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from oracle.judge.tolerance import Verdict, judge_exact
from oracle.report.report import CheckResult
from oracle.report.results import replay_command, save_case

__all__ = ["Outcome", "crash", "poison", "require_equal", "run_op", "to_result"]


def poison(t: torch.Tensor) -> None:
    """NaN for floating buffers, 0xFF bytes otherwise (an unwritten element stays visible)."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.view(-1).view(torch.uint8).fill_(0xFF)


@dataclasses.dataclass
class RunResult:
    plan: Any
    buffers: dict[str, torch.Tensor]
    observed: dict[str, torch.Tensor]


def run_op(
    contract: Any, op: Any, problem: Mapping[str, Any], inputs: Mapping[str, Any], device: Any
) -> RunResult:
    """plan → allocate → poison → bind → run (module docstring)."""
    plan = op.plan(problem)
    buffers = dict(contract.allocate(plan, device))
    for name in ("output", *contract.observables):
        if name in buffers and buffers[name] is not None:
            poison(buffers[name])
    bound = op.bind(plan, buffers)
    op.run(bound, inputs)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    observed = {
        stage: buffers[name]
        for name, stage in contract.observables.items()
        if buffers.get(name) is not None
    }
    return RunResult(plan, buffers, observed)


@dataclasses.dataclass
class Outcome:
    """One judged execution of a case."""

    name: str
    verdict: Any  # oracle.judge.tolerance.Verdict
    case: Any
    inputs: Mapping[str, torch.Tensor]
    output: torch.Tensor  # where the kernel wrote it (copied to the host only to be saved)
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def _save(outcome: Outcome, results_dir: Path) -> str:
    tensors = {
        k: t.detach().cpu() for k, t in outcome.inputs.items() if isinstance(t, torch.Tensor)
    }
    tensors["y"] = outcome.output.detach().cpu()  # copied to the host only when saved
    meta = {
        "case_id": outcome.case.case_id,
        "case": outcome.case.to_dict(),
        "execution": outcome.name,
        "note": outcome.note,
        "verdict": outcome.verdict.to_dict(),
        "kind": "grid",
    }
    return replay_command(save_case(meta, tensors, results_dir))


def to_result(outcome: Outcome, results_dir: Path) -> CheckResult:
    """A CheckResult for ``outcome``; a failure saves the case and names the replay command."""
    verdict = outcome.verdict
    metrics = {
        **verdict.metrics.to_dict(),
        "variant": outcome.case.variant.name,
        "m": outcome.case.m,
        "k": outcome.case.k,
        "n": outcome.case.n,
        **outcome.extra,
    }
    if verdict.passed:
        return CheckResult(outcome.name, "gpu", "pass", outcome.note, metrics)
    try:
        command = _save(outcome, results_dir)
        tail = f" — replay: {command}"
    except Exception as exc:  # noqa: BLE001 - never mask the verdict
        tail = f" — could not save the case: {type(exc).__name__}: {exc}"
    reason = (f"{outcome.note}: " if outcome.note else "") + verdict.reason + tail
    return CheckResult(outcome.name, "gpu", "fail", reason, metrics)


def require_equal(verdict: Any, got: torch.Tensor, want: torch.Tensor, *, what: str) -> Any:
    """``verdict`` with one more requirement: ``got`` equals ``want`` bit for bit."""
    exact = judge_exact(got, want)
    if exact.passed:
        return verdict
    reasons = (*verdict.reasons, f"{what}: {exact.reason}")
    details = {**verdict.details, "exact": {what: exact.details}}
    return Verdict(False, reasons, verdict.metrics, details)


def crash(name: str, exc: BaseException) -> CheckResult:
    return CheckResult(name, "gpu", "fail", f"raised {type(exc).__name__}: {exc}")
