"""The host side of every kernel: what a kernel is compiled from and how it is launched.

* :mod:`b12x.launch.kinds` — THE kernel-kind registry: kind name -> spec class, builder, kernel
  classes; :func:`~b12x.launch.kinds.compiled` is the one door every launch path resolves a
  kernel through (cache key sources derived from the builder's and kernels' imports).
* :mod:`b12x.launch.specs` — :class:`~b12x.launch.specs.KernelSpec` (every codegen input of the
  decode, dense GEMM, split-K reduce and rotation kernels), their builder, and the compile
  toolchain (options, ptxas remarks, the spill-free optimisation level) every kind shares.
* :mod:`b12x.launch.moe_compile` — the builder of one grouped-GEMM spec (uniform or paired).
* :mod:`b12x.launch.moe_boundary` — the builder of one MoE boundary spec (rotate, activate,
  reduce).
* :mod:`b12x.launch.records` — the launch records: one frozen keyword-only dataclass per compiled
  kernel, its argument order derived from the kernel's own ``__call__`` signature.
* :mod:`b12x.launch.host` — validated launchers on torch tensors (decode, GEMM, reduce,
  rotations).

Nothing here is device code (that is :mod:`b12x.kernels`), and no op logic (that is
:mod:`b12x.ops`, which this package never imports: a layer contract in ``pyproject.toml``).
Kernels resolve through :func:`b12x.launch.kinds.compiled` and
:mod:`b12x.runtime.compile_cache` only.
"""
