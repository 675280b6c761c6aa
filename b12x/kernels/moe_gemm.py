"""Grouped trellis GEMM over expert blocks: the MoE FC1/FC2 launch (spec §3.4, §4.1; R1, R7).

Layout (the full account: docs/notes/b12x.md, "b12x/kernels/moe_gemm.py"):
* **Rows are routes.** ``a`` ``int32[n, K/2]`` holds every route's rotated activations; slot ``s``
  of route block ``s // B`` computes route ``route_rows[s]`` (``>= n``: padding, never stored);
  ``out`` ``int32[n, N_out/2]`` is written in route order from column word ``out_col_word``.
* **Weights.** ``payload`` ``int32[E_payload·K/16, N/16, 8b]``: every expert's trellis stacked
  on the K16 axis; payload expert ``expert_base + local``.
* **Expert of a block.** A block is live when it starts below ``route_count[0]`` and its id
  indexes ``descriptors``; it computes when ``descriptors[id] >> 8`` equals ``tier``.
* **Work split.** ``k_split`` warp groups of ``warps`` warps per CTA; group ``g`` runs K16 slice
  ``g·S + [0, S)``, ``S = K/16/k_split``, ``depth`` rows per iteration, loads issued first.
* **K reduction** (:func:`reduce_groups`): groups fold into group 0 in a fixed order through
  shared memory; group 0 alone stores. Each row depends only on its own A row and ``k_split``,
  so the MoE stays batch-invariant while ``k_split`` depends on the weight geometry only.
* **Shared decode** (``m_warps`` >= 1): each K16 row decoded once per CTA into shared memory,
  ``k_split`` the fold's slice count in the per-warp kernel's order (bit-identical results).
* **QSRT pairs** build :class:`b12x.kernels.moe_pair_gemm.MoePairGemmKernel` from the same
  primitives. :mod:`b12x.launch.moe_compile` builds either kernel from a spec.

Invariants:
* Inactive blocks never read ``descriptors``, ``modes`` or ``payload`` and never write ``out``.
* Codebook, rates, pair layout, dtype and tile shape are compile-time (:class:`MoeGemmSpec`); the
  LUT address is one Int64 slot.
* Every thread of a live CTA reaches the reduction barriers: liveness and the tier test are
  CTA-uniform and every group runs the same number of slice iterations.
"""

from __future__ import annotations

import dataclasses
import functools

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Float32, Int32, Int64

from b12x.abi import abi_entry
from b12x.formats import DecodeFormat, resolve_format
from b12x.kernels.dense_gemm import decode_and_accumulate
from b12x.kernels.dependent_launch import await_upstream, launch_options
from b12x.kernels.mainloop import (
    accumulate_staged,
    lane_coords,
    ring_word_pointers,
    routed_a_pointers,
    routed_epilogue,
    routed_rows,
    stage_rows,
    tile_row_words,
    zero_accumulators,
)
from b12x.kernels.pair_decode import pair_layout_bits
from b12x.kernels.shared_decode import SharedDecodeMainloop
from b12x.kernels.shared_layout import (
    WGMMA_SMEM_LIMIT,
    SharedDecodeLayout,
    check_shared_decode,
    check_wgmma,
    shared_decode_layout,
)
from b12x.kernels.trellis_decode import lane_ring_start
from b12x.kernels.wgmma_decode import WgmmaDecodeMainloop

__all__ = [
    "DYNAMIC",
    "DYNAMIC_KINDS",
    "MainloopBundle",
    "MoeGemmSpec",
    "MoeGroupedGemmKernel",
    "PAIR_KINDS",
    "TIER_SHIFT",
    "accumulate_tile",
    "block_liveness",
    "shared_block_epilogue",
    "shared_slot_source",
    "shared_unit_live",
]

