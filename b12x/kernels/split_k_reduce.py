"""The split-K reduce: ``out = Σ_s partials[s]`` in split order, one launch after the dense GEMM.

Layout: ``partials`` fp32 ``[S, M, N]`` (the split-K GEMM's output, :mod:`b12x.kernels.dense_gemm`),
``out`` the compute dtype ``[M, N]`` viewed as int32 ``[M, N/2]``; one thread per output pair.
Invariant: the adds run in split order, so the result is the ordered fp32 sum
``((0 + p_0) + p_1) + …`` rounded once to the compute dtype, bit for bit
(``tests/b12x/test_split_reduce_gpu.py``), whatever the batch of loads in flight.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from b12x.abi import abi_entry
from b12x.kernels import ptx
from b12x.kernels.dependent_launch import await_upstream, launch_options

#: Splits whose partials one reduce thread loads before it adds any of them.
REDUCE_BATCH = 8


class SplitKReduceKernel:
    """``out[m, n] = Σ_s partials[s, m, n]`` in split order, rounded to the compute dtype.

    ``partials``: fp32 ``[S, M, N]``; ``out``: compute dtype ``[M, N]`` viewed as int32
    ``[M, N/2]``. One thread per output pair. The partials were just written by the GEMM and
    mostly sit in L2, so the kernel is bound by load latency: a thread issues the loads of
    :data:`REDUCE_BATCH` splits before the first of their adds (``ceil(S / 8)`` round trips, not
    one per split or two), and the adds stay in split order (the sum is the ordered fp32 sum
    ``tests/b12x/test_split_reduce_gpu.py`` checks bit for bit).
    """

    def __init__(self, *, bf16: bool, threads: int = 256):
        self.bf16 = bf16
        self.threads = threads

    @abi_entry
    @cute.jit
    def __call__(self, partials: cute.Tensor, out: cute.Tensor, stream):
        pairs = out.shape[0] * out.shape[1]
        grid = (pairs + self.threads - 1) // self.threads
        self.kernel(partials, out).launch(
            grid=(grid, 1, 1), block=(self.threads, 1, 1), stream=stream, **launch_options()
        )

    @cute.kernel
    def kernel(self, partials: cute.Tensor, out: cute.Tensor):
        await_upstream()
        idx = cute.arch.block_idx()[0] * self.threads + cute.arch.thread_idx()[0]
        half_n = out.shape[1]
        if idx < out.shape[0] * half_n:
            row = idx // half_n
            pair = idx - row * half_n
            splits = partials.shape[0]
            lo = Float32(0.0)
            hi = Float32(0.0)
            for first in range(0, splits, REDUCE_BATCH):
                # Loads first: the batch's loads are all in flight before its first add (a split
                # past the end reloads the last one, never read past the buffer), then the adds
                # in split order, a split past the end skipped: the same sum, bit for bit.
                batch = []
                for j in cutlass.range_constexpr(REDUCE_BATCH):
                    s = cutlass.min(first + j, splits - 1)
                    batch.append((partials[s, row, 2 * pair], partials[s, row, 2 * pair + 1]))
                for j in cutlass.range_constexpr(REDUCE_BATCH):
                    if first + j < splits:
                        lo = lo + batch[j][0]
                        hi = hi + batch[j][1]
            if cutlass.const_expr(self.bf16):
                out[row, pair] = Int32(ptx.f32x2_to_bfloat2(lo, hi))
            else:
                out[row, pair] = Int32(ptx.f32x2_to_half2(lo, hi))
