"""Blockwise H128 rotations of the dense trellis linear, with the §3.2 fp16 rounding points.

Layout
------
* A warp takes :data:`JOBS_PER_WARP` consecutive (row, 128-feature block) jobs, one per lane
  group of the butterfly layout (:mod:`b12x.kernels.butterfly`: eight lanes per block, sixteen
  elements per lane, read from the operand viewed as ``int32[M, F/2]``). Every load is issued
  before the butterfly; a group past the end stores nothing. In place (``out`` is ``y``, the K6
  path) is safe: a lane reads its words before it writes them, and no other lane writes them.
* Butterfly (spec §3.1): in-thread H4 in natural order ``(a+b+c+d, a−b+c−d, a+b−c−d, a−b−c+d)``
  (each rounded left to right), then the stages of index bits 2..6 in order, where the element
  whose bit is set keeps ``partner − self`` and the other ``partner + self``
  (:func:`b12x.kernels.butterfly.h128`: bits 2–4 across lanes, bits 5–6 in-thread); finally
  ``× 0.088388347648`` in fp32.
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
from b12x.kernels.butterfly import (
    BLOCKS_PER_WARP,
    GROUP_LANES,
    group_job,
    h128,
    load_lane,
    store_lane,
    word_at,
)
from b12x.kernels.dependent_launch import await_upstream, launch_options

__all__ = ["InputRotationKernel", "OutputRotationKernel", "INV_SQRT_128", "JOBS_PER_WARP"]

INV_SQRT_128 = 0.088388347648
#: Consecutive (row, block) jobs one warp takes: one per lane group of the butterfly layout.
JOBS_PER_WARP = BLOCKS_PER_WARP


def _hmul2(a, b) -> Uint32:
    return ptx.asm_u32("mul.rn.f16x2 $0, $1, $2;", a, b)


def _h4(v: list) -> list:
    """The in-thread H4 in natural order (spec §3.1), each sum rounded left to right."""
    a, b, c, d = v
    return [a + b + c + d, a - b + c - d, a + b - c - d, a - b - c + d]


def _grid(jobs, warps: int) -> tuple:
    per_cta = warps * JOBS_PER_WARP
    return ((jobs + per_cta - 1) // per_cta, 1, 1)


def _load_job(src, scale, warps: int) -> tuple:
    """The lane, whether its group's job exists, where the job's block starts in ``src`` (a flat
    word index), and the lane's eight source and eight scale words. A group past the end loads
    (and rotates) the last job's words and stores nothing: only the stores are guarded, so no
    shuffle sits under a branch that ptxas would compile for a diverged warp (a guarded
    butterfly doubled the SASS with ``WARPSYNC``/``ENDCOLLECTIVE`` fallbacks)."""
    tid = cute.arch.thread_idx()[0]
    lane = tid % 32
    first = (cute.arch.block_idx()[0] * warps + tid // 32) * JOBS_PER_WARP
    blocks = src.shape[1] // 64
    live, row, base, sub = group_job(first, lane, src.shape[0] * blocks, blocks)
    word0 = word_at(src, row, base)
    return lane, live, word0, load_lane(src, word0, sub), load_lane(scale, base, sub)


def _to_f16_word(word, bf16: bool):
    """The fp16 pair of a 16-bit pair (a bf16 pair is rounded to fp16 first)."""
    if bf16:
        lo, hi = ptx.half2_to_f32x2(word, bf16=True)
        return ptx.f32x2_to_half2(lo, hi)
    return word


def _out_word(packed, bf16: bool) -> Int32:
    """The fp16 pair ``packed`` as stored: itself, or the bf16 pair rounded from it."""
    if bf16:
        lo, hi = ptx.half2_to_f32x2(packed, bf16=False)
        packed = ptx.f32x2_to_bfloat2(lo, hi)
    return Int32(packed)


def _scaled_h128(vals: list, lane) -> list:
    return [v * Float32(INV_SQRT_128) for v in h128(vals, lane, _h4)]


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
        self.kernel(x, suh, out).launch(
            grid=_grid(jobs, self.warps),
            block=(32 * self.warps, 1, 1),
            stream=stream,
            **launch_options(),
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, suh: cute.Tensor, out: cute.Tensor):
        await_upstream()
        lane, live, word0, words, scales = _load_job(x, suh, self.warps)
        vals = []
        for w in cutlass.range_constexpr(8):
            scaled = _hmul2(_to_f16_word(words[w], self.in_bf16), scales[w])
            vals += list(ptx.half2_to_f32x2(scaled, bf16=False))
        res = _scaled_h128(vals, lane)
        packed = [ptx.f32x2_to_half2(res[2 * w], res[2 * w + 1]) for w in range(8)]
        if live:
            store_lane(
                out, word0, lane % GROUP_LANES, [_out_word(p, self.out_bf16) for p in packed]
            )


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
        self.kernel(y, svh, out).launch(
            grid=_grid(jobs, self.warps),
            block=(32 * self.warps, 1, 1),
            stream=stream,
            **launch_options(),
        )

    @cute.kernel
    def kernel(self, y: cute.Tensor, svh: cute.Tensor, out: cute.Tensor):
        await_upstream()
        lane, live, word0, words, scales = _load_job(y, svh, self.warps)
        vals = []
        for w in cutlass.range_constexpr(8):  # a bf16 GEMM output: gemm_output_f16 first (§3.3)
            vals += list(ptx.half2_to_f32x2(_to_f16_word(words[w], self.in_bf16), bf16=False))
        res = _scaled_h128(vals, lane)
        packed = [
            _hmul2(ptx.f32x2_to_half2(res[2 * w], res[2 * w + 1]), scales[w]) for w in range(8)
        ]
        if live:
            store_lane(
                out, word0, lane % GROUP_LANES, [_out_word(p, self.out_bf16) for p in packed]
            )
