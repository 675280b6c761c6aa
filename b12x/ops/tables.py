"""Decision tables: the one machinery behind every declarative host decision (docs/architecture.md).

The dense dispatch table (:mod:`b12x.ops.dense.dispatch`), the split-K table
(:mod:`b12x.ops.dense.split_k`) and the MoE's tables (:mod:`b12x.ops.moe.dispatch`) are built
from the pieces below; what differs between them is data (fields, rows, boundaries), never the
way a row is tried or a reason is written.

Layout:
* **Cases** are plain mappings, validated per field by a :class:`Schema` of :class:`Field` s:
  :meth:`Schema.normalize` returns a fresh dict (each value through the field's ``check``, which
  normalises or raises naming the field; absent ones take the ``default``; an absent required
  field, an unknown field or a non-mapping raises). A field's ``joint`` check runs on the case
  normalised so far. Generic checks: :func:`positive_int`, :func:`optional`,
  :func:`int_choice`, :func:`str_choice`.
* A :class:`Condition` is one named gate: ``holds(case)`` and ``describe(case)`` (why it failed).
* A :class:`Row` is a path: name, description, named conditions (the **first failed condition is
  the rejection reason**, :meth:`Row.failed`) and the answer ``value`` (constant or callable).
* A :class:`DecisionTable` is what ``oracle.judge.dispatch`` checks (``name``, ``paths``,
  ``boundaries``, ``explain``) plus ``decide``, ``normalize_case`` and ``fields``.
  :meth:`DecisionTable.explain` returns an :class:`Explanation` ``(path, reasons, value)``; a
  case no row accepts raises ``ValueError`` with every reason (fail closed). With
  ``current_rows``, ``explain`` consults the rows it returns at every call (so a test can plant
  a fault the oracle must catch against ``paths``). Details: docs/notes/b12x.md.
* :class:`Boundary` declares both sides of a threshold as data (the fields of
  ``oracle.judge.dispatch.Boundary``: b12x cannot import the oracle).

Invariants: ``explain`` is a pure function of the case, every row seeing the case normalised
once; nothing here knows a particular table (no field name, threshold or path name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "UNKNOWN_IN_TABLE",
    "UNKNOWN_SORTED",
    "Boundary",
    "Condition",
    "DecisionTable",
    "Explanation",
    "Field",
    "Row",
    "Schema",
    "int_choice",
    "optional",
    "positive_int",
    "str_choice",
]

#: Unknown-field message naming the table, known fields in declaration order.
UNKNOWN_IN_TABLE = "case: unknown field(s) {unknown} for table {table}; known: {known}"
#: Unknown-field message listing the known fields sorted by name.
UNKNOWN_SORTED = "case: unknown field(s) {unknown}; known: {sorted_known}"

_REQUIRED = object()


def _type_name(value: object) -> str:
    return type(value).__name__


# ---------------------------------------------------------------------------- field checks


def positive_int(name: str, value: Any) -> int:
    """A positive ``int`` (never a ``bool``); raises naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected int, got {_type_name(value)}")
    if value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return value


def optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """``check`` that lets ``None`` through unchanged."""

    def check_optional(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return check_optional


def _choice(
    choices: tuple[Any, ...],
    optional: bool,
    kind: str,
    is_kind: Callable[[Any], bool],
    show: Callable[[Any], str],
) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if not is_kind(value):
            raise TypeError(f"{name}: expected {kind}, got {_type_name(value)}")
        if value not in choices:
            want = f"None or one of {choices}" if optional else f"one of {choices}"
            raise ValueError(f"{name}: expected {want}, got {show(value)}")
        return value

    return check


def int_choice(choices: tuple[int, ...], optional: bool = False) -> Callable[[str, Any], Any]:
    """One of the ints ``choices`` (or ``None`` when ``optional``); never a ``bool``."""
    return _choice(
        choices, optional, "int", lambda v: isinstance(v, int) and not isinstance(v, bool), str
    )


def str_choice(choices: tuple[str, ...], optional: bool = False) -> Callable[[str, Any], Any]:
    """One of the strings ``choices`` (or ``None`` when ``optional``)."""
    return _choice(choices, optional, "str", lambda v: isinstance(v, str), repr)


# ---------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Field:
    """One case field: ``check(name, value)`` normalises or raises naming the field; ``default``
    is used when the case omits it (required fields have none); ``joint(case)`` runs after the
    field on the case normalised so far (module docstring)."""

    name: str
    check: Callable[[str, Any], Any]
    default: Any = _REQUIRED
    doc: str = ""
    joint: Callable[[dict[str, Any]], None] | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclasses.dataclass(frozen=True)
class Schema:
    """The fields of one table's cases; :meth:`normalize` validates a case (module docstring)."""

    table: str
    fields: tuple[Field, ...]
    unknown: str = UNKNOWN_IN_TABLE

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def defaults(self) -> dict[str, Any]:
        """The default of every optional field, in field order."""
        return {f.name: f.default for f in self.fields if not f.required}

    def normalize(self, case: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(case, Mapping):
            raise TypeError(f"case: expected a mapping, got {_type_name(case)}")
        known = list(self.names)
        unknown = sorted(str(k) for k in case if k not in known)
        if unknown:
            raise ValueError(
                self.unknown.format(
                    unknown=unknown, table=self.table, known=known, sorted_known=sorted(known)
                )
            )
        out: dict[str, Any] = {}
        for f in self.fields:
            if f.name in case:
                out[f.name] = f.check(f.name, case[f.name])
            elif f.required:
                raise ValueError(f"{f.name}: missing from the {self.table} case (required)")
            else:
                out[f.name] = f.default
            if f.joint is not None:
                f.joint(out)
        return out


# ---------------------------------------------------------------------------- rows and tables


@dataclasses.dataclass(frozen=True)
class Condition:
    """One named gate of a row: ``holds(case)``; ``describe(case)`` explains a failure."""

    name: str
    holds: Callable[[Mapping[str, Any]], bool]
    describe: Callable[[Mapping[str, Any]], str]


@dataclasses.dataclass(frozen=True)
class Row:
    """A path: its conditions (in order) and its answer (a constant or ``value(case)``)."""

    name: str
    description: str
    schema: Schema
    conditions: tuple[Condition, ...]
    value: Any = None

    def first_failed(self, norm: Mapping[str, Any]) -> Condition | None:
        """The first condition that fails on the normalised case ``norm`` (None: all hold)."""
        for cond in self.conditions:
            if not cond.holds(norm):
                return cond
        return None

    def failed(self, case: Mapping[str, Any]) -> Condition | None:
        """The row's rejection reason for ``case`` (validated first), or None."""
        return self.first_failed(self.schema.normalize(case))

    def predicate(self, case: Mapping[str, Any]) -> bool:
        return self.failed(case) is None

    def answer_of(self, norm: Mapping[str, Any]) -> Any:
        """The row's answer for the normalised case ``norm``."""
        return self.value(norm) if callable(self.value) else self.value

    def answer(self, case: Mapping[str, Any]) -> Any:
        return self.answer_of(self.schema.normalize(case))


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The chosen path, one reason per row considered, and the chosen row's answer."""

    path: str
    reasons: tuple[str, ...] = ()
    value: Any = None


@dataclasses.dataclass(frozen=True)
class Boundary:
    """Same fields as ``oracle.judge.dispatch.Boundary``: ``base`` with ``field`` set to each
    side."""

    name: str
    base: dict
    field: str
    below: Any
    above: Any
    expect_below: str
    expect_above: str


@dataclasses.dataclass(frozen=True)
class DecisionTable:
    """One decision: the object ``oracle.judge.dispatch`` checks (``name``, ``paths``,
    ``boundaries``, ``explain``), plus :meth:`decide` (the chosen row's value) and the case schema.
    ``refusal`` words a case no row accepts (``{name}`` is the table's name); ``explanation`` builds
    the answer from ``(path, reasons, value)``; ``current_rows`` (module docstring)."""

    name: str
    description: str
    schema: Schema
    paths: tuple[Row, ...]
    boundaries: tuple[Boundary, ...]
    refusal: str = "no {name} row accepts it"
    explanation: Callable[[str, tuple[str, ...], Any], Explanation] = Explanation
    current_rows: Callable[[], Sequence[Row]] | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        return self.schema.names

    def normalize_case(self, case: Mapping[str, Any]) -> dict[str, Any]:
        return self.schema.normalize(case)

    def explain(self, case: Mapping[str, Any]) -> Explanation:
        norm = self.schema.normalize(case)
        reasons = []
        rows = self.paths if self.current_rows is None else self.current_rows()
        for row in rows:
            failed = row.first_failed(norm)
            if failed is None:
                reasons.append(f"{row.name}: selected")
                return self.explanation(row.name, tuple(reasons), row.answer_of(norm))
            reasons.append(f"{row.name}: {failed.describe(norm)}")
        refusal = self.refusal.format(name=self.name)
        raise ValueError(f"case: {refusal} (" + "; ".join(reasons) + ")")

    def decide(self, case: Mapping[str, Any]) -> Any:
        return self.explain(case).value

    @classmethod
    def build(
        cls,
        name: str,
        description: str,
        fields: Sequence[Field],
        rows: Sequence[tuple[str, str, Sequence[Condition], Any]],
        boundaries: Sequence[Boundary],
        **options: Any,
    ) -> DecisionTable:
        """A table whose ``(name, description, conditions, value)`` rows are bound to one
        schema of ``fields`` (``options``: ``refusal``, ``explanation``, the schema's
        ``unknown``)."""
        unknown = options.pop("unknown", UNKNOWN_IN_TABLE)
        schema = Schema(name, tuple(fields), unknown)
        paths = tuple(Row(r[0], r[1], schema, tuple(r[2]), r[3]) for r in rows)
        return cls(name, description, schema, paths, tuple(boundaries), **options)
