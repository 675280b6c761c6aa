"""CPU checks of the stream-K GEMM (:mod:`b12x.kernels.stream_k`): its schedule, its refusals
and its compile. The GPU half is ``tests/b12x/test_dense_stream_k_gpu.py``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from b12x.kernels.stream_k_schedule import head_owner, segments, stream_k_range, stream_k_units
from b12x.launch import host
from b12x.launch.specs import KernelSpec, gemm_spec
from b12x.ops.dense import mainloop as mainloop_table
from oracle.pytest_plugin import scaled_examples

DEEP = mainloop_table.TENSOR_DEEP
DEEP_GEOMETRY = dict(
    warps=DEEP.warps, m_warps=DEEP.m_warps, shared_rows=DEEP.shared_rows,
    smem_stages=DEEP.smem_stages, wgmma=True,
)  # fmt: skip


def _walk(tiles: int, units: int, ctas: int):
    """Every CTA's segments: ``{(tile, unit): cta}``, the pieces per tile (CTAs in order) and
    the head's CTA and peers per tile."""
    total = tiles * units
    cover, pieces, heads = {}, {}, {}
    for c in range(ctas):
        written = 0
        for tile, u0, u1, peers in segments(c, total, ctas, units):
            assert 0 <= u0 < u1 <= units
            for u in range(u0, u1):
                assert (tile, u) not in cover, f"unit {u} of tile {tile} runs twice"
                cover[(tile, u)] = c
            if peers is None:
                written += 1
                pieces.setdefault(tile, []).append(c)
            else:
                assert tile not in heads
                heads[tile] = (c, peers)
                assert all(p > c for p in peers), "a head waits on a lower CTA"
        assert written <= 1, f"CTA {c} writes {written} partials into its one slot"
    return cover, pieces, heads


@settings(max_examples=scaled_examples(300), deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 200))
def test_the_schedule_runs_every_unit_once_and_adds_every_piece(tiles, units, ctas):
    ctas = min(ctas, tiles * units)
    cover, pieces, heads = _walk(tiles, units, ctas)
    assert len(cover) == tiles * units
    assert sorted(heads) == list(range(tiles))
    for tile, (c, peers) in heads.items():
        assert peers == pieces.get(tile, []), f"tile {tile}: head adds {peers}"
        assert cover[(tile, 0)] == c
    last = segments(ctas - 1, tiles * units, ctas, units)[-1]
    assert not last[3], "the last CTA would wait"  # a piece (None) or a whole tile ([])


def test_the_ranges_are_even_and_head_owner_inverts_them():
    for total, ctas in [(3584, 132), (7168, 132), (10, 10), (7, 3)]:
        lengths = {e - s for s, e in (stream_k_range(c, total, ctas) for c in range(ctas))}
        assert max(lengths) - min(lengths) <= 1 and min(lengths) >= 1
        for u in range(total):
            c = head_owner(u, total, ctas)
            start, end = stream_k_range(c, total, ctas)
            assert start <= u < end
    assert stream_k_units(512, 16) == 32 and stream_k_units(45, 16) == 3


def test_the_deep_row_at_m64_runs_0_87_of_a_tile_per_sm():
    """The case this kernel exists for (8192 x 28672, M = 64, 132 SMs): 112 tiles of 32 units
    over 132 CTAs, at most 28 units (0.875 of a tile) each instead of 32."""
    spec = gemm_spec("mcg", 4, DEEP.geometry())
    ctas = host.stream_k_ctas(spec, 64, 8192, 28672, 132)
    assert ctas == 132
    total = 112 * 32
    assert max(e - s for s, e in (stream_k_range(c, total, ctas) for c in range(ctas))) == 28
    assert host.stream_k_ctas(spec, 64, 16 * 80, 512, 132) == 10  # one unit per CTA


def test_segments_refuses_more_ctas_than_units():
    with pytest.raises(ValueError, match="ctas"):
        segments(0, 4, 5, 2)


