"""The kernel-adapter contract: how the oracle judges a trellis GEMM it did not ship.

``b12x`` declares itself through ``b12x.support`` (plans with observable stages, dispatch
tables, tile registries). A third-party kernel declares much less, in one
:class:`KernelAdapter` value:

* **formats** (:class:`WeightFormat`): how to draw random weights of one of its formats, and
  how those tensors map onto the reference: ``reference_weight(weights) -> W [K, N]`` with
  ``y = x @ W`` (exact values, any float dtype), computed by ``reference/`` code, never by the
  kernel under test;
* **ops** (:class:`AdapterOp`): today one kind, ``"gemm"``: ``y[M, N] = scale · x[M, K] @
  W[K, N]`` in the op's compute dtype; which formats, dtypes, shapes (:meth:`AdapterOp.refusal`)
  and scales it accepts; and a graph op in the protocol of :mod:`oracle.run.graph_protocol`
  (``plan(problem)`` / ``bind(plan, buffers)`` / ``run(bound, inputs)`` / ``freeze()``) with
  ``allocate(plan, device) -> {"output": …}``: the oracle owns every buffer;
* ``unavailable()``: ``None`` when the kernel can run here, else one line saying why (not
  installed, no GPU); the CLI refuses with that line.

The problem a gemm op plans is ``{"m", "k", "n", "format", "compute_dtype", "scale"}``; its
inputs are ``{"x": [M, K], **weights}``. With that, :mod:`oracle.run.adapter` runs the
differential grid (judged by :func:`oracle.judge.tolerance.judge_gemm`), the CUDA-graph
protocol and replay unchanged. :func:`load_adapter` resolves a registered name
(:data:`ADAPTERS`) or ``package.module:ATTRIBUTE``. Walkthrough: docs/adapters.md.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["ADAPTERS", "AdapterError", "AdapterOp", "KernelAdapter", "WeightFormat", "load_adapter"]

#: Adapters the oracle ships: name -> ``module:attribute``.
ADAPTERS: Mapping[str, str] = {"quack": "oracle.adapters.quack:ADAPTER"}


class AdapterError(ValueError):
    """An adapter that cannot be loaded, or that breaks the contract (one line)."""


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """One weight format of an adapted kernel and its meaning in the reference.

    ``random_weights(k=, n=, generator=)`` returns the named CPU tensors of a random weight;
    ``reference_weight(weights)`` returns ``W [K, N]`` (``y = x @ W``) from those tensors, by
    reference code. ``k_multiple`` / ``n_multiple``: the shapes the format can hold."""

    name: str
    random_weights: Callable[..., dict[str, torch.Tensor]]
    reference_weight: Callable[[Mapping[str, torch.Tensor]], torch.Tensor]
    k_multiple: int
    n_multiple: int


@dataclasses.dataclass(frozen=True)
class AdapterOp:
    """One op of an adapted kernel (module docstring). ``scales`` are the per-tensor output
    scales the grid draws (powers of two keep the judge exact: see docs/adapters.md)."""

    name: str
    formats: tuple[str, ...]
    compute_dtypes: tuple[torch.dtype, ...]
    graph_op: Callable[[], Any]
    allocate: Callable[[Any, Any], dict[str, torch.Tensor]]
    max_m: int
    scales: tuple[float, ...] = (1.0,)

    def refusal(self, fmt: WeightFormat, *, m: int, k: int, n: int) -> str | None:
        """Why this op cannot run ``m x k x n`` in ``fmt``, or None."""
        if not 1 <= m <= self.max_m:
            return f"m = {m} is outside 1..{self.max_m}"
        for name, value, multiple in (("k", k, fmt.k_multiple), ("n", n, fmt.n_multiple)):
            if value < multiple or value % multiple:
                return f"{name} = {value} is not a positive multiple of {multiple} ({fmt.name})"
        return None


@dataclasses.dataclass(frozen=True)
class KernelAdapter:
    """A kernel the oracle judges through this contract (module docstring)."""

    name: str
    formats: Mapping[str, WeightFormat]
    ops: tuple[AdapterOp, ...]
    unavailable: Callable[[], str | None]
    version: Callable[[], str | None] = lambda: None

    def __post_init__(self) -> None:
        if not self.ops:
            raise AdapterError(f"adapter {self.name!r} declares no op")
        for op in self.ops:
            if op.name != "gemm":
                raise AdapterError(f"adapter {self.name!r}: op {op.name!r} is not a known kind")
            missing = [f for f in op.formats if f not in self.formats]
            if missing or not op.formats:
                raise AdapterError(
                    f"adapter {self.name!r}: op {op.name!r} names formats {missing or '()'} "
                    f"that it does not declare (declared: {sorted(self.formats)})"
                )
            if not op.compute_dtypes or not op.scales:
                raise AdapterError(f"adapter {self.name!r}: op {op.name!r} has no dtype or scale")

    def op(self, name: str) -> AdapterOp:
        for op in self.ops:
            if op.name == name:
                return op
        raise AdapterError(f"adapter {self.name!r} has no op {name!r}")


def load_adapter(spec: str) -> KernelAdapter:
    """The adapter a registered name or ``module:attribute`` names (:class:`AdapterError`)."""
    target = ADAPTERS.get(spec, spec)
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise AdapterError(
            f"unknown kernel {spec!r}: expected one of {sorted(ADAPTERS)} or module:ATTRIBUTE"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AdapterError(f"kernel {spec!r}: cannot import {module_name}: {exc}") from None
    adapter = getattr(module, attribute, None)
    if not isinstance(adapter, KernelAdapter):
        raise AdapterError(
            f"kernel {spec!r}: {target} is {type(adapter).__name__}, not a KernelAdapter"
        )
    return adapter
