"""The dense mainloop table (``b12x.ops.dense.mainloop``): per-warp decode or shared decode.

Expected rows are written from the table's measured evidence (its module docstring: the shared
decode from M = 17, thin up to M = 32, then on sm_90 where N is a multiple of 256 the deep
wgmma geometry up to M = 64 and the swap-AB mainloop from M = 65, elsewhere wide, to the
decode_matmul threshold; slots 2 x 3 up to K5, 1 x 4 from K6 by the 48 KB shared-memory budget,
4 x 4 deep and 2 x 6 swap-AB at every rate), not read back from the table. The
oracle's generic dispatch checks (boundaries, reachability, determinism, consistency) run on it
like on the path table, every geometry it can return compiles spill-free on the CPU, and the
planned geometry, slots and split reach the launch unchanged (CPU stand-in launchers).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch

from b12x import support
from b12x.formats import FORMATS
from b12x.launch.specs import KernelSpec, gemm_spec
from b12x.ops.dense import mainloop as L
from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.dense.tiles import tensor_core_takes_decoder
from oracle.judge import dispatch as O
from oracle.judge.tiles import SimulatedDevice
from oracle.pytest_plugin import slow_sweep

H200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))
A100 = SimulatedDevice("a100", 108, 163 * 1024, (8, 0))

GRID = [
    {"path": path, "m": m, "n": n, "bits": bits, "pinned": pinned, "capability": cap}
    for path, m, n, bits, pinned, cap in itertools.product(
        ("generic", "decode_matmul", "k6_mcg_small_m"),
        (1, 16, 17, 32, 33, 64, 128),
        (128, 384, 28672, 28736, 28800),
        (2, 4, 5, 6, 8),
        (False, True),
        ((9, 0), (8, 0), (12, 0)),
    )
]
SM80 = {"capability": (8, 0)}


def test_oracle_generic_checks_pass():
    outcomes = O.check_table(L.TABLE, GRID)  # oracle.judge.dispatch reads b12x's Boundary records
    assert [o.failures for o in outcomes] == [(), (), (), ()]
    hits = outcomes[1].metrics["hits"]
    assert all(hits[row.name] > 0 for row in L.ROWS)


@pytest.mark.parametrize(
    ("case", "row", "geometry"),
    [
        ({"m": 16}, "small_m", None),
        ({"m": 17}, "shared_thin", (1, 2, 4, 2, 4)),
        ({"m": 32}, "shared_thin", (1, 2, 4, 2, 4)),
        ({"m": 33, **SM80}, "shared_wide", (2, 1, 8, 4, 1)),
        ({"m": 128, **SM80}, "shared_wide", (2, 1, 8, 4, 1)),
        ({"m": 33, "capability": (12, 0)}, "shared_wide", (2, 1, 8, 4, 1)),
        ({"m": 33}, "tensor_core_deep", (1, 2, 8, 8, 1)),  # sm_90: wgmma from M = 33
        ({"m": 64}, "tensor_core_deep", (1, 2, 8, 8, 1)),
        ({"m": 65}, "tensor_swap", (8, 2, 8, 8, 1)),  # sm_90: 128 tokens x 256 weight rows
        ({"m": 128}, "tensor_swap", (8, 2, 8, 8, 1)),
        ({"m": 129}, "tensor_swap", (16, 1, 8, 8, 1)),  # 256 tokens x 128 weight rows
        ({"m": 256}, "tensor_swap", (16, 1, 8, 8, 1)),
        ({"m": 4096}, "tensor_swap", (16, 1, 8, 8, 1)),  # a pinned-off decode_matmul M
        ({"m": 64, "n": 28800}, "shared_wide", (2, 1, 8, 4, 1)),  # N not a 256 multiple
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
        assert v.wgmma == row.startswith("tensor")
        assert v.swap_ab == (row == "tensor_swap")
        if v.wgmma:  # deep 4 x 4, swap-AB 2 x 6, its 256-token CTA pairs 4 x 4
            slots = (2, 6) if row == "tensor_swap" and v.cluster == 1 else (4, 4)
            assert (v.shared_rows, v.smem_stages) == slots


@pytest.mark.parametrize(("bits", "slots"), [(2, (2, 3)), (4, (2, 3)), (5, (2, 3)), (6, (1, 4))])
def test_slots_follow_the_shared_memory_budget(bits, slots):
    # wide at K5: 3 x 2 x (1280 + 4096) + 2 x 8192 = 48640 <= 49152; at K6: 50176 does not fit
    got = L.explain({**L.DEFAULT_CASE, **SM80, "bits": bits}).value
    assert (got.shared_rows, got.smem_stages) == slots


@pytest.mark.parametrize("m", [65, 128, 129, 4096])
@pytest.mark.parametrize("bits", range(1, 9))
def test_the_swap_geometry_fits_every_rate(bits, m):
    from b12x.kernels.shared_layout import WGMMA_SMEM_LIMIT, check_swap_ab, swap_ab_layout

    got = L.explain({**L.DEFAULT_CASE, "m": m, "bits": bits}).value
    geo = dict(m_tiles=got.m_tiles, n_tiles=got.n_tiles, warps=got.warps)
    check_swap_ab(True, wgmma=True, bits=bits, m_warps=got.m_warps, rows=got.shared_rows,
                  stages=got.smem_stages, **geo)  # fmt: skip
    lay = swap_ab_layout(
        bits=bits, rows=got.shared_rows, stages=got.smem_stages, cluster=got.cluster, **geo
    )
    if m <= 128:  # 6 slots x 2 rows x (payload run + tokens): 16 tiles x 32b + 128 x 32
        assert (got.cluster, got.shared_rows, got.smem_stages) == (1, 2, 6)
        assert lay.total == 6 * 2 * (16 * 32 * bits + 128 * 32) <= WGMMA_SMEM_LIMIT
    else:  # payload slots (8 tiles x 32b per row), aligned 256-token tiles, 4 x 2 mbarriers
        assert (got.cluster, got.shared_rows, got.smem_stages) == (2, 4, 4)
        tokens = -(-4 * 4 * 8 * 32 * bits // 1024) * 1024 + 4 * 4 * 256 * 32
        assert lay.total == tokens + 4 * 16 + 1024 <= WGMMA_SMEM_LIMIT  # + base alignment


@pytest.mark.parametrize(("m", "rows"), [(64, 4)], ids=["deep"])
@pytest.mark.parametrize("bits", range(1, 9))
def test_the_wgmma_geometry_fits_every_rate(bits, m, rows):
    from b12x.kernels.shared_layout import WGMMA_SMEM_LIMIT, shared_decode_layout

    got = L.explain({**L.DEFAULT_CASE, "m": m, "bits": bits}).value
    assert (got.shared_rows, got.smem_stages) == (rows, 4)
    lay = shared_decode_layout(
        bits=bits, m_tiles=1, n_tiles=2, warps=8, m_warps=8, rows=rows, stages=4
    )  # 4 x rows x (16·32·b + 4096) + 2 x rows x 16 x 512: 192 KB at K8 with 4 rows
    want = 4 * rows * (16 * 32 * bits + 4096) + 2 * rows * 16 * 512
    assert lay.total == want <= WGMMA_SMEM_LIMIT


def _geometry_spec(geometry, codebook: str, bits: int, *, bf16: bool) -> KernelSpec:
    """The GEMM specialisation a plan of ``geometry`` (a mainloop table value) launches at
    ``bits``: its slots at that rate, stream-K or not, as ``plan_dense`` builds it."""
    g = L.slots_for(bits, geometry)
    return gemm_spec(codebook, bits, g.geometry(), bf16=bf16, write_partials=g.split_k > 1)


# thin at K4 (2 x 3 slots, split-K partials), wide at K8 (1 x 4 slots, the largest payload)
@pytest.mark.deep
@pytest.mark.parametrize(
    ("geometry", "bits", "most"),
    [
        (L.THIN, 4, 128),
        (L.WIDE, 8, 128),
        (L.TENSOR_DEEP, 8, 255),
        (L.SWAP_WIDE, 8, 255),
        (L.SWAP_TALL, 8, 255),
    ],
    ids=["thin", "wide", "tensor_core_deep", "swap_wide", "swap_tall"],
)
def test_every_planned_geometry_compiles_spill_free(geometry, bits, most):
    g = L.slots_for(bits, geometry)
    spec = _geometry_spec(geometry, "mcg", bits, bf16=True)
    report = support.compile_specialization(spec, "sm_90")
    assert report.spill_bytes == 0, (spec, report.spill_bytes)
    # two CTAs of 256 threads (wide) / four of 128 (thin) per SM need <= 128 registers; the
    # tensor-core CTA runs alone on its SM (128 accumulators per thread)
    assert report.registers is not None and report.registers <= most, report.registers
    if g.swap_ab:  # the token tile is the MMA's N
        assert f"wgmma.mma_async.sync.aligned.m64n{g.cta_m}k16" in report.ptx
    elif g.wgmma:
        assert "wgmma.mma_async.sync.aligned.m64n256k16" in report.ptx
    if g.stream_k:  # the fix-up's flag hand-off (b12x.kernels.stream_k)
        assert "ld.acquire.gpu.global.u32" in report.ptx
        assert "st.release.gpu.global.u32" in report.ptx
    # the ncu step of scripts/profile_small_m.sh filters kernels by name: it must find the one
    # this row plans (planted: its old filter, DenseTrellisGemm, misses the three stream-K rows)
    (entry,) = re.findall(r"\.entry\s+(\w+)", report.ptx)
    assert re.search(_profiled_kernels(), entry), entry


def _profiled_kernels() -> str:
    """The default kernel-name regex of ``scripts/profile_small_m.sh`` (``KERNEL_RE``)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "profile_small_m.sh"
    (regex,) = re.findall(r'KERNEL_RE="\$\{KERNEL_RE:-([^}]*)\}"', script.read_text())
    return regex


