"""CI gate: every CPU-tier mutant of the catalogue must be killed (none survived, stale or error).

The catalogue (``oracle/mutate/catalogue.toml``) is applied mutant by mutant to temporary copies
of the project; each mutant's narrow kill command runs in its copy through one fork server (the
heavy imports are paid once). Under xdist the mutants run one at a time, so the other worker
keeps running the rest of the suite; alone, they use every core.

The unmutated baseline run of the kill tests is skipped here: those same tests run on the real
tree in this very suite, so a kill test that fails unmutated already fails CI by itself
(``python -m oracle mutate`` does run the baseline).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oracle.mutate import gate_passed, load_catalogue, run_catalogue, summarize
from oracle.mutate.runner import ForkExecutor, copy_project, probe_imports, project_root


@pytest.mark.deep
def test_cpu_catalogue_has_no_survivor_and_no_stale_mutant(tmp_path):
    cpu = [m for m in load_catalogue() if m.tier == "cpu"]
    assert len(cpu) >= 15
    jobs = 1 if os.environ.get("PYTEST_XDIST_WORKER") else (os.cpu_count() or 1)
    execute = ForkExecutor()
    try:
        # The fork server's children import the copy, never the editable install.
        root = copy_project(project_root(), tmp_path / "probe")
        for name, file in probe_imports(root, execute).items():
            assert Path(file).resolve().is_relative_to(root.resolve()), (name, file)
        results = run_catalogue(cpu, jobs=jobs, baseline=False, execute=execute, timeout=240)
    finally:
        execute.close()
    table = "\n".join(
        f"{r.id:40s} {r.klass:4s} {r.status:14s} {r.seconds:6.1f}s {r.killer or r.reason}"
        for r in results
    )
    assert gate_passed(results), table
    assert summarize(results)["cpu"]["kill_rate"] == 1.0, table
    declared_only = {m.id for m in cpu if not m.edits}  # e.g. the R16 process class, with reason
    for r in results:
        if r.id in declared_only:
            assert r.status == "not-applicable" and r.reason, table
        else:
            assert r.status == "killed" and r.killer, table
