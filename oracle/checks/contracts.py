"""ABI contracts (design §5.6): the static checker over b12x with its lock and pinned slots.

One result, ``contracts.abi``: ``oracle.contracts.check_b12x()`` (standard library only; b12x is
parsed, never imported). It fails on any violation, listing the first few with file:line, and
reports the checker's counts (modules, calls, resolved calls, locked signatures ...) as metrics
so a silently shrinking scope is visible.
"""

from __future__ import annotations

from oracle.report import CheckResult

__all__ = ["MAX_LISTED", "run"]

MAX_LISTED = 5


def run(ctx=None) -> list[CheckResult]:
    from oracle.contracts import check_b12x
    from oracle.contracts.check import REPO_ROOT

    report = check_b12x()
    metrics = {**report.counts, "by_rule": report.by_rule()}
    if report.ok:
        return [CheckResult("contracts.abi", "cpu", "pass", "", metrics)]
    listed = [v.format(REPO_ROOT) for v in report.violations[:MAX_LISTED]]
    more = len(report.violations) - len(listed)
    reason = f"{len(report.violations)} violation(s): " + " | ".join(listed)
    if more > 0:
        reason += f" | +{more} more (python -m oracle contracts)"
    return [CheckResult("contracts.abi", "cpu", "fail", reason, metrics)]
