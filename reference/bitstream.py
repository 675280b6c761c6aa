"""The trellis_t256 tile bitstream (spec §1.2–§1.4), written literally.

Layout of one tile (``b`` = bits per weight, 1..8):

* 256 symbols ``sym[t]`` of ``b`` bits fill a stream of ``256·b`` bits, symbol ``t`` at stream bits
  ``[t·b, (t+1)·b)``, most significant bit first.
* The stream is cut into ``16·b`` 16-bit *stream words*, MSB first: stream word ``j`` holds stream
  bits ``[16j, 16j+16)`` with the earliest bit in bit 15. Packing works in 16 spans of 16 symbols;
  span ``s`` is exactly the stream words ``[b·s, b·s+b)``.
* **SWAP16 storage**: the payload is ``int16[16·b]`` and stream word ``j`` is stored at int16
  index ``j XOR 1`` (the halves of every u32 are swapped). Read as little-endian u32, ring word
  ``i`` is ``(stream16[2i] << 16) | stream16[2i+1]``, i.e. stream bits ``[32i, 32i+32)`` MSB
  first.
* **States** (§1.3): ``state[t]`` is the 16-bit window of the stream ending at bit ``(t+1)·b``,
  taken cyclically (tail-biting), so the newest symbol is in the low ``b`` bits.

Tensors: symbols and states are integer tensors ``[..., 256]`` (returned as int64); payloads are
``int16[..., 16·b]``; every leading dimension is a batch dimension. u16/u32 values are carried in
int64 so no arithmetic overflows. No function loops over tiles; the only Python loops run over
the ``b`` bit positions of a symbol, the 16 bit positions of a word, or the ``⌈16/b⌉`` shift
terms of the cyclic construction.

The fast decoder lives in :mod:`reference.trellis`; this module is the readable statement of the
format that tests compare it against.
"""

from __future__ import annotations

import torch

from reference._checks import (
    INTEGER_DTYPES,
    check_bits,
    check_dtype,
    check_integer_tensor,
    check_last_dim,
    check_symbol_range,
)

STEPS_PER_TILE = 256
STATE_BITS = 16
STATE_MASK = 0xFFFF
U32_MASK = 0xFFFFFFFF


def _u16_to_int16(words: torch.Tensor) -> torch.Tensor:
    """Reinterpret u16 values held in a wider integer tensor as int16 bit patterns."""
    return ((words.to(torch.int64) ^ 0x8000) - 0x8000).to(torch.int16)


