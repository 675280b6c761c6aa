"""GPU: the fused MoE over QSRT pair payloads against reference.moe_pairs (spec §4.2–§4.4).

* Differential: static kinds P22 / P33 / P24 / P43 / P44 and ``"dynamic"`` (mixed per-expert mode
  tables) on FC1 (N-axis records, prepared order) and FC2 (K-axis records), experts {8, 64},
  top-k {1, 8}, M {1, 17, 128}, H {512, 1024}, I {256, 512} (1–2 pairs), proj and packed,
  fp16 and bf16, MCG plus one 3INST, one MUL1 and one sqg_e4m3 (LUT) case; judged like
  tests/b12x/test_moe_gpu.py: per row against the faithful paired reference relative to the row's
  magnitude, and globally against the exact reference by the tolerance rule.
* P33 ≡ uniform K3: the paired kernels on the uniform payload re-cut as P33 give the uniform
  kernels' output bit for bit (same decode, same per-column accumulation order).
* Inactive routes contribute exactly zero (NaN weights, ids -1 / E / 2^31-1), eager and under
  CUDA-graph replay with dynamic mode tables (the mode value check is skipped while capturing);
  a direct launch writes only the live routes of live blocks (ids -1 / E, past the route count,
  padding slots stay poisoned).
* Determinism and batch invariance (no split-K: a token's output at batch M equals batch 1).
* K groups on the pair kernel (pinned specs, ``k_split`` 2 / 4 on both axes, static and dynamic)
  in the direct launch above, also within fp32 reordering of the unsplit launch; on sm_90 the
  pair shared decode folding at the same K boundaries gives the split per-warp kernel's bits.
* The custom op with pair arguments passes opcheck's schema / fake-tensor checks.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import b12x.ops.moe.custom_op  # noqa: F401  (registers torch.ops.b12x.trellis_moe)
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch import host as launchers
from b12x.ops.moe.pairs import launch_paired_gemm, pair_gemm_spec
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import GemmContext, MoeInputs, run_moe
from oracle.judge.tolerance import judge_gemm
from reference.moe import TrellisExperts
from reference.moe_pairs import (
    PairedExperts,
    p33_from_uniform,
)
from reference.pairs import decode_pair

pytestmark = pytest.mark.gpu

F16, BF16 = torch.float16, torch.bfloat16
DEV = "cuda"
RATE_SUM = {"P22": 4, "P33": 6, "P24": 6, "P43": 7, "P44": 8, "dynamic": 6}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _payload(g, *shape):
    return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)


def _scales(g, rows, width):
    sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
    return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half()


def _modes(g, e):
    modes = torch.randint(0, 2, (e,), generator=g, dtype=torch.int32)
    modes[0], modes[1] = 0, 1  # both kinds always present
    return modes


def make_paired(e, h, i, layout, fc1, fc2, *, seed=0, codebook="mcg"):
    """Random paired experts on the GPU (payload words are uniform: every tile is valid)."""
    g = _gen(seed)

    def words(choice):
        return (h // 16) * (i // 256) * 128 * RATE_SUM[choice]

    if fc1 is None:
        w13 = _payload(g, 2, e, h // 16, i // 16, 48) if layout == "proj" else _payload(
            g, e, h // 16, 2 * i // 16, 48)  # fmt: skip
    else:
        w13 = _payload(g, 2, e, words(fc1)) if layout == "proj" else _payload(g, e, 2 * words(fc1))
    w2 = _payload(g, e, i // 16, h // 16, 48) if fc2 is None else _payload(g, e, words(fc2))
    gate = _scales(g, e, h)
    up = gate if layout == "packed" else _scales(g, e, h)
    m1 = _modes(g, e) if fc1 == "dynamic" else None
    m2 = _modes(g, e) if fc2 == "dynamic" else None
    tensors = [w13, w2, gate, up, _scales(g, e, 3 * i), _scales(g, 1, h)]
    tensors = [t.to(DEV) for t in tensors]
    modes = [None if m is None else m.to(DEV) for m in (m1, m2)]
    return PairedExperts(*tensors, codebook, layout, fc1, fc2, *modes)


def _routes(e, m, top_k, h, *, seed, x_dtype=F16):
    g = _gen(seed)
    x = (0.1 * torch.randn(m, h, generator=g)).to(x_dtype)  # keeps H = 1024 outputs in fp16
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
    return x.to(DEV), torch.rand(m, top_k, generator=g).to(DEV), ids.to(DEV)


def _inputs(experts, x, w, ids):
    return MoeInputs(
        x, w, ids, (experts.w13,), (experts.w2,), experts.gate_suh,
        experts.up_suh if experts.w13_layout == "proj" else None,
        experts.intermediate_rotations, experts.down_svh, None, None,
        getattr(experts, "fc1_modes", None), getattr(experts, "fc2_modes", None),
    )  # fmt: skip


def _bound(experts, m, top_k, x_dtype, compute_dtype, *, fc1=None, fc2=None, m_tiles=None):
    plan = plan_moe(
        m=m, top_k=top_k, hidden=experts.hidden_size, intermediate=experts.intermediate_size,
        codebook=experts.codebook, bits=3, num_experts=experts.num_experts,
        w13_layout=experts.w13_layout, x_dtype=x_dtype, compute_dtype=compute_dtype,
        m_tiles=m_tiles, fc1_pair=fc1, fc2_pair=fc2,
    )  # fmt: skip
    return bind_moe(plan, **allocate_moe_buffers(plan, DEV))


CASES = [
    # experts, top_k, m, H, I, layout, fc1, fc2, x dtype, compute dtype, codebook, m_tiles
    (8, 1, 1, 512, 256, "proj", "P33", "P33", F16, F16, "mcg", None),
    (8, 8, 17, 512, 512, "proj", "P24", "P24", F16, F16, "mcg", None),
    (64, 8, 128, 1024, 256, "proj", "dynamic", "dynamic", F16, F16, "mcg", None),
    (64, 1, 17, 512, 512, "packed", "dynamic", "dynamic", BF16, BF16, "mcg", None),
    (8, 8, 128, 1024, 512, "proj", "P22", "P44", F16, BF16, "mcg", None),
    (8, 1, 17, 512, 256, "packed", "P43", "P22", BF16, F16, "mcg", None),
    (64, 8, 1, 512, 256, "proj", "P44", "P43", F16, F16, "mcg", None),
    (64, 8, 17, 1024, 512, "proj", "dynamic", None, F16, BF16, "mcg", None),
    (8, 8, 128, 512, 256, "packed", None, "dynamic", F16, F16, "mcg", None),
    (8, 8, 128, 512, 512, "proj", "dynamic", "P24", F16, F16, "mcg", 2),
    (64, 8, 128, 512, 512, "proj", "P33", "P24", BF16, BF16, "mcg", None),
    (8, 8, 17, 512, 256, "proj", "P24", "dynamic", F16, F16, "sqg_e4m3", None),
    (8, 1, 17, 512, 256, "proj", "P24", "P44", F16, F16, "3inst", None),
    (8, 8, 17, 512, 256, "packed", "P43", "dynamic", F16, F16, "mul1", None),
]


@pytest.mark.parametrize(
    "e, top_k, m, h, i, layout, fc1, fc2, x_dtype, compute_dtype, codebook, m_tiles", CASES
)
def test_paired_moe_matches_references(
    e, top_k, m, h, i, layout, fc1, fc2, x_dtype, compute_dtype, codebook, m_tiles, moe_judge
):
    experts = make_paired(e, h, i, layout, fc1, fc2, seed=e + m + i, codebook=codebook)
    x, w, ids = _routes(e, m, top_k, h, seed=m + 1, x_dtype=x_dtype)
    bound = _bound(experts, m, top_k, x_dtype, compute_dtype, fc1=fc1, fc2=fc2, m_tiles=m_tiles)
    got = run_moe(bound, _inputs(experts, x, w, ids))
    torch.cuda.synchronize()
    assert got.dtype == x_dtype and torch.isfinite(got).all()
    moe_judge(got, x, experts, w, ids, compute_dtype)


def _uniform_k3(e, h, i, layout, seed):
    g = _gen(seed)
    w13 = _payload(g, 2, e, h // 16, i // 16, 48) if layout == "proj" else _payload(
        g, e, h // 16, 2 * i // 16, 48)  # fmt: skip
    gate = _scales(g, e, h)
    up = gate if layout == "packed" else _scales(g, e, h)
    tensors = [w13, _payload(g, e, i // 16, h // 16, 48), gate, up, _scales(g, e, 3 * i),
               _scales(g, 1, h)]  # fmt: skip
    return TrellisExperts(*[t.to(DEV) for t in tensors], "mcg", layout)


def _as_p33(uniform, fc1, fc2):
    e = uniform.num_experts
    w13, w2 = uniform.w13, uniform.w2
    if fc1 and uniform.w13_layout == "packed":
        w13 = torch.stack([p33_from_uniform(w13[x].cpu(), "n") for x in range(e)])
    elif fc1:
        w13 = torch.stack([
            torch.stack([p33_from_uniform(w13[p, x].cpu(), "n") for x in range(e)]) for p in (0, 1)
        ])  # fmt: skip
    if fc2:
        w2 = torch.stack([p33_from_uniform(w2[x].cpu(), "k") for x in range(e)])
    return w13.to(DEV), w2.to(DEV)


@pytest.mark.parametrize(
    "layout, fc1, fc2, m, top_k, compute_dtype",
    [
        ("proj", True, True, 17, 8, F16),
        ("packed", True, True, 128, 8, BF16),
        ("proj", True, False, 1, 1, F16),
        ("proj", False, True, 128, 8, F16),
    ],
)
def test_p33_equals_uniform_k3_bit_for_bit(layout, fc1, fc2, m, top_k, compute_dtype):
    e, h, i = 8, 512, 512
    uniform = _uniform_k3(e, h, i, layout, seed=50 + m)
    x, w, ids = _routes(e, m, top_k, h, seed=51)
    want = run_moe(_bound(uniform, m, top_k, F16, compute_dtype), _inputs(uniform, x, w, ids))
    want = want.clone()
    w13, w2 = _as_p33(uniform, fc1, fc2)
    inputs = MoeInputs(
        x, w, ids, (w13,), (w2,), uniform.gate_suh,
        uniform.up_suh if layout == "proj" else None, uniform.intermediate_rotations,
        uniform.down_svh,
    )  # fmt: skip
    bound = _bound(uniform, m, top_k, F16, compute_dtype, fc1="P33" if fc1 else None,
                   fc2="P33" if fc2 else None)  # fmt: skip
    got = run_moe(bound, inputs)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def _with_inactive(ids, e):
    ids = ids.clone()
    for i, value in enumerate([-1, e, 2**31 - 1]):
        ids[i % ids.shape[0], i % ids.shape[1]] = value
    ids[-1] = -1  # one token with every route inactive
    return ids


def test_inactive_routes_contribute_zero_eager_and_replay(moe_judge):
    e, m, top_k, h, i = 8, 9, 2, 512, 256
    experts = make_paired(e, h, i, "proj", "dynamic", "dynamic", seed=61)
    x, w, ids = _routes(e, m, top_k, h, seed=62)
    ids = _with_inactive(ids.to(torch.int32), e)
    inactive = (ids < 0) | (ids >= e)
    w = torch.where(inactive, torch.full_like(w, float("nan")), w)
    before = [t.clone() for t in (x, w, ids, experts.fc1_modes, experts.fc2_modes)]
    bound = _bound(experts, m, top_k, F16, F16, fc1="dynamic", fc2="dynamic")
    inputs = _inputs(experts, x, w, ids)
    eager = run_moe(bound, inputs).clone()
    after = (x, w, ids, experts.fc1_modes, experts.fc2_modes)
    for t, b in zip(after, before, strict=True):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8))  # bit-unchanged
    assert torch.equal(eager[-1], torch.zeros(h, dtype=F16, device=DEV))
    moe_judge(eager, x, experts, torch.where(inactive, torch.zeros_like(w), w), ids, F16)

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_moe(bound, inputs)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        run_moe(bound, inputs)
    bound.buffers["output"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bound.buffers["output"][:m], eager)
    experts.fc2_modes.copy_(1 - before[4])  # new per-expert kinds, in place
    graph.replay()
    fresh = run_moe(_bound(experts, m, top_k, F16, F16, fc1="dynamic", fc2="dynamic"), inputs)
    torch.cuda.synchronize()
    assert torch.equal(bound.buffers["output"][:m], fresh)
    assert not torch.equal(fresh, eager)


def test_runs_are_deterministic_and_batch_invariant():
    experts = make_paired(64, 512, 512, "proj", "dynamic", "P24", seed=71)
    x, w, ids = _routes(64, 17, 8, 512, seed=72)
    bound = _bound(experts, 17, 8, F16, F16, fc1="dynamic", fc2="P24")
    runs = [run_moe(bound, _inputs(experts, x, w, ids)).clone() for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    single = _bound(experts, 1, 8, F16, F16, fc1="dynamic", fc2="P24")
    for t in (0, 7, 16):  # no split-K: each route row depends only on its own A row
        one = run_moe(single, _inputs(experts, x[t : t + 1], w[t : t + 1], ids[t : t + 1]))
        assert torch.equal(one[0], runs[0][t]), f"token {t} differs from its batch-1 output"


def _direct_launch(spec, *, a, payload, modes, n, block_expert_ids, route_count, route_rows):
    """One ``launch_paired_gemm`` of ``spec`` into a NaN-poisoned ``[rows, n]`` fp16 output
    (identity descriptors: expert id = payload expert), returned."""
    e = payload.shape[0]
    ctx = GemmContext(
        arch=launchers.device_arch(torch.device(DEV)),
        block_expert_ids=torch.tensor(block_expert_ids, dtype=torch.int32, device=DEV),
        route_count=torch.tensor([route_count], dtype=torch.int32, device=DEV),
        route_rows=route_rows.to(DEV),
        descriptors=torch.arange(e, dtype=torch.int32, device=DEV),
    )
    out = torch.full((a.shape[0], n), float("nan"), dtype=F16, device=DEV)
    launch_paired_gemm(
        spec=spec, codebook="mcg", ctx=ctx, a=a, payload=payload, num_payload_experts=e,
        modes=modes, out=out, n=n, expert_base=0, out_col=0,
    )  # fmt: skip
    return out


def _expert_weight(payload, expert, kind, axis, k, n):
    """The decoded ``[K, N]`` weight of one expert's prepared pair payload at ``kind``."""
    pairs = n // 256 if axis == "n" else k // 256
    return decode_pair(payload[expert].cpu(), (kind,) * pairs, axis, k if axis == "n" else n,
                       "mcg", layout="prepared")  # fmt: skip


