"""Codebooks: the value of every 16-bit trellis state, per (codebook, bits) (spec §2).

Every codebook is a pure function of (codebook, bits, state), so the reference represents each
legal pair as one ``float16[65536]`` table indexed by state (Appendix A).

* Names (lower case): ``3inst``, ``mcg``, ``mul1`` (fp16 hash family, :mod:`.fp16_hash`;
  the table does not depend on bits), ``sqg_e4m3`` (:mod:`.sqg_e4m3`) and ``sqg_fp16``
  (:mod:`.sqg_fp16`).
* Legal bits in the reference: ``3inst``/``mcg``/``mul1``: 1..8; ``sqg_e4m3``: 2..4;
  ``sqg_fp16``: 5..6. Anything else raises ``ValueError`` naming the codebook and the bits.
* :func:`state_values` caches each table and returns a fresh clone, so no caller can corrupt the
  cache. The SQG modules are imported lazily, inside the call.
"""

from __future__ import annotations

import functools
import importlib

import torch

from reference._checks import check_int, codebook_bits_message
from reference.codebooks import fp16_hash

CODEBOOKS = ("3inst", "mcg", "mul1", "sqg_e4m3", "sqg_fp16")

_LEGAL_BITS: dict[str, tuple[int, ...]] = {
    "3inst": tuple(range(1, 9)),
    "mcg": tuple(range(1, 9)),
    "mul1": tuple(range(1, 9)),
    "sqg_e4m3": (2, 3, 4),
    "sqg_fp16": (5, 6),
}

_HASH_BUILDERS = {
    "3inst": fp16_hash.values_3inst,
    "mcg": fp16_hash.values_mcg,
    "mul1": fp16_hash.values_mul1,
}

_SQG_MODULES = {
    "sqg_e4m3": "reference.codebooks.sqg_e4m3",
    "sqg_fp16": "reference.codebooks.sqg_fp16",
}


def _check_codebook_name(codebook: object) -> str:
    if not isinstance(codebook, str):
        raise TypeError(f"codebook: expected a str, got {type(codebook).__name__}")
    if codebook not in _LEGAL_BITS:
        raise ValueError(f"codebook: unknown codebook {codebook!r}; expected one of {CODEBOOKS}")
    return codebook


def legal_bits(codebook: str) -> tuple[int, ...]:
    """The bit rates the reference accepts for ``codebook``."""
    return _LEGAL_BITS[_check_codebook_name(codebook)]


def validate_codebook_bits(codebook: str, bits: int) -> tuple[str, int]:
    """Raise ``ValueError`` for an unknown codebook or an illegal pair; return the pair."""
    codebook = _check_codebook_name(codebook)
    bits = check_int(bits, "bits")
    if bits not in _LEGAL_BITS[codebook]:
        raise ValueError(codebook_bits_message(codebook, bits, _LEGAL_BITS[codebook]))
    return codebook, bits


@functools.cache
def _cached_values(codebook: str, bits: int) -> torch.Tensor:
    if codebook in _HASH_BUILDERS:
        table = _HASH_BUILDERS[codebook]()
    else:
        table = importlib.import_module(_SQG_MODULES[codebook]).values(bits)
    if not isinstance(table, torch.Tensor) or table.dtype != torch.float16:
        raise TypeError(f"codebook {codebook!r}: builder must return a float16 tensor")
    if table.shape != (fp16_hash.NUM_STATES,):
        raise ValueError(
            f"codebook {codebook!r}: builder returned shape {tuple(table.shape)}, "
            f"expected ({fp16_hash.NUM_STATES},)"
        )
    return table.detach().clone().contiguous()


def state_values(codebook: str, bits: int) -> torch.Tensor:
    """``float16[65536]``: the value of every state for a legal (codebook, bits) (a fresh copy)."""
    codebook, bits = validate_codebook_bits(codebook, bits)
    return _cached_values(codebook, bits).clone()


def _state_values_shared(codebook: str, bits: int) -> torch.Tensor:
    """The cached table itself, for read-only use inside :mod:`reference` (no copy)."""
    codebook, bits = validate_codebook_bits(codebook, bits)
    return _cached_values(codebook, bits)
