"""CPU tests of ``benchmarks/cublas_gemm_forms.py``: its table and its refusal without a GPU."""

from __future__ import annotations

import pytest
import torch


def test_rows_show_each_form_with_its_paired_ratio(forms):
    times = {1024: {"bf16 TN": (500.0, 1.0), "fp16 NN": (620.0, 1.24), "fp16 TN": (618.0, 1.1),
                    "bf16 NN": (600.0, 0.9)}}  # fmt: skip
    (row,) = forms.ratio_rows(times)  # FORMS order, each ratio as paired
    assert row == ["1024", "620.0 (1.240)", "618.0 (1.100)", "600.0 (0.900)", "500.0 (1.000)"]
    assert [name for name, _, _ in forms.FORMS][-1] == forms.ANCHOR


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
