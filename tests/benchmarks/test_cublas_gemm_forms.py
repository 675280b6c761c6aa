"""CPU tests of ``benchmarks/cublas_gemm_forms.py``: its forms and arguments (the table is
``bench_cli.ratio_cells``, the refusal is tested with the other probe in test_bench_cli)."""

from __future__ import annotations

import pytest
import torch


def test_the_anchor_form_is_one_of_the_forms(forms):
    assert forms.ANCHOR in [name for name, _, _ in forms.FORMS]


def test_forms_cover_both_dtypes_and_both_weight_layouts(forms):
    kinds = {(dtype, transposed) for _, dtype, transposed in forms.FORMS}
    assert kinds == {(d, t) for d in (torch.float16, torch.bfloat16) for t in (False, True)}


def test_defaults_are_the_issue_layer(forms):
    args = forms.parse_args([])
    assert (args.m, args.k, args.n) == ((1024, 4096), 8192, 28672)


@pytest.mark.parametrize("argv", [["--m", "0"], ["--k", "-1"], ["--n", "x"]])
def test_bad_arguments_exit_2(forms, argv):
    with pytest.raises(SystemExit) as exc:
        forms.parse_args(argv)
    assert exc.value.code == 2
