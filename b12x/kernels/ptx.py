"""Inline-PTX primitives used by the trellis kernels (CuTe DSL ``dsl_user_op`` wrappers).

Layout
------
Each helper wraps one short PTX sequence through ``llvm.inline_asm`` and returns a DSL numeric
(``Uint32``, ``Float32``). They are pure functions of their operands (no side effects), so the
compiler may schedule them freely; the only memory-reading helpers are :func:`ld_global_nc_u8`,
:func:`ld_global_nc_u32` and :func:`ld_shared_u8`, which read read-only tables. The exceptions
are the shared-memory stores and the ``cp.async`` ring helpers (:func:`cp_async_16`,
:func:`cp_async_commit`, :func:`cp_async_wait`, :func:`ld_shared_u32_imm`): they are volatile
(``has_side_effects``), so LLVM keeps them in program order relative to each other and to the
warp barrier that orders a ring slot's reads before its next fill.

Invariants
----------
* Packed fp16/bf16 pairs live in one ``Uint32``: the lower-index element in the low half.
* All floating-point ops round to nearest even (``.rn``), matching the spec's rounding points.
* Helpers accept DSL values or Python ints (converted to ``Uint32``/``Int64`` first).
"""

from __future__ import annotations

from cutlass import Float32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

__all__ = [
    "PRMT_CUT8",
    "asm_u32",
    "lop3_hash_pair_to_half2",
    "lop3_hash_pair_to_bfloat2",
    "dp4a_bytesum",
    "pack_lo16",
    "e4m3x2_to_half2",
    "half2_to_bfloat2",
    "ld_global_nc_u8",
    "ld_global_nc_u32",
    "ld_shared_u8",
    "d3l_fma_half",
    "bfind_u32",
    "brev_u32",
    "mma_m16n8k16",
    "f32x2_to_half2",
    "f32x2_to_bfloat2",
    "u32_as_f32",
    "f32_as_u32",
    "asm_f32",
    "half2_to_f32x2",
    "shf_r_clamp",
    "shf_r_imm",
    "shr_clamp",
    "bfe16",
    "cut16",
    "ld_global_nc_u32_imm",
    "st_shared_u16",
    "st_shared_u32",
    "ld_shared_v4",
    "st_shared_v4",
    "st_global_v4",
    "ld_global_v2_u32",
    "st_global_v2_u32",
    "cp_async_16",
    "cp_async_commit",
    "cp_async_wait",
    "ld_shared_u32_imm",
    "st_global_cg_v4_f32",
    "ld_global_cg_v4_f32",
    "fence_acq_rel_gpu",
    "st_release_gpu_u32",
    "wait_acquire_gpu_u32",
]


def _u32_values(args, loc, ip):
    return [Uint32(a).ir_value(loc=loc, ip=ip) for a in args]


