"""CuTe DSL boundary kernels of the fused MoE: the work between (and around) the grouped GEMMs,
one launch per stage (spec §3.1, §3.4; :func:`b12x.ops.moe.run.run_moe`).

Layout
------
* Every kernel gives one warp a (row, 128-feature block) job (rotate: :data:`ROTATE_JOBS_PER_WARP`
  consecutive jobs, their loads issued first). Lane ``l`` holds elements
  ``4l .. 4l+3`` of the block: two packed 16-bit pairs read from the operand viewed as
  ``int32[rows, F/2]`` (words ``64·blk + 2l + q``, ``q = 0, 1``; the lower element in the low
  half). Route ``r`` belongs to token ``r // top_k`` (route order is token-major, slot minor).
* The butterfly (:func:`_h128`) is the fp32 H128 of :func:`b12x.ops.moe.boundary.h128_fp32_` in the
  same add/sub order: stages over index bits 0..6; bits 0–1 in-thread (``(a+b, a−b, c+d, c−d)``
  then ``(s0+s2, s1+s3, s0−s2, s1−s3)``), bits 2–6 as xor-shuffles with lane offsets 1..16 where
  the lower lane keeps ``lo + hi`` and the upper ``lo − hi``; then ``× 0.088388347648`` in fp32.
  Every fp32 add/sub/mul/div is an explicit ``.rn`` PTX instruction, so neither LLVM nor ptxas
  contracts a product and a sum into an FMA: each op rounds exactly where the torch glue rounds.
* :class:`MoeRotateKernel` (``kind="rotate"``): ``A[r] = cd(fp16(H128(fp16(fp16(x[t]) ·
  suh[e]))))`` for the gate table and, for the ``proj`` layout, the up table (grid y = projection).
* :class:`MoeActivateKernel` (``kind="activate"``): from ``fc1[r] = [gate | up]`` (compute dtype)
  ``g = H128(gate)·s1``, ``u = H128(up)·s2``, ``a = silu(g)·u·s3`` (``s1|s2|s3`` the expert's
  ``intermediate_rotations`` row, fp16 → fp32), ``A2[r] = cd(H128(a))``.
* :class:`MoeReduceKernel` (``kind="reduce"``): one warp per (token, block):
  ``out[t] = x_dtype(Σ_{s=0..k−1} (H128(fc2[r])·svh[e])·w[r])`` in fp32 from ``+0`` in slot order;
  an inactive route adds ``+0`` (selected, so a stale ``fc2`` row or a NaN weight never leaks).
* :class:`MoeBoundarySpec` holds every codegen input. Device code only: the builder (kernel
  object and fake arguments) is :func:`b12x.launch.moe_boundary.build_moe_boundary`, and launches
  resolve through the ``moe_boundary`` kind of :mod:`b12x.launch.kinds` (the one compile cache,
  its freeze switch and capture detection).

Invariants
----------
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
from cutlass import Float32, Int32, Int64, Uint32

from b12x.abi import abi_entry
from b12x.kernels import ptx

__all__ = [
    "BOUNDARY_KINDS",
    "H128_SCALE_FP32",
    "WORDS_PER_BLOCK",
    "MoeActivateKernel",
    "MoeBoundarySpec",
    "MoeReduceKernel",
    "MoeRotateKernel",
]

BOUNDARY_KINDS = ("rotate", "activate", "reduce", "pack")
H128_SCALE_FP32 = 0.088388347648  # the same constant as b12x.ops.moe.boundary (fp32-rounded)
WORDS_PER_BLOCK = 64  # a 128-feature block of 16-bit values, as int32 words
#: Consecutive (route, block) jobs one warp of the rotate kernel takes, all loads issued before
#: the first butterfly (one job per warp left the step's largest boundary kernel latency-bound:
#: 327 us at GLM-like M = 4096 on the H200, 3.5x its bytes at HBM speed).
ROTATE_JOBS_PER_WARP = 4


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


def _h128(v: list, lane) -> list:
    """Scaled H128 of the warp's block; ``v`` = this lane's 4 fp32 elements (module docstring)."""
    a, b, c, d = v
    s0, s1, s2, s3 = _add(a, b), _sub(a, b), _add(c, d), _sub(c, d)
    out = [_add(s0, s2), _add(s1, s3), _sub(s0, s2), _sub(s1, s3)]
    for offset in (1, 2, 4, 8, 16):
        upper = (lane & offset) != 0
        nxt = []
        for x in out:
            partner = cute.arch.shuffle_sync_bfly(x, offset)
            # lower lane: lo + hi (hi = partner); upper lane: lo − hi (lo = partner).
            nxt.append(Float32(cutlass.select_(upper, _sub(partner, x), _add(x, partner))))
        out = nxt
    scale = Float32(H128_SCALE_FP32)
    return [_mul(x, scale) for x in out]


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
            grid=((jobs + per_cta - 1) // per_cta, projs, 1), block=(32 * w, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, x, gate_suh, up_suh, route_expert, out_gate, out_up, top_k, num_experts):
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
        """The warp's :data:`ROTATE_JOBS_PER_WARP` consecutive jobs: every load first (a job past
        the end loads the last job's words and stores nothing), then each job's rotation."""
        blocks = out.shape[1] // WORDS_PER_BLOCK
        total = out.shape[0] * blocks
        loaded = []
        for j in cutlass.range_constexpr(ROTATE_JOBS_PER_WARP):
            safe = cutlass.min(warp_job * ROTATE_JOBS_PER_WARP + j, total - 1)
            r = safe // blocks
            col = (safe - r * blocks) * WORDS_PER_BLOCK + 2 * lane
            token = r // top_k
            row = _table_row(_expert(route_expert, r, num_experts), suh)
            words = [Uint32(x[token, col + q]) for q in range(2)]
            scales = [Uint32(suh[row, col + q]) for q in range(2)]
            loaded.append((r, col, words, scales))
        for j in cutlass.range_constexpr(ROTATE_JOBS_PER_WARP):
            if warp_job * ROTATE_JOBS_PER_WARP + j < total:  # warp-uniform: shuffles converge
                self._rotate_job(out, lane, *loaded[j])

    def _rotate_job(self, out, lane, r, col, words, scales):
        """One job's rotation from its loaded words and scales, stored to route row ``r``."""
        vals = []
        for q in range(2):
            word = words[q]
            if cutlass.const_expr(self.spec.in_bf16):  # fp16(x): the input_f16 rounding
                lo, hi = ptx.half2_to_f32x2(word, bf16=True)
                word = ptx.f32x2_to_half2(lo, hi)
            prod = ptx.asm_u32("mul.rn.f16x2 $0, $1, $2;", word, scales[q])
            lo, hi = ptx.half2_to_f32x2(prod, bf16=False)  # fp16(x · suh): one rounding
            vals += [lo, hi]
        res = _h128(vals, lane)
        for q in range(2):
            packed = ptx.f32x2_to_half2(res[2 * q], res[2 * q + 1])  # the fp16 rotation
            if cutlass.const_expr(self.spec.out_bf16):
                lo, hi = ptx.half2_to_f32x2(packed, bf16=False)
                packed = ptx.f32x2_to_bfloat2(lo, hi)
            out[r, col + q] = Int32(packed)


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
        self.kernel(fc1, rotations, route_expert, out, num_experts).launch(
            grid=((jobs + w - 1) // w, 1, 1), block=(32 * w, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, fc1, rotations, route_expert, out, num_experts):
        lane, job = _job(self.spec.warps)
        half_i = out.shape[1]  # I/2 words
        blocks = half_i // WORDS_PER_BLOCK
        if job < out.shape[0] * blocks:
            r = job // blocks
            col = (job - r * blocks) * WORDS_PER_BLOCK + 2 * lane
            row = _expert(route_expert, r, num_experts)  # [E, 3I]: never broadcast
            in_bf16 = self.spec.in_bf16
            g, u, s1, s2, s3 = [], [], [], [], []
            for q in cutlass.range_constexpr(2):
                g += list(ptx.half2_to_f32x2(fc1[r, col + q], bf16=in_bf16))
                u += list(ptx.half2_to_f32x2(fc1[r, half_i + col + q], bf16=in_bf16))
                s1 += list(ptx.half2_to_f32x2(rotations[row, col + q], bf16=False))
                s2 += list(ptx.half2_to_f32x2(rotations[row, half_i + col + q], bf16=False))
                s3 += list(ptx.half2_to_f32x2(rotations[row, 2 * half_i + col + q], bf16=False))
            hg, hu = _h128(g, lane), _h128(u, lane)
            act = []
            for j in cutlass.range_constexpr(4):
                gj = _silu(_mul(hg[j], s1[j]))
                act.append(_mul(_mul(gj, _mul(hu[j], s2[j])), s3[j]))
            res = _h128(act, lane)
            for q in cutlass.range_constexpr(2):
                out[r, col + q] = _pack(res[2 * q], res[2 * q + 1], self.spec.out_bf16)


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
        self.kernel(fc2, svh, route_expert, route_inactive, weights, out, num_experts).launch(
            grid=((jobs + w - 1) // w, 1, 1), block=(32 * w, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, fc2, svh, route_expert, route_inactive, weights, out, num_experts):
        lane, job = _job(self.spec.warps)
        blocks = out.shape[1] // WORDS_PER_BLOCK
        if job < out.shape[0] * blocks:
            t = job // blocks
            col = (job - t * blocks) * WORDS_PER_BLOCK + 2 * lane
            k = self.spec.top_k
            acc = [Float32(0.0)] * 4
            for s in cutlass.range_constexpr(k):
                r = t * k + s
                active = Int32(route_inactive[r]) == 0
                row = _table_row(_expert(route_expert, r, num_experts), svh)
                y, sv = [], []
                for q in cutlass.range_constexpr(2):
                    y += list(ptx.half2_to_f32x2(fc2[r, col + q], bf16=self.spec.in_bf16))
                    sv += list(ptx.half2_to_f32x2(svh[row, col + q], bf16=False))
                hy = _h128(y, lane)
                wr = Float32(weights[r])
                for j in cutlass.range_constexpr(4):
                    term = _mul(_mul(hy[j], sv[j]), wr)
                    acc[j] = _add(acc[j], Float32(cutlass.select_(active, term, Float32(0.0))))
            for q in cutlass.range_constexpr(2):
                out[t, col + q] = _pack(acc[2 * q], acc[2 * q + 1], self.spec.out_bf16)
