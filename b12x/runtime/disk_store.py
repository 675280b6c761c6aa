"""The disk store of the compile cache: entries shared by processes (the layout, digest,
concurrency and freshness rules: docs/notes/b12x.md, ``b12x/runtime/compile_cache.py``).

Layout
------
* :func:`cache_root` (``$B12X_CACHE_DIR`` / XDG / ``~/.cache``), :func:`toolchain` (what decides
  the bytes of an exported kernel besides the key).
* The source closure: :func:`source_closure` (every b12x module a kernel's sources import,
  transitively, lazy imports included) and :func:`dependency_hash` over it.
* :class:`DiskStore`: ``v<DISK_FORMAT>/<kernel>/<digest>.kobj`` entries (``MAGIC``, header,
  payload) written by atomic rename, verified on load, discarded with a
  :class:`CompileCacheWarning` when they must not be used; export and load through the DSL.

:mod:`b12x.runtime.compile_cache` re-exports every public name here.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from b12x.runtime.cache_keys import (
    CompileKey,
    _b12x_module_path,
    _file_digest,
    _module_file,
    _source_file,
)

#: Version of the entry format and of the digest recipe; entries live under ``<root>/v<N>/``.
DISK_FORMAT = 1
#: Cache root override; ``off`` / ``0`` / ``none`` / ``false`` / ``no`` disables the disk cache.
CACHE_DIR_ENV = "B12X_CACHE_DIR"
#: When set, each process appends its :func:`stats` to this file (one JSON line) at exit.
STATS_FILE_ENV = "B12X_COMPILE_STATS"
MAGIC = b"b12x-kobj\n"
_OFF = frozenset({"off", "0", "none", "false", "no"})
_MAX_HEADER = 1 << 20
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
#: b12x's own environment switches that change generated code (kernels read them while tracing):
#: ``B12X_DEPENDENT_LAUNCH`` (:mod:`b12x.kernels.dependent_launch`). Their values are part of
#: :func:`toolchain`, so a kernel exported under one setting is never loaded under another.
CODEGEN_ENV = ("B12X_DEPENDENT_LAUNCH",)


def toolchain() -> dict[str, Any]:
    """What decides an exported kernel's bytes besides its key (memoised per process).

    Package versions (the DSL, its libs flavours, tvm-ffi), ``cutlass.__version__``, the DSL's
    CUDA flavour, the DSL's own compile-affecting settings (its ``cache_key_str``: arch, lineinfo,
    assertions, compiler options, runtime library...) and the host machine. If the DSL cannot
    report its settings, every ``CUTE_DSL_*`` variable is recorded instead (stricter, never
    looser). b12x's codegen switches (:data:`CODEGEN_ENV`) are recorded as set (None: unset).
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
        "codegen_env": {name: os.environ.get(name) for name in CODEGEN_ENV},
    }
    try:  # lazy: CUTLASS is read only when a cache entry is keyed
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
    try:  # lazy: tvm-ffi may be absent (recorded as such)
        import tvm_ffi

        info["tvm_ffi"] = str(tvm_ffi.__version__)
    except Exception:  # noqa: BLE001
        info["tvm_ffi"] = "absent"
    _TOOLCHAIN = json.loads(_canonical(info))
    return _TOOLCHAIN


# --- the source closure: every b12x module a kernel's sources import ----------------------------

_IMPORTS: dict[tuple[str, bytes], tuple[str, ...]] = {}


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
    try:  # lazy: CUTLASS loads only when a compiled function is stored
        from cutlass.cutlass_dsl.tvm_ffi_provider import TVMFFIJitCompiledFunctionBase
    except ImportError:
        return False
    if not isinstance(compiled, TVMFFIJitCompiledFunctionBase):
        return False
    compiled.export_to_c(str(path), function_name=symbol)
    return True


def _dsl_load(path: Path, symbol: str) -> Any:
    """The tvm-ffi function ``symbol`` of the object file ``path`` (JIT-linked in memory)."""
    import cutlass.cute as cute  # lazy: CUTLASS loads only when an entry is loaded

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
