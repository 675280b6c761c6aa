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

Per tile of every declared tile registry (:func:`tile_coverage`): its name and shape, the
(problem, simulated device) points where the one predicate qualifies it, and the kernel
specialisations the registry maps it to (JSON ``tiles``).

The coverage check of the default job (:func:`problems`) fails when a declared variant has no
runner or no case in the default job, when b12x declares something that maps onto no legal
registry variant (it would ship a variant nothing can judge), or when a registered tile
qualifies nowhere or maps to no kernel specialisation (nothing could ever judge it).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from typing import Any

from oracle.cases.variants import REGISTRY, unmapped
from oracle.run.grid import select_grid
from oracle.run.runners import runners_for

__all__ = [
    "SCHEMA",
    "TileCoverage",
    "VariantCoverage",
    "coverage",
    "default_case_counts",
    "problems",
    "tile_coverage",
    "to_json",
]

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


@dataclasses.dataclass(frozen=True)
class TileCoverage:
    registry: str
    name: str
    shape: str
    qualified: int  # (problem, device) points where the registry's predicate accepts it
    points: int  # (problem, device) points tried
    specializations: int  # kernel specs the registry maps it to (-1: the registry has no hook)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tile_coverage() -> list[TileCoverage]:
    """One record per entry of every declared tile registry (module docstring)."""
    from oracle.cases.declared import declared
    from oracle.judge.tiles import DEVICES

    registries, _ = declared("tile_registries")
    out = []
    for registry in registries or ():
        hook = getattr(registry, "specializations", None)
        points = [(p, d) for p in registry.problems for d in DEVICES]
        for tile in registry.entries:
            qualified = sum(bool(registry.qualify(tile, p, d)[0]) for p, d in points)
            try:
                specs = len(tuple(hook(tile))) if callable(hook) else -1
            except (TypeError, ValueError):  # a shape the kernels cannot be built for
                specs = 0
            name = getattr(tile, "name", "") or repr(tile)
            out.append(TileCoverage(registry.name, name, repr(tile), qualified, len(points), specs))
    return out


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


def problems(
    records: list[VariantCoverage] | None = None, tiles: list[TileCoverage] | None = None
) -> list[str]:
    """What makes the coverage check fail (module docstring); empty when it passes."""
    records = coverage() if records is None else records
    tiles = tile_coverage() if tiles is None else tiles
    found = []
    for r in records:
        if r.declared and not any(not name.startswith("graph:") for name in r.runners):
            found.append(f"{r.id}: declared by b12x but no differential runner judges it")
        elif r.declared and r.default_cases == 0:
            found.append(f"{r.id}: declared by b12x but the default job runs none of its cases")
    for declaration, why in unmapped():
        found.append(f"b12x declares {declaration!r}, which no registry variant names: {why}")
    for t in tiles:
        if t.qualified == 0:
            found.append(f"tile {t.name} of {t.registry}: qualifies on none of {t.points} points")
        if t.specializations == 0:
            found.append(f"tile {t.name} of {t.registry}: maps to no kernel specialisation")
    return found


def to_json(records: list[VariantCoverage] | None = None) -> dict[str, Any]:
    records = coverage() if records is None else records
    tiles = tile_coverage()
    return {
        "schema": SCHEMA,
        "variants": [r.to_dict() for r in records],
        "tiles": [t.to_dict() for t in tiles],
        "unmapped": [{"declaration": repr(d), "reason": why} for d, why in unmapped()],
        "problems": problems(records, tiles),
    }
