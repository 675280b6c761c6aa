"""The compile cache: one structural key per kernel specialisation, kept in memory and on disk.

Layout
------
* :class:`CompileKey` is a frozen dataclass of plain data: the kernel id, every codegen input as
  sorted ``(field, value)`` pairs, the target arch (``"sm_90"``), the CuTe DSL version, the ABI
  version read from the signature lock (:func:`b12x.abi.abi_version`) and a SHA-256 of the kernel
  module sources. :func:`make_key` builds one; :func:`launch_key` builds (once) the key of a spec
  dataclass whose fields are every codegen input of its kernel.
* :class:`CompileCache` maps ``CompileKey -> compiled object`` in memory, backed by an optional
  :class:`DiskStore`. :data:`CACHE` is THE process cache (backed by the disk store of
  :func:`cache_root`): every launch path resolves its kernels through :func:`compiled_kernel`
  (``cute.compile`` itself does not cache). The caller names the kernel id, the source modules
  and the builder: that caller is :func:`b12x.launch.kinds.compiled`, the kernel-kind registry
  (kind name = kernel id, sources derived from the builder's imports), so this module never
  imports a spec, a builder or a kernel. The compiled object is the tvm-ffi callable, which
  launches on torch's current stream.
* Resolving a key: memory hit -> the object. Miss -> refused while frozen or capturing (below);
  else the disk entry is loaded if there is a valid one; else ``build()`` compiles, the result is
  exported to the disk entry and loaded back from it, so the object this process launches is the
  one the next process will load. :func:`stats` counts memory hits, compiles and disk loads /
  writes with their seconds; ``B12X_COMPILE_STATS=FILE`` appends them as one JSON line per
  process at exit (``benchmarks/oracle_job.py`` reads it).
* The freeze switch: :func:`freeze`, :func:`unfreeze`, :func:`is_frozen` and the context manager
  :func:`frozen`. After warm-up the caller freezes; a memory miss while frozen, or while the
  current (or a given) CUDA stream is capturing a graph, raises :class:`KernelResolutionFrozen`
  naming the key, before anything is compiled **or loaded from disk**.
* :func:`dump_dir`: where this process's ``--keep-ptx`` / ``--keep-cubin`` files go
  (:func:`b12x.launch.toolchain.compile_options` passes it as ``--dump-dir``), never the working
  directory.

The disk cache
--------------
* Where: ``$B12X_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/b12x/kernels``, else
  ``~/.cache/b12x/kernels``; ``B12X_CACHE_DIR=off`` (or ``0``/``none``/``false``) keeps kernels
  in memory only. Read when this module is imported.
* Layout under the root::

      v1/<kernel>/<digest>.kobj    one kernel; "v1" is DISK_FORMAT (entry format + digest recipe)
      v1/<kernel>/.tmp-*           a write in progress (renamed into place when complete)
      dumps/<host>-<pid>-*/        PTX/CUBIN dumps of a running process (removed at its exit,
                                   or by the next process on the host if it died first)

* ``<digest>`` = SHA-256 of canonical JSON of: the whole :class:`CompileKey` (every codegen
  field, arch, DSL version, ABI version, source hash), the toolchain (:func:`toolchain`: CuTe DSL
  and tvm-ffi versions, the DSL's CUDA flavour and its own compile-affecting settings such as
  ``CUTE_DSL_LINEINFO``, the host machine) and :func:`dependency_hash` of the key's source
  modules (every b12x module they import, transitively; the registry already passes such a
  closure, and the digest recomputes it, so no caller can leave a helper out). Our key decides
  identity; the DSL's own cache key is unused.
* A ``.kobj`` file is ``MAGIC``, an 8-byte little-endian header length, a JSON header (format,
  the key record, toolchain, dependency hash, symbol, payload SHA-256 and size, compile seconds)
  and the payload: the ELF object that ``export_to_c`` writes for a tvm-ffi compiled function,
  holding the host launcher and the cubin. Loading stages the payload to a private file and calls
  ``cutlass.cute.runtime.load_module(..., enable_tvm_ffi=True)`` (JIT-linked in memory; no GPU is
  touched until the first launch, which loads the cubin, as after a compile).
* Concurrency: writers export to a private temporary file and ``os.replace`` it into place, so
  readers (other pytest-xdist workers, the oracle's shard subprocesses) see a complete entry or
  none. Two processes that miss the same key at once may both compile; the last rename wins and
  both entries are valid. There is no lock to wait on or go stale.
* Never stale, never corrupt: an entry is used only if its header repeats the expected key,
  toolchain and dependency hash and its payload matches the recorded SHA-256; otherwise (or if the
  DSL fails to load it) it is discarded with a :class:`CompileCacheWarning` and recompiled.
* Freeze rule: a disk hit is not a compile, but it IS a kernel this process never warmed up, and
  its first launch loads a CUDA module. So the disk is consulted only where a compile would be
  allowed: frozen or capturing, a memory miss raises whatever the disk holds. The freeze switch
  keeps one meaning whatever state the disk is in.
* Clearing: ``python -m b12x.runtime.compile_cache --clear`` (``--info`` shows the root, entry
  count and size), or ``rm -r ~/.cache/b12x/kernels`` (the root printed by ``--info``). Entries of
  older sources or toolchains are never served; ``--clear`` is how to reclaim their space.

Invariants
----------
* Keys are structural: values are ints, strs, bools, floats, None, torch dtypes (by name) and
  tuples / frozen dataclasses of those. Anything else (an object whose ``repr`` is an address, a
  tensor, a stream) is a ``TypeError``: two equal keys always mean the same compiled code, and a
  field that changes codegen always changes the key.
* Runtime-only values (M, pointers, split sizes passed as kernel arguments) are not key fields.
* There is one cache and one switch; every launch path reaches :func:`compiled_kernel` through
  :func:`b12x.launch.kinds.compiled`, so no layer can compile behind the switch.
* A launch key is built once per ``(spec, arch)`` and memoised: the loaded kernel code cannot
  change under a running process (an edited source file gives a new key in the next process).
* The disk is an accelerator, never a dependency: any I/O error on it is a warning, and the
  kernel is compiled (and kept in memory) as if there were no disk cache.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from b12x.abi import abi_version

__all__ = [
    "CACHE",
    "CACHE_DIR_ENV",
    "DISK_FORMAT",
    "STATS_FILE_ENV",
    "CompileCache",
    "CompileCacheWarning",
    "CompileKey",
    "DiskStore",
    "KernelResolutionFrozen",
    "cache_root",
    "capture_active",
    "clear",
    "compiled_kernel",
    "dependency_hash",
    "dsl_version",
    "dump_dir",
    "freeze",
    "frozen",
    "is_frozen",
    "launch_key",
    "make_key",
    "source_closure",
    "source_hash",
    "stats",
    "toolchain",
    "unfreeze",
]


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


def source_hash(modules: Iterable[str]) -> str:
    """SHA-256 over the named modules' source digests (name-tagged, in the given order); a b12x
    module is read where :func:`source_closure` reads it."""
    digest = hashlib.sha256()
    for name in modules:
        if not isinstance(name, str):
            raise TypeError(f"modules: expected module names, got {type(name).__name__}")
        digest.update(name.encode() + b"\0" + _file_digest(_source_file(name)))
    return digest.hexdigest()


def make_key(
    kernel: str,
    codegen: Mapping[str, Any],
    *,
    arch: str,
    modules: Iterable[str],
    abi: int | None = None,
    dsl: str | None = None,
) -> CompileKey:
    """Build a :class:`CompileKey` hashing the sources of ``modules``; ``abi``/``dsl`` default to
    the lock's and the installed one."""
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


