"""GPU tests added for the mutation gate's GPU tier (each names the catalogue mutants it kills).

* ``moe-kernel-inactive-route-not-masked`` (R7), ``moe-padding-slot-stored`` (R8): the grouped
  GEMM launched directly on hand-built route blocks, so that every liveness guard of the kernel
  contract (``b12x.kernels.moe_gemm``: a block is live iff ``b·B < route_count[0]`` and ``0 <=
  id < descriptors.shape[0]``; a slot holding the sentinel ``>= n`` stores nothing) is the ONLY
  thing between a forbidden block or slot and a visible write. The route packer never emits an
  expert id of −1, so through ``run_moe`` the lower bound cannot be observed; here it can.
  Out-of-range descriptor reads land on known words (the descriptor table is a 16-byte aligned
  view inside a larger buffer whose neighbours name real experts), and ``out`` is a prefix view
  of a NaN canary buffer, so a stored sentinel slot (row ``n``) changes a checkable row.
  Activations are one-hot rows: every written row must equal one decoded weight row exactly.
* ``moe-route-block-size-disagrees`` (R12/R15): ``plan_moe`` with ``m_tiles`` pinned above the
  automatic choice must still pack routes in the launch's block size; its run must agree with
  the automatically planned run.
* ``bf16-as-fp16-custom-op`` (R14): the dense custom op with ``compute_dtype=bfloat16`` must equal,
  bit for bit, the plan / bind / run path planned with bf16 compute (and differ from fp16 compute,
  which proves the comparison can tell the two apart).
"""

from __future__ import annotations

import pytest
import torch

from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch import host
from b12x.ops.dense import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import GemmContext, MoeInputs, launch_grouped_gemm, run_moe
from reference.trellis import decode

pytestmark = pytest.mark.gpu

F16 = torch.float16
DEV = "cuda"


def _payload(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)


# ------------------------------------------------------------------ grouped GEMM liveness guards

K, N, E, BITS, B = 128, 128, 2, 3, 16
N_ROUTES = 64
SENTINEL = N_ROUTES
# (block expert id, routes in its slots); route_count covers blocks 0..3 only (4·16 slots).
BLOCKS = (
    (1, list(range(0, 16))),  # live: expert 1
    (-1, list(range(16, 32))),  # id −1: inactive (the lower bound)
    (E, list(range(32, 48))),  # id E: inactive (the upper bound)
    (0, list(range(48, 56)) + [SENTINEL] * 8),  # live: expert 0, half padding slots
    (0, list(range(56, 64))),  # past route_count: inactive
)
ROUTE_COUNT = 4 * B
LIVE = {**{r: 1 for r in range(0, 16)}, **{r: 0 for r in range(48, 56)}}  # route -> expert


def _hot_column(route: int) -> int:
    return (7 * route + 3) % K


