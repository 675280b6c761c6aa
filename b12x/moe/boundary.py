"""Allocation-free torch pieces of the MoE between the GEMM launches (spec §3.1, §3.4).

Layout
------
* :func:`h128_fp32_` — blockwise H128 over the last dim with the kernels' fp32 butterfly: per
  128-block, stages over index bits 0..6 in that order (bits 0–1 are the in-thread H4, bits 2–6
  the xor-shuffles with lane offsets 1..16), the lower element keeping ``lo + hi`` and the upper
  ``lo − hi``, then ``× 0.088388347648`` in fp32 (§3.1). It ping-pongs between two caller
  buffers and returns the one holding the result.
* :func:`gather_rows_` — per-slot rows of a per-expert table (``[E, F]``: ``index_select`` by the
  slot's expert; ``[1, F]``: the broadcast row copied to every slot).

Invariants
----------
* Everything writes into caller buffers (``out=``, in-place ops, views): no allocation, no host
  synchronisation, so the MoE ``run`` that calls these is CUDA-graph capturable.
"""

from __future__ import annotations

import torch

__all__ = ["H128_SCALE_FP32", "gather_rows_", "h128_fp32_"]

BLOCK = 128
H128_SCALE_FP32 = 0.088388347648


def h128_fp32_(src: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """H128 of fp32 ``src [R, F]`` (F % 128 == 0) using ``tmp`` (same shape); returns the result.

    Both buffers are overwritten; the result is ``src`` or ``tmp`` (whichever holds stage 7).
    """
    rows, features = src.shape
    cur, nxt = src, tmp
    span = 1
    while span < BLOCK:
        shape = (rows, features // (2 * span), 2, span)
        x, y = cur.view(shape), nxt.view(shape)
        torch.add(x[:, :, 0], x[:, :, 1], out=y[:, :, 0])
        torch.sub(x[:, :, 0], x[:, :, 1], out=y[:, :, 1])
        cur, nxt = nxt, cur
        span *= 2
    cur.mul_(H128_SCALE_FP32)
    return cur


def gather_rows_(table: torch.Tensor, slot_expert: torch.Tensor, out: torch.Tensor) -> None:
    """``out[s] = table[slot_expert[s]]`` (``table`` ``[E, F]``) or ``table[0]`` for ``[1, F]``."""
    if table.shape[0] == 1:
        out.copy_(table.expand(out.shape[0], table.shape[1]))
    else:
        torch.index_select(table, 0, slot_expert, out=out)
