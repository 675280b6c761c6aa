"""CuTe DSL kernels of b12x: trellis decode, the dense trellis GEMM, H128 rotations.

Layout
------
* :mod:`b12x.kernels.ptx` — inline-PTX primitives (lop3, prmt, dp4a, f16 math, mma.sync, loads).
* :mod:`b12x.kernels.trellis_decode` — window extraction, per-codebook decoders, decode kernel.
* :mod:`b12x.kernels.dense_gemm` — the decode-and-accumulate mainloop (a shared body), the GEMM
  kernel (mma.sync m16n8k16, fp32 accumulation, split-K partials) and the split-K reduction.
* :mod:`b12x.kernels.hadamard` — the input/output H128 rotation kernels.
* :mod:`b12x.launch.specs` — :class:`KernelSpec` (every codegen input), fake-tensor builders and
  :func:`compile_spec` (kernels are cached only in :mod:`b12x.runtime.compile_cache`);
  :mod:`b12x.launch.host` — validated launchers on torch tensors.

Invariants
----------
Submodules import cutlass lazily where they can, so importing this package is cheap; nothing in
here imports :mod:`reference` or :mod:`oracle`.
"""
