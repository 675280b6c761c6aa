"""CPU tier of the grouped GEMM's intra-CTA K split (``MoeGemmSpec.k_split``).

* The plan picks ``k_split`` from the weight geometry only: the same factor for M = 1 and
  M = 4096 (m_tiles 1 vs 4), with or without a device, so a route's fp32 summation order and
  hence its output bits never depend on the batch (the batch-invariance promise).
* Every planned split specialisation compiles for sm_80 / sm_90 / sm_120 with zero spills, fits
  the register file at its CTA size, stages partial sums in shared memory with a CTA barrier
  between every shared store and the loads that read it, and keeps the full mainloop.
* Spec validation: bad factors, paired specs, oversized CTAs or reduction buffers raise.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch.moe_compile import build_moe_gemm
from b12x.launch.toolchain import compile_with_remarks
from b12x.ops.moe.plan import choose_k_split, gemm_geometry, plan_moe
from oracle.pytest_plugin import slow_sweep

GLM = dict(
    top_k=8, hidden=5120, intermediate=1536, codebook="mcg", bits=4, num_experts=128,
    w13_layout="packed", x_dtype=torch.bfloat16,
)  # fmt: skip

_ST_SHARED = re.compile(r"\bst\.shared\b")
_LD_SHARED = re.compile(r"\bld\.shared\b")
_BARRIER = re.compile(r"\b(bar\.sync|barrier\.sync)\b")


@functools.cache
def _compile(spec: MoeGemmSpec, arch: str):
    """(PTX, registers, spill bytes) of ``spec`` compiled for ``arch`` with ptxas remarks."""
    r = compile_with_remarks(*build_moe_gemm(spec), arch)
    return r.ptx, list(r.registers), list(r.spills)


def _unguarded_shared_loads(ptx: str) -> list[int]:
    """Lines of ``ld.shared`` reached in text order after an ``st.shared`` with no CTA barrier
    between (text order over-approximates the straight-line reduction rounds)."""
    bad, dirty = [], False
    for number, line in enumerate(ptx.splitlines(), 1):
        code = line.split("//")[0]
        if _BARRIER.search(code):
            dirty = False
        if _LD_SHARED.search(code) and dirty:
            bad.append(number)
        if _ST_SHARED.search(code):
            dirty = True
    return bad


# ------------------------------------------------------------------ plan: geometry-only factor


@pytest.mark.parametrize(
    "k, want", [(128, 1), (512, 1), (768, 1), (1024, 2), (1536, 4), (2048, 4), (3072, 4),
                (4096, 8), (4608, 4), (5120, 8), (7168, 8), (1280, 2), (640, 1)],
)  # fmt: skip
def test_choose_k_split_rule(k, want):
    got = choose_k_split(k, 4096)
    assert got == want
    assert k % (128 * got) == 0 and (got == 1 or k // got >= (384 if got == 4 else 512))
    assert choose_k_split(k, 128) == got  # N never changes the factor


@pytest.mark.parametrize("layout, bits", [("packed", 4), ("proj", 3)])
def test_plans_pick_k_split_from_geometry_only(layout, bits):
    plans = {m: plan_moe(m=m, **{**GLM, "w13_layout": layout, "bits": bits}) for m in
             (1, 4, 8, 64, 512, 4096)}  # fmt: skip
    assert {p.routes.block_size for p in plans.values()} == {16, 32, 64}  # m_tiles does vary
    fc1 = {s.k_split for p in plans.values() for s in p.fc1_spec}
    fc2 = {s.k_split for p in plans.values() for s in p.fc2_spec}
    assert fc1 == {8} and fc2 == {4}, (fc1, fc2)  # K = 5120 -> 8, K = 1536 -> 4
    for p in plans.values():
        for spec in p.kernel_specs:
            k = 5120 if spec in p.fc1_spec else 1536
            assert k % spec.k_multiple == 0
            assert spec.cta_threads <= 512


def test_tiered_and_device_plans_keep_the_factor():
    from b12x.ops.dense import tiles

    h200 = tiles.DeviceLimits("H200", 132, 232448, (9, 0))
    tiered = dict(GLM, bits=(3, 4), num_experts=(64, 64), num_global_experts=128)
    for kwargs in (tiered, GLM):
        for device in (None, h200):
            seen = {"fc1": set(), "fc2": set()}
            for m in (1, 8, 4096):
                p = plan_moe(m=m, **kwargs, device=device)
                seen["fc1"] |= {s.k_split for s in p.fc1_spec}
                seen["fc2"] |= {s.k_split for s in p.fc2_spec}
            assert seen == {"fc1": {8}, "fc2": {4}}, (kwargs["bits"], device, seen)


def test_small_layers_keep_a_single_group():
    p = plan_moe(m=1, **{**GLM, "hidden": 256, "intermediate": 128})
    assert {s.k_split for s in p.kernel_specs} == {1}


def test_paired_phases_keep_k_split_one():
    p = plan_moe(m=1, **{**GLM, "bits": 3, "fc1_pair": "P24", "fc2_pair": "dynamic"})
    assert {s.k_split for s in p.kernel_specs} == {1}


def test_geometry_keeps_wide_blocks_at_four_warps_up_to_k_split_4():
    for k_split in (1, 2, 4, 8):
        n_tiles, warps, depth = gemm_geometry(1, 3072, k_split)
        assert (n_tiles, warps, depth) == ((2, 2, 8) if k_split > 1 else (2, 4, 8))
        for m_tiles in (2, 4):
            n_tiles, warps, depth = gemm_geometry(m_tiles, 3072, k_split)
            # 128 threads; at k_split 8 one warp per group (256 threads, one CTA per SM)
            assert warps * k_split == max(4, k_split) and depth == 2
            assert 3072 % (16 * n_tiles * warps) == 0


# ------------------------------------------------------------------ spec validation


def test_spec_rejects_bad_k_split():
    for bad in (0, 3, 16, True, 2.0):
        with pytest.raises(ValueError, match="k_split"):
            MoeGemmSpec("mcg", 4, False, k_split=bad)
    # the pair shared decode folds (a summation order, no warp groups): a fold region, 8 warps
    shared = MoeGemmSpec(
        "mcg", 3, False, n_tiles=2, warps=8, pair="P33", rate_axis="k", m_warps=8,
        shared_rows=2, smem_stages=4, wgmma=True, k_split=2,
    )  # fmt: skip
    assert shared.cta_threads == 256 and shared.shared_layout.fold_offset < shared.smem_bytes
    # the per-warp pair kernel splits K in warp groups: whole pairs (256) per group on K
    fc1 = MoeGemmSpec("mcg", 3, False, n_tiles=2, warps=8, pair="P24", rate_axis="n", k_split=2)
    fc2 = MoeGemmSpec("mcg", 3, False, n_tiles=2, warps=4, pair="P33", rate_axis="k", k_split=4)
    assert (fc1.cta_threads, fc1.k_multiple) == (512, 256)
    assert (fc2.cta_threads, fc2.k_multiple) == (512, 1024)
    with pytest.raises(ValueError, match="threads"):  # 16 warps × 8 groups = 4096 threads
        MoeGemmSpec("mcg", 4, False, warps=16, k_split=8)
    with pytest.raises(ValueError, match="shared memory"):  # 7·8·32·16·4 B = 112 KiB
        MoeGemmSpec("mcg", 4, False, n_tiles=2, warps=8, k_split=8, m_tiles=2)
    spec = MoeGemmSpec("mcg", 4, False, m_tiles=1, n_tiles=2, warps=4, k_split=4)
    assert (spec.cta_threads, spec.reduce_chunk, spec.smem_bytes) == (512, 16, 3 * 4 * 32 * 16 * 4)
    assert spec.k_multiple == 512 and spec.n_group == 128
    assert MoeGemmSpec("mcg", 4, False).smem_bytes == 0


# ------------------------------------------------------------------ compile: every planned spec


def _planned_split_specs(codebooks, dtypes, ms=(1, 512, 4096)):
    specs = {}
    for dtype in dtypes:
        for m in ms:
            for codebook, bits in codebooks:
                p = plan_moe(m=m, **{**GLM, "codebook": codebook, "bits": bits},
                             compute_dtype=dtype)  # fmt: skip
                specs.update(dict.fromkeys(p.kernel_specs))
    return [s for s in specs if s.k_split > 1]


def _extra_split_specs():
    from b12x.ops.dense import tiles

    h200 = tiles.DeviceLimits("H200", 132, 232448, (9, 0))
    p = plan_moe(m=129, **{**GLM, "w13_layout": "proj", "bits": 3, "num_experts": 160}, device=h200)
    (wave,) = p.fc2_spec  # the wave-balanced FC2 keeps the plan's k_split 4 (1024 threads)
    assert (wave.n_group, wave.k_split, wave.cta_threads) == (512, 4, 1024)
    # a two-group split: FC1 of a 1024-wide model (K = 1024 -> 2 groups of 2 warps)
    (k2,) = plan_moe(m=1, **{**GLM, "hidden": 1024, "intermediate": 512}).fc1_spec
    assert (k2.k_split, k2.warps) == (2, 2)
    return [
        wave,
        k2,
        MoeGemmSpec("mcg", 4, False, m_tiles=1, n_tiles=2, warps=1, depth=8, k_split=8),
    ]


#: The default CPU set: GLM's mcg K4 plans (both dtypes, m_tiles 1/2/4), the LUT decoder with the
#: most live registers at m_tiles 4, the wave-balanced FC2, a planned two-group split and a
#: one-warp k_split 8 spec. The exhaustive set (more codebooks and rates) is marked slow.
SPLIT_SPECS = list(dict.fromkeys(
    _planned_split_specs((("mcg", 4),), (torch.float16,))
    + [s for s in _planned_split_specs((("mcg", 4),), (torch.bfloat16,), ms=(4096,))
       if s.k_split == 8]
    + [s for s in _planned_split_specs((("sqg_e4m3", 3),), (torch.bfloat16,), ms=(4096,))]
    + _extra_split_specs()
))  # fmt: skip
ALL_SPLIT_SPECS = _planned_split_specs(
    (("mcg", 2), ("mcg", 3), ("mcg", 4), ("mcg", 6), ("mcg", 8), ("3inst", 4), ("mul1", 4),
     ("sqg_e4m3", 3), ("sqg_e4m3", 4), ("sqg_fp16", 5)),
    (torch.float16, torch.bfloat16),
)  # fmt: skip


def _check(spec, arch):
    ptx, regs, spills = _compile(spec, arch)
    assert re.search(rf"\.target {arch}\b", ptx)
    assert sum(spills) == 0, (spec, arch, spills)
    assert regs and max(regs) * spec.cta_threads <= 65536, (spec, regs)  # the CTA can launch
    # the shared mainloop body, unchanged: 2 MMAs per M16 block, N16 tile and staged row
    mma = ptx.count("mma.sync.aligned.m16n8k16")
    assert mma >= 2 * spec.m_tiles * spec.n_tiles * spec.depth, mma
    assert _ST_SHARED.search(ptx) and _LD_SHARED.search(ptx), "no shared-memory reduction"
    assert _unguarded_shared_loads(ptx) == []
    rounds = spec.m_tiles * spec.n_tiles * 8 // spec.reduce_chunk
    assert len(_BARRIER.findall(ptx)) >= 2 * rounds - 1


def test_split_spec_set_covers_the_plans():
    got = {(s.m_tiles, s.k_split, s.warps) for s in SPLIT_SPECS}
    want = {(1, 8, 2), (1, 4, 2), (2, 8, 1), (2, 4, 1), (4, 8, 1), (4, 4, 1), (1, 4, 8), (1, 8, 1),
            (1, 2, 2)}  # fmt: skip
    assert want <= got, got


def _split_id(s: MoeGemmSpec) -> str:
    return (
        f"{s.codebook}{s.bits}-m{s.m_tiles}"
        f"-n{s.n_tiles}-w{s.warps}-k{s.k_split}-{'bf16' if s.bf16 else 'f16'}"
    )


@pytest.mark.deep
@pytest.mark.parametrize("spec", SPLIT_SPECS, ids=_split_id)
def test_planned_split_specs_compile_without_spills_sm90(spec):
    _check(spec, "sm_90")


@pytest.mark.slow
@slow_sweep(
    "spec",
    ALL_SPLIT_SPECS,
    _split_id,
    reason="exhaustive split compile sweep runs only when selected with -m slow",
)
def test_every_planned_split_spec_compiles_without_spills(spec):
    _check(spec, "sm_90")


@pytest.mark.deep
@pytest.mark.parametrize("arch", ["sm_80", "sm_120"])
@pytest.mark.parametrize("index", [0, -1])
def test_split_specs_compile_for_other_arches(arch, index):
    wide = sorted(SPLIT_SPECS, key=lambda s: (s.m_tiles, s.k_split))
    _check(wide[index], arch)


def test_unsplit_spec_has_no_shared_memory_or_barrier():
    ptx, _, spills = _compile(MoeGemmSpec("mcg", 4, False, m_tiles=1, n_tiles=2, depth=8), "sm_90")
    assert sum(spills) == 0
    assert not _ST_SHARED.search(ptx) and not _BARRIER.search(ptx)


def test_barrier_check_flags_a_missing_barrier():
    ok = "st.shared.f32 [%r1], %f1;\nbar.sync 0;\nld.shared.f32 %f2, [%r1];\n"
    assert _unguarded_shared_loads(ok) == []
    assert _unguarded_shared_loads(ok.replace("bar.sync 0;", "add.s32 %r4, 1;")) == [3]


def test_launches_refuse_a_k_their_groups_cannot_split():
    """Both grouped-GEMM launchers ask the spec (``MoeGemmSpec.check_k``) before anything is
    viewed or launched (the context is never read): a uniform k_split 4 launch needs K % 512,
    a K-axis pair launch of k_split 4 whole pairs per group (K % 1024); an unsplit spec needs
    whole K16 rows only. Planted: either launcher's call dropped, its launch reaches the payload
    view and fails there with an unrelated error (or, on a GPU, the groups split a unit)."""
    from b12x.ops.moe.pairs import launch_paired_gemm
    from b12x.ops.moe.run import launch_grouped_gemm

    uniform = MoeGemmSpec("mcg", 4, False, warps=4, k_split=4)
    pair = MoeGemmSpec("mcg", 3, False, n_tiles=2, warps=4, pair="P33", rate_axis="k", k_split=4)
    a = torch.zeros(16, 768, dtype=torch.float16)
    common = dict(codebook=None, ctx=None, a=a, payload=torch.zeros(1, dtype=torch.int16),
                  num_payload_experts=1, out=a, out_col=0, expert_base=0)  # fmt: skip
    with pytest.raises(ValueError, match="K=768 is not a multiple of 512"):
        launch_grouped_gemm(spec=uniform, tier=0, **{**common, "codebook": "mcg"})
    with pytest.raises(ValueError, match="K=768 is not a multiple of 1024, .*whole pairs"):
        launch_paired_gemm(spec=pair, modes=None, n=512, **{**common, "codebook": "mcg"})
    MoeGemmSpec("mcg", 4, False).check_k(16)
    with pytest.raises(ValueError, match="K=24 is not a multiple of 16"):
        MoeGemmSpec("mcg", 4, False).check_k(24)
