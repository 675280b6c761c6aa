"""The compile cache: one structural key per kernel specialisation, and the freeze switch.

Layout
------
* :class:`CompileKey` is a frozen dataclass of plain data: the kernel id, every codegen input as
  sorted ``(field, value)`` pairs, the target arch (``"sm_90"``), the CuTe DSL version, the ABI
  version read from the signature lock (:func:`b12x.abi.abi_version`) and a SHA-256 of the kernel
  module sources. :func:`make_key` builds one; :func:`key_for_spec` builds the key of a
  :class:`~b12x.kernels.specs.KernelSpec` (whose fields are every codegen input of a kernel).
* :class:`CompileCache` is an in-memory map ``CompileKey -> compiled object`` with hit/miss
  counters. :data:`CACHE` is THE process cache: every launch path resolves its kernels through
  :func:`compiled_kernel` (``cute.compile`` itself does not cache). A dense
  :class:`~b12x.kernels.specs.KernelSpec` is keyed by :func:`key_for_spec` and built by
  :func:`b12x.kernels.specs.compile_spec` (the spill-free optimisation level); another spec type
  (the grouped MoE GEMM) passes its kernel id, source modules and builder. The compiled object is
  the tvm-ffi callable, which launches on torch's current stream.
* The freeze switch: :func:`freeze`, :func:`unfreeze`, :func:`is_frozen` and the context manager
  :func:`frozen`. After warm-up the caller freezes; a cache miss while frozen, or while the
  current (or a given) CUDA stream is capturing a graph, raises :class:`KernelResolutionFrozen`
  naming the key, before anything is compiled.

Invariants
----------
* Keys are structural: values are ints, strs, bools, floats, None, torch dtypes (by name) and
  tuples / frozen dataclasses of those. Anything else (an object whose ``repr`` is an address, a
  tensor, a stream) is a ``TypeError``: two equal keys always mean the same compiled code, and a
  field that changes codegen always changes the key.
* Runtime-only values (M, pointers, split sizes passed as kernel arguments) are not key fields.
* There is one cache and one switch: :func:`b12x.kernels.specs.compiled` and
  :func:`b12x.kernels.specs.freeze` are thin aliases of :func:`compiled_kernel` and
  :func:`freeze` / :func:`unfreeze`, so no layer can compile behind the switch.
* A launch key is built once per ``(spec, arch)`` and memoised: the loaded kernel code cannot
  change under a running process (an edited source file gives a new key in the next process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from b12x.abi import abi_version

__all__ = [
    "CACHE",
    "KERNEL_SOURCE_MODULES",
    "CompileCache",
    "CompileKey",
    "KernelResolutionFrozen",
    "capture_active",
    "compiled_kernel",
    "dsl_version",
    "freeze",
    "frozen",
    "is_frozen",
    "key_for_spec",
    "launch_key",
    "make_key",
    "source_hash",
    "unfreeze",
]

#: Modules whose source is hashed into every kernel key (the device code and its helpers).
KERNEL_SOURCE_MODULES: tuple[str, ...] = (
    "b12x.formats",
    "b12x.kernels.ptx",
    "b12x.kernels.trellis_decode",
    "b12x.kernels.dense_gemm",
    "b12x.kernels.hadamard",
    "b12x.kernels.specs",
)


class KernelResolutionFrozen(RuntimeError):
    """A kernel would compile while resolution is frozen or a CUDA graph is being captured."""


_PLAIN = (int, str, bool, float, type(None))


def _structural(value: Any, where: str) -> Any:
    """``value`` as hashable plain data, or ``TypeError`` naming ``where``."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, tuple | list):
        return tuple(_structural(v, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value).__name__,) + tuple(
            (f.name, _structural(getattr(value, f.name), f"{where}.{f.name}")) for f in fields
        )
    raise TypeError(
        f"{where}: compile-key values must be plain data (int, str, bool, float, None, dtype, "
        f"tuples or dataclasses of them), got {type(value).__name__}"
    )


