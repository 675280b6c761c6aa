"""The coverage gate (``python -m oracle coverage`` and the default job's coverage family).

:func:`oracle.run.coverage.problems` on synthetic records: a declared variant passes only with a
*differential* runner (kernel against the reference) and a case in the default job; a
graph-replay runner alone judges nothing against the reference; an undeclared variant is never
a problem; a b12x declaration that maps onto no registry variant is. The real registry's run is
checked end to end through the CLI (exit 0, the JSON schema, every declared variant judged).
"""

from __future__ import annotations

import json

import pytest

from oracle.cli import main
from oracle.run import coverage
from oracle.run.coverage import VariantCoverage


def record(runners=("differential",), cases=3, declared=True, name="dense/mcg/k4/fp16"):
    return VariantCoverage(name, declared, tuple(runners), cases, "" if declared else "why")


@pytest.fixture
def nothing_unmapped(monkeypatch):
    monkeypatch.setattr(coverage, "unmapped", lambda: ())


@pytest.mark.parametrize(
    "records, expected",
    [
        ([record()], []),
        ([record(runners=("decode_op",))], []),
        ([record(runners=())], ["no differential runner"]),
        ([record(runners=("graph:dense",))], ["no differential runner"]),
        ([record(runners=("graph:dense", "graph:moe"))], ["no differential runner"]),
        ([record(runners=("graph:dense", "differential"))], []),
        ([record(cases=0)], ["the default job runs none of its cases"]),
        ([record(runners=(), cases=0, declared=False)], []),
        ([record(), record(runners=("graph:x",), name="b")], ["b: declared by b12x but no"]),
    ],
)
def test_problems_of_synthetic_records(records, expected, nothing_unmapped):
    found = coverage.problems(records)
    assert len(found) == len(expected), found
    for line, needle in zip(found, expected, strict=True):
        assert needle in line, found


def test_a_declaration_no_variant_names_is_a_problem(monkeypatch):
    monkeypatch.setattr(coverage, "unmapped", lambda: (("dense/mcg/k9", "bits 9"),))
    assert coverage.problems([record()]) == [
        "b12x declares 'dense/mcg/k9', which no registry variant names: bits 9"
    ]


def test_the_coverage_command_judges_every_declared_variant(tmp_path, capsys):
    out = tmp_path / "coverage.json"
    assert main(["coverage", "-q", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == coverage.SCHEMA and data["problems"] == []
    declared = [v for v in data["variants"] if v["declared"]]
    assert declared and all(v["default_cases"] > 0 for v in declared)
    assert all(any(not r.startswith("graph:") for r in v["runners"]) for v in declared)
    assert "0 problem(s)" in capsys.readouterr().out


def test_the_coverage_command_fails_on_a_problem(monkeypatch, capsys):
    monkeypatch.setattr(coverage, "problems", lambda records=None: ["x: planted"])
    assert main(["coverage", "-q"]) == 1
    assert "PROBLEM x: planted" in capsys.readouterr().out


def test_the_default_jobs_coverage_family_passes_and_fails_with_the_gate(monkeypatch):
    from oracle.checks import coverage as family

    (result,) = family.run()
    assert (result.name, result.status) == ("coverage.declared_variants_judged", "pass")
    assert result.metrics["declared"] > 0 and result.metrics["default_cases_per_op"]["dense"] > 0
    monkeypatch.setattr(family, "problems", lambda records=None: ["x: planted"])
    (result,) = family.run()
    assert result.status == "fail" and "x: planted" in result.reason