def _grouped_gemm_case():
    payload = _payload((E, K // 16, N // 16, 16 * BITS), seed=71)
    a = torch.zeros(N_ROUTES, K, dtype=F16)
    for r in range(N_ROUTES):
        a[r, _hot_column(r)] = 1.0
    route_rows = torch.full((len(BLOCKS) * B,), SENTINEL, dtype=torch.int32)
    for b, (_, routes) in enumerate(BLOCKS):
        route_rows[b * B : b * B + len(routes)] = torch.tensor(routes, dtype=torch.int32)
    block_ids = torch.tensor([e for e, _ in BLOCKS], dtype=torch.int32)
    # descriptors = words [4, 4 + E) of a 12-word buffer: word 3 (what id −1 would read) and
    # word 4 + E (what id E would read) name real tier-0 experts, so a missing bound computes.
    table = torch.zeros(12, dtype=torch.int32)
    table[4 : 4 + E] = torch.arange(E, dtype=torch.int32)
    table[3], table[4 + E] = 0, 1
    return payload, a, route_rows, block_ids, table


def test_grouped_gemm_writes_only_live_routes_of_live_blocks():
    payload, a, route_rows, block_ids, table = _grouped_gemm_case()
    weights = decode(payload, "mcg")  # fp16 [E, K, N]
    canary = torch.full((N_ROUTES + B, N), float("nan"), dtype=F16, device=DEV)
    table_dev = table.to(DEV)
    descriptors = table_dev[4 : 4 + E]
    assert descriptors.data_ptr() % 16 == 0
    spec = MoeGemmSpec("mcg", BITS, False, m_tiles=1, n_tiles=2, depth=8)
    ctx = GemmContext(
        arch=host.device_arch(torch.device(DEV)),
        block_expert_ids=block_ids.to(DEV),
        route_count=torch.tensor([ROUTE_COUNT], dtype=torch.int32, device=DEV),
        route_rows=route_rows.to(DEV),
        descriptors=descriptors,
    )
    launch_grouped_gemm(
        spec=spec, codebook="mcg", ctx=ctx, tier=0, a=a.to(DEV), payload=payload.to(DEV),
        num_payload_experts=E, out=canary[:N_ROUTES], expert_base=0, out_col=0,
    )  # fmt: skip
    torch.cuda.synchronize()
    got = canary.cpu()
    written = sorted(r for r in range(got.shape[0]) if not torch.isnan(got[r]).all())
    assert written == sorted(LIVE), f"rows written: {written}"
    for route, expert in LIVE.items():  # one-hot rows: exactly one decoded weight row each
        assert torch.equal(got[route], weights[expert, _hot_column(route)]), route


# ------------------------------------------------------------------ pinned m_tiles (R12 / R15)

H, I = 256, 128


def _moe_case(e, m, top_k, seed):
    g = torch.Generator().manual_seed(seed)

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half().to(DEV)

    w13 = _payload((e, H // 16, 2 * I // 16, 16 * BITS), seed + 1).to(DEV)
    w2 = _payload((e, I // 16, H // 16, 16 * BITS), seed + 2).to(DEV)
    x = (0.5 * torch.randn(m, H, generator=g)).half().to(DEV)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(DEV)
    w = torch.rand(m, top_k, generator=g).to(DEV)
    return MoeInputs(
        x, w, ids, (w13,), (w2,), scales(e, H), None, scales(e, 3 * I), scales(1, H)
    )  # fmt: skip


@pytest.mark.parametrize("m_tiles", [2, 4])
def test_pinned_m_tiles_packs_routes_in_the_launch_block_size(m_tiles):
    e, m, top_k = 8, 16, 2  # 4 routes per expert: the automatic choice is m_tiles = 1
    inputs = _moe_case(e, m, top_k, seed=81)
    outputs = {}
    for pin in (None, m_tiles):
        plan = plan_moe(
            m=m, top_k=top_k, hidden=H, intermediate=I, codebook="mcg", bits=BITS,
            num_experts=e, w13_layout="packed", x_dtype=F16, compute_dtype=F16, m_tiles=pin,
        )  # fmt: skip
        assert {s.block_size for s in plan.kernel_specs} == {16 * (pin or 1)}
        outputs[pin] = run_moe(bind_moe(plan, **allocate_moe_buffers(plan, DEV)), inputs).clone()
    torch.cuda.synchronize()
    auto, pinned = outputs[None].double(), outputs[m_tiles].double()
    assert torch.isfinite(pinned).all()
    err = float((pinned - auto).norm() / auto.norm())
    assert err <= 1e-3, f"pinned m_tiles={m_tiles} differs from the automatic plan: relL2 {err:.3e}"


# ------------------------------------------------------------------ dense custom op dtype (R14)


def test_dense_op_computes_in_the_requested_dtype():
    import b12x.ops.dense.custom_op as ops

    m, k, n, bits = 24, 256, 256, 4
    g = torch.Generator().manual_seed(91)
    x = (torch.randn(m, k, generator=g) * 0.5).half().to(DEV)
    trellis = _payload((k // 16, n // 16, 16 * bits), seed=92).to(DEV)
    suh = torch.randn(k, generator=g).sign().half().to(DEV)
    svh = (torch.randn(n, generator=g).sign() * 0.125).half().to(DEV)

    def planned(compute_dtype):
        plan = plan_dense(
            m=m, k=k, n=n, bits=bits, codebook="mcg", x_dtype=F16, compute_dtype=compute_dtype,
            device=x.device,
        )  # fmt: skip
        bound = bind_dense(plan, **allocate_dense_buffers(plan, x.device))
        return run_dense(bound, x, trellis, suh, svh).clone()

    want_bf16, want_f16 = planned(torch.bfloat16), planned(F16)
    assert not torch.equal(want_bf16, want_f16), "bf16 and fp16 compute must be distinguishable"
    got = ops.dense_linear(x, trellis, suh, svh, codebook="mcg", compute_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    assert got.dtype == F16
    assert torch.equal(got, want_bf16)
