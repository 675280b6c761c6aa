"""What b12x declares: its typed contract (``b12x.support.OPS``), read once for the oracle.

* :func:`ops` is every ``OpContract`` b12x ships; :func:`op_contract` one by name; :func:`declared`
  the distinct dispatch tables or tile registries they declare. The records'
  mapping onto the registry's vocabulary (``DeclaredVariant`` -> :class:`Variant`) lives beside
  the registry, in :mod:`oracle.cases.variants` (``registry_variant``, ``declarations``,
  ``unmapped``): a variant's coverage is a property of the variant.
* No fallbacks: the contract is imported directly; an import error is a real failure.
"""

from __future__ import annotations

from typing import Any

from b12x import support

__all__ = ["declared", "op_contract", "ops"]


def ops() -> tuple[Any, ...]:
    """``b12x.support.OPS``: every op contract b12x ships."""
    return tuple(support.OPS)


def op_contract(name: str) -> Any:
    """``b12x.support.op_contract(name)`` (ValueError naming the known ops)."""
    return support.op_contract(name)


def declared(hook: str) -> tuple[list[Any] | None, str]:
    """``(objects, "")``: every distinct dispatch table (``hook == "dispatch_tables"``) or tile
    registry (``"tile_registries"``) of b12x's op contracts, or ``(None, reason)`` when no op
    declares one."""
    if hook not in ("dispatch_tables", "tile_registries"):
        raise ValueError(f"hook: expected dispatch_tables or tile_registries, got {hook!r}")
    found: dict[int, Any] = {}
    for contract in ops():
        items = contract.dispatch if hook == "dispatch_tables" else (contract.tiles,)
        for item in items:
            if item is not None:
                found.setdefault(id(item), item)
    if not found:
        return None, f"no op of b12x.support declares {hook.replace('_', ' ')}"
    return list(found.values()), ""
