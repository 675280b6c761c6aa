"""The one tolerance model (design §6), with its defaults as data.

Rule
----
Let ``y`` be the kernel output, ``e`` the exact fp64 reference and ``f`` the faithful reference
(the kernel's rounding points). Rows are the last dimension (see :mod:`oracle.metrics`). A case
passes when **all** of:

1. ``y`` has no NaN and no ±Inf (always; no tolerance waives it);
2. for every block of ``row_block`` consecutive rows:
   ``relL2_block(y, e) ≤ max(alpha · relL2_block(f, e), floor)``;
3. ``worst-row cosine(y, e) ≥ min_row_cosine`` (catches one bad row inside a good block).

Per-block gating means a single bad block fails even when the global rel-L2 (a mean) is fine.
Without a faithful reference the bound is the floor alone. ``exact`` tolerances (decode, layout,
replay vs eager) skip the rule and use :func:`judge_exact` (``torch.equal`` semantics).

Defaults (data, :data:`DEFAULT_TOLERANCES`) are per compute dtype; per-variant overrides live in
:mod:`oracle.variants` and must carry a non-empty reason (:meth:`Tolerance.override` enforces it).
Every :class:`Verdict` carries the full :class:`~oracle.metrics.Metrics`, pass or fail.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from oracle.metrics import Metrics, as_rows, compute_metrics, row_block_rel_l2

__all__ = [
    "DEFAULT_TOLERANCES",
    "Tolerance",
    "Verdict",
    "default_tolerance",
    "judge",
    "judge_exact",
]

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


#: Per compute dtype defaults. Measured with reference.linear (random payloads, M 1..129, K/N
#: 256..1280, mcg/sqg_e4m3/3inst): the faithful dense path's rel-L2 against exact is
#: 4.5e-4..5.3e-4 in fp16 and 3.0e-3..3.7e-3 in bf16, worst-row cosine >= 0.9999999 / 0.999993.
#: The floors sit ~2x above those rel-L2s, so a faithful error near zero (e.g. a one-hot input)
#: does not make the gate impossible; the cosine limits leave ~100x headroom in (1 - cos).
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "fp16": Tolerance(
        alpha=2.0,
        floor=1e-3,
        min_row_cosine=0.9999,
        row_block=16,
        reason="default fp16: alpha 2 (design §6); floor ~2x the faithful dense rel-L2 (~5e-4)",
    ),
    "bf16": Tolerance(
        alpha=2.0,
        floor=8e-3,
        min_row_cosine=0.999,
        row_block=16,
        reason="default bf16: alpha 2 (design §6); floor ~2x the faithful dense rel-L2 (~3.5e-3)",
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


def _check_tensor(t: Any, arg: str, fn: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {arg} must be a torch.Tensor, got {type(t).__name__}")


def judge(
    y: torch.Tensor,
    exact: torch.Tensor,
    faithful: torch.Tensor | None,
    tol: Tolerance | None = None,
) -> Verdict:
    """Apply the design §6 rule (module docstring). ``tol`` defaults to the fp16 default."""
    _check_tensor(y, "y", "judge")
    _check_tensor(exact, "exact", "judge")
    if faithful is not None:
        _check_tensor(faithful, "faithful", "judge")
    if tol is None:
        tol = DEFAULT_TOLERANCES["fp16"]
    if not isinstance(tol, Tolerance):
        raise TypeError(f"judge: tol must be a Tolerance, got {type(tol).__name__}")
    if tol.exact:
        return judge_exact(y, exact)
    metrics = compute_metrics(y, exact, faithful)  # validates shapes
    reasons: list[str] = []
    if metrics.nan_count or metrics.inf_count:
        reasons.append(f"non-finite output: {metrics.nan_count} NaN, {metrics.inf_count} Inf")
    y_blocks = row_block_rel_l2(y, exact, tol.row_block)
    if faithful is not None:
        f_blocks = row_block_rel_l2(faithful, exact, tol.row_block)
        bound = torch.clamp(tol.alpha * f_blocks, min=tol.floor)
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
            f"rel-L2 over the bound max(alpha={tol.alpha:g}·faithful, floor={tol.floor:g}) in "
            f"{len(bad_blocks)} of {bad.numel()} row blocks ({listed}{tail})"
        )
    if not metrics.worst_row_cosine >= tol.min_row_cosine:
        reasons.append(
            f"worst-row cosine {metrics.worst_row_cosine:.6g} < {tol.min_row_cosine:g} "
            f"(row {metrics.worst_row})"
        )
    details = {
        "tolerance": tol.to_dict(),
        "failing_row_blocks": bad_blocks,
        "rows": int(as_rows(exact).shape[0]),
    }
    return Verdict(passed=not reasons, reasons=tuple(reasons), metrics=metrics, details=details)


def judge_exact(a: torch.Tensor, b: torch.Tensor) -> Verdict:
    """``torch.equal`` semantics (same shape, same dtype, every element equal; NaN != NaN).

    On mismatch the reasons give the count and the first mismatching index (row-major)."""
    _check_tensor(a, "a", "judge_exact")
    _check_tensor(b, "b", "judge_exact")
    reasons: list[str] = []
    details: dict[str, Any] = {"mismatches": 0, "first_mismatch": None}
    same_shape = tuple(a.shape) == tuple(b.shape)
    if a.dtype != b.dtype:
        reasons.append(f"dtype {a.dtype} != {b.dtype}")
    if not same_shape:
        reasons.append(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
        metrics = _metrics_of_flat_prefix(a, b)
        return Verdict(False, tuple(reasons), metrics, details)
    a_cpu, b_cpu = a.detach().cpu(), b.detach().cpu()
    common = torch.promote_types(a_cpu.dtype, b_cpu.dtype)
    mismatch = a_cpu.to(common) != b_cpu.to(common)
    count = int(mismatch.sum())
    if count:
        first = torch.nonzero(mismatch.reshape(-1))[0].item()
        index = (
            tuple(int(i) for i in torch.unravel_index(torch.tensor(first), a.shape))
            if a.dim()
            else ()
        )
        details.update(mismatches=count, first_mismatch=list(index))
        reasons.append(
            f"{count} of {a.numel()} elements differ; first at index {index}: "
            f"{a_cpu.reshape(-1)[first].item()!r} != {b_cpu.reshape(-1)[first].item()!r}"
        )
    metrics = compute_metrics(a_cpu, b_cpu)
    return Verdict(passed=not reasons, reasons=tuple(reasons), metrics=metrics, details=details)


def _metrics_of_flat_prefix(a: torch.Tensor, b: torch.Tensor) -> Metrics:
    """Metrics when shapes differ: compare the common flat prefix, so a report still has numbers."""
    n = min(a.numel(), b.numel())
    return compute_metrics(a.detach().cpu().reshape(-1)[:n], b.detach().cpu().reshape(-1)[:n])
