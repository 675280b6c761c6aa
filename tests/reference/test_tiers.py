"""Mixed K3/K4 tiers (§4.1): tier maps and descriptors, combined rotation tables, validation,
and the mixed forward against two independent single-tier forwards with the routes split by tier.

Expectations: maps built element by element with dicts here; rotation tables concatenated by
hand; the mixed forward judged against :func:`reference.moe.moe_forward` run separately on each
tier (its own correctness is pinned by tests/reference/test_moe.py against a dense loop).
"""

from __future__ import annotations

import pytest
import torch

from reference.moe import TrellisExperts, moe_forward
from reference.tiers import (
    MixedTierExperts,
    build_tiered_maps,
    combine_rotations,
    mixed_moe_forward,
)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny matmuls: one intra-op thread avoids oversubscribing the 2-core CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_scales(gen, *shape):
    sign = torch.where(torch.rand(*shape, generator=gen) < 0.5, -1.0, 1.0)
    return (sign * (0.5 + torch.rand(*shape, generator=gen))).to(torch.float16)


def random_payload(gen, *shape):
    return torch.randint(-(2**15), 2**15, shape, generator=gen, dtype=torch.int64).to(torch.int16)


def make_tier(seed, num_experts, bits, *, hidden=128, inter=128, codebook="mcg", broadcast=False):
    gen = torch.Generator().manual_seed(seed)
    e, h16, i16, words = num_experts, hidden // 16, inter // 16, 16 * bits
    return TrellisExperts(
        w13=random_payload(gen, 2, e, h16, i16, words),
        w2=random_payload(gen, e, i16, h16, words),
        gate_suh=random_scales(gen, e, hidden),
        up_suh=random_scales(gen, 1 if broadcast else e, hidden),
        intermediate_rotations=random_scales(gen, e, 3 * inter),
        down_svh=random_scales(gen, 1 if broadcast else e, hidden),
        codebook=codebook,
        w13_layout="proj",
    )


def element_wise_maps(tier0, tier1, num_global):
    g2c = {g: -1 for g in range(num_global)}
    descriptors = []
    for tier, ids in enumerate((tier0, tier1)):
        for local, g in enumerate(ids):
            g2c[g] = len(descriptors)
            descriptors.append(tier * 256 + local)
    return [g2c[g] for g in range(num_global)], descriptors


@pytest.mark.parametrize(
    "tier0, tier1, num_global",
    [
        ([5, 0, 3], [1, 7], 10),
        ([], [2, 0], 3),
        (list(range(0, 512, 2)), list(range(1, 512, 2)), 512),  # 256 + 256: both tiers full
        ([9], [], 12),
    ],
)
def test_maps_match_element_wise_construction(tier0, tier1, num_global):
    g2c, descriptors = build_tiered_maps(tier0, tier1, num_global)
    want_g2c, want_descriptors = element_wise_maps(tier0, tier1, num_global)
    assert g2c.dtype == torch.int32 and descriptors.dtype == torch.int32
    assert g2c.tolist() == want_g2c
    assert descriptors.tolist() == want_descriptors


