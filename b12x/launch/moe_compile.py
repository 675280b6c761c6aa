"""How one grouped-GEMM spec is built: the host side of :mod:`b12x.kernels.moe_gemm`.

Layout
------
* :func:`build_moe_gemm` maps a :class:`~b12x.kernels.moe_gemm.MoeGemmSpec` to its kernel object
  and the fake (symbolic-shape) arguments ``cute.compile`` needs: an unpaired spec builds
  :class:`~b12x.kernels.moe_gemm.MoeGroupedGemmKernel`, a paired one
  :class:`~b12x.kernels.moe_pair_gemm.MoePairGemmKernel` (composed from the shared mainloop
  primitives, not a subclass). It is the builder of the ``moe_gemm`` kind of
  :mod:`b12x.launch.kinds`, through which CPU compile checks (:mod:`b12x.ops.moe.support`) and
  GPU launches (:func:`b12x.launch.kinds.compiled`) both reach it.

Invariants
----------
* This module sits above both kernel modules (the grouped kernel and the pair kernel), so neither
  kernel module imports it: the builder names both classes without an import circle.
* No device code lives here; the kernels' PTX does not depend on where their builder is.
* The fake arguments' shapes and divisibility are codegen inputs too: this module is in the
  kind's hashed sources (the registry derives them from the builder's module and its imports).
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64

from b12x.kernels.moe_gemm import MoeGemmSpec, MoeGroupedGemmKernel
from b12x.kernels.moe_pair_gemm import MoePairGemmKernel

__all__ = ["build_moe_gemm"]


def build_moe_gemm(spec: MoeGemmSpec):
    """(kernel object, fake argument tuple) for ``cute.compile`` (CPU compile checks use it)."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    def fake(dtype, shape):
        order = tuple(range(len(shape) - 1, -1, -1))
        return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)

    rows = cute.sym_int()  # routes (M·top_k), in route order
    blocks = fake(Int32, (cute.sym_int(),))
    count = fake(Int32, (1,))
    route_rows = fake(Int32, (cute.sym_int(divisibility=spec.block_size),))
    descriptors = fake(Int32, (cute.sym_int(),))
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    scalars = (Int64(0), Int32(0), Int32(0), Int32(0))
    if spec.pair is not None:
        # K axis: K = 256·pairs (A rows of 128·pairs words); N axis: one 256-column pair per CTA.
        a = fake(Int32, (rows, cute.sym_int(divisibility=spec.k_word_multiple)))
        n_div = spec.n_group // 16 if spec.rate_axis == "k" else 1
        payload = fake(Int32, (cute.sym_int(), cute.sym_int(divisibility=n_div), spec.pair_words))
        out = fake(Int32, (rows, cute.sym_int(divisibility=spec.n_group // 2)))
        modes = fake(Int32, (cute.sym_int(),))
        args = (a, payload, out, blocks, count, route_rows, descriptors, modes, *scalars)
        return MoePairGemmKernel(spec), (*args, stream)
    a = fake(Int32, (rows, cute.sym_int(divisibility=spec.k_word_multiple)))
    payload = fake(
        Int32, (cute.sym_int(), cute.sym_int(divisibility=spec.n_group // 16), 8 * spec.bits)
    )
    out = fake(Int32, (rows, cute.sym_int(divisibility=spec.n_group // 2)))
    kernel = MoeGroupedGemmKernel(spec)
    args = (a, payload, out, blocks, count, route_rows, descriptors, *scalars)
    return kernel, (*args, stream)
