"""What b12x declares, read from its typed contract (``b12x.support.OPS``), in registry terms.

Layout
------
* ``b12x.support`` lists every op it ships as an ``OpContract`` whose ``variants`` are
  ``DeclaredVariant`` records (docs/oracle_contract.md §1). :func:`registry_variant` maps one
  record onto the oracle's :class:`~oracle.variants.Variant` vocabulary:

  ==========================  =====================================================
  DeclaredVariant             Variant
  ==========================  =====================================================
  op decode / dense / moe     op decode / dense / moe
  compute_dtype torch dtype   compute_dtype "fp16" / "bf16"
  rotation                    rotation (decode "none", dense "full"/"none", moe "full")
  pair_kind (moe)             pair_kind, rate_axis None (MoE pairs are phase-bound)
  tier_bits (3, 4)            tier_layout "k3k4"
  layouts, pair_modes, paths  (execution choices inside one variant; the runners vary them)
  ==========================  =====================================================

* :func:`declarations` is the map registry variant -> the declaration(s) b12x gives for it;
  :func:`unmapped` lists declarations that name no registry variant (a contract drift the
  coverage check fails on: b12x would ship something nothing judges).
* :func:`op_contract` is ``b12x.support.op_contract`` (imported lazily: b12x pulls in torch and
  its kernel modules, which a CPU-only import of the oracle does not need).

Invariants
----------
* No fallbacks: the contract is imported directly; an import error is a real failure.
* Cached per process; :func:`clear` drops the cache (tests that swap the contract call it).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from oracle.variants import TIER_LAYOUTS, Variant

__all__ = [
    "EXECUTION_OPS",
    "clear",
    "declarations",
    "op_contract",
    "ops",
    "registry_variant",
    "unmapped",
]

_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}


def ops() -> tuple[Any, ...]:
    """``b12x.support.OPS``: every op contract b12x ships."""
    from b12x import support

    return tuple(support.OPS)


def op_contract(name: str) -> Any:
    """``b12x.support.op_contract(name)`` (ValueError naming the known ops)."""
    from b12x import support

    return support.op_contract(name)


def registry_variant(declared: Any) -> tuple[Variant | None, str]:
    """``(variant, "")`` for a declaration, or ``(None, why)`` when it names no legal registry
    variant."""
    dtype = _DTYPES.get(str(declared.compute_dtype))
    if dtype is None:
        return None, f"compute dtype {declared.compute_dtype} is not fp16/bf16"
    tier = None
    if declared.tier_bits is not None:
        tier = next((k for k, v in TIER_LAYOUTS.items() if v == tuple(declared.tier_bits)), None)
        if tier is None:
            return None, f"tier bits {declared.tier_bits} name no registry tier layout"
    try:
        variant = Variant(
            declared.codebook,
            declared.bits,
            pair_kind=declared.pair_kind,
            rate_axis=None,
            tier_layout=tier,
            rotation=declared.rotation,
            compute_dtype=dtype,
            op=declared.op,
        )
    except (TypeError, ValueError) as exc:
        return None, f"outside the registry vocabulary: {exc}"
    if not variant.legal:
        return None, f"{variant.name} is illegal in the registry: {variant.illegal_reason}"
    return variant, ""


#: Contract ops that are not grid ops but executions of another op's cases: ``moe_gemm`` (the
#: grouped GEMM alone) is judged through decode cases (one-hot rows,
#: ``decode_through_grouped_gemm``).
EXECUTION_OPS = {"moe_gemm": "decode"}


@functools.cache
def _index() -> tuple[Mapping[Variant, tuple[Any, ...]], tuple[tuple[Any, str], ...]]:
    mapped: dict[Variant, list[Any]] = {}
    orphans: list[tuple[Any, str]] = []
    for contract in ops():
        if contract.name in EXECUTION_OPS:
            continue
        for declared in contract.variants:
            variant, why = registry_variant(declared)
            if variant is None:
                orphans.append((declared, f"{contract.name}: {why}"))
            else:
                mapped.setdefault(variant, []).append(declared)
    return {v: tuple(d) for v, d in mapped.items()}, tuple(orphans)


def declarations() -> Mapping[Variant, tuple[Any, ...]]:
    """Registry variant -> the DeclaredVariant records b12x gives for it."""
    return _index()[0]


def unmapped() -> tuple[tuple[Any, str], ...]:
    """Declarations that map onto no legal registry variant, with the reason."""
    return _index()[1]


def clear() -> None:
    """Forget the cached contract (after a test swaps ``b12x.support``)."""
    _index.cache_clear()
