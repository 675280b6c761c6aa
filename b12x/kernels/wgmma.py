"""Hopper warpgroup MMA primitives (sm_90a): ``wgmma.mma_async``, its fences, descriptors, and
the ``stmatrix`` store that writes decoded weights in its operand layout.

Layout:
* **Core matrices.** A ``wgmma`` operand in shared memory without swizzle is a grid of *core
  matrices*: 8 rows x 16 bytes (8 fp16/bf16 along K), each 128 contiguous bytes, row ``i`` at
  ``16·i``. A K16 slab of an M (or N) x 16 operand is two core matrices per 8 rows: the *leading
  byte offset* (LBO) steps one core matrix along K, the *stride byte offset* (SBO) one along M/N.
  Both operands here are K-major (``tnspA = tnspB = 0``) with LBO = 128 and SBO = 256: core matrix
  ``(group, k_half)`` at ``256·group + 128·k_half``.
* **Descriptor** (:func:`descriptor`): a 64-bit word, bits 0-13 the start address / 16, 16-29 LBO /
  16, 32-45 SBO / 16, 62-63 the swizzle mode (0 = none). A shared-window address of an sm_90 CTA is
  below 228 KB, so start / 16 fits 14 bits and a byte offset added to the address field
  (:func:`descriptor_at`, offset / 16 in the low bits) never carries into LBO.
* **Accumulators** of ``m64nNk16`` (f32): per thread ``N/2`` registers; warp ``q`` of the warpgroup
  holds rows ``16q + g`` and ``16q + g + 8``; register ``8·t + 4·nb + c`` is row ``g + 8·(c // 2)``,
  column ``16·t + 8·nb + 2r + c % 2`` (``g = lane // 4``, ``r = lane % 4``): N16 tile ``t``, n-block
  ``nb``, exactly the ``mma.sync.m16n8k16`` C fragment repeated over the tiles, so the per-warp
  kernels' epilogues read it unchanged.
* **stmatrix** (:func:`stmatrix_x4`): lane ``l`` gives the address of row ``l % 8`` of matrix ``l //
  8`` and holds, in register ``j``, row ``l // 4``, columns ``2(l % 4)..+1`` of matrix ``j``: the
  ``mma.sync`` B fragment. A decoded N16 x K16 tile (registers ``(n=g, k=2r)``, ``(g, 2r+8)``,
  ``(g+8, 2r)``, ``(g+8, 2r+8)``) is therefore its four core matrices ``(n-block, k-half)`` in that
  order, 512 contiguous bytes with lane ``l`` addressing ``16·l``.

Ordering: shared memory written by ordinary stores or ``cp.async`` is read by ``wgmma`` through
the async proxy, so the writer runs :func:`fence_proxy_async` before the publishing barrier;
:func:`fence` / :func:`commit` bracket a batch of MMAs and :func:`wait` (at most ``pending`` in
flight) passes the accumulators through; every helper is volatile (kept in program order).
"""

from __future__ import annotations

from cutlass import Float32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from b12x.kernels.shared_layout import WGMMA_MAX_N

__all__ = [
    "CORE_LBO",
    "CORE_SBO",
    "commit",
    "descriptor",
    "descriptor_at",
    "descriptor_swizzle32",
    "fence",
    "fence_proxy_async",
    "mma",
    "mma_rs",
    "stmatrix_x4",
    "wait",
    "wait_in_place",
]

#: Bytes from a core matrix to the next along K (its k-half partner).
CORE_LBO = 128
#: Bytes from a core matrix to the next along M/N (the next 8 rows).
CORE_SBO = 256


def descriptor(smem_addr) -> Int64:
    """The no-swizzle K-major descriptor (LBO :data:`CORE_LBO`, SBO :data:`CORE_SBO`) of the
    operand starting at 32-bit shared-window address ``smem_addr`` (16-byte aligned)."""
    fields = ((CORE_LBO >> 4) << 16) | ((CORE_SBO >> 4) << 32)
    return Int64((Uint32(smem_addr) >> Uint32(4)) & Uint32(0x3FFF)) | Int64(fields)


