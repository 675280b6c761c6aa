"""Route packing of the fused MoE in one launch: top-k ids -> expert blocks (spec §3.4; R4, R7,
R9, R12).

The device twin of the torch packer :func:`b12x.ops.moe.routing.pack_routes_into`, which
launches about thirty small kernels per MoE step; this one CTA writes the same consumer
buffers in one launch, bit for bit (``tests/b12x/test_moe_pack_gpu.py`` compares them).

Layout (``n`` routes, ``E`` experts, block size ``B``, ``cap`` packed capacity):
* In: ``route_expert`` int64 ``[n]``, the caller's ids already widened (never narrowed) by the
  host's ``copy_``. Out, in place: ``route_expert`` with every id outside ``[0, E)`` replaced by
  the drop bucket ``E``; ``route_active`` / ``route_inactive`` (the bool buffers' bytes).
* ``packed_route_slots`` int32 ``[cap + n]``: filled with the sentinel ``n``, then route ``r``
  stored at ``slot[r] = base[e] + rank[r]``, where ``rank`` is the route's rank among the routes
  of its bucket in route order and ``base`` the exclusive scan of the padded counts
  ``ceil(c/B)·B`` (the drop bucket's base is ``cap``). ``route_slot`` int64 ``[n]`` = ``slot``,
  ``route_gather`` = ``min(slot, cap)``.
* ``expert_counts`` int32 ``[E]`` (active routes), ``expert_offsets`` int32 ``[E + 1]`` (the padded
  scan), ``route_count`` int32 ``[1]`` = ``expert_offsets[E]``; ``block_expert_ids`` int32
  ``[cap / B]``: the number of experts whose group ends at or before the block's first slot
  (``searchsorted(ends, start, right=True)``: the block's expert, ``E`` past the last group).

Algorithm (one CTA of :data:`PACK_THREADS` threads; shared memory: buckets and ranks of at most
:data:`PACK_MAX_ROUTES` routes, offsets of at most :data:`PACK_MAX_EXPERTS` + 1 buckets):
1. Per route: the bucket (``E`` for an id outside ``[0, E)``, found by int64 comparisons), the
   flags, the bucket into shared memory; the sentinel fill of ``packed_route_slots``.
2. Per bucket (thread-strided): one walk over the routes in order counts the bucket and gives
   each of its routes its rank (stable and deterministic: no atomics).
3. Warp 0 scans the padded counts (a lane per contiguous chunk of experts, then a shuffle scan)
   and writes counts, offsets and ``route_count``.
4. Per route: its slot, gather index and the packed entry; per block: its expert, by a
   fixed-step binary search over the group ends.

Invariants:
* Caller ids are never read here (only their widened copy), and no id outside ``[0, E)`` ever
  addresses a buffer: it becomes the drop bucket before any use.
* Bounds (checked by the host before any launch, :func:`b12x.ops.moe.boundary.device_packs`):
  ``n <= PACK_MAX_ROUTES``, ``E <= PACK_MAX_EXPERTS``; larger plans take the torch packer.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Int32, Int64, Uint8, Uint32

from b12x.abi import abi_entry
from b12x.kernels import ptx
from b12x.kernels.dependent_launch import await_upstream, launch_options

__all__ = ["PACK_MAX_EXPERTS", "PACK_MAX_ROUTES", "PACK_THREADS", "MoePackKernel"]

PACK_THREADS = 256
#: Routes one launch packs (M <= 128 at top-8); the per-bucket walk is O(routes) per thread.
PACK_MAX_ROUTES = 1024
#: Experts one launch packs (a power of two: the binary search's first step).
PACK_MAX_EXPERTS = 1024
_SMEM_BYTES = 4 * (2 * PACK_MAX_ROUTES + PACK_MAX_EXPERTS + 1)


def _lds(addr) -> Int32:
    return Int32(ptx.ld_shared_u32_imm(addr, 0))


class MoePackKernel:
    """The route packer (module docstring); ``spec`` is a ``MoeBoundarySpec`` of kind ``pack``."""

    def __init__(self, spec):
        self.spec = spec

    @abi_entry
    @cute.jit
    def __call__(
        self,
        route_expert: cute.Tensor,
        route_active: cute.Tensor,
        route_inactive: cute.Tensor,
        packed_route_slots: cute.Tensor,
        route_slot: cute.Tensor,
        route_gather: cute.Tensor,
        block_expert_ids: cute.Tensor,
        route_count: cute.Tensor,
        expert_counts: cute.Tensor,
        expert_offsets: cute.Tensor,
        block_size: Int32,
        stream,
    ):
        self.kernel(
            route_expert, route_active, route_inactive, packed_route_slots, route_slot,
            route_gather, block_expert_ids, route_count, expert_counts, expert_offsets, block_size,
        ).launch(
            grid=(1, 1, 1), block=(PACK_THREADS, 1, 1), smem=_SMEM_BYTES, stream=stream,
            **launch_options(),
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self, route_expert, route_active, route_inactive, packed, route_slot, route_gather,
        block_expert_ids, route_count, expert_counts, expert_offsets, block_size,
    ):  # fmt: skip
        await_upstream()
        tid = cute.arch.thread_idx()[0]
        n = route_expert.shape[0]
        experts = expert_counts.shape[0]
        total = packed.shape[0]
        cap = total - n
        allocator = cutlass.memory.SmemAllocator()
        smem = allocator.allocate(_SMEM_BYTES, byte_alignment=16)
        s_bucket = Uint32(smem.toint())
        s_rank = s_bucket + Uint32(4 * PACK_MAX_ROUTES)
        s_off = s_rank + Uint32(4 * PACK_MAX_ROUTES)

        # 1. buckets and flags; the sentinel fill
        for r in cutlass.range(tid, n, PACK_THREADS):
            raw = Int64(route_expert[r])
            ok = (raw >= Int64(0)) & (raw < Int64(experts))
            bucket = Int32(cutlass.select_(ok, Int32(raw), Int32(experts)))
            route_expert[r] = Int64(bucket)
            route_active[r] = Uint8(cutlass.select_(ok, Int32(1), Int32(0)))
            route_inactive[r] = Uint8(cutlass.select_(ok, Int32(0), Int32(1)))
            ptx.st_shared_u32(s_bucket + Uint32(4 * r), bucket)
        for i in cutlass.range(tid, total, PACK_THREADS):
            packed[i] = Int32(n)
        cute.arch.sync_threads()

        # 2. per bucket: count and ranks, in route order
        for b in cutlass.range(tid, experts + 1, PACK_THREADS):
            count = Int32(0)
            for r in cutlass.range(0, n, 1):
                mine = _lds(s_bucket + Uint32(4 * r)) == b
                if mine:
                    ptx.st_shared_u32(s_rank + Uint32(4 * r), count)
                count = count + Int32(cutlass.select_(mine, Int32(1), Int32(0)))
            ptx.st_shared_u32(s_off + Uint32(4 * b), count)
        cute.arch.sync_threads()

        # 3. warp 0: the padded exclusive scan over experts (a chunk per lane, then a shuffle scan)
        if tid < 32:
            per = (experts + 31) // 32
            lo = cutlass.min(tid * per, experts)  # at most 32·32: no overflow
            hi = cutlass.min(lo + per, experts)
            local = Int32(0)
            for e in cutlass.range(lo, hi, 1):
                c = _lds(s_off + Uint32(4 * e))
                local = local + (c + block_size - 1) // block_size * block_size
            inclusive = local
            for step in cutlass.range_constexpr(5):
                up = cute.arch.shuffle_sync_up(inclusive, 1 << step)
                inclusive = inclusive + Int32(cutlass.select_(tid >= (1 << step), up, Int32(0)))
            running = inclusive - local
            for e in cutlass.range(lo, hi, 1):
                c = _lds(s_off + Uint32(4 * e))
                expert_counts[e] = c
                expert_offsets[e] = running
                ptx.st_shared_u32(s_off + Uint32(4 * e), running)
                running = running + (c + block_size - 1) // block_size * block_size
            if tid == 31:
                expert_offsets[experts] = inclusive
                route_count[0] = inclusive
                ptx.st_shared_u32(s_off + Uint32(4 * experts), inclusive)
        cute.arch.sync_threads()

        # 4. slots, gather indices and packed entries; the expert of every block
        for r in cutlass.range(tid, n, PACK_THREADS):
            bucket = _lds(s_bucket + Uint32(4 * r))
            base = Int32(cutlass.select_(bucket < experts, _lds(s_off + Uint32(4 * bucket)), cap))
            slot = base + _lds(s_rank + Uint32(4 * r))
            route_slot[r] = Int64(slot)
            route_gather[r] = Int64(cutlass.min(slot, cap))
            packed[slot] = Int32(r)
        for blk in cutlass.range(tid, block_expert_ids.shape[0], PACK_THREADS):
            start = blk * block_size
            pos = Int32(0)  # ends[e] = s_off[e + 1]: count the ends <= start
            for shift in cutlass.range_constexpr(PACK_MAX_EXPERTS.bit_length()):
                cand = pos + Int32(PACK_MAX_EXPERTS >> shift)
                end = _lds(s_off + Uint32(4 * cutlass.min(cand, experts)))
                take = (cand <= experts) & (end <= start)
                pos = Int32(cutlass.select_(take, cand, pos))
            block_expert_ids[blk] = pos
