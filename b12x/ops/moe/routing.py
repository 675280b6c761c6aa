"""Route packing on caller-owned buffers: top-k ids -> expert blocks (spec §3.4; R4, R7, R9, R12).

Implementation: **torch ops, capture-safe** (not a CuTe DSL kernel). Every op writes into a
caller-owned buffer (``out=`` variants, in-place ops, views), nothing is allocated and nothing
syncs with the host, so :func:`pack_routes_into` can be captured in a CUDA graph. On CPU the same
code runs, which is how the tests compare it with ``reference.routing.pack_routes``.

Layout (identical to ``reference.routing``; ``n = M * top_k`` routes, route ``r = t*top_k + s``):
* ``packed_route_indices = packed_route_slots[:capacity]`` (int32): active route indices grouped
  by expert (ascending expert, ascending route inside one expert), each group padded to a
  multiple of ``block_size`` with the sentinel ``n``; slots past the last block hold ``n``.
  ``packed_route_slots[capacity:]`` is the drop area that inactive routes are scattered into.
* ``block_expert_ids`` int32 ``[capacity / block_size]``: expert of each block; blocks past the
  last filled one hold ``num_experts`` (an inactive id: no kernel addresses weights for it).
* ``route_count`` int32 ``[1]``: ``packed_route_count`` (padding included), on the device.
* ``expert_counts`` int32 ``[E]`` (active routes, no padding), ``expert_offsets`` int32 ``[E+1]``.
* ``route_slot`` int64 ``[n]``: where each route landed; ``route_gather`` int64 ``[n]``: the same
  for active routes and exactly ``capacity`` for inactive ones (a row kept zero by consumers).
* ``route_active`` bool ``[n]``.

Algorithm (no sort, no atomics, O(n·E) memory): ids widened to int64 (out-of-range ids go to the
drop bucket ``E``), an expert-major one-hot, a chunked inclusive scan over routes giving each
route's stable rank in its expert, an exclusive scan of the padded counts, then the scatter and a
``searchsorted`` for the block experts. Step by step: docs/notes/b12x.md.

Invariants:
* Caller tensors (``topk_ids``) are only read. Capacity beyond int32 is rejected at plan time.
* Live ``M`` may be below the planned ``M``: every buffer is used through a row-prefix view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from b12x.runtime.scratch import BufferSpec, live_rows, live_view
from b12x.runtime.validate import check_positive_int, check_tensor

__all__ = [
    "ROUTE_ID_DTYPES",
    "ROUTE_BUFFER_NAMES",
    "RoutePlan",
    "SCAN_CHUNK",
    "capacity_bound",
    "check_route_ids",
    "pack_routes_into",
    "packed_route_indices",
    "plan_routes",
    "route_buffer_specs",
]

ROUTE_ID_DTYPES = (torch.int32, torch.int64)
INT32_MAX = 2**31 - 1
ROUTE_BUFFER_NAMES = (
    "route_expert",
    "route_active",
    "route_inactive",
    "expert_range",
    "route_onehot",
    "route_chunk_scan",
    "expert_scan",
    "route_rank",
    "route_rank64",
    "slot_base",
    "route_slot",
    "route_gather",
    "route_index",
    "packed_route_slots",
    "group_ends",
    "block_starts",
    "block_expert_ids",
    "route_count",
    "expert_counts",
    "expert_offsets",
)


def capacity_bound(m: int, top_k: int, num_experts: int, block_size: int) -> int:
    """``M·top_k + E·(B−1)`` rounded up to a multiple of ``B`` (a bound on the packed count)."""
    bound = m * top_k + num_experts * (block_size - 1)
    return -(-bound // block_size) * block_size


@dataclasses.dataclass(frozen=True)
class RoutePlan:
    """Planned routing geometry (``m`` is the planned capacity in tokens)."""

    m: int
    top_k: int
    num_experts: int
    block_size: int

    @property
    def routes(self) -> int:
        return self.m * self.top_k

    @property
    def capacity(self) -> int:
        return capacity_bound(self.m, self.top_k, self.num_experts, self.block_size)

    @property
    def num_blocks(self) -> int:
        return self.capacity // self.block_size

    def live(self, m: int) -> RoutePlan:
        """The same geometry for a live ``m`` (``1 <= m <= self.m``)."""
        if not 1 <= m <= self.m:
            raise ValueError(f"topk_ids: live M={m} must be in [1, planned M={self.m}]")
        return dataclasses.replace(self, m=m)


def plan_routes(*, m: int, top_k: int, num_experts: int, block_size: int) -> RoutePlan:
    """Validate the routing geometry; reject capacities that do not fit int32 route indices."""
    for name, value in (
        ("m", m),
        ("top_k", top_k),
        ("num_experts", num_experts),
        ("block_size", block_size),
    ):
        check_positive_int(name, value)
    plan = RoutePlan(m, top_k, num_experts, block_size)
    if plan.capacity + plan.routes > INT32_MAX:
        raise ValueError(
            f"m/num_experts: {m} x {top_k} routes over {num_experts} experts need "
            f"{plan.capacity} packed slots, which does not fit int32 route indices "
            f"(max {INT32_MAX})"
        )
    return plan


#: Routes per chunk of the one-hot scan (step 2 of the module docstring).
SCAN_CHUNK = 1024


def _scan_chunks(n: int) -> int:
    return -(-n // SCAN_CHUNK)


def _scan_width(n: int) -> int:
    """The one-hot's row length for ``n`` routes: ``n`` padded to whole scan chunks."""
    return _scan_chunks(n) * SCAN_CHUNK


