"""MoE routing: softmax top-k, the active-route rule, and route packing by expert (spec §3.4).

Vocabulary:
* A **route** is one (token ``t``, slot ``s``) pair of a ``[M, top_k]`` routing table. Its **route
  index** is ``r = t * top_k + s`` (token-major, slot inner), in ``[0, M * top_k)``.
* A route is **active** when its expert id ``e`` satisfies ``0 <= e < num_experts``; every other id
  (``-1`` for CUDA-graph padding and non-local EP routes, ``E``, ``2**31``, ``2**32``, any negative
  int32) is **inactive** and contributes exactly zero (regression class R7).
* Ids may be int32 or int64. The range check is done in the ids' own dtype; nothing is narrowed
  before the check (R9: ``2**32`` narrowed to int32 is expert 0). Only ids already known to be in
  ``[0, E)`` are ever converted.

Packed layout (what :func:`pack_routes` returns, R12): ``packed_route_indices`` (int32, length
:func:`capacity_bound`) lists the route indices of the active routes grouped by expert, experts in
ascending id order, and inside one expert in ascending route order (token order, then slot). Each
expert's group is padded up to a multiple of ``block_size`` with the **sentinel** ``M * top_k`` (one
past the last route index), so every block of ``block_size`` consecutive slots belongs to exactly
one expert. An expert with no active route owns no block. Slots past the last block (up to the
capacity) also hold the sentinel.

* ``block_expert_ids[b]`` (int32, ``[num_blocks]``) is the expert of block ``b``.
* ``packed_route_count = num_blocks * block_size`` counts the filled slots, padding included.
* Route indices and the sentinel are int32; a capacity past ``2**31 - 1`` is rejected.
* ``expert_counts[e]`` (int32, ``[E]``) is the number of active routes of expert ``e`` (no padding);
  ``expert_offsets[e]`` (int32, ``[E + 1]``) is where expert ``e``'s padded group starts,
  ``expert_offsets[E] = packed_route_count``.

Capacity: ``packed_route_count <= M * top_k + E * (B - 1)`` (expert ``e`` fills
``ceil(c_e / B) * B`` slots); :func:`capacity_bound` rounds it up to whole blocks of ``B``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference._checks import check_dtype, check_int, check_tensor

ROUTE_ID_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1


def _check_positive_int(value: object, name: str) -> int:
    value = check_int(value, name)
    if value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return value


def _check_num_experts(value: object) -> int:
    """A positive expert count that int32 route ids can compare with: torch casts a Python int
    to the ids' dtype, so ``int32_ids < 2**31`` wraps and would mark every route inactive."""
    value = _check_positive_int(value, "num_experts")
    if value > INT32_MAX:
        raise ValueError(f"num_experts: expected at most {INT32_MAX} (2**31 - 1), got {value}")
    return value


def check_route_ids(ids: object, name: str = "topk_ids") -> torch.Tensor:
    """Require an int32/int64 ``[M, top_k]`` tensor of expert ids (float ids are a TypeError)."""
    ids = check_dtype(ids, ROUTE_ID_DTYPES, name)
    if ids.dim() != 2:
        raise ValueError(f"{name}: expected shape [M, top_k], got {tuple(ids.shape)}")
    if ids.shape[1] < 1:
        raise ValueError(f"{name}: expected top_k >= 1, got shape {tuple(ids.shape)}")
    return ids


