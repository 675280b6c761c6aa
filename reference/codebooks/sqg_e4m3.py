"""``sqg_e4m3``: SQG-XOR-Cheb-T12, the K2/K3/K4 codebook of b12x (spec §2.4, §2.5, App. D).

A 16-bit state (codeword) is decoded in three stages, each a small function here:

1. **Graph** (:func:`xor_graph_rank`). The codeword ``cw = (h << b) | beta`` splits into the
   retained history ``h`` (top ``w = 16 - b`` bits) and the branch symbol ``beta`` (low ``b`` bits).
   ``h`` goes through a bijective xorshift pair on ``w`` bits and an affine u32 map ``p = 0x3FA7D929
   * m + 0xC928FD8E``; the rank is ``((bitrev_b(beta) ^ (p >> (32 - b))) << w) | (p & (2^w - 1))``.
   The map is a bijection on 0..65535 for every ``b``, and the ``2^b`` successors of one history
   share the phase (low ``w`` bits) and occupy all ``2^b`` strata (top ``b`` bits). The same graph
   serves ``sqg_fp16`` at b = 5, 6 (see :mod:`reference.codebooks.sqg_fp16`).
2. **Staircase** (:func:`staircase_byte`). The sign is ``rank < 0x8000`` (negative), the magnitude
   index is ``m = (rank & 0x7FFF) ^ (0x7FFF if negative)``, and the E4M3FN code magnitude is the
   number of the 77 cut points of :data:`CHEB_TRANSITIONS` that are ``<= m``. Negative codes carry
   bit 0x80, except zero (no negative zero). 0x7F/0xFF never occur.
3. **T12** (:func:`t12_table`). The served table keeps one byte per 16 consecutive ranks: the modal
   staircase byte of ranks ``16i .. 16i+15``. A tie between two equally frequent bytes goes to the
   smaller **byte code** (unsigned 0..255), not the smaller E4M3 value: for two negative bytes that
   is the smaller magnitude. Only this reading hashes to the §2.9 fingerprint ``cca11fe5…``;
   ordering ties by E4M3 value changes exactly one entry (T12[1903]: 0xA0 by code, 0xA1 by value)
   and the hash (the tests check both facts).

:func:`direct_table` folds the graph and T12 into one 3 x 65536 byte table, ``direct[((b - 2) << 16)
| state] = T12[rank_b(state) >> 4]``. :func:`state_bytes` is one rate slice of it and :func:`values`
widens it exactly to fp16 via :func:`e4m3fn_to_float`.

Invariants: every table is built once (``functools.cache``) and handed out as a fresh clone, so
callers may mutate what they get without corrupting the cache. All integer arithmetic is int64
with explicit masks, so no step depends on fixed-width overflow.
"""

from __future__ import annotations

import functools

import torch

__all__ = [
    "CHEB_TRANSITIONS",
    "GRAPH_BITS",
    "LEGAL_BITS",
    "bitrev",
    "direct_table",
    "e4m3_to_float",
    "e4m3fn_to_float",
    "staircase_byte",
    "state_bytes",
    "t12_table",
    "values",
    "xor_graph_rank",
]

#: The 77 increasing magnitude-index cut points of the full-tail Chebyshev-normal E4M3
#: staircase (spec Appendix D, ``_CHEB_NORMAL_POSITIVE_TRANSITIONS``).
CHEB_TRANSITIONS: tuple[int, ...] = (
    17, 51, 85, 119, 153, 187, 221, 255, 289, 323, 357, 391, 426,
    460, 494, 528, 579, 647, 715, 783, 851, 919, 987, 1055, 1157, 1293,
    1429, 1565, 1701, 1837, 1973, 2108, 2312, 2583, 2854, 3124, 3395, 3665, 3934,
    4203, 4606, 5141, 5674, 6205, 6732, 7258, 7779, 8298, 9070, 10085, 11084, 12065,
    13026, 13967, 14885, 15781, 17081, 18725, 20265, 21696, 23017, 24229, 25332, 26330, 27637,
    29054, 30143, 30957, 31548, 31967, 32255, 32447, 32617, 32717, 32753, 32764, 32767,
)  # fmt: skip

#: Bitrates the XOR graph is defined for (shared by sqg_e4m3 and sqg_fp16).
GRAPH_BITS: tuple[int, ...] = (2, 3, 4, 5, 6)
#: Bitrates of the sqg_e4m3 codebook itself.
LEGAL_BITS: tuple[int, ...] = (2, 3, 4)

_AFFINE_MUL = 0x3FA7D929
_AFFINE_ADD = 0xC928FD8E
_U32 = 0xFFFFFFFF
_NUM_STATES = 1 << 16
_T12_SIZE = 4096