@dataclasses.dataclass(frozen=True)
class CompileKey:
    """Identity of one compiled kernel; equal keys mean identical generated code."""

    kernel: str
    codegen: tuple[tuple[str, Any], ...]
    arch: str
    dsl_version: str
    abi_version: int
    source_hash: str

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or not self.kernel:
            raise ValueError("kernel: expected a non-empty kernel id")
        if not isinstance(self.arch, str) or not self.arch.startswith("sm_"):
            raise ValueError(f"arch: expected something like 'sm_90', got {self.arch!r}")
        if isinstance(self.abi_version, bool) or not isinstance(self.abi_version, int):
            raise TypeError(f"abi_version: expected int, got {type(self.abi_version).__name__}")
        _structural(self.codegen, "codegen")

    def describe(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.codegen)
        return (
            f"{self.kernel}({fields}) for {self.arch} [dsl {self.dsl_version}, "
            f"abi {self.abi_version}, src {self.source_hash[:12]}]"
        )


def dsl_version() -> str:
    """The installed CuTe DSL (``nvidia-cutlass-dsl``) version, or ``"absent"``."""
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _module_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ValueError(f"modules: cannot locate the source of {name!r}")
    return Path(spec.origin)


_FILE_DIGESTS: dict[tuple[str, int, int], bytes] = {}


def _file_digest(path: Path) -> bytes:
    """SHA-256 of one file, memoised on (path, mtime, size) so an edit is always seen."""
    stat = path.stat()
    memo_key = (str(path), stat.st_mtime_ns, stat.st_size)
    digest = _FILE_DIGESTS.get(memo_key)
    if digest is None:
        digest = hashlib.sha256(path.read_bytes()).digest()
        _FILE_DIGESTS[memo_key] = digest
    return digest


def source_hash(modules: Iterable[str] = KERNEL_SOURCE_MODULES) -> str:
    """SHA-256 over the named modules' source digests (name-tagged, in the given order)."""
    digest = hashlib.sha256()
    for name in modules:
        if not isinstance(name, str):
            raise TypeError(f"modules: expected module names, got {type(name).__name__}")
        digest.update(name.encode() + b"\0" + _file_digest(_module_file(name)))
    return digest.hexdigest()


def make_key(
    kernel: str,
    codegen: Mapping[str, Any],
    *,
    arch: str,
    modules: Iterable[str] = KERNEL_SOURCE_MODULES,
    abi: int | None = None,
    dsl: str | None = None,
) -> CompileKey:
    """Build a :class:`CompileKey`; ``abi``/``dsl`` default to the lock's and the installed one."""
    if not isinstance(codegen, Mapping):
        raise TypeError(
            f"codegen: expected a mapping of codegen inputs, got {type(codegen).__name__}"
        )
    items = []
    for name in sorted(codegen):
        if not isinstance(name, str):
            raise TypeError(f"codegen: field names must be str, got {name!r}")
        items.append((name, _structural(codegen[name], f"codegen[{name!r}]")))
    return CompileKey(
        kernel=kernel,
        codegen=tuple(items),
        arch=arch,
        dsl_version=dsl_version() if dsl is None else dsl,
        abi_version=abi_version() if abi is None else abi,
        source_hash=source_hash(tuple(modules)),
    )


def key_for_spec(spec: Any, arch: str) -> CompileKey:
    """Key of a ``KernelSpec`` (a frozen dataclass holding every codegen input) for ``arch``."""
    if not dataclasses.is_dataclass(spec) or isinstance(spec, type):
        raise TypeError(f"spec: expected a KernelSpec dataclass, got {type(spec).__name__}")
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    kernel = str(fields.pop("kind", type(spec).__name__))
    return make_key(kernel, fields, arch=arch)


# ---------------------------------------------------------------------------- freeze switch

_FROZEN = False


def freeze() -> None:
    """From now on a cache miss raises :class:`KernelResolutionFrozen` (after warm-up)."""
    global _FROZEN
    _FROZEN = True


def unfreeze() -> None:
    """Allow compiles again."""
    global _FROZEN
    _FROZEN = False


