"""Named caller-owned buffers: their specs, plan-time allocation, and bind-time checks.

Layout:
* :class:`BufferSpec` — ``(name, shape, dtype, role)`` of one buffer an op needs; ``role`` is
  ``"output"`` (the result the caller reads) or ``"scratch"`` (anything else the op writes).
  A plan carries a tuple of them, exactly the buffers its path uses and nothing more.
* :func:`allocate_buffers` — plan-time only: ``torch.empty`` for every spec (or ``torch.zeros``
  for specs marked ``zeroed``, e.g. a lock workspace). It refuses to run while a CUDA graph is
  being captured.
* :func:`live_rows` / :func:`live_view` — run-time views of a bound buffer: its first ``rows``
  rows (buffers are planned for the capacity, a run uses the live count), or its first
  ``rows·cols`` elements viewed ``[rows, cols]`` (one buffer serving several widths).
* :func:`require_buffer` — bind-time: the caller's tensor must exist and match the spec exactly
  (dtype, shape, device, contiguity, 16-byte alignment) and have storage (a ``meta`` tensor
  can never be run); it is returned as is (a view, never a copy). A missing or mismatched
  buffer raises :class:`BufferNotProvided` naming it; during capture the message reads
  "scratch `c_tmp` is not initialized for CUDA graph capture".
* Each op declares its buffers ONCE, as an :class:`OpBuffers`: its plan class, the class
  ``bind`` returns (a :class:`BoundBuffers`), every buffer name any of its plans may use and
  the *anchor* buffer (its output) whose device every other buffer must share. From that one
  declaration :meth:`OpBuffers.allocate` (plan-time allocation of exactly the plan's buffers)
  and :meth:`OpBuffers.bind` (unknown names refused, every planned buffer through
  :func:`require_buffer` on the anchor's device, kept by identity in a read-only mapping) serve
  every op; a plan class takes ``buffer_names`` / ``buffer(name)`` from :class:`PlannedBuffers`.

Invariants:
* Nothing in this module allocates except :func:`allocate_buffers`.
* A one-element placeholder never satisfies a larger spec: shapes are compared exactly.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from b12x.runtime.compile_cache import capture_active
from b12x.runtime.validate import check_device_arg, check_tensor

__all__ = [
    "BoundBuffers",
    "BufferNotProvided",
    "BufferSpec",
    "OpBuffers",
    "PlannedBuffers",
    "allocate_buffers",
    "check_known_names",
    "live_rows",
    "live_view",
    "require_buffer",
]

ROLES = ("output", "scratch")


class BufferNotProvided(ValueError):
    """A buffer the plan needs is missing or does not match its spec."""


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    """One named buffer: exact shape and dtype, its role, and whether it must start zeroed."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    role: str = "scratch"
    zeroed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: expected an identifier, got {self.name!r}")
        if not isinstance(self.shape, tuple) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.shape
        ):
            raise ValueError(f"shape: expected a tuple of non-negative ints, got {self.shape!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype: expected a torch.dtype, got {type(self.dtype).__name__}")
        if self.role not in ROLES:
            raise ValueError(f"role: expected one of {ROLES}, got {self.role!r}")

    @property
    def numel(self) -> int:
        count = 1
        for s in self.shape:
            count *= s
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def describe(self) -> str:
        return f"{self.role} `{self.name}` {list(self.shape)} {self.dtype}"


def allocate_buffers(
    specs: Iterable[BufferSpec], device: torch.device | str
) -> dict[str, torch.Tensor]:
    """Plan-time allocation of every spec on ``device`` (never during capture)."""
    specs = tuple(specs)
    for spec in specs:
        if not isinstance(spec, BufferSpec):
            raise TypeError(f"specs: expected BufferSpec entries, got {type(spec).__name__}")
    if capture_active():
        names = ", ".join(f"`{s.name}`" for s in specs)
        raise RuntimeError(
            f"allocate_buffers: refusing to allocate {names} during CUDA graph capture; "
            "allocate at plan time, before capture"
        )
    device = check_device_arg("device", device)
    if device.type == "cuda" and (
        not torch.cuda.is_available()
        or (device.index is not None and device.index >= torch.cuda.device_count())
    ):
        raise ValueError(f"device: {device} is not available on this machine")
    out = {}
    for spec in specs:
        factory = torch.zeros if spec.zeroed else torch.empty
        out[spec.name] = factory(spec.shape, dtype=spec.dtype, device=device)
    return out


