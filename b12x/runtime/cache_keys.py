"""Compile keys: the structural identity of one kernel specialisation.

Layout
------
* :class:`CompileKey` is a frozen dataclass of plain data: the kernel id, every codegen input as
  sorted ``(field, value)`` pairs, the target arch (``"sm_90"``), the CuTe DSL version
  (:func:`dsl_version`), the ABI version read from the signature lock
  (:func:`b12x.abi.abi_version`) and :func:`source_hash`, a SHA-256 of the kernel's source
  modules. :func:`make_key` builds one.

Invariants
----------
* Keys are structural: values are ints, strs, bools, floats, None, torch dtypes (by name) and
  tuples / frozen dataclasses of those. Anything else (an object whose ``repr`` is an address, a
  tensor, a stream) is a ``TypeError``: two equal keys always mean the same compiled code.
* A source file is hashed once per (path, size, mtime) in a process.

:mod:`b12x.runtime.compile_cache` re-exports every public name here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from b12x.abi import abi_version

_PLAIN = (int, str, bool, float, type(None))
#: The b12x package directory: where a b12x module's source is read from.
_B12X_DIR = Path(__file__).resolve().parent.parent


def _b12x_module_path(name: str) -> Path | None:
    """The file of b12x module ``name`` (package: its ``__init__.py``), None if not a module."""
    rel = name.split(".")[1:]
    base = _B12X_DIR.joinpath(*rel)
    for candidate in ((base.with_suffix(".py"),) if rel else ()) + (base / "__init__.py",):
        if candidate.is_file():
            return candidate
    return None


def _source_file(name: str) -> Path:
    """The file of module ``name``: a b12x module under :data:`_B12X_DIR`, any other one where
    Python would import it from."""
    if name == "b12x" or name.startswith("b12x."):
        path = _b12x_module_path(name)
        if path is None:
            raise ValueError(f"modules: cannot locate the source of {name!r}")
        return path
    return _module_file(name)


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
