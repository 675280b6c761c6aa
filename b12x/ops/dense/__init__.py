"""The dense trellis linear: plan / bind / run, its dispatch table and its tile registry.

* :mod:`b12x.ops.dense.plan` — :func:`plan_dense`, :func:`allocate_dense_buffers`,
  :func:`bind_dense`, :func:`run_dense` and the per-path buffer contract.
* :mod:`b12x.ops.dense.dispatch` — the declarative path table with ``explain(case)``.
* :mod:`b12x.ops.dense.tiles` — the tile registry and its one qualification predicate.
"""

from b12x.ops.dense.plan import (
    BoundDense,
    DensePlan,
    allocate_dense_buffers,
    bind_dense,
    plan_dense,
    run_dense,
)

__all__ = [
    "BoundDense",
    "DensePlan",
    "allocate_dense_buffers",
    "bind_dense",
    "plan_dense",
    "run_dense",
]
