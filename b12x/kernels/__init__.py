"""CuTe DSL kernels of b12x: device code only, and the spec dataclasses it is parameterised by.

Layout
------
* :mod:`b12x.kernels.ptx` — inline-PTX primitives (lop3, prmt, dp4a, f16 math, mma.sync, loads).
* :mod:`b12x.kernels.trellis_decode` — window extraction, per-codebook decoders, decode kernel.
* :mod:`b12x.kernels.mainloop` — the device primitives the three GEMMs compose.
* :mod:`b12x.kernels.dense_gemm` — the decode-and-accumulate mainloop (a shared body), the GEMM
  kernel (mma.sync m16n8k16, fp32 accumulation, split-K partials);
  :mod:`b12x.kernels.split_k_reduce` — the split-K reduction (the ordered fp32 sum).
* :mod:`b12x.kernels.hadamard` — the input/output H128 rotation kernels.
* :mod:`b12x.kernels.moe_gemm`, :mod:`b12x.kernels.moe_pair_gemm` — the grouped and the QSRT
  pair MoE GEMM (and ``MoeGemmSpec``); :mod:`b12x.kernels.moe_boundary` — the MoE step's rotate
  / activate / reduce kernels (and ``MoeBoundarySpec``).

How a kernel is built, compiled, cached and launched is :mod:`b12x.launch` (the kind registry
:mod:`b12x.launch.kinds` names every kernel class here and its builder).

Invariants
----------
Nothing here imports :mod:`b12x.launch`, :mod:`b12x.ops`, :mod:`b12x.runtime` or
:mod:`b12x.support` (layer contracts in ``pyproject.toml``), nor :mod:`reference` or
:mod:`oracle`. Submodules import cutlass lazily where they can, so importing this package is
cheap.
"""
