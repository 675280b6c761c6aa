"""Pinned semantic slots: (callee, parameter) → the argument expressions a call may pass.

Layout
------
* ``fixtures/pinned_slots.json`` is either a list of entries or an object
  ``{"comment": str, "slots": [entries]}``. An entry is
  ``{"callee": qualname-or-suffix, "parameter": name, "allowed": [expression, ...],
  "explicit": bool, "reason": str}``.
* :func:`load_slots` reads and validates the file into :class:`PinnedSlot` records.
* :func:`check_pinned_slots` judges one bound call: a call that binds the parameter to an
  expression outside ``allowed`` (empty = anything goes), or, with ``explicit`` true, that leaves
  it to its default (or hides it behind ``**kwargs`` unpacking) is a violation.
* :func:`stale_slots` reports entries that match no function of the package, or name a parameter
  the callee does not have: a registry that silently matches nothing protects nothing (R16).

Invariants
----------
* ``callee`` matches a function qualname when equal to it or to one of its dotted suffixes
  (``Kernel.__init__`` matches ``pkg.mod.Kernel.__init__``); a class name stands for its
  ``__init__`` (``Kernel`` matches ``pkg.mod.Kernel.__init__``).
* Expressions are compared in normal form (``ast.unparse(ast.parse(expr))``), so ``"mcg"`` and
  ``'mcg'`` are the same expression and whitespace does not matter.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .binding import Binding
    from .index import PackageIndex
    from .resolve import CallSite


def normalize_expression(text: str) -> str:
    """Canonical source form of one Python expression (raises ValueError when it is not one)."""
    try:
        return ast.unparse(ast.parse(text, mode="eval").body)
    except SyntaxError as exc:
        raise ValueError(f"allowed: {text!r} is not a Python expression: {exc.msg}") from exc


@dataclass(frozen=True)
class PinnedSlot:
    callee: str
    parameter: str
    allowed: tuple[str, ...] = ()
    explicit: bool = False
    reason: str = ""

    def matches(self, qualname: str) -> bool:
        candidates = [qualname]
        if qualname.endswith(".__init__"):
            candidates.append(qualname[: -len(".__init__")])
        return any(c == self.callee or c.endswith("." + self.callee) for c in candidates)


def _entry(raw: object, where: str) -> PinnedSlot:
    if not isinstance(raw, dict):
        raise ValueError(f"slots_path: {where} must be an object, got {type(raw).__name__}")
    callee, parameter = raw.get("callee"), raw.get("parameter")
    allowed, explicit = raw.get("allowed", []), raw.get("explicit", False)
    if not isinstance(callee, str) or not callee:
        raise ValueError(f"slots_path: {where}.callee must be a non-empty string")
    if not isinstance(parameter, str) or not parameter.isidentifier():
        raise ValueError(f"slots_path: {where}.parameter must be an identifier")
    if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
        raise ValueError(f"slots_path: {where}.allowed must be a list of expression strings")
    if not isinstance(explicit, bool):
        raise ValueError(f"slots_path: {where}.explicit must be true or false")
    return PinnedSlot(
        callee,
        parameter,
        tuple(normalize_expression(a) for a in allowed),
        explicit,
        str(raw.get("reason", "")),
    )


def parse_slots(data: object) -> list[PinnedSlot]:
    """Validate already-loaded JSON (a list, or an object with a ``slots`` list)."""
    if isinstance(data, dict):
        data = data.get("slots", [])
    if not isinstance(data, list):
        raise ValueError("slots_path: expected a list of entries or an object with 'slots'")
    return [_entry(raw, f"slots[{i}]") for i, raw in enumerate(data)]


def load_slots(path: str | Path | None) -> list[PinnedSlot]:
    """Read pinned slots from ``path`` (``None`` → no slots)."""
    if path is None:
        return []
    if not isinstance(path, (str, Path)):
        raise TypeError(f"slots_path: expected str or Path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"slots_path: {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"slots_path: {path} is not valid JSON: {exc}") from exc
    return parse_slots(data)


def check_pinned_slots(
    site: CallSite, binding: Binding, slots: list[PinnedSlot]
) -> list[tuple[str, str | None, str]]:
    """(parameter, expression, message) for every pinned slot this call breaks."""
    found: list[tuple[str, str | None, str]] = []
    for slot in slots:
        if site.callee is None or not slot.matches(site.callee.qualname):
            continue
        reason = f" [{slot.reason}]" if slot.reason else ""
        param = binding.signature.get(slot.parameter)
        if param is None:
            continue  # reported once per entry by stale_slots, not at every call
        if slot.parameter in binding.bound:
            expression = ast.unparse(binding.bound[slot.parameter])
            if slot.allowed and expression not in slot.allowed:
                allowed = ", ".join(slot.allowed)
                found.append(
                    (slot.parameter, expression, f"`{expression}` is not one of: {allowed}{reason}")
                )
        elif slot.explicit and not site.partial:
            how = (
                "hidden behind argument unpacking"
                if binding.unpacked
                else f"not passed; relies on the default {param.default}"
            )
            found.append(
                (slot.parameter, param.default, f"must be passed explicitly, {how}{reason}")
            )
    return found


def stale_slots(index: PackageIndex, slots: list[PinnedSlot]) -> list[tuple[PinnedSlot, str]]:
    """(slot, message) for entries that match no function or no parameter of the package."""
    stale = []
    for slot in slots:
        matched = [f for q, f in index.functions.items() if slot.matches(q)]
        matched += [
            init
            for q, cls in index.classes.items()
            if slot.matches(f"{q}.__init__") and f"{q}.__init__" not in index.functions
            for init in [index.constructor(cls)]
            if init is not None and init.qualname == f"{q}.__init__"
        ]
        if not matched:
            stale.append((slot, f"pinned slot callee {slot.callee!r} matches no function"))
        elif not any(f.signature.get(slot.parameter) is not None for f in matched):
            stale.append(
                (slot, f"pinned parameter {slot.parameter!r} is in no signature of {slot.callee!r}")
            )
    return stale