def is_frozen() -> bool:
    return _FROZEN


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Freeze for the duration of the block, restoring the previous state afterwards."""
    before = _FROZEN
    freeze()
    try:
        yield
    finally:
        if not before:
            unfreeze()


def capture_active(stream: Any = None) -> bool:
    """True while ``stream`` (default: torch's current stream) is capturing a CUDA graph."""
    try:
        if stream is None:
            return bool(torch.cuda.is_current_stream_capturing())
        with torch.cuda.stream(stream):
            return bool(torch.cuda.is_current_stream_capturing())
    except (RuntimeError, AssertionError):  # CPU-only build: no stream can be capturing
        return False


# ---------------------------------------------------------------------------- the cache


class CompileCache:
    """In-memory ``CompileKey -> compiled object`` map, honouring the freeze switch."""

    def __init__(self) -> None:
        self._entries: dict[CompileKey, Any] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def compiled_keys(self) -> tuple[CompileKey, ...]:
        """The keys compiled so far, in insertion order."""
        return tuple(self._entries)

    def lookup(self, key: CompileKey) -> Any | None:
        return self._entries.get(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def get_or_compile(
        self, key: CompileKey, build: Callable[[], Any], *, stream: Any = None
    ) -> Any:
        """The cached object for ``key``; on a miss call ``build()`` unless frozen/capturing."""
        if not isinstance(key, CompileKey):
            raise TypeError(f"key: expected CompileKey, got {type(key).__name__}")
        if not callable(build):
            raise TypeError("build: expected a callable that compiles the kernel")
        found = self._entries.get(key)
        if found is not None:
            self.hits += 1
            return found
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self.hits += 1
                return found
            if _FROZEN:
                raise KernelResolutionFrozen(
                    f"kernel resolution is frozen: {key.describe()} was never warmed up"
                )
            if capture_active(stream):
                raise KernelResolutionFrozen(
                    f"cannot compile {key.describe()} during CUDA graph capture; warm it up first"
                )
            self.misses += 1
            compiled = build()
            if compiled is None:
                raise ValueError(f"build: returned None for {key.describe()}")
            self._entries[key] = compiled
            return compiled


#: The process-wide cache: the only one any launch path resolves kernels through.
CACHE = CompileCache()
_LAUNCH_KEYS: dict[tuple[Any, str, str, tuple[str, ...]], CompileKey] = {}
_KEYS_LOCK = threading.Lock()


def launch_key(
    spec: Any, arch: str, *, kernel: str | None = None, modules: Iterable[str] | None = None
) -> CompileKey:
    """The (memoised) key :func:`compiled_kernel` uses for ``spec`` on ``arch``.

    Without ``kernel``/``modules`` ``spec`` is a ``KernelSpec``: :func:`key_for_spec` (kernel id
    = its ``kind``, sources :data:`KERNEL_SOURCE_MODULES`). Otherwise every dataclass field of
    ``spec`` is a codegen input of ``kernel``, whose sources are ``modules``.
    """
    mods = KERNEL_SOURCE_MODULES if modules is None else tuple(modules)
    memo = (spec, arch, kernel or "", mods)
    key = _LAUNCH_KEYS.get(memo)
    if key is not None:
        return key
    if kernel is None:
        if modules is not None:
            raise ValueError("modules: a KernelSpec is hashed over KERNEL_SOURCE_MODULES")
        key = key_for_spec(spec, arch)
    else:
        if not dataclasses.is_dataclass(spec) or isinstance(spec, type):
            raise TypeError(f"spec: expected a frozen spec dataclass, got {type(spec).__name__}")
        codegen = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        key = make_key(kernel, codegen, arch=arch, modules=mods)
    with _KEYS_LOCK:
        return _LAUNCH_KEYS.setdefault(memo, key)


def compiled_kernel(
    spec: Any,
    arch: str,
    *,
    kernel: str | None = None,
    modules: Iterable[str] | None = None,
    build: Callable[[], Any] | None = None,
    cache: CompileCache | None = None,
) -> Any:
    """The tvm-ffi callable of ``spec`` for ``arch``, compiled at most once per key.

    A ``KernelSpec`` needs nothing else; another spec type names its ``kernel`` id, its source
    ``modules`` and a ``build()`` that compiles it. Honours the freeze switch and capture.
    """
    key = launch_key(spec, arch, kernel=kernel, modules=modules)
    if build is None:
        if kernel is not None:
            raise ValueError(f"build: {kernel} specs need their own builder")

        def build() -> Any:
            from b12x.kernels.specs import compile_spec

            return compile_spec(spec, arch).fn

    return (CACHE if cache is None else cache).get_or_compile(key, build)
