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
* Clearing: ``python -m b12x.runtime.compile_cache --clear`` (without ``--clear`` it shows the
  root, entry count and size), or ``rm -r`` of the root it prints. Entries of
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

import argparse
import atexit
import contextlib
import dataclasses
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
