"""Trellis decode on the device: window extraction (spec §1.4) and per-codebook decoders (§2).

Layout:
* **Ring words.** A tile payload ``int16[16b]`` read as little-endian u32 is the ring of ``W32 =
  8b`` words; ring word i holds stream bits ``[32i, 32i+32)`` MSB-first (§1.2).
* **Per lane.** Lane ``l`` decodes steps ``t = 8l .. 8l+7``. Window 0 starts at stream bit ``b0 =
  (8l + 257)·b − 16`` (mod ``256b``); the eight windows span ``16 + 7b`` bits, which fit in
  :func:`ring_words_per_lane` consecutive ring words (2 for b ≤ 4, 3 for b ≤ 8).
  :func:`lane_ring_start` returns ``(first word, bit offset off)``, window j ending at bit ``off +
  16 + j·b`` of the concatenated words (first word on top). ``off`` is a Python int when every lane
  has the same one (b = 4, 8); otherwise it is chosen so that the bits left after the span, ``e =
  32·words − span − off``, lie in ``[0, 32]`` (a lane may start one word early).
* **Window extraction** (:func:`lane_windows`) follows a trace-time :func:`window_plan`: a few
  funnel shifts (``shf.r.clamp``; one per canonical 32-bit chunk with the lane's run-time ``e`` when
  ``off`` varies by lane) and then one-instruction cuts at bit 0 / 8 / 16 of some register (``and``,
  ``prmt`` with zero bytes, ``shr``), a ``bfe`` elsewhere. MCG K4 costs 11 integer instructions per
  tile, K2 12, K3/K6 17 (:attr:`WindowPlan.instructions`); :func:`run_window_plan` is the same plan
  in pure Python (the CPU tests prove it equals §1.4 for every lane and bitrate).
* **Decoders** (:func:`decode_states_to_half2x4`) turn eight states into four packed registers
  ``(w0,w1), (w2,w3), (w4,w5), (w6,w7)``, lower index in the low half: exactly the two m16n8k16 B
  fragments of the lane (§1.5): ``(w0,w1),(w2,w3)`` feed n-block 0 and ``(w4,w5),(w6,w7)`` n-block
  1. With ``to_bf16`` each half2 is rounded to bf16 (exact for sqg_e4m3).
* **Decode kernel** :class:`TrellisDecodeKernel`: payload ``int32[K/16, N/16, 8b]`` → ``int16[K,
  N]`` (fp16 bits); one warp per strip of ``STRIP`` N16 tiles, each placed by the §1.5 map into
  shared memory, then written out with coalesced 16-byte stores.

Invariants: everything that depends on the codebook or bitrate is a trace-time constant (the
:class:`~b12x.formats.DecodeFormat`; no codebook string reaches device code, the decoder body is
``fmt.device_decode``); a table arrives in one 64-bit LUT slot (§2.8: global, or ``lut_in_smem``).
"""

from __future__ import annotations

import dataclasses
import functools

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Int32, Int64, Uint32

from b12x.abi import abi_entry
from b12x.kernels import ptx
from b12x.kernels.dependent_launch import await_upstream, launch_options

__all__ = [
    "ring_words_per_lane",
    "lane_geometry",
    "lane_offsets",
    "lane_ring_start",
    "load_lane_words",
    "Funnel",
    "Cut",
    "WindowPlan",
    "window_plan",
    "run_window_plan",
    "lane_windows",
    "decode_states_to_half2x4",
    "decode_fp16_hash",
    "decode_mul1",
    "decode_sqg_t12",
    "decode_sqg_d3l",
    "TrellisDecodeKernel",
]


def ring_words_per_lane(bits: int) -> int:
    """How many consecutive ring words hold one lane's eight windows."""
    return 2 if bits <= 4 else 3


def _span(bits: int) -> int:
    """Bits covered by a lane's eight windows."""
    return 16 + 7 * bits


def _adjust_below(bits: int) -> int:
    """Raw bit offsets below this start one word early (so that ``e <= 32``, see below)."""
    return 32 * ring_words_per_lane(bits) - _span(bits) - 32


