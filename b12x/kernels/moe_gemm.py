"""Grouped trellis GEMM over expert blocks: the MoE FC1/FC2 launch (spec §3.4, §4.1; R1, R7).

Layout
------
* **Rows are routes, gathered per packed slot.** ``a``: the rotated activations of every route
  (route order ``r = t·top_k + s``), fp16 or bf16 ``[n, K]`` viewed as ``int32[n, K/2]``;
  ``route_rows`` int32 ``[capacity]`` is the packer's slot table: slot ``s`` (route block
  ``s // B``, ``B = 16·m_tiles``) computes route ``route_rows[s]``; a value ``>= n`` (the
  sentinel) is a padding slot, whose A row is not read for real (a clamped row is loaded) and
  whose result is never stored. ``out``: the compute dtype ``[n, N_out]`` viewed as
  ``int32[n, N_out/2]``, written in route order (the scatter is the epilogue); this launch
  writes the column window ``[2·out_col_word, 2·out_col_word + N)``, so the two projections of
  the ``proj`` layout land side by side in one FC1 buffer.
* **Weights.** ``payload``: ``int32[E_payload·K/16, N/16, 8b]``, every expert's ``[K/16, N/16,
  16b]`` int16 trellis stacked on the K16 axis (a contiguous ``[E, K/16, N/16, 16b]`` stack, or
  ``[2, E, ...]`` for ``proj`` with ``expert_base`` = 0 for gate and E for up).
* **Expert of a block.** ``block_expert_ids[b]`` is a combined expert id; a block is live when
  ``b·B < route_count[0]`` and ``0 <= id < descriptors.shape[0]``. Only then is
  ``descriptors[id] = (tier << 8) | local`` read; the CTA computes when its tier equals the
  ``tier`` argument, with payload expert ``expert_base + local``. A uniform stack passes the
  identity descriptors (tier 0); two tiers are two launches (tier 0, tier 1) over the same
  blocks, each with its own payload and bit rate (spec §4.1, "a documented sequence").
* **Work split.** CTA ``(x, b)``: warp ``w`` owns N16 tiles ``(x·warps + w)·n_tiles + [0,
  n_tiles)`` of block ``b``'s ``m_tiles`` M16 row blocks, over all K16 rows, ``depth`` rows per
  iteration with all their loads issued first (K % 128 == 0 makes ``depth | K/16``). No split-K,
  so the result is deterministic and independent of the other blocks: each row's output depends
  only on its own A row, which makes the MoE batch-invariant per route.
* **Mainloop.** Per K16 row each lane loads its A fragments and its 2–3 ring words per tile and
  calls the dense kernel's shared body :func:`b12x.kernels.dense_gemm.decode_and_accumulate` **by
  keyword**, with the codegen constants taken from one frozen :class:`MainloopBundle`.

Invariants
----------
* Inactive blocks (past the route count, or holding the sentinel id) never read ``descriptors``
  or ``payload`` and never write ``out``.
* The codebook, bit rate, dtype and tile shape are compile-time (:class:`MoeGemmSpec`); the LUT
  address arrives in one Int64 slot like the dense kernel's.
"""

from __future__ import annotations

import dataclasses
import threading

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from b12x.formats import DecodeFormat, resolve_format
from b12x.kernels import ptx
from b12x.kernels.dense_gemm import decode_and_accumulate
from b12x.kernels.trellis_decode import lane_ring_start, ring_words_per_lane

__all__ = [
    "MainloopBundle",
    "MoeGemmSpec",
    "MoeGroupedGemmKernel",
    "build_moe_gemm",
    "compiled_moe_gemm",
    "TIER_SHIFT",
]

