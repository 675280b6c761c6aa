"""Legacy SQG-Cheb graph (profile 5, the W4A8-era state-table codebook; spec §2.6).

Not a W4A16 codebook id: it is covered so the W4A8 / state-table decode paths and their §2.9
fingerprints have a reference. Layout of a decode, for bitrate b in 2..4 and ``w = 16 - b``:

* ``mix(v; A, B; s0, s1, s2)`` on w bits: ``r = v; r ^= r >> s0; r *= A|1; r ^= r >> s1;
  r *= B|1; r ^= r >> s2``, with **every** step masked to w bits, the input included (the
  syndrome's pre-XOR constant 0x5105 has bits above w; only the masked reading reproduces the
  K4 fingerprint).
* ``phase = mix(h; 0x65AF, 0x16BF; 6, 4, 5)`` and
  ``syndrome = mix(h ^ 0x5105; 0x8693, 0x2A21; 2, 4, 4) & (2^b - 1)`` of the history
  ``h = cw >> b``; ``stratum = 7 * (bitrev_b(beta) ^ syndrome) mod 2^b`` of the branch
  ``beta = cw & (2^b - 1)``; ``rank = (stratum << w) | phase``.
* The byte is the **exact** staircase of the rank
  (:func:`reference.codebooks.sqg_e4m3.staircase_byte`), with no T12 compression.
* K2-Q8H4 (an FC2-only profile): swap codeword bits 2 and 4, then use the K3 graph.

Compact execution forms, built here so the equivalences the device relies on are testable:

* :func:`rank_descriptor` (2 KiB): entry j covers magnitude indices ``32j .. 32j+31``; bits 7:0
  hold ``base = #{cuts < 32j}`` over the first 75 cuts, bits 13:8 the offset of the one such
  cut inside the bucket (32 = none); the last two cuts (32764, 32767) are explicit increments.
* :func:`state_blob` (58 KiB): per history a u16 ``phase | syndrome << w`` for K2, K3, K4, then
  the descriptor.

Tables are cached (``functools.cache``) and returned as clones.
"""

from __future__ import annotations

import functools

import torch

from reference.codebooks.sqg_e4m3 import CHEB_TRANSITIONS, bitrev, staircase_byte

__all__ = [
    "EXPLICIT_CUTS",
    "LEGAL_BITS",
    "PHASE_MIXER",
    "SYNDROME_MIXER",
    "SYNDROME_PRE_XOR",
    "descriptor_code",
    "direct_table",
    "legacy_graph_rank",
    "legacy_graph_fields",
    "mix",
    "q8h4_k2_state_bytes",
    "q8h4_swap",
    "rank_descriptor",
    "state_blob",
    "state_bytes",
]

LEGAL_BITS: tuple[int, ...] = (2, 3, 4)
#: (A, B, (s0, s1, s2)) of the phase and syndrome mixers (spec §2.6, Appendix D).
PHASE_MIXER: tuple[int, int, tuple[int, int, int]] = (0x65AF, 0x16BF, (6, 4, 5))
SYNDROME_MIXER: tuple[int, int, tuple[int, int, int]] = (0x8693, 0x2A21, (2, 4, 4))
SYNDROME_PRE_XOR = 0x5105
STRATUM_MULTIPLIER = 7
#: Cut points the 2 KiB rank descriptor applies as explicit increments, not bucket offsets.
EXPLICIT_CUTS: tuple[int, ...] = (32764, 32767)

_NUM_STATES = 1 << 16
_BUCKET = 32