# ---------------------------------------------------------------------------- the disk store

#: Version of the entry format and of the digest recipe; entries live under ``<root>/v<N>/``.
DISK_FORMAT = 1
#: Cache root override; ``off`` / ``0`` / ``none`` / ``false`` / ``no`` disables the disk cache.
CACHE_DIR_ENV = "B12X_CACHE_DIR"
#: When set, each process appends its :func:`stats` to this file (one JSON line) at exit.
STATS_FILE_ENV = "B12X_COMPILE_STATS"
MAGIC = b"b12x-kobj\n"
_OFF = frozenset({"off", "0", "none", "false", "no"})
_MAX_HEADER = 1 << 20
_B12X_DIR = Path(__file__).resolve().parent.parent
#: Distributions whose versions decide the bytes of an exported kernel.
_TOOLCHAIN_DISTS = (
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-core",
    "nvidia-cutlass-dsl-libs-cu12",
    "nvidia-cutlass-dsl-libs-cu13",
    "apache-tvm-ffi",
)


class CompileCacheWarning(RuntimeWarning):
    """The disk cache could not serve or keep one entry; the kernel is compiled instead."""


class _BadEntry(Exception):
    """A disk entry that must not be used (the message says why)."""


def cache_root(environ: Mapping[str, str] | None = None) -> Path | None:
    """The disk cache root (module docstring), or None when ``B12X_CACHE_DIR`` turns it off."""
    env = os.environ if environ is None else environ
    raw = env.get(CACHE_DIR_ENV, "").strip()
    if raw.lower() in _OFF:
        return None
    if raw:
        return Path(raw).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():
        base = Path(xdg)
    else:
        home = env.get("HOME", "").strip()
        base = (Path(home) if home else Path.home()) / ".cache"
    return base / "b12x" / "kernels"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _key_record(key: CompileKey) -> dict[str, Any]:
    """Every field of ``key`` as JSON data (tuples as lists: the form a header reads back as)."""
    record = {
        "kernel": key.kernel,
        "codegen": key.codegen,
        "arch": key.arch,
        "dsl_version": key.dsl_version,
        "abi_version": key.abi_version,
        "source_hash": key.source_hash,
    }
    return json.loads(_canonical(record))


