"""GPU: one grouped trellis GEMM (``moe_gemm``) with one-hot activations returns the weights
decoded by the reference, bit for bit.

Route ``r = t·top_k + j`` of the first ``E·K/top_k`` tokens goes to expert ``r // K`` with a
one-hot activation at column ``r % K``, so the output rows ``[0, E·K)`` viewed ``[E, K, N]`` must
equal the decoded payload in the compute dtype: each output is ``1·w`` plus exact zeros in fp32,
rounded once (fp16 compute: the fp16 weight itself; bf16 compute: the weight rounded to bf16).
The trailing tokens route only to inactive ids (−1, E, 2^31−1, −2^31): their rows keep the NaN
poison. Cases: MCG K4 uniform (fp16 and bf16, FC1 and FC2 with the intra-CTA K split, a pinned
single-block route size), a static pair (P24, FC1 / N axis), a dynamic pair (FC2 / K axis, one
expert per mode), and the wave-balanced FC2 tile planned for this device.
"""

from __future__ import annotations

import pytest
import torch

from b12x.ops.moe.gemm_op import (
    allocate_moe_gemm_buffers,
    bind_moe_gemm,
    plan_moe_gemm,
    run_moe_gemm,
)
from reference.pairs import decode_pair
from reference.trellis import decode

pytestmark = pytest.mark.gpu

F16, BF16 = torch.float16, torch.bfloat16
DEV = "cuda"
DYNAMIC_KINDS = ("P33", "P24")  # mode 0, mode 1 (spec §4.2)


def _payload(seed, shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)


def one_hot_routes(e, k, top_k, dtype):
    routes = e * k
    ids = (torch.arange(routes) // k).view(-1, top_k)
    dead = torch.tensor([-1, e, 2**31 - 1, -(2**31)]).view(-1, top_k)  # inactive tokens
    ids = torch.cat([ids, dead]).to(torch.int64)
    a = torch.zeros(ids.numel(), k, dtype=dtype)
    a[torch.arange(routes), torch.arange(routes) % k] = 1
    a[routes:] = 1
    return a, ids


def reference_weights(plan, payload, modes):
    """``[E, K, N]`` decoded by the reference, in the compute dtype."""
    p = plan.problem
    if p.pair is None:
        return decode(payload, p.codebook).to(p.compute_dtype)
    ws = []
    for e in range(p.num_experts):
        kind = DYNAMIC_KINDS[int(modes[e])] if p.pair == "dynamic" else p.pair
        if p.phase == "fc1":
            w = decode_pair(payload[e], (kind,) * (p.n // 256), "n", p.k, p.codebook,
                            layout="prepared")  # fmt: skip
        else:
            w = decode_pair(payload[e], (kind,) * (p.k // 256), "k", p.n, p.codebook)
        ws.append(w)
    return torch.stack(ws).to(p.compute_dtype)


CASES = [
    # (phase, pair, bits, k, n, experts, top_k, m_tiles, compute dtype, device for the plan)
    ("fc1", None, 4, 256, 512, 2, 2, None, F16, None),
    ("fc1", None, 4, 256, 512, 2, 2, None, BF16, None),
    ("fc2", None, 4, 2048, 256, 2, 1, None, F16, None),  # k_split 4
    ("fc2", None, 4, 2048, 256, 2, 1, 1, BF16, None),  # k_split 4, one M16 block
    ("fc1", "P24", 3, 256, 512, 2, 2, None, F16, None),
    ("fc2", "dynamic", 3, 512, 256, 2, 2, None, BF16, None),
    ("fc2", None, 4, 256, 512, 64, 2, None, F16, DEV),  # the wave-balanced FC2 tile
]


@pytest.mark.parametrize(
    "phase, pair, bits, k, n, e, top_k, m_tiles, cd, device",
    CASES,
    ids=[f"{c[0]}-{c[1]}-k{c[3]}-{c[8]}-m{c[7]}-{'dev' if c[9] else 'nodev'}" for c in CASES],
)
def test_one_hot_rows_reproduce_the_decoded_weights(phase, pair, bits, k, n, e, top_k, m_tiles,
                                                    cd, device):  # fmt: skip
    a, ids = one_hot_routes(e, k, top_k, cd)
    plan = plan_moe_gemm(
        m=ids.shape[0], top_k=top_k, k=k, n=n, codebook="mcg", bits=bits, num_experts=e,
        compute_dtype=cd, phase=phase, pair=pair, m_tiles=m_tiles, device=device,
    )  # fmt: skip
    if device is not None:
        assert plan.spec.n_group == 512, plan.decisions[-1]  # the wave-balanced tile
    payload = _payload(e * k + n, plan.payload_shape)
    modes = torch.tensor([0, 1], dtype=torch.int32) if pair == "dynamic" else None
    buffers = allocate_moe_gemm_buffers(plan, DEV)
    buffers["out"].fill_(float("nan"))
    bound = bind_moe_gemm(plan, **buffers)
    out = run_moe_gemm(
        bound, a=a.to(DEV), topk_ids=ids.to(DEV), payload=payload.to(DEV),
        modes=None if modes is None else modes.to(DEV),
    )  # fmt: skip
    torch.cuda.synchronize()
    got = out[: e * k].reshape(e, k, n).cpu()
    want = reference_weights(plan, payload, modes)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.isnan(out[e * k :]).all()  # inactive routes: rows never written
