"""Torch custom ops of b12x: ``torch.ops.b12x.trellis_dense_linear`` (``torch.library``).

Layout:
* ``b12x::trellis_dense_linear(Tensor x, Tensor trellis, Tensor suh, Tensor svh, str codebook,
  Tensor? bias=None, int[]? tile=None, int split_k=0, ScalarType? compute_dtype=None) -> Tensor``
  — the dense trellis linear ``[M, K] -> [M, N]`` in ``x.dtype``. ``tile`` is the serialised
  tile pin ``[tile_k, tile_n, cta_threads]`` (it crosses the schema as plain ints and is
  re-validated by the one tile predicate, R3/R15); ``split_k = 0`` means automatic;
  ``compute_dtype = None`` means fp16.
* ONE front door: the CUDA implementation validates with :func:`check_dense_linear_args` (the
  schema's conventions, then :func:`b12x.ops.dense.plan.dense_problem_from_tensors`, i.e. the same
  validators :func:`~b12x.ops.dense.plan.plan_dense` and :func:`~b12x.ops.dense.plan.run_dense`
  use),
  plans for ``x``'s device, allocates the plan's buffers (an eager op may: it is plan time for
  this call), binds and runs :mod:`b12x.ops.dense.plan`, handing every argument through unchanged.
  CUDA-graph consumers call plan / bind / run themselves with their own buffers.
* The fake (meta) implementation runs the same :func:`check_dense_linear_args` (so bad input
  fails under ``torch.compile`` tracing too, R14) and returns an empty ``[M, N]`` of ``x.dtype``.
* The CPU implementation runs the same checks, then raises ``ValueError`` naming ``x``: the
  kernels need CUDA tensors (instead of the dispatcher's "could not run ... with arguments from
  the 'CPU' backend").
* :func:`dense_linear` is the Python front door of the op (accepts a ``Tile`` for ``tile``); it
  validates first, so a value of the wrong schema type raises ``TypeError``/``ValueError``
  naming the argument instead of torch's schema error.

Invariants:
* The op is functional (mutates nothing) and has no autograd formula (inference only).
* Registration happens once, at import of this module.
"""

from __future__ import annotations

from typing import Any

import torch

from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.dense.plan import (
    allocate_dense_buffers,
    bind_dense,
    dense_problem_from_tensors,
    plan_dense,
    run_dense,
)
from b12x.runtime.validate import HALF_DTYPES, check_dtype_choice

__all__ = ["OP_NAME", "check_dense_linear_args", "dense_linear", "trellis_dense_linear"]

OP_NAME = "b12x::trellis_dense_linear"
INT64_MAX = 2**63 - 1  # the schema's int


def check_dense_linear_args(
    x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype
) -> dict[str, Any]:
    """Validate the op's arguments (metadata only); return :func:`plan_dense`'s keywords.

    The schema's conventions are checked here (``split_k`` a non-negative int, 0 = automatic;
    ``compute_dtype`` ``None`` = fp16; ``tile`` ``None`` or three ints); everything else by
    :func:`b12x.ops.dense.plan.dense_problem_from_tensors`, the validators the plan itself runs."""
    if isinstance(split_k, bool) or not isinstance(split_k, int):
        raise TypeError(f"split_k: expected an int (0 = auto), got {type(split_k).__name__}")
    if not 0 <= split_k <= INT64_MAX:
        raise ValueError(f"split_k: expected an int in [0, 2**63) (0 = auto), got {split_k}")
    if compute_dtype is not None:
        check_dtype_choice("compute_dtype", compute_dtype, HALF_DTYPES)
    if tile is not None and not isinstance(tile, list | tuple):
        raise TypeError(f"tile: expected None or [tile_k, tile_n, cta_threads], got {tile!r}")
    if tile is not None and any(isinstance(v, int) and abs(v) > INT64_MAX for v in tile):
        raise ValueError(f"tile: components must fit int64, got {list(tile)}")
    return dense_problem_from_tensors(
        x, trellis, suh, svh, codebook=codebook, bias=bias,
        tile=None if tile is None else list(tile), split_k=split_k or None,
        compute_dtype=torch.float16 if compute_dtype is None else compute_dtype,
    )  # fmt: skip


@torch.library.custom_op(OP_NAME, mutates_args=(), device_types="cuda")
def trellis_dense_linear(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str,
    bias: torch.Tensor | None = None,
    tile: list[int] | None = None,
    split_k: int = 0,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    problem = check_dense_linear_args(
        x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype
    )
    plan = plan_dense(
        m=problem["m"],
        k=problem["k"],
        n=problem["n"],
        bits=problem["bits"],
        codebook=codebook,
        x_dtype=x.dtype,
        compute_dtype=compute_dtype or torch.float16,
        external_rotation=False,
        tile=None if tile is None else list(tile),
        split_k=split_k or None,
        device=x.device,
    )
    bound = bind_dense(plan, **allocate_dense_buffers(plan, x.device))
    return run_dense(bound, x, trellis, suh, svh, bias=bias)


@trellis_dense_linear.register_fake
def _trellis_dense_linear_fake(
    x, trellis, suh, svh, codebook, bias=None, tile=None, split_k=0, compute_dtype=None
):
    problem = check_dense_linear_args(
        x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype
    )
    return x.new_empty((problem["m"], problem["n"]))


@trellis_dense_linear.register_kernel("cpu")
def _trellis_dense_linear_cpu(
    x, trellis, suh, svh, codebook, bias=None, tile=None, split_k=0, compute_dtype=None
):
    check_dense_linear_args(x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype)
    raise ValueError(
        f"x: {OP_NAME} runs on CUDA tensors; got device {x.device} (move x, trellis, suh, svh "
        "and bias to a CUDA device)"
    )


def dense_linear(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    *,
    codebook: str,
    bias: torch.Tensor | None = None,
    tile: dense_tiles.Tile | list[int] | None = None,
    split_k: int = 0,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Call the custom op; a :class:`~b12x.ops.dense.tiles.Tile` pin is serialised first.

    The arguments are validated (:func:`check_dense_linear_args`) before the call, so a value
    of the wrong type raises ``TypeError``/``ValueError`` naming it here rather than torch's
    schema error from the dispatcher."""
    spec = dense_tiles.serialize(tile) if isinstance(tile, dense_tiles.Tile) else tile
    check_dense_linear_args(x, trellis, suh, svh, codebook, bias, spec, split_k, compute_dtype)
    return torch.ops.b12x.trellis_dense_linear(
        x, trellis, suh, svh, codebook, bias, spec, split_k, compute_dtype
    )