_TOOLCHAIN: dict[str, Any] | None = None


def toolchain() -> dict[str, Any]:
    """What decides an exported kernel's bytes besides its key (memoised per process).

    Package versions (the DSL, its libs flavours, tvm-ffi), ``cutlass.__version__``, the DSL's
    CUDA flavour, the DSL's own compile-affecting settings (its ``cache_key_str``: arch, lineinfo,
    assertions, compiler options, runtime library...) and the host machine. If the DSL cannot
    report its settings, every ``CUTE_DSL_*`` variable is recorded instead (stricter, never
    looser).
    """
    global _TOOLCHAIN
    if _TOOLCHAIN is not None:
        return _TOOLCHAIN
    packages = {}
    for dist in _TOOLCHAIN_DISTS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            packages[dist] = importlib.metadata.version(dist)
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "system": platform.system(),
        "packages": packages,
    }
    try:
        import cutlass
        from cutlass.base_dsl.version_info import CUDA_VERSION
        from cutlass.cutlass_dsl import CuTeDSL

        info["cutlass"] = str(getattr(cutlass, "__version__", "?"))
        info["dsl_cuda"] = str(CUDA_VERSION)
        info["dsl_settings"] = CuTeDSL._get_dsl().envar.cache_key_str()
    except Exception:  # noqa: BLE001 - a different DSL layout: record the raw environment
        info["dsl_settings"] = sorted(
            (k, v) for k, v in os.environ.items() if k.startswith(("CUTE_DSL_", "CUTLASS_"))
        )
    try:
        import tvm_ffi

        info["tvm_ffi"] = str(tvm_ffi.__version__)
    except Exception:  # noqa: BLE001
        info["tvm_ffi"] = "absent"
    _TOOLCHAIN = json.loads(_canonical(info))
    return _TOOLCHAIN


# --- the source closure: every b12x module a kernel's sources import ----------------------------

_IMPORTS: dict[tuple[str, bytes], tuple[str, ...]] = {}


def _b12x_module_path(name: str) -> Path | None:
    """The file of b12x module ``name`` (package: its ``__init__.py``), None if not a module."""
    rel = name.split(".")[1:]
    base = _B12X_DIR.joinpath(*rel)
    for candidate in ((base.with_suffix(".py"),) if rel else ()) + (base / "__init__.py",):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(path: Path, module: str) -> tuple[str, ...]:
    """Module names ``path`` imports anywhere (function bodies included), relative ones resolved;
    ``from m import x`` yields ``m`` and ``m.x`` (the caller drops what is not a module)."""
    memo = (module, _file_digest(path))
    names = _IMPORTS.get(memo)
    if names is not None:
        return names
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append(base)
            found.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    names = _IMPORTS[memo] = tuple(found)
    return names


