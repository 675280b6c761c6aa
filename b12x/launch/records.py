"""Launch records: every call into a compiled kernel binds its arguments by name.

Layout
------
* A compiled kernel (the tvm-ffi callable of ``cute.compile``) takes positional arguments only,
  in the order of its kernel class's ``__call__`` less ``self`` and the trailing ``stream`` (the
  launch runs on the tvm-ffi environment stream, so the callable has no stream slot). A launch
  record is a frozen, keyword-only dataclass with one field per such parameter:
  ``fn(*GroupedGemmLaunch(a=..., payload=..., ...).args())``.
* Each record names its kernel class in :attr:`LaunchRecord.entry` (``"module.Class"``).
  :meth:`LaunchRecord.parameters` reads the parameter order from that class's ``__call__``
  (``inspect.signature``; ``@cute.jit`` keeps the wrapped signature), and :meth:`args` returns
  the fields in exactly that order. The order is never written a second time: the record's own
  field order does not matter.
* :data:`RECORDS` lists every record; :func:`check_records` checks them all (the tests do).

Invariants
----------
* A record's fields equal its kernel entry's parameter names as a set, or the first
  construction of the record raises :class:`LaunchRecordError` naming the parameters the record
  lacks and the fields the kernel no longer takes: a kernel whose signature changes can never
  silently shift the arguments of a launch, it stops every launch of it instead.
* Constructing a record with a missing or an unknown field raises ``TypeError`` naming it
  (dataclass keyword-only construction); positional construction is refused.
* Host-side only: this module imports the kernel modules lazily (``importlib``, on a record's
  first use), so importing it loads neither cutlass nor any kernel; it changes no device code.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

__all__ = [
    "DecodeLaunch",
    "GemmLaunch",
    "GroupedGemmLaunch",
    "InputRotationLaunch",
    "LaunchRecord",
    "LaunchRecordError",
    "MoeActivateLaunch",
    "MoePackLaunch",
    "MoeReduceLaunch",
    "MoeRotateLaunch",
    "OutputRotationLaunch",
    "PairGemmLaunch",
    "RECORDS",
    "ReduceLaunch",
    "StreamKGemmLaunch",
    "check_records",
    "entry_parameters",
]

#: The entry parameter the compiled callable does not take: the environment stream (always last).
STREAM = "stream"

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class LaunchRecordError(TypeError):
    """A launch record and its kernel entry disagree (the kernel's signature changed)."""


def entry_parameters(kernel: type) -> tuple[str, ...]:
    """The positional parameters of the compiled ``kernel``, in order: its ``__call__``'s
    parameters after ``self``, less a trailing ``stream``. Raises :class:`LaunchRecordError`
    for an entry that cannot be called positionally (``*args``, keyword-only parameters) or
    whose ``stream`` is not last."""
    where = f"{kernel.__module__}.{kernel.__qualname__}.__call__"
    params = list(inspect.signature(kernel.__call__).parameters.values())
    if not params or params[0].name != "self":
        raise LaunchRecordError(f"{where}: expected a method whose first parameter is self")
    params = params[1:]
    for p in params:
        if p.kind not in _POSITIONAL:
            raise LaunchRecordError(
                f"{where}: parameter {p.name!r} is {p.kind.description}; a compiled kernel "
                "takes positional arguments only"
            )
    names = tuple(p.name for p in params)
    if STREAM in names[:-1]:
        raise LaunchRecordError(f"{where}: {STREAM!r} must be the last parameter, got {names}")
    return names[:-1] if names and names[-1] == STREAM else names


def _resolve(entry: str) -> type:
    module, _, name = entry.rpartition(".")
    return getattr(importlib.import_module(module), name)


#: record class -> its kernel entry's parameter order (filled on first use, after the check).
_PARAMETERS: dict[type, tuple[str, ...]] = {}


class LaunchRecord:
    """Base of the launch records (each a frozen keyword-only dataclass with ``entry`` set)."""

    #: ``"module.Class"`` of the kernel whose ``__call__`` the record binds.
    entry: ClassVar[str]

    @classmethod
    def parameters(cls) -> tuple[str, ...]:
        """The kernel entry's parameter order, after checking the fields match it (cached)."""
        cached = _PARAMETERS.get(cls)
        if cached is not None:
            return cached
        order = entry_parameters(_resolve(cls.entry))
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = [name for name in order if name not in fields]
        extra = sorted(fields - set(order))
        if missing or extra:
            raise LaunchRecordError(
                f"{cls.__name__}: its fields no longer match {cls.entry}.__call__ "
                f"{order}: the kernel takes {missing} that the record lacks, the record has "
                f"{extra} that the kernel does not take; update the record and its launches"
            )
        _PARAMETERS[cls] = order
        return order

    def __post_init__(self) -> None:
        type(self).parameters()

    def args(self) -> tuple:
        """The positional arguments of the compiled kernel, in its entry's parameter order."""
        return tuple(getattr(self, name) for name in type(self).parameters())


# ---------------------------------------------------------------------------- dense kernels


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class DecodeLaunch(LaunchRecord):
    """:class:`b12x.kernels.trellis_decode.TrellisDecodeKernel`."""

    entry: ClassVar[str] = "b12x.kernels.trellis_decode.TrellisDecodeKernel"
    payload: torch.Tensor
    out: torch.Tensor
    lut_addr: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class GemmLaunch(LaunchRecord):
    """:class:`b12x.kernels.dense_gemm.DenseTrellisGemmKernel`."""

    entry: ClassVar[str] = "b12x.kernels.dense_gemm.DenseTrellisGemmKernel"
    a: torch.Tensor
    payload: torch.Tensor
    out: torch.Tensor
    lut_addr: int
    k_rows_per_split: int
    splits: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class StreamKGemmLaunch(LaunchRecord):
    """:class:`b12x.kernels.stream_k.DenseStreamKGemmKernel` (``flags`` zero on entry)."""

    entry: ClassVar[str] = "b12x.kernels.stream_k.DenseStreamKGemmKernel"
    a: torch.Tensor
    payload: torch.Tensor
    out: torch.Tensor
    partials: torch.Tensor
    flags: torch.Tensor
    lut_addr: int
    ctas: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ReduceLaunch(LaunchRecord):
    """:class:`b12x.kernels.split_k_reduce.SplitKReduceKernel`."""

    entry: ClassVar[str] = "b12x.kernels.split_k_reduce.SplitKReduceKernel"
    partials: torch.Tensor
    out: torch.Tensor


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class InputRotationLaunch(LaunchRecord):
    """:class:`b12x.kernels.hadamard.InputRotationKernel`."""

    entry: ClassVar[str] = "b12x.kernels.hadamard.InputRotationKernel"
    x: torch.Tensor
    suh: torch.Tensor
    out: torch.Tensor


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class OutputRotationLaunch(LaunchRecord):
    """:class:`b12x.kernels.hadamard.OutputRotationKernel`."""

    entry: ClassVar[str] = "b12x.kernels.hadamard.OutputRotationKernel"
    y: torch.Tensor
    svh: torch.Tensor
    out: torch.Tensor


# ---------------------------------------------------------------------------- MoE kernels


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class GroupedGemmLaunch(LaunchRecord):
    """:class:`b12x.kernels.moe_gemm.MoeGroupedGemmKernel`."""

    entry: ClassVar[str] = "b12x.kernels.moe_gemm.MoeGroupedGemmKernel"
    a: torch.Tensor
    payload: torch.Tensor
    out: torch.Tensor
    block_expert_ids: torch.Tensor
    route_count: torch.Tensor
    route_rows: torch.Tensor
    descriptors: torch.Tensor
    lut_addr: int
    tier: int
    expert_base: int
    out_col_word: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class PairGemmLaunch(LaunchRecord):
    """:class:`b12x.kernels.moe_pair_gemm.MoePairGemmKernel` (its own ``__call__``: ``modes``
    has a slot of its own there, wherever the kernel puts it)."""

    entry: ClassVar[str] = "b12x.kernels.moe_pair_gemm.MoePairGemmKernel"
    a: torch.Tensor
    payload: torch.Tensor
    out: torch.Tensor
    block_expert_ids: torch.Tensor
    route_count: torch.Tensor
    route_rows: torch.Tensor
    descriptors: torch.Tensor
    modes: torch.Tensor
    lut_addr: int
    tier: int
    expert_base: int
    out_col_word: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class MoeRotateLaunch(LaunchRecord):
    """:class:`b12x.kernels.moe_boundary.MoeRotateKernel`."""

    entry: ClassVar[str] = "b12x.kernels.moe_boundary.MoeRotateKernel"
    x: torch.Tensor
    gate_suh: torch.Tensor
    up_suh: torch.Tensor
    route_expert: torch.Tensor
    out_gate: torch.Tensor
    out_up: torch.Tensor
    top_k: int
    num_experts: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class MoeActivateLaunch(LaunchRecord):
    """:class:`b12x.kernels.moe_boundary.MoeActivateKernel`."""

    entry: ClassVar[str] = "b12x.kernels.moe_boundary.MoeActivateKernel"
    fc1: torch.Tensor
    rotations: torch.Tensor
    route_expert: torch.Tensor
    out: torch.Tensor
    num_experts: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class MoeReduceLaunch(LaunchRecord):
    """:class:`b12x.kernels.moe_boundary.MoeReduceKernel`."""

    entry: ClassVar[str] = "b12x.kernels.moe_boundary.MoeReduceKernel"
    fc2: torch.Tensor
    svh: torch.Tensor
    route_expert: torch.Tensor
    route_inactive: torch.Tensor
    weights: torch.Tensor
    out: torch.Tensor
    num_experts: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class MoePackLaunch(LaunchRecord):
    """:class:`b12x.kernels.moe_pack.MoePackKernel`."""

    entry: ClassVar[str] = "b12x.kernels.moe_pack.MoePackKernel"
    route_expert: torch.Tensor
    route_active: torch.Tensor
    route_inactive: torch.Tensor
    packed_route_slots: torch.Tensor
    route_slot: torch.Tensor
    route_gather: torch.Tensor
    block_expert_ids: torch.Tensor
    route_count: torch.Tensor
    expert_counts: torch.Tensor
    expert_offsets: torch.Tensor
    block_size: int


#: Every launch record, one per compiled kernel class a host launch calls.
RECORDS: tuple[type[LaunchRecord], ...] = (
    DecodeLaunch,
    GemmLaunch,
    StreamKGemmLaunch,
    ReduceLaunch,
    InputRotationLaunch,
    OutputRotationLaunch,
    GroupedGemmLaunch,
    PairGemmLaunch,
    MoeRotateLaunch,
    MoeActivateLaunch,
    MoeReduceLaunch,
    MoePackLaunch,
)


def check_records() -> dict[str, tuple[str, ...]]:
    """Check every record against its kernel entry (imports the kernel modules: cutlass);
    returns ``{record name: parameter order}``, or raises :class:`LaunchRecordError`."""
    return {record.__name__: record.parameters() for record in RECORDS}
