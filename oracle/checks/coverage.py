"""The coverage family of the default job (CPU): every variant b12x declares is judged.

One result, ``coverage.declared_variants_judged``: it fails when a variant declared by b12x's
contract has no differential runner or no case in the default GPU job, or when b12x declares
something no registry variant names (:func:`oracle.run.coverage.problems`). Its metrics count the
declared, judged and undeclared variants and the default job's cases per op.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from oracle.report.report import CheckResult
from oracle.run.coverage import coverage, problems

__all__ = ["run"]


def run(ctx: Any = None) -> list[CheckResult]:
    records = coverage()
    found = problems(records)
    per_op = Counter()
    for r in records:
        per_op[r.id.split("/", 1)[0]] += r.default_cases
    metrics = {
        "variants": len(records),
        "declared": sum(r.declared for r in records),
        "judged": sum(bool(r.runners) for r in records if r.declared),
        "default_cases_per_op": dict(per_op),
    }
    if found:
        shown = "; ".join(found[:8]) + (f"; +{len(found) - 8} more" if len(found) > 8 else "")
        return [CheckResult("coverage.declared_variants_judged", "cpu", "fail", shown, metrics)]
    why = f"{metrics['declared']} declared variants, each judged and in the default job"
    return [CheckResult("coverage.declared_variants_judged", "cpu", "pass", why, metrics)]
