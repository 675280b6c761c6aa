"""The mutation gate: ``python -m oracle mutate`` (README.md, issue 6).

A test suite earns trust by failing on the bugs it claims to block. This package applies a
catalogue of known regressions (one or more per class of ``spec/regression-classes.md``) to a
temporary copy of the project, runs the narrow tests or oracle checks that should catch each one,
and reports killed / survived / not-applicable / stale. A survivor is a bug in the oracle.

Layout:
* ``catalogue.toml`` — the catalogue as DATA (per mutant an id, class, tier, description, the
  rewrites, ``requires``, ``covers`` and the ``kill`` command); :mod:`.catalogue` loads and
  validates it and applies a mutant (a rewrite that no longer matches is :class:`StaleMutant`,
  which FAILS the gate: catalogue rot is caught).
* :mod:`.runner` — copy, apply, run the kill command in the copy, in parallel, with a baseline
  run; :func:`summarize` gives the kill rate per tier.
* :mod:`.forkserver` — CPU kill commands forked from a preloaded server;
  :class:`~oracle.mutate.runner.SubprocessExecutor` runs GPU ones (no CUDA after fork).
* :mod:`.probe` — where the project packages were imported from; :mod:`.cli` — the command line.

Invariants:
* The working tree is never written: every mutant runs in its own temporary copy, removed after.
* Statuses: ``killed``, ``survived``, ``not-applicable`` (always with a reason), ``stale``,
  ``error``, ``baseline-failed`` (the kill command already fails unmutated). The gate passes iff
  no mutant of the selected tier is survived, stale, error or baseline-failed. The full notes:
  docs/notes/oracle.md.
"""

from oracle.mutate.catalogue import (
    DEFAULT_CATALOGUE,
    ISSUE_CLASSES,
    Edit,
    KillCommand,
    Mutant,
    StaleMutant,
    apply_mutant,
    load_catalogue,
)
from oracle.mutate.runner import (
    COPIED_PATHS,
    FAILING_STATUSES,
    MutantResult,
    copy_project,
    gate_passed,
    run_catalogue,
    run_mutant,
    summarize,
)

__all__ = [
    "COPIED_PATHS",
    "DEFAULT_CATALOGUE",
    "FAILING_STATUSES",
    "ISSUE_CLASSES",
    "Edit",
    "KillCommand",
    "Mutant",
    "MutantResult",
    "StaleMutant",
    "apply_mutant",
    "copy_project",
    "gate_passed",
    "load_catalogue",
    "run_catalogue",
    "run_mutant",
    "summarize",
]
