"""Two constants of the judges, held by what they mean rather than by their values.

* The coarse gate's floor applies only to a row block whose faithful error is zero (nothing
  rounded), and there it must not be a loophole: an output 3 ulps off everywhere fails, 1 ulp
  off passes (fp16 and bf16), whatever the floor's number.
* The envelope's directed tensor-core allowance is one ulp of the partial sum per K16 step
  (``2·κ·u`` with κ = 1): the GEMM stage's directed bound of a hand-computed all-ones GEMM.
"""

from __future__ import annotations

import pytest
import torch

from oracle.judge import envelope as env
from oracle.judge.tolerance import judge
from oracle.judge.verdicts import DEFAULT_TOLERANCES

ULP_EXPONENT = {"fp16": -10, "bf16": -7}  # ulp of a value in [1, 2)


@pytest.mark.parametrize("dtype_name", list(ULP_EXPONENT))
@pytest.mark.parametrize("ulps, passes", [(1, True), (3, False)])
def test_the_floor_decides_only_exact_blocks_and_is_no_loophole(dtype_name, ulps, passes):
    g = torch.Generator().manual_seed(3)
    exact = (1 + torch.rand(32, 64, generator=g, dtype=torch.float64)).to(torch.float16)
    exact = exact.to(torch.float64)  # faithful == exact: a block where nothing rounded
    sign = torch.where(torch.rand(32, 64, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    y = exact * (1 + sign * ulps * 2.0 ** ULP_EXPONENT[dtype_name])
    verdict = judge(y, exact, exact.clone(), DEFAULT_TOLERANCES[dtype_name])
    assert verdict.passed == passes, verdict.reason
    blocks = y.shape[0] // verdict.details["tolerance"]["row_block"]
    assert verdict.details["floor_blocks"] == blocks  # every block was decided by the floor


def test_the_directed_allowance_is_one_partial_sum_ulp_per_k16_step():
    """a = b = ones, K = 64 (4 K16 steps), one output: the K16 block sums are 16, the prefix
    sums 16, 32, 48, 64, so the walk is (64 - 0) + 2·16 = 96 and the directed bound
    2·κ·u·steps·walk = 2 · 2^-24 · 4 · 96 (plus float64 slack far below it)."""
    a = torch.ones(1, 64, dtype=torch.float64)
    b = torch.ones(64, 1, dtype=torch.float64)
    bound = env.gemm_envelope(env.Bound.exact(a), b)
    directed = 2 * 2.0**-24 * 4 * 96
    assert float(bound.sys.reshape(-1)[0]) == pytest.approx(directed, rel=1e-9)
