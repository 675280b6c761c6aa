"""Fixtures the b12x tests share.

* ``moe_judge`` — ``moe_judge(got, x, experts, w, ids, compute_dtype)``: the oracle's MoE judge
  (:func:`oracle.tolerance.judge_moe`: element-wise stage envelope + exact-reference gates) as an
  assertion, the same verdict ``python -m oracle`` gives, so a dropped route or a scaled row fails
  the test. ``experts`` are uniform (``reference.moe.TrellisExperts``) or paired
  (``reference.moe_pairs.PairedExperts``); the GPU MoE tests (uniform, pairs, K split) judge
  with it.
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