#: Bytes from one 8-row group of a 32-byte-swizzled K-major operand to the next (8 rows x 32 B).
SWIZZLE32_SBO = 256
#: The descriptor's 2-bit swizzle mode (bits 62-63) for the 32-byte swizzle.
SWIZZLE32_MODE = 3


def descriptor_swizzle32(smem_addr) -> Int64:
    """The K-major descriptor of a 32-byte-swizzled operand at ``smem_addr`` (256-byte aligned):
    row ``i`` is 32 contiguous bytes (one K16 row, the swizzle's width) at ``32·i``, its two
    16-byte halves swapped when bit 2 of ``i`` is set (address bit 4 ^= bit 7), as TMA's
    ``SWIZZLE_32B`` writes it. SBO :data:`SWIZZLE32_SBO` (the next 8 rows); LBO is unused for a
    swizzled K-major operand whose K extent (16) fits the swizzle width (field 1)."""
    fields = (1 << 16) | ((SWIZZLE32_SBO >> 4) << 32) | (SWIZZLE32_MODE << 62)
    fields -= 1 << 64  # the same 64 bits as a signed Int64 (the mode sets bit 63)
    return Int64((Uint32(smem_addr) >> Uint32(4)) & Uint32(0x3FFF)) | Int64(fields)


def descriptor_at(desc, byte_offset: int) -> Int64:
    """``desc`` moved ``byte_offset`` (a 16-byte multiple, a trace-time int) further."""
    if byte_offset % 16:
        raise ValueError(f"byte_offset: {byte_offset} is not a multiple of 16")
    return desc + Int64(byte_offset >> 4) if byte_offset else desc


def _void(text: str, loc, ip) -> None:
    llvm.inline_asm(
        None, [], text, "~{memory}", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    )  # fmt: skip


@dsl_user_op
def fence(loc=None, ip=None) -> None:
    """``wgmma.fence``: the warpgroup's register writes are ordered before its next MMAs."""
    _void("wgmma.fence.sync.aligned;", loc, ip)


@dsl_user_op
def commit(loc=None, ip=None) -> None:
    """``wgmma.commit_group``: the warpgroup's MMAs issued since the last commit form a batch."""
    _void("wgmma.commit_group.sync.aligned;", loc, ip)


@dsl_user_op
def fence_proxy_async(loc=None, ip=None) -> None:
    """``fence.proxy.async.shared::cta``: this thread's shared-memory writes (stores and landed
    ``cp.async``) become visible to the async proxy that ``wgmma`` reads through."""
    _void("fence.proxy.async.shared::cta;", loc, ip)


def _acc_struct(count: int):
    return llvm.StructType.get_literal([T.f32()] * count)


@dsl_user_op
def wait(acc: list, pending: int = 0, loc=None, ip=None) -> list:
    """``wgmma.wait_group pending``, with the accumulators ``acc`` (Float32 values) passed
    through as in/out operands; returns them (use the returned values, not the old ones)."""
    if not 0 <= pending <= 7:
        raise ValueError(f"pending: expected 0..7, got {pending}")
    count = len(acc)
    cons = ",".join(["=f"] * count + [str(i) for i in range(count)]) + ",~{memory}"
    res = llvm.inline_asm(
        _acc_struct(count), [Float32(v).ir_value(loc=loc, ip=ip) for v in acc],
        f"wgmma.wait_group.sync.aligned {pending};", cons, has_side_effects=True,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    )  # fmt: skip
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(count)]


def wait_in_place(acc, count: int, pending: int = 0) -> None:
    """:func:`wait` on the first ``count`` accumulators of the register tensor ``acc``, written
    back in place (the form the mainloops keep their accumulators in)."""
    values = wait([acc[i] for i in range(count)], pending)
    for i in range(count):
        acc[i] = values[i]