def test_maps_accept_id_tensors():
    g2c, descriptors = build_tiered_maps(
        torch.tensor([4, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int64), 5
    )
    assert g2c.tolist() == [2, 1, -1, -1, 0]
    assert descriptors.tolist() == [0, 1, 256]


def test_maps_reject_bad_tiers():
    with pytest.raises(ValueError, match="tier0_global_ids"):
        build_tiered_maps(list(range(257)), [], 300)
    with pytest.raises(ValueError, match="tier1_global_ids"):
        build_tiered_maps([], list(range(257)), 300)
    with pytest.raises(ValueError, match="tier0_global_ids"):
        build_tiered_maps([1, 2, 1], [0], 4)  # duplicate within a tier
    with pytest.raises(ValueError, match="tier1_global_ids"):
        build_tiered_maps([1, 2], [3, 2], 4)  # duplicate across tiers
    with pytest.raises(ValueError, match="tier1_global_ids"):
        build_tiered_maps([1], [4], 4)  # out of range
    with pytest.raises(ValueError, match="tier0_global_ids"):
        build_tiered_maps([-1], [0], 4)
    with pytest.raises(TypeError, match="tier0_global_ids"):
        build_tiered_maps(torch.tensor([1.0]), [0], 4)
    with pytest.raises(ValueError, match="num_global_experts"):
        build_tiered_maps([], [], 0)


def make_mixed(broadcast=False, codebook="mcg", bits=(3, 4)):
    tier0 = make_tier(1, 3, bits[0], codebook=codebook, broadcast=broadcast)
    tier1 = make_tier(2, 2, bits[1], codebook=codebook)
    return MixedTierExperts(
        tier0=tier0,
        tier1=tier1,
        tier0_bits=bits[0],
        tier1_bits=bits[1],
        codebook=codebook,
        tier0_global_ids=[6, 2, 4],
        tier1_global_ids=[0, 5],
        num_global_experts=8,
    )


def test_combined_rotations_are_tier0_then_tier1():
    mixed = make_mixed(broadcast=True)
    t0, t1 = mixed.tier0, mixed.tier1
    rot = combine_rotations(t0, t1)
    assert torch.equal(
        rot.intermediate_rotations,
        torch.cat([t0.intermediate_rotations, t1.intermediate_rotations]),
    )
    assert torch.equal(rot.gate_suh, torch.cat([t0.gate_suh, t1.gate_suh]))
    # tier0's up_suh and down_svh are broadcast [1, H]: expanded to its 3 experts.
    assert torch.equal(rot.up_suh, torch.cat([t0.up_suh.repeat(3, 1), t1.up_suh]))
    assert torch.equal(rot.down_svh, torch.cat([t0.down_svh.repeat(3, 1), t1.down_svh]))
    assert torch.equal(mixed.rotations.down_svh, rot.down_svh)
    assert mixed.global_to_combined.tolist() == [3, -1, 1, -1, 2, 4, 0, -1]
    assert mixed.descriptor_map.tolist() == [0, 1, 2, 256, 257]


def split_by_tier(mixed, ids):
    """Per tier: local ids (or -1) built from the tier id lists with plain Python."""
    lookup = {}
    for tier, glist in enumerate((mixed.tier0_global_ids, mixed.tier1_global_ids)):
        for local, g in enumerate(glist):
            lookup[g] = (tier, local)
    per_tier = [[[-1] * ids.shape[1] for _ in range(ids.shape[0])] for _ in range(2)]
    for t, row in enumerate(ids.tolist()):
        for s, g in enumerate(row):
            if g in lookup:
                tier, local = lookup[g]
                per_tier[tier][t][s] = local
    return [torch.tensor(p, dtype=torch.int64) for p in per_tier]


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_mixed_forward_equals_sum_of_single_tier_forwards(id_dtype):
    mixed = make_mixed(broadcast=True)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 8, (7, 4), generator=gen)  # global ids 1, 3, 7 are unmapped
    ids[0, 0] = -1
    if id_dtype == torch.int64:
        ids[2, 1] = 2**32
        ids[3, 3] = 2**31
    ids = ids.to(id_dtype)
    weights = torch.rand(7, 4, generator=gen)
    x = (0.5 * torch.randn(7, 128, generator=gen)).half()
    before = ids.clone()
    got = mixed_moe_forward(x, mixed, weights, ids, precision="exact")
    assert torch.equal(ids, before)
    ids0, ids1 = split_by_tier(mixed, ids)
    assert int((ids0 >= 0).sum()) > 0 and int((ids1 >= 0).sum()) > 0
    want = moe_forward(x, mixed.tier0, weights, ids0) + moe_forward(x, mixed.tier1, weights, ids1)
    assert float((got - want).norm() / want.norm()) < 1e-12
    # Unmapped global ids contribute exactly zero: same bits with them replaced by -1.
    masked = torch.where(
        (ids0 >= 0) | (ids1 >= 0), ids.to(torch.int64), torch.full_like(ids0, -1)
    ).to(id_dtype)
    assert torch.equal(mixed_moe_forward(x, mixed, weights, masked), got)


