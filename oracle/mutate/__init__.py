"""The mutation gate: ``python -m oracle mutate`` (design §5.9, issue 6).

A test suite earns trust by failing on the bugs it claims to block. This package applies a
catalogue of known regressions (one or more per class of ``spec/regression-classes.md``) to a
temporary copy of the project, runs the narrow tests or oracle checks that should catch each one,
and reports killed / survived / not-applicable / stale. A survivor is a bug in the oracle.

Layout:
* ``catalogue.toml`` — the catalogue as DATA: per mutant an ``id``, regression ``class`` (R1..R16),
  ``tier`` (``cpu``/``gpu``), ``description``, the rewrite (``[[mutant.edit]]`` entries: exact-text
  patches ``old -> new``, once or ``all = true``, or an AST rewrite), an optional ``requires``
  (paths that must exist, else "not-applicable"), ``covers`` (tags of :data:`ISSUE_CLASSES`, the
  regressions issue 6 lists) and the ``kill`` command (pytest node ids and/or oracle check
  families). GPU-tier regressions with a CPU-observable symptom have a ``-static`` CPU sibling.
* :mod:`.catalogue` — :class:`Mutant` / :class:`Edit` / :class:`KillCommand`, :func:`load_catalogue`
  (validated) and :func:`apply_mutant` (exact-once patches, AST rewrites; :class:`StaleMutant` when
  a rewrite no longer matches the code, which FAILS the gate: catalogue rot is caught).
* :mod:`.runner` — :func:`copy_project` (only reference/, b12x/, oracle/, tests/, fixtures/,
  pyproject.toml, conftest.py), :func:`run_mutant` (copy, apply, run the kill command with
  the copy first on ``PYTHONPATH``/``sys.path``, other project checkouts dropped, a carried DSL
  kept, and the working directory set to the copy) and :func:`run_catalogue` (parallel, the
  baseline run of the kill tests alongside) returning :class:`MutantResult` s; :func:`summarize`
  gives the kill rate per tier (killed / runnable).
* :mod:`.forkserver` — CPU kill commands are forked from one server process that has already
  imported torch, pytest, hypothesis and cutlass (about 1 s per mutant instead of about 5 s);
  :class:`~oracle.mutate.runner.SubprocessExecutor` runs GPU kill commands (no CUDA after fork)
  and is the portable fallback.
* :mod:`.probe` — ``python -m oracle.mutate.probe`` prints where the project packages were
  imported from (tests prove a kill command imports the copy, not the editable install).
* :mod:`.cli` — ``python -m oracle mutate [--tier cpu|gpu|all] [--json FILE] [--only ID,...]``.

Invariants:
* The working tree is never written: every mutant runs in its own temporary copy, removed after.
* Statuses: ``killed`` (the kill command failed on the mutant), ``survived`` (it passed),
  ``not-applicable`` (the code it needs does not exist yet, or a GPU mutant without a GPU; always
  with a reason), ``stale`` (the rewrite or the kill command no longer matches the project),
  ``error`` (timeout or a runner crash), ``baseline-failed`` (the kill command already fails on
  the unmutated copy: nothing is proven). The gate passes iff no mutant of the selected tier is
  survived, stale, error or baseline-failed.
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
