"""Blockwise H128 rotations of the dense trellis linear, with the §3.2 fp16 rounding points.

Layout
------
* One warp per (row, 128-feature block); lane ``l`` holds elements ``4l .. 4l+3`` of the block
  (two packed 16-bit pairs, read from the operand viewed as ``int32[M, F/2]``).
* Butterfly (spec §3.1): in-thread H4 in natural order ``(a+b+c+d, a−b+c−d, a+b−c−d, a−b−c+d)``,
  then xor-shuffles with offsets 1, 2, 4, 8, 16 where the lane whose offset bit is set keeps
  ``partner − self`` and the other ``partner + self``; finally ``× 0.088388347648`` in fp32.
* :class:`InputRotationKernel` (step 1–2): ``rot = fp16(H128(fp16(fp16(x) · suh)) / √128)``;
  ``x`` is fp16 or bf16 (bf16 is first rounded to fp16), ``suh`` fp16 ``[K]``; output fp16, or
  bf16 rounded from that fp16 when the GEMM runs in bf16.
* :class:`OutputRotationKernel` (step 4–5): ``out = fp16(fp16(H128(y) / √128) · svh)``; ``y`` is
  the GEMM output in the compute dtype (bf16 is first rounded to fp16, the ``gemm_output_f16``
  point of §3.3), ``svh`` fp16 ``[N]``; the result is rounded to the output dtype (bf16 outputs
  are rounded from the fp16 value).

Invariants
----------
* Feature dims are multiples of 128; every buffer is contiguous and 16-byte aligned (the host
  wrapper checks). Arithmetic is fp32 between the two fp16 rounding points, as in the spec.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from b12x.abi import abi_entry
from b12x.kernels import ptx

__all__ = ["InputRotationKernel", "OutputRotationKernel", "INV_SQRT_128"]

INV_SQRT_128 = 0.088388347648


def _hmul2(a, b) -> Uint32:
    return ptx.asm_u32("mul.rn.f16x2 $0, $1, $2;", a, b)


def _h128_lane(v: list, lane) -> list:
    """H128 of the warp's block: v = 4 fp32 of this lane, returns 4 fp32 (unscaled)."""
    a, b, c, d = v
    out = [a + b + c + d, a - b + c - d, a + b - c - d, a - b - c + d]
    for offset in (1, 2, 4, 8, 16):
        upper = (lane & offset) != 0
        nxt = []
        for x in out:
            partner = cute.arch.shuffle_sync_bfly(x, offset)
            nxt.append(Float32(cutlass.select_(upper, partner - x, partner + x)))
        out = nxt
    return out


class InputRotationKernel:
    """``x [M, K] (fp16|bf16) · suh → H128 → rotated [M, K] (fp16, or bf16 when out_bf16)``."""

    def __init__(self, *, in_bf16: bool, out_bf16: bool, warps: int = 4):
        self.in_bf16 = in_bf16
        self.out_bf16 = out_bf16
        self.warps = warps

    @abi_entry
    @cute.jit
    def __call__(self, x: cute.Tensor, suh: cute.Tensor, out: cute.Tensor, stream):
        jobs = x.shape[0] * (x.shape[1] // 64)
        grid = (jobs + self.warps - 1) // self.warps
        self.kernel(x, suh, out).launch(
            grid=(grid, 1, 1), block=(32 * self.warps, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, suh: cute.Tensor, out: cute.Tensor):
        tid = cute.arch.thread_idx()[0]
        lane = tid % 32
        job = cute.arch.block_idx()[0] * self.warps + tid // 32
        blocks = x.shape[1] // 64
        if job < x.shape[0] * blocks:
            row = job // blocks
            col = (job - row * blocks) * 64 + 2 * lane
            vals = []
            for q in cutlass.range_constexpr(2):
                word = Uint32(x[row, col + q])
                if cutlass.const_expr(self.in_bf16):
                    lo, hi = ptx.half2_to_f32x2(word, bf16=True)
                    word = ptx.f32x2_to_half2(lo, hi)
                scaled = _hmul2(word, Uint32(suh[col + q]))
                lo, hi = ptx.half2_to_f32x2(scaled, bf16=False)
                vals += [lo, hi]
            res = _h128_lane(vals, lane)
            for q in cutlass.range_constexpr(2):
                lo = res[2 * q] * Float32(INV_SQRT_128)
                hi = res[2 * q + 1] * Float32(INV_SQRT_128)
                packed = ptx.f32x2_to_half2(lo, hi)
                if cutlass.const_expr(self.out_bf16):
                    l2, h2 = ptx.half2_to_f32x2(packed, bf16=False)
                    packed = ptx.f32x2_to_bfloat2(l2, h2)
                out[row, col + q] = Int32(packed)


class OutputRotationKernel:
    """``y [M, N] (compute dtype) → H128 → fp16 · svh → out [M, N] (fp16|bf16)``."""

    def __init__(self, *, in_bf16: bool, out_bf16: bool, warps: int = 4):
        self.in_bf16 = in_bf16
        self.out_bf16 = out_bf16
        self.warps = warps

    @abi_entry
    @cute.jit
    def __call__(self, y: cute.Tensor, svh: cute.Tensor, out: cute.Tensor, stream):
        jobs = y.shape[0] * (y.shape[1] // 64)
        grid = (jobs + self.warps - 1) // self.warps
        self.kernel(y, svh, out).launch(
            grid=(grid, 1, 1), block=(32 * self.warps, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, y: cute.Tensor, svh: cute.Tensor, out: cute.Tensor):
        tid = cute.arch.thread_idx()[0]
        lane = tid % 32
        job = cute.arch.block_idx()[0] * self.warps + tid // 32
        blocks = y.shape[1] // 64
        if job < y.shape[0] * blocks:
            row = job // blocks
            col = (job - row * blocks) * 64 + 2 * lane
            vals = []
            for q in cutlass.range_constexpr(2):
                word = Uint32(y[row, col + q])
                if cutlass.const_expr(self.in_bf16):  # gemm_output -> gemm_output_f16 (§3.3)
                    lo, hi = ptx.half2_to_f32x2(word, bf16=True)
                    word = ptx.f32x2_to_half2(lo, hi)
                lo, hi = ptx.half2_to_f32x2(word, bf16=False)
                vals += [lo, hi]
            res = _h128_lane(vals, lane)
            for q in cutlass.range_constexpr(2):
                lo = res[2 * q] * Float32(INV_SQRT_128)
                hi = res[2 * q + 1] * Float32(INV_SQRT_128)
                packed = _hmul2(ptx.f32x2_to_half2(lo, hi), Uint32(svh[col + q]))
                if cutlass.const_expr(self.out_bf16):
                    l2, h2 = ptx.half2_to_f32x2(packed, bf16=False)
                    packed = ptx.f32x2_to_bfloat2(l2, h2)
                out[row, col + q] = Int32(packed)