def _check_bits(bits: object, legal: tuple[int, ...], who: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits: expected an int, got {type(bits).__name__} ({who})")
    if bits not in legal:
        raise ValueError(f"bits: {who} accepts bits in {legal}, got {bits}")
    return bits


def _check_int_tensor(x: object, name: str, who: str, lo: int, hi: int) -> torch.Tensor:
    """Return ``x`` as int64 after checking it is an integer tensor with values in [lo, hi]."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__} ({who})")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer dtype, got {x.dtype} ({who})")
    x64 = x.to(torch.int64)
    if x64.numel() and (int(x64.min()) < lo or int(x64.max()) > hi):
        raise ValueError(
            f"{name}: values must lie in [{lo}, {hi}], "
            f"got range [{int(x64.min())}, {int(x64.max())}] ({who})"
        )
    return x64


def bitrev(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Reverse the low ``bits`` bits of each element of the int64 tensor ``x`` (higher bits
    must be zero). ``bitrev(0b01, 2) == 0b10``."""
    out = torch.zeros_like(x)
    for i in range(bits):
        out |= ((x >> i) & 1) << (bits - 1 - i)
    return out


def xor_graph_rank(cw: torch.Tensor, bits: int) -> torch.Tensor:
    """Rank (0..65535, int64) of every 16-bit codeword in ``cw`` under the §2.5 XOR graph.

    ``bits`` is the trellis bitrate b in 2..6. The result has the shape of ``cw``.
    """
    bits = _check_bits(bits, GRAPH_BITS, "xor_graph_rank")
    cw = _check_int_tensor(cw, "cw", "xor_graph_rank", 0, _NUM_STATES - 1)
    w = 16 - bits
    hm = (1 << w) - 1
    h = cw >> bits
    beta = cw & ((1 << bits) - 1)
    m = h ^ (h >> 11)
    m = m ^ ((m << 11) & hm)
    p = (_AFFINE_MUL * m + _AFFINE_ADD) & _U32  # m < 2^14, so the product fits in int64
    phase = p & hm
    syndrome = p >> (32 - bits)
    return ((bitrev(beta, bits) ^ syndrome) << w) | phase


def staircase_byte(rank: torch.Tensor) -> torch.Tensor:
    """E4M3FN byte (uint8) of the exact Chebyshev-normal staircase for each rank (0..65535)."""
    rank = _check_int_tensor(rank, "rank", "staircase_byte", 0, _NUM_STATES - 1)
    negative = rank < 0x8000
    m = (rank & 0x7FFF) ^ torch.where(negative, 0x7FFF, 0)
    cuts = torch.tensor(CHEB_TRANSITIONS, dtype=torch.int64)
    code_mag = torch.searchsorted(cuts, m, right=True)  # #{cuts <= m}
    sign = torch.where(negative & (code_mag != 0), 0x80, 0)
    return (code_mag | sign).to(torch.uint8)


def e4m3fn_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Exact float32 value of each E4M3FN byte in the uint8 tensor ``codes``.

    ``exp = (byte >> 3) & 15``, ``man = byte & 7``; normal ``(1 + man/8) * 2^(exp - 7)``,
    subnormal ``man/8 * 2^-6``; bit 7 is the sign; 0x7F / 0xFF are NaN. Every E4M3FN value is
    exactly representable in float32 (and in fp16 / bf16).
    """
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes: expected a torch.Tensor, got {type(codes).__name__}")
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes: expected dtype torch.uint8, got {codes.dtype}")
    c = codes.to(torch.int64)
    exp = (c >> 3) & 15
    man = (c & 7).to(torch.float64)
    normal = (1.0 + man / 8.0) * torch.pow(2.0, (exp - 7).to(torch.float64))
    subnormal = man / 8.0 * 2.0**-6
    mag = torch.where(exp == 0, subnormal, normal)
    mag = torch.where((c & 0x7F) == 0x7F, torch.nan, mag)
    value = torch.where((c & 0x80) != 0, -mag, mag)
    return value.to(torch.float32)  # exact: at most 4 significant bits, exponents -9..8


#: Name used in reference/README.md; same function.
e4m3_to_float = e4m3fn_to_float


def _modal_bytes(groups: torch.Tensor) -> torch.Tensor:
    """Modal byte of each row of the uint8 matrix ``groups``; ties go to the smaller byte code."""
    rows = groups.shape[0]
    row_ids = torch.arange(rows, dtype=torch.int64).unsqueeze(1)
    flat = (row_ids * 256 + groups.to(torch.int64)).reshape(-1)
    counts = torch.bincount(flat, minlength=rows * 256).reshape(rows, 256)
    # Columns are byte codes in increasing order; argmax returns the first maximal column.
    return torch.argmax(counts, dim=1).to(torch.uint8)


@functools.cache
def _t12() -> torch.Tensor:
    ranks = torch.arange(_NUM_STATES, dtype=torch.int64)
    return _modal_bytes(staircase_byte(ranks).reshape(_T12_SIZE, 16))


@functools.cache
def _direct() -> torch.Tensor:
    t12 = _t12()
    states = torch.arange(_NUM_STATES, dtype=torch.int64)
    slices = [t12[xor_graph_rank(states, b) >> 4] for b in LEGAL_BITS]
    return torch.cat(slices)


def t12_table() -> torch.Tensor:
    """The served 4096-byte T12 table (uint8[4096]); entry i covers ranks 16i..16i+15."""
    return _t12().clone()


def direct_table() -> torch.Tensor:
    """uint8[3 * 65536]: ``direct[((b - 2) << 16) | state] = T12[rank_b(state) >> 4]``."""
    return _direct().clone()


def state_bytes(bits: int) -> torch.Tensor:
    """E4M3FN byte (uint8[65536]) of every state at bitrate ``bits`` in 2..4."""
    bits = _check_bits(bits, LEGAL_BITS, "sqg_e4m3.state_bytes")
    start = (bits - 2) << 16
    return _direct()[start : start + _NUM_STATES].clone()


@functools.cache
def _values(bits: int) -> torch.Tensor:
    return e4m3fn_to_float(state_bytes(bits)).to(torch.float16)  # exact widening


def values(bits: int) -> torch.Tensor:
    """fp16 value (float16[65536]) of every state at bitrate ``bits`` in 2..4."""
    bits = _check_bits(bits, LEGAL_BITS, "sqg_e4m3.values")
    return _values(bits).clone()
