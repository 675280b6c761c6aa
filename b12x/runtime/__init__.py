"""The b12x runtime: compile cache and freeze switch, caller-owned buffers, input validation.

* :mod:`b12x.runtime.compile_cache` — structural :class:`CompileKey`, the in-memory cache,
  :func:`freeze` / :func:`unfreeze` / :func:`is_frozen` and :class:`KernelResolutionFrozen`.
* :mod:`b12x.runtime.scratch` — :class:`BufferSpec`, plan-time :func:`allocate_buffers`,
  bind-time :func:`require_buffer` (the "not initialized for CUDA graph capture" errors).
* :mod:`b12x.runtime.validate` — dtype / shape / contiguity / alignment / device / legality checks.

Ops built on these (plan / bind / run) live in :mod:`b12x.ops.dense`.
"""

from b12x.runtime.compile_cache import (
    CompileKey,
    KernelResolutionFrozen,
    capture_active,
    freeze,
    frozen,
    is_frozen,
    unfreeze,
)
from b12x.runtime.scratch import BufferNotProvided, BufferSpec, allocate_buffers, require_buffer

__all__ = [
    "BufferNotProvided",
    "BufferSpec",
    "CompileKey",
    "KernelResolutionFrozen",
    "allocate_buffers",
    "capture_active",
    "freeze",
    "frozen",
    "is_frozen",
    "require_buffer",
    "unfreeze",
]
