"""quack's QTIP 4-bit weight blob (quack-kernels 0.6.5, ``wformat="qtip"``), a peer format (§8).

Orientation. The blob describes ``Wt[n, k]`` (``[N, K]``, rows = output features), the transpose
of this repository's ``W[k, n]``: quack's GEMM computes ``out[M, N] = act[M, K] @ Wt^T``.

Layout. ``blob: uint8[N/64, K/64, 128, 16]``; block ``(g, kt)`` holds
``Wt[64g:64g+64, 64kt:64kt+64]``. Each of its 128 *threads* owns 16 bytes read as one 128-bit
little-endian integer ``S`` (byte i is bits [8i, 8i+8)), i.e. 32 nibbles, nibble j at [4j, 4j+4).

States (§8.2). ``state[j]`` (j = 0..31) is bits [4j, 4j+16) of ``S`` taken cyclically: nibbles
j, j+1, j+2, j+3 (mod 32) from the low end up. So ``state[j+1] & 0xFFF == state[j] >> 4`` for
every j, 31 -> 0 included (tail-biting): any 16 bytes are a valid stream.

Positions (§8.3). Value j = 8b + 2p + e of thread t lands at ``(row, col)`` of its block with
``row = 16(t//32) + (t%32)//4 + 8(p%2)``, ``col = 16b + 2(t%4) + 8(p//2) + e``: the register
order of a WGMMA m64k16 A fragment, and a bijection onto the 64 × 64 block.

Values (§8.4). ``x = (s·89226354 + 64248484) mod 2^32``, ``r = (x & 0x81FF81FF) ^ 0x3E003E00``,
``value = bf16(r >> 16) + bf16(r & 0xFFFF)``, one round-to-nearest-even bf16 add. Each half has
biased exponent 124..127 (magnitude in [1/8, 2)), so every value is finite, in (-4, 4).

Scale. The blob carries none: the values sit at codebook scale and a per-tensor scale is the
GEMM's fp32 epilogue factor on the fp32 accumulator (``decode(blob, scale)`` gives the exact
product instead). :func:`encode` is a tail-biting Viterbi over this trellis, for tests.

Public names: ``state_values``, ``sequence_coordinates``, ``stream_states``, ``decode``,
``encode``.
"""

from __future__ import annotations

import functools
import math

import torch

from reference._checks import check_dtype, check_finite

NUM_STATES = 1 << 16
TILE = 64
THREADS = 128
STREAM_BYTES = 16
STEPS = 32  # values (and states) per thread stream
EDGES = 1 << 12  # the 12 bits two consecutive states share
U32_MASK = 0xFFFFFFFF

HASH_MULTIPLIER = 89226354  # 0x05517C72, the 3INST LCG of §2.1
HASH_ADDEND = 64248484  # 0x03D45AA4
HALF_MASK = 0x81FF81FF  # per bf16 half: sign, the two low exponent bits, 7 mantissa bits
EXPONENT_XOR = 0x3E003E00  # sets exponent bits 13..9: biased exponent 124 + (two kept bits)

FP16_MAX = 65504.0
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Sequences per Viterbi chunk: per sequence, 256 KiB of work row and 512 KiB of step costs.
_CHUNK_SEQUENCES = 128


def _bf16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Read u16 bit patterns held in an int64 tensor as bfloat16 values."""
    signed = ((bits & 0xFFFF) ^ 0x8000) - 0x8000
    return signed.to(torch.int16).view(torch.bfloat16)


@functools.cache
def _table() -> torch.Tensor:
    s = torch.arange(NUM_STATES, dtype=torch.int64)
    x = (s * HASH_MULTIPLIER + HASH_ADDEND) & U32_MASK
    r = (x & HALF_MASK) ^ EXPONENT_XOR
    high = _bf16_from_bits(r >> 16).to(torch.float32)
    low = _bf16_from_bits(r & 0xFFFF).to(torch.float32)
    # Both halves are multiples of 2^-10 below 2 in magnitude, so their sum has at most 12
    # significant bits and float32 holds it exactly; the cast to bf16 is the one RN-even rounding.
    return (high + low).to(torch.bfloat16)


def state_values() -> torch.Tensor:
    """``bfloat16[65536]``: the value of every 16-bit state (§8.4), a fresh copy."""
    return _table().clone()


@functools.cache
def _coordinates() -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.arange(THREADS, dtype=torch.int64).reshape(THREADS, 1)
    j = torch.arange(STEPS, dtype=torch.int64).reshape(1, STEPS)
    b, p, e = j // 8, (j // 2) % 4, j % 2
    rows = 16 * (t // 32) + (t % 32) // 4 + 8 * (p % 2)
    cols = 16 * b + 2 * (t % 4) + 8 * (p // 2) + e
    return rows.contiguous(), cols.contiguous()


def sequence_coordinates() -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)``, two ``int64[128, 32]``: block position of value j of thread t (§8.3)."""
    rows, cols = _coordinates()
    return rows.clone(), cols.clone()