def _asm(result_type, operands, text, constraints, loc, ip):
    return llvm.inline_asm(
        result_type,
        operands,
        text,
        constraints,
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def asm_u32(text: str, *args, loc=None, ip=None) -> Uint32:
    """One u32 result from ``len(args)`` u32 operands: ``$0`` is the result, ``$1..`` the args."""
    constraints = ",".join(["=r"] + ["r"] * len(args))
    return Uint32(_asm(T.i32(), _u32_values(args, loc, ip), text, constraints, loc, ip))


@dsl_user_op
def asm_f32(text: str, *args, loc=None, ip=None) -> Float32:
    """One f32 result from ``len(args)`` f32 operands (``$0`` the result). Explicit ``.rn``
    instructions written this way cannot be contracted into an FMA by the compiler."""
    operands = [Float32(a).ir_value(loc=loc, ip=ip) for a in args]
    constraints = ",".join(["=f"] + ["f"] * len(args))
    return Float32(_asm(T.f32(), operands, text, constraints, loc, ip))


_F16_TO_F32 = (
    "{{ .reg .b16 l, h; .reg .f32 f; mov.b32 {{l, h}}, $1; cvt.f32.f16 f, {half}; mov.b32 $0, f; }}"
)


def half2_to_f32x2(word, *, bf16: bool) -> tuple:
    """The two fp32 values (exact) of a packed fp16 / bf16 pair, the low half first."""
    word = Uint32(word)
    if bf16:
        lo = asm_u32("shl.b32 $0, $1, 16;", word)
        hi = asm_u32("and.b32 $0, $1, 0xffff0000;", word)
    else:
        lo = asm_u32(_F16_TO_F32.format(half="l"), word)
        hi = asm_u32(_F16_TO_F32.format(half="h"), word)
    return u32_as_f32(lo), u32_as_f32(hi)


def lop3_hash_pair_to_half2(x_lo, x_hi, mask: int, xor: int) -> Uint32:
    """§2.0 for two hashes: half2(value(x_lo), value(x_hi)), value = fp16(h.lo) + fp16(h.hi).

    No integer pack: ``fma.rn.f16x2(h0, (1, -1), (h0.hi, h0.hi)) = (v0, +0)`` and
    ``fma.rn.f16x2(h1, (-1, 1), (h1.lo, h1.lo)) = (+0, v1)`` (each sum rounded once, exactly
    like ``add.rn.f16``; ``x - x`` is +0 under RN), then ``(v0, +0) + (+0, v1)`` is exact. A value
    is never -0 (its halves are non-zero normals, |h| >= 0.125, so a zero sum is an exact
    cancellation, +0), hence adding +0 changes no bit. The halves are read through operand
    swizzles, so the pair costs two LOP3 (integer pipe) and three FP16 instructions.
    """
    text = (
        "{ .reg .b32 h0, h1, c0, c1, k0, k1, r0, r1; .reg .b16 a0, a1, b0, b1;\n"
        f"lop3.b32 h0, $1, {mask:#010x}, {xor:#010x}, 0x6a;\n"
        f"lop3.b32 h1, $2, {mask:#010x}, {xor:#010x}, 0x6a;\n"
        "mov.b32 {a0, a1}, h0;\n"
        "mov.b32 {b0, b1}, h1;\n"
        "mov.b32 c0, {a1, a1};\n"
        "mov.b32 c1, {b0, b0};\n"
        "mov.b32 k0, 0xbc003c00;\n"
        "mov.b32 k1, 0x3c00bc00;\n"
        "fma.rn.f16x2 r0, h0, k0, c0;\n"
        "fma.rn.f16x2 r1, h1, k1, c1;\n"
        "add.rn.f16x2 $0, r0, r1; }"
    )
    return asm_u32(text, x_lo, x_hi)


def lop3_hash_pair_to_bfloat2(x_lo, x_hi, mask: int, xor: int) -> Uint32:
    """bf16x2 of :func:`lop3_hash_pair_to_half2`: each value is the fp16 sum (``add.rn.f16``, the
    same single rounding), widened exactly to fp32 and rounded once to bf16 — no fp16 pack."""
    text = (
        "{ .reg .b32 h0, h1; .reg .b16 a0, a1, b0, b1, r0, r1; .reg .f32 f0, f1;\n"
        f"lop3.b32 h0, $1, {mask:#010x}, {xor:#010x}, 0x6a;\n"
        f"lop3.b32 h1, $2, {mask:#010x}, {xor:#010x}, 0x6a;\n"
        "mov.b32 {a0, a1}, h0;\n"
        "mov.b32 {b0, b1}, h1;\n"
        "add.rn.f16 r0, a0, a1;\n"
        "add.rn.f16 r1, b0, b1;\n"
        "cvt.f32.f16 f0, r0;\n"
        "cvt.f32.f16 f1, r1;\n"
        "cvt.rn.bf16x2.f32 $0, f1, f0; }"
    )
    return asm_u32(text, x_lo, x_hi)


def dp4a_bytesum(x, base: int) -> Uint32:
    """``base + sum of the four bytes of x`` (dp4a.u32.u32 with 0x01010101)."""
    return asm_u32(f"dp4a.u32.u32 $0, $1, 0x01010101, {base:#x};", x)


def pack_lo16(lo, hi) -> Uint32:
    """``(hi & 0xFFFF) << 16 | (lo & 0xFFFF)`` with one prmt."""
    return asm_u32("prmt.b32 $0, $1, $2, 0x5410;", lo, hi)


def e4m3x2_to_half2(byte_lo, byte_hi) -> Uint32:
    """Two E4M3FN bytes (each in the low 8 bits of a u32) to an exact half2.

    ``(byte & 0x7F) << 7`` read as fp16 is the E4M3 value times 2^-8 (normals and subnormals
    alike), so one exact ``mul.rn.f16x2`` by 256 restores it; the sign bit moves to bit 15.
    Works on every arch (no ``cvt.e4m3x2`` needed). NaN codes are never produced by the tables.
    """
    text = (
        "{ .reg .b32 p, m, s, k;\n"
        "prmt.b32 p, $1, $2, 0x5410;\n"
        "and.b32 m, p, 0x007f007f;\n"
        "shl.b32 m, m, 7;\n"
        "and.b32 s, p, 0x00800080;\n"
        "shl.b32 s, s, 8;\n"
        "or.b32 m, m, s;\n"
        "mov.b32 k, 0x5c005c00;\n"
        "mul.rn.f16x2 $0, m, k; }"
    )
    return asm_u32(text, byte_lo, byte_hi)


def half2_to_bfloat2(h2) -> Uint32:
    """Round a packed half2 to a packed bf16x2 (via exact fp32, one RN rounding each)."""
    text = (
        "{ .reg .b16 l, h; .reg .f32 fl, fh;\n"
        "mov.b32 {l, h}, $1;\n"
        "cvt.f32.f16 fl, l;\n"
        "cvt.f32.f16 fh, h;\n"
        "cvt.rn.bf16x2.f32 $0, fh, fl; }"
    )
    return asm_u32(text, h2)


@dsl_user_op
def ld_global_nc_u8(addr, loc=None, ip=None) -> Uint32:
    """Zero-extended byte at global address ``addr`` (read-only path)."""
    a = Int64(addr).ir_value(loc=loc, ip=ip)
    text = "{ .reg .b16 v; ld.global.nc.u8 v, [$1]; cvt.u32.u16 $0, v; }"
    return Uint32(_asm(T.i32(), [a], text, "=r,l", loc, ip))


@dsl_user_op
def ld_global_nc_u32(addr, loc=None, ip=None) -> Uint32:
    """u32 at global address ``addr`` (read-only path, 4-byte aligned)."""
    a = Int64(addr).ir_value(loc=loc, ip=ip)
    return Uint32(_asm(T.i32(), [a], "ld.global.nc.u32 $0, [$1];", "=r,l", loc, ip))


@dsl_user_op
def ld_shared_u8(addr, loc=None, ip=None) -> Uint32:
    """Zero-extended byte at 32-bit shared-window address ``addr``."""
    a = Uint32(addr).ir_value(loc=loc, ip=ip)
    text = "{ .reg .b16 v; ld.shared.u8 v, [$1]; cvt.u32.u16 $0, v; }"
    return Uint32(_asm(T.i32(), [a], text, "=r,r", loc, ip))


def d3l_fma_half(desc, x) -> Uint32:
    """D3L magnitude: ``fma.rn.f16(slope, fp16(x), base)`` with desc = base | slope << 16.

    Returns the fp16 bits in the low half of a u32 (high half zero).
    """
    text = (
        "{ .reg .b16 b, s, xh, r;\n"
        "mov.b32 {b, s}, $1;\n"
        "cvt.rn.f16.u32 xh, $2;\n"
        "fma.rn.f16 r, s, xh, b;\n"
        "cvt.u32.u16 $0, r; }"
    )
    return asm_u32(text, desc, x)


def bfind_u32(v) -> Uint32:
    """Index of the most significant set bit of ``v`` (0xFFFFFFFF for v == 0)."""
    return asm_u32("bfind.u32 $0, $1;", v)


def brev_u32(v) -> Uint32:
    return asm_u32("brev.b32 $0, $1;", v)


def f32x2_to_half2(lo, hi) -> Uint32:
    """Pack two fp32 values into a half2 with RN rounding (``lo`` in the low half)."""
    return _f32x2_pack("cvt.rn.f16x2.f32 $0, $2, $1;", lo, hi)


def f32x2_to_bfloat2(lo, hi) -> Uint32:
    """Pack two fp32 values into a bf16x2 with RN rounding (``lo`` in the low half)."""
    return _f32x2_pack("cvt.rn.bf16x2.f32 $0, $2, $1;", lo, hi)


@dsl_user_op
def _f32x2_pack(text: str, lo, hi, loc=None, ip=None) -> Uint32:
    ops = [Float32(lo).ir_value(loc=loc, ip=ip), Float32(hi).ir_value(loc=loc, ip=ip)]
    return Uint32(_asm(T.i32(), ops, text, "=r,f,f", loc, ip))


@dsl_user_op
def mma_m16n8k16(a, b, c, *, bf16: bool, loc=None, ip=None):
    """One ``mma.sync.aligned.m16n8k16.row.col.f32.{f16|bf16}`` with fp32 accumulators.

    ``a``: 4 u32 (A fragment), ``b``: 2 u32 (B fragment), ``c``: 4 fp32. Returns 4 Float32.
    """
    kind = "bf16" if bf16 else "f16"
    text = (
        f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
    )
    operands = _u32_values(list(a) + list(b), loc, ip)
    operands += [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    struct = llvm.StructType.get_literal([T.f32()] * 4)
    res = _asm(struct, operands, text, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3", loc, ip)
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def u32_as_f32(bits, loc=None, ip=None) -> Float32:
    """Reinterpret the bits of a u32 as fp32."""
    return Float32(llvm.bitcast(T.f32(), Uint32(bits).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def f32_as_u32(value, loc=None, ip=None) -> Uint32:
    """The bits of an fp32 value as a u32 (a bitcast, no conversion)."""
    return Uint32(llvm.bitcast(T.i32(), Float32(value).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def shf_r_clamp(lo, hi, shift) -> Uint32:
    """Low 32 bits of ``(hi:lo) >> min(shift, 32)``."""
    return asm_u32("shf.r.clamp.b32 $0, $1, $2, $3;", lo, hi, shift)


def shf_r_imm(lo, hi, shift: int) -> Uint32:
    """Low 32 bits of ``(hi:lo) >> shift`` for a constant ``0 < shift < 32`` (one SHF)."""
    if not 0 < shift < 32:
        raise ValueError(f"shift: expected 1..31, got {shift}")
    return asm_u32(f"shf.r.clamp.b32 $0, $1, $2, {shift};", lo, hi)


def shr_clamp(x, shift) -> Uint32:
    """``x >> min(shift, 32)`` for a run-time shift (PTX ``shr`` clamps; LLVM's would be poison)."""
    return asm_u32("shr.b32 $0, $1, $2;", x, shift)


def bfe16(x, pos: int) -> Uint32:
    """``(x >> pos) & 0xFFFF`` for a constant ``pos`` (pos + 16 <= 32)."""
    if pos == 0:
        return Uint32(x) & Uint32(0xFFFF)
    if pos == 16:
        return Uint32(x) >> Uint32(16)
    return asm_u32(f"bfe.u32 $0, $1, {pos}, 16;", x)


#: ``prmt`` selector of :func:`cut16` at bit 8: result bytes = (x.b1, x.b2, 0, 0), where nibble
#: value 4 names byte 0 of the zero second operand.
PRMT_CUT8 = 0x4421


def cut16(x, pos: int) -> Uint32:
    """``(x >> pos) & 0xFFFF``: one instruction for pos 0 (and), 8 (prmt with zero bytes) and
    16 (shr); a ``bfe`` (two instructions on sm_90) elsewhere."""
    if pos == 8:
        return asm_u32(f"prmt.b32 $0, $1, 0, {PRMT_CUT8:#06x};", x)
    return bfe16(x, pos)


@dsl_user_op
def ld_global_nc_u32_imm(addr, offset: int, loc=None, ip=None) -> Uint32:
    """u32 at global address ``addr + offset`` (``offset`` a constant byte immediate)."""
    a = Int64(addr).ir_value(loc=loc, ip=ip)
    return Uint32(_asm(T.i32(), [a], f"ld.global.nc.u32 $0, [$1+{offset}];", "=r,l", loc, ip))


def _asm_void(operands, text, constraints, loc, ip):
    llvm.inline_asm(
        None,
        operands,
        text,
        constraints,
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_shared_u16(addr, value, loc=None, ip=None) -> None:
    """Store the low 16 bits of ``value`` at 32-bit shared address ``addr``."""
    ops = _u32_values([addr, value], loc, ip)
    text = "{ .reg .b16 t; cvt.u16.u32 t, $1; st.shared.u16 [$0], t; }"
    _asm_void(ops, text, "r,r,~{memory}", loc, ip)


@dsl_user_op
def st_shared_u32(addr, value, loc=None, ip=None) -> None:
    """Store the u32 ``value`` at 32-bit shared address ``addr``."""
    ops = _u32_values([addr, value], loc, ip)
    _asm_void(ops, "st.shared.u32 [$0], $1;", "r,r,~{memory}", loc, ip)


def _asm_u32s(count: int, operands, text: str, constraints: str, side_effects: bool, loc, ip):
    """``count`` u32 results of one inline-asm statement (``$0 .. $count-1``)."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * count),
        operands,
        text,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )
    return tuple(Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(count))


@dsl_user_op
def ld_shared_v4(addr, offset: int = 0, loc=None, ip=None) -> tuple:
    """Four u32 from 16-byte-aligned shared address ``addr + offset`` (``offset`` a constant
    byte immediate)."""
    text = f"ld.shared.v4.u32 {{$0, $1, $2, $3}}, [$4+{offset}];"
    constraints = "=r,=r,=r,=r,r,~{memory}"
    return _asm_u32s(4, _u32_values([addr], loc, ip), text, constraints, True, loc, ip)


@dsl_user_op
def st_shared_v4(addr, values, offset: int = 0, loc=None, ip=None) -> None:
    """Store four u32 at 16-byte-aligned shared address ``addr + offset`` (``offset`` a
    constant byte immediate)."""
    ops = _u32_values([addr] + list(values), loc, ip)
    text = f"st.shared.v4.u32 [$0+{offset}], {{$1, $2, $3, $4}};"
    _asm_void(ops, text, "r,r,r,r,r,~{memory}", loc, ip)


@dsl_user_op
def st_global_v4(addr, values, loc=None, ip=None) -> None:
    """Store four u32 at 16-byte-aligned global address ``addr``."""
    ops = [Int64(addr).ir_value(loc=loc, ip=ip)] + _u32_values(list(values), loc, ip)
    _asm_void(ops, "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r,~{memory}", loc, ip)


@dsl_user_op
def ld_global_v2_u32(addr, offset: int = 0, loc=None, ip=None) -> tuple:
    """Two u32 at 8-byte-aligned global address ``addr + offset`` (``offset`` a constant byte
    immediate): an ordinary coherent load (not ``.nc``), so an in-place kernel may read what it
    later overwrites."""
    operands = [Int64(addr).ir_value(loc=loc, ip=ip)]
    text = f"ld.global.v2.u32 {{$0, $1}}, [$2+{offset}];"
    return _asm_u32s(2, operands, text, "=r,=r,l", False, loc, ip)


@dsl_user_op
def st_global_v2_u32(addr, values, offset: int = 0, loc=None, ip=None) -> None:
    """Store two u32 at 8-byte-aligned global address ``addr + offset`` (``offset`` a constant
    byte immediate)."""
    ops = [Int64(addr).ir_value(loc=loc, ip=ip)] + _u32_values(list(values), loc, ip)
    _asm_void(ops, f"st.global.v2.u32 [$0+{offset}], {{$1, $2}};", "l,r,r,~{memory}", loc, ip)


@dsl_user_op
def cp_async_16(
    dst,
    src,
    src_size,
    *,
    dst_offset: int = 0,
    cache_global: bool = True,
    enable=None,
    loc=None,
    ip=None,
) -> None:
    """``cp.async.{cg|ca}.shared.global [dst + dst_offset], [src], 16, src_size`` (sm_80+).

    Copies 16 bytes from global ``src`` (16-byte aligned) to the 32-bit shared-window address
    ``dst + dst_offset`` (16-byte aligned; ``dst_offset`` a constant immediate), reading only the
    first ``src_size`` bytes (0 or 16) and zero-filling the rest: ``src_size = 0`` fills zeros
    without touching global memory. ``cache_global`` picks ``.cg`` (L2 only, for streamed data)
    over ``.ca`` (also L1, for data several warps re-read). With ``enable`` (a u32), the copy is
    issued only where it is non-zero (a PTX predicate, no branch). Completion is tracked by
    :func:`cp_async_commit` groups and awaited with :func:`cp_async_wait`.
    """
    level = "cg" if cache_global else "ca"
    ops = [
        Uint32(dst).ir_value(loc=loc, ip=ip),
        Int64(src).ir_value(loc=loc, ip=ip),
        Uint32(src_size).ir_value(loc=loc, ip=ip),
    ]
    copy = f"cp.async.{level}.shared.global [$0+{dst_offset}], [$1], 16, $2;"
    if enable is None:
        _asm_void(ops, copy, "r,l,r,~{memory}", loc, ip)
        return
    ops.append(Uint32(enable).ir_value(loc=loc, ip=ip))
    text = "{ .reg .pred p; setp.ne.u32 p, $3, 0;\n@p " + copy + " }"
    _asm_void(ops, text, "r,l,r,r,~{memory}", loc, ip)


@dsl_user_op
def cp_async_commit(loc=None, ip=None) -> None:
    """``cp.async.commit_group``: close the thread's pending copies into one group."""
    _asm_void([], "cp.async.commit_group;", "~{memory}", loc, ip)


@dsl_user_op
def cp_async_wait(pending: int, loc=None, ip=None) -> None:
    """``cp.async.wait_group pending``: wait until at most ``pending`` of the thread's newest
    groups are incomplete (their copies are then visible to this thread; other threads need a
    barrier after it)."""
    if not 0 <= pending <= 7:
        raise ValueError(f"pending: expected 0..7, got {pending}")
    _asm_void([], f"cp.async.wait_group {pending};", "~{memory}", loc, ip)


@dsl_user_op
def ld_shared_u32_imm(addr, offset: int, loc=None, ip=None) -> Uint32:
    """u32 at 32-bit shared-window address ``addr + offset`` (``offset`` a constant immediate).

    Volatile: it stays between the ``cp.async.wait_group`` / warp barrier that make its slot
    valid and the barrier after which the slot is refilled.
    """
    res = llvm.inline_asm(
        T.i32(),
        _u32_values([addr], loc, ip),
        f"ld.shared.u32 $0, [$1+{offset}];",
        "=r,r,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )
    return Uint32(res)


# ---- cross-CTA hand-off (the stream-K fix-up, :mod:`b12x.kernels.stream_k`): partial sums go
# through L2 only (``.cg``), a flag is raised with release and awaited with acquire semantics at
# GPU scope. All are volatile and clobber memory, so LLVM keeps them in program order.


@dsl_user_op
def st_global_cg_v4_f32(addr, values, offset: int = 0, loc=None, ip=None) -> None:
    """Store four fp32 at 16-byte-aligned global address ``addr + offset`` (``offset`` a
    constant byte immediate), cached in L2 only."""
    ops = [Int64(addr).ir_value(loc=loc, ip=ip)]
    ops += [Float32(v).ir_value(loc=loc, ip=ip) for v in values]
    text = f"st.global.cg.v4.f32 [$0+{offset}], {{$1, $2, $3, $4}};"
    _asm_void(ops, text, "l,f,f,f,f,~{memory}", loc, ip)


@dsl_user_op
def ld_global_cg_v4_f32(addr, offset: int = 0, loc=None, ip=None) -> tuple:
    """Four fp32 at 16-byte-aligned global address ``addr + offset`` (``offset`` a constant
    byte immediate), read from L2 (never a stale L1 line)."""
    struct = llvm.StructType.get_literal([T.f32()] * 4)
    res = llvm.inline_asm(
        struct, [Int64(addr).ir_value(loc=loc, ip=ip)],
        f"ld.global.cg.v4.f32 {{$0, $1, $2, $3}}, [$4+{offset}];", "=f,=f,=f,=f,l,~{memory}",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    )  # fmt: skip
    return tuple(Float32(llvm.extractvalue(T.f32(), res, [j], loc=loc, ip=ip)) for j in range(4))


@dsl_user_op
def fence_acq_rel_gpu(loc=None, ip=None) -> None:
    """``fence.acq_rel.gpu``: this thread's earlier writes are ordered before its later ones
    at GPU scope (the classic thread fence before a flag is raised)."""
    _asm_void([], "fence.acq_rel.gpu;", "~{memory}", loc, ip)


@dsl_user_op
def st_release_gpu_u32(addr, value, loc=None, ip=None) -> None:
    """``st.release.gpu`` of the u32 ``value`` at global address ``addr``."""
    ops = [Int64(addr).ir_value(loc=loc, ip=ip)] + _u32_values([value], loc, ip)
    _asm_void(ops, "st.release.gpu.global.u32 [$0], $1;", "l,r,~{memory}", loc, ip)


@dsl_user_op
def wait_acquire_gpu_u32(addr, value, loc=None, ip=None) -> None:
    """Spin until the u32 at global address ``addr`` equals ``value`` (``ld.acquire.gpu``, a
    short ``nanosleep`` between polls); later reads see what the flag's writer released."""
    ops = [Int64(addr).ir_value(loc=loc, ip=ip)] + _u32_values([value], loc, ip)
    text = (
        "{ .reg .pred done; .reg .u32 got; "
        "SPIN: ld.acquire.gpu.global.u32 got, [$0]; setp.eq.u32 done, got, $1; "
        "@done bra.uni DONE; nanosleep.u32 32; bra.uni SPIN; DONE: }"
    )
    _asm_void(ops, text, "l,r,~{memory}", loc, ip)
