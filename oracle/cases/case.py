"""One grid point (:class:`Case`), and the selection error and count check every selection
shares (:mod:`oracle.cases.grids` generates cases, :mod:`oracle.cases.sampling` samples them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from oracle.cases.variants import Variant

__all__ = ["Case", "SelectionError", "check_count"]


class SelectionError(ValueError):
    """A selection that cannot select what it says (filter, case id, sample size, tile): the
    message is one line that names the offending input and lists the known keys or values."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One grid point. ``experts``/``top_k`` are None except for MoE."""

    variant: Variant
    m: int
    k: int
    n: int
    experts: int | None = None
    top_k: int | None = None
    seed: int = 0
    heavy: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.variant, Variant):
            raise TypeError(f"Case: variant must be a Variant, got {type(self.variant).__name__}")
        for arg in ("m", "k", "n", "seed"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Case: {arg} must be a non-negative int, got {value!r}")
        if (self.variant.op == "moe") != (self.experts is not None and self.top_k is not None):
            raise ValueError("Case: experts and top_k are required for moe and only for moe")
        if self.experts is not None and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"Case: top_k must be in 1..experts, got {self.top_k}")

    @property
    def case_id(self) -> str:
        parts = [self.variant.name.replace("/", "-"), f"m{self.m}", f"k{self.k}", f"n{self.n}"]
        if self.experts is not None:
            parts += [f"e{self.experts}", f"t{self.top_k}"]
        parts.append(f"s{self.seed}")
        return "_".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (variant fields flattened under ``variant``)."""
        out = dataclasses.asdict(self)
        out["variant"] = {"name": self.variant.name, **dataclasses.asdict(self.variant)}
        out["case_id"] = self.case_id
        return out


def check_count(value: Any, name: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SelectionError(f"{name} must be an int, got {value!r}")
    if value < (0 if allow_zero else 1):
        low = "a non-negative" if allow_zero else "a positive"
        raise SelectionError(f"{name} must be {low} int, got {value}")
    return value