def source_closure(modules: Iterable[str]) -> tuple[str, ...]:
    """``modules`` plus every b12x module they import, transitively, and the packages on the way
    (a package's ``__init__`` runs on import); sorted. Imports outside b12x are not followed."""
    seen: dict[str, Path] = {}
    stack = [(name, True) for name in modules]
    while stack:
        name, explicit = stack.pop()
        if name in seen:
            continue
        in_b12x = name == "b12x" or name.startswith("b12x.")
        path = _b12x_module_path(name) if in_b12x else _module_file(name)
        if path is None:
            if explicit:
                raise ValueError(f"modules: cannot locate the source of {name!r}")
            continue
        seen[name] = path
        if not in_b12x:
            continue
        parts = name.split(".")
        stack.extend((".".join(parts[:i]), False) for i in range(1, len(parts)))
        stack.extend(
            (dep, False)
            for dep in _imported_names(path, name)
            if dep == "b12x" or dep.startswith("b12x.")
        )
    return tuple(sorted(seen))


def _source_file(name: str) -> Path:
    """The file of module ``name``: a b12x module under :data:`_B12X_DIR`, any other one where
    Python would import it from."""
    if name == "b12x" or name.startswith("b12x."):
        path = _b12x_module_path(name)
        if path is None:
            raise ValueError(f"modules: cannot locate the source of {name!r}")
        return path
    return _module_file(name)


def dependency_hash(modules: Iterable[str]) -> str:
    """SHA-256 over :func:`source_closure` of ``modules`` (name-tagged file digests)."""
    digest = hashlib.sha256()
    for name in source_closure(modules):
        digest.update(name.encode() + b"\0" + _file_digest(_source_file(name)))
    return digest.hexdigest()


# --- exporting and loading through the DSL -----------------------------------------------------


def _dsl_export(compiled: Any, path: Path, symbol: str) -> bool:
    """Write ``compiled`` (a tvm-ffi compiled function) as an ELF object exporting ``symbol``.

    False for anything else (a test double, a function compiled without ``--enable-tvm-ffi``).
    """
    try:
        from cutlass.cutlass_dsl.tvm_ffi_provider import TVMFFIJitCompiledFunctionBase
    except ImportError:
        return False
    if not isinstance(compiled, TVMFFIJitCompiledFunctionBase):
        return False
    compiled.export_to_c(str(path), function_name=symbol)
    return True


def _dsl_load(path: Path, symbol: str) -> Any:
    """The tvm-ffi function ``symbol`` of the object file ``path`` (JIT-linked in memory)."""
    import cutlass.cute as cute

    module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
    return getattr(module, symbol)


def _pack(header: Mapping[str, Any], payload: bytes) -> bytes:
    text = _canonical(header).encode()
    return MAGIC + len(text).to_bytes(8, "little") + text + payload


def _unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    if not data.startswith(MAGIC):
        raise _BadEntry("not a b12x kernel entry (bad magic)")
    at = len(MAGIC)
    if len(data) < at + 8:
        raise _BadEntry("truncated header length")
    size = int.from_bytes(data[at : at + 8], "little")
    if size > _MAX_HEADER or at + 8 + size > len(data):
        raise _BadEntry(f"header length {size} does not fit the file")
    try:
        header = json.loads(data[at + 8 : at + 8 + size])
    except ValueError as exc:
        raise _BadEntry(f"unreadable header ({exc})") from None
    if not isinstance(header, dict):
        raise _BadEntry("header is not an object")
    return header, data[at + 8 + size :]


def _warn(message: str) -> None:
    warnings.warn(message, CompileCacheWarning, stacklevel=4)


