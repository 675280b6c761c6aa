"""Torch custom ops of b12x: ``torch.ops.b12x.trellis_dense_linear`` (``torch.library``).

Layout
------
* ``b12x::trellis_dense_linear(Tensor x, Tensor trellis, Tensor suh, Tensor svh, str codebook,
  Tensor? bias=None, int[]? tile=None, int split_k=0, ScalarType? compute_dtype=None) -> Tensor``
  — the dense trellis linear ``[M, K] -> [M, N]`` in ``x.dtype``. ``tile`` is the serialised
  tile pin ``[tile_k, tile_n, cta_threads]`` (it crosses the schema as plain ints and is
  re-validated by the one tile predicate, R3/R15); ``split_k = 0`` means automatic;
  ``compute_dtype = None`` means fp16.
* The CUDA implementation plans for ``x``'s device, allocates the plan's buffers (an eager op may:
  it is plan time for this call), binds and runs :mod:`b12x.dense.plan`. CUDA-graph consumers call
  plan / bind / run themselves with their own buffers.
* The fake (meta) implementation runs the same :func:`check_dense_linear_args` (so bad input
  fails under ``torch.compile`` tracing too, R14) and returns an empty ``[M, N]`` of ``x.dtype``.
* :func:`dense_linear` is the Python convenience wrapper (accepts a ``Tile`` for ``tile``).

Invariants
----------
* The op is functional (mutates nothing) and has no autograd formula (inference only).
* Registration happens once, at import of this module.
"""

from __future__ import annotations

import torch

from b12x.dense import tiles as dense_tiles
from b12x.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.runtime.validate import HALF_DTYPES, check_codebook_bits, check_tensor

__all__ = ["OP_NAME", "check_dense_linear_args", "dense_linear", "trellis_dense_linear"]

OP_NAME = "b12x::trellis_dense_linear"


def check_dense_linear_args(
    x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype
) -> tuple[int, int, int, int]:
    """Validate the op's arguments (metadata only); return ``(M, K, N, bits)``."""
    check_tensor("x", x, dtypes=HALF_DTYPES, ndim=2)
    check_tensor("trellis", trellis, dtypes=(torch.int16,), ndim=3, device=x.device)
    if trellis.shape[-1] == 0 or trellis.shape[-1] % 16:
        raise ValueError(f"trellis: last dim must be 16·bits, got {trellis.shape[-1]}")
    # The bitrate selects the compiled kernel, so it is static: under dynamic-shape tracing the
    # payload's last dim is specialised (int() installs a guard) rather than left symbolic.
    bits = int(trellis.shape[-1]) // 16
    check_codebook_bits(codebook, bits)
    k, n = trellis.shape[0] * 16, trellis.shape[1] * 16
    if k == 0 or n == 0 or k % 128 or n % 128:
        raise ValueError(f"trellis: K={k} and N={n} must be positive multiples of 128")
    m = x.shape[0]
    if m == 0:
        raise ValueError("x: needs at least one row")
    if x.shape[1] != k:
        raise ValueError(f"x: expected {k} features (trellis K), got {x.shape[1]}")
    check_tensor("suh", suh, dtypes=(torch.float16,), shape=(k,), device=x.device)
    check_tensor("svh", svh, dtypes=(torch.float16,), shape=(n,), device=x.device)
    if bias is not None:
        check_tensor("bias", bias, dtypes=(torch.float16,), shape=(n,), device=x.device)
    if tile is not None:
        dense_tiles.deserialize(list(tile))
    if isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 0:
        raise ValueError(f"split_k: expected a non-negative int (0 = auto), got {split_k!r}")
    if compute_dtype is not None and compute_dtype not in HALF_DTYPES:
        raise TypeError(
            f"compute_dtype: expected torch.float16 or torch.bfloat16, got {compute_dtype}"
        )
    return m, k, n, bits


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
    m, k, n, bits = check_dense_linear_args(
        x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype
    )
    plan = plan_dense(
        m=m,
        k=k,
        n=n,
        bits=bits,
        codebook=codebook,
        x_dtype=x.dtype,
        compute_dtype=compute_dtype or torch.float16,
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
    m, _, n, _ = check_dense_linear_args(
        x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype
    )
    return x.new_empty((m, n))


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
    """Call the custom op; a :class:`~b12x.dense.tiles.Tile` pin is serialised first."""
    spec = dense_tiles.serialize(tile) if isinstance(tile, dense_tiles.Tile) else tile
    return torch.ops.b12x.trellis_dense_linear(
        x, trellis, suh, svh, codebook, bias, spec, split_k, compute_dtype
    )
