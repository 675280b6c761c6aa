"""``b12x.ops.dense.tiles.specializations(tile)`` (the registry hook ``python -m oracle run
--tile`` compiles) lists exactly what a launch pinned to the tile compiles: the dense GEMM spec
that ``plan_dense(..., tile=)`` + ``host.trellis_matmul`` build, the split-K reduce, and for the
wave-balanced FC2 tile the grouped-GEMM spec ``plan_fc2_tile`` produces."""

from __future__ import annotations

import pytest
import torch

from b12x.launch.specs import KernelSpec
from b12x.ops.dense import tiles
from b12x.ops.dense.plan import plan_dense
from oracle.judge.tiles import DEVICES

H200 = next(d for d in DEVICES if tuple(d.capability) == (9, 0))


def _launched(plan) -> list[KernelSpec]:
    """The specs ``run_dense`` → ``host.trellis_matmul`` compiles for ``plan`` (its keywords)."""
    p = plan.problem
    bf16 = p.compute_dtype == torch.bfloat16
    gemm = KernelSpec(
        "gemm", p.fmt, p.bits, bf16=bf16, geometry=plan.geometry, write_partials=plan.split_k > 1
    )
    return [gemm] + ([KernelSpec("reduce", bf16=bf16)] if plan.split_k > 1 else [])


@pytest.mark.parametrize("tile", [t for t in tiles.ENTRIES if t != tiles.WAVE_BALANCED_FC2])
@pytest.mark.parametrize(
    ("m", "k", "n", "codebook", "bits", "dtype"),
    [
        (1, 8192, 256, "mcg", 4, torch.float16),  # M16 block, split-K (partials + reduce)
        (24, 1024, 1024, "sqg_fp16", 5, torch.bfloat16),  # two M16 blocks
        (200, 512, 2048, "3inst", 2, torch.float16),  # four M16 blocks
        (3, 4096, 512, "sqg_e4m3", 3, torch.bfloat16),
    ],
)
def test_hook_lists_what_a_pinned_dense_plan_launches(tile, m, k, n, codebook, bits, dtype):
    plan = plan_dense(
        m=m, k=k, n=n, bits=bits, codebook=codebook, x_dtype=dtype, compute_dtype=dtype,
        tile=tile, device=H200,
    )  # fmt: skip
    assert plan.path == "generic" and plan.tile == tile
    specs = tiles.REGISTRY.specializations(tile)
    for spec in _launched(plan):
        assert spec in specs, (spec, tile)


def test_hook_covers_split_k_and_every_m_block():
    specs = tiles.specializations(tiles.Tile(64, 256, 256))
    gemm = [s for s in specs if s.kind == "gemm"]
    assert {s.m_tiles for s in gemm} == {1, 2, 4}
    assert {s.write_partials for s in gemm} == {False, True}
    assert {(s.geometry.warps, s.n_tiles) for s in gemm} == {(8, 2)}
    assert {s.bf16 for s in specs if s.kind == "reduce"} == {False, True}
    assert len(set(specs)) == len(specs)


def test_wave_balanced_fc2_tile_maps_to_the_grouped_gemm_the_fc2_plan_builds():
    from b12x.formats import resolve_format
    from b12x.ops.moe.plan import plan_fc2_tile, plan_gemm_spec

    specs = tiles.REGISTRY.specializations(tiles.WAVE_BALANCED_FC2)
    limits = tiles.DeviceLimits("h200", 132, 232448, (9, 0))
    taken = 0
    cases = (("mcg", 3, torch.float16, 129), ("mul1", 4, torch.bfloat16, 129))  # 1032 routes
    for codebook, bits, dtype, m in cases:
        decisions: list = []
        default = plan_gemm_spec(
            decisions=decisions, role="fc2", fmt=resolve_format(codebook, bits), bits=bits,
            compute_dtype=dtype, m_tiles=1, phase="fc2", choice=None, k=1536, n=5120,
        )  # fmt: skip
        spec = plan_fc2_tile(
            default, decisions=decisions, role="fc2", limits=limits, m=m, top_k=8,
            num_experts=160, hidden=5120, intermediate=1536,
        )  # fmt: skip
        assert spec != default  # the wave rule fired
        assert spec in specs
        assert default not in specs
        taken += 1
    assert taken == 2
    assert all(s.pair is None and (s.k_split == 1 or s.m_tiles == 1) for s in specs)


@pytest.mark.parametrize(
    ("m_tiles", "intermediate"),
    [(4, 512), (1, 2048), (1, 1536)],  # k_split 1 at four blocks (spilled), k_split 4 (spilled), 2
)
def test_a_decoder_capped_below_four_tiles_never_takes_the_wave_fc2_tile(m_tiles, intermediate):
    """D3L (sqg_fp16, wide_tile_cap 2) spilled 400-700 B in the wave tile at m_tiles 4 and at
    k_split 4 on every arch (``oracle run --tile 32x512x256`` on the H200): its FC2
    keeps the default geometry where MCG, same problem, takes the tile."""
    from b12x.formats import resolve_format
    from b12x.ops.moe.dispatch import FC2_TILE
    from b12x.ops.moe.plan import plan_fc2_tile, plan_gemm_spec

    limits = tiles.DeviceLimits("h200", 132, 232448, (9, 0))
    taken = {}
    for codebook, bits in (("mcg", 5), ("sqg_fp16", 5)):
        decisions: list = []
        default = plan_gemm_spec(
            decisions=decisions, role="fc2", fmt=resolve_format(codebook, bits), bits=bits,
            compute_dtype=torch.float16, m_tiles=m_tiles, phase="fc2", choice=None,
            k=intermediate, n=5120,
        )  # fmt: skip
        spec = plan_fc2_tile(
            default, decisions=decisions, role="fc2", limits=limits, m=129, top_k=8,
            num_experts=160, hidden=5120, intermediate=intermediate,
        )  # fmt: skip
        taken[codebook] = spec != default
        assert dict(decisions[-1].case)["wide_tile_cap"] == resolve_format(codebook).wide_tile_cap
        if codebook == "sqg_fp16":
            reasons = " ".join(FC2_TILE.explain(dict(decisions[-1].case)).reasons)
            assert "wide_tile_cap=2" in reasons, reasons
    assert taken == {"mcg": True, "sqg_fp16": False}
    listed = {s.codebook for s in tiles.specializations(tiles.WAVE_BALANCED_FC2)}
    assert "mcg" in listed and "sqg_fp16" not in listed


def test_hook_refuses_what_is_not_a_registry_tile():
    with pytest.raises(TypeError, match="tile"):
        tiles.specializations([64, 256, 256])
    with pytest.raises(ValueError, match="registry entry"):
        tiles.specializations(tiles.Tile(32, 32, 16))


@pytest.mark.slow
def test_a_grouped_gemm_spec_of_the_fc2_tile_compiles_on_cpu():
    from b12x import support

    spec = next(s for s in tiles.specializations(tiles.WAVE_BALANCED_FC2) if s.codebook == "mcg")
    report = support.compile_specialization(spec, "sm_90")
    assert "mma.sync.aligned.m16n8k16" in report.ptx
    assert report.registers and report.spill_bytes == 0