class DiskStore:
    """Compiled kernels under ``root/v{DISK_FORMAT}/<kernel>/<digest>.kobj`` (module docstring).

    ``toolchain_info``, ``export`` and ``load`` default to :func:`toolchain` and the DSL's
    export / load; tests pass doubles. ``export(obj, path, symbol) -> bool`` writes an object file
    (False: ``obj`` cannot be exported); ``load(path, symbol)`` returns the callable.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        toolchain_info: Mapping[str, Any] | None = None,
        export: Callable[[Any, Path, str], bool] | None = None,
        load: Callable[[Path, str], Any] | None = None,
    ) -> None:
        self.root = Path(root)
        self._toolchain = None if toolchain_info is None else json.loads(_canonical(toolchain_info))
        self._export = _dsl_export if export is None else export
        self._load = _dsl_load if load is None else load
        self.discarded = 0

    @property
    def entries(self) -> Path:
        """The directory of this format's entries."""
        return self.root / f"v{DISK_FORMAT}"

    def identity(self, key: CompileKey, sources: Iterable[str] = ()) -> dict[str, Any]:
        """What an entry's header must repeat to be served for ``key`` (and its digest input)."""
        sources = tuple(sources)
        return {
            "format": DISK_FORMAT,
            "key": _key_record(key),
            "toolchain": toolchain() if self._toolchain is None else self._toolchain,
            "dependencies": dependency_hash(sources) if sources else "",
        }

    def path_for(self, key: CompileKey, sources: Iterable[str] = ()) -> Path:
        """The entry file of ``key`` (whether or not it exists)."""
        return self._locate(key, tuple(sources))[0]

    def _locate(self, key: CompileKey, sources: tuple[str, ...]) -> tuple[Path, dict[str, Any]]:
        identity = self.identity(key, sources)
        digest = hashlib.sha256(_canonical(identity).encode()).hexdigest()
        folder = re.sub(r"[^A-Za-z0-9_.-]", "_", key.kernel)
        return self.entries / folder / f"{digest}.kobj", identity

    def load(self, key: CompileKey, sources: Iterable[str] = ()) -> Any | None:
        """The stored kernel of ``key``, or None (absent; or bad: discarded with a warning)."""
        path, identity = self._locate(key, tuple(sources))
        try:
            before = path.stat()
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            _warn(f"compile cache: cannot read {path} ({exc}); compiling {key.describe()}")
            return None
        try:
            header, payload = _unpack(data)
            for field in ("format", "key", "toolchain", "dependencies"):
                if header.get(field) != identity[field]:
                    raise _BadEntry(f"its {field} differs from {key.describe()}'s")
            if len(payload) != header.get("payload_bytes"):
                raise _BadEntry(
                    f"payload is {len(payload)} bytes, header says {header.get('payload_bytes')}"
                )
            if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
                raise _BadEntry("payload SHA-256 mismatch")
            symbol = header.get("symbol")
            if not isinstance(symbol, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", symbol):
                raise _BadEntry(f"bad symbol {symbol!r}")
            try:
                return self._load_payload(payload, symbol)
            except Exception as exc:  # noqa: BLE001 - the DSL refused it: treat as corrupt
                raise _BadEntry(
                    f"the DSL could not load it ({type(exc).__name__}: {exc})"
                ) from None
        except _BadEntry as bad:
            _warn(f"compile cache: discarding {path}: {bad}; recompiling {key.describe()}")
            self._discard(path, before)
            return None

    def save(
        self, key: CompileKey, sources: Iterable[str], compiled: Any, *, compile_s: float = 0.0
    ) -> Any | None:
        """Export ``compiled`` into the entry of ``key`` and load it back.

        Returns the loaded callable (what the caller should keep), or None when ``compiled``
        cannot be exported or the disk refused the write (a warning says which); the caller then
        keeps ``compiled`` itself.
        """
        path, identity = self._locate(key, tuple(sources))
        symbol = "b12x_" + path.stem[:32]
        fd, staged = tempfile.mkstemp(prefix="b12x-export-", suffix=".o")
        os.close(fd)
        try:
            try:
                if not self._export(compiled, Path(staged), symbol):
                    return None
            except Exception as exc:  # noqa: BLE001 - e.g. a cross-compiled (engine-less) object
                _warn(f"compile cache: cannot export {key.describe()} ({exc}); kept in memory")
                return None
            payload = Path(staged).read_bytes()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staged)
        header = {
            **identity,
            "symbol": symbol,
            "payload_bytes": len(payload),
            "payload_sha256": hashlib.sha256(payload).hexdigest(),
            "compile_s": round(compile_s, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "describe": key.describe(),
        }
        tmp = path.parent / f".tmp-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(_pack(header, payload))
            os.replace(tmp, path)
        except OSError as exc:
            _warn(f"compile cache: cannot write {path} ({exc}); {key.describe()} kept in memory")
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None
        try:
            return self._load_payload(payload, symbol)
        except Exception as exc:  # noqa: BLE001 - never leave an entry that does not load
            _warn(f"compile cache: {path} does not load back ({exc}); discarded")
            with contextlib.suppress(OSError):
                self._discard(path, path.stat())
            return None

    def _load_payload(self, payload: bytes, symbol: str) -> Any:
        """Stage ``payload`` to a private file (the DSL loads from a path) and load ``symbol``."""
        fd, staged = tempfile.mkstemp(prefix="b12x-load-", suffix=".o")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            loaded = self._load(Path(staged), symbol)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staged)
        if loaded is None:
            raise ValueError(f"load returned None for {symbol}")
        return loaded

    def _discard(self, path: Path, seen: os.stat_result) -> None:
        """Remove ``path`` if it is still the file that was judged bad (not a fresh rewrite)."""
        self.discarded += 1
        with contextlib.suppress(OSError):
            now = path.stat()
            if (now.st_ino, now.st_mtime_ns, now.st_size) == (
                seen.st_ino,
                seen.st_mtime_ns,
                seen.st_size,
            ):
                path.unlink()


