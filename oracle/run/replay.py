"""Replay of a saved failing case (``python -m oracle replay FILE``).

A saved grid case holds its case id, the execution that failed (``gpu.<op>.<case id>[.<label>]``),
its input tensors and the kernel output ``y``. Replay first checks that the file is what it
claims (:func:`check_grid_case`: the id is a grid point, the meta and the
tensor layout agree with it), and every saved input must equal, bit for bit,
the input the runner regenerates from that id (an edited id or tensor is a :class:`ReplayMismatch`,
never a pass). Then:

* with CUDA, the case is run again through :mod:`oracle.run.runners` and the execution with the
  saved name is reported (all of them when the name is not among the results);
* without CUDA, the saved ``y`` is judged again against references recomputed on the CPU
  (``judge_saved`` of the op's runner; intermediate stages were not saved, so the judge composes
  them).

A case saved by an adapted kernel (``kind: "adapter"``, ``run --kernel``) names its adapter and
is replayed by :func:`oracle.run.adapter.replay_adapter_case` the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from oracle.cases.grids import SelectionError, resolve_case_id
from oracle.report.report import CheckResult
from oracle.report.results import CaseFileError, LoadedCase, load_case, same_bits
from oracle.run.adapter import replay_adapter_case
from oracle.run.grid import unrunnable_reason
from oracle.run.runners import decode, dense, moe, run_case, saved_inputs

__all__ = ["ReplayMismatch", "check_grid_case", "grid_case_layout", "replay"]


class ReplayMismatch(CaseFileError):
    """A saved case disagrees with its own id (edited id, shapes, dtypes or values)."""


def _module(op: str) -> Any:
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
        if not same_bits(got, want):
            raise ReplayMismatch(
                f"saved `{name}` differs from the input case {case.case_id} generates: the "
                "file does not belong to its case id"
            )


def grid_case_layout(case: Any) -> dict[str, tuple[tuple[int, ...] | None, tuple[str, ...]]]:
    """name -> (shape, accepted dtype names) of the tensors a failing grid execution saves for
    ``case``: its inputs as :func:`oracle.run.runners.saved_inputs` regenerates them, plus the
    kernel output ``y`` (shape None: it depends on the execution, e.g. a decode case's one-hot
    GEMM rows)."""
    out: dict[str, tuple[tuple[int, ...] | None, tuple[str, ...]]] = {
        name: (tuple(t.shape), (str(t.dtype).removeprefix("torch."),))
        for name, t in saved_inputs(case, "cpu").items()
    }
    out["y"] = (None, ("float16", "bfloat16", "float32"))
    return out


def check_grid_case(loaded: LoadedCase) -> Any:
    """The grid :class:`~oracle.cases.grids.Case` a loaded file was saved for, after checking that
    the file agrees with it (module docstring); :class:`CaseFileError` otherwise."""
    where = str(loaded.path)
    case_id = loaded.meta["case_id"]
    try:
        case = resolve_case_id(case_id)
    except SelectionError as exc:
        test = loaded.meta.get("test")
        how = f"; it was saved by test {test} (rerun that with pytest)" if test else ""
        raise CaseFileError(f"{where}: not a replayable grid case: {exc}{how}") from None
    described = loaded.meta.get("case")
    if described is not None:
        if not isinstance(described, dict):
            raise CaseFileError(f"{where}: 'case' must be an object, got {described!r}")
        if described.get("case_id", case_id) != case_id:
            raise CaseFileError(
                f"{where}: case_id {case_id!r} disagrees with case.case_id "
                f"{described.get('case_id')!r}"
            )
        for field in ("m", "k", "n", "experts", "top_k", "seed"):
            if field in described and described[field] != getattr(case, field):
                raise CaseFileError(
                    f"{where}: case.{field} = {described[field]!r} disagrees with the id's "
                    f"{getattr(case, field)!r}"
                )
        name = (described.get("variant") or {}).get("name", case.variant.name)
        if name != case.variant.name:
            raise CaseFileError(
                f"{where}: case.variant {name!r} disagrees with the id's {case.variant.name!r}"
            )
    variant = loaded.meta.get("variant", case.variant.name)
    if variant != case.variant.name:
        raise CaseFileError(
            f"{where}: variant {variant!r} disagrees with the id's {case.variant.name!r}"
        )
    want = grid_case_layout(case)
    if set(loaded.tensors) != set(want):
        raise CaseFileError(
            f"{where}: tensors {sorted(loaded.tensors)} are not the {sorted(want)} that a "
            f"{case.variant.name} grid case saves"
        )
    for name, (shape, dtypes) in want.items():
        got = loaded.tensors[name]
        got_dtype = str(got.dtype).removeprefix("torch.")
        if (shape is not None and tuple(got.shape) != shape) or got_dtype not in dtypes:
            raise CaseFileError(
                f"{where}: tensor {name!r} is {got_dtype}{list(got.shape)}, case id {case_id} "
                f"needs {'/'.join(dtypes)}{list(shape) if shape is not None else ''}"
            )
    return case


def replay(path: str | Path, *, cuda: bool) -> tuple[CheckResult, Any]:
    """Re-judge the saved case at ``path`` (module docstring). Raises :class:`ReplayMismatch`
    (a ValueError) when the file disagrees with its id."""
    loaded = load_case(path)  # CaseFileError: unreadable, corrupt, no case id
    if loaded.meta.get("kind") == "adapter":
        return replay_adapter_case(loaded, cuda=cuda), None
    case = check_grid_case(loaded)  # CaseFileError: not a grid point, meta or layout disagree
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
