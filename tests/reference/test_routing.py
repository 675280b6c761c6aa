"""Routing: softmax top-k, the active-route rule (R7, R9) and route packing (R12).

Expectations come from a plain-Python packer written here (lists and loops over the spec's
layout rules), from float64 softmax formulas, and from hand-written cases.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.pytest_plugin import scaled_examples
from reference.routing import active_mask, capacity_bound, pack_routes, softmax_topk


def python_pack(ids_rows: list[list[int]], num_experts: int, block: int):
    """The layout rules of the spec, one route at a time (no torch)."""
    m, top_k = len(ids_rows), len(ids_rows[0])
    sentinel = m * top_k
    groups: list[list[int]] = [[] for _ in range(num_experts)]
    for t, row in enumerate(ids_rows):
        for s, e in enumerate(row):
            if 0 <= e < num_experts:
                groups[e].append(t * top_k + s)
    packed, block_experts = [], []
    for e, group in enumerate(groups):
        padded = group + [sentinel] * ((-len(group)) % block)
        packed.extend(padded)
        block_experts.extend([e] * (len(padded) // block))
    counts = [len(g) for g in groups]
    return packed, block_experts, counts, sentinel


def assert_matches_python(ids: torch.Tensor, num_experts: int, block: int) -> None:
    packed = pack_routes(ids, num_experts, block)
    want, want_blocks, want_counts, sentinel = python_pack(ids.tolist(), num_experts, block)
    m, top_k = ids.shape
    capacity = m * top_k + num_experts * (block - 1)
    capacity = math.ceil(capacity / block) * block
    assert packed.packed_route_count == len(want)
    assert packed.num_blocks == len(want_blocks)
    assert packed.sentinel == sentinel
    assert packed.packed_route_indices.dtype == torch.int32
    assert packed.packed_route_indices.shape == (capacity,)
    assert packed.packed_route_indices.tolist() == want + [sentinel] * (capacity - len(want))
    assert packed.block_expert_ids.dtype == torch.int32
    assert packed.block_expert_ids.tolist() == want_blocks
    assert packed.expert_counts.dtype == torch.int32
    assert packed.expert_counts.tolist() == want_counts
    assert packed.packed_route_count <= capacity
    assert packed.expert_offsets.tolist()[-1] == len(want)


def test_hand_written_packing():
    ids = torch.tensor([[1, 1], [0, -1], [3, 2**32]], dtype=torch.int64)
    packed = pack_routes(ids, num_experts=4, block_size=4)
    s = 6  # sentinel = M * top_k
    assert packed.packed_route_indices.tolist()[:12] == [2, s, s, s, 0, 1, s, s, 4, s, s, s]
    assert packed.block_expert_ids.tolist() == [0, 1, 3]
    assert packed.expert_counts.tolist() == [1, 2, 0, 1]
    assert packed.expert_offsets.tolist() == [0, 4, 8, 8, 12]
    assert packed.packed_route_count == 12
    # capacity = 6 + 4 * 3 = 18 -> rounded up to 20.
    assert packed.capacity == capacity_bound(3, 2, 4, 4) == 20
    assert packed.packed_route_indices.tolist()[12:] == [s] * 8


def test_all_routes_to_one_expert():
    ids = torch.full((9, 3), 5, dtype=torch.int64)
    packed = pack_routes(ids, num_experts=8, block_size=4)
    assert packed.expert_counts.tolist() == [0] * 5 + [27, 0, 0]
    assert packed.block_expert_ids.tolist() == [5] * 7
    assert packed.packed_route_indices.tolist()[:28] == list(range(27)) + [27]
    assert_matches_python(ids, 8, 4)


def test_empty_experts_own_no_block_and_duplicates_keep_route_order():
    ids = torch.tensor([[2, 2, 2], [7, 2, 7]], dtype=torch.int32)
    packed = pack_routes(ids, num_experts=8, block_size=2)
    assert packed.block_expert_ids.tolist() == [2, 2, 7]
    assert packed.packed_route_indices.tolist()[:6] == [0, 1, 2, 4, 3, 5]
    assert_matches_python(ids, 8, 2)


@pytest.mark.parametrize("bad", [-1, 8, 2**31, 2**32, 2**32 + 3, -(2**40)])
def test_inactive_int64_ids_are_dropped_not_wrapped(bad):
    ids = torch.tensor([[0, bad], [bad, 3]], dtype=torch.int64)
    packed = pack_routes(ids, num_experts=8, block_size=1)
    assert packed.expert_counts.tolist() == [1, 0, 0, 1, 0, 0, 0, 0]
    assert packed.packed_route_indices.tolist()[:2] == [0, 3]
    mask = active_mask(ids, 8)
    assert mask.tolist() == [[True, False], [False, True]]


def test_inactive_int32_ids():
    ids = torch.tensor([[-1, 2], [8, -(2**31)], [2**31 - 1, 0]], dtype=torch.int32)
    assert active_mask(ids, 8).tolist() == [[False, True], [False, False], [False, True]]
    assert pack_routes(ids, 8, 2).expert_counts.tolist() == [1, 0, 1, 0, 0, 0, 0, 0]


def test_int32_and_int64_ids_pack_identically():
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(-2, 11, (13, 4), generator=gen)
    a = pack_routes(ids.to(torch.int32), 10, 8)
    b = pack_routes(ids.to(torch.int64), 10, 8)
    for name in ("packed_route_indices", "block_expert_ids", "expert_counts", "expert_offsets"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.num_blocks, a.packed_route_count) == (b.num_blocks, b.packed_route_count)


def test_caller_ids_unchanged():
    ids = torch.tensor([[2**32, -1, 3]], dtype=torch.int64)
    before = ids.clone()
    pack_routes(ids, 4, 2)
    active_mask(ids, 4)
    assert torch.equal(ids, before)


def test_no_active_route():
    ids = torch.full((3, 2), -1, dtype=torch.int64)
    packed = pack_routes(ids, 4, 8)
    assert packed.num_blocks == packed.packed_route_count == 0
    assert packed.block_expert_ids.numel() == 0
    assert packed.packed_route_indices.tolist() == [6] * capacity_bound(3, 2, 4, 8)


@settings(deadline=None, max_examples=scaled_examples(40))
@given(
    shape=st.sampled_from([(1, 1), (1, 8), (7, 2), (16, 4), (33, 8)]),
    num_experts=st.sampled_from([1, 3, 8, 64]),
    block=st.sampled_from([1, 4, 8, 16, 64]),
    dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 2**16),
)
def test_packing_matches_python_packer(shape, num_experts, block, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-2, num_experts + 2, shape, generator=gen).to(dtype)
    assert_matches_python(ids, num_experts, block)


def test_capacity_bound_is_reached_by_the_worst_case():
    # Every expert gets exactly one route -> each pads to a full block: count = E * block.
    e, block = 8, 4
    ids = torch.arange(e, dtype=torch.int64).reshape(4, 2)
    packed = pack_routes(ids, e, block)
    assert packed.packed_route_count == e * block
    assert packed.packed_route_count <= capacity_bound(4, 2, e, block) == 32


def test_softmax_topk_against_float64_formula():
    logits = torch.tensor([[0.5, 2.0, -1.0, 2.0, 0.1], [3.0, 0.0, 1.0, -2.0, 0.5]])
    weights, ids = softmax_topk(logits, 3)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert ids.tolist() == [[1, 3, 0], [0, 2, 4]]  # tie 2.0/2.0 -> lower id first
    raw, _ = softmax_topk(logits, 3, renormalize=False)
    for row in range(2):
        vals = [float(v) for v in logits[row]]
        denom = sum(math.exp(v) for v in vals)
        chosen = [vals[i] for i in ids[row].tolist()]
        want_raw = [math.exp(v) / denom for v in chosen]
        want = [math.exp(v) / sum(math.exp(c) for c in chosen) for v in chosen]
        assert raw[row].tolist() == pytest.approx(want_raw, rel=1e-6)
        assert weights[row].tolist() == pytest.approx(want, rel=1e-6)


def test_bad_inputs_name_the_argument():
    good = torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="topk_ids"):
        pack_routes(good.to(torch.float32), 4, 2)
    with pytest.raises(ValueError, match="topk_ids"):
        pack_routes(torch.zeros(4, dtype=torch.int64), 4, 2)
    with pytest.raises(ValueError, match="block_size"):
        pack_routes(good, 4, 0)
    with pytest.raises(ValueError, match="num_experts"):
        pack_routes(good, 0, 2)
    with pytest.raises(TypeError, match="ids"):
        active_mask(good.to(torch.float64), 4)
    with pytest.raises(ValueError, match="top_k"):
        softmax_topk(torch.zeros(2, 3), 4)
    with pytest.raises(TypeError, match="logits"):
        softmax_topk(torch.zeros(2, 3, dtype=torch.int64), 1)
