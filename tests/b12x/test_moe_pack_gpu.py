"""GPU: the one-launch route packer (:class:`b12x.kernels.moe_pack.MoePackKernel`, through
:func:`b12x.ops.moe.boundary.pack_routes`) against the torch packer
:func:`b12x.ops.moe.routing.pack_routes_into` (itself checked against ``reference.routing`` on
CPU): every buffer a consumer reads is **bit-identical** — the widened ids with the drop bucket,
the active/inactive flags, the packed slots (sentinel and drop area included), route slots and
gather indices, block experts, counts, offsets and the route count — for int32 and int64 ids
with inactive values of every kind (-1, E, int32/int64 extremes), 1..1024 routes, 1..1024
experts and several block sizes; over stale buffers of a larger earlier call (live M below the
planned M); and inside a CUDA graph replayed on new ids. ``run_moe`` takes the packer for a
plan within its bounds (one launch, no torch packing) and the torch packer past them.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host as launchers
from b12x.ops.moe import boundary, routing
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda")


def _arch() -> str:
    return launchers.device_arch(DEV)


#: The buffers a consumer of the packer reads (the rest are the torch packer's scratch).
CONSUMED = (
    "route_expert", "route_active", "route_inactive", "packed_route_slots", "route_slot",
    "route_gather", "block_expert_ids", "route_count", "expert_counts", "expert_offsets",
)  # fmt: skip


def _buffers(plan: routing.RoutePlan, fill: int) -> dict:
    return {
        s.name: torch.full(s.shape, fill, dtype=s.dtype, device=DEV)
        for s in routing.route_buffer_specs(plan)
    }


def _ids(m: int, top_k: int, experts: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random ids in ``[0, E)`` with about a fifth replaced by inactive values of every kind."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (m, top_k), generator=g, dtype=torch.int64)
    info = torch.iinfo(dtype)
    bad = torch.tensor([-1, experts, experts + 5, info.max, info.min, -7], dtype=torch.int64)
    pick = torch.rand(m, top_k, generator=g) < 0.2
    ids[pick] = bad[torch.randint(0, len(bad), (int(pick.sum()),), generator=g)]
    return ids.to(dtype).to(DEV)


def _consumed(plan: routing.RoutePlan, live: routing.RoutePlan, buffers: dict) -> dict:
    n, cap = live.routes, live.capacity
    sizes = {
        "packed_route_slots": cap + n, "block_expert_ids": live.num_blocks, "route_count": 1,
        "expert_counts": plan.num_experts, "expert_offsets": plan.num_experts + 1,
    }  # fmt: skip
    return {name: buffers[name][: sizes.get(name, n)].clone() for name in CONSUMED}


def _both(plan, ids, *, stale: int = 0):
    """(device packer's buffers, torch packer's buffers), each packed into fresh buffers."""
    dev_buf, torch_buf = _buffers(plan, stale), _buffers(plan, stale)
    live = boundary.pack_routes(arch=_arch(), plan=plan, topk_ids=ids, buffers=dev_buf)
    ref_live = routing.pack_routes_into(plan, ids, torch_buf)
    assert live == ref_live
    return _consumed(plan, live, dev_buf), _consumed(plan, live, torch_buf)


def _assert_equal(got: dict, want: dict) -> None:
    for name in CONSUMED:
        assert torch.equal(got[name], want[name]), (name, got[name], want[name])


GEOMETRIES = [  # (planned M, live M, top_k, experts, block size)
    (1, 1, 1, 1, 16),
    (1, 1, 8, 128, 16),
    (4, 3, 2, 8, 16),
    (16, 16, 8, 64, 32),
    (64, 33, 8, 256, 64),
    (128, 128, 8, 128, 16),
    (128, 97, 8, 1024, 16),
    (512, 512, 2, 3, 128),
    (1024, 700, 1, 257, 8),
]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "m{}-{}x{}-e{}-b{}".format(*g))
def test_the_device_packer_writes_what_the_torch_packer_writes(geometry, dtype):
    planned, m, top_k, experts, block = geometry
    plan = routing.plan_routes(m=planned, top_k=top_k, num_experts=experts, block_size=block)
    for seed in range(3):
        got, want = _both(plan, _ids(m, top_k, experts, dtype, seed), stale=-3)
        _assert_equal(got, want)


def test_all_routes_inactive_and_all_routes_on_one_expert():
    plan = routing.plan_routes(m=64, top_k=8, num_experts=32, block_size=16)
    for ids in (
        torch.full((64, 8), -1, dtype=torch.int64, device=DEV),
        torch.full((64, 8), 31, dtype=torch.int32, device=DEV),
        torch.arange(512, device=DEV).view(64, 8) % 32,
    ):
        got, want = _both(plan, ids)
        _assert_equal(got, want)


def test_a_smaller_live_batch_over_stale_buffers_matches():
    plan = routing.plan_routes(m=128, top_k=8, num_experts=64, block_size=16)
    dev_buf, torch_buf = _buffers(plan, 0), _buffers(plan, 0)
    for m in (128, 5, 77, 1):
        ids = _ids(m, 8, 64, torch.int64, seed=m)
        live = boundary.pack_routes(arch=_arch(), plan=plan, topk_ids=ids, buffers=dev_buf)
        routing.pack_routes_into(plan, ids, torch_buf)
        _assert_equal(_consumed(plan, live, dev_buf), _consumed(plan, live, torch_buf))


def test_the_device_packer_replays_in_a_cuda_graph():
    plan = routing.plan_routes(m=16, top_k=4, num_experts=32, block_size=16)
    buf = _buffers(plan, 0)
    ids = _ids(16, 4, 32, torch.int32, seed=0)
    boundary.pack_routes(arch=_arch(), plan=plan, topk_ids=ids, buffers=buf)  # compile first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        live = boundary.pack_routes(arch=_arch(), plan=plan, topk_ids=ids, buffers=buf)
    for seed in (1, 2):
        ids.copy_(_ids(16, 4, 32, torch.int32, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        want = _buffers(plan, 0)
        routing.pack_routes_into(plan, ids, want)
        _assert_equal(_consumed(plan, live, buf), _consumed(plan, live, want))


@pytest.mark.parametrize("m, device_packs", [(4, True), (200, False)])
def test_run_moe_takes_the_device_packer_within_its_bounds(m, device_packs, monkeypatch):
    plan = plan_moe(
        m=m, top_k=8, hidden=256, intermediate=256, codebook="mcg", bits=4, num_experts=16,
        w13_layout="packed", x_dtype=torch.bfloat16, compute_dtype=torch.float16,
    )  # fmt: skip
    assert boundary.device_packs(plan.routes) is device_packs
    bound = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
    g = torch.Generator().manual_seed(0)

    def payload(*shape):
        return torch.randint(-(2**15), 2**15, shape, generator=g).to(torch.int16).to(DEV)

    f16 = dict(dtype=torch.float16, device=DEV)
    inputs = MoeInputs(
        (0.05 * torch.randn(m, 256, generator=g)).to(torch.bfloat16).to(DEV),
        torch.rand(m, 8, generator=g).to(DEV), _ids(m, 8, 16, torch.int64, seed=3),
        (payload(16, 16, 32, 64),), (payload(16, 16, 16, 64),), torch.ones(1, 256, **f16), None,
        torch.ones(16, 768, **f16), torch.ones(1, 256, **f16),
    )  # fmt: skip
    calls = []
    real_kernel, real_torch = boundary.pack_routes, routing.pack_routes_into
    monkeypatch.setattr(
        boundary, "pack_routes", lambda **kw: calls.append("kernel") or real_kernel(**kw)
    )
    monkeypatch.setattr(
        routing, "pack_routes_into", lambda *a: calls.append("torch") or real_torch(*a)
    )
    run_moe(bound, inputs)
    assert calls == (["kernel"] if device_packs else ["torch"])
