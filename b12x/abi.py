"""ABI markers for b12x kernel code, and the version of the locked kernel ABI.

Layout
------
* :func:`shared_body` marks a *shared body*: a device function that several kernels (dense, MoE,
  tiers, pairs) call. Every call into it must bind every parameter **by keyword** and must not
  rely on any default, so that a parameter inserted into the body cannot silently shift the
  arguments of a stale call site (spec §5.3, regression class R1).
* :func:`abi_entry` marks a kernel entry point whose signature is snapshotted in the ABI lock.
* :data:`ABI_LOCK_PATH` is the lock file (``fixtures/abi_lock.json`` at the repository root) and
  :func:`abi_version` reads its integer ``abi_version``; the compile-cache key includes it, so a
  cubin compiled against an older ABI is never reused.

Invariants
----------
* The markers are runtime-trivial: they return the very object they were given (tagging it with
  an attribute when the object allows it) and never change how it is called or compiled. The
  static checker (``oracle.contracts``) recognises them by their *name* in the source, so they
  must be applied as ``@shared_body`` / ``@abi_entry`` (optionally through a module attribute,
  e.g. ``@abi.shared_body``), never through an alias with another name.
* This module imports only the standard library: no torch, no cutlass, nothing from
  ``reference`` or ``oracle`` (the lock is plain JSON, which b12x may read).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["ABI_LOCK_PATH", "abi_entry", "abi_version", "shared_body"]

F = TypeVar("F", bound=Callable)

#: The ABI signature lock, ``fixtures/abi_lock.json`` at the repository root.
ABI_LOCK_PATH: Path = Path(__file__).resolve().parent.parent / "fixtures" / "abi_lock.json"

SHARED_BODY_ATTR = "__b12x_shared_body__"
ABI_ENTRY_ATTR = "__b12x_abi_entry__"


def _tag(fn: F, attribute: str, marker: str) -> F:
    if not callable(fn):
        raise TypeError(f"{marker}: expected a function or method, got {type(fn).__name__}")
    # A compiled object with __slots__ refuses the attribute; the checker goes by name anyway.
    with contextlib.suppress(AttributeError, TypeError):
        setattr(fn, attribute, True)
    return fn


def shared_body(fn: F) -> F:
    """Mark ``fn`` as a shared body: callers bind every parameter by keyword, no defaults."""
    return _tag(fn, SHARED_BODY_ATTR, "shared_body")


def abi_entry(fn: F) -> F:
    """Mark ``fn`` as a kernel entry point whose signature is locked in :data:`ABI_LOCK_PATH`."""
    return _tag(fn, ABI_ENTRY_ATTR, "abi_entry")


def abi_version(lock_path: str | Path | None = None) -> int:
    """Return the integer ``abi_version`` of the ABI lock (default :data:`ABI_LOCK_PATH`).

    Raises ``FileNotFoundError`` when the lock is absent and ``ValueError`` when it is not a JSON
    object carrying a non-negative integer ``abi_version``; a compile cache must never guess.
    """
    if lock_path is not None and not isinstance(lock_path, (str, Path)):
        raise TypeError(f"lock_path: expected str or Path, got {type(lock_path).__name__}")
    path = ABI_LOCK_PATH if lock_path is None else Path(lock_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"lock_path: ABI lock {path} not found; generate it with "
            "`python -m oracle contracts --update-lock`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"lock_path: ABI lock {path} is not valid JSON: {exc}") from exc
    version = data.get("abi_version") if isinstance(data, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(
            f"lock_path: ABI lock {path} has no non-negative integer 'abi_version' "
            f"(got {version!r})"
        )
    return version