# ---------------------------------------------------------------------------- the cache


@dataclasses.dataclass
class CacheCounters:
    """What a :class:`CompileCache` did: compiles vs disk loads (and writes), with seconds."""

    compiles: int = 0
    compile_s: float = 0.0
    disk_loads: int = 0
    disk_load_s: float = 0.0
    disk_writes: int = 0
    disk_write_s: float = 0.0
    not_persisted: int = 0


class CompileCache:
    """``CompileKey -> compiled object`` in memory, over an optional :class:`DiskStore`.

    Honours the freeze switch and capture detection before touching the disk (module docstring).
    ``hits`` counts memory hits; ``misses`` counts memory misses that were resolved (by a disk
    load or a compile); :attr:`counters` tells which.
    """

    def __init__(self, disk: DiskStore | None = None) -> None:
        self._entries: dict[CompileKey, Any] = {}
        self._lock = threading.Lock()
        self.disk = disk
        self.hits = 0
        self.misses = 0
        self.counters = CacheCounters()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def compiled_keys(self) -> tuple[CompileKey, ...]:
        """The keys resolved so far (compiled or loaded), in insertion order."""
        return tuple(self._entries)

    def lookup(self, key: CompileKey) -> Any | None:
        return self._entries.get(key)

    def clear(self) -> None:
        """Forget the in-memory entries and counters (the disk is left alone: see :func:`clear`)."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0
            self.counters = CacheCounters()

    def get_or_compile(
        self,
        key: CompileKey,
        build: Callable[[], Any],
        *,
        stream: Any = None,
        sources: Iterable[str] = (),
    ) -> Any:
        """The cached object for ``key``; on a memory miss (unless frozen / capturing) the disk
        entry, else ``build()``'s result, stored to disk. ``sources`` are the key's source
        modules (their import closure joins the disk digest)."""
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
            sources = tuple(sources)
            counters = self.counters
            if self.disk is not None:
                start = time.perf_counter()
                loaded = self.disk.load(key, sources)
                if loaded is not None:
                    counters.disk_loads += 1
                    counters.disk_load_s += time.perf_counter() - start
                    self._entries[key] = loaded
                    return loaded
            start = time.perf_counter()
            compiled = build()
            seconds = time.perf_counter() - start
            if compiled is None:
                raise ValueError(f"build: returned None for {key.describe()}")
            counters.compiles += 1
            counters.compile_s += seconds
            if self.disk is not None:
                start = time.perf_counter()
                stored = self.disk.save(key, sources, compiled, compile_s=seconds)
                if stored is None:
                    counters.not_persisted += 1
                else:
                    counters.disk_writes += 1
                    counters.disk_write_s += time.perf_counter() - start
                    compiled = stored
            self._entries[key] = compiled
            return compiled


def _default_disk() -> DiskStore | None:
    root = cache_root()
    return None if root is None else DiskStore(root)


#: The process-wide cache: the only one any launch path resolves kernels through.
CACHE = CompileCache(_default_disk())
_LAUNCH_KEYS: dict[tuple[Any, str, str, tuple[str, ...]], CompileKey] = {}
_KEYS_LOCK = threading.Lock()


def stats(cache: CompileCache | None = None) -> dict[str, Any]:
    """Counters of ``cache`` (default :data:`CACHE`) as plain data.

    ``compiles`` / ``compile_s``: kernels built by ``cute.compile`` (and their seconds);
    ``disk_loads`` / ``disk_load_s``: kernels loaded from disk instead; ``disk_writes`` /
    ``disk_write_s``: entries written (export + write + load-back); ``not_persisted``: compiled
    objects that could not be exported; ``disk_discarded``: bad entries removed;
    ``memory_hits`` / ``memory_misses``: lookups served from / missing in memory.
    """
    cache = CACHE if cache is None else cache
    counters = dataclasses.asdict(cache.counters)
    for name in ("compile_s", "disk_load_s", "disk_write_s"):
        counters[name] = round(counters[name], 4)
    return {
        "cache_dir": None if cache.disk is None else str(cache.disk.root),
        "memory_hits": cache.hits,
        "memory_misses": cache.misses,
        **counters,
        "disk_discarded": 0 if cache.disk is None else cache.disk.discarded,
    }


def _write_stats_at_exit(pid: int = os.getpid()) -> None:  # noqa: B008 - the importing process
    target = os.environ.get(STATS_FILE_ENV, "").strip()
    if not target:
        return
    line = {"pid": os.getpid(), "forked": os.getpid() != pid, "argv": sys.argv[:4], **stats()}
    with contextlib.suppress(OSError), open(target, "a") as f:
        f.write(json.dumps(line) + "\n")


def _reset_counters_in_child() -> None:
    """A forked child reports its own work, not its parent's."""
    CACHE.hits = CACHE.misses = 0
    CACHE.counters = CacheCounters()