def _loop(m_warps, rows, stages, *, wgmma=False, swap_ab=False, cluster=1) -> dict:
    """The mainloop fields of the geometry a plan launches: every ``wgmma`` row runs on the
    stream-K schedule."""
    return dict(m_warps=m_warps, shared_rows=rows, smem_stages=stages, wgmma=wgmma,
                swap_ab=swap_ab, cluster=cluster, stream_k=wgmma)  # fmt: skip


@pytest.mark.parametrize(
    ("m", "mainloop", "tiles", "warps", "split"),
    [
        (16, _loop(0, 2, 0), None, None, None),
        (32, _loop(2, 2, 3), (1, 2), 4, 4),  # thin
        (100, _loop(4, 2, 3), (2, 1), 8, 1),  # wide
        (100, _loop(8, 2, 6, wgmma=True, swap_ab=True), (8, 2), 8, 1),  # swap-AB
        (200, _loop(8, 4, 4, wgmma=True, swap_ab=True, cluster=2), (16, 1), 8, 1),  # shared
        (64, _loop(8, 4, 4, wgmma=True), (1, 2), 8, 1),  # deep
    ],
    ids=["per_warp", "thin", "wide", "tensor_swap", "tensor_swap_cluster", "tensor_core_deep"],
)
def test_the_planned_mainloop_is_the_launched_one(fake_kernels, m, mainloop, tiles, warps, split):
    """R15 for the mainloop table: the plan's geometry, slots and split reach the launch
    unchanged (values written from b12x.ops.dense.mainloop's THIN / WIDE / TENSOR / TENSOR_DEEP
    rows at K4; the wide row on an sm_80 device, the tensor-core row on the H200)."""
    f16 = torch.float16
    device = H200 if mainloop.get("wgmma") else A100
    plan = plan_dense(device=device, m=m, k=8192, n=1024, bits=4, codebook="mcg", x_dtype=f16)
    assert plan.path == "generic"
    buffers = allocate_dense_buffers(plan, "cpu")
    bound = bind_dense(plan, **buffers)
    x = torch.randn(m, 8192, generator=torch.Generator().manual_seed(m)).to(f16)
    trellis = torch.zeros(512, 64, 64, dtype=torch.int16)
    run_dense(bound, x, trellis, torch.ones(8192, dtype=f16), torch.ones(1024, dtype=f16))
    (gemm,) = [c for c in fake_kernels.calls if c[0] == "gemm"]
    step, flags = gemm[4], gemm[5]
    g = step.geometry
    assert {name: getattr(g, name) for name in mainloop} == mainloop
    assert flags is (buffers["stream_k_flags"] if g.stream_k else None)
    assert step is plan.launches.gemm and g == plan.geometry and step.splits == plan.split_k
    if tiles is not None:
        assert ((g.m_tiles, g.n_tiles), g.warps, step.splits) == (tiles, warps, split)


