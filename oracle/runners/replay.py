"""Replay of a saved failing case (``python -m oracle replay FILE``).

A saved grid case holds its case id, the execution that failed (``gpu.<op>.<case id>[.<label>]``),
its input tensors and the kernel output ``y``. Replay first checks that the file is what it
claims: the case id must parse to a grid case, and every saved input must equal, bit for bit,
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

__all__ = ["ReplayMismatch", "replay"]


class ReplayMismatch(ValueError):
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
    from oracle.grids import parse_case_id
    from oracle.results import load_case
    from oracle.runners import run_case

    loaded = load_case(path)
    case_id = loaded.meta.get("case_id")
    try:
        case = parse_case_id(case_id)
    except (TypeError, ValueError) as exc:
        raise ReplayMismatch(f"{path}: not a grid case ({exc})") from None
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
    if "y" not in loaded.tensors:
        raise ReplayMismatch(f"{path}: no kernel output `y` saved")
    label = execution.removeprefix(f"gpu.{case.variant.op}.{case.case_id}").lstrip(".")
    label = label.split("@")[0].split(".")[0] if case.variant.op == "dense" else label
    verdict = _module(case.variant.op).judge_saved(case, label, loaded.tensors["y"], "cpu")
    status = "pass" if verdict.passed else "fail"
    reason = "saved kernel output (no CUDA: references only); " + (
        verdict.reason or "within tolerance"
    )
    return (
        CheckResult(f"replay.{execution}", "cpu", status, reason, verdict.metrics.to_dict()),
        verdict,
    )
