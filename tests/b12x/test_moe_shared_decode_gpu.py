"""GPU: the grouped GEMMs' shared-decode mainloop gives the per-warp mainloop's results bit for bit.

The shared decode (:mod:`b12x.kernels.shared_decode`, planned by the ``moe_mainloop`` table from
128 routes per expert) decodes each K16 row of an expert once per 128-slot route block and folds
its K slices in the per-warp kernel's fixed order, so a route's result must not depend on which
mainloop ran it. Each case runs the whole op (:func:`b12x.ops.moe.run.run_moe`) twice on the same
inputs, once planned ``shared_decode="wide"`` (and, on sm_90, once ``"tensor"``: the ``wgmma``
consumers of :mod:`b12x.kernels.wgmma_decode`, M = 40 leaving a whole warpgroup dead) and once
``"off"``, and asserts equal bits:

* K splits 4 (FC1, K = 2048) and 2 (FC2, K = 1024): the fold runs in both GEMMs;
* packed and proj FC1, fp16 and bf16 compute, MCG K4 and K3, the 3INST codebook, K6 (1 x 4
  slots);
* M from 40 (16 % of a block live: dead warps) to 700 (several blocks per expert, partial last
  blocks), inactive routes (ids -1 and E) among them;
* K3/K4 tiers (two launches per GEMM over the same 128-slot blocks, unmapped ids);
* batch invariance across mainloops: tokens of a shared-decode batch (on sm_90 the table plans
  ``tensor``) equal their batch-1 outputs (which run per-warp);
* determinism: repeated shared-decode runs are bitwise equal.
"""

from __future__ import annotations

import pytest
import torch

from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from b12x.ops.moe.tiers import build_tiered_maps, combine_tier_rotations, plan_tiered_moe
from oracle.run.runners.inputs import stack_to, trellis_experts

pytestmark = pytest.mark.gpu

F16, BF16 = torch.float16, torch.bfloat16
H, I = 2048, 1024  # FC1 K = 2048 (k_split 4), FC2 K = 1024 (k_split 2); every N % 256 == 0
SHARED = ("wide", "tensor")
DEV = "cuda"


def make_experts(e, bits, layout, *, seed, codebook="mcg"):
    """The oracle runner's random uniform stack
    (:func:`oracle.run.runners.inputs.trellis_experts`)."""
    gen = torch.Generator().manual_seed(seed)
    return stack_to(trellis_experts(gen, e, H, I, bits, layout, codebook), DEV)


def routes(e, m, top_k, *, seed, x_dtype, num_ids=None):
    """Tokens, weights and ids; every 7th token's last route is inactive (-1 or E)."""
    g = torch.Generator().manual_seed(seed)
    x = (0.05 * torch.randn(m, H, generator=g)).to(x_dtype)  # fp16 stays finite at H = 2048
    ids = torch.stack([torch.randperm(num_ids or e, generator=g)[:top_k] for _ in range(m)])
    ids[::7, -1] = torch.tensor([-1, e]).repeat(len(ids[::7]))[: len(ids[::7])]
    w = torch.rand(m, top_k, generator=g)
    return x.to(DEV), w.to(DEV), ids.to(DEV)


def inputs(experts, x, w, ids):
    return MoeInputs(
        x, w, ids, (experts.w13,), (experts.w2,), experts.gate_suh,
        experts.up_suh if experts.w13_layout == "proj" else None,
        experts.intermediate_rotations, experts.down_svh,
    )  # fmt: skip


def bound(experts, m, top_k, x_dtype, compute_dtype, shared_decode):
    plan = plan_moe(
        m=m, top_k=top_k, hidden=H, intermediate=I, codebook=experts.codebook, bits=experts.bits,
        num_experts=experts.num_experts, w13_layout=experts.w13_layout, x_dtype=x_dtype,
        compute_dtype=compute_dtype, shared_decode=shared_decode, device=DEV,
    )  # fmt: skip
    shared = [s.m_warps > 0 for s in plan.kernel_specs]
    want = shared_decode in SHARED or (
        shared_decode is None and m * top_k >= 128 * experts.num_experts
    )
    assert shared == [want] * len(shared), plan.kernel_specs
    if shared_decode in SHARED:
        assert all(s.wgmma == (shared_decode == "tensor") for s in plan.kernel_specs)
    return bind_moe(plan, **allocate_moe_buffers(plan, DEV))


def _needs_hopper(pin):
    """``tensor`` (wgmma) runs on sm_90 only; elsewhere the plan refuses it (a CPU test)."""
    if pin == "tensor" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the tensor geometry multiplies with wgmma: sm_90 only")


