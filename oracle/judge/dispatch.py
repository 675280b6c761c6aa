"""Generic checks over a declared dispatch table (docs/architecture.md, §5.5; regression class R2).

The protocol a dispatch table must satisfy: A dispatch table is any object with these attributes
(b12x declares its own; this module never imports b12x, and tests use small doubles):

* ``name: str`` — what the table routes (e.g. ``"dense"``).
* ``paths: Sequence[path]`` — every implemented path. Each path has ``name: str`` and
  ``predicate(case) -> bool`` (the row's gate). Names are unique.
* ``boundaries`` — the boundaries as data (:class:`Boundary`, or any record or mapping with its
  fields, since b12x cannot import oracle): a ``name``, a ``base`` case, the ``field`` that is
  varied, the value on each side (``below``, ``above``) and the path expected on each side
  (``expect_below``, ``expect_above``), e.g. M 128 / 129 around the K6/MCG small-M row.
* ``explain(case)`` — an :class:`Explanation` or any object with ``path`` and ``reasons``: the
  chosen path and why (one reason per path considered, e.g. ``"k6_mcg_small_m: m=129 > 128"``).
  ``explain`` must be a pure function of the case.

A *case* is a plain mapping of dispatch fields (arch/capability, ``m``, ``bits``, ``codebook``,
``pair_kind``, ``compute_dtype``, ``external_rotation``, ``explicit_tile`` ...); the table decides
which fields it reads. Cases are never mutated by the checks.

The generic checks (each returns one :class:`Outcome`):
* :func:`check_boundaries`, :func:`check_reachability`, :func:`check_determinism`,
  :func:`check_consistency` (what each proves: docs/notes/oracle.md).

:func:`check_table` runs all four. An :class:`Outcome` carries the check name, the failure
messages (empty when it passed; capped at :data:`MAX_LISTED` with a count of the rest) and
metrics; :mod:`oracle.judge.tiles` reuses it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "MAX_LISTED",
    "Boundary",
    "DispatchTable",
    "Explanation",
    "Outcome",
    "Path",
    "boundaries",
    "boundary_cases",
    "check_boundaries",
    "check_consistency",
    "check_determinism",
    "check_reachability",
    "check_table",
    "validate_table",
]

MAX_LISTED = 8  # failure messages kept per outcome; the rest are counted


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What ``explain(case)`` returns: the chosen path's name and the reasons for the choice."""

    path: str
    reasons: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Path:
    """A convenience path record (any object with ``name`` and ``predicate`` conforms)."""

    name: str
    predicate: Any
    description: str = ""


@dataclasses.dataclass(frozen=True)
class Boundary:
    """A declared dispatch boundary: ``base`` with ``field`` set to ``below`` / ``above``."""

    name: str
    base: Mapping[str, Any]
    field: str
    below: Any
    above: Any
    expect_below: str
    expect_above: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("Boundary: name must be a non-empty string")
        if not isinstance(self.base, Mapping):
            raise TypeError(f"Boundary {self.name}: base must be a mapping")
        if not isinstance(self.field, str) or not self.field:
            raise ValueError(f"Boundary {self.name}: field must be a non-empty string")
        if self.below == self.above:
            raise ValueError(f"Boundary {self.name}: below and above are equal ({self.below!r})")

    def sides(self) -> tuple[tuple[str, dict[str, Any], str], ...]:
        """``(side, case, expected path)`` for the two sides."""
        return (
            ("below", {**self.base, self.field: self.below}, self.expect_below),
            ("above", {**self.base, self.field: self.above}, self.expect_above),
        )


