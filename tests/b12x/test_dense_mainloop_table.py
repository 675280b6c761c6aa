"""The dense mainloop table (``b12x.ops.dense.mainloop``): per-warp decode or shared decode.

Expected rows are written from the table's measured evidence (its module docstring: the shared
decode from M = 17, thin up to M = 32, wide to the decode_matmul threshold; slots 2 x 3 up to
K5, 1 x 4 from K6 by the 48 KB shared-memory budget), not read back from the table. The
oracle's generic dispatch checks (boundaries, reachability, determinism, consistency) run on it
like on the path table, and every geometry it can return compiles spill-free on the CPU.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from b12x import support
from b12x.launch.specs import KernelSpec
from b12x.ops.dense import mainloop as L
from oracle import dispatch as O

GRID = [
    {"path": path, "m": m, "n": n, "bits": bits, "pinned": pinned}
    for path, m, n, bits, pinned in itertools.product(
        ("generic", "decode_matmul", "k6_mcg_small_m"),
        (1, 16, 17, 32, 33, 64, 128),
        (128, 384, 28672, 28736),
        (2, 4, 5, 6, 8),
        (False, True),
    )
]


class OracleView:
    def __init__(self, table=L.TABLE):
        self.name = table.name
        self.paths = table.paths
        self.boundaries = [O.Boundary(**dataclasses.asdict(b)) for b in table.boundaries]
        self.explain = table.explain


def test_oracle_generic_checks_pass():
    outcomes = O.check_table(OracleView(), GRID)
    assert [o.failures for o in outcomes] == [(), (), (), ()]
    hits = outcomes[1].metrics["hits"]
    assert all(hits[row.name] > 0 for row in L.ROWS)


@pytest.mark.parametrize(
    ("case", "row", "geometry"),
    [
        ({"m": 16}, "small_m", None),
        ({"m": 17}, "shared_thin", (1, 2, 4, 2, 4)),
        ({"m": 32}, "shared_thin", (1, 2, 4, 2, 4)),
        ({"m": 33}, "shared_wide", (2, 1, 8, 4, 1)),
        ({"m": 128}, "shared_wide", (2, 1, 8, 4, 1)),
        ({"m": 64, "pinned": True}, "pinned_tile", None),
        ({"m": 64, "path": "decode_matmul"}, "off_generic_path", None),
        ({"m": 64, "n": 28736}, "n_not_128", None),
    ],
)
def test_rows_and_geometries(case, row, geometry):
    got = L.explain({**L.DEFAULT_CASE, **case})
    assert got.path == row and got.reasons[-1] == f"{row}: selected"
    if geometry is None:
        assert got.value is None
    else:
        v = got.value
        assert (v.m_tiles, v.n_tiles, v.warps, v.m_warps, v.split_k) == geometry


@pytest.mark.parametrize(("bits", "slots"), [(2, (2, 3)), (4, (2, 3)), (5, (2, 3)), (6, (1, 4))])
def test_slots_follow_the_shared_memory_budget(bits, slots):
    # wide at K5: 3 x 2 x (1280 + 4096) + 2 x 8192 = 48640 <= 49152; at K6: 50176 does not fit
    got = L.explain({**L.DEFAULT_CASE, "bits": bits}).value
    assert (got.shared_rows, got.smem_stages) == slots


# thin at K4 (2 x 3 slots, split-K partials), wide at K8 (1 x 4 slots, the largest payload)
@pytest.mark.parametrize(("geometry", "bits"), [(L.THIN, 4), (L.WIDE, 8)], ids=["thin", "wide"])
def test_every_planned_geometry_compiles_spill_free(geometry, bits):
    g = L.slots_for(bits, geometry)
    spec = KernelSpec(
        "gemm", "mcg", bits, bf16=True, m_tiles=g.m_tiles, n_tiles=g.n_tiles, warps=g.warps,
        write_partials=g.split_k > 1, m_warps=g.m_warps, shared_rows=g.shared_rows,
        smem_stages=g.smem_stages,
    )  # fmt: skip
    report = support.compile_specialization(spec, "sm_90")
    assert report.spill_bytes == 0, (spec, report.spill_bytes)
    # two CTAs of 256 threads (wide) / four of 128 (thin) per SM need <= 128 registers
    assert report.registers is not None and report.registers <= 128, report.registers
