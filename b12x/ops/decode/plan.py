"""plan / bind / run of the trellis decode: payload ``int16[K/16, N/16, 16·b]`` → fp16 ``[K, N]``.

Layout:
* :func:`plan_decode` (host only, keyword-only ``k``, ``n``, ``bits``, ``codebook``) validates
  the problem and returns a frozen :class:`DecodePlan`: the problem, the one kernel
  specialisation run launches (``KernelSpec("decode", codebook, bits)``) and its one buffer,

  ==========  ==============  ===========================================================
  name        shape / dtype   meaning
  ==========  ==============  ===========================================================
  ``output``  [K, N] fp16     the decoded weight, ``W[k, n]`` (row = input feature k)
  ==========  ==============  ===========================================================

  Tile ``(kt, nt)`` of the payload (its ``16·bits`` int16 words, SWAP16 storage, spec §1.2)
  becomes ``output[16kt:16kt+16, 16nt:16nt+16]`` in the spec's §1.5 tile order.
* :func:`allocate_decode_buffers` is the plan-time allocator (outside capture only).
* :func:`bind_decode` checks the caller's ``output`` (exact shape, fp16, contiguous, 16-byte
  aligned) and keeps it by identity.
* :func:`run_decode` validates ``trellis`` against the plan (int16, exact shape, device of the
  bound output, contiguous, aligned) before launching
  :func:`b12x.launch.host.decode_weight` into the bound output; it never allocates.
* :class:`DecodeOp` — the graph-op protocol of ``oracle.run.graph_protocol`` (same shape as
  :class:`b12x.ops.dense.plan.DenseOp`): ``plan(problem)`` / ``bind(plan, buffers)`` /
  ``run(bound, inputs)`` (input ``trellis``) / ``freeze()`` / ``compile_unwarmed(plan)``.

Invariants:
* K and N are positive multiples of 16 (whole tiles); (codebook, bits) is legal for the kernels
  (:mod:`b12x.formats`). Every check raises ``TypeError``/``ValueError`` naming the argument.
* The plan decides everything; ``run`` reads it (R15).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from b12x.formats import DecodeFormat, resolve_format
from b12x.launch import host as launchers
from b12x.launch.kinds import compiled
from b12x.launch.specs import KernelSpec
from b12x.runtime import compile_cache
from b12x.runtime.scratch import BoundBuffers, BufferSpec, OpBuffers, PlannedBuffers
from b12x.runtime.validate import (
    check_codebook_bits,
    check_extent,
    check_positive_int,
    check_tensor,
)

__all__ = [
    "BUFFER_NAMES",
    "BUFFERS",
    "BoundDecode",
    "DecodeOp",
    "DecodePlan",
    "DecodeProblem",
    "allocate_decode_buffers",
    "bind_decode",
    "plan_decode",
    "run_decode",
]

BUFFER_NAMES = ("output",)


@dataclasses.dataclass(frozen=True)
class DecodeProblem:
    k: int
    n: int
    bits: int
    codebook: str
    #: The codebook's format, resolved once here from the validated name; every kernel spec
    #: built for this problem carries it (never the name).
    fmt: DecodeFormat = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "fmt", resolve_format(self.codebook, self.bits))

    @property
    def payload_shape(self) -> tuple[int, int, int]:
        """``(K/16, N/16, 16·bits)``: the int16 payload ``run_decode`` accepts."""
        return (self.k // 16, self.n // 16, 16 * self.bits)


@dataclasses.dataclass(frozen=True)
class DecodePlan(PlannedBuffers):
    """The problem, its one buffer and the one kernel ``run`` launches (module docstring)."""

    problem: DecodeProblem
    buffers: tuple[BufferSpec, ...]
    buffer_owner = "the decode plan"

    @property
    def kernel_specs(self) -> tuple[KernelSpec, ...]:
        """The kernel specialisations ``run`` launches (the warm-up set)."""
        return (KernelSpec("decode", self.problem.fmt, self.problem.bits),)


def plan_decode(*, k: int, n: int, bits: int, codebook: str) -> DecodePlan:
    """Plan the decode of one ``K × N`` layer (module docstring)."""
    for name, value in (("k", k), ("n", n)):
        check_extent(name, check_positive_int(name, value))
        if value % 16:
            raise ValueError(f"{name}: expected a multiple of 16 (whole 16×16 tiles), got {value}")
    codebook, bits = check_codebook_bits(codebook, bits)
    problem = DecodeProblem(k, n, bits, codebook)
    buffers = (BufferSpec("output", (k, n), torch.float16, role="output"),)
    return DecodePlan(problem, buffers)


class BoundDecode(BoundBuffers):
    """A plan and the caller's ``output`` (by identity); what :func:`run_decode` executes."""


