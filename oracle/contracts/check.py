"""One entry point that runs every contract rule over a package: :func:`check_package`.

Layout
------
* :func:`check_package` indexes the package (:mod:`.index`), resolves every call site
  (:mod:`.resolve`), applies the call rules (:mod:`.rules`) with the pinned slots
  (:mod:`.slots`), reports stale slot entries and, when a lock is given, compares the locked
  signatures (:mod:`.lock`). It returns a :class:`ContractReport`.
* :func:`default_root`, :data:`DEFAULT_LOCK_PATH` and :data:`DEFAULT_SLOTS_PATH` name the b12x
  package and its fixtures; :func:`check_b12x` is the oracle's default job.

Invariants
----------
* Standard library only; the checked package is parsed, never imported.
* ``lock_path=None`` / ``slots_path=None`` mean "no lock check" / "no pinned slots", so a
  synthetic package can be checked on its own; :func:`check_b12x` passes the real fixtures.
* Violations are sorted by (path, line, rule, parameter), so reports are stable run to run.
* A file that does not parse is a ``parse-error`` violation: what cannot be read is not passed.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .index import build_index
from .lock import check_lock, locked_functions
from .resolve import iter_call_sites
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
    """Result of one run: violations (errors), infos (unverifiable calls) and counts."""

    root: Path
    violations: list[Violation] = field(default_factory=list)
    infos: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

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
            "violations": [v.to_json() for v in self.violations],
            "infos": [v.to_json() for v in self.infos],
        }


def _sort_key(v: Violation) -> tuple:
    return (v.path, v.line, v.rule, v.parameter or "", v.expression or "")


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
    calls = resolved = 0
    for site in iter_call_sites(index):
        calls += 1
        if site.callee is None:
            continue
        resolved += 1
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
        "locked_signatures": len(locked_functions(index)),
        "pinned_slots": len(slots),
        "violations": len(report.violations),
        "infos": len(report.infos),
    }
    return report


def check_b12x() -> ContractReport:
    """The oracle's default job: b12x against fixtures/abi_lock.json and pinned_slots.json."""
    return check_package(default_root(), lock_path=DEFAULT_LOCK_PATH, slots_path=DEFAULT_SLOTS_PATH)