atexit.register(_write_stats_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_counters_in_child)


# ---------------------------------------------------------------------------- dumps


_DUMP_DIRS: dict[int, Path] = {}


def dump_dir() -> Path | None:
    """This process's directory for ``--keep-ptx`` / ``--keep-cubin`` files, never the cwd.

    ``<root>/dumps/<host>-<pid>-*/`` under the disk cache root (a system temporary directory
    when the disk cache is off or unwritable), created on first use and removed when the process
    exits (or, if it dies first, by the next process of the host that creates its own); the
    compiled object keeps the PTX in memory (``fn.artifacts.PTX``). Private to the process,
    so concurrent processes never read each other's same-named dumps. None when the user set
    ``CUTE_DSL_DUMP_DIR``: the DSL then writes where they asked.
    """
    if os.environ.get("CUTE_DSL_DUMP_DIR"):
        return None
    pid = os.getpid()
    current = _DUMP_DIRS.get(pid)
    if current is not None and current.is_dir():
        return current
    made = None
    root = CACHE.disk.root if CACHE.disk is not None else None
    if root is not None:
        try:
            (root / "dumps").mkdir(parents=True, exist_ok=True)
            _prune_dump_dirs(root / "dumps")
            made = Path(tempfile.mkdtemp(prefix=f"{_HOST}-{pid}-", dir=root / "dumps"))
        except OSError:
            made = None
    if made is None:
        made = Path(tempfile.mkdtemp(prefix=f"b12x-dumps-{pid}-"))
    if pid not in _DUMP_DIRS:
        atexit.register(_remove_dump_dir, pid)
    _DUMP_DIRS[pid] = made
    return made