def softmax_topk(
    logits: torch.Tensor, top_k: int, *, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: fp32 softmax over experts, then the ``top_k`` largest probabilities per token.

    ``logits`` is a floating ``[M, E]`` tensor. Returns ``(weights, ids)``: ``weights`` float32
    ``[M, top_k]`` in descending order, ``ids`` int64 ``[M, top_k]``. Ties are broken towards the
    lower expert id (stable sort). With ``renormalize`` the selected probabilities are divided by
    their sum (each row of weights sums to 1), otherwise they are the plain softmax values.
    """
    logits = check_tensor(logits, "logits")
    if not logits.is_floating_point():
        raise TypeError(f"logits: expected a floating dtype, got {logits.dtype}")
    if logits.dim() != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits: expected shape [M, E] with E >= 1, got {tuple(logits.shape)}")
    top_k = _check_positive_int(top_k, "top_k")
    if top_k > logits.shape[1]:
        raise ValueError(f"top_k: {top_k} exceeds the number of experts {logits.shape[1]}")
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool, got {type(renormalize).__name__}")
    probabilities = torch.softmax(logits.to(torch.float32), dim=-1)
    sorted_probs, sorted_ids = torch.sort(probabilities, dim=-1, descending=True, stable=True)
    weights = sorted_probs[:, :top_k].contiguous()
    ids = sorted_ids[:, :top_k].to(torch.int64).contiguous()
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def active_mask(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Bool tensor shaped like ``ids``: True where ``0 <= id < num_experts``.

    ``ids`` is int32 or int64 of any shape. The comparison runs in the ids' own dtype, so int64
    ids such as ``2**31`` or ``2**32`` are inactive, never wrapped onto a valid expert.
    """
    ids = check_dtype(ids, ROUTE_ID_DTYPES, "ids")
    num_experts = _check_num_experts(num_experts)
    return (ids >= 0) & (ids < num_experts)


def capacity_bound(m: int, top_k: int, num_experts: int, block_size: int) -> int:
    """``M * top_k + E * (block_size - 1)`` rounded up to a multiple of ``block_size``.

    An upper bound on ``packed_route_count`` for any routing table of that shape.
    """
    m = check_int(m, "m")
    if m < 0:
        raise ValueError(f"m: expected a non-negative int, got {m}")
    top_k = _check_positive_int(top_k, "top_k")
    num_experts = _check_positive_int(num_experts, "num_experts")
    block_size = _check_positive_int(block_size, "block_size")
    bound = m * top_k + num_experts * (block_size - 1)
    return -(-bound // block_size) * block_size


@dataclass(frozen=True, eq=False)
class PackedRoutes:
    """Routes grouped by expert in whole blocks; see the module docstring for the layout."""

    packed_route_indices: torch.Tensor
    block_expert_ids: torch.Tensor
    num_blocks: int
    packed_route_count: int
    expert_counts: torch.Tensor
    expert_offsets: torch.Tensor
    num_tokens: int
    top_k: int
    num_experts: int
    block_size: int

    @property
    def sentinel(self) -> int:
        """The padding value, ``M * top_k`` (one past the last route index)."""
        return self.num_tokens * self.top_k

    @property
    def capacity(self) -> int:
        """Length of ``packed_route_indices`` (:func:`capacity_bound` of the shape)."""
        return int(self.packed_route_indices.numel())


def pack_routes(topk_ids: torch.Tensor, num_experts: int, block_size: int) -> PackedRoutes:
    """Group the active routes of ``topk_ids`` ``[M, top_k]`` by expert, padded to whole blocks.

    Inactive ids are dropped. The caller's tensor is never modified. See the module docstring for
    the exact layout and the sentinel.
    """
    topk_ids = check_route_ids(topk_ids, "topk_ids")
    num_experts = _check_num_experts(num_experts)
    block_size = _check_positive_int(block_size, "block_size")
    m, top_k = topk_ids.shape
    device = topk_ids.device
    sentinel = m * top_k
    capacity = capacity_bound(m, top_k, num_experts, block_size)
    if capacity > INT32_MAX:
        raise ValueError(
            f"topk_ids: {m} x {top_k} routes need a capacity of {capacity} slots, which does not "
            f"fit the int32 route indices (max {INT32_MAX})"
        )

    flat_ids = topk_ids.reshape(-1)
    active = active_mask(flat_ids, num_experts)
    route_index = torch.arange(sentinel, dtype=torch.int64, device=device)[active]
    expert = flat_ids[active].to(torch.int64)  # safe: every remaining id lies in [0, E)
    order = torch.sort(expert, stable=True).indices  # expert order, route order inside
    route_index, expert = route_index[order], expert[order]

    counts = torch.bincount(expert, minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    padded_offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    padded_offsets[1:] = torch.cumsum(padded, dim=0)
    count_offsets = torch.cumsum(counts, dim=0) - counts
    rank_in_expert = torch.arange(expert.numel(), dtype=torch.int64, device=device)
    rank_in_expert = rank_in_expert - count_offsets[expert]
    slots = padded_offsets[expert] + rank_in_expert

    packed = torch.full((capacity,), sentinel, dtype=torch.int64, device=device)
    packed[slots] = route_index
    packed_route_count = int(padded_offsets[-1])
    blocks_per_expert = padded // block_size
    block_expert_ids = torch.repeat_interleave(
        torch.arange(num_experts, dtype=torch.int64, device=device), blocks_per_expert
    )
    return PackedRoutes(
        packed_route_indices=packed.to(torch.int32),
        block_expert_ids=block_expert_ids.to(torch.int32),
        num_blocks=packed_route_count // block_size,
        packed_route_count=packed_route_count,
        expert_counts=counts.to(torch.int32),
        expert_offsets=padded_offsets.to(torch.int32),
        num_tokens=m,
        top_k=top_k,
        num_experts=num_experts,
        block_size=block_size,
    )