def stream_states(streams: torch.Tensor) -> torch.Tensor:
    """``uint8[..., 16]`` thread streams -> ``int64[..., 32]`` states (§8.2).

    A whole blob ``[N/64, K/64, 128, 16]`` gives ``[N/64, K/64, 128, 32]``.
    """
    streams = check_dtype(streams, torch.uint8, "streams")
    if streams.dim() < 1 or streams.shape[-1] != STREAM_BYTES:
        raise ValueError(
            f"streams: expected last dimension {STREAM_BYTES} (one thread's bytes), "
            f"got shape {tuple(streams.shape)}"
        )
    wide = streams.to(torch.int64)
    nibbles = torch.stack((wide & 0xF, wide >> 4), dim=-1).flatten(-2)  # nibble j = bits 4j..
    states = torch.zeros_like(nibbles)
    for i in range(4):  # nibble (j + i) mod 32 is bits [4i, 4i+4) of state j
        states |= torch.roll(nibbles, shifts=-i, dims=-1) << (4 * i)
    return states


def _check_blob(blob: object) -> torch.Tensor:
    blob = check_dtype(blob, torch.uint8, "blob")
    if blob.dim() != 4 or tuple(blob.shape[2:]) != (THREADS, STREAM_BYTES):
        raise ValueError(
            f"blob: expected shape [N/64, K/64, {THREADS}, {STREAM_BYTES}], got {tuple(blob.shape)}"
        )
    if blob.shape[0] == 0 or blob.shape[1] == 0:
        raise ValueError(f"blob: expected a non-empty block grid, got shape {tuple(blob.shape)}")
    return blob