@dsl_user_op
def mma(acc: list, desc_a, desc_b, *, n: int, bf16: bool, loc=None, ip=None) -> list:
    """One ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{bf16|f16}``, both operands K-major in
    shared memory (descriptors), accumulating into ``acc`` (``n/2`` Float32, the layout in the
    module docstring); returns the new accumulators (valid after :func:`wait`)."""
    if n % 8 or not 8 <= n <= WGMMA_MAX_N:
        raise ValueError(f"n: expected a multiple of 8 in 8..{WGMMA_MAX_N}, got {n}")
    count = n // 2
    if len(acc) != count:
        raise ValueError(f"acc: m64n{n} needs {count} accumulators, got {len(acc)}")
    kind = "bf16" if bf16 else "f16"
    regs = ", ".join(f"${i}" for i in range(count))
    text = (
        "{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
        f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "
        f"{{{regs}}}, ${count}, ${count + 1}, p, 1, 1, 0, 0; }}"
    )
    cons = ",".join(["=f"] * count + ["l", "l"] + [str(i) for i in range(count)]) + ",~{memory}"
    operands = [Int64(desc_a).ir_value(loc=loc, ip=ip), Int64(desc_b).ir_value(loc=loc, ip=ip)]
    operands += [Float32(v).ir_value(loc=loc, ip=ip) for v in acc]
    res = llvm.inline_asm(
        _acc_struct(count), operands, text, cons, has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    )  # fmt: skip
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(count)]


@dsl_user_op
def mma_rs(acc: list, a_regs: list, desc_b, *, n: int, bf16: bool, loc=None, ip=None) -> list:
    """One ``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{bf16|f16}`` with A from registers
    (``a_regs``: the lane's four packed words, the ``mma.sync.m16n8k16`` A fragment order
    ``(g, 2r), (g + 8, 2r), (g, 2r + 8), (g + 8, 2r + 8)`` of its warp's 16 rows) and B K-major
    in shared memory (``desc_b``), accumulating into ``acc`` (``n/2`` Float32, the layout in the
    module docstring). The A registers must not be rewritten until :func:`wait` has retired this
    MMA (ptxas keeps them live until then, or serializes and says so: remark C7510/C7520)."""
    if n % 8 or not 8 <= n <= WGMMA_MAX_N:
        raise ValueError(f"n: expected a multiple of 8 in 8..{WGMMA_MAX_N}, got {n}")
    count = n // 2
    if len(acc) != count:
        raise ValueError(f"acc: m64n{n} needs {count} accumulators, got {len(acc)}")
    if len(a_regs) != 4:
        raise ValueError(f"a_regs: the register A fragment is 4 words, got {len(a_regs)}")
    kind = "bf16" if bf16 else "f16"
    regs = ", ".join(f"${i}" for i in range(count))
    a_ops = ", ".join(f"${count + i}" for i in range(4))
    text = (
        "{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
        f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "
        f"{{{regs}}}, {{{a_ops}}}, ${count + 4}, p, 1, 1, 0; }}"
    )
    cons = ",".join(["=f"] * count + ["r"] * 4 + ["l"] + [str(i) for i in range(count)])
    operands = [Uint32(v).ir_value(loc=loc, ip=ip) for v in a_regs]
    operands += [Int64(desc_b).ir_value(loc=loc, ip=ip)]
    operands += [Float32(v).ir_value(loc=loc, ip=ip) for v in acc]
    res = llvm.inline_asm(
        _acc_struct(count), operands, text, cons + ",~{memory}", has_side_effects=True,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    )  # fmt: skip
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(count)]


@dsl_user_op
def stmatrix_x4(addr, regs, offset: int = 0, loc=None, ip=None) -> None:
    """``stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr + offset], regs``: four 8x8 b16
    matrices (module docstring, "stmatrix"); ``addr`` is the lane's row address (32-bit shared
    window), ``offset`` a constant immediate."""
    ops = [Uint32(v).ir_value(loc=loc, ip=ip) for v in [addr, *regs]]
    text = f"stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0+{offset}], {{$1, $2, $3, $4}};"
    llvm.inline_asm(
        None, ops, text, "r,r,r,r,r,~{memory}", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    )  # fmt: skip