def _check_payload(payload: object, name: str = "payload") -> torch.Tensor:
    tensor = check_dtype(payload, torch.int16, name)
    if tensor.dim() < 1 or tensor.shape[-1] == 0 or tensor.shape[-1] % 16:
        raise ValueError(
            f"{name}: expected last dimension 16·bits (a positive multiple of 16), "
            f"got shape {tuple(tensor.shape)}"
        )
    check_bits(tensor.shape[-1] // 16, f"{name} (bits = last dimension / 16)")
    return tensor


def _check_symbols(symbols: object, bits: int, name: str = "symbols") -> torch.Tensor:
    tensor = check_integer_tensor(symbols, name)
    check_last_dim(tensor, STEPS_PER_TILE, name)
    check_symbol_range(tensor, bits, name)
    return tensor.to(torch.int64)


def pack_symbols(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``[..., 256]`` b-bit symbols into the SWAP16-stored payload ``int16[..., 16·b]``."""
    bits = check_bits(bits)
    sym = _check_symbols(symbols, bits)
    lead = sym.shape[:-1]
    shifts = torch.arange(bits - 1, -1, -1, device=sym.device)
    stream_bits = ((sym[..., None] >> shifts) & 1).reshape(*lead, 16 * bits, 16)
    weights = torch.arange(15, -1, -1, device=sym.device)
    stream16 = (stream_bits << weights).sum(dim=-1)
    stored = stream16.reshape(*lead, 8 * bits, 2).flip(-1).reshape(*lead, 16 * bits)
    return _u16_to_int16(stored)


def stream_words(payload: torch.Tensor) -> torch.Tensor:
    """Undo SWAP16: ``int16[..., 16·b]`` -> the stream words as int64 u16 values, in order."""
    payload = _check_payload(payload)
    lead, width = payload.shape[:-1], payload.shape[-1]
    words = payload.to(torch.int64) & STATE_MASK
    # explicit sizes (never -1): a batch with a zero-size leading dimension stays reshapeable
    return words.reshape(*lead, width // 2, 2).flip(-1).reshape(*lead, width)


def ring_u32(payload: torch.Tensor) -> torch.Tensor:
    """The payload as its ring of ``8·b`` u32 words (int64): word i = stream bits [32i, 32i+32)."""
    stream16 = stream_words(payload)
    lead = stream16.shape[:-1]
    pairs = stream16.reshape(*lead, stream16.shape[-1] // 2, 2)
    return (pairs[..., 0] << 16) | pairs[..., 1]


def unpack_symbols(payload: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack_symbols`: ``int16[..., 16·b]`` -> int64 symbols ``[..., 256]``."""
    bits = check_bits(bits)
    payload = _check_payload(payload)
    if payload.shape[-1] != 16 * bits:
        raise ValueError(
            f"payload: expected last dimension 16·bits = {16 * bits}, "
            f"got shape {tuple(payload.shape)}"
        )
    stream16 = stream_words(payload)
    lead = stream16.shape[:-1]
    shifts = torch.arange(15, -1, -1, device=payload.device)
    stream_bits = ((stream16[..., None] >> shifts) & 1).reshape(*lead, STEPS_PER_TILE, bits)
    weights = torch.arange(bits - 1, -1, -1, device=payload.device)
    return (stream_bits << weights).sum(dim=-1)


def _check_steps(t: object, device: torch.device) -> torch.Tensor:
    """``t`` as an int64 tensor of step indices in 0..255 (an int or an integer tensor only)."""
    if isinstance(t, torch.Tensor):
        if t.dtype not in INTEGER_DTYPES:
            raise TypeError(f"t: expected an integer tensor of step indices, got dtype {t.dtype}")
        steps = t.to(device=device, dtype=torch.int64)
    elif isinstance(t, int) and not isinstance(t, bool):
        steps = torch.tensor(t, dtype=torch.int64, device=device)
    else:
        raise TypeError(
            f"t: expected an int or an integer tensor of step indices, got {type(t).__name__}"
        )
    if steps.numel() and (bool((steps < 0).any()) or bool((steps >= STEPS_PER_TILE).any())):
        low, high = int(steps.min()), int(steps.max())
        raise ValueError(f"t: expected step indices in 0..255, got values in {low}..{high}")
    return steps


def window_state(ring: torch.Tensor, t: torch.Tensor | int, bits: int) -> torch.Tensor:
    """The §1.4 window rule, literally, for every step index in ``t``.

    ``ring`` is ``int64[..., 8·b]`` u32 words (see :func:`ring_u32`); ``t`` is an int or an
    integer tensor of step indices in 0..255 (a float, a bool, a list or a float tensor is a
    ``TypeError``: a fractional step is never truncated). Returns int64 states of shape
    ``ring.shape[:-1] + t.shape``::

        b1 = (t + 257)·b ; b0 = b1 − 16 ; j0 = b0 >> 5 ; j1 = (b1 − 1) >> 5
        s  = (j1 + 1)·32 − b1
        state = ((u32[j0 mod W32] << 32 | u32[j1 mod W32]) >> s) & 0xFFFF
    """
    bits = check_bits(bits)
    ring = check_integer_tensor(ring, "ring")
    check_last_dim(ring, 8 * bits, "ring")
    steps = _check_steps(t, ring.device)
    ring_words = 8 * bits
    b1 = (steps + 257) * bits
    b0 = b1 - 16
    j0 = b0 >> 5
    j1 = (b1 - 1) >> 5
    s = (j1 + 1) * 32 - b1
    ring = ring.to(torch.int64) & U32_MASK
    upper = ring[..., (j0 % ring_words).reshape(-1)]
    lower = ring[..., (j1 % ring_words).reshape(-1)]
    # The 64-bit "merged" word would not fit a signed int64 when bit 31 of ``upper`` is set.
    # Only merged bits [s, s+16) with s <= 31 survive the final mask, i.e. bits below 47, so
    # keeping the low 15 bits of ``upper`` (merged bits 32..46) changes nothing we return.
    merged = ((upper & 0x7FFF) << 32) | lower
    state = (merged >> s.reshape(-1)) & STATE_MASK
    return state.reshape((*ring.shape[:-1], *steps.shape))


def cyclic_states(symbols: torch.Tensor, bits: int) -> torch.Tensor:
    """§1.3: ``state[t] = OR_j sym[(t − j) mod 256] << (j·b)``, j < ⌈16/b⌉, masked to 16 bits."""
    bits = check_bits(bits)
    sym = _check_symbols(symbols, bits)
    state = torch.zeros_like(sym)
    for j in range(-(-STATE_BITS // bits)):
        state |= torch.roll(sym, shifts=j, dims=-1) << (j * bits)
    return state & STATE_MASK
