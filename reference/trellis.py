"""Trellis payloads: pack, states and the vectorised layer decoder (spec §1, Appendix A).

Public names (kept stable for the oracle and other modules):

* ``pack(symbols, bits)``: symbols ``[..., 256]`` -> payload ``int16[..., 16·bits]`` (SWAP16).
* ``states(packed, bits)``: payload -> ``int64[..., 256]`` states in **step order**.
* ``bits_of(trellis)``: the bit rate ``trellis.shape[-1] // 16``, validated.
* ``decode(trellis, codebook)``: ``int16[..., K/16, N/16, 16·bits]`` -> ``float16[..., K, N]``.

How the fast path works. State ``t`` is the 16-bit stream window starting at stream bit
``o = ((t+1)·b − 16) mod 256·b`` (§1.3). With ``q = o >> 4`` and ``r = o & 15``, that window is
bits ``[r, r+16)`` (from the top) of the 32-bit *pair* ``P[q] = w[q] << 16 | w[q+1]`` of stream
words (``q+1`` taken mod ``16·b``), i.e. ``state = (P[q] >> (16 − r)) & 0xFFFF``. SWAP16 storage
puts stream word ``j`` at int16 index ``j ^ 1``, so:

1. per payload word (cheap: ``b/16`` of the output size) build ``P`` in storage order with one
   gather of the next stream word. ``P`` is kept as an int32 bit pattern: the stored int16 word,
   sign-extended, times 2^16 never overflows int32 and has the right low 32 bits;
2. per weight, gather ``P`` at a precomputed index, arithmetic-shift right by ``16 − r`` (1..16;
   only bits up to 31 are kept, so the sign fill never reaches the result) and mask to 16 bits;
3. look the states up in the codebook table, writing fp16 straight into the output.

For ``decode`` the per-weight indices are laid out in *output* order: output row block ``kt`` is
``W[16kt:16kt+16, :]``, and its element ``(k_local, n)`` reads tile ``nt = n // 16`` at step
``t(k_local, n % 16)`` (§1.5), i.e. element ``nt·16b + (q ^ 1)`` of payload row ``kt`` viewed as
``[.., K/16, (N/16)·16b]``. The gather therefore yields the states already in matrix order; no
symbols, rings, tiles or transposes are built. Work is chunked over row blocks to bound memory.
This computes exactly the states of :func:`reference.bitstream.cyclic_states` and of the §1.4
window rule; the tests check all three agree.
"""

from __future__ import annotations

import functools

import torch

from reference import bitstream, tile_order
from reference._checks import check_bits, check_dtype, check_min_ndim
from reference.codebooks import _state_values_shared, validate_codebook_bits

STEPS_PER_TILE = 256
TILE = 16
STATE_MASK = 0xFFFF
# Output elements decoded per chunk (whole 16-row blocks): bounds int32 temporaries to ~16 MB.
_CHUNK_ELEMENTS = 1 << 22