def route_buffer_specs(plan: RoutePlan) -> tuple[BufferSpec, ...]:
    """Exactly the buffers :func:`pack_routes_into` uses, sized for the planned ``m``."""
    if not isinstance(plan, RoutePlan):
        raise TypeError(f"plan: expected RoutePlan, got {type(plan).__name__}")
    n, e, cap = plan.routes, plan.num_experts, plan.capacity
    i32, i64, b = torch.int32, torch.int64, torch.bool
    return (
        BufferSpec("route_expert", (n,), i64),
        BufferSpec("route_active", (n,), b),
        BufferSpec("route_inactive", (n,), b),
        BufferSpec("expert_range", (e + 1,), i64),
        BufferSpec("route_onehot", ((e + 1) * _scan_width(n),), i32),  # [E + 1, padded n]
        BufferSpec("route_chunk_scan", ((e + 1) * _scan_chunks(n),), i32),  # [E + 1, chunks]
        BufferSpec("expert_scan", (e + 1, 2), i32),
        BufferSpec("route_rank", (n,), i32),
        BufferSpec("route_rank64", (n,), i64),
        BufferSpec("slot_base", (e + 1,), i64),
        BufferSpec("route_slot", (n,), i64),
        BufferSpec("route_gather", (n,), i64),
        BufferSpec("route_index", (n,), i32),
        BufferSpec("packed_route_slots", (cap + n,), i32),
        BufferSpec("group_ends", (e,), i64),
        BufferSpec("block_starts", (plan.num_blocks,), i64),
        BufferSpec("block_expert_ids", (plan.num_blocks,), i32),
        BufferSpec("route_count", (1,), i32),
        BufferSpec("expert_counts", (e,), i32),
        BufferSpec("expert_offsets", (e + 1,), i32),
    )


def check_route_ids(topk_ids: object, *, top_k: int | None = None, device=None) -> torch.Tensor:
    """int32/int64 ``[M, top_k]`` ids (TypeError for any other dtype, checked before any use)."""
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"topk_ids: expected a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype not in ROUTE_ID_DTYPES:
        raise TypeError(
            f"topk_ids: expected dtype torch.int32 or torch.int64, got {topk_ids.dtype}"
        )
    check_tensor("topk_ids", topk_ids, dtypes=ROUTE_ID_DTYPES, ndim=2, device=device, aligned=False)
    if topk_ids.shape[1] < 1 or (top_k is not None and topk_ids.shape[1] != top_k):
        want = "top_k >= 1" if top_k is None else f"top_k = {top_k}"
        raise ValueError(
            f"topk_ids: expected shape [M, top_k] with {want}, got {tuple(topk_ids.shape)}"
        )
    return topk_ids