def test_the_gpu_default_job_judges_the_tensor_core_rows():
    """The default job's GPU grid must reach the wgmma mainloops through the dense runner's own
    problem on an H200 (every codebook family, both compute dtypes, every rate, both swap-AB
    geometries); planted: the grid's every-M bucket back at N = 640 (not a 256 multiple) leaves
    0 cases here."""
    from oracle.run.grid import select_grid
    from oracle.run.runners.dense import dense_problem

    runnable, _ = select_grid()
    plans = {
        id(c): plan_dense(**dense_problem(c), device=H200)
        for c in runnable
        if c.variant.op == "dense"
    }
    tensor = [c for c in runnable if id(c) in plans and plans[id(c)].geometry.wgmma]
    rows = {plans[id(c)].mainloop_reasons[-1] for c in tensor}
    assert rows == {"tensor_core_deep: selected", "tensor_swap: selected"}, rows
    assert len(tensor) >= 40, len(tensor)
    # every codebook family whose decoder runs them spill-free (D3L, sqg_fp16, does not: below)
    assert {c.variant.codebook for c in tensor} == {"mcg", "3inst", "mul1", "sqg_e4m3"}
    assert {c.variant.compute_dtype for c in tensor} == {"fp16", "bf16"}
    assert {c.variant.bits for c in tensor} == set(range(1, 9))
    assert {33 <= c.m <= 256 for c in tensor} == {True}
    # both swap-AB geometries (128 tokens x 256 weight rows, 256 x 128), with partial token tiles
    swap = [plans[id(c)].geometry for c in tensor if plans[id(c)].geometry.swap_ab]
    assert {(g.m_tiles, g.n_tiles) for g in swap} == {(8, 2), (16, 1)}
    assert {c.m % 128 for c in tensor if plans[id(c)].geometry.swap_ab} - {0}, "no partial tile"