def test_mixed_faithful_matches_single_tier_bitwise_when_routes_stay_in_one_tier():
    mixed = make_mixed()
    gen = torch.Generator().manual_seed(6)
    ids = torch.tensor([[6, 2], [4, 4], [2, 6]])  # tier 0 only (locals 0, 1, 2)
    local = torch.tensor([[0, 1], [2, 2], [1, 0]])
    weights = torch.rand(3, 2, generator=gen)
    x = (0.5 * torch.randn(3, 128, generator=gen)).half()
    got = mixed_moe_forward(x, mixed, weights, ids, precision="faithful")
    want = moe_forward(x, mixed.tier0, weights, local, precision="faithful")
    assert got.dtype == torch.float32
    assert torch.equal(got, want)


def test_tier_order_does_not_change_the_result():
    """Swapping which stack is tier 0 (and the id lists) permutes the combined namespace only."""
    mixed = make_mixed()
    swapped = MixedTierExperts(
        tier0=mixed.tier1,
        tier1=mixed.tier0,
        tier0_bits=4,
        tier1_bits=3,
        codebook="mcg",
        tier0_global_ids=[0, 5],
        tier1_global_ids=[6, 2, 4],
        num_global_experts=8,
    )
    assert swapped.descriptor_map.tolist() == [0, 1, 256, 257, 258]
    gen = torch.Generator().manual_seed(8)
    ids = torch.randint(-1, 9, (6, 3), generator=gen)
    weights = torch.rand(6, 3, generator=gen)
    x = (0.5 * torch.randn(6, 128, generator=gen)).half()
    for precision in ("exact", "faithful"):
        a = mixed_moe_forward(x, mixed, weights, ids, precision=precision)
        b = mixed_moe_forward(x, swapped, weights, ids, precision=precision)
        assert torch.equal(a, b), precision


def test_mixed_validation_names_the_argument():
    tier0, tier1 = make_tier(1, 3, 3), make_tier(2, 2, 4)
    good = dict(
        tier0=tier0,
        tier1=tier1,
        tier0_bits=3,
        tier1_bits=4,
        codebook="mcg",
        tier0_global_ids=[0, 1, 2],
        tier1_global_ids=[3, 4],
        num_global_experts=5,
    )
    MixedTierExperts(**good)
    with pytest.raises(ValueError, match="tier1_bits"):
        MixedTierExperts(**{**good, "tier1_bits": 3})
    with pytest.raises(ValueError, match="codebook"):
        MixedTierExperts(**{**good, "codebook": "3inst"})
    with pytest.raises(ValueError, match="tier0_global_ids"):
        MixedTierExperts(**{**good, "tier0_global_ids": [0, 1], "num_global_experts": 5})
    with pytest.raises(ValueError, match="tier1_global_ids"):
        MixedTierExperts(**{**good, "tier1_global_ids": [3, 1]})
    with pytest.raises(ValueError, match="tier1"):
        MixedTierExperts(**{**good, "tier1": make_tier(2, 2, 4, hidden=256)})
    with pytest.raises(TypeError, match="tier0"):
        MixedTierExperts(**{**good, "tier0": "k3"})
    mixed = MixedTierExperts(**good)
    x = torch.zeros(2, 128, dtype=torch.float16)
    with pytest.raises(TypeError, match="topk_ids"):
        mixed_moe_forward(x, mixed, torch.ones(2, 1), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="topk_weights"):
        mixed_moe_forward(x, mixed, torch.ones(2, 2), torch.zeros(2, 1, dtype=torch.int64))
