"""Catalogue completeness (CPU): the mutation gate covers issue 6 and the regression classes.

* Every regression of issue 6's list (:data:`oracle.mutate.catalogue.ISSUE_CLASSES`) is covered
  (``covers``) by at least one mutant that has a rewrite, and the seed bug, the codebook default,
  inactive routes, bf16-as-fp16, planned capacity and the removed barrier have a CPU-tier mutant
  (so CI, which has no GPU, still fails on them).
* Every class R1..R16 of ``spec/regression-classes.md`` has a mutant with a rewrite, or an entry
  without one whose ``not_applicable_reason`` documents why (R16, the process class).
* Every GPU-tier mutant has a rewrite (none is merely declared) and a narrow kill command: pytest
  node ids of single tests (no whole files or directories).
* Every kill node id of every mutant, GPU tier included, resolves at collection here on CPU, so
  a renamed GPU test fails CI instead of making its mutant "stale" only on the GPU machine.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from oracle.mutate import load_catalogue
from oracle.mutate.catalogue import ISSUE_CLASSES
from oracle.mutate.runner import child_env, project_root

R_CLASSES = tuple(f"R{i}" for i in range(1, 17))
CPU_REQUIRED = (
    "stale-positional-call",
    "codebook-default-at-tier-call",
    "inactive-route-not-masked",
    "bf16-as-fp16",
    "planned-capacity-disagrees",
    "barrier-removed",
)


def test_every_issue_regression_is_covered_by_a_rewrite():
    mutants = load_catalogue()
    covered = {tag for m in mutants if m.edits for tag in m.covers}
    assert set(ISSUE_CLASSES) - covered == set()
    for tag in CPU_REQUIRED:
        cpu = [m.id for m in mutants if tag in m.covers and m.tier == "cpu" and m.edits]
        assert cpu, f"{tag}: no CPU-tier mutant, so CI cannot catch it"


def test_every_regression_class_has_a_mutant_or_a_documented_reason():
    mutants = load_catalogue()
    for klass in R_CLASSES:
        mine = [m for m in mutants if m.klass == klass]
        assert mine, f"{klass}: no catalogue entry"
        assert any(m.edits for m in mine) or all(m.not_applicable_reason for m in mine), klass


def test_gpu_mutants_have_rewrites_and_narrow_kill_commands():
    gpu = [m for m in load_catalogue() if m.tier == "gpu"]
    assert len(gpu) >= 9
    for m in gpu:
        assert m.edits, f"{m.id}: a GPU mutant without a rewrite"
        assert m.kill.pytest and all("::" in n for n in m.kill.pytest), m.id


@pytest.mark.deep
def test_every_kill_node_id_resolves():
    node_ids = sorted({n for m in load_catalogue() for n in m.kill.pytest})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "--assert=plain",  # as the kill commands run; rewriting asserts collects nothing
            *node_ids,
        ],
        cwd=project_root(),
        env=child_env(project_root()),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    missing = re.findall(r"ERROR: (?:file or directory )?not found: (\S+)", out)
    assert missing == [] and proc.returncode == 0, out[-3000:]
    collected = set(proc.stdout.split())
    for node in node_ids:
        found = [c for c in collected if c == node or c.startswith((node + "[", node + "::"))]
        assert found, f"{node}: collects no test"