@runtime_checkable
class DispatchTable(Protocol):
    name: str
    paths: Sequence[Any]
    boundaries: Sequence[Boundary]

    def explain(self, case: Mapping[str, Any]) -> Explanation: ...


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Result of one generic check: ``failures`` empty means it passed."""

    check: str
    failures: tuple[str, ...] = ()
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def reason(self) -> str:
        return "; ".join(self.failures)


def _outcome(check: str, failures: list[str], **metrics: Any) -> Outcome:
    listed = failures[:MAX_LISTED]
    if len(failures) > MAX_LISTED:
        listed.append(f"... and {len(failures) - MAX_LISTED} more")
    return Outcome(check, tuple(listed), {"failures": len(failures), **metrics})


def _fmt(case: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in case.items()) + "}"


def validate_table(table: Any) -> None:
    """Raise ``TypeError``/``ValueError`` naming what is missing before any check runs."""
    for attr in ("name", "paths", "boundaries", "explain"):
        if not hasattr(table, attr):
            raise TypeError(
                f"dispatch table: missing attribute `{attr}` (see oracle.judge.dispatch)"
            )
    if not callable(table.explain):
        raise TypeError("dispatch table: `explain` must be callable")
    names = []
    for i, path in enumerate(table.paths):
        if not isinstance(getattr(path, "name", None), str):
            raise TypeError(f"dispatch table {table.name}: paths[{i}] has no string `name`")
        if not callable(getattr(path, "predicate", None)):
            raise TypeError(f"dispatch table {table.name}: path {path.name} has no `predicate`")
        names.append(path.name)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"dispatch table {table.name}: duplicated path names {dupes}")
    boundaries(table)  # raises naming a malformed boundary


_BOUNDARY_FIELDS = ("name", "base", "field", "below", "above", "expect_below", "expect_above")


def boundaries(table: Any) -> list[Boundary]:
    """The table's boundaries as :class:`Boundary` (b12x declares its own records, or mappings,
    with the same fields, since it never imports oracle)."""
    out = []
    for i, b in enumerate(table.boundaries):
        if isinstance(b, Boundary):
            out.append(b)
            continue
        if isinstance(b, Mapping):
            has, get = b.__contains__, b.__getitem__
        else:
            has, get = (lambda f, b=b: hasattr(b, f)), (lambda f, b=b: getattr(b, f))
        missing = [f for f in _BOUNDARY_FIELDS if not has(f)]
        if missing:
            raise TypeError(f"dispatch table {table.name}: boundaries[{i}] lacks {missing}")
        out.append(Boundary(**{f: get(f) for f in _BOUNDARY_FIELDS}))
    return out


def _explain(table: Any, case: Mapping[str, Any], *, own_copy: bool = True) -> Explanation:
    result = table.explain(dict(case) if own_copy else case)
    if not isinstance(result, Explanation):
        path = getattr(result, "path", None)
        if not isinstance(path, str):
            raise TypeError(
                f"{table.name}.explain returned {type(result).__name__}, not Explanation"
            )
        result = Explanation(path, tuple(getattr(result, "reasons", ()) or ()))
    return result


def _paths_by_name(table: Any) -> dict[str, Any]:
    return {p.name: p for p in table.paths}


def boundary_cases(table: Any) -> list[dict[str, Any]]:
    """Both sides of every declared boundary, as plain cases."""
    return [case for b in boundaries(table) for _, case, _ in b.sides()]


def check_boundaries(table: Any) -> Outcome:
    """``explain`` at both sides of every boundary picks the expected path (module docstring)."""
    validate_table(table)
    declared = _paths_by_name(table)
    failures: list[str] = []
    declared_boundaries = boundaries(table)
    for b in declared_boundaries:
        for side, case, expected in b.sides():
            where = f"boundary {b.name} ({side}: {b.field}={case[b.field]!r})"
            if expected not in declared:
                failures.append(f"{where}: expected path `{expected}` is not declared")
                continue
            try:
                got = _explain(table, case)
            except Exception as exc:  # noqa: BLE001 - a crashing explain is a failure, reported
                failures.append(f"{where}: explain raised {type(exc).__name__}: {exc}")
                continue
            if got.path != expected:
                why = "; ".join(got.reasons) or "no reasons given"
                failures.append(
                    f"{where}: expected `{expected}`, explain chose `{got.path}` ({why})"
                )
            elif not declared[expected].predicate(dict(case)):
                failures.append(f"{where}: `{expected}` chosen but its own predicate is false")
    return _outcome("dispatch.boundaries", failures, boundaries=len(declared_boundaries))


def check_reachability(table: Any, grid: Iterable[Mapping[str, Any]]) -> Outcome:
    """Every declared path is chosen somewhere; nothing undeclared is ever chosen."""
    validate_table(table)
    declared = _paths_by_name(table)
    points = [dict(c) for c in grid] + boundary_cases(table)
    hits: dict[str, int] = {name: 0 for name in declared}
    failures: list[str] = []
    for case in points:
        try:
            path = _explain(table, case).path
        except Exception as exc:  # noqa: BLE001
            failures.append(f"explain raised {type(exc).__name__} at {_fmt(case)}: {exc}")
            continue
        if path not in declared:
            failures.append(f"explain chose undeclared path `{path}` at {_fmt(case)}")
            continue
        hits[path] += 1
    for name, count in hits.items():
        if count == 0:
            failures.append(
                f"path `{name}` is unreachable: no grid point or boundary side selects it"
            )
    return _outcome("dispatch.reachability", failures, points=len(points), hits=hits)


def check_determinism(table: Any, grid: Iterable[Mapping[str, Any]]) -> Outcome:
    """Same answer twice and on a deep copy; the case is not mutated."""
    validate_table(table)
    failures: list[str] = []
    points = [dict(c) for c in grid] + boundary_cases(table)
    for case in points:
        snapshot = copy.deepcopy(case)
        try:
            first = _explain(table, case, own_copy=False)  # the original: mutation shows
            second = _explain(table, copy.deepcopy(case))
        except Exception as exc:  # noqa: BLE001
            failures.append(f"explain raised {type(exc).__name__} at {_fmt(case)}: {exc}")
            continue
        if case != snapshot:
            failures.append(f"explain mutated the case {_fmt(snapshot)}")
        if (first.path, first.reasons) != (second.path, second.reasons):
            failures.append(
                f"explain is not deterministic at {_fmt(case)}: `{first.path}` then `{second.path}`"
            )
    return _outcome("dispatch.determinism", failures, points=len(points))


def check_consistency(table: Any, grid: Iterable[Mapping[str, Any]]) -> Outcome:
    """At every grid point the chosen path's own predicate holds."""
    validate_table(table)
    declared = _paths_by_name(table)
    failures: list[str] = []
    points = [dict(c) for c in grid] + boundary_cases(table)
    for case in points:
        try:
            path = _explain(table, case).path
        except Exception as exc:  # noqa: BLE001
            failures.append(f"explain raised {type(exc).__name__} at {_fmt(case)}: {exc}")
            continue
        if path in declared and not declared[path].predicate(dict(case)):
            failures.append(f"`{path}` chosen at {_fmt(case)} but its predicate is false")
    return _outcome("dispatch.consistency", failures, points=len(points))


def check_table(table: Any, grid: Iterable[Mapping[str, Any]] = ()) -> list[Outcome]:
    """All generic dispatch checks, in a fixed order."""
    validate_table(table)
    points = [dict(c) for c in grid]
    return [
        check_boundaries(table),
        check_reachability(table, points),
        check_determinism(table, points),
        check_consistency(table, points),
    ]
