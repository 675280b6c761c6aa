"""The ABI signature lock: a snapshot of every locked signature, with an ABI version.

Layout
------
* Locked functions: every ``@shared_body`` / ``@abi_entry`` function plus every ``@cute.jit`` /
  ``@cute.kernel`` function of the package (decorators matched by their last name).
* The lock file (``fixtures/abi_lock.json`` for b12x) is
  ``{"abi_version": int, "signatures": {qualname: [{"name", "kind", "default", "annotation"},
  ...]}}`` with ``default``/``annotation`` as unparsed source or ``null``; keys sorted, two-space
  indent, trailing newline, so the file is byte-stable and diffs read well.
* :func:`check_lock` compares the package with the lock: ``lock-missing`` when there is no lock,
  ``lock-changed`` for every added, removed or changed signature, with a readable diff.
* :func:`update_lock` rewrites the lock; it bumps ``abi_version`` by exactly one when any
  signature changed (or starts at 1 when there was no lock) and never otherwise.

Invariants
----------
* The lock is regenerated only on purpose (``--update-lock``); a check never writes it.
* The ABI version only grows, and grows only with a signature change, so a compile-cache key
  that includes it changes exactly when a locked signature does.
"""

from __future__ import annotations

import json
from pathlib import Path

from .binding import Param, Signature
from .index import FunctionInfo, PackageIndex
from .rules import Violation

LOCKED_DECORATORS = frozenset({"shared_body", "abi_entry", "jit", "kernel"})
LOCK_CALLER = "<abi-lock>"


def locked_functions(index: PackageIndex) -> dict[str, FunctionInfo]:
    """Every function of the package whose signature belongs in the lock, by qualname."""
    return {q: f for q, f in sorted(index.functions.items()) if f.decorators & LOCKED_DECORATORS}


def snapshot(index: PackageIndex) -> dict[str, list[dict]]:
    """The ``signatures`` section of the lock for the package as it is now."""
    return {
        q: [p.to_json() for p in f.signature.params] for q, f in locked_functions(index).items()
    }


def render_lock(abi_version: int, signatures: dict[str, list[dict]]) -> str:
    document = {"abi_version": abi_version, "signatures": dict(sorted(signatures.items()))}
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def read_lock(path: str | Path) -> dict | None:
    """The lock document at ``path``, ``None`` when absent; ValueError when malformed."""
    if not isinstance(path, (str, Path)):
        raise TypeError(f"lock_path: expected str or Path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"lock_path: {path} is not valid JSON: {exc}") from exc
    version = data.get("abi_version") if isinstance(data, dict) else None
    signatures = data.get("signatures") if isinstance(data, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"lock_path: {path} has no non-negative integer 'abi_version'")
    if not isinstance(signatures, dict) or not all(
        isinstance(v, list) for v in signatures.values()
    ):
        raise ValueError(f"lock_path: {path} has no 'signatures' object of parameter lists")
    return data


def _signature_from_json(params: list[dict]) -> Signature:
    return Signature(
        tuple(
            Param(
                str(p.get("name")),
                str(p.get("kind")),
                p.get("default"),
                p.get("annotation"),
                p.get("default") is not None,
            )
            for p in params
        )
    )


def _changed_parameters(old: list[dict], new: list[dict]) -> str:
    old_by_name = {p.get("name"): p for p in old}
    new_by_name = {p.get("name"): p for p in new}
    names = [p.get("name") for p in new if old_by_name.get(p.get("name")) != p]
    names += [n for n in old_by_name if n not in new_by_name]
    old_order = [p.get("name") for p in old if p.get("name") in new_by_name]
    new_order = [p.get("name") for p in new if p.get("name") in old_by_name]
    if not names and old_order != new_order:
        names = [a for a, b in zip(new_order, old_order, strict=True) if a != b]
    return ", ".join(str(n) for n in dict.fromkeys(names))


def check_lock(index: PackageIndex, lock_path: str | Path) -> list[Violation]:
    """Violations of the package against the lock at ``lock_path``."""
    lock = read_lock(lock_path)
    current = snapshot(index)
    functions = locked_functions(index)
    if lock is None:
        return [
            Violation(
                "lock-missing",
                str(lock_path),
                0,
                LOCK_CALLER,
                "-",
                None,
                None,
                f"no ABI lock at {lock_path} ({len(current)} locked signatures); generate it "
                "with --update-lock",
            )
        ]
    version = lock["abi_version"]
    locked = lock["signatures"]
    found: list[Violation] = []
    hint = f"regenerate the lock with --update-lock (ABI v{version} -> v{version + 1})"
    for qualname in sorted(set(current) | set(locked)):
        new, old = current.get(qualname), locked.get(qualname)
        if new == old:
            continue
        fn = functions.get(qualname)
        path, line = (str(fn.path), fn.lineno) if fn is not None else (str(lock_path), 0)
        if old is None:
            rendered = _signature_from_json(new).render()
            found.append(
                Violation(
                    "lock-changed",
                    path,
                    line,
                    LOCK_CALLER,
                    qualname,
                    None,
                    rendered,
                    f"new locked signature is not in the lock; {hint}",
                )
            )
        elif new is None:
            rendered = _signature_from_json(old).render()
            found.append(
                Violation(
                    "lock-changed",
                    path,
                    line,
                    LOCK_CALLER,
                    qualname,
                    None,
                    rendered,
                    f"locked signature was removed from the package; {hint}",
                )
            )
        else:
            was, now = _signature_from_json(old).render(), _signature_from_json(new).render()
            found.append(
                Violation(
                    "lock-changed",
                    path,
                    line,
                    LOCK_CALLER,
                    qualname,
                    _changed_parameters(old, new) or None,
                    now,
                    f"signature changed: was {was}, now {now}; {hint}",
                )
            )
    return found


def update_lock(index: PackageIndex, lock_path: str | Path) -> tuple[int, bool]:
    """Rewrite the lock; return (abi_version, whether any signature changed)."""
    lock = read_lock(lock_path)
    current = snapshot(index)
    if lock is None:
        version, changed = 1, True
    else:
        changed = lock["signatures"] != current
        version = lock["abi_version"] + (1 if changed else 0)
    path = Path(lock_path)
    text = render_lock(version, current)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return version, changed