def pack_routes_into(
    plan: RoutePlan, topk_ids: torch.Tensor, buffers: Mapping[str, torch.Tensor]
) -> RoutePlan:
    """Pack ``topk_ids`` into the caller's ``buffers`` (module docstring); returns the live plan.

    ``buffers`` must hold every spec of :func:`route_buffer_specs` (checked by the caller's bind).
    Nothing is allocated; the ids are only read.
    """
    check_route_ids(topk_ids, top_k=plan.top_k)
    live = plan.live(topk_ids.shape[0])
    n, e, b, cap = live.routes, live.num_experts, live.block_size, live.capacity
    expert = live_rows(buffers, "route_expert", n)
    active = live_rows(buffers, "route_active", n)
    inactive = live_rows(buffers, "route_inactive", n)
    expert.copy_(topk_ids.reshape(n))  # widening copy; int64 ids are never narrowed
    torch.ge(expert, 0, out=active)
    torch.lt(expert, e, out=inactive)
    torch.logical_and(active, inactive, out=active)
    torch.logical_not(active, out=inactive)
    expert.masked_fill_(inactive, e)  # drop bucket

    expert_range = buffers["expert_range"]
    torch.arange(e + 1, out=expert_range)
    chunks, width = _scan_chunks(n), _scan_width(n)
    padded = live_view(buffers, "route_onehot", e + 1, width)
    onehot = padded[:, :n]
    torch.eq(expert_range.view(e + 1, 1), expert.view(1, n), out=onehot)
    per_chunk = padded.view(e + 1, chunks, SCAN_CHUNK)
    per_chunk.cumsum_(2)  # innermost-dim scan of short rows: (E + 1)·chunks rows in parallel
    carry = live_view(buffers, "route_chunk_scan", e + 1, chunks)
    carry.copy_(per_chunk[:, :, SCAN_CHUNK - 1])  # each chunk's count
    carry.cumsum_(1)
    carry.sub_(per_chunk[:, :, SCAN_CHUNK - 1])  # the counts of the chunks before it
    per_chunk.add_(carry.view(e + 1, chunks, 1))  # the inclusive scan over all routes
    histogram = onehot[:, n - 1]

    scan = buffers["expert_scan"]
    padded = scan[1:, 0]
    scan.zero_()
    padded.copy_(histogram[:e])
    padded.add_(b - 1)
    padded.floor_divide_(b)
    padded.mul_(b)
    scan.cumsum_(0)  # column 0: exclusive padded offsets [E + 1] (outer-dim scan)
    buffers["expert_counts"].copy_(histogram[:e])
    buffers["expert_offsets"].copy_(scan[:, 0])
    buffers["route_count"].copy_(scan[e : e + 1, 0])

    slot_base = buffers["slot_base"]
    slot_base.copy_(scan[:, 0])
    slot_base[e].fill_(cap)  # inactive routes land in the drop area [cap, cap + n)
    rank = live_rows(buffers, "route_rank", n)
    torch.gather(onehot, 0, expert.view(1, n), out=rank.view(1, n))
    rank64 = live_rows(buffers, "route_rank64", n)
    rank64.copy_(rank)
    slot = live_rows(buffers, "route_slot", n)
    torch.index_select(slot_base, 0, expert, out=slot)
    slot.add_(rank64)
    slot.sub_(1)  # inclusive count -> rank
    torch.clamp(slot, max=cap, out=live_rows(buffers, "route_gather", n))

    route_index = live_rows(buffers, "route_index", n)
    torch.arange(n, out=route_index)
    packed = live_rows(buffers, "packed_route_slots", cap + n)
    packed.fill_(n)
    packed.scatter_(0, slot, route_index)

    ends = buffers["group_ends"]
    ends.copy_(scan[1:, 0])
    starts = live_rows(buffers, "block_starts", live.num_blocks)
    torch.arange(0, cap, b, out=starts)
    torch.searchsorted(
        ends,
        starts,
        right=True,
        out_int32=True,
        out=live_rows(buffers, "block_expert_ids", live.num_blocks),
    )
    return live


def packed_route_indices(live: RoutePlan, buffers: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The ``[capacity]`` view of the packed route indices for a live plan."""
    return live_rows(buffers, "packed_route_slots", live.capacity)