def pack(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack b-bit symbols ``[..., 256]`` into the stored payload ``int16[..., 16·bits]``."""
    return bitstream.pack_symbols(symbols, bits)


def bits_of(trellis: torch.Tensor) -> int:
    """The bit rate of a payload tensor: ``trellis.shape[-1] // 16``, validated to be 1..8."""
    trellis = check_dtype(trellis, torch.int16, "trellis")
    check_min_ndim(trellis, 1, "trellis")
    last = trellis.shape[-1]
    if last == 0 or last % 16:
        raise ValueError(
            f"trellis: expected last dimension 16·bits (a positive multiple of 16), "
            f"got shape {tuple(trellis.shape)}"
        )
    return check_bits(last // 16, "trellis (bits = last dimension / 16)")


@functools.cache
def _step_pair_indices(bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per tile, for bit rate b: (next_word, pair_of_step, shift_of_step), all int64.

    ``next_word[i]`` (16·b entries) is the stored index of the stream word following the one
    stored at ``i``; ``pair_of_step[t]`` and ``shift_of_step[t]`` (256 entries) give the stored
    index of ``P[q]`` and the right shift ``16 − r`` for step t.
    """
    words = 16 * bits
    stored = torch.arange(words, dtype=torch.int64)
    stream_index = stored ^ 1
    next_word = ((stream_index + 1) % words) ^ 1
    t = torch.arange(STEPS_PER_TILE, dtype=torch.int64)
    start = ((t + 1) * bits - 16) % (STEPS_PER_TILE * bits)
    return next_word, (start >> 4) ^ 1, 16 - (start & 15)


@functools.cache
def _matrix_pair_indices(
    bits: int, n_tiles: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three maps for one payload row of ``n_tiles`` tiles and one output row block [16, N].

    Returns (next_word over the row, pair index per output element, int32 shift per element).
    """
    next_word, pair_step, shift_step = _step_pair_indices(bits)
    words = 16 * bits
    tile_base = torch.arange(n_tiles, dtype=torch.int64) * words
    row_next = (tile_base[:, None] + next_word[None, :]).reshape(-1)
    step = tile_order.step_of_tile_position().reshape(TILE, 1, TILE)  # [k_local, 1, n_local]
    pair = (tile_base.reshape(1, n_tiles, 1) + pair_step[step]).reshape(-1)
    shift = shift_step[step].expand(TILE, n_tiles, TILE).reshape(-1).to(torch.int32)
    return row_next, pair, shift


def _word_pairs(payload_rows: torch.Tensor, next_word: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns ``w[q] << 16 | w[q+1]`` in storage order, from int16 payload rows."""
    signed = payload_rows.to(torch.int32)
    following = signed.index_select(-1, next_word).bitwise_and_(STATE_MASK)
    return (signed << 16).bitwise_or_(following)


def _pair_windows(pairs: torch.Tensor, pair_index: torch.Tensor, shift: torch.Tensor):
    """``(P[pair_index] >> shift) & 0xFFFF`` along the last dimension (int32)."""
    picked = torch.gather(pairs, -1, pair_index.expand(*pairs.shape[:-1], -1))
    return picked.bitwise_right_shift_(shift).bitwise_and_(STATE_MASK)


def states(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """``int16[..., 16·bits]`` payload -> ``int64[..., 256]`` states in step order."""
    bits = check_bits(bits)
    packed = check_dtype(packed, torch.int16, "packed")
    check_min_ndim(packed, 1, "packed")
    if packed.shape[-1] != 16 * bits:
        raise ValueError(
            f"packed: expected last dimension 16·bits = {16 * bits}, "
            f"got shape {tuple(packed.shape)}"
        )
    next_word, pair, shift = (x.to(packed.device) for x in _step_pair_indices(bits))
    pairs = _word_pairs(packed, next_word)
    return _pair_windows(pairs, pair, shift.to(torch.int32)).to(torch.int64)


def _check_trellis(trellis: object) -> int:
    trellis = check_dtype(trellis, torch.int16, "trellis")
    check_min_ndim(trellis, 3, "trellis")
    return bits_of(trellis)


def decode(trellis: torch.Tensor, codebook: str) -> torch.Tensor:
    """Decode ``int16[..., K/16, N/16, 16·bits]`` with ``codebook`` to ``float16[..., K, N]``."""
    bits = _check_trellis(trellis)
    validate_codebook_bits(codebook, bits)
    *lead, k_tiles, n_tiles, words_per_tile = trellis.shape
    if k_tiles == 0 or n_tiles == 0:
        raise ValueError(
            f"trellis: expected a non-empty tile grid, got shape {tuple(trellis.shape)}"
        )
    device = trellis.device
    lut = _state_values_shared(codebook, bits).to(device)
    next_word, pair, shift = (x.to(device) for x in _matrix_pair_indices(bits, n_tiles))

    rows = trellis.reshape(-1, n_tiles * words_per_tile)  # one payload row per 16-row block
    out = torch.empty(rows.shape[0], TILE * n_tiles * TILE, dtype=torch.float16, device=device)
    chunk = max(1, _CHUNK_ELEMENTS // out.shape[1])
    for start in range(0, rows.shape[0], chunk):
        pairs = _word_pairs(rows[start : start + chunk], next_word)
        state = _pair_windows(pairs, pair, shift)
        torch.index_select(lut, 0, state.reshape(-1), out=out[start : start + chunk].reshape(-1))
    return out.reshape(*lead, k_tiles * TILE, n_tiles * TILE)
