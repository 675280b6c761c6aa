"""Adding a tile is one registry entry (``docs/adding_a_tile.md``): a throwaway geometry
registered in one place (the ``throwaway`` fixture, the only edit) reaches the planner, the
oracle's ``explain``, the tile checks and ``coverage`` by its name."""

from __future__ import annotations

import pytest
import torch

from b12x.kernels.geometry import GemmGeometry
from b12x.ops.dense import tiles
from b12x.ops.dense.plan import plan_dense
from oracle.judge.tiles import DEVICES

#: 16 warps of the per-warp decode, two N16 tiles each: 512 columns per CTA.
THROWAWAY = tiles.Tile(64, 512, 512, name="throwaway_512")
H200 = next(d for d in DEVICES if tuple(d.capability) == (9, 0))


@pytest.fixture
def throwaway(monkeypatch):
    """The one edit: the entry appended to the registry."""
    monkeypatch.setattr(tiles, "ENTRIES", (*tiles.ENTRIES, THROWAWAY))
    return THROWAWAY


def test_the_registry_knows_it_by_name_and_shape(throwaway):
    assert tiles.parse_tile("throwaway_512") is throwaway
    assert tiles.parse_tile("64x512x512") is throwaway
    assert tiles.parse_tile([64, 512, 512]) is throwaway
    assert throwaway in tiles.REGISTRY.entries


def test_without_the_entry_nothing_knows_it():
    with pytest.raises(ValueError, match="unknown tile 'throwaway_512'; known: square"):
        tiles.parse_tile("throwaway_512")
    with pytest.raises(ValueError, match=r"pinned Tile\(64x512x512\) rejected"):
        plan_dense(m=64, k=4096, n=1024, bits=4, codebook="mcg", x_dtype=torch.float16,
                   tile="64x512x512", device=H200)  # fmt: skip


def test_the_planner_pins_it_and_launches_its_geometry(throwaway):
    plan = plan_dense(m=64, k=4096, n=1024, bits=4, codebook="mcg", x_dtype=torch.float16,
                      tile="throwaway_512", device=H200)  # fmt: skip
    assert plan.path == "generic" and plan.tile is throwaway
    assert plan.geometry == GemmGeometry(m_tiles=4, n_tiles=2, warps=16)
    assert plan.launches.gemm.geometry == plan.geometry
    assert set(plan.launches.gemm.specs) <= set(tiles.REGISTRY.specializations(throwaway))


def test_explain_names_it(throwaway):
    from oracle.cli.explain import explain_dense, format_dense

    e = explain_dense(m=64, k=4096, n=1024, codebook="mcg", bits=4, tile="throwaway_512")
    assert (e.tile_name, e.tile, e.geometry["warps"]) == ("throwaway_512", "64x512x512", 16)
    assert "tile: throwaway_512 (64x512x512)" in format_dense(e)


def test_the_tile_checks_judge_it(throwaway):
    from oracle.checks import dispatch_tiles

    results = {r.name: r for r in dispatch_tiles.run()}
    failed = {name: r.reason for name, r in results.items() if r.status == "fail"}
    assert not failed, failed
    (pinned,) = dispatch_tiles.qualify_tile("throwaway_512")
    assert pinned.status == "pass", pinned.reason
    assert pinned.name == "tile.dense_trellis_tiles.throwaway_512"


def test_coverage_lists_it(throwaway):
    from oracle.run import coverage

    (row,) = [t for t in coverage.tile_coverage() if t.name == "throwaway_512"]
    assert row.shape == "Tile(64x512x512)" and row.qualified > 0 and row.specializations > 0
    assert not [p for p in coverage.problems(records=[]) if "throwaway" in p]


def test_coverage_flags_an_entry_nothing_could_judge(monkeypatch):
    """A registered shape that qualifies nowhere (cta_threads 512 with 128 columns is not the
    §5.4 shape rule's) is a coverage problem, not a silent entry."""
    from oracle.run import coverage

    orphan = tiles.Tile(64, 128, 512, name="orphan")
    monkeypatch.setattr(tiles, "ENTRIES", (*tiles.ENTRIES, orphan))
    assert "tile orphan of dense_trellis_tiles: qualifies on none of" in " ".join(
        coverage.problems(records=[])
    )


def test_its_kernel_compiles(throwaway):
    """Kernel support: the per-warp GEMM takes 16 warps (one sm_90 compile, spill-free)."""
    from b12x.support import compile_specialization

    spec = tiles.REGISTRY.specializations(throwaway)[0]
    assert spec.geometry.warps == 16
    report = compile_specialization(spec, "sm_90")
    assert report.spill_bytes == 0, report.spill_bytes
