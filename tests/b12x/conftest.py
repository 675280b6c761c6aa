"""Fixtures the b12x tests share.

* ``moe_judge`` — ``moe_judge(got, x, experts, w, ids, compute_dtype)``: the oracle's MoE judge
  (:func:`oracle.tolerance.judge_moe`: element-wise stage envelope + exact-reference gates) as an
  assertion, the same verdict ``python -m oracle`` gives, so a dropped route or a scaled row fails
  the test. ``experts`` are uniform (``reference.moe.TrellisExperts``) or paired
  (``reference.moe_pairs.PairedExperts``); the GPU MoE tests (uniform, pairs, K split) judge
  with it.
* ``fake_kernels`` — the dense linear's host launchers (``b12x.launch.host`` as seen by
  ``b12x.ops.dense.plan``) replaced by in-place CPU stand-ins that record every launch
  (:class:`FakeKernels`), so plan / bind / run orchestration is checked without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def moe_judge() -> Callable[..., None]:
    """``moe_judge(got, x, experts, w, ids, compute_dtype)`` asserts the oracle's MoE verdict."""
    from oracle.tolerance import judge_moe  # lazy: the root conftest pins GPUs before torch loads

    def judge(got, x, experts, w, ids, compute_dtype) -> None:
        verdict = judge_moe(
            got, x=x, experts=experts, topk_weights=w, topk_ids=ids, compute_dtype=compute_dtype
        )
        assert verdict.passed, verdict.reason

    return judge


class FakeKernels:
    """In-place CPU stand-ins for ``b12x.launch.host`` that record what each launch touched."""

    def __init__(self):
        self.calls = []
        self.mainloops = []  # the mainloop keywords of each trellis_matmul launch

    def rotate_input(self, x, suh, *, out_dtype, out):
        self.calls.append(("rotate_input", x, out))
        assert out.dtype == out_dtype  # no allocation here: out is the scratch
        out.copy_(x)
        out.mul_(suh)

    def trellis_matmul(
        self, a, trellis, codebook, *, split_k, out, scratch=None, tiles, warps, **mainloop
    ):
        self.calls.append(("trellis_matmul", a, out, scratch, split_k, tiles, warps))
        self.mainloops.append(mainloop)
        out.copy_(a[:, : out.shape[1]])
        if scratch is not None:
            scratch.fill_(0.5)

    def rotate_output(self, y, svh, *, out_dtype, out):
        self.calls.append(("rotate_output", y, out))
        assert out.dtype == out_dtype
        if out.dtype == svh.dtype:
            out.copy_(y)
            out.mul_(svh)
        else:  # fp16(y · svh) cast to out's dtype; allocation-free, so y (scratch) is scaled
            y.mul_(svh)
            out.copy_(y)

    def decode_weight(self, trellis, codebook, *, out):
        self.calls.append(("decode_weight", trellis, out))
        out.fill_(0.25)


@pytest.fixture
def fake_kernels(monkeypatch) -> FakeKernels:
    from b12x.ops.dense import plan as plan_mod

    fake = FakeKernels()
    for name in ("rotate_input", "trellis_matmul", "rotate_output", "decode_weight"):
        monkeypatch.setattr(plan_mod.launchers, name, getattr(fake, name))
    return fake