def lane_geometry(lane: int, bits: int) -> tuple[int, int]:
    """Python mirror of :func:`lane_ring_start` for one lane: ``(first, off)``.

    Window 0 of lane ``l`` starts at stream bit ``(8l + 257)·b − 16`` (§1.4). ``first`` is the
    ring word the lane loads first and ``off`` the bit offset of window 0 from that word's MSB.
    Normally ``first`` is the word holding bit 0 of window 0 (``off < 32``); when the span would
    leave more than 32 unused bits after its end in the loaded words, the lane starts one word
    earlier (``off += 32``), so that ``e = 32·words − span − off`` always lies in ``[0, 32]``.
    """
    ring = 8 * bits
    start = (lane * 8 + 257) * bits - 16
    raw = start & 31
    adj = 1 if raw < _adjust_below(bits) else 0
    return ((start >> 5) + ring - adj) % ring, raw + 32 * adj


def lane_offsets(bits: int) -> tuple[int, ...]:
    """The distinct ``off`` values of the 32 lanes (one value: the offset is lane-invariant)."""
    return tuple(sorted({lane_geometry(lane, bits)[1] for lane in range(32)}))


def lane_ring_start(lane, bits: int):
    """(first ring word, bit offset of window 0 from its MSB) of ``lane``; see lane_geometry.

    The offset is a Python ``int`` when it is the same for every lane (b = 4, 8), so the window
    positions are compile-time constants; otherwise an ``Int32``.
    """
    ring = 8 * bits
    start = (Int32(lane) * 8 + 257) * bits - 16
    offsets = lane_offsets(bits)
    if len(offsets) == 1:  # lane-invariant: the adjustment is a constant too
        adj = offsets[0] // 32
        return ((start >> 5) + (ring - adj)) % ring, offsets[0]
    raw = start & 31
    if max(offsets) < 32:  # no lane starts a word early
        return (start >> 5) % ring, raw
    adj = Int32(cutlass.select_(raw < _adjust_below(bits), Int32(1), Int32(0)))
    return ((start >> 5) + (ring - adj)) % ring, raw + adj * 32


def load_lane_words(read_word, first, bits: int) -> list:
    """Load the lane's ring words ``first, first+1, ...`` (mod W32) through ``read_word(i)``."""
    ring = 8 * bits
    words = []
    for i in range(ring_words_per_lane(bits)):
        index = first + i
        index = Int32(cutlass.select_(index >= ring, index - ring, index))
        words.append(Uint32(read_word(index)))
    return words


# ---------------------------------------------------------------------------------------------
# Window extraction plan (trace-time Python): which funnel shifts and which one-instruction cuts
# ---------------------------------------------------------------------------------------------
#
# Coordinates. The lane's span, read LSB-first, is the value C whose bit 0 is the last bit of
# window 7; window j occupies C bits [p_j, p_j + 16) with p_j = (7 - j)·b. The loaded words,
# concatenated with the first word on top, hold C shifted up by e = 32·words − span − off.
#
# Instructions. A 16-bit state is cut out of a 32-bit register in ONE instruction when it sits
# at bit 0 (and 0xffff), bit 8 (prmt with zero bytes) or bit 16 (shr 16); anywhere else it
# takes two (bfe = shift + extend). A register holding C bits [q, q + 32) is either free (a
# loaded word, when e is a compile-time constant) or costs one funnel shift. The plan buys the
# fewest funnel registers such that every window sits at 0, 8 or 16 of some register; with a
# lane-dependent e it first buys the canonical registers C[0:32), C[32:64), ... (one funnel
# with the lane's shift each) and cuts everything else with immediate shifts.


@dataclasses.dataclass(frozen=True)
class Funnel:
    """New register = low 32 bits of ``(regs[hi] : regs[lo]) >> min(shift, 32)``.

    ``hi`` None means zero (a plain right shift). The shift is ``const``, plus the lane's ``e``
    when ``lane_shift`` (then ``const`` is 0).
    """

    lo: int
    hi: int | None
    const: int
    lane_shift: bool = False


