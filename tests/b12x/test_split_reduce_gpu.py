"""GPU: the split-K reduce kernel sums the fp32 partials in split order, bit for bit.

:class:`b12x.kernels.split_k_reduce.SplitKReduceKernel` must return ``((0 + p_0) + p_1) + … +
p_{S-1}`` in fp32, rounded once to the compute dtype: the order every split-K consumer and the
determinism claims rely on. The envelope tests cannot see the order (any order is as accurate)
and the one-hot split tests cannot either (one non-zero partial per output), so this test draws
partials whose order shows *after* the final rounding: large values (about 2^20, fp32 ulp
1/8) that the last split cancels, leaving an O(1) sum carrying O(0.1) of order-dependent
rounding. A reordered, dropped or repeated split changes most outputs. Exact zeros of both
signs are sprinkled in (``0 + (-0)`` stays +0). Split counts 1..33 cover unrolled bodies and
remainders of any unroll the compiler picks.
"""

from __future__ import annotations

import pytest
import torch

from b12x.launch import host, kinds
from b12x.launch.records import ReduceLaunch
from b12x.launch.specs import KernelSpec

SPLITS = (1, 2, 3, 7, 8, 9, 15, 16, 17, 33)


def cancelling_partials(splits: int, m: int, n: int, seed: int) -> torch.Tensor:
    """fp32 ``[S, M, N]``: S - 1 large random partials, then one that cancels their fp64 sum up
    to an O(1) remainder (S = 1: one O(1) partial, so every output fits fp16)."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(splits, m, n, generator=gen, dtype=torch.float64) * (
        2.0**20 if splits > 1 else 1
    )
    zeros = torch.rand(splits, m, n, generator=gen) < 0.05
    zeros[-1] = False
    p[zeros] = 0.0
    p[zeros & (torch.rand(splits, m, n, generator=gen) < 0.5)] = -0.0
    if splits > 1:
        p[-1] = -p[:-1].sum(0) + torch.randn(m, n, generator=gen, dtype=torch.float64)
    return p.to(torch.float32)


def ordered_sum(partials: torch.Tensor) -> torch.Tensor:
    """``((0 + p_0) + p_1) + …`` in fp32, one IEEE add at a time."""
    acc = torch.zeros(partials.shape[1:], dtype=torch.float32, device=partials.device)
    for s in range(partials.shape[0]):
        acc = acc + partials[s]
    return acc


def reduce_on_device(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    m, n = partials.shape[1:]
    out = torch.full((m, n), float("nan"), dtype=dtype, device=partials.device)
    launch = ReduceLaunch(partials=partials, out=out.view(torch.int32))
    spec = KernelSpec("reduce", bf16=dtype == torch.bfloat16)
    kinds.compiled(spec, host.device_arch(out.device))(*launch.args())
    torch.cuda.synchronize()
    return out


def test_the_order_shows_after_rounding():
    """The premise, on the CPU: summed last split first, the same partials give other fp16
    bits for most outputs, and dropping the first split changes nearly all of them."""
    partials = cancelling_partials(15, 4, 96, seed=3)
    forward = ordered_sum(partials).to(torch.float16)
    backward = ordered_sum(partials.flip(0)).to(torch.float16)
    assert (forward != backward).float().mean() > 0.5
    assert (forward != ordered_sum(partials[1:]).to(torch.float16)).float().mean() > 0.9


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("m", [1, 5])
def test_reduce_is_the_ordered_fp32_sum(splits, m, dtype):
    partials = cancelling_partials(splits, m, 96, seed=splits * 7 + m).cuda()
    expected = ordered_sum(partials).to(dtype)
    got = reduce_on_device(partials, dtype)
    differ = int((got.view(torch.int16) != expected.view(torch.int16)).sum())
    assert differ == 0, f"S={splits}: {differ} of {got.numel()} outputs differ from the ordered sum"
