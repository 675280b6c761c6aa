"""CPU tests of ``benchmarks/decode_gemm_overlap.py``: chunking and arguments."""

from __future__ import annotations

import pytest


def test_chunks_tile_the_columns_in_n16_aligned_equal_parts(overlap):
    cols = overlap.chunk_columns(28672, 7)
    assert cols[0][0] == 0 and cols[-1][1] == 28672 and len(cols) == 7
    assert all(a == b0 for (_, a), (b0, _) in zip(cols, cols[1:], strict=False))
    assert {b - a for a, b in cols} == {4096}


def test_defaults(overlap):
    args = overlap.parse_args([])
    assert (args.m, args.chunks, args.bits, args.k, args.n) == ((1024, 4096), (2, 4, 7), 4,
                                                                 8192, 28672)  # fmt: skip


@pytest.mark.parametrize(
    "argv", [["--chunks", "3", "--n", "28672"], ["--k", "8200"], ["--m", "0"], ["--bits", "x"]]
)
def test_bad_arguments_exit_2(overlap, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        overlap.parse_args(argv)
    assert exc.value.code == 2
