"""The fused trellis MoE: route packing, plan / bind / run, mixed K3/K4 tiers, custom op.

* :mod:`b12x.ops.moe.routing` — capture-safe route packing into caller buffers (torch ops).
* :mod:`b12x.ops.moe.boundary` — allocation-free H128 butterfly and per-slot table gathers.
* :mod:`b12x.ops.moe.plan` — :func:`plan_moe`, buffer specs, :func:`bind_moe`.
* :mod:`b12x.ops.moe.run` — input checks, the grouped-GEMM shared body, :func:`run_moe`.
* :mod:`b12x.ops.moe.tiers` — combined namespace, descriptors, :func:`plan_tiered_moe`.
* :mod:`b12x.ops.moe.pairs` — QSRT pairs per phase (FC1 N-axis, FC2 K-axis, dynamic P33/P24 mode
  tables): choices, payload shapes, :func:`launch_paired_gemm`.
* :mod:`b12x.ops.moe.dispatch` — every host decision of the MoE as a declarative table
  (:data:`TABLES`:
  route block, K split, GEMM and pair geometry, wave-balanced FC2 tile) with ``explain``.
* :mod:`b12x.ops.moe.gemm_op` — ``moe_gemm``: one grouped GEMM (FC1 or FC2, uniform or paired) as
  its
  own plan / bind / run op and :class:`MoeGemmOp` (one-hot decode checks).
* :mod:`b12x.ops.moe.custom_op` — ``torch.ops.b12x.trellis_moe`` and :class:`MoeOp` (import it to
  register).
* :mod:`b12x.ops.moe.support` — the CPU compile set; :func:`supported_moe_variants` (deprecated:
  the variants live in ``b12x.support.OPS``).

The device code is :mod:`b12x.kernels.moe_gemm` (CuTe DSL).
"""