def test_a_stream_k_row_plans_its_scratch_and_launches_with_it(fake_kernels):
    """The deep row on the stream-K schedule: the plan compiles the ``gemm_stream_k`` kind,
    lists the partials and the zeroed flags (128 CTAs at 8192 x 1024, M = 64: 4 tiles x 32
    units, under the H200's 132 SMs), and the launch gets exactly those buffers; an explicit
    split-K request keeps the split (and the plain kernel)."""
    f16 = torch.float16
    plan = plan_dense(device=H200, m=64, k=8192, n=1024, bits=4, codebook="mcg", x_dtype=f16)
    assert plan.geometry.stream_k and plan.split_k == 1
    assert [s.kind for s in plan.kernel_specs if "gemm" in s.kind] == ["gemm_stream_k"]
    specs = {b.name: b for b in plan.buffers}
    assert specs["stream_k_flags"].shape == (128,) and specs["stream_k_flags"].zeroed
    assert specs["stream_k_partials"].shape == (128 * 128 * 256,)
    buffers = allocate_dense_buffers(plan, "cpu")
    bound = bind_dense(plan, **buffers)
    x = torch.randn(64, 8192, generator=torch.Generator().manual_seed(1)).to(f16)
    trellis = torch.zeros(512, 64, 64, dtype=torch.int16)
    run_dense(bound, x, trellis, torch.ones(8192, dtype=f16), torch.ones(1024, dtype=f16))
    (gemm,) = [c for c in fake_kernels.calls if c[0] == "gemm"]
    assert gemm[3] is buffers["stream_k_partials"]
    assert gemm[4].geometry.stream_k is True and gemm[5] is buffers["stream_k_flags"]
    split = plan_dense(device=H200, m=64, k=8192, n=1024, bits=4, codebook="mcg", x_dtype=f16,
                       split_k=2)  # fmt: skip
    assert not split.geometry.stream_k and split.split_k == 2
    assert not {"stream_k_flags", "stream_k_partials"} & {b.name for b in split.buffers}
    pair = plan_dense(device=H200, m=256, k=8192, n=1024, bits=4, codebook="mcg", x_dtype=f16)
    assert pair.geometry.stream_k and pair.geometry.cluster == 2  # 4 pair tiles x 32 units
    assert {b.name: b.shape for b in pair.buffers}["stream_k_flags"] == (132,)