TIER_SHIFT = 8
#: K16 rows loaded per mainloop iteration; each divides 8, and K is a multiple of 128 (8 rows).
DEPTHS = (1, 2, 4, 8)
#: Intra-CTA K split factors: warp groups that share N tiles and split the K16 rows.
K_SPLITS = (1, 2, 4, 8)
#: fp32 accumulators per lane that one round of the shared-memory K reduction moves.
REDUCE_CHUNK = 16
#: Static shared memory a launch may use without an opt-in attribute (bytes).
MAX_STATIC_SMEM = 48 * 1024
MAX_CTA_THREADS = 1024
LOCAL_MASK = (1 << TIER_SHIFT) - 1

#: QSRT pair kind -> (b_lo, b_hi): record 0 / record 1 rates in storage order (spec §4.3).
PAIR_KINDS = {"P22": (2, 2), "P33": (3, 3), "P24": (2, 4), "P43": (4, 3), "P44": (4, 4)}
DYNAMIC = "dynamic"
#: The bodies of a dynamic launch, indexed by the per-expert mode (0 = P33, 1 = P24, §4.2).
DYNAMIC_KINDS = ("P33", "P24")
PAIR_CHOICES = (*PAIR_KINDS, DYNAMIC)
PAIR_RATE_AXES = ("n", "k")
PAIR_BASE_BITS = 3
RECORD_TILES = 8  # 128 channels of one record = 8 sixteen-wide tiles on the rate axis


