"""Coverage: for every registry variant, who declares it, who judges it, how often by default.

``python -m oracle coverage [--json FILE]`` prints, per variant of
:data:`oracle.cases.variants.REGISTRY`:

* ``declared`` — whether b12x's typed contract (``b12x.support.OPS``) declares it; when not,
  ``reason`` says why (the registry's own reason for a variant nobody ships, e.g. coupled
  Hadamard, or "b12x.support does not declare ...");
* ``runners`` — the oracle runners that judge it (:func:`oracle.run.runners.runners_for`:
  ``differential``, ``decode_op``, ``decode_through_gemm``, ``decode_through_full_gemm``,
  ``decode_through_grouped_gemm``, ``graph:<target>``);
* ``default_cases`` — how many cases of it the default GPU job runs
  (:func:`oracle.run.grid.select_grid` with no selection: computed on the CPU, nothing runs).

JSON (``schema`` :data:`SCHEMA`): ``{"schema", "variants": [{"id", "declared", "runners",
"default_cases", "reason"}], "unmapped": [{"declaration", "reason"}], "problems": [...]}``.

The coverage check of the default job (:func:`problems`) fails when a declared variant has no
runner or no case in the default job, or when b12x declares something that maps onto no legal
registry variant (it would ship a variant nothing can judge).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from typing import Any

from oracle.cases.variants import REGISTRY, unmapped
from oracle.run.grid import select_grid
from oracle.run.runners import runners_for

__all__ = ["SCHEMA", "VariantCoverage", "coverage", "default_case_counts", "problems", "to_json"]

SCHEMA = "oracle.coverage/1"


@dataclasses.dataclass(frozen=True)
class VariantCoverage:
    id: str
    declared: bool
    runners: tuple[str, ...]
    default_cases: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "runners": list(self.runners)}


@functools.cache
def default_case_counts() -> dict[str, int]:
    """Cases per variant name in the default GPU job's selection (CPU only)."""
    runnable, _ = select_grid()
    return dict(Counter(case.variant.name for case in runnable))


def coverage() -> list[VariantCoverage]:
    """One record per registry variant (module docstring)."""
    counts = default_case_counts()
    out = []
    for variant in REGISTRY:
        declared = variant.kernel_coverage is not None
        out.append(
            VariantCoverage(
                id=variant.name,
                declared=declared,
                runners=runners_for(variant),
                default_cases=counts.get(variant.name, 0),
                reason="" if declared else (variant.no_coverage_reason or "not declared"),
            )
        )
    return out


def problems(records: list[VariantCoverage] | None = None) -> list[str]:
    """What makes the coverage check fail (module docstring); empty when it passes."""
    records = coverage() if records is None else records
    found = []
    for r in records:
        if r.declared and not any(not name.startswith("graph:") for name in r.runners):
            found.append(f"{r.id}: declared by b12x but no differential runner judges it")
        elif r.declared and r.default_cases == 0:
            found.append(f"{r.id}: declared by b12x but the default job runs none of its cases")
    for declaration, why in unmapped():
        found.append(f"b12x declares {declaration!r}, which no registry variant names: {why}")
    return found


def to_json(records: list[VariantCoverage] | None = None) -> dict[str, Any]:
    records = coverage() if records is None else records
    return {
        "schema": SCHEMA,
        "variants": [r.to_dict() for r in records],
        "unmapped": [{"declaration": repr(d), "reason": why} for d, why in unmapped()],
        "problems": problems(records),
    }
