"""CPU checks of ``benchmarks/dense_shared_decode_shared_sweep.py``: its geometry arguments and its
refusal without a GPU (the sweep itself is a GPU measurement)."""

from __future__ import annotations

import argparse

import pytest

from b12x.kernels.geometry import GemmGeometry


def test_geometry_argument(shared_sweep):
    assert shared_sweep.geometry("2x1x8x4") == (2, 1, 8, 4, False, False, 1, False)
    assert shared_sweep.geometry("1x2x8x8w") == (1, 2, 8, 8, True, False, 1, False)  # wgmma
    assert shared_sweep.geometry("1x2x8x8wk") == (1, 2, 8, 8, True, False, 1, True)  # stream-K
    assert shared_sweep.geometry("0x1x8x8s") == (0, 1, 8, 8, True, True, 1, False)  # swap-AB
    assert shared_sweep.geometry("16x1x8x8s2") == (16, 1, 8, 8, True, True, 2, False)  # shared
    assert shared_sweep.geometry("16x1x8x8s2k") == (16, 1, 8, 8, True, True, 2, True)
    assert shared_sweep.geometry("0x2x8x8sk") == (0, 2, 8, 8, True, True, 1, True)
    for name in ("16x1x8x8s4", "1x2x8x8wk", "1x2x8x8w", "2x1x8x4", "16x1x8x8s2k", "0x2x8x8sk"):
        assert shared_sweep.geometry_name(shared_sweep.geometry(name)) == name
    assert shared_sweep.swap_tiles(0, 100) == 7 and shared_sweep.swap_tiles(0, 4096) == 16
    for bad in ("2x1x8", "2x1x8x4x1", "axbxcxd", "w2x1x8x4", "0x1x8x8ws", "2x1x8x4k"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            shared_sweep.geometry(bad)


def test_default_geometries_are_legal(shared_sweep):
    from b12x.launch.specs import KernelSpec

    for text in shared_sweep.DEFAULT_GEOMETRIES:
        mt, nt, w, mw, tensor, *_ = shared_sweep.geometry(text)
        KernelSpec(
            "gemm",
            "mcg",
            4,
            geometry=GemmGeometry(
                m_tiles=mt, n_tiles=nt, warps=w, m_warps=mw, smem_stages=3, wgmma=tensor
            ),
        )


def test_refuses_without_cuda(shared_sweep, monkeypatch, capsys):
    monkeypatch.setattr(shared_sweep.torch.cuda, "is_available", lambda: False)
    assert shared_sweep.main([]) == 1
    assert "needs a CUDA device" in capsys.readouterr().err
