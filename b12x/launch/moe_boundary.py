"""How one MoE boundary spec is built: the host side of :mod:`b12x.kernels.moe_boundary`.

Layout
------
* :func:`build_moe_boundary` maps a :class:`~b12x.kernels.moe_boundary.MoeBoundarySpec` to its
  kernel object (by ``spec.kind``: :class:`~b12x.kernels.moe_boundary.MoeRotateKernel`,
  :class:`~b12x.kernels.moe_boundary.MoeActivateKernel`,
  :class:`~b12x.kernels.moe_boundary.MoeReduceKernel` or the route packer
  :class:`~b12x.kernels.moe_pack.MoePackKernel`) and the fake (symbolic-shape) arguments
  ``cute.compile`` needs. It is the builder of the ``moe_boundary`` kind of
  :mod:`b12x.launch.kinds`: CPU compile checks and GPU launches both reach it there.

Invariants
----------
* 16-bit operands are int32 word views ``[rows, F/2]`` with ``F/2 % 64 == 0``
  (``WORDS_PER_BLOCK`` words per 128-feature block); ``route_expert`` is int64 ``[n]``,
  ``route_inactive`` uint8 ``[n]`` (the bool buffer's bytes), ``weights`` fp32 ``[n]`` (4-byte
  aligned: the caller's ``topk_weights`` need not be 16-byte aligned). The packer's buffers are
  the route buffers of :mod:`b12x.ops.moe.routing` (bool flags as uint8 bytes).
* No device code lives here; the kernels' PTX does not depend on where their builder is. The
  fake arguments' shapes are codegen inputs, so this module is in the kind's hashed sources.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8

from b12x.kernels.moe_boundary import (
    WORDS_PER_BLOCK,
    MoeActivateKernel,
    MoeBoundarySpec,
    MoeReduceKernel,
    MoeRotateKernel,
)
from b12x.kernels.moe_pack import MoePackKernel

__all__ = ["build_moe_boundary"]

_KERNELS = {
    "rotate": MoeRotateKernel,
    "activate": MoeActivateKernel,
    "reduce": MoeReduceKernel,
    "pack": MoePackKernel,
}


def build_moe_boundary(spec: MoeBoundarySpec):
    """(kernel object, fake argument tuple) for ``cute.compile`` (module docstring: the views)."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    def fake(dtype, shape, align=16):
        order = tuple(range(len(shape) - 1, -1, -1))
        return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)

    def words():
        return cute.sym_int(divisibility=WORDS_PER_BLOCK)

    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    n = cute.sym_int()
    experts = fake(Int64, (n,))
    kernel = _KERNELS[spec.kind](spec)
    if spec.kind == "rotate":
        h = words()
        x = fake(Int32, (cute.sym_int(), h))
        gate, up = fake(Int32, (cute.sym_int(), h)), fake(Int32, (cute.sym_int(), h))
        out_gate, out_up = fake(Int32, (n, h)), fake(Int32, (n, h))
        args = (x, gate, up, experts, out_gate, out_up, Int32(1), Int32(1))
    elif spec.kind == "pack":
        flag = (fake(Uint8, (n,)), fake(Uint8, (n,)))
        packed = fake(Int32, (cute.sym_int(),))
        slots = (fake(Int64, (n,)), fake(Int64, (n,)))
        blocks, count = fake(Int32, (cute.sym_int(),)), fake(Int32, (1,))
        e = cute.sym_int()
        counts, offsets = fake(Int32, (e,)), fake(Int32, (cute.sym_int(),))
        args = (experts, *flag, packed, *slots, blocks, count, counts, offsets, Int32(1))
    elif spec.kind == "activate":
        fc1 = fake(Int32, (n, cute.sym_int(divisibility=2 * WORDS_PER_BLOCK)))
        rotations = fake(Int32, (cute.sym_int(), cute.sym_int(divisibility=3 * WORDS_PER_BLOCK)))
        out = fake(Int32, (n, words()))
        args = (fc1, rotations, experts, out, Int32(1))
    else:
        h = words()
        fc2, svh = fake(Int32, (n, h)), fake(Int32, (cute.sym_int(), h))
        inactive, weights = fake(Uint8, (n,)), fake(Float32, (n,), align=4)
        out = fake(Int32, (cute.sym_int(), h))
        args = (fc2, svh, experts, inactive, weights, out, Int32(1))
    return kernel, (*args, stream)