@pytest.mark.parametrize(
    "phase, choice, k_split",
    [("fc1", "dynamic", 1), ("fc2", "P24", 1), ("fc2", "dynamic", 1),
     ("fc1", "P33", 4), ("fc1", "dynamic", 2), ("fc2", "P33", 4), ("fc2", "dynamic", 2)],
)  # fmt: skip
def test_paired_kernel_writes_only_live_routes_of_live_blocks(phase, choice, k_split):
    """One direct launch over four 16-slot blocks: live (expert 1, one padding slot), id -1,
    id E, and a block past the route count. Only the live block's real routes are written, each
    judged by the GEMM envelope against the decoded pair weight. With K groups (the planned
    geometry, ``k_split`` replaced) the output also stays within fp32 reordering of the unsplit
    launch's: a group's slice skipped or folded twice moves it by a whole slice's products (a
    reasoned bound; that fault has not been planted on a GPU yet)."""
    e, rows, k, n = 4, 64, 1024, 1024  # four pairs on either axis: K splits up to 4
    g = _gen(91)
    spec = pair_gemm_spec(codebook="mcg", bf16=False, m_tiles=1, choice=choice, phase=phase, n=n)
    payload = _payload(g, e, (k // 16) * (n // 256) * 128 * RATE_SUM[choice]).to(DEV)
    modes = _modes(g, e).to(DEV) if choice == "dynamic" else None
    a = (0.1 * torch.randn(rows, k, generator=g)).half().to(DEV)
    route_rows = torch.arange(rows, dtype=torch.int32)  # slot s computes route s
    route_rows[5] = rows  # the sentinel: a padding slot inside the live block
    blocks = dict(block_expert_ids=[1, -1, e, 3], route_count=48, route_rows=route_rows)
    launch = dict(a=a, payload=payload, modes=modes, n=n, **blocks)  # block 3 is past the count
    out = _direct_launch(dataclasses.replace(spec, k_split=k_split), **launch)
    torch.cuda.synchronize()
    written = (~torch.isnan(out)).all(dim=1).cpu()
    untouched = torch.isnan(out).all(dim=1).cpu()
    expect = torch.zeros(rows, dtype=torch.bool)
    expect[:16] = True
    expect[5] = False
    assert torch.equal(written, expect) and torch.equal(untouched, ~expect)
    kind = choice if modes is None else ("P33", "P24")[int(modes[1])]
    weight = _expert_weight(payload, 1, kind, "n" if phase == "fc1" else "k", k, n)
    live = expect[:16]
    verdict = judge_gemm(out[:16][live].cpu(), a[:16][live].cpu(), weight, compute_dtype=F16)
    assert verdict.passed, verdict.reason
    if k_split > 1:
        unsplit = _direct_launch(spec, **launch)[:16][live].float()
        diff = (out[:16][live].float() - unsplit).abs().max().item()
        assert diff <= 1e-2 * unsplit.abs().max().item(), diff


def test_custom_op_with_pairs_schema_and_fake(moe_judge):
    experts = make_paired(8, 512, 256, "proj", "P24", "dynamic", seed=81)
    x, w, ids = _routes(8, 4, 2, 512, seed=82)
    args = (
        x, w, ids, [experts.w13], [experts.w2], experts.gate_suh, experts.up_suh,
        experts.intermediate_rotations, experts.down_svh, "mcg", "proj",
    )  # fmt: skip
    kwargs = dict(fc1_pair="P24", fc2_pair="dynamic", fc2_modes=experts.fc2_modes)
    torch.library.opcheck(
        torch.ops.b12x.trellis_moe.default, args, kwargs,
        test_utils=("test_schema", "test_faketensor"),
    )  # fmt: skip
    out = torch.ops.b12x.trellis_moe(*args, **kwargs)
    moe_judge(out, x, experts, w, ids, F16)


@pytest.mark.parametrize("phase", ["fc1", "fc2"])
def test_folding_pair_shared_decode_equals_the_split_per_warp_kernel(phase):
    """Batch invariance across the pair mainloops with a K split (sm_90): 125 routes of one
    expert (3 padding slots) through the per-warp pair kernel at ``k_split`` 2 (16-slot blocks)
    and through the ``wgmma`` pair shared decode folding at the same K boundaries (one 128-slot
    block), dynamic kind: equal bits on every live route, and the per-warp output judged
    against the decoded weight (so they do not agree on garbage)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the pair shared decode multiplies with wgmma (sm_90 only)")
    e, rows, live_rows, k, n = 4, 128, 125, 1024, 512
    g = _gen(97)
    axis = "n" if phase == "fc1" else "k"
    base = pair_gemm_spec(codebook="mcg", bf16=False, m_tiles=1, choice="dynamic", phase=phase,
                          n=n)  # fmt: skip
    per_warp = dataclasses.replace(base, k_split=2)
    shared = MoeGemmSpec(
        "mcg", 3, False, m_tiles=1, n_tiles=2, warps=8, pair="dynamic", rate_axis=axis,
        m_warps=8, shared_rows=2, smem_stages=4, wgmma=True, k_split=2,
    )  # fmt: skip
    payload = _payload(g, e, (k // 16) * (n // 256) * 128 * RATE_SUM["dynamic"]).to(DEV)
    modes = _modes(g, e).to(DEV)
    a = (0.1 * torch.randn(rows, k, generator=g)).half().to(DEV)
    route_rows = torch.arange(rows, dtype=torch.int32)
    route_rows[live_rows:] = rows  # padding at the end of the block
    outs = [
        _direct_launch(
            spec, a=a, payload=payload, modes=modes, n=n, route_rows=route_rows,
            block_expert_ids=[2] * (rows // spec.block_size), route_count=rows,
        )[:live_rows]
        for spec in (per_warp, shared)
    ]  # fmt: skip
    torch.cuda.synchronize()
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])
    weight = _expert_weight(payload, 2, ("P33", "P24")[int(modes[2])], axis, k, n)
    verdict = judge_gemm(outs[0].cpu(), a[:live_rows].cpu(), weight, compute_dtype=F16)
    assert verdict.passed, verdict.reason
