"""The ops b12x ships, one package each, every one laid out the same way.

* :mod:`b12x.ops.decode` — a whole trellis layer payload to its fp16 weight (``plan``).
* :mod:`b12x.ops.dense` — the dense trellis linear: ``plan`` (plan / allocate / bind / run),
  ``dispatch`` (the path table), ``split_k`` (the split-K table), ``tiles`` (the one tile
  registry, also read by the MoE's FC2 tile decision) and ``custom_op``
  (``torch.ops.b12x.trellis_dense_linear``).
* :mod:`b12x.ops.moe` — the fused trellis MoE: ``plan``, ``dispatch`` (every host decision as a
  table), ``run``, ``routing``, ``boundary``, ``tiers``, ``pairs``, ``gemm_op`` (one grouped GEMM
  as its own op) and ``custom_op`` (``torch.ops.b12x.trellis_moe``).

:mod:`b12x.ops.tables` is the decision-table machinery the ``dispatch`` and ``split_k`` tables
share (case fields, named conditions, rows, ``explain`` and boundaries); it knows no op.

Every op is plan (host-side, may allocate) → bind (views of caller buffers) → run (never
allocates, capture-safe). Device code lives in :mod:`b12x.kernels`; how a kernel compiles and is
launched lives in :mod:`b12x.launch`. Importing this package imports no op: the custom ops
register when their ``custom_op`` module is imported.
"""
