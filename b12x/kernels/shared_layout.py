"""Shared-memory layout of the dense GEMM's shared-decode mainloop (pure Python, no cutlass).

The kernel (:mod:`b12x.kernels.dense_gemm`, "Shared decode"), the launch spec
(:mod:`b12x.launch.specs`) and the plan (:mod:`b12x.ops.dense.mainloop`) all read the geometry
rules and byte counts from here, so that a geometry the kernel would refuse is refused by the
spec and never planned. Importing this module loads only the standard library.

Layout (bytes, per CTA)
-----------------------
``smem_stages`` cp.async slots, each ``shared_rows`` K16 rows: first every row's payload run
(``row_pay = cta_tiles·32·bits``: the CTA's ``cta_tiles = n_tiles·warps`` N16 tiles of the row,
contiguous in global memory), then every row's activation region (``row_a = cta_m/16`` blocks
of :data:`A_BLOCK_BYTES`, ``cta_m = 16·m_tiles·m_warps`` rows); after the slots, two fragment
buffers of ``shared_rows·cta_tiles`` decoded tiles (:data:`FRAG_TILE_BYTES` each: 32 lanes x
four B registers). Slots and buffers must fit :data:`SMEM_LIMIT`. A grouped GEMM whose K is
summed in slices (the MoE's fixed fold order) appends the fold region: per thread its partial
sums, as 16-byte groups ``q`` at ``fold_offset + (q·threads + tid)·16`` (a warp's 32 lanes write
512 contiguous bytes per group, conflict-free).
"""

from __future__ import annotations

import dataclasses
import math

__all__ = [
    "A_BLOCK_BYTES",
    "FRAG_TILE_BYTES",
    "SHARED_ROWS",
    "SMEM_LIMIT",
    "SLOT_CHOICES",
    "SharedDecodeLayout",
    "WARPGROUP",
    "WGMMA_CAPABILITY",
    "WGMMA_SMEM_LIMIT",
    "WGMMA_MAX_N",
    "check_shared_decode",
    "check_wgmma",
    "check_wgmma_geometry",
    "check_dense_mainloop",
    "check_swap_ab",
    "swap_ab_layout",
    "SMEM_STAGES",
    "SWAP_MAX_ACCUMULATORS",
    "SWAP_STAGES",
    "SWAP_CLUSTERS",
    "TOKEN_TILE_ALIGN",
    "helper_registers",
    "fitting_slots",
    "fold_bytes",
    "shared_decode_layout",
]

#: Shared memory per CTA the ring may use: the 48 KB a launch gets without the opt-in attribute
#: (an sm_90 SM has 228 KB, sm_120 100 KB). The headline tile needs 12-16 KB, so the ring never
#: limits occupancy before registers do (8 CTAs of 4 warps at 64 registers).
SMEM_LIMIT = 48 * 1024
#: Shared memory per CTA a ``wgmma`` geometry may use: the 227 KB an sm_90 launch may opt in to
#: (the only arch it runs on; the launch asks for it).
WGMMA_SMEM_LIMIT = 227 * 1024
#: Bytes of one M16 block's A rows in one K16 row: 16 rows x 32 B.
A_BLOCK_BYTES = 16 * 32
#: Bytes of one decoded N16 x K16 tile in shared memory: 32 lanes x four B registers.
FRAG_TILE_BYTES = 32 * 16
#: Legal ``smem_stages`` of the dense GEMM outside the swap-AB mainloop: 0 = the per-warp
#: register stages, else the cp.async slots of its ring or of the shared decode (a one-slot
#: ring could not overlap a copy with a decode).
SMEM_STAGES = (0, 2, 3, 4)
#: Legal ``shared_rows`` (K16 rows decoded per barrier) of the shared-decode mainloop.
SHARED_ROWS = (1, 2, 4)
#: ``(shared_rows, smem_stages)`` in order of preference.
#: Chosen by measurement: docs/evidence/dense-shared-decode-slots.md
SLOT_CHOICES = ((2, 3), (1, 4))


def check_shared_decode(*, warps: int, m_warps: int, rows: int, smem_stages: int) -> None:
    """Validate the shared-decode geometry: ``m_warps`` 0 (off) or a divisor of ``warps``;
    ``rows`` one of :data:`SHARED_ROWS`; with ``m_warps`` on, ``smem_stages`` (its cp.async
    slots) 3..4. Raises ``ValueError`` naming the field."""
    if isinstance(m_warps, bool) or not isinstance(m_warps, int) or m_warps < 0:
        raise ValueError(f"m_warps: expected an int >= 0, got {m_warps!r}")
    if m_warps and warps % m_warps:
        raise ValueError(f"m_warps: {m_warps} does not divide warps={warps}")
    if isinstance(rows, bool) or rows not in SHARED_ROWS:
        raise ValueError(f"shared_rows: expected one of {SHARED_ROWS}, got {rows!r}")
    if m_warps and smem_stages < 3:
        raise ValueError(
            f"smem_stages: the shared-decode mainloop needs 3..4 cp.async slots, got {smem_stages}"
        )


