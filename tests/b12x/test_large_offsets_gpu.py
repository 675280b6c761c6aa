"""GPU: byte offsets past 2^31 (R9). A dense payload and a MoE stack larger than 2 GiB, judged
where the offsets are largest: the dense linear's last 128 columns (the last N16 tiles of every
K16 row) and the MoE routes to the last experts of the stack. A 32-bit byte offset anywhere on
those paths wraps and reads another tile's or expert's weights, which the judges flag.
"""

from __future__ import annotations

import pytest
import torch

from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from oracle.judge.tolerance import judge_linear, judge_moe
from reference import trellis as ref_trellis
from reference.moe import TrellisExperts

pytestmark = pytest.mark.gpu

DEV = torch.device("cuda")
F16 = torch.float16
GIB2 = 2**31


def _payload(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randint(-(2**15), 2**15, shape, generator=g, device=DEV, dtype=torch.int32).to(
        torch.int16
    )


def _scales(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    sign = torch.where(torch.rand(shape, generator=g, device=DEV) < 0.5, -1.0, 1.0)
    return (sign * (0.5 + torch.rand(shape, generator=g, device=DEV))).to(F16)


def test_a_dense_payload_past_2_gib_is_read_at_its_last_columns():
    k, n, bits = 32768, 139264, 4  # 2.28e9 payload bytes
    payload = _payload((k // 16, n // 16, 16 * bits), seed=1)
    assert payload.numel() * payload.element_size() > GIB2
    suh = (_scales((k,), seed=2).float() * 0.02).to(F16)
    svh = _scales((n,), seed=3)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(4)).to(F16).to(DEV)
    plan = plan_dense(m=1, k=k, n=n, bits=bits, codebook="mcg", x_dtype=F16, device=DEV)
    bound = bind_dense(plan, **allocate_dense_buffers(plan, DEV))
    y = run_dense(bound, x, payload, suh, svh).clone()
    last = slice(n - 128, n)  # one H128 block of outputs: its own rotation, its own columns
    weight = ref_trellis.decode(payload[:, -8:].cpu(), "mcg")
    verdict = judge_linear(
        y[:, last].cpu(), x=x.cpu(), weight=weight, suh=suh.cpu(), svh=svh[last].cpu(),
        compute_dtype=F16,
    )  # fmt: skip
    assert verdict.passed, verdict.reason


def test_a_moe_stack_past_2_gib_is_read_at_its_last_experts():
    e, h, i, top_k = 72, 4096, 8192, 2  # w13 2.4e9 bytes, w2 1.2e9
    w13 = _payload((e, h // 16, 2 * i // 16, 64), seed=5)
    w2 = _payload((e, i // 16, h // 16, 64), seed=6)
    assert w13.numel() * w13.element_size() > GIB2
    gate_suh = (_scales((e, h), seed=7).float() * 0.05).to(F16)
    rotations = (_scales((e, 3 * i), seed=8).float() * 0.05).to(F16)
    down_svh = _scales((1, h), seed=9)
    experts = TrellisExperts(w13, w2, gate_suh, gate_suh, rotations, down_svh, "mcg", "packed")
    x = (0.5 * torch.randn(2, h, generator=torch.Generator().manual_seed(10))).to(F16).to(DEV)
    ids = torch.tensor([[e - 1, e - 2], [e - 1, 0]], dtype=torch.int64, device=DEV)
    w = torch.tensor([[0.7, 0.3], [0.5, 0.5]], device=DEV)
    plan = plan_moe(
        m=2, top_k=top_k, hidden=h, intermediate=i, codebook="mcg", bits=4, num_experts=e,
        w13_layout="packed", x_dtype=F16,
    )  # fmt: skip
    bound = bind_moe(plan, **allocate_moe_buffers(plan, DEV))
    inputs = MoeInputs(x, w, ids, (w13,), (w2,), gate_suh, None, rotations, down_svh)
    y = run_moe(bound, inputs).clone()
    verdict = judge_moe(y, x=x, experts=experts, topk_weights=w, topk_ids=ids, compute_dtype=F16)
    assert verdict.passed, verdict.reason