def _check_scale(scale: object) -> float:
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise TypeError(f"scale: expected None or a real number, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    as_fp32 = torch.tensor(float(scale), dtype=torch.float32)
    if not bool(torch.isfinite(as_fp32)):
        raise ValueError(f"scale: {scale} overflows float32, the epilogue factor's type")
    return float(as_fp32)


def decode(blob: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Decode ``uint8[N/64, K/64, 128, 16]`` to ``Wt[N, K]`` (§8.1–§8.4).

    ``scale=None``: the stored weights, ``bfloat16`` (every value is exactly a bf16). A number:
    ``float64`` ``Wt · fp32(scale)``, exact (8 × 24 significant bits fit in 53). The kernel applies
    the scale to its fp32 accumulator instead, so it matches this only up to that rounding.
    """
    blob = _check_blob(blob)
    factor = None if scale is None else _check_scale(scale)
    groups, k_blocks = blob.shape[:2]
    values = _table().to(blob.device)[stream_states(blob)]  # [G, KT, 128, 32]
    rows, cols = (x.to(blob.device) for x in _coordinates())
    blocks = torch.empty(groups, k_blocks, TILE, TILE, dtype=torch.bfloat16, device=blob.device)
    blocks[:, :, rows, cols] = values
    out = blocks.permute(0, 2, 1, 3).reshape(groups * TILE, k_blocks * TILE)
    return out if factor is None else out.to(torch.float64) * factor


def _squared_error(values: torch.Tensor, target: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = (values − target)²`` in float32: one subtraction, one square (both RN-even)."""
    return torch.sub(values, target, out=out).square_()


def _viterbi(targets: torch.Tensor, lut: torch.Tensor, edge: torch.Tensor | None) -> torch.Tensor:
    """Cheapest state path ``int64[B, 32]`` for float32 ``targets[B, 32]`` (squared error).

    A state is ``(c << 12) | in_edge`` and its out-edge is ``state >> 4``; the out-edge of step j
    is the in-edge of step j+1. ``arrive[e]`` is the cost of the cheapest path so far whose last
    state has out-edge ``e``. With ``edge`` given, the in-edge of state 0 and the out-edge of
    state 31 are both forced to ``edge`` (a closed path). The forward pass keeps only ``arrive``
    per step; the trace back re-prices the 16 states of one out-edge with the same float32
    operations, so its choice (the first minimum: the smallest low nibble on a tie) is the one
    the forward minimum was taken over.
    """
    count, device = targets.shape[0], targets.device
    rows = torch.arange(count, device=device)
    arrive = torch.zeros(count, EDGES, dtype=torch.float32, device=device)
    if edge is not None:
        arrive.fill_(math.inf)
        arrive[rows, edge] = 0.0
    work = torch.empty(count, NUM_STATES, dtype=torch.float32, device=device)
    history = torch.empty(STEPS, count, EDGES, dtype=torch.float32, device=device)
    for j in range(STEPS):
        history[j] = arrive
        _squared_error(lut, targets[:, j : j + 1], work)
        work.view(count, 16, EDGES).add_(arrive.view(count, 1, EDGES))  # s = (c << 12) | in_edge
        arrive = work.view(count, EDGES, 16).amin(dim=-1)  # s = (out_edge << 4) | low nibble
    out_edge = arrive.argmin(dim=-1) if edge is None else edge
    path = torch.empty(count, STEPS, dtype=torch.int64, device=device)
    nibble = torch.arange(16, device=device)
    for j in range(STEPS - 1, -1, -1):
        states = (out_edge.unsqueeze(-1) << 4) | nibble  # [B, 16]
        arrived = history[j, rows.unsqueeze(-1), states & (EDGES - 1)]
        costs = _squared_error(lut[states], targets[:, j : j + 1], torch.empty_like(arrived))
        costs.add_(arrived)
        path[:, j] = states[rows, costs.argmin(dim=-1)]
        out_edge = path[:, j] & (EDGES - 1)  # in-edge of step j = out-edge of step j-1
    return path


def _encode_sequences(targets: torch.Tensor) -> torch.Tensor:
    """Tail-biting paths ``int64[B, 32]`` for ``targets[B, 32]``, in two passes.

    Pass 1 runs unconstrained over the sequence rotated by 16 (values 16..31 then 0..15) and reads
    the in-edge of state 0 off the middle of its path. Pass 2 is the cheapest path closed through
    that edge, so it is optimal among all closed paths sharing state 0's in-edge.
    """
    lut = _table().to(device=targets.device, dtype=torch.float32)
    half = STEPS // 2
    first = _viterbi(torch.roll(targets, shifts=-half, dims=1).contiguous(), lut, None)
    return _viterbi(targets, lut, first[:, half] & (EDGES - 1))


def _check_weights(w: object) -> torch.Tensor:
    w = check_dtype(w, _FLOAT_DTYPES, "w")
    if w.dim() != 2 or w.shape[0] == 0 or w.shape[1] == 0 or w.shape[0] % 64 or w.shape[1] % 64:
        raise ValueError(
            f"w: expected [N, K] with N and K positive multiples of 64, got {tuple(w.shape)}"
        )
    check_finite(w, "w")
    if float(w.abs().max()) > FP16_MAX:
        raise ValueError(f"w: expected values in the fp16 range |x| <= {FP16_MAX:g}")
    return w


def encode(w: torch.Tensor) -> torch.Tensor:
    """Encode ``Wt[N, K]`` (float, at codebook scale) into a blob ``uint8[N/64, K/64, 128, 16]``.

    Every thread's 32 values are quantised by the two-pass tail-biting Viterbi of
    :func:`_encode_sequences`; ``decode(encode(w))`` is exactly the chosen path's values. No
    scale is searched: divide by one first and pass it to the GEMM (or :func:`decode`).
    """
    w = _check_weights(w)
    groups, k_blocks = w.shape[0] // TILE, w.shape[1] // TILE
    rows, cols = (x.to(w.device) for x in _coordinates())
    blocks = w.reshape(groups, TILE, k_blocks, TILE).permute(0, 2, 1, 3)
    targets = blocks[:, :, rows, cols].reshape(-1, STEPS).to(torch.float32)
    paths = torch.cat(
        [
            _encode_sequences(targets[i : i + _CHUNK_SEQUENCES])
            for i in range(0, targets.shape[0], _CHUNK_SEQUENCES)
        ]
    )
    nibbles = paths & 0xF  # state j's low nibble is nibble j of the stream
    streams = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).to(torch.uint8)
    return streams.reshape(groups, k_blocks, THREADS, STREAM_BYTES)