#: Warps of one warpgroup (the unit that issues a Hopper ``wgmma``).
WARPGROUP = 4
#: The only capability with ``wgmma`` (sm_90; it compiles for the arch-specific sm_90a).
WGMMA_CAPABILITY = (9, 0)
#: Largest N of one fp16/bf16 ``wgmma`` (a multiple of 8).
WGMMA_MAX_N = 256


def check_wgmma(wgmma, *, n_tiles: int, warps: int, m_warps: int, helpers: bool = False) -> None:
    """Validate the ``wgmma`` flag (a bool) and, when set, its shared-decode geometry
    (:mod:`b12x.kernels.wgmma_decode`, "Geometry"); ``ValueError`` naming the field. The one rule
    the specs, the launcher and the kernels apply. ``helpers``: the caller's kernel runs
    decode-only helper warps (``m_warps < warps``; the dense GEMM does, the MoE GEMM does not)."""
    if not isinstance(wgmma, bool):
        raise ValueError(f"wgmma: expected a bool, got {wgmma!r}")
    if wgmma:
        check_wgmma_geometry(n_tiles=n_tiles, warps=warps, m_warps=m_warps, helpers=helpers)


def check_wgmma_geometry(*, n_tiles: int, warps: int, m_warps: int, helpers: bool = False) -> None:
    """Validate a ``wgmma`` shared-decode geometry (:mod:`b12x.kernels.wgmma_decode`, "Geometry");
    ``ValueError`` naming the field. Every warp decodes; the first ``m_warps`` (whole
    warpgroups) also multiply, the rest are decode-only helpers (only where ``helpers``)."""
    if warps % WARPGROUP:
        raise ValueError(f"warps: the wgmma mainloop needs whole warpgroups of 4, got {warps}")
    if not helpers and m_warps != warps:
        raise ValueError(f"m_warps: every warp multiplies in this wgmma mainloop ({warps}), got "
                         f"{m_warps}")  # fmt: skip
    if m_warps % WARPGROUP or not WARPGROUP <= m_warps <= warps:
        raise ValueError(
            f"m_warps: the warps that multiply with wgmma are whole warpgroups of 4 among the "
            f"{warps}, got {m_warps}"
        )
    if 16 * n_tiles * warps > WGMMA_MAX_N:
        raise ValueError(
            f"n_tiles: one wgmma covers at most {WGMMA_MAX_N} columns, "
            f"{n_tiles} x {warps} warps x 16 = {16 * n_tiles * warps}"
        )
    if m_warps < warps:
        helper_registers(warps=warps, m_warps=m_warps)  # the register split must exist


#: Registers per SM (sm_90) that one CTA of a helper geometry divides between its warps.
SM_REGISTERS = 64 * 1024
#: Registers a multiplying thread asks for in a helper geometry (``setmaxnreg.inc``): the
#: 128 fp32 accumulators of one m64n256 ``wgmma`` plus its decode (the all-multiplying 128 x 256
#: geometry compiles to 180 without a cap).
MMA_THREAD_REGISTERS = 184
#: Fewest registers a decode-only helper thread may be left with (``setmaxnreg`` minimum).
MIN_HELPER_REGISTERS = 24


