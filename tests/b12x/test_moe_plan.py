"""CPU: MoE planning, buffer contract, binding, validation, and the whole ``run`` sequence.

The grouped GEMM is the only device kernel of ``run``; here it is replaced by an emulation built
on ``reference.trellis.decode`` (same contract: slots gather their route's row and scatter the
result back, live blocks only, tier descriptors, column window), so every torch step of ``run``
(packing, rotations, boundary, top-k sum, tier maps) is checked against ``reference.moe`` /
``reference.tiers`` on CPU. The emulation runs outside the allocation counter; everything else
must allocate nothing under the simulated graph protocol.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from b12x.ops.moe import run as run_mod
from b12x.ops.moe.custom_op import MoeOp
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from b12x.ops.moe.tiers import build_tiered_maps, combine_tier_rotations, plan_tiered_moe
from b12x.runtime.scratch import BufferNotProvided
from oracle.run.graph_protocol import ConsumerFixture, GraphProtocol, SimulatedBackend
from reference import tiers as ref_tiers
from reference.moe import TrellisExperts, expert_route_outputs, moe_forward, row_magnitude
from reference.routing import capacity_bound
from reference.trellis import decode

F16, BF16 = torch.float16, torch.bfloat16
H, I = 256, 128


def make_experts(e, bits, layout, *, seed=0, broadcast=False, codebook="mcg"):
    g = torch.Generator().manual_seed(seed)

    def payload(*shape):
        return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half()

    words = 16 * bits
    if layout == "packed":
        w13 = payload(e, H // 16, 2 * I // 16, words)
    else:
        w13 = payload(2, e, H // 16, I // 16, words)
    gate = scales(1 if broadcast else e, H)
    up = gate if layout == "packed" else scales(e, H)
    return TrellisExperts(
        w13, payload(e, I // 16, H // 16, words), gate, up, scales(e, 3 * I),
        scales(1 if broadcast else e, H), codebook, layout,
    )  # fmt: skip


class EmulatedGemm:
    """The grouped-GEMM contract on CPU (reference decode, fp32 matmul, rounded to the dtype)."""

    def __init__(self):
        self.launches = []
        self.decoded = {}  # (payload address, first K16 row, codebook, dtype) -> weight

    def weight(self, trellis, first, k_rows, codebook, dtype):
        key = (trellis.data_ptr(), first, codebook, dtype)
        if key not in self.decoded:
            fp16 = decode(trellis[first : first + k_rows], codebook)
            self.decoded[key] = fp16.to(dtype).float()
        return self.decoded[key]

    def compiled(self, spec, arch):
        def fn(a, payload, out, block_ids, count, route_rows, descriptors, lut, tier, expert_base,
               col_word):  # fmt: skip
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # tiny matmuls: thread hand-off dominates on 2 cores
            try:
                self._emulate(spec, a, payload, out, block_ids, count, route_rows, descriptors,
                              tier, expert_base, col_word)  # fmt: skip
            finally:
                torch.set_num_threads(threads)

        return fn

    def _emulate(self, spec, a, payload, out, block_ids, count, route_rows, descriptors, tier,
                 expert_base, col_word):  # fmt: skip
        with _disable_current_modes():
            self.launches.append((spec.bits, tier, expert_base, col_word, spec))
            cd = BF16 if spec.bf16 else F16
            a_rows, out_rows = a.view(cd).float(), out.view(cd)
            trellis = payload.view(torch.int16)
            k_rows, b = a.shape[1] // 8, spec.block_size
            for blk in range(block_ids.shape[0]):
                e = int(block_ids[blk])
                if blk * b >= int(count[0]) or not 0 <= e < descriptors.shape[0]:
                    continue  # inactive block: neither descriptors nor payload are read
                d = int(descriptors[e])
                if d >> 8 != tier:
                    continue
                first = (expert_base + (d & 255)) * k_rows
                w = self.weight(trellis, first, k_rows, spec.codebook, cd)
                routes = route_rows[blk * b : (blk + 1) * b].to(torch.int64)
                routes = routes[routes < a.shape[0]]  # padding slots store nothing
                cols = slice(2 * col_word, 2 * col_word + w.shape[1])
                out_rows[routes, cols] = (a_rows[routes] @ w).to(cd)


@pytest.fixture
def gemm(monkeypatch):
    emulated = EmulatedGemm()
    monkeypatch.setattr(run_mod, "compiled", emulated.compiled)
    monkeypatch.setattr(run_mod, "_lut_addr", lambda spec, device: 0)
    monkeypatch.setattr(run_mod.launchers, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(run_mod, "LAUNCH_DEVICE_TYPES", ("cuda", "cpu"))  # the emulated tier
    return emulated


def _inputs(experts, m, top_k, *, x_dtype=F16, seed=1, ids=None):
    g = torch.Generator().manual_seed(seed)
    x = (0.5 * torch.randn(m, H, generator=g)).to(x_dtype)
    if ids is None:
        ids = torch.stack(
            [torch.randperm(experts.num_experts, generator=g)[:top_k] for _ in range(m)]
        )
    w = torch.rand(m, top_k, generator=g)
    return x, w, ids


def _uniform_inputs(experts, x, w, ids):
    return MoeInputs(
        x, w, ids, (experts.w13,), (experts.w2,), experts.gate_suh,
        experts.up_suh if experts.w13_layout == "proj" else None,
        experts.intermediate_rotations, experts.down_svh,
    )  # fmt: skip


def _assert_close_rows(got, x, experts, w, ids, compute_dtype, *, ref=None):
    faithful = moe_forward(x, experts, w, ids, precision="faithful", compute_dtype=compute_dtype)
    outs, active = expert_route_outputs(
        x, experts, ids, precision="faithful", compute_dtype=compute_dtype
    )
    scale = row_magnitude(outs, active, w).float()
    err = (got.float() - faithful).norm(dim=1)
    assert bool((err <= 3e-3 * scale + 1e-6).all()), (err / scale.clamp_min(1e-9)).max()


def _plan_for(experts, m, top_k, x_dtype, compute_dtype=F16, **kw):
    return plan_moe(
        m=m, top_k=top_k, hidden=H, intermediate=I, codebook=experts.codebook, bits=experts.bits,
        num_experts=experts.num_experts, w13_layout=experts.w13_layout, x_dtype=x_dtype,
        compute_dtype=compute_dtype, **kw,
    )  # fmt: skip


# ------------------------------------------------------------------ planning and buffers


def test_plan_buffers_follow_the_problem():
    plan = plan_moe(
        m=8, top_k=2, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
        w13_layout="packed", x_dtype=F16,
    )  # fmt: skip
    names = plan.buffer_names
    assert plan.routes.capacity == capacity_bound(8, 2, 8, 16)
    assert "rotation_up" not in names and "input_f16" not in names and "global_ids" not in names
    spec = {b.name: b for b in plan.buffers}
    assert spec["output"].shape == (8, H) and spec["output"].role == "output"
    assert spec["fc1"].shape == (16, 2 * I) and spec["route_terms"].shape == (16, H)
    assert spec["packed_route_slots"].shape == (plan.routes.capacity + 16,)
    proj = plan_moe(
        m=8, top_k=2, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
        w13_layout="proj", x_dtype=BF16, compute_dtype=BF16,
    )  # fmt: skip
    pspec = {b.name: b for b in proj.buffers}
    assert pspec["rotation_up"].dtype == BF16 and pspec["input_f16"].dtype == F16
    assert {s.bf16 for s in proj.kernel_specs} == {True}
    tiers = plan_tiered_moe(
        m=4, top_k=2, hidden=H, intermediate=I, codebook="mcg", tier0_bits=3, tier1_bits=4,
        tier0_experts=3, tier1_experts=5, num_global_experts=10, w13_layout="proj",
        x_dtype=F16, compute_dtype=F16,
    )  # fmt: skip
    assert [s.bits for s in tiers.fc1_spec] == [3, 4] and tiers.routes.num_experts == 8
    assert "global_ids" in tiers.buffer_names and "expert_descriptors" not in tiers.buffer_names


def test_block_size_grows_with_routes_per_expert():
    small = plan_moe(
        m=1, top_k=8, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=128,
        w13_layout="packed", x_dtype=F16,
    )  # fmt: skip
    large = plan_moe(
        m=4096, top_k=8, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=128,
        w13_layout="packed", x_dtype=F16,
    )  # fmt: skip
    assert small.routes.block_size == 16 and large.routes.block_size == 64


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"w13_layout": "fused"}, ValueError, "w13_layout"),
        ({"hidden": 200}, ValueError, "hidden"),
        ({"bits": 9}, ValueError, "bits"),
        ({"codebook": "sqg_e4m3", "bits": 6}, ValueError, "sqg_e4m3"),
        ({"x_dtype": torch.float32}, TypeError, "x_dtype"),
        ({"top_k": 0}, ValueError, "top_k"),
        ({"top_k": 9}, ValueError, "top_k"),
        ({"num_experts": 0}, ValueError, "num_experts"),
        ({"bits": (3, 4), "num_experts": 8}, ValueError, "bits/num_experts"),
        ({"num_global_experts": 8}, ValueError, "num_global_experts"),
        ({"bits": (3, 4), "num_experts": (4, 4)}, ValueError, "num_global_experts"),
        (
            {"bits": (3, 4), "num_experts": (32, 32), "num_global_experts": 10},
            ValueError,
            "num_global_experts: 10 global ids cannot address the 64 experts",
        ),
        ({"m_tiles": 3}, ValueError, "m_tiles"),
    ],
)
def test_plan_rejects_bad_arguments_naming_them(overrides, error, match):
    args = dict(
        m=4, top_k=2, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
        w13_layout="packed", x_dtype=F16,
    )  # fmt: skip
    args.update(overrides)
    with pytest.raises(error, match=match):
        plan_moe(**args)


def test_tier_plan_requires_mcg_and_at_most_256_experts_per_tier():
    args = dict(
        m=4, top_k=2, hidden=H, intermediate=I, tier0_bits=3, tier1_bits=4, tier0_experts=3,
        tier1_experts=5, num_global_experts=10, w13_layout="proj", x_dtype=F16,
        compute_dtype=F16,
    )  # fmt: skip
    with pytest.raises(ValueError, match="codebook"):
        plan_tiered_moe(codebook="sqg_e4m3", **args)
    with pytest.raises(ValueError, match="256"):
        plan_tiered_moe(codebook="mcg", **{**args, "tier1_experts": 257})


def test_bind_checks_every_buffer_and_names_it():
    plan = plan_moe(
        m=4, top_k=2, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
        w13_layout="packed", x_dtype=F16,
    )  # fmt: skip
    buffers = allocate_moe_buffers(plan, "cpu")
    bound = bind_moe(plan, **buffers)
    assert all(bound.buffers[n] is buffers[n] for n in plan.buffer_names)
    for name in ("fc1", "route_onehot", "route_terms"):
        with pytest.raises(BufferNotProvided, match=f"`{name}`"):
            bind_moe(plan, **{**buffers, name: torch.empty(1, dtype=buffers[name].dtype)})
        with pytest.raises(BufferNotProvided, match=f"`{name}`"):
            bind_moe(plan, **{k: v for k, v in buffers.items() if k != name})
    with pytest.raises(ValueError, match="unknown buffer"):
        bind_moe(plan, **buffers, fc3=buffers["fc1"])


def test_run_validates_before_any_launch(gemm):
    experts = make_experts(8, 3, "proj")
    plan = _plan_for(experts, 4, 2, F16)
    bound = bind_moe(plan, **allocate_moe_buffers(plan, "cpu"))
    x, w, ids = _inputs(experts, 4, 2)
    good = _uniform_inputs(experts, x, w, ids)
    cases = [
        ({"topk_ids": ids.float()}, TypeError, "topk_ids"),
        ({"topk_ids": ids.to(torch.int16)}, TypeError, "topk_ids"),
        ({"topk_ids": ids[:, :1].contiguous()}, ValueError, "topk_ids"),
        ({"x": x.to(BF16)}, TypeError, "x"),
        ({"x": torch.zeros(5, H, dtype=F16)}, ValueError, "x"),
        ({"topk_weights": w.to(torch.int32)}, TypeError, "topk_weights"),
        ({"w13": (experts.w13[:, :4].contiguous(),)}, ValueError, r"w13\[0\]"),
        ({"w2": (experts.w2, experts.w2)}, ValueError, "w2"),
        ({"up_suh": None}, ValueError, "up_suh"),
        (
            {"intermediate_rotations": experts.intermediate_rotations[:1]},
            ValueError,
            "intermediate",
        ),
        ({"down_svh": experts.down_svh.float()}, TypeError, "down_svh"),
        ({"descriptor_map": torch.zeros(8, dtype=torch.int32)}, ValueError, "global_to_combined"),
    ]
    for change, error, match in cases:
        fields = {f: getattr(good, f) for f in good.__dataclass_fields__}
        fields.update(change)
        with pytest.raises(error, match=match):
            run_moe(bound, MoeInputs(**fields))
    assert gemm.launches == []


# ------------------------------------------------------------------ the run sequence on CPU


@pytest.mark.parametrize(
    "layout, x_dtype, compute_dtype, top_k, broadcast",
    [
        ("packed", F16, F16, 2, False),
        ("proj", BF16, F16, 1, True),
        ("proj", F16, BF16, 8, False),
    ],
)
def test_run_matches_the_faithful_reference(gemm, layout, x_dtype, compute_dtype, top_k, broadcast):
    experts = make_experts(8, 3, layout, broadcast=broadcast)
    m = 5
    x, w, ids = _inputs(experts, m, top_k, x_dtype=x_dtype)
    ids[1, 0] = -1  # one inactive route
    ids = ids.to(torch.int32)
    plan = _plan_for(experts, 8, top_k, x_dtype, compute_dtype)  # live M 5 < planned 8
    bound = bind_moe(plan, **allocate_moe_buffers(plan, "cpu"))
    got = run_moe(bound, _uniform_inputs(experts, x, w, ids))
    assert got.dtype == x_dtype and got.shape == (m, H)
    _assert_close_rows(got, x, experts, w, ids, compute_dtype)
    per_phase = 1 if layout == "packed" else 2
    assert len(gemm.launches) == per_phase + 1
    # R15: run launches exactly the planned specialisations, FC1 first, then FC2.
    assert [launch[4] for launch in gemm.launches] == [plan.fc1_spec[0]] * per_phase + [
        plan.fc2_spec[0]
    ]
    assert [launch[2:4] for launch in gemm.launches][:per_phase] == [(0, 0), (8, I // 2)][
        :per_phase
    ]


def test_inactive_routes_contribute_exactly_zero(gemm):
    experts = make_experts(8, 3, "packed")
    x, w, ids = _inputs(experts, 4, 2)
    ids = ids.to(torch.int64)
    ids[0] = torch.tensor([-1, 2**32])  # token 0: every route inactive
    ids[1, 1] = 8
    w[0] = float("nan")  # weights of inactive routes are never read
    w[1, 1] = float("inf")
    before = (ids.clone(), w.clone(), x.clone())
    plan = _plan_for(experts, 4, 2, F16)
    bound = bind_moe(plan, **allocate_moe_buffers(plan, "cpu"))
    got = run_moe(bound, _uniform_inputs(experts, x, w, ids))
    assert torch.equal(got[0], torch.zeros(H, dtype=F16))
    assert torch.equal(ids, before[0])
    assert torch.equal(w.view(torch.int32), before[1].view(torch.int32))  # bit-unchanged
    assert torch.equal(x, before[2])
    w_ok = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
    _assert_close_rows(got[1:], x[1:], experts, w_ok[1:], ids[1:], F16)


def _tiered(layout, seed=3):
    t0, t1 = make_experts(3, 3, layout, seed=seed), make_experts(4, 4, layout, seed=seed + 1)
    t0_ids, t1_ids = [5, 0, 7], [2, 8, 1, 4]  # globals 3, 6 unmapped
    mixed = ref_tiers.MixedTierExperts(t0, t1, 3, 4, "mcg", t0_ids, t1_ids, 9)
    g2c, desc = build_tiered_maps(t0_ids, t1_ids, 9)
    tables = combine_tier_rotations(vars(t0), vars(t1), (3, 4))
    return t0, t1, mixed, g2c, desc, tables


def test_tier_maps_match_the_reference():
    _, _, mixed, g2c, desc, tables = _tiered("proj")
    assert torch.equal(g2c, mixed.global_to_combined) and torch.equal(desc, mixed.descriptor_map)
    for name in ("gate_suh", "up_suh", "intermediate_rotations", "down_svh"):
        assert torch.equal(tables[name], getattr(mixed.rotations, name))
    with pytest.raises(ValueError, match="twice"):
        build_tiered_maps([1, 2], [2], 4)
    with pytest.raises(ValueError, match="256"):
        build_tiered_maps(list(range(257)), [], 300)


@pytest.mark.parametrize("layout", ["packed", "proj"])
def test_tiered_run_matches_the_mixed_reference(gemm, layout):
    t0, t1, mixed, g2c, desc, tables = _tiered(layout)
    g = torch.Generator().manual_seed(9)
    m, top_k = 6, 2
    x = (0.5 * torch.randn(m, H, generator=g)).half()
    ids = torch.randint(0, 9, (m, top_k), generator=g)
    ids[0, 0], ids[2, 1] = 3, 2**32  # unmapped, beyond the id space
    w = torch.rand(m, top_k, generator=g)
    plan = MoeOp().plan(
        dict(
            m=m, top_k=top_k, hidden=H, intermediate=I, tier0_bits=3, tier1_bits=4,
            tier0_experts=3, tier1_experts=4, num_global_experts=9, w13_layout=layout,
            x_dtype=F16, compute_dtype=F16,
        )
    )  # fmt: skip
    bound = bind_moe(plan, **allocate_moe_buffers(plan, "cpu"))
    inputs = MoeInputs(
        x, w, ids, (t0.w13, t1.w13), (t0.w2, t1.w2), tables["gate_suh"],
        tables["up_suh"] if layout == "proj" else None, tables["intermediate_rotations"],
        tables["down_svh"], g2c, desc,
    )  # fmt: skip
    got = run_moe(bound, inputs)
    want = ref_tiers.mixed_moe_forward(x, mixed, w, ids, precision="faithful")
    assert {launch[0] for launch in gemm.launches} == {3, 4}
    err = (got.float() - want).norm(dim=1)
    assert bool((err <= 3e-3 * want.norm(dim=1) + 1e-3).all()), err


# ------------------------------------------------------------------ simulated graph protocol


@pytest.fixture
def simulated(monkeypatch, gemm):
    backend = SimulatedBackend()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: backend.capturing)
    return backend


def _fixture(plan, experts, sets=2):
    buffers = allocate_moe_buffers(plan, "cpu")
    made = [_inputs(experts, plan.problem.m, plan.problem.top_k, seed=s) for s in range(sets)]

    def as_inputs(x, w, ids):
        return {"x": x, "topk_weights": w, "topk_ids": ids, "w13": experts.w13, "w2": experts.w2,
                "gate_suh": experts.gate_suh, "up_suh": experts.up_suh,
                "intermediate_rotations": experts.intermediate_rotations,
                "down_svh": experts.down_svh}  # fmt: skip

    inputs = {k: v.clone() for k, v in as_inputs(*made[0]).items()}
    scratch = tuple(n for n in buffers if n != "output")
    return ConsumerFixture(
        buffers, inputs, [as_inputs(*s) for s in made], outputs=("output",), scratch=scratch
    )


def test_simulated_graph_protocol_passes_without_allocation(simulated):
    experts = make_experts(8, 3, "proj")
    problem = dict(
        m=3, top_k=2, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
        w13_layout="proj", x_dtype=F16,
    )  # fmt: skip
    op = MoeOp()
    verdict = GraphProtocol(op, problem, _fixture(op.plan(problem), experts), simulated).run()
    assert verdict.passed, verdict.reasons
    assert verdict.step("capture").status == "pass"


def test_simulated_graph_protocol_catches_an_allocating_run(simulated, monkeypatch):
    def allocating_h128(src, tmp):
        src.copy_(src * 1.0)  # a fresh tensor per call
        return src

    monkeypatch.setattr(run_mod.boundary, "h128_fp32_", allocating_h128)
    experts = make_experts(8, 3, "packed")
    problem = dict(
        m=2, top_k=1, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
        w13_layout="packed", x_dtype=F16,
    )  # fmt: skip
    op = MoeOp()
    verdict = GraphProtocol(op, problem, _fixture(op.plan(problem), experts), simulated).run()
    assert verdict.step("capture").status == "fail"