_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", platform.node() or "host")


def _prune_dump_dirs(parent: Path) -> None:
    """Remove dump directories of this host's dead processes (a process that exits without
    running ``atexit``, e.g. a pytest-xdist worker, leaves its directory behind)."""
    for child in parent.iterdir():
        host, _, rest = child.name.rpartition("-")[0].rpartition("-")
        pid = int(rest) if rest.isdigit() else None
        if host != _HOST or pid is None or pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(child, ignore_errors=True)
        except OSError:  # alive, someone else's
            continue


def _remove_dump_dir(pid: int) -> None:
    if os.getpid() != pid:  # a forked child inherited the handler: the directory is not its own
        return
    path = _DUMP_DIRS.pop(pid, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------- resolving


def launch_key(spec: Any, arch: str, *, kernel: str, modules: Iterable[str]) -> CompileKey:
    """The key :func:`compiled_kernel` uses for ``spec`` on ``arch``, built once per process.

    Every dataclass field of ``spec`` is a codegen input of ``kernel``; ``modules`` are the
    sources hashed into the key. Memoised on ``(spec, arch, kernel, modules)``, so a launch
    costs one dictionary lookup and the loaded code cannot change under a running process.
    """
    mods = tuple(modules)
    memo = (spec, arch, kernel, mods)
    key = _LAUNCH_KEYS.get(memo)
    if key is not None:
        return key
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
    kernel: str,
    modules: Iterable[str],
    build: Callable[[], Any],
    cache: CompileCache | None = None,
) -> Any:
    """The tvm-ffi callable of ``spec`` for ``arch``, compiled at most once per key.

    ``kernel`` is the kernel id, ``modules`` the sources and ``build()`` the compile (the
    registry :mod:`b12x.launch.kinds` supplies all three). Honours the freeze switch and
    capture; a kernel another process compiled is loaded from the disk cache.
    """
    sources = tuple(modules)
    key = launch_key(spec, arch, kernel=kernel, modules=sources)
    return (CACHE if cache is None else cache).get_or_compile(key, build, sources=sources)


# ---------------------------------------------------------------------------- maintenance


def _entry_files(root: Path) -> list[Path]:
    return [
        p
        for d in sorted(root.glob("v[0-9]*"))
        if d.is_dir() and re.fullmatch(r"v\d+", d.name)
        for p in d.rglob("*.kobj")
    ]


def clear(root: str | os.PathLike[str] | None = None) -> int:
    """Delete every disk entry (all format versions) and leftover dumps under ``root`` (default
    :func:`cache_root`); returns the number of entries removed. Other files are left alone."""
    base = cache_root() if root is None else Path(root)
    if base is None or not base.is_dir():
        return 0
    removed = len(_entry_files(base))
    for child in base.iterdir():
        if child.is_dir() and (re.fullmatch(r"v\d+", child.name) or child.name == "dumps"):
            shutil.rmtree(child, ignore_errors=True)
    return removed


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m b12x.runtime.compile_cache [--dir DIR] [--clear]``: show or clear the cache."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m b12x.runtime.compile_cache",
        description="Show (default) or clear the b12x kernel disk cache.",
    )
    parser.add_argument("--dir", help="cache root (default: $B12X_CACHE_DIR, XDG or ~/.cache)")
    parser.add_argument("--clear", action="store_true", help="delete every cached kernel")
    args = parser.parse_args(None if argv is None else list(argv))
    root = Path(args.dir) if args.dir else cache_root()
    if root is None:
        print(f"disk cache is off ({CACHE_DIR_ENV}={os.environ.get(CACHE_DIR_ENV)})")
        return 0
    if args.clear:
        print(f"removed {clear(root)} kernel entries under {root}")
        return 0
    files = _entry_files(root) if root.is_dir() else []
    size = sum(p.stat().st_size for p in files if p.is_file())
    print(f"root: {root}")
    print(f"entries: {len(files)} ({size / 1e6:.1f} MB) in format v{DISK_FORMAT} and older")
    print(f"clear with: python -m b12x.runtime.compile_cache --clear  (or rm -r {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
