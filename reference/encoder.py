"""Tail-biting Viterbi encoder for trellis_t256 tiles, every codebook (spec §1.3, §1.5, §1.7).

Public names:

* ``encode(values, bits, codebook, *, returns="payload", chunk_bytes=...)``: a weight matrix ``[...,
  K, N]`` (K, N positive multiples of 16) -> the payload ``int16[..., K/16, N/16, 16·bits]``
  (``returns="payload"``, SWAP16 storage as :func:`reference.trellis.pack`) or the path's states
  ``int64[..., K/16, N/16, 256]`` in **step order** (``returns="states"``).
* ``encode_tiles(tile_values, bits, codebook, *, chunk_bytes=...)``: the core. Tiles ``[..., 256]``
  already in step order (§1.5) -> states ``int64[..., 256]``.

Invariants of the result (checked by the tests): the path is tail-biting, so
``trellis.states(trellis.pack(states & (2^b − 1)), b)`` equals the returned states, and the decoded
value of step t is ``state_values(codebook, bits)[state[t]]``, the fp16 value whose squared error
against the input the encoder minimised. Bit-exact agreement with EXL3's encoder is not a goal.
The algorithm: the trellis and the two tail-biting passes, :func:`encode_tiles`; costs and ties,
:func:`_forward`; memory layout and chunking, :func:`_layout_axes`; the closing guard,
:func:`_close_paths`.

Speed. Each step is a handful of whole-buffer torch ops, on any device. On a small CPU the loop runs
fastest single-threaded (``torch.set_num_threads(1)``; about 40–100 ms per tile for both passes on
one core); the encoder leaves the thread setting to the caller.
"""

from __future__ import annotations

import functools

import torch

from reference import bitstream, tile_order
from reference._checks import check_dtype, check_finite, check_int, check_last_dim, check_min_ndim
from reference.codebooks import _state_values_shared, validate_codebook_bits

STEPS_PER_TILE = 256
STATE_BITS = 16
FP16_MAX = 65504.0
DEFAULT_CHUNK_BYTES = 256 << 20
# Pass 1 starts here and wraps (§1.7).
_PASS1_START = 128
# Cost of an edge pass 2 may not start from; finite so the branch-index packing stays valid.
_UNREACHABLE = 2.0**100
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_RETURNS = ("payload", "states")


@functools.cache
def _branch_major_values(codebook: str, bits: int) -> torch.Tensor:
    """float32[65536]: codebook values in the ``[c, e_lo, e_hi]`` work layout (see module doc)."""
    c, e_lo, e_hi = _layout_axes(bits)
    state = (c << (STATE_BITS - bits)) | (e_hi << bits) | e_lo
    return _state_values_shared(codebook, bits).to(torch.float32)[state.reshape(-1)]