CASES = [
    # experts, top_k, m, layout, x_dtype, compute_dtype, codebook, bits
    (8, 2, 700, "packed", F16, F16, "mcg", 4),
    (8, 2, 700, "proj", BF16, BF16, "mcg", 4),
    (8, 2, 40, "packed", BF16, F16, "mcg", 3),
    (4, 4, 300, "proj", F16, BF16, "3inst", 3),
    (8, 1, 500, "packed", F16, F16, "mcg", 6),
]


@pytest.mark.parametrize("pin", SHARED)
@pytest.mark.parametrize("e, top_k, m, layout, x_dtype, compute_dtype, codebook, bits", CASES)
def test_shared_decode_equals_per_warp(
    e, top_k, m, layout, x_dtype, compute_dtype, codebook, bits, pin
):
    _needs_hopper(pin)
    experts = make_experts(e, bits, layout, seed=e * 1000 + m, codebook=codebook)
    x, w, ids = routes(e, m, top_k, seed=m, x_dtype=x_dtype)
    shared = bound(experts, m, top_k, x_dtype, compute_dtype, pin)
    per_warp = bound(experts, m, top_k, x_dtype, compute_dtype, "off")
    got = run_moe(shared, inputs(experts, x, w, ids)).clone()
    want = run_moe(per_warp, inputs(experts, x, w, ids)).clone()
    torch.cuda.synchronize()
    assert torch.isfinite(want).all() and want.abs().max() > 0
    bad = (got != want).any(dim=1).nonzero().flatten().tolist()
    assert not bad, f"{len(bad)} of {m} tokens differ, first {bad[:8]}"
    again = run_moe(shared, inputs(experts, x, w, ids))
    assert torch.equal(again, got), "the shared decode is not deterministic"


def test_shared_decode_batch_invariant():
    experts = make_experts(8, 4, "packed", seed=77)
    m, top_k = 600, 2  # 150 routes per expert: the table plans the shared decode
    x, w, ids = routes(8, m, top_k, seed=78, x_dtype=F16)
    batch = run_moe(bound(experts, m, top_k, F16, F16, None), inputs(experts, x, w, ids)).clone()
    single = bound(experts, 1, top_k, F16, F16, None)  # 1 route per expert: the per-warp decode
    for t in (0, 7, 133, 599):
        one = run_moe(single, inputs(experts, x[t : t + 1], w[t : t + 1], ids[t : t + 1]))
        assert torch.equal(one[0], batch[t]), f"token {t} differs from its batch-1 output"


@pytest.mark.parametrize("pin", SHARED)
@pytest.mark.parametrize("layout", ["packed", "proj"])
def test_shared_decode_tiers_equal_per_warp(layout, pin):
    _needs_hopper(pin)
    t0, t1 = make_experts(5, 3, layout, seed=31), make_experts(3, 4, layout, seed=32)
    t0_ids, t1_ids, num_global = [9, 0, 4, 6, 2], [7, 1, 3], 10  # global 5 and 8 unmapped
    g2c, desc = build_tiered_maps(t0_ids, t1_ids, num_global)
    tables = combine_tier_rotations(vars(t0), vars(t1), (5, 3))
    m, top_k = 400, 2
    x, w, ids = routes(num_global, m, top_k, seed=33, x_dtype=F16, num_ids=num_global)
    outs = []
    for mainloop in (pin, "off"):
        plan = plan_tiered_moe(
            m=m, top_k=top_k, hidden=H, intermediate=I, codebook="mcg", tier0_bits=3,
            tier1_bits=4, tier0_experts=5, tier1_experts=3, num_global_experts=num_global,
            w13_layout=layout, x_dtype=F16, compute_dtype=F16, shared_decode=mainloop,
            device=DEV,
        )  # fmt: skip
        assert all((s.m_warps > 0) == (mainloop != "off") for s in plan.kernel_specs)
        b = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
        args = MoeInputs(
            x, w, ids, (t0.w13, t1.w13), (t0.w2, t1.w2), tables["gate_suh"],
            tables["up_suh"] if layout == "proj" else None, tables["intermediate_rotations"],
            tables["down_svh"], g2c.to(DEV), desc.to(DEV),
        )  # fmt: skip
        outs.append(run_moe(b, args).clone())
    torch.cuda.synchronize()
    assert outs[1].abs().max() > 0
    assert torch.equal(outs[0], outs[1])