@dataclasses.dataclass(frozen=True)
class MoeGemmSpec:
    """Every codegen input of one grouped-GEMM specialisation (plus the arch: the cache key)."""

    codebook: str
    bits: int
    bf16: bool
    m_tiles: int = 1
    n_tiles: int = 2
    warps: int = 4
    depth: int = 4
    pair: str | None = None
    rate_axis: str | None = None
    k_split: int = 1
    #: ``>= 1``: the shared-decode mainloop (:mod:`b12x.kernels.shared_decode`): the CTA decodes
    #: each K16 row once and ``m_warps`` x ``warps/m_warps`` warps multiply it; route blocks of
    #: ``16·m_tiles·m_warps`` slots; ``k_split`` is then the fold's slice count (summation order
    #: only, no warp groups). 0: the per-warp mainloop.
    m_warps: int = 0
    #: K16 rows per shared-decode step and its cp.async slots (``smem_stages`` 0 when per-warp).
    shared_rows: int = 2
    smem_stages: int = 0
    #: The shared decode multiplies with Hopper ``wgmma`` (sm_90a; ``m_warps == warps``,
    #: :mod:`b12x.kernels.wgmma_decode`).
    wgmma: bool = False

    def __post_init__(self):
        resolve_format(self.codebook, self.bits)
        for name in ("m_tiles", "n_tiles", "warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.depth not in DEPTHS:
            raise ValueError(f"depth: expected one of {DEPTHS}, got {self.depth!r}")
        if type(self.k_split) is not int or self.k_split not in K_SPLITS:
            raise ValueError(f"k_split: expected one of {K_SPLITS}, got {self.k_split!r}")
        self._check_shared()
        # the shared decode's fold region may go past the 48 KB, and a wgmma geometry's slots
        # too, up to an sm_90 launch's opt-in 227 KB (the plan checks the device)
        static = self.shared_layout.fold_offset if self.m_warps else self.smem_bytes
        limit = MAX_STATIC_SMEM
        if self.wgmma:
            static, limit = self.smem_bytes, WGMMA_SMEM_LIMIT
        if self.cta_threads > MAX_CTA_THREADS or static > limit:
            raise ValueError(
                f"warps/k_split: {self.warps} warps × k_split {self.k_split} need "
                f"{self.cta_threads} threads and {self.smem_bytes} B of shared memory (at most "
                f"{MAX_CTA_THREADS} threads and {limit} B)"
            )
        if self.pair is None:
            if self.rate_axis is not None:
                raise ValueError(f"rate_axis: an unpaired spec has none, got {self.rate_axis!r}")
            return
        self._check_pair()

    def _check_shared(self) -> None:
        check_shared_decode(
            warps=self.warps, m_warps=self.m_warps, rows=self.shared_rows,
            smem_stages=self.smem_stages,
        )  # fmt: skip
        if not self.m_warps and self.smem_stages:
            raise ValueError(
                f"smem_stages: the per-warp grouped GEMM has no shared-memory ring, got "
                f"{self.smem_stages} (set m_warps for the shared decode)"
            )
        if self.m_warps and self.pair is not None and not self.wgmma:
            raise ValueError(
                f"m_warps: the paired kernel's shared decode multiplies with wgmma (sm_90), got "
                f"m_warps={self.m_warps} without it"
            )
        check_wgmma(self.wgmma, n_tiles=self.n_tiles, warps=self.warps, m_warps=self.m_warps)

    @functools.cached_property
    def shared_layout(self) -> SharedDecodeLayout | None:
        """The shared decode's byte layout (None for the per-warp mainloop); computed once."""
        if not self.m_warps:
            return None
        return shared_decode_layout(
            bits=self.shared_bits, m_tiles=self.m_tiles, n_tiles=self.n_tiles, warps=self.warps,
            m_warps=self.m_warps, rows=self.shared_rows, stages=self.smem_stages,
            fold=self.k_split > 1,
        )  # fmt: skip

    @property
    def shared_bits(self) -> int:
        """The rate the shared decode's slots are sized at: ``bits``, or for a pair launch
        :func:`~b12x.kernels.pair_decode.pair_layout_bits` over its bodies' record rates."""
        if self.pair is None:
            return self.bits
        return pair_layout_bits(self.rate_axis, tuple(PAIR_KINDS[k] for k in self.body_kinds))

    def _check_pair(self) -> None:
        if self.pair not in PAIR_CHOICES:
            raise ValueError(f"pair: expected None or one of {PAIR_CHOICES}, got {self.pair!r}")
        if self.rate_axis not in PAIR_RATE_AXES:
            raise ValueError(
                f"rate_axis: a paired spec needs 'n' (FC1) or 'k' (FC2), got {self.rate_axis!r}"
            )
        if self.bits != PAIR_BASE_BITS:
            raise ValueError(
                f"bits: pair layouts compile on the trellis_bits = {PAIR_BASE_BITS} base "
                f"(spec §4.2), got {self.bits}"
            )
        for kind in self.body_kinds:
            for rate in PAIR_KINDS[kind]:
                resolve_format(self.codebook, rate)
        if self.rate_axis == "n" and (
            self.n_tiles % 2 or self.warps * self.n_tiles != 2 * RECORD_TILES
        ):
            raise ValueError(
                f"n_tiles/warps: an N-axis pair CTA owns exactly one pair (16 N16 tiles, half of "
                f"each warp's tiles per record), got n_tiles={self.n_tiles}, warps={self.warps}"
            )

    @property
    def block_size(self) -> int:
        """Slots of one route block: the rows one CTA computes."""
        return 16 * self.m_tiles * max(1, self.m_warps)

    @property
    def uses_mma(self) -> bool:
        """Every grouped GEMM runs the mma.sync mainloop (compile checks look for it)."""
        return True

    @property
    def cta_threads(self) -> int:
        """Threads of one CTA: ``k_split`` warp groups of ``warps`` warps (the shared decode:
        ``warps`` warps, its K split being a summation order only)."""
        return 32 * self.warps * (1 if self.m_warps else self.k_split)

    @property
    def reduce_chunk(self) -> int:
        """Accumulators per lane moved in one round of the K reduction (divides the total)."""
        accs = self.m_tiles * self.n_tiles * 8
        return REDUCE_CHUNK if accs % REDUCE_CHUNK == 0 else 8

    @property
    def smem_bytes(self) -> int:
        """The K reduction's staging buffer: one ``reduce_chunk`` slice per lane of every warp
        of groups ``1 .. k_split-1`` (group 0 keeps its partial sums in registers); the shared
        decode's slots and fragment buffers (:mod:`b12x.kernels.shared_layout`)."""
        if self.m_warps:
            return self.shared_layout.total
        return (self.k_split - 1) * self.warps * 32 * self.reduce_chunk * 4

    @property
    def k_multiple(self) -> int:
        """K must be a multiple of this: per group 128 (8 K16 rows, every ``depth`` divides 8),
        or one whole pair (256, 16 K16 rows) for a K-axis pair launch."""
        return (256 if self.rate_axis == "k" else 128) * self.k_split

    @property
    def k_word_multiple(self) -> int:
        """A's rows in int32 words are a multiple of this, as the kernel compiles them: one K16
        row (8) unsplit, one pair (128) on the K axis, else :attr:`k_multiple` / 2."""
        if self.k_split == 1 and self.rate_axis != "k":
            return 8
        return self.k_multiple // 2

    def check_k(self, k: int) -> None:
        """Refuse a launch whose reduction ``k`` the compiled kernel cannot split: ``ValueError``
        naming K and the multiple (whole K16 rows, pairs or K groups)."""
        multiple = 2 * self.k_word_multiple
        if k % multiple:
            raise ValueError(
                f"a: K={k} is not a multiple of {multiple}, what this launch needs (k_split "
                f"{self.k_split}{', whole pairs' if self.rate_axis == 'k' else ''})"
            )

    @property
    def n_group(self) -> int:
        """Output columns one CTA covers (N must be a multiple)."""
        return 16 * self.n_tiles * self.warps

    @property
    def body_kinds(self) -> tuple[str, ...]:
        """The pair kinds compiled into fully specialised bodies: ``(kind,)`` for a static
        kind, :data:`DYNAMIC_KINDS` (mode 0, mode 1) for ``"dynamic"``, ``()`` when unpaired."""
        if self.pair is None:
            return ()
        return DYNAMIC_KINDS if self.pair == DYNAMIC else (self.pair,)

    @property
    def pair_words(self) -> int:
        """u32 words of one pair per K16 row (N axis) or per N16 column (K axis):
        ``64·(b_lo + b_hi)``, the same for both dynamic kinds (6 bits per coefficient pair)."""
        (total,) = {sum(PAIR_KINDS[kind]) for kind in self.body_kinds}
        return 64 * total


@dataclasses.dataclass(frozen=True)
class MainloopBundle:
    """The frozen keyword bundle of the shared mainloop's compile-time inputs."""

    fmt: DecodeFormat
    bits: int
    bf16: bool
    m_tiles: int
    lut_in_smem: bool = False


def block_liveness(block_expert_ids, route_count, descriptors, block, row_base):
    """``(expert, live)`` of route block ``block``: ``live`` is 1 exactly when the block starts
    below the route count and its expert id indexes ``descriptors`` (0 <= id < rows), else 0.
    Every grouped-GEMM kernel tests this before it reads ``descriptors``, ``modes`` or
    ``payload``; it is CTA-uniform (module docstring, Invariants)."""
    expert = block_expert_ids[block]
    in_count = Int32(cutlass.select_(row_base < route_count[0], Int32(1), Int32(0)))
    low_ok = Int32(cutlass.select_(expert >= 0, Int32(1), Int32(0)))
    high_ok = Int32(cutlass.select_(expert < descriptors.shape[0], Int32(1), Int32(0)))
    return expert, in_count * low_ok * high_ok


def shared_slot_source(route_rows, row_base, n_rows):
    """The gather source of a shared-decode route block (``a_row_source`` of
    :meth:`~b12x.kernels.shared_decode.SharedDecodeMainloop.setup`): slot ``local`` reads its
    route's row of ``a``, or row 0 and not live for a padding slot (zero-filled, never read)."""

    def slot_row(local):
        route = route_rows[row_base + local]
        live = route < n_rows
        return Int32(cutlass.select_(live, route, Int32(0))), live

    return slot_row


def shared_unit_live(shared, route_rows, row_base, n_rows, warp):
    """Whether the warp's unit whose MMAs are skipped together
    (:meth:`~b12x.kernels.shared_decode.SharedDecodeMainloop.live_row0`: a warp, a warpgroup on
    ``wgmma``) has a route: padding sits at the end of a block, so its first slot decides."""
    return route_rows[row_base + shared.live_row0(warp)] < n_rows


def shared_block_epilogue(shared, spec, *, out, acc, route_rows, warp_row0, n_rows, tile0, r, g,
                          out_col_word):  # fmt: skip
    """The scatter epilogue of a shared-decode warp: its ``m_tiles`` M16 blocks from CTA row
    ``warp_row0`` x ``mma_tiles`` N16 tiles from ``tile0``, each row to its route's output row."""
    routed_epilogue(
        out,
        acc,
        list(routed_rows(route_rows, warp_row0, spec.m_tiles, g)),
        n_rows,
        lambda nt, nb: ((tile0 + nt) * 16 + nb * 8 + 2 * r) // 2 + out_col_word,
        spec.m_tiles,
        shared.layout.mma_tiles,
        spec.bf16,
    )


def reduce_buffer(spec: MoeGemmSpec):
    """The K reduction's shared staging buffer (``spec.smem_bytes``, fp32), allocated at trace
    time: a kernel with several bodies allocates it once, before it branches."""
    allocator = cutlass.memory.SmemAllocator()
    return allocator.allocate_tensor(
        Float32, cute.make_layout(spec.smem_bytes // 4), byte_alignment=16
    )


@cute.jit
def reduce_groups(
    acc: cute.Tensor, red: cute.Tensor, group: Int32, slot: Int32, spec: cutlass.Constexpr
):
    """Sum the K groups' partial accumulators into group 0's, in a FIXED order.

    ``acc_0 <- ((acc_0 + acc_1) + acc_2) + ...`` per accumulator, group index order, so the
    result depends only on the spec (never on timing or on other blocks). ``slot`` is the
    lane's index within its group (``column warp · 32 + lane``). ``red`` (:func:`reduce_buffer`)
    holds ``reduce_chunk`` accumulators per lane of groups 1.., laid out ``[group-1][j][column
    warp][lane]`` (lane-contiguous: no bank conflicts); the accumulators move in rounds of
    ``reduce_chunk``, each between CTA barriers (every thread of a live CTA reaches them:
    liveness is CTA-uniform, and every group runs the same number of slice iterations).
    """
    chunk = spec.reduce_chunk
    lanes = spec.warps * 32
    rounds = (spec.m_tiles * spec.n_tiles * 8) // chunk
    for rnd in cutlass.range_constexpr(rounds):
        if group > 0:
            for j in cutlass.range_constexpr(chunk):
                red[((group - 1) * chunk + j) * lanes + slot] = acc[rnd * chunk + j]
        cute.arch.sync_threads()
        if group == 0:
            for src in cutlass.range_constexpr(1, spec.k_split):
                for j in cutlass.range_constexpr(chunk):
                    i = rnd * chunk + j
                    acc[i] = acc[i] + red[((src - 1) * chunk + j) * lanes + slot]
        if cutlass.const_expr(rnd + 1 < rounds):
            cute.arch.sync_threads()


def accumulate_tile(bundle: MainloopBundle, lut_addr, a_frags, words, lane_off, acc, nt: int):
    """The shared mainloop body (by keyword) for N16 tile ``nt`` at the bundle's rate: the
    grouped kernel's decode-and-accumulate step (the pair kernel keeps its own keyword call, one
    per record bundle)."""
    decode_and_accumulate(
        fmt=bundle.fmt,
        bits=bundle.bits,
        bf16=bundle.bf16,
        lut_in_smem=bundle.lut_in_smem,
        lut_addr=lut_addr,
        a_frags=a_frags,
        words=words,
        lane_off=lane_off,
        acc=acc,
        acc_base=nt * bundle.m_tiles * 8,
        m_tiles=bundle.m_tiles,
    )


class MoeGroupedGemmKernel:
    """One compiled specialisation of the grouped GEMM (see the module docstring)."""

    def __init__(self, spec: MoeGemmSpec):
        self.spec = spec
        self.bundle = MainloopBundle(
            fmt=resolve_format(spec.codebook, spec.bits),
            bits=spec.bits,
            bf16=spec.bf16,
            m_tiles=spec.m_tiles,
        )
        self.n_tiles = spec.n_tiles
        self.warps = spec.warps
        self.m_tiles = spec.m_tiles
        self.depth = spec.depth
        self.k_split = spec.k_split
        self.shared = None
        if spec.wgmma:
            self.shared = WgmmaDecodeMainloop(
                self.bundle.fmt, spec.bits, bf16=spec.bf16, m_tiles=spec.m_tiles,
                n_tiles=spec.n_tiles, warps=spec.warps, rows=spec.shared_rows,
                stages=spec.smem_stages, k_split=spec.k_split,
            )  # fmt: skip
        elif spec.m_warps:
            self.shared = SharedDecodeMainloop(
                self.bundle.fmt, spec.bits, bf16=spec.bf16, m_tiles=spec.m_tiles,
                n_tiles=spec.n_tiles, warps=spec.warps, m_warps=spec.m_warps,
                rows=spec.shared_rows, stages=spec.smem_stages, k_split=spec.k_split,
            )  # fmt: skip

    @abi_entry
    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        block_expert_ids: cute.Tensor,
        route_count: cute.Tensor,
        route_rows: cute.Tensor,
        descriptors: cute.Tensor,
        lut_addr: Int64,
        tier: Int32,
        expert_base: Int32,
        out_col_word: Int32,
        stream,
    ):
        grid_x = payload.shape[1] // (self.n_tiles * self.warps)
        self.kernel(
            a,
            payload,
            out,
            block_expert_ids,
            route_count,
            route_rows,
            descriptors,
            lut_addr,
            tier,
            expert_base,
            out_col_word,
        ).launch(
            grid=(grid_x, block_expert_ids.shape[0], 1),
            block=(self.spec.cta_threads, 1, 1),
            smem=self.spec.smem_bytes,
            stream=stream,
            **launch_options(),
        )

    @cute.kernel
    def kernel(
        self,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        block_expert_ids: cute.Tensor,
        route_count: cute.Tensor,
        route_rows: cute.Tensor,
        descriptors: cute.Tensor,
        lut_addr: Int64,
        tier: Int32,
        expert_base: Int32,
        out_col_word: Int32,
    ):
        await_upstream()
        tid = cute.arch.thread_idx()[0]
        bx, by, _ = cute.arch.block_idx()
        row_base = by * self.spec.block_size
        expert, live = block_liveness(block_expert_ids, route_count, descriptors, by, row_base)
        if live == 1:
            descriptor = descriptors[expert]
            if (descriptor >> TIER_SHIFT) == tier:
                local = descriptor & LOCAL_MASK
                if cutlass.const_expr(self.shared is None):
                    self._block_tile(
                        a=a,
                        payload=payload,
                        out=out,
                        route_rows=route_rows,
                        lut_addr=lut_addr,
                        payload_expert=expert_base + local,
                        row_base=row_base,
                        bx=bx,
                        tid=tid,
                        out_col_word=out_col_word,
                    )
                else:
                    self._shared_block_tile(
                        a=a,
                        payload=payload,
                        out=out,
                        route_rows=route_rows,
                        lut_addr=lut_addr,
                        payload_expert=expert_base + local,
                        row_base=row_base,
                        bx=bx,
                        tid=tid,
                        out_col_word=out_col_word,
                    )

    @cute.jit
    def _block_tile(
        self,
        *,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        route_rows: cute.Tensor,
        lut_addr: Int64,
        payload_expert: Int32,
        row_base: Int32,
        bx: Int32,
        tid: Int32,
        out_col_word: Int32,
    ):
        bundle = self.bundle
        bits = bundle.bits
        lane, warp, r, g = lane_coords(tid)
        # Warp w = group·warps + column warp: the group picks the K slice, the column warp the
        # N tiles (k_split == 1: one group, the whole K range).
        col_warp = warp % self.warps
        group = warp // self.warps
        k_rows = a.shape[1] // 8
        slice_rows = k_rows // self.k_split  # a multiple of 8 (K % 128·k_split == 0)
        k_begin = group * slice_rows
        tile0 = (bx * self.warps + col_warp) * self.n_tiles
        acc = zero_accumulators(self.m_tiles, self.n_tiles)
        a_ptrs, rows, n_rows = routed_a_pointers(a, route_rows, row_base, self.m_tiles, g, r)
        first, off = lane_ring_start(lane, bits)
        row_bytes = Int64(payload.shape[1]) * (4 * 8 * bits)
        expert_bytes = Int64(payload_expert) * Int64(k_rows) * row_bytes
        pay_base = payload.iterator.toint() + expert_bytes
        word_ptrs = ring_word_pointers(pay_base, first, bits, tile0=tile0)

        # `depth` K16 rows per iteration: every load of the group is issued before the first
        # decode, so `depth` rows of ring words and A fragments are in flight at once.
        for kt0 in cutlass.range(k_begin, k_begin + slice_rows, self.depth):
            staged = stage_rows(
                self.depth,
                lambda d, kt0=kt0: tile_row_words(
                    word_ptrs, Int64(kt0 + d) * row_bytes, bits, self.n_tiles
                ),
                a_ptrs,
                lambda d, kt0=kt0: Int64(kt0 + d) * 32,
                self.m_tiles,
            )
            accumulate_staged(
                staged,
                self.n_tiles,
                lambda a_frags, words, nt: accumulate_tile(
                    bundle, lut_addr, a_frags, words, off, acc, nt
                ),
            )

        if cutlass.const_expr(self.k_split > 1):
            reduce_groups(acc, reduce_buffer(self.spec), group, col_warp * 32 + lane, self.spec)

        # Group 0 holds the reduced sums and alone runs the epilogue (the scatter).
        if group == 0:
            routed_epilogue(
                out,
                acc,
                rows,
                n_rows,
                lambda nt, nb: ((tile0 + nt) * 16 + nb * 8 + 2 * r) // 2 + out_col_word,
                self.m_tiles,
                self.n_tiles,
                bundle.bf16,
            )

    @cute.jit
    def _shared_block_tile(
        self,
        *,
        a: cute.Tensor,
        payload: cute.Tensor,
        out: cute.Tensor,
        route_rows: cute.Tensor,
        lut_addr: Int64,
        payload_expert: Int32,
        row_base: Int32,
        bx: Int32,
        tid: Int32,
        out_col_word: Int32,
    ):
        """One route block through the shared decode: the CTA's ``cta_m`` slots gathered into
        shared memory (a padding slot is zero-filled, never read), each K16 row decoded once,
        the K slices folded in the per-warp kernel's fixed order (batch invariance), then the
        scatter epilogue of the warp's ``m_tiles`` M16 blocks x ``mma_tiles`` N16 tiles."""
        shared = self.shared
        lay = shared.layout
        bits = self.spec.bits
        lane, warp, r, g = lane_coords(tid)
        wm, wn = shared.warp_coords(warp)
        k_rows = a.shape[1] // 8
        n_rows = a.shape[0]
        warp_row0 = row_base + wm * (16 * self.m_tiles)
        first, off = lane_ring_start(lane, bits)
        row_bytes = Int64(payload.shape[1]) * (4 * 8 * bits)
        expert_bytes = Int64(payload_expert) * Int64(k_rows) * row_bytes
        cta_run = Int64(bx) * (lay.cta_tiles * 32 * bits)

        lanes = shared.setup(
            tid=tid, lane=lane, warp=warp, g=g, r=r, first=first, a=a,
            a_row_source=shared_slot_source(route_rows, row_base, n_rows),
            pay_cta=payload.iterator.toint() + expert_bytes + cta_run,
        )  # fmt: skip
        live = shared_unit_live(shared, route_rows, row_base, n_rows, warp)
        acc = shared.run(
            lanes=lanes, k_begin=0, k_end=k_rows, row_bytes=row_bytes, lut_addr=lut_addr,
            off=off, live_rows=live, slice_rows=k_rows // self.k_split,
        )  # fmt: skip
        shared_block_epilogue(
            shared, self.spec, out=out, acc=acc, route_rows=route_rows, warp_row0=warp_row0,
            n_rows=n_rows, tile0=bx * lay.cta_tiles + wn * lay.mma_tiles, r=r, g=g,
            out_col_word=out_col_word,
        )  # fmt: skip