def require_buffer(
    spec: BufferSpec | str,
    tensor: object,
    *,
    shape: tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
    role: str = "scratch",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The caller's tensor for ``spec``, checked and returned by identity (module docstring).

    ``spec`` is a :class:`BufferSpec`, or a buffer name together with ``shape`` and ``dtype``
    (and optionally ``role``): ``require_buffer("c_tmp", t, shape=(4, 8, 256), dtype=f32)``."""
    if isinstance(spec, str):
        if shape is None or dtype is None:
            raise ValueError(f"spec: a buffer name ({spec!r}) needs shape= and dtype=")
        spec = BufferSpec(spec, tuple(shape), dtype, role=role)
    elif not isinstance(spec, BufferSpec):
        raise TypeError(f"spec: expected BufferSpec or a name, got {type(spec).__name__}")
    elif shape is not None or dtype is not None:
        raise ValueError("spec: shape/dtype are given by the BufferSpec; pass a name instead")
    capturing = capture_active()
    label = f"{spec.role} `{spec.name}`"
    if tensor is None:
        if capturing:
            raise BufferNotProvided(
                f"{label} is not initialized for CUDA graph capture "
                f"(needs {list(spec.shape)} {spec.dtype}; allocate it before capture)"
            )
        raise BufferNotProvided(f"{label} is missing: needs {list(spec.shape)} {spec.dtype}")
    try:
        check_tensor(
            label,
            tensor,
            dtypes=(spec.dtype,),
            shape=spec.shape,
            device=None if device is None else torch.device(device),
        )
        if tensor.device.type == "meta":  # type: ignore[union-attr]
            raise ValueError(f"{label}: expected device cuda (or cpu), got meta (no storage)")
    except (TypeError, ValueError) as exc:
        if capturing:
            raise BufferNotProvided(
                f"{label} is not initialized for CUDA graph capture: {exc}"
            ) from exc
        raise BufferNotProvided(str(exc)) from exc
    return tensor  # type: ignore[return-value]


def check_known_names(known: Iterable[str], given: Mapping[str, object]) -> None:
    """Reject buffer names outside ``known`` (a typo must not silently drop a buffer).

    Names in ``known`` that the plan does not use are allowed and ignored: a consumer provisions
    one buffer set (e.g. a one-element generic ``c_tmp``) for every path of an op."""
    known = set(known)
    extra = sorted(name for name in given if name not in known)
    if extra:
        raise ValueError(f"buffers: unknown buffer name(s) {extra}; known: {sorted(known)}")


def live_rows(buffers: Mapping[str, torch.Tensor], name: str, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of the bound buffer ``name`` (a view, never a copy)."""
    return buffers[name].narrow(0, 0, rows)


def live_view(buffers: Mapping[str, torch.Tensor], name: str, rows: int, cols: int) -> torch.Tensor:
    """The first ``rows·cols`` elements of the bound buffer ``name`` viewed ``[rows, cols]``."""
    return buffers[name].view(-1).narrow(0, 0, rows * cols).view(rows, cols)


class PlannedBuffers:
    """Mixin of a plan carrying ``buffers`` (a tuple of :class:`BufferSpec`): its names and a
    look-up by name. ``buffer_owner`` is how a failed look-up names the plan."""

    buffers: tuple[BufferSpec, ...]  # a field of the plan dataclass that mixes this in
    buffer_owner = "the plan"

    @property
    def buffer_names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.buffers)

    def buffer(self, name: str) -> BufferSpec:
        for spec in self.buffers:
            if spec.name == name:
                return spec
        raise KeyError(f"name: {self.buffer_owner} has no buffer {name!r}")


@dataclasses.dataclass(frozen=True)
class BoundBuffers:
    """A plan and the caller's buffers (kept by identity, a read-only mapping) on ``device``:
    what an op's ``run`` executes. Each op subclasses it (``BoundDense``, ...)."""

    plan: Any
    buffers: Mapping[str, torch.Tensor]
    device: torch.device


@dataclasses.dataclass(frozen=True)
class OpBuffers:
    """One op's buffer contract, declared once (module docstring).

    ``plan_type`` is the op's plan class (``plan_hint`` follows its name in the refusal of
    anything else, e.g. ``" (from plan_decode)"``), ``bound`` the :class:`BoundBuffers` subclass
    :meth:`bind` returns, ``known`` every buffer name any plan of the op may use, ``anchor`` the
    buffer whose device every other must share; ``anchor_device(name, tensor)`` (optional)
    returns that device or refuses one the op cannot run on (default: the tensor's device, or
    None when it is not a tensor: the buffer check then names it)."""

    plan_type: type
    bound: type[BoundBuffers]
    known: tuple[str, ...]
    anchor: str = "output"
    plan_hint: str = ""
    anchor_device: Callable[[str, object], torch.device | None] | None = None

    def check_plan(self, plan: Any) -> Any:
        if not isinstance(plan, self.plan_type):
            raise TypeError(
                f"plan: expected {self.plan_type.__name__}{self.plan_hint}, got "
                f"{type(plan).__name__}"
            )
        return plan

    def allocate(self, plan: Any, device: torch.device | str) -> dict[str, torch.Tensor]:
        """Plan-time allocation of exactly the plan's buffers (never during capture)."""
        return allocate_buffers(self.check_plan(plan).buffers, device)

    def bind(self, plan: Any, buffers: Mapping[str, object]) -> BoundBuffers:
        """Check the caller's ``buffers`` against ``plan`` and keep them by identity."""
        self.check_plan(plan)
        check_known_names(self.known, buffers)
        anchor = buffers.get(self.anchor)
        if self.anchor_device is not None:
            device = self.anchor_device(self.anchor, anchor)
        else:
            device = anchor.device if isinstance(anchor, torch.Tensor) else None
        kept = {
            spec.name: require_buffer(spec, buffers.get(spec.name), device=device)
            for spec in plan.buffers
        }
        return self.bound(plan, types.MappingProxyType(kept), kept[self.anchor].device)