def test_spec_refuses_what_stream_k_does_not_run():
    no_wgmma = {"wgmma": False, "m_warps": 4, "smem_stages": 3, "shared_rows": 2}
    with pytest.raises(ValueError, match="stream_k: the stream-K schedule runs a wgmma"):
        dataclasses.replace(DEEP.geometry(), **no_wgmma)
    with pytest.raises(ValueError, match="write_partials"):
        KernelSpec("gemm_stream_k", "mcg", 4, geometry=DEEP.geometry(), write_partials=True)
    with pytest.raises(ValueError, match="gemm_stream_k"):
        KernelSpec("gemm", "mcg", 4, geometry=DEEP.geometry())


@pytest.mark.parametrize(
    ("change", "field"),
    [({"split_k": 2}, "split_k=2"), ({"wgmma": False}, "wgmma=False"), ({"stream_k": 1}, "=1")],
)
def test_host_refuses_before_any_device_check(change, field):
    a = torch.zeros(64, 1280, dtype=torch.bfloat16)
    payload = torch.zeros(80, 32, 64, dtype=torch.int16)
    kwargs = dict(
        tiles=(1, 2), warps=8, m_warps=8, shared_rows=4, smem_stages=4, wgmma=True,
        stream_k=True, split_k=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match=field):
        host.trellis_matmul(a, payload, "mcg", **{**kwargs, **change})


def test_the_flags_set_the_launched_ctas(monkeypatch):
    """``flags`` holds one slot per CTA the launch may run (a plan sizes it per SM of its
    device); the launch runs no more CTAs than units, in whole clusters, with its partials."""
    from b12x.launch.records import StreamKGemmLaunch

    launched = []
    monkeypatch.setattr(host, "_kernel", lambda spec, device: lambda *a: launched.append((spec, a)))
    monkeypatch.setattr(host, "_check_tensor", lambda *a, **k: None)
    monkeypatch.setattr(host, "_lut_addr", lambda fmt, device: 0)
    a = torch.zeros(64, 1280, dtype=torch.bfloat16)
    payload = torch.zeros(80, 32, 64, dtype=torch.int16)  # 2 tiles x 5 units
    geometry = DEEP_GEOMETRY
    for slots, ctas in [(7, 7), (132, 10)]:
        flags = torch.zeros(slots, dtype=torch.int32)
        scratch = torch.zeros(132 * 128 * 256)
        host.trellis_matmul(a, payload, "mcg", tiles=(1, 2), stream_k=True, flags=flags,
                            scratch=scratch, **geometry)  # fmt: skip
        spec, args = launched.pop()
        order = StreamKGemmLaunch.parameters()
        assert spec.kind == "gemm_stream_k"
        assert args[order.index("ctas")] == ctas
        assert tuple(args[order.index("partials")].shape) == (ctas, 128 * 256)
        assert args[order.index("flags")].numel() == ctas


def test_the_32_bit_guard_refuses_only_what_would_overflow(monkeypatch):
    """The kernel forms ``group·total`` and ``(u + 1)·groups`` in 32 bits: the host refuses a
    problem only when those could overflow (meta tensors: nothing is allocated). The planned
    8192 x 28672 shapes pass at every M the swap rows take."""
    launched = []
    monkeypatch.setattr(host, "_kernel", lambda spec, device: lambda *a: launched.append(a))
    monkeypatch.setattr(host, "_check_tensor", lambda *a, **k: None)
    monkeypatch.setattr(host, "_lut_addr", lambda fmt, device: 0)
    geometry = DEEP_GEOMETRY

    def run(m, k, n):
        a = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
        payload = torch.empty(k // 16, n // 16, 64, dtype=torch.int16, device="meta")
        flags = torch.empty(132, dtype=torch.int32, device="meta")
        out = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
        scratch = torch.empty(132 * 128 * 256, device="meta")
        host.trellis_matmul(a, payload, "mcg", tiles=(1, 2), stream_k=True, flags=flags,
                            scratch=scratch, out=out, **geometry)  # fmt: skip

    for m in (64, 100, 256, 4096):
        run(m, 8192, 28672)
    assert len(launched) == 4
    with pytest.raises(ValueError, match="too large for the stream-K schedule"):
        run(4096, 16 * 16 * 5000, 28672)  # 3584 tiles x 5000 units x 132 CTAs > 2^31
    assert len(launched) == 4