@dataclasses.dataclass(frozen=True)
class Cut:
    """State = ``(regs[reg] >> pos) & 0xffff`` (one instruction for pos 0, 8, 16)."""

    reg: int
    pos: int


@dataclasses.dataclass(frozen=True)
class WindowPlan:
    """Registers 0..words-1 are the loaded ring words (first word = register 0); funnel i
    defines register ``words + i``; ``cuts[j]`` yields the state of window j."""

    bits: int
    words: int
    lane_shift: bool
    funnels: tuple[Funnel, ...]
    cuts: tuple[Cut, ...]

    @property
    def instructions(self) -> int:
        """Integer instructions the plan costs per tile (funnels + cuts)."""
        return len(self.funnels) + sum(1 if c.pos in _ONE_OP else 2 for c in self.cuts)


_ONE_OP = (0, 8, 16)


def _positions(bits: int) -> list[int]:
    return [(7 - j) * bits for j in range(8)]


def _cover(positions: list[int], free: list[int], candidates) -> list[int]:
    """Fewest extra register bases q so that every position p has p - q in (0, 8, 16)."""
    best: list[int] | None = None

    def search(chosen: list[int]) -> None:
        nonlocal best
        if best is not None and len(chosen) >= len(best):
            return
        have = free + chosen
        todo = [p for p in positions if not any(p - q in _ONE_OP for q in have)]
        if not todo:
            best = list(chosen)
            return
        for q in (todo[0] - d for d in _ONE_OP):
            if candidates(q):
                search(chosen + [q])

    search([])
    assert best is not None
    return best


