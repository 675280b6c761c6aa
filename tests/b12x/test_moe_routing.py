"""CPU: the capture-safe route packer against ``reference.routing.pack_routes`` (R4, R7, R9, R12).

Expectations come from the reference packer (an independent sort-based construction) and from
hand-written invariants (the inverse map from routes to slots); no expected value is produced by
the code under test. Allocation-freedom is measured by a dispatch mode that counts every aten op
returning a fresh tensor.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from b12x.ops.moe import routing
from b12x.runtime.scratch import allocate_buffers
from oracle.pytest_plugin import scaled_examples
from reference.routing import pack_routes


class _CountFresh(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.fresh = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any("Tensor" in str(r.type) and r.alias_info is None for r in func._schema.returns):
            self.fresh.append(str(func))
        return out


def _pack(ids, num_experts, block_size, *, planned_m=None):
    plan = routing.plan_routes(
        m=planned_m or ids.shape[0], top_k=ids.shape[1], num_experts=num_experts,
        block_size=block_size,
    )  # fmt: skip
    buffers = allocate_buffers(routing.route_buffer_specs(plan), "cpu")
    for t in buffers.values():  # poison: nothing may depend on stale contents
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(-7)
    before = ids.clone()
    with _CountFresh() as counter:
        live = routing.pack_routes_into(plan, ids, buffers)
    assert counter.fresh == [], counter.fresh
    assert torch.equal(ids, before)  # caller tensor bit-unchanged
    return live, buffers


def _check_against_reference(ids, num_experts, block_size, **kw):
    live, buf = _pack(ids, num_experts, block_size, **kw)
    ref = pack_routes(ids, num_experts, block_size)
    assert live.capacity == ref.capacity
    assert torch.equal(routing.packed_route_indices(live, buf), ref.packed_route_indices)
    nb = ref.num_blocks
    blocks = buf["block_expert_ids"][: live.num_blocks]
    assert torch.equal(blocks[:nb], ref.block_expert_ids)
    assert bool((blocks[nb:] == num_experts).all())  # unused blocks hold an inactive id
    assert int(buf["route_count"][0]) == ref.packed_route_count
    assert torch.equal(buf["expert_counts"], ref.expert_counts)
    assert torch.equal(buf["expert_offsets"], ref.expert_offsets)
    # The inverse map, built independently: active route r sits at route_slot[r].
    n = ids.numel()
    flat = ids.reshape(-1).to(torch.int64) if ids.dtype == torch.int32 else ids.reshape(-1)
    active = (flat >= 0) & (flat < num_experts)
    assert torch.equal(buf["route_active"][:n], active)
    packed = ref.packed_route_indices.to(torch.int64)
    gather = buf["route_gather"][:n]
    routes = torch.arange(n)
    assert torch.equal(packed[gather[active]], routes[active])
    assert bool((gather[~active] == ref.capacity).all())


ID_VALUES = {
    torch.int32: [-1, -(2**31), 2**31 - 1],
    torch.int64: [-1, 2**31, 2**32, 2**40, -(2**33)],
}


@settings(deadline=None, max_examples=scaled_examples(30))
@given(
    m=st.sampled_from([1, 2, 7, 16, 33]),
    top_k=st.sampled_from([1, 2, 8]),
    num_experts=st.sampled_from([1, 3, 8, 64]),
    block_size=st.sampled_from([1, 4, 16]),
    dtype=st.sampled_from([torch.int32, torch.int64]),
    inactive_fraction=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_packer_matches_reference(
    m, top_k, num_experts, block_size, dtype, inactive_fraction, seed
):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, num_experts, (m, top_k), generator=g, dtype=torch.int64)
    bad = torch.tensor(ID_VALUES[dtype] + [num_experts], dtype=torch.int64)
    mask = torch.rand(m, top_k, generator=g) < inactive_fraction
    ids[mask] = bad[torch.randint(0, bad.numel(), (int(mask.sum()),), generator=g)]
    _check_against_reference(ids.to(dtype), num_experts, block_size)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_adversarial_distributions(dtype):
    all_one = torch.full((9, 4), 5, dtype=dtype)  # every route to one expert, duplicates per token
    _check_against_reference(all_one, 8, 4)
    empty_middle = torch.tensor([[0, 7], [7, 0], [0, 0]], dtype=dtype)
    _check_against_reference(empty_middle, 8, 16)


@pytest.mark.parametrize("planned_extra", [0, 700])
def test_the_chunked_scan_spans_chunks(planned_extra):
    """More routes than one scan chunk, a partial last chunk, a live M below the planned one:
    the per-chunk scans plus their carries give the reference's ranks and counts."""
    g = torch.Generator().manual_seed(11)
    m, top_k, experts = 3 * routing.SCAN_CHUNK // 8 + 3, 8, 16
    assert m * top_k > 3 * routing.SCAN_CHUNK and (m * top_k) % routing.SCAN_CHUNK
    ids = torch.randint(0, experts, (m, top_k), generator=g)
    ids[: m // 2, :4] = 3  # one expert crowded across chunk boundaries
    ids[5, 2] = -1  # and an inactive route
    _check_against_reference(ids, experts, 16, planned_m=m + planned_extra)


def test_int64_ids_are_not_narrowed():
    # 2**32 narrowed to int32 is expert 0; 2**32 + 3 would be expert 3.
    ids = torch.tensor([[2**32, 2**32 + 3, 1]], dtype=torch.int64)
    live, buf = _pack(ids, 4, 1)
    assert int(buf["route_count"][0]) == 1
    assert buf["expert_counts"].tolist() == [0, 1, 0, 0]


def test_live_m_below_planned_m():
    ids = torch.tensor([[1, 0], [2, -1], [1, 1]], dtype=torch.int32)
    _check_against_reference(ids, 4, 4, planned_m=10)
    plan = routing.plan_routes(m=2, top_k=2, num_experts=4, block_size=4)
    buffers = allocate_buffers(routing.route_buffer_specs(plan), "cpu")
    with pytest.raises(ValueError, match="live M=3"):
        routing.pack_routes_into(plan, ids, buffers)


def test_plan_and_id_validation():
    with pytest.raises(ValueError, match="block_size"):
        routing.plan_routes(m=1, top_k=1, num_experts=1, block_size=0)
    with pytest.raises(ValueError, match="int32 route indices"):
        routing.plan_routes(m=2**28, top_k=8, num_experts=8, block_size=16)
    plan = routing.plan_routes(m=2, top_k=2, num_experts=4, block_size=4)
    buffers = allocate_buffers(routing.route_buffer_specs(plan), "cpu")
    with pytest.raises(TypeError, match="topk_ids"):
        routing.pack_routes_into(plan, torch.zeros(2, 2), buffers)
    with pytest.raises(TypeError, match="topk_ids"):
        routing.pack_routes_into(plan, torch.zeros(2, 2, dtype=torch.int16), buffers)
    with pytest.raises(ValueError, match="top_k = 2"):
        routing.pack_routes_into(plan, torch.zeros(2, 3, dtype=torch.int32), buffers)
    assert plan.capacity == 2 * 2 + 4 * 3 == 16
