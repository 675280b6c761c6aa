"""CPU: QSRT pairs on the fused MoE: specs compile with zero spills, plans and inputs are
validated with errors naming the argument, and the whole paired ``run`` sequence matches the
paired reference with the grouped GEMM replaced by an emulation of the pair kernel's contract.

The emulation (:class:`EmulatedPairGemm`) re-states the kernel contract from its docstring with
reference pieces only: the int32 payload view of one expert is flattened back to int16 and
decoded by ``reference.pairs.decode_pair`` (prepared N-axis order for FC1, K-axis pair-major for
FC2) at the kind of the expert's mode; live blocks only, slots gather / scatter their route rows.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from b12x.kernels.moe_gemm import DYNAMIC_KINDS, MoeGemmSpec
from b12x.launch.moe_compile import build_moe_gemm
from b12x.launch.toolchain import compile_with_remarks
from b12x.ops.moe import pairs as pairs_mod
from b12x.ops.moe import run as run_mod
from b12x.ops.moe.custom_op import MoeOp, check_moe_op_args
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from oracle.pytest_plugin import slow_sweep
from reference import pairs as ref_pairs
from reference.moe import row_magnitude
from reference.moe_pairs import PairedExperts, paired_moe_forward, paired_route_outputs
from reference.trellis import decode

F16, BF16 = torch.float16, torch.bfloat16
H, I = 256, 256
KINDS = ("P22", "P33", "P24", "P43", "P44")
RATES = {"P22": (2, 2), "P33": (3, 3), "P24": (2, 4), "P43": (4, 3), "P44": (4, 4)}


# ------------------------------------------------------------------ compile (sm_90, zero spills)


def _compile(spec: MoeGemmSpec, arch: str):
    """(PTX, registers, spill bytes) of ``spec`` compiled for ``arch`` with ptxas remarks."""
    r = compile_with_remarks(*build_moe_gemm(spec), arch)
    return r.ptx, list(r.registers), list(r.spills)


def _planned(pair, phase, m_tiles, bf16, codebook="mcg", hidden=512):
    n = hidden if phase == "fc2" else 256
    return pairs_mod.pair_gemm_spec(
        codebook=codebook, bf16=bf16, m_tiles=m_tiles, choice=pair, phase=phase, n=n
    )


COMPILED = [
    # (choice, phase, m_tiles, bf16, codebook, arches)
    ("P24", "fc1", 1, False, "mcg", ("sm_90",)),
    ("dynamic", "fc1", 1, False, "mcg", ("sm_90",)),
    ("dynamic", "fc1", 4, True, "mcg", ("sm_80", "sm_90", "sm_120")),
    ("P44", "fc1", 2, False, "mcg", ("sm_90",)),
    ("P43", "fc1", 1, True, "3inst", ("sm_90",)),
    ("P24", "fc2", 1, False, "mcg", ("sm_90",)),
    ("dynamic", "fc2", 1, True, "mcg", ("sm_90",)),
    ("dynamic", "fc2", 4, True, "mcg", ("sm_80", "sm_90", "sm_120")),
    ("P44", "fc2", 4, False, "mcg", ("sm_90",)),
    ("P22", "fc2", 2, False, "sqg_e4m3", ("sm_90",)),
]


@pytest.mark.deep
@pytest.mark.parametrize(
    "choice, phase, m_tiles, bf16, codebook, arches",
    COMPILED,
    ids=[f"{c[1]}-{c[0]}-m{c[2]}-{c[4]}" for c in COMPILED],
)
def test_planned_pair_specs_compile_without_spills(choice, phase, m_tiles, bf16, codebook, arches):
    spec = _planned(choice, phase, m_tiles, bf16, codebook)
    assert spec.pair == choice and spec.rate_axis == {"fc1": "n", "fc2": "k"}[phase]
    bodies = 2 if choice == "dynamic" else 1
    records = 2 if phase == "fc2" else 1  # K axis: one mainloop body per record plane
    kind = "bf16" if bf16 else "f16"
    for arch in arches:
        ptx, regs, spills = _compile(spec, arch)
        assert re.search(rf"\.target {arch}\b", ptx)
        mma = ptx.count(f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32")
        want = 2 * spec.m_tiles * spec.n_tiles * spec.depth * bodies * records
        assert mma >= want, (arch, mma, want)
        assert spills and sum(spills) == 0, (arch, spills)
        assert regs and max(regs) <= 255


#: Pair specs with K groups (per-warp mainloop; pinned, the plans keep k_split 1 for now):
#: (choice, axis, n_tiles, warps, k_split, bf16).
SPLIT_PAIRS = [
    ("P33", "n", 2, 8, 4, True),
    ("dynamic", "n", 2, 8, 2, False),
    ("P33", "k", 2, 4, 4, False),
    ("dynamic", "k", 2, 4, 2, True),
]


@pytest.mark.deep
@pytest.mark.parametrize(
    "choice, axis, n_tiles, warps, k_split, bf16",
    SPLIT_PAIRS,
    ids=[f"{c[1]}-{c[0]}-ks{c[4]}" for c in SPLIT_PAIRS],
)
def test_split_pair_specs_compile_with_one_reduction_buffer(
    choice, axis, n_tiles, warps, k_split, bf16, smem_allocations
):
    """K groups on the pair kernel: spill-free within the registers 1024-thread CTAs leave, a
    barrier per body's reduction, and the reduction buffer allocated once per launch (the
    launch grants ``spec.smem_bytes``; a buffer per body of a dynamic launch would use twice
    that and the second body would write past the grant). Planted: the allocation moved into
    each body lists two sizes."""
    spec = MoeGemmSpec(
        "mcg", 3, bf16, n_tiles=n_tiles, warps=warps, depth=8, pair=choice, rate_axis=axis,
        k_split=k_split,
    )  # fmt: skip
    assert spec.cta_threads == 32 * warps * k_split and spec.smem_bytes > 0
    ptx, regs, spills = _compile(spec, "sm_90")
    assert spills and sum(spills) == 0, spills
    assert regs and max(regs) <= 65536 // spec.cta_threads
    assert ptx.count("bar.sync") >= (2 if choice == "dynamic" else 1)
    assert smem_allocations == [spec.smem_bytes], smem_allocations


#: (choice, phase, m_tiles, bf16) of every planned MCG pair spec the slow sweep compiles.
ALL_PLANNED = [
    (choice, phase, m_tiles, bf16)
    for choice in (*KINDS, "dynamic")
    for phase in ("fc1", "fc2")
    for m_tiles in (1, 2, 4)
    for bf16 in (False, True)
]


@pytest.mark.slow
@slow_sweep(
    "choice, phase, m_tiles, bf16",
    ALL_PLANNED,
    lambda c: f"{c[1]}-{c[0]}-m{c[2]}-{'bf16' if c[3] else 'f16'}",
    reason="the pair compile sweep runs only when selected with -m slow",
)
def test_every_planned_pair_spec_compiles(choice, phase, m_tiles, bf16):
    spec = _planned(choice, phase, m_tiles, bf16)
    _, _, spills = _compile(spec, "sm_90")
    assert sum(spills) == 0, spec


# ------------------------------------------------------------------ specs and plans


def test_pair_spec_rejects_bad_layouts():
    with pytest.raises(ValueError, match="bits: pair layouts"):
        MoeGemmSpec("mcg", 4, False, n_tiles=2, warps=8, pair="P24", rate_axis="n")
    with pytest.raises(ValueError, match="rate_axis"):
        MoeGemmSpec("mcg", 3, False, pair="P24")
    with pytest.raises(ValueError, match="rate_axis"):
        MoeGemmSpec("mcg", 3, False, rate_axis="k")
    with pytest.raises(ValueError, match="pair"):
        MoeGemmSpec("mcg", 3, False, pair="P55", rate_axis="k")
    with pytest.raises(ValueError, match="n_tiles/warps"):
        MoeGemmSpec("mcg", 3, False, n_tiles=2, warps=4, pair="P33", rate_axis="n")
    with pytest.raises(ValueError, match="n_tiles/warps"):
        MoeGemmSpec("mcg", 3, False, n_tiles=1, warps=16, pair="P33", rate_axis="n")
    spec = MoeGemmSpec("mcg", 3, False, n_tiles=4, warps=4, pair="dynamic", rate_axis="n")
    assert spec.body_kinds == DYNAMIC_KINDS == ("P33", "P24") and spec.pair_words == 64 * 6
    assert MoeGemmSpec("mcg", 3, False, pair="P43", rate_axis="k").pair_words == 64 * 7


def _plan(**kw):
    args = dict(
        m=17, top_k=2, hidden=H, intermediate=I, codebook="mcg", bits=3, num_experts=8,
        w13_layout="proj", x_dtype=F16,
    )  # fmt: skip
    return plan_moe(**{**args, **kw})


def test_plan_carries_the_pair_choice_per_phase():
    plan = _plan(fc1_pair="dynamic", fc2_pair="P24")
    (fc1,), (fc2,) = plan.fc1_spec, plan.fc2_spec
    assert (fc1.pair, fc1.rate_axis, fc1.bits) == ("dynamic", "n", 3)
    assert fc1.n_tiles * fc1.warps == 16  # one pair per CTA
    assert (fc2.pair, fc2.rate_axis, fc2.bits) == ("P24", "k", 3)
    assert plan.problem.fc1_pair == "dynamic" and plan.problem.fc2_pair == "P24"
    only2 = _plan(fc2_pair="P33")
    assert only2.fc1_spec[0].pair is None and only2.fc2_spec[0].pair == "P33"
    assert _plan().fc1_spec[0].pair is None and not _plan().problem.paired


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"fc1_pair": "P55"}, "fc1_pair"),
        ({"fc2_pair": "p24"}, "fc2_pair"),
        ({"fc1_pair": "P24", "bits": 4}, "bits: pair layouts"),
        ({"fc2_pair": "P33", "intermediate": 384}, "intermediate: I=384"),
        (
            {"fc1_pair": "dynamic", "bits": (3, 4), "num_experts": (4, 4), "num_global_experts": 8},
            "uniform stack",
        ),  # fmt: skip
    ],
)
def test_plan_rejects_bad_pairs_naming_them(overrides, match):
    with pytest.raises(ValueError, match=match):
        _plan(**overrides)


# ------------------------------------------------------------------ emulated run on CPU


class EmulatedPairGemm:
    """The paired grouped-GEMM contract on CPU (reference decode_pair, fp32 matmul)."""

    def __init__(self):
        self.launches = []

    def compiled(self, spec, arch):
        def fn(a, payload, out, block_ids, count, route_rows, descriptors, *rest):
            # paired: (modes, lut, tier, expert_base, col_word); unpaired: no modes slot
            modes, (_, tier, expert_base, col_word) = (rest[0], rest[1:]) if len(rest) == 5 else (
                None, rest)  # fmt: skip
            assert (spec.pair is None) == (len(rest) == 4)
            with _disable_current_modes():
                self._emulate(spec, a, payload, out, block_ids, count, route_rows, descriptors,
                              modes, tier, expert_base, col_word)  # fmt: skip

        return fn

    def _emulate(self, spec, a, payload, out, block_ids, count, route_rows, descriptors, modes,
                 tier, expert_base, col_word):  # fmt: skip
        self.launches.append((spec, modes, expert_base, col_word))
        cd = BF16 if spec.bf16 else F16
        a_rows, out_rows = a.view(cd).float(), out.view(cd)
        k = a_rows.shape[1]
        b = spec.block_size
        for blk in range(block_ids.shape[0]):
            e = int(block_ids[blk])
            if blk * b >= int(count[0]) or not 0 <= e < descriptors.shape[0]:
                continue
            d = int(descriptors[e])
            if d >> 8 != tier:
                continue
            local = d & 255
            kind = DYNAMIC_KINDS[int(modes[local])] if spec.pair == "dynamic" else spec.pair
            pe = expert_base + local
            if spec.pair is None:  # a uniform phase: [E·K/16, N/16, 8b] int32
                k16 = k // 16
                w = decode(payload[pe * k16 : (pe + 1) * k16].view(torch.int16), spec.codebook)
            elif spec.rate_axis == "n":
                k16 = k // 16
                flat = payload[pe * k16 : (pe + 1) * k16].reshape(-1).view(torch.int16)
                n = 256 * payload.shape[1]
                w = ref_pairs.decode_pair(flat, (kind,) * (n // 256), "n", k, spec.codebook,
                                          layout="prepared")  # fmt: skip
            else:
                p = k // 256
                flat = payload[pe * p : (pe + 1) * p].reshape(-1).view(torch.int16)
                n = 16 * payload.shape[1]
                w = ref_pairs.decode_pair(flat, (kind,) * p, "k", n, spec.codebook)
            w = w.to(cd).float()
            routes = route_rows[blk * b : (blk + 1) * b].to(torch.int64)
            routes = routes[routes < a.shape[0]]
            cols = slice(2 * col_word, 2 * col_word + w.shape[1])
            out_rows[routes, cols] = (a_rows[routes] @ w).to(cd)


@pytest.fixture
def gemm(monkeypatch):
    emulated = EmulatedPairGemm()
    monkeypatch.setattr(pairs_mod, "compiled", emulated.compiled)
    monkeypatch.setattr(run_mod, "compiled", emulated.compiled)
    monkeypatch.setattr(run_mod, "_lut_addr", lambda spec, device: 0)
    monkeypatch.setattr(pairs_mod, "_lut_addr", lambda spec, device: 0)
    monkeypatch.setattr(run_mod.launchers, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(run_mod, "LAUNCH_DEVICE_TYPES", ("cuda", "cpu"))  # the emulated tier
    return emulated


def _paired_experts(e, layout, fc1, fc2, *, seed=0, codebook="mcg", modes_dtype=torch.int32):
    g = torch.Generator().manual_seed(seed)

    def payload(*shape):
        return torch.randint(-(2**15), 2**15, shape, generator=g, dtype=torch.int32).to(torch.int16)

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, generator=g) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, generator=g))).half()

    def words(choice):
        s = 6 if choice == "dynamic" else sum(RATES[choice])
        return (H // 16) * (I // 256) * 128 * s

    if fc1 is None:
        w13 = payload(2, e, H // 16, I // 16, 48) if layout == "proj" else payload(
            e, H // 16, 2 * I // 16, 48)  # fmt: skip
    else:
        w13 = payload(2, e, words(fc1)) if layout == "proj" else payload(e, 2 * words(fc1))
    w2 = payload(e, I // 16, H // 16, 48) if fc2 is None else payload(e, words(fc2))
    gate = scales(e, H)
    up = gate if layout == "packed" else scales(e, H)
    modes = [torch.randint(0, 2, (e,), generator=g).to(modes_dtype) for _ in range(2)]
    return PairedExperts(
        w13, w2, gate, up, scales(e, 3 * I), scales(1, H), codebook, layout, fc1, fc2,
        modes[0] if fc1 == "dynamic" else None, modes[1] if fc2 == "dynamic" else None,
    )  # fmt: skip


def _inputs(experts, x, w, ids):
    return MoeInputs(
        x, w, ids, (experts.w13,), (experts.w2,), experts.gate_suh,
        experts.up_suh if experts.w13_layout == "proj" else None,
        experts.intermediate_rotations, experts.down_svh, None, None, experts.fc1_modes,
        experts.fc2_modes,
    )  # fmt: skip


def _routes(e, m, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    x = (0.5 * torch.randn(m, H, generator=g)).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)])
    return x, torch.rand(m, top_k, generator=g), ids


def _bound(experts, m, top_k, compute_dtype=F16):
    plan = plan_moe(
        m=m, top_k=top_k, hidden=H, intermediate=I, codebook=experts.codebook, bits=3,
        num_experts=experts.num_experts, w13_layout=experts.w13_layout, x_dtype=F16,
        compute_dtype=compute_dtype, fc1_pair=experts.fc1_pair, fc2_pair=experts.fc2_pair,
    )  # fmt: skip
    return bind_moe(plan, **allocate_moe_buffers(plan, "cpu"))


RUNS = [
    ("proj", "dynamic", "dynamic", F16),
    ("packed", "P24", "P33", BF16),
    ("proj", "P44", None, F16),
    ("packed", None, "P43", F16),
    ("proj", "P22", "dynamic", BF16),
]


@pytest.mark.parametrize("layout, fc1, fc2, compute_dtype", RUNS)
def test_paired_run_matches_the_paired_reference(gemm, layout, fc1, fc2, compute_dtype):
    experts = _paired_experts(6, layout, fc1, fc2, seed=len(gemm.launches) + 3)
    x, w, ids = _routes(6, 5, 2, seed=4)
    ids[2, 1] = -1  # inactive
    bound = _bound(experts, 5, 2, compute_dtype)
    got = run_moe(bound, _inputs(experts, x, w, ids))
    want = paired_moe_forward(x, experts, w, ids, precision="faithful", compute_dtype=compute_dtype)
    outs, active = paired_route_outputs(
        x, experts, ids, precision="faithful", compute_dtype=compute_dtype
    )
    scale = row_magnitude(outs, active, w).float()
    err = (got.float() - want).norm(dim=1)
    assert bool((err <= 3e-3 * scale + 1e-6).all()), (err / scale.clamp_min(1e-9)).max()
    paired = [launch for launch in gemm.launches if launch[0].pair is not None]
    assert len(paired) == (fc1 is not None) * (2 if layout == "proj" else 1) + (fc2 is not None)
    for spec, modes, _, _ in paired:
        table = experts.fc1_modes if spec.rate_axis == "n" else experts.fc2_modes
        if spec.pair == "dynamic":
            assert modes is table  # the caller's table itself, nothing copied or allocated


def test_p24_and_p33_modes_change_the_result(gemm):
    experts = _paired_experts(4, "proj", "dynamic", "dynamic", seed=8)
    x, w, ids = _routes(4, 3, 2, seed=9)
    bound = _bound(experts, 3, 2)
    first = run_moe(bound, _inputs(experts, x, w, ids)).clone()
    flipped = PairedExperts(**{
        **{k: v for k, v in vars(experts).items() if k != "_uniform"},
        "fc2_modes": 1 - experts.fc2_modes,
    })  # fmt: skip
    second = run_moe(bound, _inputs(flipped, x, w, ids))
    assert not torch.equal(first, second)


# ------------------------------------------------------------------ input validation


def test_run_rejects_bad_pair_inputs(gemm):
    experts = _paired_experts(4, "proj", "dynamic", "P24", seed=10)
    x, w, ids = _routes(4, 3, 2, seed=11)
    bound = _bound(experts, 3, 2)
    good = _inputs(experts, x, w, ids)

    def run(**changes):
        fields = {k: getattr(good, k) for k in good.__dataclass_fields__}
        run_moe(bound, MoeInputs(**{**fields, **changes}))

    run()
    with pytest.raises(ValueError, match=r"w2\[0\]"):
        run(w2=(experts.w2[:, :-16].contiguous(),))
    with pytest.raises(ValueError, match=r"w13\[0\]"):
        run(w13=(experts.w13.reshape(2, 4, -1, 48),))
    with pytest.raises(TypeError, match="fc1_modes"):
        run(fc1_modes=None)
    with pytest.raises(TypeError, match="fc1_modes"):
        run(fc1_modes=experts.fc1_modes.long())
    with pytest.raises(ValueError, match="fc1_modes"):
        run(fc1_modes=experts.fc1_modes[:3].contiguous())
    with pytest.raises(ValueError, match="fc1_modes: mode values"):
        run(fc1_modes=torch.tensor([0, 1, 2, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="fc2_modes: only a dynamic"):
        run(fc2_modes=torch.zeros(4, dtype=torch.int32))


def test_op_args_derive_the_paired_problem():
    experts = _paired_experts(4, "proj", "P24", "dynamic", seed=12)
    x, w, ids = _routes(4, 3, 2, seed=13)
    common = (x, w, ids, [experts.w13], [experts.w2], "mcg", "proj", None, None)
    keywords = check_moe_op_args(*common, "P24", "dynamic")
    assert keywords["hidden"] == H and keywords["intermediate"] == I and keywords["bits"] == 3
    assert (keywords["fc1_pair"], keywords["fc2_pair"]) == ("P24", "dynamic")
    assert MoeOp().plan(keywords | {"compute_dtype": F16}).fc2_spec[0].pair == "dynamic"
    with pytest.raises(ValueError, match="w2"):
        check_moe_op_args(*common, "P24", "P44")  # 8 bits per pair: not whole pairs
    with pytest.raises(ValueError, match="w2"):
        check_moe_op_args(*common, "P24", None)  # a paired payload where a 4-d stack belongs
    with pytest.raises(ValueError, match="fc1_pair"):
        check_moe_op_args(*common, "Q24", "dynamic")
    # no pair choices: a uniform stack (w13 as a proj K3 stack; the op now checks its shape too)
    w13_uniform = torch.zeros(2, 4, H // 16, I // 16, 48, dtype=torch.int16)
    w2_uniform = experts.w2.view(4, 16, 16, 48)
    uniform = check_moe_op_args(x, w, ids, [w13_uniform], [w2_uniform], *common[5:])
    assert "fc1_pair" not in uniform
    with pytest.raises(ValueError, match=r"w13\[0\]"):  # a paired w13 where a stack belongs
        check_moe_op_args(*common[:4], [w2_uniform], *common[5:])


def test_moe_pair_variants_are_covered_by_the_declared_kernels():
    from oracle.cases import variants as V

    V.clear_declarations()
    paired = [v for v in V.all_variants("moe") if v.pair_kind is not None]
    assert {v.pair_kind for v in paired} == set(KINDS)
    for v in paired:
        assert v.kernel_coverage is not None, (v.name, v.no_coverage_reason)
        assert v.kernel_coverage.startswith("b12x:moe"), v.kernel_coverage
        ok, reason = v.supported("sm_90", v.compute_dtype)
        assert ok, reason


# ------------------------------------------------------------------ wave-balanced FC2 tile


def test_plan_takes_the_wave_balanced_fc2_tile_through_qualify():
    from b12x.ops.dense import tiles

    h200 = tiles.DeviceLimits("H200", 132, 232448, (9, 0))
    glm = dict(
        m=129, top_k=8, hidden=5120, intermediate=1536, codebook="mcg", bits=3, num_experts=160,
        w13_layout="proj", x_dtype=BF16,
    )  # fmt: skip
    plan = plan_moe(**glm, device=h200)
    (fc1,), (fc2,) = plan.fc1_spec, plan.fc2_spec
    # 512 output columns per CTA, 256 threads: 8 warps × 4 N16 tiles (tile_k 32 = 2 K16 rows).
    assert (fc2.n_group, 32 * fc2.warps, fc2.n_tiles, fc2.depth) == (512, 256, 4, 2)
    assert fc1.n_group != 512 and fc1 == plan_moe(**glm).fc1_spec[0]  # FC1 never takes it
    fc1_problem = tiles.TileProblem("fc1", 129, 5120, 1536, 3)
    assert not tiles.qualify(tiles.WAVE_BALANCED_FC2, fc1_problem, h200)[0]
    assert plan_moe(**glm).fc2_spec[0].n_group == 64  # no device: the default, (2, 2, 8) at k2
    odd = plan_moe(**{**glm, "hidden": 5120 + 128}, device=h200)  # H % 512 != 0: rejected
    assert odd.fc2_spec[0].n_group != 512
    tiny = plan_moe(**{**glm, "m": 1, "top_k": 1}, device=h200)  # one block: one wave anyway
    assert tiny.fc2_spec[0].n_group != 512
    paired = plan_moe(**{**glm, "intermediate": 1536, "fc2_pair": "P24"}, device=h200)
    assert paired.fc2_spec[0].pair == "P24" and paired.fc2_spec[0].n_group != 512
    _, _, spills = _compile(fc2, "sm_90")
    assert sum(spills) == 0