TIER_SHIFT = 8
#: K16 rows loaded per mainloop iteration; each divides 8, and K is a multiple of 128 (8 rows).
DEPTHS = (1, 2, 4, 8)
LOCAL_MASK = (1 << TIER_SHIFT) - 1


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

    def __post_init__(self):
        resolve_format(self.codebook, self.bits)
        for name in ("m_tiles", "n_tiles", "warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.depth not in DEPTHS:
            raise ValueError(f"depth: expected one of {DEPTHS}, got {self.depth!r}")

    @property
    def block_size(self) -> int:
        return 16 * self.m_tiles

    @property
    def n_group(self) -> int:
        """Output columns one CTA covers (N must be a multiple)."""
        return 16 * self.n_tiles * self.warps


@dataclasses.dataclass(frozen=True)
class MainloopBundle:
    """The frozen keyword bundle of the shared mainloop's compile-time inputs."""

    fmt: DecodeFormat
    bits: int
    bf16: bool
    m_tiles: int
    lut_in_smem: bool = False


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
            block=(32 * self.warps, 1, 1),
            stream=stream,
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
        tid = cute.arch.thread_idx()[0]
        bx, by, _ = cute.arch.block_idx()
        row_base = by * (16 * self.m_tiles)
        expert = block_expert_ids[by]
        in_count = Int32(cutlass.select_(row_base < route_count[0], Int32(1), Int32(0)))
        low_ok = Int32(cutlass.select_(expert >= 0, Int32(1), Int32(0)))
        high_ok = Int32(cutlass.select_(expert < descriptors.shape[0], Int32(1), Int32(0)))
        live = in_count * low_ok * high_ok
        if live == 1:
            descriptor = descriptors[expert]
            if (descriptor >> TIER_SHIFT) == tier:
                local = descriptor & LOCAL_MASK
                self._block_tile(
                    a,
                    payload,
                    out,
                    route_rows,
                    lut_addr,
                    expert_base + local,
                    row_base,
                    bx,
                    tid,
                    out_col_word,
                )

    @cute.jit
    def _block_tile(
        self,
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
        lane = tid % 32
        warp = tid // 32
        r = lane % 4
        g = lane // 4
        k_rows = a.shape[1] // 8
        tile0 = (bx * self.warps + warp) * self.n_tiles

        acc = cute.make_rmem_tensor((self.m_tiles * self.n_tiles * 8,), Float32)
        for i in cutlass.range_constexpr(self.m_tiles * self.n_tiles * 8):
            acc[i] = Float32(0.0)

        a_base = a.iterator.toint()
        a_row_bytes = Int64(a.shape[1]) * 4
        n_rows = a.shape[0]
        a_ptrs = []
        rows = []
        for mt in cutlass.range_constexpr(self.m_tiles):
            for half in cutlass.range_constexpr(2):
                route = route_rows[row_base + mt * 16 + half * 8 + g]
                rows.append(route)  # >= n_rows: a padding slot (the sentinel), never stored
                safe = Int32(cutlass.select_(route < n_rows, route, Int32(0)))
                a_ptrs.append(a_base + Int64(safe) * a_row_bytes + r * 4)

        first, off = lane_ring_start(lane, bits)
        nw = ring_words_per_lane(bits)
        ring = 8 * bits
        row_bytes = Int64(payload.shape[1]) * (4 * ring)
        expert_bytes = Int64(payload_expert) * Int64(k_rows) * row_bytes
        pay_base = payload.iterator.toint() + expert_bytes
        word_ptrs = []
        for i in cutlass.range_constexpr(nw):
            idx = first + i
            idx = Int32(cutlass.select_(idx >= ring, idx - ring, idx))
            word_ptrs.append(pay_base + Int64(tile0 * ring + idx) * 4)

        # `depth` K16 rows per iteration: every load of the group is issued before the first
        # decode, so `depth` rows of ring words and A fragments are in flight at once.
        for kt0 in cutlass.range(0, k_rows, self.depth):
            staged = []
            for d in cutlass.range_constexpr(self.depth):
                row_off = Int64(kt0 + d) * row_bytes
                words = []
                for nt in cutlass.range_constexpr(self.n_tiles):
                    for i in cutlass.range_constexpr(nw):
                        ptr = word_ptrs[i] + row_off
                        words.append(Uint32(ptx.ld_global_nc_u32_imm(ptr, nt * 32 * bits)))
                a_off = Int64(kt0 + d) * 32
                a_frags = []
                for mt in cutlass.range_constexpr(self.m_tiles):
                    frag = []
                    for q in cutlass.range_constexpr(4):
                        ptr = a_ptrs[2 * mt + q % 2] + a_off
                        frag.append(Uint32(ptx.ld_global_nc_u32_imm(ptr, 16 * (q // 2))))
                    a_frags.append(frag)
                staged.append((words, a_frags))
            for d in cutlass.range_constexpr(self.depth):
                words, a_frags = staged[d]
                for nt in cutlass.range_constexpr(self.n_tiles):
                    decode_and_accumulate(
                        fmt=bundle.fmt,
                        bits=bundle.bits,
                        bf16=bundle.bf16,
                        lut_in_smem=bundle.lut_in_smem,
                        lut_addr=lut_addr,
                        a_frags=a_frags,
                        words=words[nt * nw : nt * nw + nw],
                        lane_off=off,
                        acc=acc,
                        acc_base=nt * self.m_tiles * 8,
                        m_tiles=bundle.m_tiles,
                    )

        for mt in cutlass.range_constexpr(self.m_tiles):
            for half in cutlass.range_constexpr(2):
                row = rows[2 * mt + half]
                if row < n_rows:
                    for nt in cutlass.range_constexpr(self.n_tiles):
                        for nb in cutlass.range_constexpr(2):
                            base = nt * self.m_tiles * 8 + mt * 8 + nb * 4 + 2 * half
                            col_word = ((tile0 + nt) * 16 + nb * 8 + 2 * r) // 2 + out_col_word
                            lo = acc[base]
                            hi = acc[base + 1]
                            if cutlass.const_expr(bundle.bf16):
                                out[row, col_word] = Int32(ptx.f32x2_to_bfloat2(lo, hi))
                            else:
                                out[row, col_word] = Int32(ptx.f32x2_to_half2(lo, hi))


def build_moe_gemm(spec: MoeGemmSpec):
    """(kernel object, fake argument tuple) for ``cute.compile`` (CPU compile checks use it)."""
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    def fake(dtype, shape):
        order = tuple(range(len(shape) - 1, -1, -1))
        return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)

    rows = cute.sym_int()  # routes (M·top_k), in route order
    a = fake(Int32, (rows, cute.sym_int(divisibility=8)))
    payload = fake(
        Int32, (cute.sym_int(), cute.sym_int(divisibility=spec.n_group // 16), 8 * spec.bits)
    )
    out = fake(Int32, (rows, cute.sym_int(divisibility=spec.n_group // 2)))
    blocks = fake(Int32, (cute.sym_int(),))
    count = fake(Int32, (1,))
    route_rows = fake(Int32, (cute.sym_int(divisibility=spec.block_size),))
    descriptors = fake(Int32, (cute.sym_int(),))
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    kernel = MoeGroupedGemmKernel(spec)
    scalars = (Int64(0), Int32(0), Int32(0), Int32(0))
    args = (a, payload, out, blocks, count, route_rows, descriptors, *scalars)
    return kernel, (*args, stream)


MOE_SOURCE_MODULES = (
    "b12x.formats",
    "b12x.kernels.ptx",
    "b12x.kernels.trellis_decode",
    "b12x.kernels.dense_gemm",
    "b12x.kernels.moe_gemm",
)
_LOCK = threading.Lock()
_KEYS: dict[tuple[MoeGemmSpec, str], object] = {}


def compiled_moe_gemm(spec: MoeGemmSpec, arch: str):
    """The tvm-ffi callable of ``spec`` for ``arch``, through the runtime compile cache.

    Honours the freeze switch: a spec that was not warmed up raises once frozen or under capture.
    """
    from b12x.kernels.specs import compile_options
    from b12x.runtime import compile_cache

    memo = (spec, arch)
    key = _KEYS.get(memo)
    if key is None:
        with _LOCK:
            codegen = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
            key = _KEYS.setdefault(
                memo,
                compile_cache.make_key("moe_gemm", codegen, arch=arch, modules=MOE_SOURCE_MODULES),
            )

    def build():
        kernel, args = build_moe_gemm(spec)
        return cute.compile(kernel, *args, options=compile_options(arch))

    return compile_cache.CACHE.get_or_compile(key, build)
