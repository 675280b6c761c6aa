"""The host side of every kernel: what a kernel is compiled from and how it is launched.

* :mod:`b12x.launch.specs` — :class:`~b12x.launch.specs.KernelSpec` (every codegen input of the
  decode, dense GEMM, split-K reduce and rotation kernels) and how one spec compiles.
* :mod:`b12x.launch.moe_compile` — how one grouped-GEMM spec (uniform or paired) compiles.
* :mod:`b12x.launch.records` — the launch records: one frozen keyword-only dataclass per compiled
  kernel, its argument order derived from the kernel's own ``__call__`` signature.
* :mod:`b12x.launch.host` — validated launchers on torch tensors (decode, GEMM, reduce,
  rotations).

Nothing here is device code (that is :mod:`b12x.kernels`), and no op logic (that is
:mod:`b12x.ops`). Kernels resolve through :mod:`b12x.runtime.compile_cache` only.
"""
