"""The validators' own arguments: a malformed check names the parameter that is wrong."""

from __future__ import annotations

import pytest
import torch

from b12x.runtime.validate import check_device_arg, check_tensor

T = torch.zeros(8, dtype=torch.float16)


@pytest.mark.parametrize("dtypes", ["float16", b"float16", ["float16"], [torch.float16, "x"]])
def test_check_tensor_refuses_dtypes_that_are_not_torch_dtypes(dtypes):
    with pytest.raises(TypeError, match=r"^dtypes: expected torch.dtype values"):
        check_tensor("x", T, dtypes=dtypes)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", -1])
def test_check_tensor_refuses_a_device_that_is_not_one(device):
    with pytest.raises(ValueError, match=r"^device: "):
        check_tensor("x", T, dtypes=(torch.float16,), device=device)


def test_check_device_arg_names_the_value_and_the_expected_forms():
    with pytest.raises(ValueError, match=r"^device: 'gpu' is not a device \(expected e.g. 'cuda'"):
        check_device_arg("device", "gpu")


def test_check_tensor_still_judges_the_tensor():
    assert check_tensor("x", T, dtypes=torch.float16, device="cpu") is T
    with pytest.raises(TypeError, match=r"^x: expected dtype torch.bfloat16"):
        check_tensor("x", T, dtypes=(torch.bfloat16,))
    with pytest.raises(ValueError, match=r"^x: expected device meta"):
        check_tensor("x", T, dtypes=(torch.float16,), device="meta")
