"""What b12x declares: its typed contract (``b12x.support.OPS``), read once for the oracle.

* :func:`ops` is every ``OpContract`` b12x ships; :func:`op_contract` one by name. The records'
  mapping onto the registry's vocabulary (``DeclaredVariant`` -> :class:`Variant`) lives beside
  the registry, in :mod:`oracle.cases.variants` (``registry_variant``, ``declarations``,
  ``unmapped``): a variant's coverage is a property of the variant.
* No fallbacks: the contract is imported directly; an import error is a real failure.
"""

from __future__ import annotations

from typing import Any

from b12x import support

__all__ = ["op_contract", "ops"]


def ops() -> tuple[Any, ...]:
    """``b12x.support.OPS``: every op contract b12x ships."""
    return tuple(support.OPS)


def op_contract(name: str) -> Any:
    """``b12x.support.op_contract(name)`` (ValueError naming the known ops)."""
    return support.op_contract(name)