def _check_bits(bits: object, who: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits: expected an int, got {type(bits).__name__} ({who})")
    if bits not in LEGAL_BITS:
        raise ValueError(f"bits: {who} accepts bits in {LEGAL_BITS}, got {bits}")
    return bits


def _check_codewords(cw: object, who: str) -> torch.Tensor:
    if not isinstance(cw, torch.Tensor):
        raise TypeError(f"cw: expected a torch.Tensor, got {type(cw).__name__} ({who})")
    if cw.dtype.is_floating_point or cw.dtype.is_complex or cw.dtype == torch.bool:
        raise TypeError(f"cw: expected an integer dtype, got {cw.dtype} ({who})")
    cw = cw.to(torch.int64)
    if cw.numel() and (int(cw.min()) < 0 or int(cw.max()) >= _NUM_STATES):
        raise ValueError(f"cw: values must lie in [0, 65535] ({who})")
    return cw


def mix(v: torch.Tensor, a: int, b: int, shifts: tuple[int, int, int], width: int) -> torch.Tensor:
    """The §2.6 two-multiplier mixer on ``width`` bits (int64 in, int64 out)."""
    mask = (1 << width) - 1
    s0, s1, s2 = shifts
    r = v & mask
    r = (r ^ (r >> s0)) & mask
    r = (r * (a | 1)) & mask
    r = (r ^ (r >> s1)) & mask
    r = (r * (b | 1)) & mask
    return (r ^ (r >> s2)) & mask


def _fields_of_history(h: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = 16 - bits
    pa, pb, ps = PHASE_MIXER
    sa, sb, ss = SYNDROME_MIXER
    phase = mix(h, pa, pb, ps, w)
    syndrome = mix(h ^ SYNDROME_PRE_XOR, sa, sb, ss, w) & ((1 << bits) - 1)
    return phase, syndrome


def legacy_graph_fields(cw: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(phase, syndrome)`` of each codeword's history (both int64)."""
    bits = _check_bits(bits, "legacy_graph_fields")
    cw = _check_codewords(cw, "legacy_graph_fields")
    return _fields_of_history(cw >> bits, bits)


def legacy_graph_rank(cw: torch.Tensor, bits: int) -> torch.Tensor:
    """Rank (int64, 0..65535) of each 16-bit codeword under the legacy graph at ``bits``."""
    bits = _check_bits(bits, "legacy_graph_rank")
    cw = _check_codewords(cw, "legacy_graph_rank")
    w = 16 - bits
    phase, syndrome = _fields_of_history(cw >> bits, bits)
    beta = cw & ((1 << bits) - 1)
    stratum = (STRATUM_MULTIPLIER * (bitrev(beta, bits) ^ syndrome)) & ((1 << bits) - 1)
    return (stratum << w) | phase


def q8h4_swap(cw: torch.Tensor) -> torch.Tensor:
    """Swap bits 2 and 4 of each codeword (the K2-Q8H4 pre-permutation)."""
    cw = _check_codewords(cw, "q8h4_swap")
    bit2, bit4 = (cw >> 2) & 1, (cw >> 4) & 1
    return (cw & ~0b10100) | (bit2 << 4) | (bit4 << 2)


@functools.cache
def _state_bytes(bits: int) -> torch.Tensor:
    return staircase_byte(legacy_graph_rank(torch.arange(_NUM_STATES), bits))


def state_bytes(bits: int) -> torch.Tensor:
    """E4M3FN byte (uint8[65536]) of every state under the legacy graph at ``bits``."""
    return _state_bytes(_check_bits(bits, "sqg_legacy.state_bytes")).clone()


def direct_table() -> torch.Tensor:
    """uint8[3 * 65536]: the K2, K3, K4 legacy state bytes, concatenated in that order."""
    return torch.cat([_state_bytes(b) for b in LEGAL_BITS])


def q8h4_k2_state_bytes() -> torch.Tensor:
    """E4M3FN byte (uint8[65536]) of every K2 state under the K2-Q8H4 profile."""
    return staircase_byte(legacy_graph_rank(q8h4_swap(torch.arange(_NUM_STATES)), 3))


@functools.cache
def _rank_descriptor() -> torch.Tensor:
    bucket_cuts = [c for c in CHEB_TRANSITIONS if c not in EXPLICIT_CUTS]
    entries = []
    for j in range(_NUM_STATES // 2 // _BUCKET):
        lo = _BUCKET * j
        base = sum(1 for c in bucket_cuts if c < lo)
        inside = [c - lo for c in bucket_cuts if lo <= c < lo + _BUCKET]
        if len(inside) > 1:
            raise AssertionError(f"bucket {j} holds {len(inside)} cuts; the descriptor has one")
        offset = inside[0] if inside else _BUCKET
        entries.append(base | (offset << 8))
    return torch.tensor(entries, dtype=torch.int64)


def rank_descriptor() -> torch.Tensor:
    """The 2 KiB rank descriptor as int64[1024] holding u16 entries (see module docstring)."""
    return _rank_descriptor().clone()


def descriptor_code(m: torch.Tensor) -> torch.Tensor:
    """Code magnitude of magnitude index ``m`` (0..32767) through the rank descriptor."""
    if not isinstance(m, torch.Tensor) or m.dtype.is_floating_point:
        raise TypeError("m: expected an integer torch.Tensor")
    m = m.to(torch.int64)
    if m.numel() and (int(m.min()) < 0 or int(m.max()) > 0x7FFF):
        raise ValueError("m: values must lie in [0, 32767]")
    entry = _rank_descriptor()[m // _BUCKET]
    base, offset = entry & 0xFF, (entry >> 8) & 0x3F
    code = base + ((m % _BUCKET) >= offset).to(torch.int64)
    for cut in EXPLICIT_CUTS:
        code = code + (m >= cut).to(torch.int64)
    return code


@functools.cache
def _state_blob() -> bytes:
    parts = []
    for bits in LEGAL_BITS:
        h = torch.arange(1 << (16 - bits), dtype=torch.int64)
        phase, syndrome = _fields_of_history(h, bits)
        parts.append(phase | (syndrome << (16 - bits)))
    parts.append(_rank_descriptor())
    words = torch.cat(parts).to(torch.int32)
    return (words - ((words & 0x8000) << 1)).to(torch.int16).numpy().astype("<i2").tobytes()


def state_blob() -> bytes:
    """The 58 KiB state blob: u16 ``phase | syndrome << w`` per history for K2 (16384), K3
    (8192), K4 (4096), then the 1024-entry rank descriptor; little-endian."""
    return _state_blob()
