"""GPU (sm_90): QSRT pairs through the ``wgmma`` shared decode give the per-warp pair kernel's bits.

The pair shared decode (:mod:`b12x.kernels.pair_decode`, planned by the ``moe_mainloop`` table's
``tensor_core`` row for paired steps) decodes each K16 row of an expert once per 128-slot route
block, at each record's rate, and multiplies with ``wgmma``; pairs have no K split, so a route's
result must equal the per-warp pair kernel's (:mod:`b12x.kernels.moe_pair_gemm`), which
``tests/b12x/test_moe_pairs_gpu.py`` judges against the references. Each case runs the whole op
twice on the same inputs, planned ``shared_decode="tensor"`` and ``"off"``, and asserts equal
bits:

* every static kind on FC1 (N axis, one pair per CTA, LLHH tiles) except P43 (an odd rate sum:
  the table keeps it per-warp), every kind on FC2 (K axis, the record picked per step), and
  ``"dynamic"`` (per-expert mode tables, both bodies);
* packed and proj FC1, fp16 and bf16, MCG plus a LUT codebook and 3INST;
* M from 20 routes per expert (a whole dead warpgroup in every block) to several blocks per
  expert with a partial last block, inactive routes (ids -1 and E, NaN weights) among them;
* one case once more under CUDA-graph replay (caller buffers poisoned first), and the plan
  check that the default plan on this device takes the shared decode for a paired step.
"""

from __future__ import annotations

import pytest
import torch

from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from oracle.run.runners.inputs import MoeChoices, paired_experts, stack_to

pytestmark = pytest.mark.gpu

F16, BF16 = torch.float16, torch.bfloat16
DEV = "cuda"


def _hopper() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the pair shared decode multiplies with wgmma (sm_90 only)")


def _experts(e, h, i, layout, fc1, fc2, codebook, seed):
    gen = torch.Generator().manual_seed(seed)
    choices = MoeChoices(layout, F16, torch.int32, fc1, fc2)
    return stack_to(paired_experts(gen, e, h, i, choices, codebook), DEV)


def _routes(e, m, top_k, h, x_dtype, seed):
    """Tokens, weights and ids; every 5th token's last route is inactive (-1 or E, NaN weight)."""
    g = torch.Generator().manual_seed(seed)
    x = (0.05 * torch.randn(m, h, generator=g)).to(x_dtype)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
    w = torch.rand(m, top_k, generator=g)
    dead = ids[::5]
    dead[:, -1] = torch.tensor([-1, e]).repeat(len(dead))[: len(dead)]
    ids[::5] = dead
    w[::5, -1] = float("nan")
    return x.to(DEV), w.to(DEV), ids.to(torch.int32).to(DEV)


def _inputs(experts, x, w, ids):
    return MoeInputs(
        x, w, ids, (experts.w13,), (experts.w2,), experts.gate_suh,
        experts.up_suh if experts.w13_layout == "proj" else None,
        experts.intermediate_rotations, experts.down_svh, None, None,
        experts.fc1_modes, experts.fc2_modes,
    )  # fmt: skip


def _bound(experts, m, top_k, x_dtype, compute_dtype, shared_decode):
    plan = plan_moe(
        m=m, top_k=top_k, hidden=experts.hidden_size, intermediate=experts.intermediate_size,
        codebook=experts.codebook, bits=3, num_experts=experts.num_experts,
        w13_layout=experts.w13_layout, x_dtype=x_dtype, compute_dtype=compute_dtype,
        fc1_pair=experts.fc1_pair, fc2_pair=experts.fc2_pair, shared_decode=shared_decode,
        device=DEV,
    )  # fmt: skip
    want = shared_decode != "off"
    assert all((s.m_warps > 0) == want for s in plan.kernel_specs), plan.kernel_specs
    return bind_moe(plan, **allocate_moe_buffers(plan, DEV))


CASES = [
    # experts, top_k, m, H, I, layout, fc1, fc2, x dtype, compute dtype, codebook
    (8, 8, 20, 512, 512, "proj", "P33", "P33", F16, F16, "mcg"),  # 20 routes: dead warpgroup
    (8, 8, 300, 512, 512, "packed", "P24", "P24", BF16, BF16, "mcg"),  # 3 blocks, partial last
    (8, 8, 160, 1024, 256, "proj", "P22", "P44", F16, BF16, "mcg"),
    (8, 8, 160, 512, 512, "packed", "P44", "P43", F16, F16, "mcg"),
    (8, 8, 200, 512, 512, "proj", "dynamic", "dynamic", F16, F16, "mcg"),
    (8, 4, 300, 512, 512, "packed", "dynamic", None, BF16, BF16, "mcg"),
    (8, 8, 160, 512, 512, "proj", None, "dynamic", F16, F16, "mcg"),
    (8, 8, 160, 512, 256, "proj", "P24", "dynamic", F16, F16, "sqg_e4m3"),
    (8, 8, 160, 512, 512, "packed", "P33", "P24", F16, F16, "3inst"),
]


@pytest.mark.parametrize(
    "e, top_k, m, h, i, layout, fc1, fc2, x_dtype, compute_dtype, codebook", CASES
)
def test_pair_shared_decode_equals_per_warp(
    e, top_k, m, h, i, layout, fc1, fc2, x_dtype, compute_dtype, codebook
):
    _hopper()
    experts = _experts(e, h, i, layout, fc1, fc2, codebook, seed=m + i + e)
    x, w, ids = _routes(e, m, top_k, h, x_dtype, seed=m + 3)
    inputs = _inputs(experts, x, w, ids)
    want = run_moe(_bound(experts, m, top_k, x_dtype, compute_dtype, "off"), inputs).clone()
    got = run_moe(_bound(experts, m, top_k, x_dtype, compute_dtype, "tensor"), inputs)
    torch.cuda.synchronize()
    assert torch.isfinite(want).all()
    assert torch.equal(got, want)


def test_pair_shared_decode_under_graph_replay():
    _hopper()
    e, top_k, m, h, i = 8, 8, 200, 512, 512
    experts = _experts(e, h, i, "proj", "dynamic", "P24", "mcg", seed=91)
    x, w, ids = _routes(e, m, top_k, h, F16, seed=92)
    inputs = _inputs(experts, x, w, ids)
    want = run_moe(_bound(experts, m, top_k, F16, F16, "off"), inputs).clone()
    bound = _bound(experts, m, top_k, F16, F16, "tensor")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_moe(bound, inputs)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_moe(bound, inputs)
    bound.buffers["output"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bound.buffers["output"][:m], want)


def test_default_plan_takes_the_pair_shared_decode_at_many_routes():
    _hopper()
    common = dict(
        top_k=8, hidden=512, intermediate=512, codebook="mcg", bits=3, num_experts=8,
        w13_layout="proj", x_dtype=F16, compute_dtype=F16, device=DEV,
    )  # fmt: skip
    plan = plan_moe(m=64, fc1_pair="P33", fc2_pair="dynamic", **common)
    assert all(s.m_warps == 8 and s.wgmma for s in plan.kernel_specs), plan.kernel_specs
    plan = plan_moe(m=64, fc1_pair="P43", fc2_pair="P33", **common)
    assert not any(s.m_warps for s in plan.kernel_specs), plan.kernel_specs