def helper_registers(*, warps: int, m_warps: int) -> tuple[int, int]:
    """``(mma, helper)``: the per-thread register counts a helper geometry's multiplying and
    decode-only warps set with ``setmaxnreg`` (multiples of 8, ``mma`` =
    :data:`MMA_THREAD_REGISTERS`, the helpers share what one CTA per SM leaves, at most 256).
    ``ValueError`` when the helpers would get fewer than :data:`MIN_HELPER_REGISTERS`."""
    per_lane = SM_REGISTERS // 32  # registers of one lane position across the SM's warps
    launch = per_lane // warps // 8 * 8  # what every thread starts with (the launch's cap)
    left = per_lane - m_warps * MMA_THREAD_REGISTERS
    helper = min(256, (left // (warps - m_warps)) // 8 * 8)
    if helper < MIN_HELPER_REGISTERS:
        raise ValueError(
            f"warps: {warps - m_warps} helper warps beside {m_warps} multiplying ones get "
            f"{helper} registers per thread, fewer than {MIN_HELPER_REGISTERS}"
        )
    if not helper <= launch <= MMA_THREAD_REGISTERS:
        raise ValueError(
            f"warps: {warps} warps start with {launch} registers per thread; setmaxnreg can "
            f"only raise the multiplying warps to {MMA_THREAD_REGISTERS} and lower the helpers "
            f"to {helper} from there"
        )
    return MMA_THREAD_REGISTERS, helper


@dataclasses.dataclass(frozen=True)
class SharedDecodeLayout:
    """Byte layout of the shared-decode mainloop's shared memory (module docstring).

    ``smem_stages`` slots, each ``shared_rows`` K16 rows: first every row's payload run
    (``row_pay = cta_tiles·32b`` B), then every row's A region (``row_a = cta_m/16`` blocks of
    :data:`A_BLOCK_BYTES`); then two fragment buffers of ``frag_bytes`` (``shared_rows·cta_tiles``
    decoded tiles of :data:`FRAG_TILE_BYTES`) at ``frag_offset``. ``a_offset`` is the A regions'
    offset inside a slot; ``period = lcm(smem_stages, 2)`` steps make one unrolled loop body
    (slot and buffer indices are immediates); ``*_chunks`` / ``*_rounds`` are a K16 row's 16-byte
    copies and the copy rounds of ``32·warps`` threads they take.
    """

    cta_tiles: int
    mma_tiles: int
    cta_m: int
    row_pay: int
    row_a: int
    a_offset: int
    slot_bytes: int
    frag_offset: int
    frag_bytes: int
    period: int
    total: int
    pay_chunks: int
    pay_rounds: int
    a_chunks: int
    a_rounds: int
    fold_offset: int = 0
    fold_bytes: int = 0
    barrier_offset: int = 0


def shared_decode_layout(
    *,
    bits: int,
    m_tiles: int,
    n_tiles: int,
    warps: int,
    m_warps: int,
    rows: int,
    stages: int,
    fold: bool = False,
) -> SharedDecodeLayout:
    """The :class:`SharedDecodeLayout` of one shared-decode geometry (``fold``: with the K-slice
    fold's partial sums, :func:`fold_bytes`, after the fragment buffers)."""
    threads = 32 * warps
    cta_tiles = n_tiles * warps
    cta_m = 16 * m_tiles * m_warps
    row_pay = cta_tiles * 32 * bits
    row_a = (cta_m // 16) * A_BLOCK_BYTES
    slot = rows * (row_pay + row_a)
    frag_offset = stages * slot
    frag_bytes = rows * cta_tiles * FRAG_TILE_BYTES
    pay_chunks = row_pay // 16
    a_chunks = 2 * cta_m
    fold_at = frag_offset + 2 * frag_bytes
    folded = (
        fold_bytes(m_tiles=m_tiles, n_tiles=n_tiles, warps=warps, m_warps=m_warps) if fold else 0
    )
    return SharedDecodeLayout(
        cta_tiles=cta_tiles, mma_tiles=n_tiles * m_warps, cta_m=cta_m, row_pay=row_pay,
        row_a=row_a, a_offset=rows * row_pay, slot_bytes=slot, frag_offset=frag_offset,
        frag_bytes=frag_bytes, period=math.lcm(stages, 2), total=fold_at + folded,
        pay_chunks=pay_chunks,
        pay_rounds=-(-pay_chunks // threads), a_chunks=a_chunks,
        a_rounds=-(-a_chunks // threads), fold_offset=fold_at, fold_bytes=folded,
    )  # fmt: skip


def fold_bytes(*, m_tiles: int, n_tiles: int, warps: int, m_warps: int) -> int:
    """Shared memory of the K-slice fold: every thread's ``m_tiles·mma_tiles·8`` fp32 partial
    sums (``mma_tiles = n_tiles·m_warps``), 64 KB for the 128 x 128 CTA of 8 warps. Past the
    48 KB a launch gets without opting in, so only a device that grants it may plan a fold."""
    return m_tiles * n_tiles * m_warps * 8 * 4 * 32 * warps


def fitting_slots(*, bits: int, m_tiles: int, n_tiles: int, warps: int, m_warps: int):
    """``(shared_rows, smem_stages)``: the first of :data:`SLOT_CHOICES` whose layout fits
    :data:`SMEM_LIMIT` at ``bits`` (2 x 3 up to K5, 1 x 4 from K6 for the 128 x 128 CTA);
    ``ValueError`` when none does."""
    for rows, stages in SLOT_CHOICES:
        need = shared_decode_layout(
            bits=bits, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps, m_warps=m_warps, rows=rows,
            stages=stages,
        ).total  # fmt: skip
        if need <= SMEM_LIMIT:
            return rows, stages
    raise ValueError(
        f"bits: no slot shape of {SLOT_CHOICES} fits K{bits} in {SMEM_LIMIT} B "
        f"(m_tiles={m_tiles}, n_tiles={n_tiles}, warps={warps}, m_warps={m_warps})"
    )


#: Most fp32 accumulators one thread of the swap-AB geometry holds: ``n_tiles`` m64 MMAs of
#: ``16·m_tiles`` token columns, ``n_tiles·8·m_tiles`` registers (one m64n256 set).
SWAP_MAX_ACCUMULATORS = 128
#: Legal cp.async slot counts of the swap-AB mainloop (:mod:`b12x.kernels.wgmma_swap`): a step's
#: copies are committed ``stages - 2`` steps before the barrier that needs them.
SWAP_STAGES = (4, 5, 6, 7, 8)
#: CTAs of a swap-AB cluster along N: 1 = each CTA copies its own tokens (cp.async); 2 or 4 = the
#: cluster's CTAs share one token tile, each copying ``1/cluster`` of it by TMA multicast into
#: every CTA of the cluster (:mod:`b12x.kernels.wgmma_swap`, "Token sharing").
SWAP_CLUSTERS = (1, 2, 4)
#: Alignment of the swap-AB token tiles under TMA: the 32-byte swizzle repeats every 256 B, and
#: TMA and ``wgmma`` both derive it from the address bits.
TOKEN_TILE_ALIGN = 1024


def swap_ab_layout(*, bits: int, m_tiles: int, n_tiles: int, warps: int, rows: int,
                   stages: int, cluster: int = 1) -> SharedDecodeLayout:  # fmt: skip
    """The :class:`SharedDecodeLayout` of a swap-AB geometry (:mod:`b12x.kernels.wgmma_swap`).

    ``cluster`` 1: ``stages`` slots of ``rows`` K16 rows, each row the CTA's payload run
    (``cta_tiles = n_tiles·warps`` N16 tiles) then its ``cta_m = 16·m_tiles`` token rows in
    core matrices (``32·cta_m`` B), all copied by cp.async; no fragment buffers (the weights
    are decoded into registers).

    ``cluster`` 2 or 4 (tokens shared by the cluster through TMA multicast): a slot holds only
    the payload runs (``slot_bytes = rows·row_pay``); the token tiles follow at ``a_offset``
    (:data:`TOKEN_TILE_ALIGN`-aligned), one ``32·cta_m``-byte tile per (slot, row) at
    ``a_offset + (slot·rows + row)·row_a`` (token ``i`` at ``32·i``, 32-byte swizzled); then the
    slots' 8-byte full mbarriers at ``barrier_offset`` and their empty mbarriers after them.
    ``total`` adds :data:`TOKEN_TILE_ALIGN` bytes of slack, so that the kernel can align the
    base the offsets are counted from. ``a_chunks = 0``: no thread copies tokens.
    """
    threads = 32 * warps
    cta_tiles = n_tiles * warps
    cta_m = 16 * m_tiles
    row_pay = cta_tiles * 32 * bits
    row_a = 32 * cta_m
    pay_chunks = row_pay // 16
    if cluster == 1:
        slot = rows * (row_pay + row_a)
        a_offset, total, barrier_offset, a_chunks = rows * row_pay, stages * slot, 0, 2 * cta_m
    else:
        slot = rows * row_pay
        a_offset = -(-stages * slot // TOKEN_TILE_ALIGN) * TOKEN_TILE_ALIGN
        barrier_offset = a_offset + stages * rows * row_a
        total, a_chunks = barrier_offset + 16 * stages + TOKEN_TILE_ALIGN, 0
    return SharedDecodeLayout(
        cta_tiles=cta_tiles, mma_tiles=n_tiles, cta_m=cta_m, row_pay=row_pay, row_a=row_a,
        a_offset=a_offset, slot_bytes=slot, frag_offset=stages * slot, frag_bytes=0,
        period=math.lcm(stages, 2), total=total, pay_chunks=pay_chunks,
        pay_rounds=-(-pay_chunks // threads), a_chunks=a_chunks,
        a_rounds=-(-a_chunks // threads), barrier_offset=barrier_offset,
    )  # fmt: skip


def check_swap_ab(
    swap_ab, *, wgmma, bits: int, m_tiles: int, n_tiles: int, warps: int, m_warps: int,
    rows: int, stages: int, cluster: int = 1,
) -> None:  # fmt: skip
    """Validate the ``swap_ab`` flag (a bool) and, when set, its geometry
    (:mod:`b12x.kernels.wgmma_swap`; its shared memory at ``bits``, skipped when ``bits`` is
    None); ``ValueError`` naming the field. The one rule the spec, the launcher and the kernel
    apply."""
    if not isinstance(swap_ab, bool):
        raise ValueError(f"swap_ab: expected a bool, got {swap_ab!r}")
    if isinstance(cluster, bool) or cluster not in SWAP_CLUSTERS:
        raise ValueError(f"cluster: expected one of {SWAP_CLUSTERS}, got {cluster!r}")
    if not swap_ab:
        if cluster != 1:
            raise ValueError("cluster: only the swap-AB mainloop shares tokens across a cluster")
        return
    if wgmma is not True:
        raise ValueError("wgmma: the swap-AB mainloop multiplies with wgmma; pass wgmma=True")
    if warps % WARPGROUP or m_warps != warps:
        raise ValueError(
            f"m_warps: every warp of the swap-AB mainloop decodes and multiplies in whole "
            f"warpgroups (m_warps == warps, a multiple of 4), got warps={warps}, m_warps={m_warps}"
        )
    if not 1 <= m_tiles <= WGMMA_MAX_N // 16:
        raise ValueError(
            f"tiles: the swap-AB CTA's 16·m_tiles token rows are one wgmma's N (<= "
            f"{WGMMA_MAX_N}), got m_tiles={m_tiles}"
        )
    if 8 * n_tiles * m_tiles > SWAP_MAX_ACCUMULATORS:
        raise ValueError(
            f"tiles: {n_tiles} x {16 * m_tiles} tokens need {8 * n_tiles * m_tiles} accumulators "
            f"per thread, more than {SWAP_MAX_ACCUMULATORS}"
        )
    if isinstance(rows, bool) or rows not in SHARED_ROWS:
        raise ValueError(f"shared_rows: expected one of {SHARED_ROWS}, got {rows!r}")
    if isinstance(stages, bool) or stages not in SWAP_STAGES:
        raise ValueError(f"smem_stages: the swap-AB mainloop takes one of {SWAP_STAGES}, got "
                         f"{stages!r}")  # fmt: skip
    if (16 * m_tiles // cluster) % 8:
        raise ValueError(
            f"cluster: each of the {cluster} CTAs copies 16·m_tiles / cluster tokens, a multiple "
            f"of 8 (one swizzle atom), got m_tiles={m_tiles}"
        )
    if bits is None:
        return
    need = swap_ab_layout(
        bits=bits,
        m_tiles=m_tiles,
        n_tiles=n_tiles,
        warps=warps,
        rows=rows,
        stages=stages,
        cluster=cluster,
    ).total
    if need > WGMMA_SMEM_LIMIT:
        raise ValueError(
            f"smem_stages: {stages} slots of {rows} K16 rows need {need} B of shared memory "
            f"(limit {WGMMA_SMEM_LIMIT})"
        )


def check_dense_mainloop(
    *, swap_ab, wgmma, bits: int | None, m_tiles: int, n_tiles: int, warps: int, m_warps: int,
    rows: int, stages: int, cluster: int = 1,
) -> None:  # fmt: skip
    """Validate the dense GEMM's mainloop options together: the swap-AB geometry
    (:func:`check_swap_ab`, which takes 4..8 slots) or else ``smem_stages`` in
    :data:`SMEM_STAGES` and the shared decode (:func:`check_shared_decode`), then the ``wgmma``
    flag (:func:`check_wgmma`, decode-only helpers allowed). ``ValueError`` naming the field;
    the one rule the spec, the launcher and the kernel apply."""
    check_swap_ab(
        swap_ab, wgmma=wgmma, bits=bits, m_tiles=m_tiles, n_tiles=n_tiles, warps=warps,
        m_warps=m_warps, rows=rows, stages=stages, cluster=cluster,
    )  # fmt: skip
    if not swap_ab:
        if isinstance(stages, bool) or stages not in SMEM_STAGES:
            raise ValueError(f"smem_stages: expected one of {SMEM_STAGES}, got {stages!r}")
        check_shared_decode(warps=warps, m_warps=m_warps, rows=rows, smem_stages=stages)
    check_wgmma(wgmma, n_tiles=n_tiles, warps=warps, m_warps=m_warps, helpers=True)
