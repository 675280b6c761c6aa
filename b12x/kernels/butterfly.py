"""The H128 butterfly of the rotation kernels, dense and MoE: one lane layout, one stage order.

Layout (a warp holds four 128-element blocks):
* Lanes ``8q .. 8q+7`` (the lane **group** ``q = lane // 8``) hold block ``q`` of the warp's four.
  Lane ``8q + s`` holds the sixteen elements ``e = 32g + 4s + c`` (``g, c`` in ``0..3``) of its
  block, listed ``g``-major: ``values[4g + c]``. So index bits 0–1 (``c``) and 5–6 (``g``) are
  in-thread and bits 2–4 (``s``) are across the group's lanes.
* In 16-bit words (``int32`` view, two elements per word, the lower index in the low half) the
  lane's elements are the words ``16g + 2s + h`` (``h`` in ``0, 1``) of the block:
  :func:`lane_words`. :func:`load_lane` / :func:`store_lane` move them as four 8-byte accesses
  (one per ``g``); per ``g`` a group's eight lanes cover 64 contiguous bytes.

Stage order (index bits 0..6, ascending; the order both torch paths round in):
1. Bits 0–1 in-thread, per ``g``: the caller's H4 of four consecutive elements (the dense
   kernels' natural order ``((a+b)+c)+d, …``; the MoE kernels' two-stage butterfly).
2. Bits 2, 3, 4: :func:`xor_stages` over lane offsets 1, 2, 4 (inside the group).
3. Bits 5 and 6 in-thread: the pairs ``g ↔ g+1`` (``g`` even), then ``g ↔ g+2``.

At every stage of bits 2..6 the lower element (bit clear) becomes ``lo + hi`` and the upper
``lo − hi``, each rounded once in fp32. Because the stages and their operations are those of
the four-elements-per-lane butterfly (bits 2–6 all across lanes), the results are bit-identical
to it; only the data movement changed.

How a cross-lane stage is issued:
One ``shfl.bfly`` and one ``fma.rn.f32 d = sign·self + partner`` per value, ``sign`` = +1 on the
lower lane and −1 on the upper (:func:`lane_signs`). Both are exact restatements of the add/sub:

* lower: ``fma(+1, lo, hi)`` (self ``lo``, partner ``hi``) ``= RN(lo + hi)`` (fp32 addition
  is commutative, bit for bit);
* upper: ``fma(−1, hi, lo)`` (self ``hi``, partner ``lo``) ``= RN(lo − hi)``; a product
  with ±1 is exact, so the fused op rounds once, where the subtraction rounds. Signed zeros,
  infinities and NaNs come out as the add/sub gives them.

Why this layout: with four elements per lane and all five upper stages across lanes, the
rotation kernels were bound by shuffles (docs/evidence/rotation-butterfly-layout.md). Sixteen
elements per lane move three stages of five through shuffles, two fifths fewer shuffles per element.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64

from b12x.kernels import ptx

__all__ = [
    "BLOCKS_PER_WARP",
    "GROUP_LANES",
    "GROUP_OFFSETS",
    "group_job",
    "h128",
    "lane_signs",
    "lane_words",
    "load_lane",
    "store_lane",
    "word_at",
    "xor_stages",
]

#: Lanes per 128-element block, and blocks per warp.
GROUP_LANES = 8
BLOCKS_PER_WARP = 32 // GROUP_LANES
#: The lane offsets of the cross-lane stages: index bits 2, 3, 4.
GROUP_OFFSETS = (1, 2, 4)


def lane_words(sub) -> list:
    """The eight word offsets (``int32`` view) of lane ``sub`` (``lane % 8``) inside its block,
    in :func:`h128`'s value order (two elements per word)."""
    return [16 * g + 2 * sub + h for g in range(4) for h in range(2)]


def group_job(first_job, lane, total, blocks) -> tuple:
    """The lane group's job (``first_job + lane // 8``) over ``total`` jobs of ``blocks``
    128-element blocks per row: whether it exists, its row (clamped to the last job's: a group
    past the end computes on real data and stores nothing), the word column where its block
    starts, and the lane's place in its group."""
    job = first_job + lane // GROUP_LANES
    safe = cutlass.min(job, total - 1)
    row = safe // blocks
    base = (safe - row * blocks) * 64
    return job < total, row, base, lane % GROUP_LANES


