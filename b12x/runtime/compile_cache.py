"""The compile cache: one structural key per kernel specialisation, kept in memory and on disk.

Layout:
* :class:`CompileKey` (frozen, plain data): the kernel id, every codegen input as sorted
  ``(field, value)`` pairs, the target arch, the CuTe DSL version, the ABI version
  (:func:`b12x.abi.abi_version`) and a SHA-256 of the kernel module sources; :func:`make_key`
  builds one, :func:`launch_key` the key of a spec dataclass.
* :class:`CompileCache` maps keys to compiled tvm-ffi callables in memory, backed by an optional
  :class:`DiskStore`; :data:`CACHE` is THE process cache. Every launch path resolves through
  :func:`compiled_kernel`, called by :func:`b12x.launch.kinds.compiled` (the kernel-kind
  registry names the kernel id, sources and builder), so this module imports no spec, builder
  or kernel.
* Resolving a key: memory hit; else refused while frozen or capturing; else a valid disk entry
  is loaded; else ``build()`` compiles, exports to disk and loads back what it wrote.
  :func:`stats` counts hits, compiles, loads and writes (``B12X_COMPILE_STATS=FILE`` appends them
  as JSON at exit). :func:`freeze` / :func:`unfreeze` / :func:`frozen` / :func:`is_frozen`: a
  memory miss while frozen or capturing raises :class:`KernelResolutionFrozen` naming the key,
  before anything is compiled **or loaded from disk**. :func:`dump_dir` holds ``--keep-ptx``
  files.
* The disk cache (``$B12X_CACHE_DIR``, ``off`` to disable; else the XDG cache): one
  ``v1/<kernel>/<digest>.kobj`` per kernel, the digest over the key, the toolchain and the
  dependency closure of the sources; atomic ``os.replace`` writes, no locks; an entry whose
  header or payload hash disagrees is discarded with a :class:`CompileCacheWarning`.
  ``python -m b12x.runtime.compile_cache [--clear]``. Details: docs/notes/b12x.md.

Invariants: keys are structural (ints, strs, bools, floats, None, dtypes by name, tuples and
frozen dataclasses of those; anything else is a ``TypeError``), so equal keys mean the same
code and a codegen change changes the key; runtime-only values are not key fields; one cache,
one switch, and no launch path compiles behind it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from b12x.runtime.cache_keys import CompileKey, dsl_version, make_key, source_hash
from b12x.runtime.disk_store import (
    CACHE_DIR_ENV,
    DISK_FORMAT,
    STATS_FILE_ENV,
    CompileCacheWarning,
    DiskStore,
    cache_root,
    dependency_hash,
    source_closure,
    toolchain,
)

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
        self.compiled: list[CompileKey] = []  # the keys this process built (not loaded)

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
            self.compiled = []

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
            self.compiled.append(key)
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
    ``memory_hits`` / ``memory_misses``: lookups served from / missing in memory;
    ``compiled_keys`` / ``resolved_keys``: short digests of the keys built here / resolved here
    (built or loaded), so that several processes' lines count distinct specialisations.
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
        "compiled_keys": [_key_digest(k) for k in cache.compiled],
        "resolved_keys": [_key_digest(k) for k in cache.compiled_keys()],
    }


def _key_digest(key: CompileKey) -> str:
    return hashlib.sha256(key.describe().encode()).hexdigest()[:16]


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
    CACHE.compiled = []


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


def entry_files(root: Path) -> list[Path]:
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
    removed = len(entry_files(base))
    for child in base.iterdir():
        if child.is_dir() and (re.fullmatch(r"v\d+", child.name) or child.name == "dumps"):
            shutil.rmtree(child, ignore_errors=True)
    return removed
