"""CuTe DSL boundary kernels of the fused MoE: the work between (and around) the grouped GEMMs,
one launch per stage (spec §3.1, §3.4; :func:`b12x.ops.moe.run.run_moe`).

Layout:
* Every kernel gives each lane group of a warp (eight lanes, :mod:`b12x.kernels.butterfly`) one
  (row, 128-feature block) job: a warp takes four consecutive jobs (:data:`ROTATE_JOBS_PER_WARP` and
  its twins), all loads issued before the butterflies; a group past the end computes on the last
  job's data and stores nothing, so no shuffle is under a branch. Lane ``8q + s`` holds sixteen
  elements of its block, the words ``64·blk + 16g + 2s + h`` (``g`` in ``0..3``, ``h`` in ``0, 1``)
  of the operand viewed as ``int32[rows, F/2]``, the lower element in the low half. Route ``r``
  belongs to token ``r // top_k`` (route order is token-major, slot minor).
* The butterfly (:func:`_h128`) is the fp32 H128 of :func:`b12x.ops.moe.boundary.h128_fp32_` in the
  same add/sub order: stages over index bits 0..6, each element whose bit is set keeping ``lo − hi``
  and the other ``lo + hi``; bits 0–1 in-thread (``(a+b, a−b, c+d, c−d)`` then ``(s0+s2, s1+s3,
  s0−s2, s1−s3)``), bits 2–4 across the group's lanes (one exact FMA with a ±1 sign per value and
  stage), bits 5–6 in-thread (:func:`b12x.kernels.butterfly.h128`); then ``× 0.088388347648``. Every
  fp32 add/sub/mul/div is an explicit ``.rn`` PTX instruction, so neither LLVM nor ptxas contracts a
  product and a sum into an FMA: each op rounds exactly where the torch glue rounds.
* :class:`MoeRotateKernel` (``kind="rotate"``): ``A[r] = cd(fp16(H128(fp16(fp16(x[t]) · suh[e]))))``
  for the gate table and, for the ``proj`` layout, the up table (grid y = projection).
* :class:`MoeActivateKernel` (``kind="activate"``): from ``fc1[r] = [gate | up]`` (compute dtype)
  ``g = H128(gate)·s1``, ``u = H128(up)·s2``, ``a = silu(g)·u·s3`` (``s1|s2|s3`` the expert's
  ``intermediate_rotations`` row, fp16 → fp32), ``A2[r] = cd(H128(a))``.
* :class:`MoeReduceKernel` (``kind="reduce"``): one lane group per (token, block): ``out[t] =
  x_dtype(Σ_{s=0..k−1} (H128(fc2[r])·svh[e])·w[r])`` in fp32 from ``+0`` in slot order; an inactive
  route adds ``+0`` (selected, so a stale ``fc2`` row or a NaN weight never leaks).
* :class:`MoeBoundarySpec` holds every codegen input. Device code only: the builder (kernel object
  and fake arguments) is :func:`b12x.launch.moe_boundary.build_moe_boundary`, and launches resolve
  through the ``moe_boundary`` kind of :mod:`b12x.launch.kinds` (the one compile cache, its freeze
  switch and capture detection).

Invariants:
* Expert ids arrive as the route packer's int64 ``route_expert`` (the drop bucket ``E`` for an
  inactive route); every kernel clamps them to ``E − 1`` before a table row is formed, so no
  inactive id ever indexes a table (R7, R9). Route ids themselves are never read or written here.
* A table with one row (``[1, F]``) is the broadcast row for every expert.
* Each output row depends only on its own route row (reduce: on its own token's ``k`` routes, in
  slot order), so the stages are deterministic and batch invariant.
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from b12x.abi import abi_entry
from b12x.kernels import ptx
from b12x.kernels.butterfly import (
    BLOCKS_PER_WARP,
    group_job,
    h128,
    load_lane,
    store_lane,
    word_at,
)
from b12x.kernels.dependent_launch import await_upstream, launch_options

__all__ = [
    "BOUNDARY_KINDS",
    "ACTIVATE_JOBS_PER_WARP",
    "H128_SCALE_FP32",
    "REDUCE_JOBS_PER_WARP",
    "ROTATE_JOBS_PER_WARP",
    "WORDS_PER_BLOCK",
    "MoeActivateKernel",
    "MoeBoundarySpec",
    "MoeReduceKernel",
    "MoeRotateKernel",
]

BOUNDARY_KINDS = ("rotate", "activate", "reduce", "pack")
H128_SCALE_FP32 = 0.088388347648  # the same constant as b12x.ops.moe.boundary (fp32-rounded)
WORDS_PER_BLOCK = 64  # a 128-feature block of 16-bit values, as int32 words
#: Consecutive (row, block) jobs one warp of each kernel takes: one per lane group of the
#: butterfly layout (:mod:`b12x.kernels.butterfly`), all loads issued before the butterflies.
ROTATE_JOBS_PER_WARP = BLOCKS_PER_WARP
ACTIVATE_JOBS_PER_WARP = BLOCKS_PER_WARP
REDUCE_JOBS_PER_WARP = BLOCKS_PER_WARP


@dataclasses.dataclass(frozen=True)
class MoeBoundarySpec:
    """Every codegen input of one boundary kernel (plus the arch: the compile-cache key).

    ``in_bf16``: the 16-bit input is bf16 (rotate: ``x``; activate / reduce: the GEMM output in
    the compute dtype). ``out_bf16``: the output is bf16 (rotate / activate: the compute dtype;
    reduce: ``x.dtype``). ``proj``: rotate writes gate and up rotations (grid y = 2). ``top_k``:
    reduce's unrolled slot count (0 for the other kinds, which take it at run time). ``pack`` is
    the route packer (:class:`b12x.kernels.moe_pack.MoePackKernel`): no 16-bit operand, so both
    dtype flags are False.
    """

    kind: str
    in_bf16: bool
    out_bf16: bool
    proj: bool = False
    top_k: int = 0
    warps: int = 4

    def __post_init__(self):
        if self.kind not in BOUNDARY_KINDS:
            raise ValueError(f"kind: expected one of {BOUNDARY_KINDS}, got {self.kind!r}")
        for name in ("in_bf16", "out_bf16", "proj"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected bool, got {getattr(self, name)!r}")
        if self.kind == "pack" and (self.in_bf16 or self.out_bf16):
            raise ValueError("in_bf16/out_bf16: the pack kernel has no 16-bit operand (False)")
        if self.proj and self.kind != "rotate":
            raise ValueError(f"proj: only the rotate kernel has projections, not {self.kind!r}")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int) or (k < 1) != (self.kind != "reduce"):
            raise ValueError(f"top_k: reduce needs top_k >= 1, the other kinds 0; got {k!r}")
        if isinstance(self.warps, bool) or self.warps not in (1, 2, 4, 8):
            raise ValueError(f"warps: expected 1, 2, 4 or 8, got {self.warps!r}")


# ---------------------------------------------------------------------------- fp32 primitives


def _add(a, b) -> Float32:
    return ptx.asm_f32("add.rn.f32 $0, $1, $2;", a, b)


def _sub(a, b) -> Float32:
    return ptx.asm_f32("sub.rn.f32 $0, $1, $2;", a, b)


def _mul(a, b) -> Float32:
    return ptx.asm_f32("mul.rn.f32 $0, $1, $2;", a, b)


def _div(a, b) -> Float32:
    return ptx.asm_f32("div.rn.f32 $0, $1, $2;", a, b)


def _silu(g) -> Float32:
    """``g / (1 + exp(−g))`` in fp32 (torch's formula; exp is the accurate libm exp)."""
    e = cute.math.exp(ptx.asm_f32("neg.f32 $0, $1;", g), fastmath=False)
    return _div(g, _add(Float32(1.0), e))


def _pack(lo, hi, bf16: bool) -> Int32:
    """RN-pack two fp32 values into a half2 / bfloat2 word."""
    if bf16:
        return Int32(ptx.f32x2_to_bfloat2(lo, hi))
    return Int32(ptx.f32x2_to_half2(lo, hi))


def _h4(v: list) -> list:
    """Index bits 0–1 in-thread: ``(a+b, a−b, c+d, c−d)``, then ``(s0+s2, s1+s3, s0−s2, s1−s3)``."""
    a, b, c, d = v
    s0, s1, s2, s3 = _add(a, b), _sub(a, b), _add(c, d), _sub(c, d)
    return [_add(s0, s2), _add(s1, s3), _sub(s0, s2), _sub(s1, s3)]


def _h128(v: list, lane) -> list:
    """Scaled H128 of the lane group's block; ``v`` = this lane's 16 fp32 elements in the order
    of :func:`b12x.kernels.butterfly.h128` (module docstring)."""
    scale = Float32(H128_SCALE_FP32)
    return [_mul(x, scale) for x in h128(v, lane, _h4)]


def _values(words: list, bf16: bool) -> list:
    """The 16 fp32 values of eight 16-bit pairs (exact), in word order, low half first."""
    vals = []
    for word in words:
        vals += list(ptx.half2_to_f32x2(word, bf16=bf16))
    return vals


def _expert(route_expert, r, num_experts) -> Int32:
    """Route ``r``'s expert, clamped to ``E − 1`` (the drop bucket ``E`` never indexes a table)."""
    e = Int64(route_expert[r])
    last = Int64(num_experts) - Int64(1)
    return Int32(cutlass.select_(e > last, last, e))


def _table_row(expert, table) -> Int32:
    """The row of ``table`` for ``expert``: row 0 of a one-row (broadcast) table."""
    return Int32(cutlass.select_(table.shape[0] > 1, expert, Int32(0)))


def _job(warps: int):
    tid = cute.arch.thread_idx()[0]
    return tid % 32, cute.arch.block_idx()[0] * warps + tid // 32


# ---------------------------------------------------------------------------- kernels


class MoeRotateKernel:
    """``x [M, H]`` (fp16|bf16) → per route ``cd(H128(fp16(x[t]·suh[e])))`` (gate, up)."""

    def __init__(self, spec: MoeBoundarySpec):
        self.spec = spec

    @abi_entry
    @cute.jit
    def __call__(
        self,
        x: cute.Tensor,
        gate_suh: cute.Tensor,
        up_suh: cute.Tensor,
        route_expert: cute.Tensor,
        out_gate: cute.Tensor,
        out_up: cute.Tensor,
        top_k: Int32,
        num_experts: Int32,
        stream,
    ):
        w = self.spec.warps
        jobs = out_gate.shape[0] * (out_gate.shape[1] // WORDS_PER_BLOCK)
        per_cta = w * ROTATE_JOBS_PER_WARP
        projs = 2 if cutlass.const_expr(self.spec.proj) else 1
        self.kernel(x, gate_suh, up_suh, route_expert, out_gate, out_up, top_k, num_experts).launch(
            grid=((jobs + per_cta - 1) // per_cta, projs, 1),
            block=(32 * w, 1, 1),
            stream=stream,
            **launch_options(),
        )

    @cute.kernel
    def kernel(self, x, gate_suh, up_suh, route_expert, out_gate, out_up, top_k, num_experts):
        await_upstream()
        lane, warp_job = _job(self.spec.warps)
        if cutlass.const_expr(self.spec.proj):
            if cute.arch.block_idx()[1] == 0:
                self._rotate(x, gate_suh, route_expert, out_gate, warp_job, lane, top_k,
                             num_experts)  # fmt: skip
            else:
                self._rotate(x, up_suh, route_expert, out_up, warp_job, lane, top_k,
                             num_experts)  # fmt: skip
        else:
            self._rotate(x, gate_suh, route_expert, out_gate, warp_job, lane, top_k, num_experts)

    @cute.jit
    def _rotate(self, x, suh, route_expert, out, warp_job, lane, top_k, num_experts):
        """The warp's :data:`ROTATE_JOBS_PER_WARP` consecutive jobs, one per lane group."""
        blocks = out.shape[1] // WORDS_PER_BLOCK
        total = out.shape[0] * blocks
        live, r, base, sub = group_job(warp_job * ROTATE_JOBS_PER_WARP, lane, total, blocks)
        token = r // top_k
        row = _table_row(_expert(route_expert, r, num_experts), suh)
        words = load_lane(x, word_at(x, token, base), sub)
        scales = load_lane(suh, word_at(suh, row, base), sub)
        res = self._rotate_job(lane, words, scales)
        if live:
            store_lane(out, word_at(out, r, base), sub, res)

    def _rotate_job(self, lane, words, scales) -> list:
        """One job's eight output words from its loaded words and scales."""
        products = []
        for word, scale in zip(words, scales, strict=True):
            if cutlass.const_expr(self.spec.in_bf16):  # fp16(x): the input_f16 rounding
                lo, hi = ptx.half2_to_f32x2(word, bf16=True)
                word = ptx.f32x2_to_half2(lo, hi)
            products.append(ptx.asm_u32("mul.rn.f16x2 $0, $1, $2;", word, scale))
        res = _h128(_values(products, False), lane)  # fp16(x · suh): one rounding
        packed = []
        for w in range(8):
            word = ptx.f32x2_to_half2(res[2 * w], res[2 * w + 1])  # the fp16 rotation
            if cutlass.const_expr(self.spec.out_bf16):
                lo, hi = ptx.half2_to_f32x2(word, bf16=False)
                word = ptx.f32x2_to_bfloat2(lo, hi)
            packed.append(Int32(word))
        return packed


class MoeActivateKernel:
    """``fc1 [n, 2I]`` (cd) → ``A2 [n, I] = cd(H128(silu(H128(g)·s1)·(H128(u)·s2)·s3))``."""

    def __init__(self, spec: MoeBoundarySpec):
        self.spec = spec

    @abi_entry
    @cute.jit
    def __call__(
        self,
        fc1: cute.Tensor,
        rotations: cute.Tensor,
        route_expert: cute.Tensor,
        out: cute.Tensor,
        num_experts: Int32,
        stream,
    ):
        w = self.spec.warps
        jobs = out.shape[0] * (out.shape[1] // WORDS_PER_BLOCK)
        per_cta = w * ACTIVATE_JOBS_PER_WARP
        self.kernel(fc1, rotations, route_expert, out, num_experts).launch(
            grid=((jobs + per_cta - 1) // per_cta, 1, 1),
            block=(32 * w, 1, 1),
            stream=stream,
            **launch_options(),
        )

    @cute.kernel
    def kernel(self, fc1, rotations, route_expert, out, num_experts):
        await_upstream()
        lane, warp_job = _job(self.spec.warps)
        half_i = out.shape[1]  # I/2 words
        blocks = half_i // WORDS_PER_BLOCK
        total = out.shape[0] * blocks
        live, r, base, sub = group_job(warp_job * ACTIVATE_JOBS_PER_WARP, lane, total, blocks)
        row = _expert(route_expert, r, num_experts)  # [E, 3I]: never broadcast
        gate = load_lane(fc1, word_at(fc1, r, base), sub)
        up = load_lane(fc1, word_at(fc1, r, half_i + base), sub)
        scales = [
            load_lane(rotations, word_at(rotations, row, p * half_i + base), sub) for p in range(3)
        ]
        res = self._activate_job(lane, gate, up, scales)
        if live:
            store_lane(out, word_at(out, r, base), sub, res)

    def _activate_job(self, lane, gate, up, scales) -> list:
        """One job's eight output words."""
        in_bf16 = self.spec.in_bf16
        hg = _h128(_values(gate, in_bf16), lane)
        hu = _h128(_values(up, in_bf16), lane)
        s1, s2, s3 = (_values(words, False) for words in scales)
        act = []
        for j in range(16):
            gj = _silu(_mul(hg[j], s1[j]))
            act.append(_mul(_mul(gj, _mul(hu[j], s2[j])), s3[j]))
        res = _h128(act, lane)
        return [_pack(res[2 * w], res[2 * w + 1], self.spec.out_bf16) for w in range(8)]


class MoeReduceKernel:
    """``fc2 [n, H]`` (cd) → ``out [M, H] = x_dtype(Σ_s (H128(fc2[r])·svh[e])·w[r])``."""

    def __init__(self, spec: MoeBoundarySpec):
        self.spec = spec

    @abi_entry
    @cute.jit
    def __call__(
        self,
        fc2: cute.Tensor,
        svh: cute.Tensor,
        route_expert: cute.Tensor,
        route_inactive: cute.Tensor,
        weights: cute.Tensor,
        out: cute.Tensor,
        num_experts: Int32,
        stream,
    ):
        w = self.spec.warps
        jobs = out.shape[0] * (out.shape[1] // WORDS_PER_BLOCK)
        per_cta = w * REDUCE_JOBS_PER_WARP
        self.kernel(fc2, svh, route_expert, route_inactive, weights, out, num_experts).launch(
            grid=((jobs + per_cta - 1) // per_cta, 1, 1),
            block=(32 * w, 1, 1),
            stream=stream,
            **launch_options(),
        )

    @cute.kernel
    def kernel(self, fc2, svh, route_expert, route_inactive, weights, out, num_experts):
        await_upstream()
        lane, warp_job = _job(self.spec.warps)
        blocks = out.shape[1] // WORDS_PER_BLOCK
        total = out.shape[0] * blocks
        live, t, base, sub = group_job(warp_job * REDUCE_JOBS_PER_WARP, lane, total, blocks)
        k = self.spec.top_k
        acc = [Float32(0.0)] * 16
        for s in cutlass.range_constexpr(k):
            r = t * k + s
            active = Int32(route_inactive[r]) == 0
            row = _table_row(_expert(route_expert, r, num_experts), svh)
            hy = _h128(_values(load_lane(fc2, word_at(fc2, r, base), sub), self.spec.in_bf16), lane)
            sv = _values(load_lane(svh, word_at(svh, row, base), sub), False)
            wr = Float32(weights[r])
            for j in cutlass.range_constexpr(16):
                term = _mul(_mul(hy[j], sv[j]), wr)
                acc[j] = _add(acc[j], Float32(cutlass.select_(active, term, Float32(0.0))))
        res = [_pack(acc[2 * w], acc[2 * w + 1], self.spec.out_bf16) for w in range(8)]
        if live:
            store_lane(out, word_at(out, t, base), sub, res)
