"""Verdicts and the parts every judge of :mod:`oracle.judge.tolerance` shares
(oracle_contract.md §3).

* :class:`Tolerance` (the coarse gate's parameters, ``reason`` never empty),
  :data:`DEFAULT_TOLERANCES` per compute dtype and :func:`default_tolerance`;
  :class:`Verdict` (passed, reasons, metrics, details).
* Argument checks, each a ``TypeError`` / ``ValueError`` naming the judge and the argument:
  :func:`check_tensor_arg`, :func:`float_tensor`, :func:`check_shape`, :func:`check_device`,
  :func:`compute_dtype_arg`, :func:`tolerance_arg`, :func:`observed_stages`.
* Verdict building: :func:`coarse_verdict` (the coarse gates, rule 4 of
  :mod:`oracle.judge.tolerance`, with the metrics and their bounds), :func:`judged_stage` /
  :func:`stage_values` (one stage's element-wise report), :func:`operand_bound` (the legitimate set
  a stage hands the next one: the observed values when the kernel exposed them) and
  :func:`summarise` (one verdict from the stage reports and the coarse gates).

The judges themselves live in :mod:`oracle.judge.tolerance` (``judge``, ``judge_gemm``,
``judge_linear``, ``judge_exact``) and :mod:`oracle.judge.moe_judge` (``judge_moe``); this module
imports neither, so both import it without an import circle.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from oracle.judge import envelope as env
from oracle.judge.metrics import Metrics, as_rows, compute_metrics, row_block_rel_l2

__all__ = [
    "COMPUTE_DTYPES",
    "DEFAULT_TOLERANCES",
    "DTYPE_NAMES",
    "MAX_LISTED_BLOCKS",
    "Tolerance",
    "Verdict",
    "check_device",
    "check_shape",
    "check_tensor_arg",
    "coarse_verdict",
    "compute_dtype_arg",
    "default_tolerance",
    "float_tensor",
    "judged_stage",
    "observed_stages",
    "operand_bound",
    "stage_values",
    "summarise",
    "tolerance_arg",
]

COMPUTE_DTYPES = (torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


MAX_LISTED_BLOCKS = 4  # failing row blocks listed by name in a verdict's reasons


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Gate parameters. ``reason`` says where the numbers come from (never empty)."""

    alpha: float = 2.0
    floor: float = 1e-3
    min_row_cosine: float = 0.999
    row_block: int = 16
    reason: str = "default"
    exact: bool = False

    def __post_init__(self) -> None:
        for arg in ("alpha", "floor", "min_row_cosine"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Tolerance: {arg} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"Tolerance: {arg} must be finite, got {value}")
        if self.alpha <= 0:
            raise ValueError(f"Tolerance: alpha must be > 0, got {self.alpha}")
        if self.floor < 0:
            raise ValueError(f"Tolerance: floor must be >= 0, got {self.floor}")
        if not -1.0 <= self.min_row_cosine <= 1.0:
            raise ValueError(
                f"Tolerance: min_row_cosine must be in [-1, 1], got {self.min_row_cosine}"
            )
        if (
            isinstance(self.row_block, bool)
            or not isinstance(self.row_block, int)
            or self.row_block < 1
        ):
            raise ValueError(f"Tolerance: row_block must be a positive int, got {self.row_block!r}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("Tolerance: reason must be a non-empty string")
        if not isinstance(self.exact, bool):
            raise TypeError(f"Tolerance: exact must be a bool, got {type(self.exact).__name__}")

    def override(self, *, reason: str, **changes: Any) -> Tolerance:
        """A copy with ``changes`` applied. ``reason`` is mandatory, non-empty and not "default"."""
        if not isinstance(reason, str) or not reason.strip() or reason.strip() == "default":
            raise ValueError("Tolerance.override: reason must say why (non-empty, not 'default')")
        allowed = {f.name for f in dataclasses.fields(self)} - {"reason"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"Tolerance.override: unknown fields {sorted(unknown)}")
        return dataclasses.replace(self, reason=reason, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Per compute dtype defaults, set from the faithful path's measured error against exact
#: (docs/evidence/oracle-default-tolerances.md).
#: alpha = 2: a legitimate kernel's rel-L2 against exact is another draw of the same rounding
#: noise (ratio ~1 +- a few % per 16-row block). The floors (~2 ulps relative) apply only to a
#: row block whose faithful error is exactly zero (nothing rounded, e.g. exactly representable
#: results), where a kernel that sums in another order may still flip a rounding; they never
#: decide a normal case (the element-wise model is the sharp gate). The cosine limits leave
#: ~100x headroom in (1 - cos).
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "fp16": Tolerance(
        alpha=2.0,
        floor=1e-3,
        min_row_cosine=0.9999,
        row_block=16,
        reason="default fp16: alpha 2; floor ~2 ulps, only where faithful == exact",
    ),
    "bf16": Tolerance(
        alpha=2.0,
        floor=8e-3,
        min_row_cosine=0.999,
        row_block=16,
        reason="default bf16: alpha 2; floor ~2 ulps, only where faithful == exact",
    ),
}


def default_tolerance(dtype: str) -> Tolerance:
    """The default for compute dtype ``"fp16"`` or ``"bf16"``."""
    try:
        return DEFAULT_TOLERANCES[dtype]
    except (KeyError, TypeError):
        raise ValueError(
            f"default_tolerance: dtype must be one of {tuple(DEFAULT_TOLERANCES)}, got {dtype!r}"
        ) from None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Outcome of one judgement: passed, the reasons it failed (empty when passed), metrics."""

    passed: bool
    reasons: tuple[str, ...]
    metrics: Metrics
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reasons": list(self.reasons),
            "metrics": self.metrics.to_dict(),
            "details": dict(self.details),
        }


def check_tensor_arg(t: Any, arg: str, fn: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {arg} must be a torch.Tensor, got {type(t).__name__}")


# ------------------------------------------------------------------------------ coarse gate


def coarse_verdict(
    y: torch.Tensor, exact: torch.Tensor, faithful: torch.Tensor | None, tol: Tolerance
) -> tuple[list[str], dict[str, Any], Metrics]:
    """The coarse gates (module docstring, rule 4) and the metrics with their bounds."""
    metrics = compute_metrics(y, exact, faithful)  # validates shapes
    reasons: list[str] = []
    if metrics.nan_count or metrics.inf_count:
        reasons.append(f"non-finite output: {metrics.nan_count} NaN, {metrics.inf_count} Inf")
    y_blocks = row_block_rel_l2(y, exact, tol.row_block)
    if faithful is not None:
        f_blocks = row_block_rel_l2(faithful, exact, tol.row_block)
        bound = torch.where(
            f_blocks > 0, tol.alpha * f_blocks, torch.full_like(f_blocks, tol.floor)
        )
    else:
        bound = torch.full_like(y_blocks, tol.floor)
    bad = ~(y_blocks <= bound)  # NaN counts as bad
    bad_blocks = torch.nonzero(bad).flatten().tolist()
    if bad_blocks:
        listed = ", ".join(
            f"rows {b * tol.row_block}..{b * tol.row_block + tol.row_block - 1}: "
            f"{float(y_blocks[b]):.3g} > {float(bound[b]):.3g}"
            for b in bad_blocks[:MAX_LISTED_BLOCKS]
        )
        more = len(bad_blocks) - MAX_LISTED_BLOCKS
        tail = f", +{more} more" if more > 0 else ""
        reasons.append(
            f"rel-L2 over the bound alpha={tol.alpha:g}·faithful (floor={tol.floor:g} only where "
            f"the faithful error is zero) in {len(bad_blocks)} of {bad.numel()} row blocks "
            f"({listed}{tail})"
        )
    if not metrics.worst_row_cosine >= tol.min_row_cosine:
        reasons.append(
            f"worst-row cosine {metrics.worst_row_cosine:.6g} < {tol.min_row_cosine:g} "
            f"(row {metrics.worst_row})"
        )
    ratios = torch.where(bound > 0, y_blocks / bound.clamp_min(1e-300), y_blocks * math.inf)
    ratios = torch.nan_to_num(ratios, nan=math.inf)
    worst = int(torch.argmax(ratios)) if ratios.numel() else 0
    metrics = metrics.with_bounds(
        coarse_bound=float(bound[worst]) if bound.numel() else None,
        coarse_ratio=float(ratios[worst]) if ratios.numel() else None,
    )
    details = {
        "tolerance": tol.to_dict(),
        "failing_row_blocks": bad_blocks,
        "floor_blocks": int((bound == tol.floor).sum()) if faithful is not None else bad.numel(),
        "rows": int(as_rows(exact).shape[0]),
    }
    return reasons, details, metrics


# ------------------------------------------------------------------------------ validation


def float_tensor(value: Any, arg: str, fn: str, dtypes: tuple | None = None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {arg} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{fn}: {arg} must be a floating tensor, got {value.dtype}")
    if dtypes is not None and value.dtype not in dtypes:
        wanted = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{fn}: {arg} must have dtype {wanted}, got {value.dtype}")
    return value


def check_shape(value: torch.Tensor, shape: tuple[int, ...], arg: str, fn: str) -> None:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{fn}: {arg} must have shape {list(shape)}, got {list(value.shape)}")


def check_device(value: torch.Tensor, device: torch.device, arg: str, fn: str) -> None:
    if value.device != device:
        raise ValueError(f"{fn}: {arg} must be on {device}, got {value.device}")


def compute_dtype_arg(value: Any, fn: str) -> torch.dtype:
    if value not in COMPUTE_DTYPES:
        raise ValueError(
            f"{fn}: compute_dtype must be torch.float16 or torch.bfloat16, got {value!r}"
        )
    return value


def tolerance_arg(value: Any, compute_dtype: torch.dtype, fn: str) -> Tolerance:
    if value is None:
        return default_tolerance(DTYPE_NAMES[compute_dtype])
    if not isinstance(value, Tolerance):
        raise TypeError(f"{fn}: tolerance must be a Tolerance, got {type(value).__name__}")
    return value


def observed_stages(value: Any, names: tuple[str, ...], fn: str) -> dict[str, torch.Tensor]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{fn}: observed must be a mapping of stage name -> tensor")
    unknown = set(value) - set(names)
    if unknown:
        raise ValueError(f"{fn}: observed has unknown stages {sorted(unknown)} (known: {names})")
    return dict(value)


# ------------------------------------------------------------------------------ verdicts


def summarise(
    reports: dict[str, env.StageReport],
    coarse: tuple[list[str], dict[str, Any], Metrics],
    extra: dict[str, Any],
) -> Verdict:
    coarse_reasons, details, metrics = coarse
    reasons = list(coarse_reasons)
    for report in reports.values():
        reasons.extend(report.reasons)
    judged = [r for r in reports.values() if r.observed]
    bias = [r for r in judged if r.bias_applied]
    closest = None
    if bias:

        def margin(r: env.StageReport) -> float:
            worst = max(abs(r.bias_mean_ulp), abs(r.bias_signed_mean_ulp))
            return worst / r.bias_bound_ulp if r.bias_bound_ulp > 0 else math.inf

        closest = max(bias, key=margin)
    metrics = metrics.with_bounds(
        envelope_checked=sum(r.checked for r in judged),
        envelope_violations=sum(r.violations for r in judged),
        envelope_worst_ratio=max((r.worst_ratio for r in judged), default=0.0),
        envelope_worst_excess_ulp=max((r.worst_excess_ulp for r in judged), default=0.0),
        bias_mean_ulp=(
            None
            if closest is None
            else max(closest.bias_mean_ulp, closest.bias_signed_mean_ulp, key=abs)
        ),
        bias_bound_ulp=None if closest is None else closest.bias_bound_ulp,
    )
    details = {
        **details,
        **extra,
        "stages": {name: report.to_dict() for name, report in reports.items()},
        "model": {
            "lambda": env.LAMBDA,
            "kappa": env.KAPPA,
            "gamma_h": env.GAMMA_H,
            "bias_z": env.BIAS_Z,
            "bias_min_elements": env.BIAS_MIN_ELEMENTS,
        },
    }
    return Verdict(passed=not reasons, reasons=tuple(reasons), metrics=metrics, details=details)


def stage_values(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` rounded (correctly) into ``dtype``, as float64."""
    return env.round_values(t.detach(), dtype)


def judged_stage(
    stage: env.StageSet,
    observed: torch.Tensor | None,
    composed_into: str,
    rows: torch.Tensor | None = None,
) -> env.StageReport:
    if observed is None:
        return env.StageReport.not_observed(stage.name, composed_into)
    return env.check_stage(stage, observed, rows=rows)


def operand_bound(
    stage: env.StageSet, observed: torch.Tensor | None, dtype: torch.dtype
) -> env.Bound:
    """The next stage's input in ``dtype``: the observed values, or (unobserved) the value a
    legitimate kernel stored, as :meth:`~oracle.judge.envelope.StageSet.stored` models it."""
    if observed is not None:
        return env.Bound.exact(stage_values(observed, dtype))
    return stage.stored(dtype)
