"""ABI contracts (§5.2–§5.3): the static checker over b12x with its lock and pinned slots.

Two results from ``oracle.contracts.check_b12x()`` (standard library only; b12x is parsed, never
imported):

* ``contracts.abi`` fails on any violation, listing the first few with file:line, and reports
  the checker's counts (modules, calls, resolved calls, locked signatures ...) as metrics so a
  silently shrinking scope is visible;
* ``contracts.entry_calls`` fails unless every call into a marked kernel entry or shared body —
  every launch of a compiled kernel included — is bound to that entry's signature (a positional
  launch the checker cannot bind is exactly the stale-call hazard).
"""

from __future__ import annotations

from oracle import contracts
from oracle.contracts.check import REPO_ROOT
from oracle.report.report import CheckResult

__all__ = ["MAX_LISTED", "run"]

MAX_LISTED = 5


def run(ctx=None) -> list[CheckResult]:
    report = contracts.check_b12x()
    metrics = {**report.counts, "by_rule": report.by_rule()}
    return [_abi(report, metrics, REPO_ROOT), _entry_calls(report)]


def _entry_calls(report) -> CheckResult:
    resolved = report.counts.get("resolved_entry_calls", 0)
    total = report.counts.get("entry_calls", 0)
    metrics = {"resolved": resolved, "total": total}
    if resolved == total:
        return CheckResult("contracts.entry_calls", "cpu", "pass", f"{resolved}/{total}", metrics)
    why = (f"{total - resolved} of {total} calls into marked kernel entries are not bound to "
           "their signature (python -m oracle contracts -v lists them)")  # fmt: skip
    return CheckResult("contracts.entry_calls", "cpu", "fail", why, metrics)


def _abi(report, metrics, root) -> CheckResult:
    if report.ok:
        return CheckResult("contracts.abi", "cpu", "pass", "", metrics)
    listed = [v.format(root) for v in report.violations[:MAX_LISTED]]
    more = len(report.violations) - len(listed)
    reason = f"{len(report.violations)} violation(s): " + " | ".join(listed)
    if more > 0:
        reason += f" | +{more} more (python -m oracle contracts)"
    return CheckResult("contracts.abi", "cpu", "fail", reason, metrics)