def test_a_decoder_that_spills_in_the_tensor_core_mainloops_keeps_the_shared_decode():
    """D3L (sqg_fp16, tile hint 2) spills 48-1152 B in every sm_90 tensor-core geometry (the
    slow test below; b12x.ops.dense.tiles.TENSOR_CORE_MIN_TILE_CAP): on the H200 its plans at
    M 33..128 take the spill-free mma.sync wide geometry and M >= 129 decode + cuBLAS (the sm_80
    threshold), while MCG at the same shapes keeps the wgmma rows. Planted: without the tensor
    rows' tile-hint condition sqg_fp16 plans wgmma here and this fails."""
    f16 = torch.float16
    for m in (33, 64, 65, 128):
        d3l = plan_dense(device=H200, m=m, k=8192, n=28672, bits=6, codebook="sqg_fp16",
                         x_dtype=f16)  # fmt: skip
        mcg = plan_dense(device=H200, m=m, k=8192, n=28672, bits=6, codebook="mcg", x_dtype=f16)
        assert mcg.geometry.wgmma and mcg.geometry.stream_k, m
        g = d3l.geometry
        assert (d3l.path, g.wgmma, g.stream_k) == ("generic", False, False), m
        assert (g.m_tiles, g.n_tiles, g.warps, g.m_warps) == (2, 1, 8, 4), m  # WIDE
        assert d3l.mainloop_reasons[-1] == "shared_wide: selected", d3l.mainloop_reasons
    for m in (129, 256):
        assert plan_dense(device=H200, m=m, k=8192, n=28672, bits=5, codebook="sqg_fp16",
                          x_dtype=f16).path == "decode_matmul"  # fmt: skip
        assert plan_dense(device=H200, m=m, k=8192, n=28672, bits=5, codebook="mcg",
                          x_dtype=f16).path == "generic"  # fmt: skip


#: (codebook, bits, bf16, mainloop table geometry name) the tensor-core decoder sweep compiles:
#: every legal rate and both dtypes in the three tensor-core geometries, plus the mma.sync wide
#: fallback for a decoder the tensor-core rows refuse.
TENSOR_CORE_SWEEP = [
    (codebook, bits, bf16, geometry)
    for codebook, fmt in sorted(FORMATS.items())
    for bits, bf16 in itertools.product(fmt.legal_bits, (True, False))
    for geometry in ("TENSOR_DEEP", "SWAP_WIDE", "SWAP_TALL")
    + (() if tensor_core_takes_decoder(fmt.wide_tile_cap) else ("WIDE",))
]


@pytest.mark.slow
@slow_sweep(
    ("codebook", "bits", "bf16", "geometry"),
    TENSOR_CORE_SWEEP,
    lambda c: f"{c[0]}-K{c[1]}-{'bf16' if c[2] else 'f16'}-{c[3].lower()}",
    reason="the tensor-core decoder sweep runs only when selected with -m slow",
)
def test_every_tensor_core_decoder_compiles_spill_free(codebook, bits, bf16, geometry):
    """The tile-hint rule's evidence, per geometry (the five codebooks took 12 minutes on 2
    cores): a decoder the tensor-core rows take compiles spill-free in all three geometries at
    every legal rate and both compute dtypes; one they refuse spills in each (so the rule is
    still needed) and its fallback, the mma.sync wide geometry, compiles spill-free."""
    takes = tensor_core_takes_decoder(FORMATS[codebook].wide_tile_cap)
    spec = _geometry_spec(getattr(L, geometry), codebook, bits, bf16=bf16)
    spill = support.compile_specialization(spec, "sm_90").spill_bytes
    # WIDE is swept only as the fallback of a refused decoder: spill-free there too
    assert (spill == 0) == (takes or geometry == "WIDE"), (spec, spill)