#: The op's buffer contract (allocate and bind), declared once.
BUFFERS = OpBuffers(DecodePlan, BoundDecode, BUFFER_NAMES, plan_hint=" (from plan_decode)")


def allocate_decode_buffers(plan: DecodePlan, device: torch.device | str) -> dict[str, Any]:
    """Plan-time allocation of exactly the plan's buffers (never during capture)."""
    return BUFFERS.allocate(plan, device)


def bind_decode(plan: DecodePlan, **buffers: torch.Tensor | None) -> BoundDecode:
    """Check the caller's buffers against ``plan`` and keep them by identity."""
    return BUFFERS.bind(plan, buffers)


def run_decode(bound: BoundDecode, trellis: torch.Tensor) -> torch.Tensor:
    """Decode ``trellis`` into the bound ``output`` and return it. Never allocates."""
    if not isinstance(bound, BoundDecode):
        raise TypeError(
            f"bound: expected BoundDecode (from bind_decode), got {type(bound).__name__}"
        )
    p = bound.plan.problem
    check_tensor(
        "trellis", trellis, dtypes=(torch.int16,), shape=p.payload_shape, device=bound.device
    )
    output = bound.buffers["output"]
    launchers.decode_weight(trellis, p.codebook, out=output)
    return output


class DecodeOp:
    """plan / bind / run over mappings (the op protocol of ``oracle.run.graph_protocol``).

    ``DecodeOp(device=None)``: the device (a CUDA device, an index, or a simulated device whose
    ``capability`` names the arch) only serves :meth:`compile_unwarmed`. ``plan(problem)`` takes
    :func:`plan_decode`'s keywords as a mapping; ``bind(plan, buffers)`` reads ``output``;
    ``run(bound, inputs)`` reads ``trellis``.
    """

    name = "trellis_decode"

    def __init__(self, device: Any = None) -> None:
        self.device = device

    def plan(self, problem: Mapping[str, Any]) -> DecodePlan:
        if not isinstance(problem, Mapping):
            raise TypeError(f"problem: expected a mapping, got {type(problem).__name__}")
        return plan_decode(**problem)

    def bind(self, plan: DecodePlan, buffers: Mapping[str, torch.Tensor]) -> BoundDecode:
        if not isinstance(buffers, Mapping):
            raise TypeError(f"buffers: expected a mapping, got {type(buffers).__name__}")
        return bind_decode(
            plan, **{name: buffers.get(name) for name in BUFFERS.check_plan(plan).buffer_names}
        )

    def run(self, bound: BoundDecode, inputs: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs: expected a mapping, got {type(inputs).__name__}")
        if "trellis" not in inputs:
            raise ValueError("inputs: missing 'trellis'")
        run_decode(bound, inputs["trellis"])

    def freeze(self) -> Any:
        return compile_cache.frozen()

    def compile_unwarmed(self, plan: DecodePlan) -> None:
        """Ask for a decode specialisation no run launches (``in_bf16``, a field the decode
        kernel ignores: a key of its own that no run requests, whereas a bf16-output decode is
        launched by the bf16 decode-then-GEMM path): it must raise once frozen or under capture."""
        from b12x.ops.dense.plan import device_limits

        p = BUFFERS.check_plan(plan).problem
        major, minor = device_limits(self.device).capability
        never_launched = KernelSpec("decode", p.fmt, p.bits, in_bf16=True)
        compiled(never_launched, f"sm_{major}{minor}")