def word_at(tensor, row, col) -> Int64:
    """The flat word index of ``tensor[row, col]`` (a contiguous 2-D ``int32`` view)."""
    return Int64(row) * Int64(tensor.shape[1]) + Int64(col)


def _lane_pairs() -> list:
    """The word offsets of the lane's four 8-byte pairs relative to its first word, from
    :func:`lane_words` (at trace time: the layout must pair consecutive words)."""
    words = lane_words(0)
    for lo, hi in zip(words[0::2], words[1::2], strict=True):
        if hi != lo + 1:
            raise ValueError(f"lane_words: words {lo}, {hi} are not an 8-byte pair")
    return [lo - words[0] for lo in words[0::2]]


def _lane_address(tensor, word0, sub):
    """Byte address of the lane's first word: ``word0`` is the flat ``int32`` index of the block's
    first word in ``tensor`` (contiguous), ``sub`` the lane inside its group."""
    return tensor.iterator.toint() + (Int64(word0) + Int64(lane_words(sub)[0])) * 4


def load_lane(tensor, word0, sub) -> list:
    """The lane's eight words of the block starting at flat word ``word0`` (:func:`lane_words`
    order), as four 8-byte loads; the block must be 8-byte aligned (``word0`` even)."""
    addr = _lane_address(tensor, word0, sub)
    words = []
    for offset in _lane_pairs():
        words += list(ptx.ld_global_v2_u32(addr, offset=4 * offset))
    return words


def store_lane(tensor, word0, sub, words: list) -> None:
    """Store the lane's eight words (:func:`load_lane`'s order and alignment)."""
    addr = _lane_address(tensor, word0, sub)
    for g, offset in enumerate(_lane_pairs()):
        ptx.st_global_v2_u32(addr, words[2 * g : 2 * g + 2], offset=4 * offset)


def lane_signs(lane, offsets=GROUP_OFFSETS) -> list:
    """Per offset: ``+1.0`` where the lane's offset bit is clear (lower), ``−1.0`` where set."""
    return [
        Float32(cutlass.select_((lane & offset) != 0, Float32(-1.0), Float32(1.0)))
        for offset in offsets
    ]


def _fma(a, b, c) -> Float32:
    return ptx.asm_f32("fma.rn.f32 $0, $1, $2, $3;", a, b, c)


def _add(a, b) -> Float32:
    return ptx.asm_f32("add.rn.f32 $0, $1, $2;", a, b)


def _sub(a, b) -> Float32:
    return ptx.asm_f32("sub.rn.f32 $0, $1, $2;", a, b)


def xor_stages(values: list, lane, offsets=GROUP_OFFSETS) -> list:
    """The cross-lane stages of ``values``, one per offset (module docstring). The signs are
    pure functions of ``lane``: the compiler computes them once per kernel."""
    out = list(values)
    for sign, offset in zip(lane_signs(lane, offsets), offsets, strict=True):
        out = [_fma(sign, v, cute.arch.shuffle_sync_bfly(v, offset)) for v in out]
    return out


def _in_thread_stage(values: list, step: int) -> list:
    """The stage pairing value quads ``g`` and ``g + step`` (``g`` with the ``step`` bit clear)."""
    out = list(values)
    for g in range(4):
        if g & step:
            continue
        for c in range(4):
            lo, hi = values[4 * g + c], values[4 * (g + step) + c]
            out[4 * g + c], out[4 * (g + step) + c] = _add(lo, hi), _sub(lo, hi)
    return out


def h128(values: list, lane, h4) -> list:
    """Unscaled H128 of the group's block: ``values`` = the lane's 16 fp32 elements (module
    docstring order), ``h4`` the caller's in-thread H4 of four consecutive elements."""
    if len(values) != 16:
        raise ValueError(f"values: expected the lane's 16 elements, got {len(values)}")
    out = []
    for g in range(4):
        out += list(h4(values[4 * g : 4 * g + 4]))
    out = xor_stages(out, lane)
    return _in_thread_stage(_in_thread_stage(out, 1), 2)
