"""CPU: ``moe_gemm``, one grouped trellis GEMM as its own plan / bind / run op.

* Planning: route block, K split and geometry are the tables' answers (recorded decisions), the
  wave-balanced FC2 tile needs an unpaired FC2 and a device (simulated here), payload shapes
  match ``b12x.ops.moe.pairs.pair_payload_shape``, buffer specs are exact.
* Validation: every ``plan_moe_gemm`` argument, every buffer at bind (meta refused), every run
  input (dtype, shape, device, contiguity, alignment, id dtype, the mode table only when
  dynamic) raises naming it, before anything is packed or launched.
* The run sequence with the kernel replaced by an emulation of its contract (reference decode,
  slots gather / scatter route rows, live blocks only): one-hot activations give back the
  decoded weight of each route's expert in route order, rows of inactive routes stay untouched,
  the launch goes through the MoE's shared bodies with the plan's spec; the op object runs the
  simulated CUDA-graph protocol without allocating.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from b12x.kernels.moe_gemm import DYNAMIC_KINDS
from b12x.launch import host
from b12x.ops.moe import boundary, gemm_op
from b12x.ops.moe import pairs as pairs_mod
from b12x.ops.moe import run as run_mod
from b12x.ops.moe.dispatch import FC2_TILE, GEMM_GEOMETRY, K_SPLIT, PAIR_GEOMETRY, ROUTE_BLOCK
from b12x.ops.moe.gemm_op import (
    MoeGemmOp,
    allocate_moe_gemm_buffers,
    bind_moe_gemm,
    plan_moe_gemm,
    run_moe_gemm,
)
from b12x.runtime import compile_cache
from b12x.runtime.scratch import BufferNotProvided
from oracle.judge.tiles import SimulatedDevice
from oracle.run.graph_protocol import ConsumerFixture, GraphProtocol, SimulatedBackend
from reference.pairs import decode_pair
from reference.trellis import decode

F16, BF16 = torch.float16, torch.bfloat16
RATE_SUM = {"P22": 4, "P33": 6, "P24": 6, "P43": 7, "P44": 8, "dynamic": 6}
H200 = SimulatedDevice("H200", 132, 232448, (9, 0))


def _problem(**changes):
    base = dict(
        m=4, top_k=2, k=256, n=256, codebook="mcg", bits=4, num_experts=4, compute_dtype=F16,
        phase="fc1",
    )  # fmt: skip
    return {**base, **changes}


# ------------------------------------------------------------------ planning


def test_plan_takes_its_geometry_from_the_tables():
    plan = plan_moe_gemm(**_problem(m=128, top_k=8, k=5120, n=3072, num_experts=16))
    m_tiles = ROUTE_BLOCK.decide({"m": 128, "top_k": 8, "num_experts": 16})
    k_split = K_SPLIT.decide({"k": 5120})
    geometry = GEMM_GEOMETRY.decide(
        {"m_tiles": m_tiles, "n": 3072, "k_split": k_split, "wide_tile_cap": 4}
    )
    spec = plan.spec
    assert (m_tiles, k_split) == (4, 8) and plan.routes.block_size == 64
    assert (spec.m_tiles, spec.k_split, spec.n_tiles, spec.warps, spec.depth) == (
        m_tiles, k_split, *geometry,
    )  # fmt: skip
    assert [(d.role, d.table) for d in plan.decisions] == [
        ("route_block", "moe_route_block"), ("fc1.k_split", "moe_k_split"),
        ("fc1.geometry", "moe_gemm_geometry"),
    ]  # fmt: skip
    # the warm-up set: the GEMM, then the device route packer (1024 routes at most)
    assert plan.routes.routes == 1024 and plan.kernel_specs == (spec, boundary.PACK_SPEC)
    past = plan_moe_gemm(**_problem(m=129, top_k=8, k=5120, n=3072, num_experts=16))  # 1032
    assert past.kernel_specs == (past.spec,)
    pinned = plan_moe_gemm(**_problem(m_tiles=2))
    assert pinned.routes.block_size == 32 and pinned.decisions[0].path == "pinned_m_tiles"


@pytest.mark.parametrize("phase, pair, m_tiles", [("fc1", "P24", 2), ("fc2", "dynamic", 4)])
def test_paired_plans_take_the_pair_geometry(phase, pair, m_tiles):
    plan = plan_moe_gemm(**_problem(phase=phase, pair=pair, bits=3, m_tiles=m_tiles, n=512))
    g = PAIR_GEOMETRY.decide({"phase": phase, "m_tiles": m_tiles, "n": 512})
    spec = plan.spec
    assert (spec.pair, spec.bits, spec.k_split) == (pair, 3, 1)
    assert (spec.n_tiles, spec.warps, spec.depth, spec.rate_axis) == tuple(g)


def test_the_wave_balanced_tile_needs_an_unpaired_fc2_and_a_device():
    glm = _problem(m=129, top_k=8, k=1536, n=5120, num_experts=160, bits=3, phase="fc2")
    wave = plan_moe_gemm(**glm, device=H200)
    assert wave.spec.n_group == 512 and wave.decisions[-1].path == "wave_balanced"
    case = dict(wave.decisions[-1].case)
    assert FC2_TILE.explain(case).path == "wave_balanced" and case["hidden"] == 5120
    assert plan_moe_gemm(**glm).spec.n_group == 64  # no device: the default (2, 2, 8) at k_split 2
    # FC1 never takes the wave tile: the default geometry at k_split 2, (2, 2, 8)
    assert plan_moe_gemm(**{**glm, "phase": "fc1"}, device=H200).spec.n_group == 64
    paired = plan_moe_gemm(**{**glm, "pair": "P24"}, device=H200)
    assert paired.spec.pair == "P24" and paired.spec.n_group != 512
    assert MoeGemmOp(device=H200).plan(glm).spec == wave.spec  # the op's (simulated) device
    few = plan_moe_gemm(**{**glm, "m": 128}, device=H200)  # 1024 routes: measured slower
    assert few.spec.n_group == 64 and few.decisions[-1].path == "default"


@pytest.mark.parametrize(
    "phase, pair, k, n",
    [("fc1", None, 512, 256), ("fc2", None, 256, 512), ("fc1", "P24", 512, 256),
     ("fc1", "P44", 256, 512), ("fc2", "dynamic", 512, 256), ("fc2", "P22", 256, 512)],
)  # fmt: skip
def test_payload_shapes_are_the_moe_layouts(phase, pair, k, n):
    bits = 4 if pair is None else 3
    plan = plan_moe_gemm(**_problem(phase=phase, pair=pair, bits=bits, k=k, n=n))
    e = 4
    if pair is None:
        assert plan.payload_shape == (e, k // 16, n // 16, 16 * bits)
    elif phase == "fc1":  # one projection of the proj layout = packed with 2I = N
        words = (k // 16) * (n // 256) * 128 * RATE_SUM[pair]
        assert plan.payload_shape == (e, words)
        shape = dict(num_experts=e, hidden=k)
        proj = pairs_mod.pair_payload_shape("fc1", pair, **shape, intermediate=n, w13_layout="proj")
        assert proj == (2, *plan.payload_shape)
        if n % 512 == 0:
            assert (
                pairs_mod.pair_payload_shape(
                    "fc1", pair, **shape, intermediate=n // 2, w13_layout="packed"
                )
                == plan.payload_shape
            )
    else:
        assert plan.payload_shape == pairs_mod.pair_payload_shape(
            "fc2", pair, num_experts=e, hidden=n, intermediate=k, w13_layout="packed"
        )


def test_buffer_specs_are_exact():
    plan = plan_moe_gemm(**_problem(m=5, top_k=3, compute_dtype=BF16))
    specs = {b.name: b for b in plan.buffers}
    assert specs["out"].shape == (15, 256) and specs["out"].dtype == BF16
    assert specs["out"].role == "output" and {b.role for b in plan.buffers} == {"output", "scratch"}
    assert specs["expert_descriptors"].shape == (4,) and specs["expert_descriptors"].dtype == (
        torch.int32
    )
    assert specs["packed_route_slots"].shape == (plan.routes.capacity + 15,)
    assert specs["block_expert_ids"].shape == (plan.routes.num_blocks,)
    assert set(plan.buffer_names) <= set(gemm_op.MOE_GEMM_BUFFER_NAMES)
    assert dict(gemm_op.OBSERVABLES) == {"out": "gemm"}
    buffers = allocate_moe_gemm_buffers(plan, "cpu")
    assert {n: (t.shape, t.dtype) for n, t in buffers.items()} == {
        s.name: (torch.Size(s.shape), s.dtype) for s in plan.buffers
    }


@pytest.mark.parametrize(
    "changes, error, match",
    [
        ({"m": 0}, ValueError, "m: expected a positive int"),
        ({"m": True}, TypeError, "m: expected int, got bool"),
        ({"top_k": 5}, ValueError, "top_k: 5 exceeds the number of experts 4"),
        ({"top_k": 2.0}, TypeError, "top_k: expected int"),
        ({"k": 200}, ValueError, "k: K=200 must be a multiple of 128"),
        ({"n": 320}, ValueError, "n: N=320 must be a multiple of 128"),
        ({"n": True}, TypeError, "n: expected int"),
        ({"num_experts": 0}, ValueError, "num_experts: expected a positive int"),
        ({"codebook": "mcgx"}, ValueError, "codebook: unknown codebook 'mcgx'; known"),
        ({"codebook": None}, TypeError, "codebook: expected str"),
        ({"bits": 4.0}, TypeError, "bits: expected int, got float"),
        ({"bits": 9}, ValueError, r"bits: codebook 'mcg' supports bits \(1,"),
        ({"codebook": "sqg_e4m3", "bits": 5}, ValueError, "bits: codebook 'sqg_e4m3'"),
        ({"compute_dtype": torch.float32}, TypeError, "compute_dtype: expected torch.float16"),
        ({"compute_dtype": "float16"}, TypeError, "compute_dtype: expected a torch.dtype"),
        ({"phase": "fc3"}, ValueError, r"phase: expected one of \('fc1', 'fc2'\)"),
        ({"phase": None}, TypeError, "phase: expected one of"),
        ({"pair": "P25", "bits": 3}, ValueError, r"pair: expected None or one of \('P22'"),
        ({"pair": 24, "bits": 3}, TypeError, "pair: expected None or one of"),
        ({"pair": "P24"}, ValueError, "bits: pair layouts compile on the trellis_bits = 3"),
        ({"pair": "P44", "bits": 3, "codebook": "sqg_fp16"}, ValueError, "bits: codebook"),
        ({"pair": "P22", "bits": 3, "codebook": "sqg_fp16"}, ValueError, "bits: codebook"),
        ({"pair": "P24", "bits": 3, "n": 384}, ValueError, "n: a fc1 pair layout needs whole 256"),
        ({"pair": "P24", "bits": 3, "phase": "fc2", "k": 384}, ValueError,
         "k: a fc2 pair layout needs whole 256"),
        ({"m_tiles": 3}, ValueError, r"m_tiles: expected None or one of \(1, 2, 4\)"),
        ({"m_tiles": True}, TypeError, "m_tiles: expected int, got bool"),
        ({"device": "cpu"}, ValueError, "device: expected a CUDA device or a simulated device"),
        ({"m": 2**20, "top_k": 1, "m_tiles": 1}, ValueError, "m: 1048576 tokens give"),
    ],
)  # fmt: skip
def test_plan_names_every_bad_argument(changes, error, match):
    with pytest.raises(error, match=match):
        plan_moe_gemm(**_problem(**changes))


def test_plan_is_keyword_only_and_has_no_codebook_default():
    with pytest.raises(TypeError):
        plan_moe_gemm(4, 2, 256, 256, "mcg", 4, 4, F16, "fc1")  # positional: refused
    problem = _problem()
    del problem["codebook"]
    with pytest.raises(TypeError, match="codebook"):
        plan_moe_gemm(**problem)


def test_bind_checks_every_buffer_and_refuses_meta():
    plan = plan_moe_gemm(**_problem())
    buffers = allocate_moe_gemm_buffers(plan, "cpu")
    bound = bind_moe_gemm(plan, **buffers)
    assert all(bound.buffers[n] is buffers[n] for n in plan.buffer_names)
    for name in ("out", "expert_descriptors", "packed_route_slots"):
        with pytest.raises(BufferNotProvided, match=f"`{name}`"):
            bind_moe_gemm(plan, **{k: v for k, v in buffers.items() if k != name})
        with pytest.raises(BufferNotProvided, match=f"`{name}`"):
            bind_moe_gemm(plan, **{**buffers, name: torch.empty(1, dtype=buffers[name].dtype)})
    with pytest.raises(ValueError, match="unknown buffer"):
        bind_moe_gemm(plan, **buffers, fc1=buffers["out"])
    with pytest.raises(ValueError, match="out: expected a buffer on a CUDA device .* got meta"):
        bind_moe_gemm(plan, **allocate_moe_gemm_buffers(plan, "meta"))
    with pytest.raises(TypeError, match="plan: expected MoeGemmPlan"):
        bind_moe_gemm(object(), **buffers)
    with pytest.raises(TypeError, match="plan: expected MoeGemmPlan"):
        allocate_moe_gemm_buffers(object(), "cpu")


# ------------------------------------------------------------------ emulated run on CPU


class EmulatedGemm:
    """The grouped-GEMM contract on CPU for unpaired and paired specs (reference decode)."""

    def __init__(self):
        self.launches = []
        self.built = set()

    def compiled(self, spec, arch):
        """Like the compile cache: a spec never built raises while frozen or capturing."""
        if spec not in self.built:
            if compile_cache.is_frozen() or compile_cache.capture_active():
                raise compile_cache.KernelResolutionFrozen(f"moe_gemm({spec}) was never warmed")
            self.built.add(spec)

        def fn(a, payload, out, block_ids, count, route_rows, descriptors, *rest):
            paired = len(rest) == 5  # (modes, lut, tier, base, col) vs (lut, tier, base, col)
            modes, (_, tier, base, col) = (rest[0], rest[1:]) if paired else (None, rest)
            assert paired == (spec.pair is not None)
            with _disable_current_modes():
                self.launches.append((spec, modes, tier, base, col, payload))
                self._emulate(spec, a, payload, out, block_ids, count, route_rows, descriptors,
                              modes, base, col)  # fmt: skip

        return fn

    @staticmethod
    def weight(spec, payload, local, modes, k):
        if spec.pair is None:
            k16 = k // 16
            return decode(payload[local * k16 : (local + 1) * k16].view(torch.int16), spec.codebook)
        kind = DYNAMIC_KINDS[int(modes[local])] if spec.pair == "dynamic" else spec.pair
        rows = k // 16 if spec.rate_axis == "n" else k // 256
        flat = payload[local * rows : (local + 1) * rows].reshape(-1).view(torch.int16)
        if spec.rate_axis == "n":
            return decode_pair(flat, (kind,) * payload.shape[1], "n", k, spec.codebook,
                               layout="prepared")  # fmt: skip
        return decode_pair(flat, (kind,) * (k // 256), "k", 16 * payload.shape[1], spec.codebook)

    def _emulate(self, spec, a, payload, out, block_ids, count, route_rows, descriptors, modes,
                 base, col):  # fmt: skip
        cd = BF16 if spec.bf16 else F16
        a_rows, out_rows = a.view(cd).float(), out.view(cd)
        b = spec.block_size
        for blk in range(block_ids.shape[0]):
            e = int(block_ids[blk])
            if blk * b >= int(count[0]) or not 0 <= e < descriptors.shape[0]:
                continue
            local = base + (int(descriptors[e]) & 255)
            w = self.weight(spec, payload, local, modes, a_rows.shape[1]).to(cd).float()
            routes = route_rows[blk * b : (blk + 1) * b].to(torch.int64)
            routes = routes[routes < a.shape[0]]
            out_rows[routes, 2 * col : 2 * col + w.shape[1]] = (a_rows[routes] @ w).to(cd)


@pytest.fixture
def gemm(monkeypatch):
    emulated = EmulatedGemm()
    for module in (run_mod, pairs_mod, gemm_op):
        monkeypatch.setattr(module, "compiled", emulated.compiled)
    monkeypatch.setattr(run_mod, "_lut_addr", lambda spec, device: 0)
    monkeypatch.setattr(pairs_mod, "_lut_addr", lambda spec, device: 0)
    monkeypatch.setattr(host, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(run_mod, "LAUNCH_DEVICE_TYPES", ("cuda", "cpu"))  # the emulated tier
    return emulated


def _payload(g, shape):
    return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)


def one_hot_routes(e, k, top_k, dtype, *, inactive_tokens=2):
    """Route ``r = t·top_k + j`` of the first ``e·k / top_k`` tokens carries expert ``r // k``
    and a one-hot activation at column ``r % k``, so the output rows ``[0, e·k)`` viewed
    ``[e, k, N]`` are the experts' weights. The last tokens route only to inactive ids."""
    routes = e * k
    ids = (torch.arange(routes) // k).view(-1, top_k)
    dead = torch.tensor([-1, e, 2**31 - 1, -(2**31)] * top_k)[: inactive_tokens * top_k]
    ids = torch.cat([ids, dead.view(inactive_tokens, top_k)]).to(torch.int64)
    a = torch.zeros(ids.numel(), k, dtype=dtype)
    a[torch.arange(routes), torch.arange(routes) % k] = 1
    a[routes:] = 1  # inactive routes' rows are never read into a stored result
    return a, ids


def expected_weights(plan, payload, modes):
    p = plan.problem
    words = payload.view(-1).view(torch.int32).view(_int32_rows(plan))
    ws = [EmulatedGemm.weight(plan.spec, words, e, modes, p.k) for e in range(p.num_experts)]
    return torch.stack(ws).to(p.compute_dtype)


def _int32_rows(plan):
    """The int32 kernel view shape of the payload (``[E·rows, cols, words]``)."""
    p, spec = plan.problem, plan.spec
    if spec.pair is None:
        return (p.num_experts * p.k // 16, p.n // 16, 8 * p.bits)
    if spec.rate_axis == "n":
        return (p.num_experts * p.k // 16, p.n // 256, spec.pair_words)
    return (p.num_experts * p.k // 256, p.n // 16, spec.pair_words)


CASES = [
    # (phase, pair, bits, compute dtype, m_tiles)
    ("fc1", None, 4, F16, None),
    ("fc2", None, 4, BF16, 1),
    ("fc1", "P24", 3, F16, None),
    ("fc2", "dynamic", 3, BF16, 2),
]


@pytest.mark.parametrize("phase, pair, bits, cd, m_tiles", CASES)
def test_one_hot_rows_give_back_the_decoded_weights(gemm, phase, pair, bits, cd, m_tiles):
    e, k, n, top_k = 2, 256, 256, 2
    g = torch.Generator().manual_seed(len(CASES[0]) + bits)
    a, ids = one_hot_routes(e, k, top_k, cd)
    m = ids.shape[0]
    plan = plan_moe_gemm(
        m=m + 3, top_k=top_k, k=k, n=n, codebook="mcg", bits=bits, num_experts=e,
        compute_dtype=cd, phase=phase, pair=pair, m_tiles=m_tiles,
    )  # fmt: skip
    payload = _payload(g, plan.payload_shape)
    modes = torch.tensor([0, 1], dtype=torch.int32) if pair == "dynamic" else None
    buffers = allocate_moe_gemm_buffers(plan, "cpu")
    buffers["out"].fill_(float("nan"))
    bound = bind_moe_gemm(plan, **buffers)
    before = (ids.clone(), a.clone(), payload.clone())
    out = run_moe_gemm(bound, a=a, topk_ids=ids, payload=payload, modes=modes)
    assert out.shape == (m * top_k, n) and out.dtype == cd
    assert out.data_ptr() == buffers["out"].data_ptr()  # a view of the bound buffer
    want = expected_weights(plan, payload, modes)
    got = out[: e * k].reshape(e, k, n)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.isnan(out[e * k :]).all()  # inactive routes: never written
    assert torch.isnan(buffers["out"][m * top_k :]).all()  # past the live rows: untouched
    assert all(torch.equal(x, y) for x, y in zip(before, (ids, a, payload), strict=True))
    (launch,) = gemm.launches
    spec, seen_modes, tier, base, col, _ = launch
    assert spec == plan.spec and (tier, base, col) == (0, 0, 0)
    if pair == "dynamic":
        assert seen_modes is modes  # the caller's table itself, nothing copied
    if pair == "dynamic":  # each expert decodes at its own mode
        first = got.clone()
        flipped = run_moe_gemm(bound, a=a, topk_ids=ids, payload=payload, modes=1 - modes)
        assert not torch.equal(flipped[:k], first[0])
        assert not torch.equal(flipped[k : 2 * k], first[1])


def test_route_order_follows_the_ids(gemm):
    """Two tokens × top_k 2 with mixed experts: route r = t·top_k + j holds ids[t, j]'s row."""
    plan = plan_moe_gemm(**_problem(m=2, num_experts=4, bits=2))
    payload = _payload(torch.Generator().manual_seed(5), plan.payload_shape)
    ids = torch.tensor([[3, 0], [1, 3]], dtype=torch.int32)
    a = torch.zeros(4, 256, dtype=F16)
    a[torch.arange(4), torch.tensor([7, 200, 0, 255])] = 1
    bound = bind_moe_gemm(plan, **allocate_moe_gemm_buffers(plan, "cpu"))
    out = run_moe_gemm(bound, a=a, topk_ids=ids, payload=payload)
    w = expected_weights(plan, payload, None)
    for r, (expert, row) in enumerate([(3, 7), (0, 200), (1, 0), (3, 255)]):
        assert torch.equal(out[r], w[expert, row]), r


class _Packed(Exception):
    pass


def test_run_validates_every_input_before_anything_runs(gemm, monkeypatch):
    plan = plan_moe_gemm(**_problem(pair="dynamic", bits=3, phase="fc2", k=256))
    bound = bind_moe_gemm(plan, **allocate_moe_gemm_buffers(plan, "cpu"))
    g = torch.Generator().manual_seed(1)
    good = dict(
        a=torch.zeros(8, 256, dtype=F16),
        topk_ids=torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]]),
        payload=_payload(g, plan.payload_shape),
        modes=torch.tensor([0, 1, 1, 0], dtype=torch.int32),
    )
    unaligned = torch.zeros(8 * 256 + 1, dtype=F16)[1:].view(8, 256)
    cases = [
        ({"a": good["a"].float()}, TypeError, "a: expected dtype torch.float16"),
        ({"a": good["a"][:6]}, ValueError, r"a: expected shape \(8, 256\)"),
        ({"a": torch.zeros(8, 512, dtype=F16)[:, :256]}, ValueError, "a: must be contiguous"),
        ({"a": unaligned}, ValueError, "a: data pointer must be 16-byte aligned"),
        ({"a": good["a"].to("meta")}, ValueError, "a: expected device cpu, got meta"),
        ({"a": None}, TypeError, "a: expected a torch.Tensor"),
        ({"topk_ids": good["topk_ids"].float()}, TypeError, "topk_ids: expected dtype"),
        ({"topk_ids": good["topk_ids"].short()}, TypeError, "topk_ids: expected dtype"),
        ({"topk_ids": good["topk_ids"][:, :1].contiguous()}, ValueError, "topk_ids: expected sha"),
        ({"topk_ids": torch.zeros(5, 2, dtype=torch.int64)}, ValueError, "topk_ids: live M=5"),
        ({"topk_ids": good["topk_ids"].to("meta")}, ValueError, "topk_ids: expected device"),
        ({"payload": good["payload"].view(4, 2, -1)}, ValueError, "payload: expected shape"),
        ({"payload": good["payload"].int()}, TypeError, "payload: expected dtype torch.int16"),
        ({"payload": good["payload"].to("meta")}, ValueError, "payload: expected device"),
        ({"modes": None}, TypeError, "modes: expected a torch.Tensor"),
        ({"modes": good["modes"].long()}, TypeError, "modes: expected dtype torch.int32"),
        ({"modes": good["modes"][:3].contiguous()}, ValueError, "modes: expected shape"),
        ({"modes": torch.tensor([0, 1, 2, 0], dtype=torch.int32)}, ValueError,
         "modes: mode values must be 0"),
    ]  # fmt: skip
    packed = []

    def packer(*args):
        packed.append(args)
        raise _Packed

    monkeypatch.setattr(gemm_op.routing, "pack_routes_into", packer)
    for change, error, match in cases:
        with pytest.raises(error, match=match):
            run_moe_gemm(bound, **{**good, **change})
    with pytest.raises(TypeError, match="bound: expected BoundMoeGemm"):
        run_moe_gemm(object(), **good)
    assert packed == [] and gemm.launches == []
    with pytest.raises(_Packed):  # the good inputs pass every check
        run_moe_gemm(bound, **good)
    packed.clear()
    static = plan_moe_gemm(**_problem(pair="P24", bits=3, phase="fc2"))
    bound = bind_moe_gemm(static, **allocate_moe_gemm_buffers(static, "cpu"))
    payload = _payload(g, static.payload_shape)
    with pytest.raises(ValueError, match="modes: only a dynamic pair layout takes a mode table"):
        run_moe_gemm(bound, **{**good, "payload": payload})
    assert packed == [] and gemm.launches == []


def test_a_cpu_bound_plan_is_refused_without_the_emulated_tier(gemm, monkeypatch):
    monkeypatch.setattr(run_mod, "LAUNCH_DEVICE_TYPES", ("cuda",))
    plan = plan_moe_gemm(**_problem())
    bound = bind_moe_gemm(plan, **allocate_moe_gemm_buffers(plan, "cpu"))
    a, ids = torch.zeros(8, 256, dtype=F16), torch.zeros(4, 2, dtype=torch.int32)
    payload = torch.zeros(plan.payload_shape, dtype=torch.int16)
    with pytest.raises(ValueError, match=r"bound: run_moe_gemm launches CUDA kernels.* cpu"):
        run_moe_gemm(bound, a=a, topk_ids=ids, payload=payload)
    assert gemm.launches == []


def test_a_cold_kernel_under_a_frozen_cache_raises_before_packing(monkeypatch):
    monkeypatch.setattr(host, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(run_mod, "LAUNCH_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(compile_cache, "CACHE", compile_cache.CompileCache())
    packed = []
    monkeypatch.setattr(gemm_op.routing, "pack_routes_into", lambda *a: packed.append(a))
    plan = plan_moe_gemm(**_problem())
    bound = bind_moe_gemm(plan, **allocate_moe_gemm_buffers(plan, "cpu"))
    inputs = dict(
        a=torch.zeros(8, 256, dtype=F16), topk_ids=torch.zeros(4, 2, dtype=torch.int32),
        payload=torch.zeros(plan.payload_shape, dtype=torch.int16),
    )  # fmt: skip
    op = MoeGemmOp()
    with op.freeze(), pytest.raises(compile_cache.KernelResolutionFrozen, match="moe_gemm"):
        run_moe_gemm(bound, **inputs)
    with op.freeze(), pytest.raises(compile_cache.KernelResolutionFrozen, match="warps=2"):
        op.compile_unwarmed(plan)
    assert packed == [] and not compile_cache.CACHE.compiled_keys()


# ------------------------------------------------------------------ the op object


@pytest.fixture
def simulated(monkeypatch, gemm):
    backend = SimulatedBackend()
    # A real replay runs no Python; the simulated one re-runs the captured callable, so host-side
    # work skipped under capture (the mode-table value read) is skipped on replay too.
    monkeypatch.setattr(
        torch.cuda, "is_current_stream_capturing",
        lambda: backend.capturing or getattr(backend, "replaying", False),
    )  # fmt: skip
    return backend


def test_op_runs_the_simulated_graph_protocol_without_allocation(simulated):
    e, k = 2, 256
    problem = dict(
        m=e * k // 2, top_k=2, k=k, n=256, codebook="mcg", bits=3, num_experts=e,
        compute_dtype=F16, phase="fc1", pair="dynamic",
    )  # fmt: skip
    op = MoeGemmOp()
    plan = op.plan(problem)
    g = torch.Generator().manual_seed(3)
    a, ids = one_hot_routes(e, k, 2, F16, inactive_tokens=0)

    def inputs(seed):  # every route active: the out rows are all written (poison would show)
        perm = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed))
        return {"a": a[perm].contiguous(), "topk_ids": ids.view(-1)[perm].view(-1, 2).clone(),
                "payload": _payload(g, plan.payload_shape),
                "modes": torch.tensor([seed % 2, 1 - seed % 2], dtype=torch.int32)}  # fmt: skip

    sets = [inputs(s) for s in range(2)]
    buffers = allocate_moe_gemm_buffers(plan, "cpu")
    fixture = ConsumerFixture(
        buffers, {name: t.clone() for name, t in sets[0].items()}, sets, outputs=("out",),
        scratch=tuple(n for n in buffers if n != "out"),
    )  # fmt: skip
    verdict = GraphProtocol(op, problem, fixture, simulated).run()
    assert verdict.passed, verdict.reasons
    assert verdict.step("capture").status == "pass"


def test_op_checks_its_mappings(gemm):
    op = MoeGemmOp()
    with pytest.raises(TypeError, match="problem: expected a mapping"):
        op.plan([("m", 1)])
    plan = op.plan(_problem())
    buffers = allocate_moe_gemm_buffers(plan, "cpu")
    with pytest.raises(BufferNotProvided, match="`out`"):
        op.bind(plan, {k: v for k, v in buffers.items() if k != "out"})
    bound = op.bind(plan, {**buffers, "unrelated": torch.zeros(1)})  # only the plan's names
    with pytest.raises(TypeError, match="inputs: expected a mapping"):
        op.run(bound, None)
    with pytest.raises(TypeError, match="a: expected a torch.Tensor"):
        op.run(bound, {"topk_ids": torch.zeros(4, 2, dtype=torch.int32)})
