"""Validation before any launch: dtype, shape, contiguity, 16-byte alignment, device, legality.

Layout
------
* :func:`check_tensor` — one tensor against a dtype set, a rank or exact shape, contiguity,
  16-byte alignment and a device. Every failure raises ``TypeError`` (wrong type or dtype) or
  ``ValueError`` (everything else) whose message starts with the argument's name.
* :func:`is_16b_aligned` — alignment that also works under FakeTensor / meta tracing (where no data
  pointer exists): the storage offset in bytes must then be a multiple of 16, since allocator
  bases are always at least 16-byte aligned.
* :func:`check_codebook_bits` — (codebook, bits) legality through the kernel registry
  :func:`b12x.formats.resolve_format`; :func:`check_positive_int`, :func:`check_bool`,
  :func:`check_choice` and :func:`check_dtype_choice` for scalar arguments. ``bool`` is never
  accepted where an ``int`` is asked for (``True`` is an ``int`` in Python), and an ``int`` never
  where a ``bool`` is; a ``torch.SymInt`` counts as an int (shapes under dynamic tracing).

Invariants
----------
* Checks never launch, allocate or synchronise; they read metadata only.
* The order is fixed (type, dtype, rank/shape, device, contiguity, alignment) so one bad tensor
  always produces the same message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch._subclasses.fake_tensor import is_fake

from b12x.formats import resolve_format

__all__ = [
    "HALF_DTYPES",
    "check_bool",
    "check_choice",
    "check_codebook_bits",
    "check_device_arg",
    "check_extent",
    "check_row_stride",
    "check_dtype_choice",
    "check_positive_int",
    "check_tensor",
    "is_16b_aligned",
]

HALF_DTYPES = (torch.float16, torch.bfloat16)

#: The largest extent a kernel indexes: tensor shapes (and route ids) are 32-bit signed ints in
#: the compiled kernels, so a dimension or a route count past it cannot be launched.
MAX_EXTENT = 2**31 - 1


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d) for d in dtypes)


def is_16b_aligned(t: torch.Tensor) -> bool:
    """16-byte alignment of ``t``'s first element (metadata only under fake/meta tensors)."""
    offset_bytes = t.storage_offset() * t.element_size()
    if t.device.type == "meta" or is_fake(t):  # tracing: no data pointer to read
        return offset_bytes % 16 == 0
    return t.data_ptr() % 16 == 0


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype],
    ndim: int | None = None,
    shape: Sequence[int] | None = None,
    device: torch.device | None = None,
    contiguous: bool = True,
    aligned: bool = True,
) -> torch.Tensor:
    """Validate one tensor argument (module docstring); return it unchanged. A malformed check
    (``dtypes`` not torch dtypes, ``device`` not a device) raises naming that parameter."""
    if isinstance(dtypes, torch.dtype):
        dtypes = (dtypes,)
    if isinstance(dtypes, str | bytes) or not all(isinstance(d, torch.dtype) for d in dtypes):
        raise TypeError(f"dtypes: expected torch.dtype values (e.g. torch.float16), got {dtypes!r}")
    if device is not None:
        device = check_device_arg("device", device)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in tuple(dtypes):
        raise TypeError(f"{name}: expected dtype {_dtype_names(dtypes)}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {tuple(t.stride())})")
    if aligned and not is_16b_aligned(t):
        raise ValueError(f"{name}: data pointer must be 16-byte aligned")
    return t


def check_extent(name: str, value: int, *, what: str = "") -> int:
    """``value`` (an int already checked positive) within :data:`MAX_EXTENT`; raises naming
    ``name`` and the limit. A ``torch.SymInt`` (tracing) is not compared."""
    if isinstance(value, int) and value > MAX_EXTENT:
        raise ValueError(
            f"{name}: {value}{what} exceeds the kernels' index range (at most 2**31 - 1 = "
            f"{MAX_EXTENT}: shapes are 32-bit ints in the compiled kernels)"
        )
    return value


def check_row_stride(name: str, n: int, bits: int) -> int:
    """The bytes of one payload K16 row, ``2·n·bits`` (``n/16`` tiles of ``32·bits`` bytes), within
    :data:`MAX_EXTENT`: the dense kernels step between rows with a 32-bit stride, widened when
    multiplied by the row index. Raises naming ``name`` and the limit."""
    row = 2 * n * bits
    if isinstance(row, int) and row > MAX_EXTENT:
        raise ValueError(
            f"{name}: {n} columns at {bits} bits make a {row}-byte payload K16 row, past the "
            f"kernels' 32-bit row stride (at most 2**31 - 1 = {MAX_EXTENT} bytes)"
        )
    return row


def check_codebook_bits(codebook: object, bits: object) -> tuple[str, int]:
    """Legal (codebook, bits) for the kernels; raises naming ``codebook`` or ``bits``."""
    if not isinstance(codebook, str):
        raise TypeError(f"codebook: expected str, got {type(codebook).__name__}")
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits: expected int, got {type(bits).__name__}")
    fmt = resolve_format(codebook, bits)
    return fmt.name, bits


def check_positive_int(name: str, value: object) -> int:
    """A positive ``int`` (or ``torch.SymInt``), never a ``bool``; raises naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | torch.SymInt):
        raise TypeError(f"{name}: expected int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return value  # type: ignore[return-value]


def check_bool(name: str, value: object) -> bool:
    """A real ``bool`` (not ``0``/``1``, not a string such as ``'no'``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {type(value).__name__} {value!r}")
    return value


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """One of the strings ``choices``; raises naming ``name`` and listing the accepted values."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {tuple(choices)}, got {type(value).__name__}")
    if value not in tuple(choices):
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value


def check_dtype_choice(name: str, value: object, allowed: Sequence[torch.dtype]) -> torch.dtype:
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name}: expected a torch.dtype, got {type(value).__name__}")
    if value not in tuple(allowed):
        raise TypeError(f"{name}: expected {_dtype_names(allowed)}, got {value}")
    return value


def check_device_arg(name: str, value: object) -> torch.device:
    """A device to allocate on: a ``torch.device``, a device string (``"cuda:0"``, ``"cpu"``) or
    a CUDA index (not a ``bool``); returns it as a ``torch.device``."""
    if isinstance(value, bool) or not isinstance(value, torch.device | str | int):
        raise TypeError(
            f"{name}: expected a torch.device, a device string or an index, got "
            f"{type(value).__name__}"
        )
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{name}: expected a device index >= 0, got {value}")
    try:
        return torch.device("cuda", value) if isinstance(value, int) else torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{name}: {value!r} is not a device (expected e.g. 'cuda', 'cuda:0' or 'cpu')"
        ) from None