@functools.cache
def window_plan(bits: int, off: int | None) -> WindowPlan:
    """The extraction plan for a lane with constant offset ``off``, or for a lane-dependent one
    (``off`` None: the shift comes from the lane's ``e`` at run time)."""
    words = ring_words_per_lane(bits)
    span = _span(bits)
    positions = _positions(bits)
    funnels: list[Funnel] = []
    bases: dict[int, int] = {}  # C base q -> register
    if off is not None:
        e = 32 * words - span - off
        if not 0 <= e <= 32:
            raise ValueError(f"off: {off} leaves e={e} outside [0, 32] for bits={bits}")
        for i in range(words):
            bases[32 * (words - 1 - i) - e] = i

        def source(q):  # raw funnel from the loaded words
            raw = q + e
            k = raw // 32
            lo = words - 1 - k
            return Funnel(lo, lo - 1 if lo >= 1 else None, raw - 32 * k)

        def feasible(q):
            return 0 <= q + e <= 32 * words - 16
    else:
        for k in range(-(-span // 32)):
            lo = words - 1 - k
            funnels.append(Funnel(lo, lo - 1 if lo >= 1 else None, 0, lane_shift=True))
            bases[32 * k] = words + k

        def source(q):  # immediate funnel from the canonical registers
            k = q // 32
            hi = bases.get(32 * (k + 1))
            return Funnel(bases[32 * k], hi, q - 32 * k)

        def feasible(q):
            return 0 <= q <= span - 16

    for q in _cover(positions, list(bases), feasible):
        funnels.append(source(q))
        bases[q] = words + len(funnels) - 1
    cuts = []
    for p in positions:
        q = min((q for q in bases if p - q in _ONE_OP), key=lambda q: (p - q, q), default=None)
        if q is None:  # not reached: _cover covers every position
            raise AssertionError(f"window at {p} uncovered for bits={bits}")
        cuts.append(Cut(bases[q], p - q))
    return WindowPlan(bits, words, off is None, tuple(funnels), tuple(cuts))


def run_window_plan(plan: WindowPlan, words: list[int], e: int) -> list[int]:
    """Pure-Python semantics of a plan (the device instructions bit for bit): eight states."""
    regs = [w & 0xFFFFFFFF for w in words]
    for f in plan.funnels:
        shift = min(e + f.const if f.lane_shift else f.const, 32)
        hi = regs[f.hi] if f.hi is not None else 0
        regs.append((((hi << 32) | regs[f.lo]) >> shift) & 0xFFFFFFFF)
    return [(regs[c.reg] >> c.pos) & 0xFFFF for c in plan.cuts]


def lane_windows(words: list, off, bits: int) -> list:
    """The eight 16-bit states of a lane, as ``Uint32`` (window j ends at off + 16 + j·b).

    Follows :func:`window_plan`: funnel shifts (``shf.r.clamp``; with a lane-dependent offset
    the shift is the lane's ``e = 32·words − span − off``, computed once) then one-instruction
    cuts at bit 0 / 8 / 16 where the plan found them.
    """
    if isinstance(off, int):
        plan = window_plan(bits, off)
        e = None
    else:
        plan = window_plan(bits, None)
        e = Int32(32 * len(words) - _span(bits)) - off
    regs = [Uint32(w) for w in words]
    for f in plan.funnels:
        lo = regs[f.lo]
        hi = regs[f.hi] if f.hi is not None else None
        if f.lane_shift:
            regs.append(ptx.shr_clamp(lo, e) if hi is None else ptx.shf_r_clamp(lo, hi, e))
        elif hi is None:
            regs.append(lo >> Uint32(f.const))
        else:
            regs.append(ptx.shf_r_imm(lo, hi, f.const))
    return [ptx.cut16(regs[c.reg], c.pos) for c in plan.cuts]


# ---------------------------------------------------------------------------------------------
# Per-codebook decoders: eight states -> four packed half2
# ---------------------------------------------------------------------------------------------


# Each body takes its decoder object (:mod:`b12x.formats`: the constants as dataclass fields);
# the decoder's ``device`` method names its body, so nothing here chooses one. This module
# imports nothing from :mod:`b12x.formats` (which imports it lazily: no circle).


def _to_bf16(regs: list, to_bf16: bool) -> list:
    return [ptx.half2_to_bfloat2(r) for r in regs] if to_bf16 else regs


def decode_fp16_hash(dec, states: list, to_bf16: bool) -> list:
    """§2.0 hash + LOP3 + half add (3inst, mcg); rounds to bf16 itself."""
    hashes = [s * Uint32(dec.multiplier) + Uint32(dec.addend) for s in states]
    pair = ptx.lop3_hash_pair_to_bfloat2 if to_bf16 else ptx.lop3_hash_pair_to_half2
    return [pair(hashes[2 * i], hashes[2 * i + 1], dec.lop3_mask, dec.lop3_xor) for i in range(4)]


def decode_mul1(dec, states: list, to_bf16: bool) -> list:
    """§2.3 hash, dp4a byte sum, fp16 FMA."""
    sums = [ptx.dp4a_bytesum(s * Uint32(dec.multiplier), dec.acc_base) for s in states]
    k_inv = dec.k_inv * 0x10001
    k_bias = dec.k_bias * 0x10001
    out = []
    for i in range(4):
        pair = ptx.pack_lo16(sums[2 * i], sums[2 * i + 1])
        text = (
            "{ .reg .b32 a, c;\n"
            f"mov.b32 a, {k_inv:#010x};\n"
            f"mov.b32 c, {k_bias:#010x};\n"
            "fma.rn.f16x2 $0, $1, a, c; }"
        )
        out.append(ptx.asm_u32(text, pair))
    return _to_bf16(out, to_bf16)


def _sqg_stratum_phase(dec, state, bits: int):
    """§2.5 graph pieces of one codeword: (stratum, p) with phase = p & (2^(16-b) - 1)."""
    width = 16 - bits
    hmask = (1 << width) - 1
    h = state >> Uint32(bits)
    if width > 11:
        h = h ^ (h >> Uint32(11))
        h = h ^ ((h << Uint32(11)) & Uint32(hmask))
    p = h * Uint32(dec.affine_mul) + Uint32(dec.affine_add)
    beta_rev = ptx.brev_u32(state) >> Uint32(32 - bits)
    stratum = beta_rev ^ (p >> Uint32(32 - bits))
    return stratum, p


def _read_lut_u8(lut_addr, index, lut_in_smem: bool):
    if lut_in_smem:
        return ptx.ld_shared_u8(Uint32(lut_addr) + Uint32(index))
    return ptx.ld_global_nc_u8(Int64(lut_addr) + Int64(index))


def decode_sqg_t12(dec, bits: int, states: list, lut_addr, lut_in_smem: bool, to_bf16: bool):
    """§2.5 SQG-XOR rank -> T12 byte (LUT slot) -> E4M3 widen."""
    width = 16 - bits
    low_mask = (1 << (width - 4)) - 1
    codes = []
    for s in states:
        stratum, p = _sqg_stratum_phase(dec, s, bits)
        index = (stratum << Uint32(width - 4)) | ((p >> Uint32(4)) & Uint32(low_mask))
        codes.append(_read_lut_u8(lut_addr, index, lut_in_smem))
    regs = [ptx.e4m3x2_to_half2(codes[2 * i], codes[2 * i + 1]) for i in range(4)]
    return _to_bf16(regs, to_bf16)


def _d3l_half(dec, state, bits: int, lut_addr) -> Uint32:
    width = 16 - bits
    stratum, p = _sqg_stratum_phase(dec, state, bits)
    rank = (stratum << Uint32(width)) | (p & Uint32((1 << width) - 1))
    positive = rank >> Uint32(15)  # 1 when rank >= 0x8000
    neg_mask = (positive ^ Uint32(1)) * Uint32(0x7FFF)
    m = Int32((rank & Uint32(0x7FFF)) ^ neg_mask)
    v = Int32(65535) - m * 2
    e = Int32(ptx.bfind_u32(Uint32(v)))
    # Head (e <= 3): idx = 2^max(e-1, 0) + ((v - 2^e - 1) >> 1), x = 0.
    pow_e = Int32(1) << e
    head_base = Int32(1) << Int32(cutlass.select_(e > 1, e - 1, Int32(0)))
    head_idx = head_base + ((v - pow_e - 1) >> 1)
    # Tail: sh = e - 3, sub = (v - 2^e) >> sh, idx = 8 sh + sub,
    # x = (2^e + (sub << sh) + 2^sh - 1 - v) >> 1.
    sh = Int32(cutlass.select_(e > 3, e - 3, Int32(0)))
    sub = (v - pow_e) >> sh
    tail_idx = sh * 8 + sub
    tail_x = (pow_e + (sub << sh) + (Int32(1) << sh) - 1 - v) >> 1
    is_tail = e > 3
    idx = Int32(cutlass.select_(is_tail, tail_idx, head_idx))
    x = Int32(cutlass.select_(is_tail, tail_x, Int32(0)))
    desc = ptx.ld_global_nc_u32(Int64(lut_addr) + Int64(idx) * 4)
    mag = ptx.d3l_fma_half(desc, Uint32(x))
    return mag ^ ((positive ^ Uint32(1)) << Uint32(15))


def decode_sqg_d3l(dec, bits: int, states: list, lut_addr, to_bf16: bool) -> list:
    """§2.5 SQG-XOR rank -> D3L descriptor (LUT slot) -> fp16 FMA."""
    halves = [_d3l_half(dec, s, bits, lut_addr) for s in states]
    regs = [ptx.pack_lo16(halves[2 * i], halves[2 * i + 1]) for i in range(4)]
    return _to_bf16(regs, to_bf16)


def decode_states_to_half2x4(fmt, bits: int, states: list, lut_addr, *, lut_in_smem, to_bf16):
    """Decode eight states (w0..w7) to four packed half2 (bf16x2 when ``to_bf16``): the body of
    ``fmt``'s decoder (:meth:`b12x.formats.DecodeFormat.device_decode`)."""
    return fmt.device_decode(bits, states, lut_addr, lut_in_smem=lut_in_smem, to_bf16=to_bf16)


# ---------------------------------------------------------------------------------------------
# Decode kernel: payload -> fp16 weight (exactness checks, large-M path)
# ---------------------------------------------------------------------------------------------

_K_LOCAL = (0, 1, 8, 9)
#: N16 tiles per warp in the decode kernel, and the bytes of its shared staging block.
STRIP = 8
_STRIP_BYTES = 16 * 16 * STRIP * 2


class TrellisDecodeKernel:
    """``payload int32[K/16, N/16, 8b] -> out int16[K, N]`` (fp16 bits, or with ``out_bf16`` the
    bf16 bits of each fp16 weight rounded to nearest even: the decode the bf16 GEMMs multiply).

    One warp per strip of :data:`STRIP` consecutive N16 tiles of one K16 row: the lanes decode
    each tile into a per-warp shared-memory block ``[16][16·STRIP]`` (§1.5 map), then copy it
    out with coalesced 16-byte stores. Tiles and columns past N (a partial last strip) are
    skipped.
    """

    def __init__(self, fmt, bits: int, *, warps_per_cta: int = 4, out_bf16: bool = False):
        fmt.check_bits(bits)
        self.fmt = fmt
        self.bits = bits
        self.warps_per_cta = warps_per_cta
        self.out_bf16 = out_bf16

    @abi_entry
    @cute.jit
    def __call__(self, payload: cute.Tensor, out: cute.Tensor, lut_addr: Int64, stream):
        strips = (payload.shape[1] + STRIP - 1) // STRIP
        total = payload.shape[0] * strips
        ctas = (total + self.warps_per_cta - 1) // self.warps_per_cta
        self.kernel(payload, out, lut_addr).launch(
            grid=(ctas, 1, 1),
            block=(32 * self.warps_per_cta, 1, 1),
            smem=self.warps_per_cta * _STRIP_BYTES,
            stream=stream,
            **launch_options(),
        )

    @cute.kernel
    def kernel(self, payload: cute.Tensor, out: cute.Tensor, lut_addr: Int64):
        await_upstream()
        tid = cute.arch.thread_idx()[0]
        lane = tid % 32
        warp = tid // 32
        job = cute.arch.block_idx()[0] * self.warps_per_cta + warp
        n_tiles = payload.shape[1]
        strips = (n_tiles + STRIP - 1) // STRIP
        allocator = cutlass.memory.SmemAllocator()
        smem = allocator.allocate(self.warps_per_cta * _STRIP_BYTES, byte_alignment=16)
        sbase = Uint32(smem.toint()) + Uint32(warp * _STRIP_BYTES)
        if job < payload.shape[0] * strips:
            kt = job // strips
            nt0 = (job - kt * strips) * STRIP
            first, off = lane_ring_start(lane, self.bits)
            r = lane % 4
            g = lane // 4
            for t in cutlass.range_constexpr(STRIP):
                if nt0 + t < n_tiles:
                    words = load_lane_words(
                        lambda i, t=t: payload[kt, nt0 + t, i], first, self.bits
                    )
                    states = lane_windows(words, off, self.bits)
                    regs = decode_states_to_half2x4(
                        self.fmt,
                        self.bits,
                        states,
                        lut_addr,
                        lut_in_smem=False,
                        to_bf16=self.out_bf16,
                    )
                    for j in cutlass.range_constexpr(8):
                        k_local = 2 * r + _K_LOCAL[j % 4]
                        n_local = t * 16 + g + 8 * (j // 4)
                        addr = sbase + Uint32((k_local * 16 * STRIP + n_local) * 2)
                        ptx.st_shared_u16(addr, regs[j // 2] >> Uint32(16 * (j % 2)))
            cute.arch.sync_warp()
            n = out.shape[1]
            out_base = out.iterator.toint()
            chunks_per_row = 2 * STRIP  # 16-byte chunks (8 fp16) per strip row
            for i in cutlass.range_constexpr(16 * chunks_per_row // 32):
                c = lane + 32 * i
                row = c // chunks_per_row
                col = nt0 * 16 + (c % chunks_per_row) * 8
                if col < n:
                    v = ptx.ld_shared_v4(sbase + Uint32(c * 16))
                    dst = out_base + ((Int64(kt) * 16 + row) * n + col) * 2
                    ptx.st_global_v4(dst, v)
