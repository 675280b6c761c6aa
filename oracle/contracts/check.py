"""One entry point that runs every contract rule over a package: :func:`check_package`.

Layout
------
* :func:`check_package` indexes the package (:mod:`.index`), resolves every call site
  (:mod:`.resolve`), applies the call rules (:mod:`.rules`) with the pinned slots
  (:mod:`.slots`), reports stale slot entries and, when a lock is given, compares the locked
  signatures (:mod:`.lock`). It returns a :class:`ContractReport`.
* The report's ``entry_calls`` (:class:`~.entries.EntryCalls`) counts the calls into marked
  entries and shared bodies and how many bound by name (definition in :mod:`.entries`); the
  counts repeat them as ``entry_calls`` / ``resolved_entry_calls``.
* :func:`default_root`, :data:`DEFAULT_LOCK_PATH` and :data:`DEFAULT_SLOTS_PATH` name the b12x
  package and its fixtures; :func:`check_b12x` is the oracle's default job.

Invariants
----------
* Standard library only; the checked package is parsed, never imported.
* ``lock_path=None`` / ``slots_path=None`` mean "no lock check" / "no pinned slots", so a
  synthetic package can be checked on its own; :func:`check_b12x` passes the real fixtures.
* A launch record whose fields come from its kernel at run time (no ``__init__`` and no
  dataclass fields in the source) is not checked against its synthesised ``__init__(self)``:
  its keywords are bound to the kernel entry instead.
* Violations are sorted by (path, line, rule, parameter), so reports are stable run to run.
* A file that does not parse is a ``parse-error`` violation: what cannot be read is not passed.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .entries import (
    EntryCalls,
    check_record_definitions,
    classify,
    compile_providers,
    constructor_in_source,
    record_classes,
)
from .index import build_index
from .lock import check_lock, locked_functions
from .resolve import collect_call_sites
from .rules import Violation, check_call_site, check_shared_body_definition
from .slots import load_slots, stale_slots

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LOCK_PATH = REPO_ROOT / "fixtures" / "abi_lock.json"
DEFAULT_SLOTS_PATH = REPO_ROOT / "fixtures" / "pinned_slots.json"


def default_root() -> Path:
    """The installed ``b12x`` package directory (found without importing it)."""
    spec = importlib.util.find_spec("b12x")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return REPO_ROOT / "b12x"


@dataclass
class ContractReport:
    """Result of one run: violations (errors), infos (unverifiable calls), counts and the calls
    into marked entries."""

    root: Path
    violations: list[Violation] = field(default_factory=list)
    infos: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    entry_calls: EntryCalls = field(default_factory=EntryCalls)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_rule(self) -> dict[str, int]:
        return dict(sorted(Counter(v.rule for v in self.violations).items()))

    def to_json(self) -> dict:
        return {
            "root": str(self.root),
            "ok": self.ok,
            "counts": dict(self.counts),
            "by_rule": self.by_rule(),
            "entry_calls": self.entry_calls.to_json(),
            "violations": [v.to_json() for v in self.violations],
            "infos": [v.to_json() for v in self.infos],
        }


def _sort_key(v: Violation) -> tuple:
    return (v.path, v.line, v.rule, v.parameter or "", v.expression or "")


def _runtime_record_init(site, index, records: dict) -> bool:
    """A launch record's constructor that the source does not spell out (no ``__init__``, no
    dataclass fields): the record binding (:mod:`.entries`) checks its keywords instead."""
    callee = site.callee
    if callee.name != "__init__" or callee.class_qualname not in records:
        return False
    return not constructor_in_source(index, index.classes[callee.class_qualname])


def check_package(
    root: str | Path,
    *,
    lock_path: str | Path | None = None,
    slots_path: str | Path | None = None,
) -> ContractReport:
    """Check every call into the package at ``root`` and, optionally, its lock and slots."""
    if not isinstance(root, (str, Path)):
        raise TypeError(f"root: expected str or Path, got {type(root).__name__}")
    for name, value in (("lock_path", lock_path), ("slots_path", slots_path)):
        if value is not None and not isinstance(value, (str, Path)):
            raise TypeError(f"{name}: expected str, Path or None, got {type(value).__name__}")
    slots = load_slots(slots_path)
    index = build_index(root)
    report = ContractReport(index.root)
    found: list[Violation] = []
    for path, message in index.parse_errors:
        found.append(Violation("parse-error", str(path), 0, "-", "-", None, None, message))
    for fn in index.functions.values():
        found += check_shared_body_definition(fn)
    found += check_record_definitions(index)
    records = record_classes(index)
    sites, returns = collect_call_sites(index)
    providers = compile_providers(returns)
    record_seen: set[Violation] = set()
    calls = resolved = 0
    for site in sites:
        calls += 1
        entry_call, record_violations = classify(site, index, providers, slots)
        if entry_call is not None:
            report.entry_calls.calls.append(entry_call)
        for violation in record_violations:  # one construction may reach several launches
            if violation not in record_seen:
                record_seen.add(violation)
                found.append(violation)
        if site.callee is None:
            continue
        resolved += 1
        if _runtime_record_init(site, index, records):
            continue  # its fields come from the kernel at run time; bound to the entry above
        found += check_call_site(site, slots)
    for slot, message in stale_slots(index, slots):
        found.append(
            Violation(
                "pinned-slot",
                str(slots_path),
                0,
                "<pinned-slots>",
                slot.callee,
                slot.parameter,
                None,
                message,
            )
        )
    if lock_path is not None:
        found += check_lock(index, lock_path)
    report.violations = sorted((v for v in found if v.severity == "error"), key=_sort_key)
    report.infos = sorted((v for v in found if v.severity != "error"), key=_sort_key)
    report.counts = {
        "modules": len(index.modules),
        "classes": len(index.classes),
        "functions": len(index.functions),
        "calls": calls,
        "resolved_calls": resolved,
        "entry_calls": report.entry_calls.total,
        "resolved_entry_calls": report.entry_calls.resolved,
        "locked_signatures": len(locked_functions(index)),
        "pinned_slots": len(slots),
        "violations": len(report.violations),
        "infos": len(report.infos),
    }
    return report


def check_b12x() -> ContractReport:
    """The oracle's default job: b12x against fixtures/abi_lock.json and pinned_slots.json."""
    return check_package(default_root(), lock_path=DEFAULT_LOCK_PATH, slots_path=DEFAULT_SLOTS_PATH)
