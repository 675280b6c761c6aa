"""Replay of a saved failing case (``python -m oracle replay FILE``).

A saved grid case holds its case id, the execution that failed (``gpu.<op>.<case id>[.<label>]``),
its input tensors and the kernel output ``y``. Replay first checks that the file is what it
claims (:func:`oracle.results.check_grid_case`: the id is a grid point, the meta and the tensor
layout agree with it), and every saved input must equal, bit for bit,
the input the runner regenerates from that id (an edited id or tensor is a :class:`ReplayMismatch`,
never a pass). Then:

* with CUDA, the case is run again through :mod:`oracle.runners` and the execution with the
  saved name is reported (all of them when the name is not among the results);
* without CUDA, the saved ``y`` is judged again against references recomputed on the CPU
  (``judge_saved`` of the op's runner; intermediate stages were not saved, so the judge composes
  them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from oracle.report import CheckResult
from oracle.results import CaseFileError

__all__ = ["ReplayMismatch", "replay"]


class ReplayMismatch(CaseFileError):
    """A saved case disagrees with its own id (edited id, shapes, dtypes or values)."""


def _module(op: str) -> Any:
    from oracle.runners import decode, dense, moe

    return {"decode": decode, "dense": dense, "moe": moe}[op]


def _check_inputs(case: Any, saved: dict[str, torch.Tensor]) -> None:
    regenerated = _module(case.variant.op).regenerate(case, "cpu")
    for name, want in regenerated.items():
        got = saved.get(name)
        if got is None:
            continue
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise ReplayMismatch(
                f"saved `{name}` is {got.dtype} {tuple(got.shape)}, but case {case.case_id} makes "
                f"{want.dtype} {tuple(want.shape)}: the file does not belong to its case id"
            )
        same = torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))
        if not same:
            raise ReplayMismatch(
                f"saved `{name}` differs from the input case {case.case_id} generates: the "
                "file does not belong to its case id"
            )


def replay(path: str | Path, *, cuda: bool) -> tuple[CheckResult, Any]:
    """Re-judge the saved case at ``path`` (module docstring). Raises :class:`ReplayMismatch`
    (a ValueError) when the file disagrees with its id."""
    from oracle.results import check_grid_case, load_case
    from oracle.runners import run_case

    loaded = load_case(path)  # CaseFileError: unreadable, corrupt, no case id
    case = check_grid_case(loaded)  # CaseFileError: not a grid point, meta or layout disagree
    from oracle.checks.gpu import unrunnable_reason

    why = unrunnable_reason(case)
    if why is not None:  # nothing in the oracle can judge it: a skip, never a verdict
        name = f"replay.gpu.{case.variant.op}.{case.case_id}"
        return CheckResult(name, "cpu", "skip", why), None
    saved = {k: t for k, t in loaded.tensors.items() if k != "y"}
    _check_inputs(case, saved)
    execution = loaded.meta.get("execution") or f"gpu.{case.variant.op}.{case.case_id}"
    if cuda:
        results = run_case(case, device=torch.device("cuda"), results_dir=Path(path).parent)
        chosen = [r for r in results if r.name == execution] or results
        failed = [r for r in chosen if r.status == "fail"]
        pick = failed[0] if failed else chosen[0]
        reason = f"kernel rerun on CUDA; {pick.reason or 'within tolerance'}"
        return CheckResult(f"replay.{pick.name}", "gpu", pick.status, reason, pick.metrics), None
    label = execution.removeprefix(f"gpu.{case.variant.op}.{case.case_id}").lstrip(".")
    label = label.split("@")[0].split(".")[0] if case.variant.op == "dense" else label
    if case.variant.op == "decode" and not label:  # saved without an execution: the decode op
        label = "op"
    verdict = _module(case.variant.op).judge_saved(case, label, loaded.tensors["y"], "cpu")
    status = "pass" if verdict.passed else "fail"
    reason = "saved kernel output (no CUDA: references only); " + (
        verdict.reason or "within tolerance"
    )
    return (
        CheckResult(f"replay.{execution}", "cpu", status, reason, verdict.metrics.to_dict()),
        verdict,
    )
