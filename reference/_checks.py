"""Argument validation shared by every module of :mod:`reference`.

Each helper checks one property and raises before any work is done:

* ``TypeError`` for a wrong Python type or a wrong tensor dtype;
* ``ValueError`` for a wrong value, shape, range or (codebook, bits) legality.

Every message starts with the name of the offending argument (``"trellis: expected dtype
torch.int16, got torch.float32"``) so a caller can see at once which input was wrong. The helpers
return the validated value (for example the bit rate as a plain ``int``) so call sites stay short.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def check_tensor(x: object, name: str) -> torch.Tensor:
    """Require a ``torch.Tensor``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_dtype(x: object, dtypes: torch.dtype | Iterable[torch.dtype], name: str) -> torch.Tensor:
    """Require a tensor whose dtype is ``dtypes`` (one dtype or a collection of them)."""
    tensor = check_tensor(x, name)
    allowed = (dtypes,) if isinstance(dtypes, torch.dtype) else tuple(dtypes)
    if tensor.dtype not in allowed:
        wanted = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name}: expected dtype {wanted}, got {tensor.dtype}")
    return tensor


def check_integer_tensor(x: object, name: str) -> torch.Tensor:
    """Require a tensor of an integer dtype (int8/uint8/int16/int32/int64)."""
    return check_dtype(x, INTEGER_DTYPES, name)


def check_int(value: object, name: str) -> int:
    """Require a plain Python integer (``bool`` is rejected)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    return value


def check_multiple(value: int, multiple: int, name: str, *, allow_zero: bool = False) -> int:
    """Require ``value`` to be a (positive unless ``allow_zero``) multiple of ``multiple``."""
    value = check_int(value, name)
    if value < 0 or (value == 0 and not allow_zero) or value % multiple:
        raise ValueError(f"{name}: expected a positive multiple of {multiple}, got {value}")
    return value


def check_min_ndim(x: torch.Tensor, ndim: int, name: str) -> torch.Tensor:
    """Require a tensor with at least ``ndim`` dimensions."""
    if x.dim() < ndim:
        raise ValueError(f"{name}: expected at least {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def check_last_dim(x: torch.Tensor, size: int, name: str) -> torch.Tensor:
    """Require a tensor (of at least one dimension) whose last dimension equals ``size``."""
    if x.dim() < 1 or x.shape[-1] != size:
        raise ValueError(f"{name}: expected last dimension {size}, got shape {tuple(x.shape)}")
    return x


def check_finite(x: torch.Tensor, name: str) -> torch.Tensor:
    """Require a floating tensor with no NaN or infinity."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: expected finite values, found NaN or infinity")
    return x


def check_bits(bits: object, name: str = "bits", *, low: int = 1, high: int = 8) -> int:
    """Require a trellis bit rate: a plain int in ``[low, high]`` (default 1..8)."""
    value = check_int(bits, name)
    if not low <= value <= high:
        raise ValueError(f"{name}: expected a trellis bit rate in {low}..{high}, got {value}")
    return value


def check_symbol_range(symbols: torch.Tensor, bits: int, name: str) -> torch.Tensor:
    """Require every entry of an integer tensor to lie in ``[0, 2**bits)``.

    The comparison runs in int64: compared with a Python int, torch casts the scalar to the
    tensor's dtype, so ``int8 >= 128`` (and ``uint8 >= 256``) would wrap and refuse every
    valid symbol."""
    wide = symbols.to(torch.int64)
    if wide.numel() and (bool((wide < 0).any()) or bool((wide >= (1 << bits)).any())):
        raise ValueError(f"{name}: expected {bits}-bit symbols in [0, {1 << bits}), found others")
    return symbols


def codebook_bits_message(codebook: object, bits: object, legal: Iterable[int]) -> str:
    """The message for an illegal (codebook, bits) pair; names both arguments."""
    legal_text = ", ".join(str(b) for b in legal)
    return (
        f"codebook/bits: codebook {codebook!r} does not support bits={bits!r} "
        f"(legal bits: {legal_text})"
    )