def _layout_axes(bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Broadcastable index grids ``c [C,1,1]``, ``e_lo [1,C,1]``, ``e_hi [1,1,M]``.

    Memory and layout. Per chunk of T tiles the work buffer is float32 ``[T, 65536]`` laid out ``[c,
    e_lo, e_hi]`` (``e_lo`` = low b bits of the out-edge, ``e_hi`` = its top ``16 − 2b`` bits, which
    is the in-edge's low part), so the in-edge cost broadcasts over the middle axis and the branch
    minimum reduces over the outer one. Back-pointers take ``256 · T · 2^(16−b)`` bytes (4 MiB per
    tile at b = 2, 8 MiB at b = 1), stored in the ``[e_lo, e_hi]`` edge order. Tiles are processed
    in chunks sized so back-pointers plus work buffers stay under ``chunk_bytes`` (default 256 MiB).
    Inputs must lie in the fp16 range (|w| ≤ 65504), which keeps every path cost below ~5e12, far
    from ``_UNREACHABLE``.
    """
    branches, middle = 1 << bits, 1 << (STATE_BITS - 2 * bits)
    c = torch.arange(branches).reshape(branches, 1, 1)
    e_lo = torch.arange(branches).reshape(1, branches, 1)
    e_hi = torch.arange(middle).reshape(1, 1, middle)
    return c, e_lo, e_hi


def _forward(steps: torch.Tensor, lut: torch.Tensor, start_cost: torch.Tensor, bits: int):
    """Run the Viterbi recursion over ``steps`` (float32 ``[T, S]``, visiting order).

    Returns the final edge costs float32 ``[T, E]`` (natural edge order, relative to the tile's best
    edge) and back-pointers uint8 ``[S, T, E]`` indexed by ``e_lo · M + e_hi`` (the out-edge is
    ``(e_hi << b) | e_lo``).

    Arithmetic and ties. Costs are float32 (the fp16 codebook values and the inputs are converted
    exactly or rounded to float32) and are kept relative to the tile's best edge (the per-tile
    minimum is subtracted after each step), so decisions are resolved against the excess cost rather
    than the running total. The branch search uses one ``amin`` per step: the low ``b`` mantissa
    bits of every candidate's (non-negative) cost are replaced by its branch index ``c``, so the
    minimum carries its own arg-min; among candidates whose costs agree once those low bits are
    cleared (equal, or within ``2^b`` float32 ulps) **the smallest branch ``c`` wins**, as with
    EXL3's strict ``<``. Back-pointers are uint8 ``c`` per (step, tile, edge).
    """
    tiles, count = steps.shape
    branches, middle = 1 << bits, 1 << (STATE_BITS - 2 * bits)
    edges = branches * middle
    low_mask = branches - 1
    device = steps.device
    branch_index = torch.arange(branches, dtype=torch.int32, device=device)
    branch_index = branch_index.reshape(1, branches, 1)
    work = torch.empty(tiles, 1 << STATE_BITS, dtype=torch.float32, device=device)
    work_grid = work.view(tiles, branches, branches, middle)  # [c, e_lo, e_hi]
    work_bits = work.view(torch.int32).view(tiles, branches, edges)
    back = torch.empty(count, tiles, edges, dtype=torch.uint8, device=device)
    branch = torch.empty(tiles, edges, dtype=torch.int32, device=device)
    cost = start_cost.to(torch.float32, copy=True).contiguous()
    cost_by_in_edge = cost.view(tiles, branches, 1, middle)  # in-edge = c·M + e_hi
    cost_by_out_edge = cost.view(tiles, middle, branches)  # out-edge = e_hi·C + e_lo
    for i in range(count):
        torch.sub(lut, steps[:, i, None], out=work)
        work.mul_(work)
        work_grid.add_(cost_by_in_edge)
        work_bits.bitwise_and_(~low_mask).bitwise_or_(branch_index)  # branch in low bits
        best = work.view(tiles, branches, edges).amin(dim=1)  # [T, e_lo·M + e_hi]
        best_bits = best.view(torch.int32)
        torch.bitwise_and(best_bits, low_mask, out=branch)
        back[i].copy_(branch)
        best_bits.bitwise_and_(~low_mask)
        floor = best.amin(dim=1).view(tiles, 1, 1)
        torch.sub(best.view(tiles, branches, middle).transpose(1, 2), floor, out=cost_by_out_edge)
    return cost, back


def _backtrace(back: torch.Tensor, end_edge: torch.Tensor, bits: int) -> torch.Tensor:
    """States int64 ``[T, S]`` (visiting order) of the path ending in out-edge ``end_edge``."""
    count, tiles, _ = back.shape
    middle = 1 << (STATE_BITS - 2 * bits)
    edge_shift = STATE_BITS - bits
    rows = torch.arange(tiles, device=back.device)
    path = torch.empty(tiles, count, dtype=torch.int64, device=back.device)
    edge = end_edge.to(torch.int64)
    for i in range(count - 1, -1, -1):
        stored = (edge & ((1 << bits) - 1)) * middle + (edge >> bits)
        branch = back[i, rows, stored].to(torch.int64)
        state = (branch << edge_shift) | edge
        path[:, i] = state
        edge = state >> bits
    return path


def _close_paths(path: torch.Tensor, bits: int) -> torch.Tensor:
    """Return ``path`` with every tile made tail-biting.

    A closed tile (``path[:, 0] >> b`` equals the out-edge of step 255) is returned unchanged; any
    other tile keeps its symbols (low b bits) and gets the cyclic states of §1.3.

    Every edge is reachable after ⌈(16−b)/b⌉ ≤ 15 steps, so pass 2 is always feasible for finite
    inputs. Should a tile still fail to close (a guard, not an expected event), its path's symbols
    are kept and its states are rebuilt cyclically from them (:func:`_close_paths`), which is
    tail-biting by construction (any symbol string is a legal tile) and changes only the first
    ⌈16/b⌉ − 1 states.
    """
    edge_mask = (1 << (STATE_BITS - bits)) - 1
    closed = (path[:, 0] >> bits) == (path[:, -1] & edge_mask)
    if bool(closed.all()):
        return path
    rebuilt = bitstream.cyclic_states(path & ((1 << bits) - 1), bits)
    return torch.where(closed[:, None], path, rebuilt)


def _encode_chunk(tiles: torch.Tensor, lut: torch.Tensor, bits: int) -> torch.Tensor:
    """Two-pass tail-biting Viterbi for float32 tiles ``[T, 256]`` -> states int64 ``[T, 256]``."""
    count, edges = tiles.shape[0], 1 << (STATE_BITS - bits)
    order = torch.cat([tiles[:, _PASS1_START:], tiles[:, :_PASS1_START]], dim=1).contiguous()
    free_start = torch.zeros(count, edges, dtype=torch.float32, device=tiles.device)
    cost, back = _forward(order, lut, free_start, bits)
    first_pass = _backtrace(back, cost.argmin(dim=1), bits)
    end_edge = first_pass[:, STEPS_PER_TILE - _PASS1_START] >> bits  # in-edge of step 0
    del back

    rows = torch.arange(count, device=tiles.device)
    start = torch.full((count, edges), _UNREACHABLE, dtype=torch.float32, device=tiles.device)
    start[rows, end_edge] = 0.0
    _, back = _forward(tiles, lut, start, bits)
    return _close_paths(_backtrace(back, end_edge, bits), bits)


def _chunk_tiles(bits: int, chunk_bytes: int) -> int:
    """Tiles per chunk: back-pointers plus about three float32 work rows must fit the budget."""
    per_tile = STEPS_PER_TILE * (1 << (STATE_BITS - bits)) + 3 * 4 * (1 << STATE_BITS)
    return max(1, chunk_bytes // per_tile)


def _check_values(values: object, name: str) -> torch.Tensor:
    tensor = check_dtype(values, _FLOAT_DTYPES, name)
    check_finite(tensor, name)
    if tensor.numel() and float(tensor.abs().max()) > FP16_MAX:
        raise ValueError(f"{name}: expected values in the fp16 range |x| <= {FP16_MAX:g}")
    return tensor


def _check_chunk_bytes(chunk_bytes: object) -> int:
    chunk_bytes = check_int(chunk_bytes, "chunk_bytes")
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes: expected a positive byte budget, got {chunk_bytes}")
    return chunk_bytes


def encode_tiles(
    tile_values: torch.Tensor,
    bits: int,
    codebook: str,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """Encode tiles ``[..., 256]`` in step order; return tail-biting states ``int64[..., 256]``.

    The trellis (§1.3). ``state[t] = ((state[t−1] << b) | sym[t]) & 0xFFFF``. Consecutive states
    share an *edge* of ``16 − b`` bits: the out-edge of step t is ``state[t] & (2^(16−b) − 1)`` and
    equals the in-edge of step t+1, ``state[t+1] >> b``. A state is ``(c, e)``: top branch bits
    ``c`` (b bits) over its out-edge ``e``. The Viterbi keeps one cost per edge and, per step,
    ``cost'(e) = min_c [cost(((c << (16−b)) | e) >> b) + (value(c, e) − w[t])²]``.

    Tail-biting scheme (the two passes of §1.7):

    1. Pass 1, unconstrained (all start costs 0), visits steps 128..255 then 0..127. Back-tracing
       from the cheapest final edge down to step 0 yields ``state[0]``; its in-edge is the *end
       edge*.
    2. Pass 2 visits steps 0..255 with every start edge but the end edge priced out (a large finite
       ``_UNREACHABLE``), and back-traces from the end edge at step 255. The path therefore closes:
       the out-edge of step 255 is the in-edge of step 0.
    """
    tile_values = check_dtype(tile_values, _FLOAT_DTYPES, "tile_values")
    check_min_ndim(tile_values, 1, "tile_values")
    check_last_dim(tile_values, STEPS_PER_TILE, "tile_values")
    _check_values(tile_values, "tile_values")
    codebook, bits = validate_codebook_bits(codebook, bits)
    chunk_bytes = _check_chunk_bytes(chunk_bytes)

    device = tile_values.device
    flat = tile_values.reshape(-1, STEPS_PER_TILE).to(torch.float32)
    lut = _branch_major_values(codebook, bits).to(device)
    out = torch.empty(flat.shape, dtype=torch.int64, device=device)
    step = _chunk_tiles(bits, chunk_bytes)
    for begin in range(0, flat.shape[0], step):
        out[begin : begin + step] = _encode_chunk(flat[begin : begin + step], lut, bits)
    return out.reshape(tile_values.shape)


def encode(
    values: torch.Tensor,
    bits: int,
    codebook: str,
    *,
    returns: str = "payload",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """Encode a weight matrix ``[..., K, N]`` with a tail-biting Viterbi (see module doc).

    ``returns="payload"`` gives ``int16[..., K/16, N/16, 16·bits]`` (decodable with
    :func:`reference.trellis.decode`); ``returns="states"`` gives the path's states
    ``int64[..., K/16, N/16, 256]`` in step order.
    """
    values = check_dtype(values, _FLOAT_DTYPES, "values")
    check_min_ndim(values, 2, "values")
    *_, k_dim, n_dim = values.shape
    if k_dim == 0 or n_dim == 0 or k_dim % 16 or n_dim % 16:
        raise ValueError(
            f"values: expected K and N to be positive multiples of 16, got shape "
            f"{tuple(values.shape)}"
        )
    _check_values(values, "values")
    codebook, bits = validate_codebook_bits(codebook, bits)
    if returns not in _RETURNS:
        raise ValueError(f"returns: expected one of {_RETURNS}, got {returns!r}")
    chunk_bytes = _check_chunk_bytes(chunk_bytes)

    path = encode_tiles(tile_order.matrix_to_tiles(values), bits, codebook, chunk_bytes=chunk_bytes)
    if returns == "states":
        return path
    return bitstream.pack_symbols(path & ((1 << bits) - 1), bits)
