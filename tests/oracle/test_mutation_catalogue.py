"""The mutation gate's machinery: catalogue loading and validation, exact-once patches, the AST
rewrite, stale detection, project copies, the runner's verdicts on a tiny synthetic project, the
kill rate summary and the CLI. The real catalogue is run by ``test_mutation_gate.py``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import textwrap
from pathlib import Path

import pytest

from oracle.mutate import (
    COPIED_PATHS,
    Edit,
    KillCommand,
    Mutant,
    StaleMutant,
    apply_mutant,
    copy_project,
    gate_passed,
    load_catalogue,
    run_mutant,
    summarize,
)
from oracle.mutate.catalogue import apply_edit
from oracle.mutate.cli import main as mutate_main
from oracle.mutate.cli import select
from oracle.mutate.runner import (
    MutantResult,
    SubprocessExecutor,
    child_pythonpath,
    foreign_path_entries,
    make_executor,
    probe,
    probe_imports,
    project_root,
    run_catalogue,
)

REQUIRED_CLASSES = {"R1", "R2", "R3", "R4", "R5", "R6", "R7", "R8", "R9", "R11", "R13", "R14"}
REQUIRED_IDS = {
    "seed-shifted-positional-call",
    "codebook-default-flipped",
    "k6-small-m-row-removed",
    "fc2-pin-tile-floor-reimposed",
    "b12x-window-off-by-one",
    "reference-window-off-by-one",
    "pair-k-axis-low-high-swapped",
    "pair-n-axis-interleave-skipped",
    "tail-row-unwritten-run",
    "allocation-in-run",
    "compile-key-field-dropped",
    "index-stride-narrowed-int32",
    "inactive-route-not-masked",
    "bf16-as-fp16-reference",
    "bf16-as-fp16-plan",
    "planned-splits-disagree-with-launch",
    "barrier-removed-before-smem-reuse",
}


def _mutant(edits, pytest_ids=("tests/test_m.py",), **kw) -> Mutant:
    return Mutant(
        id=kw.pop("id", "m"),
        klass="R1",
        tier=kw.pop("tier", "cpu"),
        description="d",
        edits=tuple(edits),
        kill=KillCommand(pytest=tuple(pytest_ids)),
        **kw,
    )


# ------------------------------------------------------------------------ the real catalogue


def test_packaged_catalogue_covers_the_issue_list():
    mutants = load_catalogue()
    assert {m.id for m in mutants} >= REQUIRED_IDS
    assert {m.klass for m in mutants} >= REQUIRED_CLASSES
    assert {m.tier for m in mutants} == {"cpu", "gpu"}
    for m in mutants:
        assert m.edits or m.not_applicable_reason, m.id


def test_every_rewrite_of_the_catalogue_applies_exactly_once(tmp_path):
    root = copy_project(project_root(), tmp_path / "copy")
    pristine = {p: p.read_bytes() for p in root.rglob("*.py")}
    for m in load_catalogue():
        for path, data in pristine.items():  # reset the files the previous mutant touched
            if path.read_bytes() != data:
                path.write_bytes(data)
        apply_mutant(m, root)  # raises StaleMutant on catalogue rot
        for f in m.files:
            compile((root / f).read_text(), f, "exec")  # the mutant is still valid Python


# ------------------------------------------------------------------------ loading / validation


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cat.toml"
    path.write_text(textwrap.dedent(text))
    return path


GOOD = """
[[mutant]]
id = "a"
class = "R2"
tier = "cpu"
description = "x"
[[mutant.edit]]
file = "b12x/x.py"
old = "1"
new = "2"
[mutant.kill]
pytest = ["tests/t.py::test_x"]
"""


def test_a_valid_catalogue_loads(tmp_path):
    [m] = load_catalogue(_write(tmp_path, GOOD))
    assert (m.id, m.klass, m.tier, m.files, m.kill.pytest) == (
        "a",
        "R2",
        "cpu",
        ("b12x/x.py",),
        ("tests/t.py::test_x",),
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('class = "R2"', 'class = "R17"'), "`class` must be R1..R16"),
        (('tier = "cpu"', 'tier = "tpu"'), "`tier` must be one of"),
        (('id = "a"', 'id = "A b"'), "`id` must match"),
        (('new = "2"', 'new = "1"'), "`new` must be a string different"),
        (('file = "b12x/x.py"', 'file = "../x.py"'), "relative path inside the project"),
        (('pytest = ["tests/t.py::test_x"]', "pytest = []"), "names no pytest node id"),
        (('old = "1"', 'op = "nope"\nkind = "ast"\ncallee = "f"'), "`op` must be one of"),
        (('description = "x"', 'description = "x"\ncolour = 3'), "unknown field"),
    ],
)
def test_invalid_catalogues_name_the_mutant_and_field(tmp_path, change, message):
    with pytest.raises(ValueError, match=message) as info:
        load_catalogue(_write(tmp_path, GOOD.replace(*change)))
    assert "catalogue: mutant" in str(info.value)


def test_duplicate_ids_and_bad_paths_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="duplicate id"):
        load_catalogue(_write(tmp_path, GOOD + GOOD))
    with pytest.raises(TypeError, match="path"):
        load_catalogue(3)
    with pytest.raises(ValueError, match="no \\[\\[mutant\\]\\]"):
        load_catalogue(_write(tmp_path, "x = 1\n"))


# ------------------------------------------------------------------------ applying rewrites


def test_patch_applies_once_and_is_stale_when_missing_or_ambiguous(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\nb = 2\nb = 2\n")
    apply_edit(tmp_path, Edit(file="m.py", old="a = 1\n", new="a = 3\n"))
    assert (tmp_path / "m.py").read_text() == "a = 3\nb = 2\nb = 2\n"
    with pytest.raises(StaleMutant, match="found 2 times"):
        apply_edit(tmp_path, Edit(file="m.py", old="b = 2\n", new="b = 4\n"))
    with pytest.raises(StaleMutant, match="found 0 times"):
        apply_edit(tmp_path, Edit(file="m.py", old="a = 1\n", new="a = 4\n"))
    with pytest.raises(StaleMutant, match="file not found"):
        apply_edit(tmp_path, Edit(file="gone.py", old="x", new="y"))


SOURCE = """\
def body(*, fmt, bits, acc):
    return fmt, bits, acc


def kernel(self):
    x = "π"  # non-ASCII before the call: offsets are bytes
    return body(
        fmt=self.fmt,
        bits=4,
        acc=[1, 2],
    )
"""


def _positional(drop=()):
    return Edit(
        file="k.py",
        kind="ast",
        op="keyword-call-to-positional",
        callee="body",
        function="kernel",
        drop=tuple(drop),
    )


def test_ast_rewrite_turns_the_keyword_call_positional(tmp_path):
    (tmp_path / "k.py").write_text(SOURCE)
    apply_edit(tmp_path, _positional(drop=["bits"]))
    text = (tmp_path / "k.py").read_text()
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)]
    [call] = [c for c in calls if getattr(c.func, "id", None) == "body"]
    assert [ast.unparse(a) for a in call.args] == ["self.fmt", "[1, 2]"]
    assert call.keywords == [] and 'x = "π"' in text


def test_ast_rewrite_is_stale_without_exactly_one_keyword_call(tmp_path):
    (tmp_path / "k.py").write_text(SOURCE.replace("fmt=self.fmt", "self.fmt"))
    with pytest.raises(StaleMutant, match="0 keyword-only calls"):
        apply_edit(tmp_path, _positional())
    (tmp_path / "k.py").write_text(SOURCE)
    with pytest.raises(StaleMutant, match="lacks keyword"):
        apply_edit(tmp_path, _positional(drop=["missing"]))


# ------------------------------------------------------------------------ copies and the runner


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


def test_copy_holds_only_the_listed_paths_and_kill_commands_import_it(tmp_path):
    root = copy_project(project_root(), tmp_path / "copy")
    assert {p.name for p in root.iterdir()} <= set(COPIED_PATHS)
    assert {"reference", "b12x", "oracle", "tests", "fixtures"} <= {p.name for p in root.iterdir()}
    found = probe_imports(root)  # a fresh process, as a kill command runs
    assert set(found) == {"reference", "b12x", "oracle", "oracle.mutate"}
    for name, file in found.items():
        assert Path(file).resolve().is_relative_to(root.resolve()), (name, file)


@pytest.fixture
def tiny_project(tmp_path):
    """A minimal project: b12x/calc.py and a test that pins its result."""
    src = tmp_path / "src"
    (src / "b12x").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "b12x" / "__init__.py").write_text("")
    (src / "b12x" / "calc.py").write_text("def double(x):\n    return 2 * x\n")
    (src / "tests" / "test_calc.py").write_text(
        "from b12x.calc import double\n\n\ndef test_double():\n    assert double(3) == 6\n"
    )
    (src / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-ra'\n")
    return src


def test_runner_verdicts_on_a_tiny_project(tiny_project):
    execute = SubprocessExecutor()
    before = _digest(tiny_project)
    kill = ["tests/test_calc.py::test_double"]

    def run(mutant):
        return run_mutant(mutant, src=tiny_project, execute=execute, timeout=120)

    breaks = Edit(file="b12x/calc.py", old="2 * x", new="3 * x")
    harmless = Edit(file="b12x/calc.py", old="2 * x", new="x * 2")
    killed = run(_mutant([breaks], kill))
    assert (killed.status, killed.killer) == ("killed", kill[0])
    assert run(_mutant([harmless], kill)).status == "survived"
    stale = run(_mutant([Edit(file="b12x/calc.py", old="4 * x", new="5 * x")], kill))
    assert stale.status == "stale" and "found 0 times" in stale.reason
    lost = run(_mutant([breaks], ["tests/test_calc.py::test_gone"]))
    assert lost.status == "stale" and "not found" in lost.reason
    gpu = run(_mutant([breaks], kill, tier="gpu"))
    assert gpu.status == "not-applicable" and "gpu tier" in gpu.reason
    later = run(_mutant([breaks], kill, requires=("b12x/ops/moe",), not_applicable_reason="later"))
    assert later.status == "not-applicable" and later.reason.startswith("later")
    assert _digest(tiny_project) == before  # the source tree was never written


def test_summary_kill_rate_and_gate():
    rows = [
        MutantResult("a", "R1", "cpu", "killed"),
        MutantResult("b", "R2", "cpu", "killed"),
        MutantResult("c", "R3", "cpu", "survived"),
        MutantResult("d", "R8", "gpu", "not-applicable"),
    ]
    summary = summarize(rows)
    assert summary["cpu"]["kill_rate"] == pytest.approx(2 / 3)
    assert summary["gpu"]["kill_rate"] is None and summary["gpu"]["not-applicable"] == 1
    assert not gate_passed(rows)
    assert gate_passed([rows[0], rows[3]])
    assert not gate_passed([MutantResult("e", "R1", "cpu", "stale")])


def test_cli_selection_and_usage_errors(capsys):
    mutants = load_catalogue()
    cpu = select(mutants, "cpu", None)
    assert cpu and all(m.tier == "cpu" for m in cpu)
    assert len(select(mutants, "all", None)) == len(mutants)
    assert [m.id for m in select(mutants, "all", "k6-small-m-row-removed")] == [
        "k6-small-m-row-removed"
    ]
    with pytest.raises(ValueError, match="tier"):
        select(mutants, "tpu", None)
    assert mutate_main(["--only", "no-such-mutant"]) == 2
    err = capsys.readouterr().err
    assert "no-such-mutant" in err and err.count("\n") == 1
    # an id of another tier is refused, never run as "not-applicable" under a passing exit code
    (gpu_id, *_) = [m.id for m in mutants if m.tier == "gpu"]
    with pytest.raises(ValueError, match=f"{gpu_id} \\(gpu\\) not in --tier cpu"):
        select(mutants, "cpu", gpu_id)
    assert [m.id for m in select(mutants, "gpu", gpu_id)] == [gpu_id]
    assert mutate_main(["--only", gpu_id]) == 2
    assert "not in --tier cpu" in capsys.readouterr().err
    assert mutate_main(["--list", "--tier", "gpu"]) == 0
    listed = capsys.readouterr().out
    assert "b12x-window-off-by-one" in listed and "k6-small-m-row-removed" not in listed


# The CLI's verdicts are under test, not the kill test: a passing test that imports no torch
# (a kill command importing torch spends ~2 s starting up in its own process).
ROT_KILL = "tests/test_layers.py::test_cycle_finder_on_synthetic_graphs"
ROT = """
[[mutant]]
id = "harmless"
class = "R7"
tier = "cpu"
description = "a docstring edit no test can see"
[[mutant.edit]]
file = "reference/routing.py"
old = "Bool tensor shaped like ``ids``"
new = "A bool tensor shaped like ``ids``"
[mutant.kill]
pytest = ["{KILL}"]

[[mutant]]
id = "rotten"
class = "R7"
tier = "cpu"
description = "a patch whose text is gone"
[[mutant.edit]]
file = "reference/routing.py"
old = "this text is not in the file"
new = "x"
[mutant.kill]
pytest = ["{KILL}"]
""".replace("{KILL}", ROT_KILL)


def test_cli_exits_1_on_a_survivor_and_on_a_stale_mutant(tmp_path, capsys):
    catalogue = tmp_path / "rot.toml"
    catalogue.write_text(ROT)
    report = tmp_path / "out" / "mutate.json"
    argv = ["--catalogue", str(catalogue), "--no-baseline", "--isolation", "subprocess"]
    assert mutate_main([*argv, "-q", "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "FAIL harmless: survived" in out and "FAIL rotten: stale" in out
    assert "tier cpu: kill rate 0.0%" in out
    data = json.loads(report.read_text())
    assert data["passed"] is False
    assert {r["id"]: r["status"] for r in data["results"]} == {
        "harmless": "survived",
        "rotten": "stale",
    }


# ------------------------------------------------------------------------ patches over every copy


def test_patch_with_all_rewrites_every_occurrence_and_is_stale_without_one(tmp_path):
    (tmp_path / "m.py").write_text("if ok:\n    a = 1\nif ok:\n    b = 2\n")
    apply_edit(tmp_path, Edit(file="m.py", old="if ok:\n", new="if True:\n", all=True))
    assert (tmp_path / "m.py").read_text() == "if True:\n    a = 1\nif True:\n    b = 2\n"
    with pytest.raises(StaleMutant, match="found 0 times \\(expected at least 1\\)"):
        apply_edit(tmp_path, Edit(file="m.py", old="if ok:\n", new="x\n", all=True))


def test_covers_tags_are_validated(tmp_path):
    good = GOOD.replace('tier = "cpu"', 'tier = "cpu"\ncovers = ["allocation-in-run"]')
    [m] = load_catalogue(_write(tmp_path, good))
    assert m.covers == ("allocation-in-run",)
    with pytest.raises(ValueError, match="unknown `covers` tag"):
        load_catalogue(_write(tmp_path, good.replace("allocation-in-run", "nonsense")))
    with pytest.raises(ValueError, match="`all` must be a boolean"):
        load_catalogue(_write(tmp_path, GOOD.replace('new = "2"', 'new = "2"\nall = 1')))


# ------------------------------------------------------------------------ the child's import path


def test_child_pythonpath_puts_the_copy_first_and_drops_other_checkouts(tmp_path):
    copy = tmp_path / "copy"
    dsl = tmp_path / "dsl"
    dsl.mkdir()
    inherited = os.pathsep.join([str(project_root()), str(dsl), "", str(dsl)])
    entries = child_pythonpath(copy, inherited).split(os.pathsep)
    assert entries == [str(copy), str(dsl)]
    assert foreign_path_entries(None) == []


@pytest.mark.deep
@pytest.mark.parametrize("isolation", ["subprocess", "fork"])
def test_kill_commands_import_the_copy_with_the_original_root_on_pythonpath(
    tmp_path, monkeypatch, isolation
):
    """The device's env.sh exports PYTHONPATH=<original root>:<carried DSL>; a kill command must
    still import the copy, and keep the DSL entry."""
    dsl = tmp_path / "dsl-site"
    dsl.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(project_root()), str(dsl)]))
    root = copy_project(project_root(), tmp_path / "copy")
    execute = make_executor(isolation)
    try:
        seen = probe(root, execute)
    finally:
        execute.close()
    for name, file in seen["modules"].items():
        assert Path(file).resolve().is_relative_to(root.resolve()), (name, file)
    assert Path(seen["sys_path"][0]).resolve() == root.resolve()
    assert str(dsl) in seen["sys_path"]
    assert str(project_root()) not in seen["sys_path"]
    assert seen["pythonpath"].split(os.pathsep) == [str(root), str(dsl)]


# ------------------------------------------------------------------------ baseline and isolation


def test_a_failing_baseline_is_reported_not_counted_as_a_kill(tiny_project):
    (tiny_project / "tests" / "test_calc.py").write_text(
        "from b12x.calc import double\n\n\ndef test_double():\n    assert double(3) == 7\n"
    )
    breaks = Edit(file="b12x/calc.py", old="2 * x", new="3 * x")
    mutant = _mutant([breaks], ["tests/test_calc.py::test_double"])
    [result] = run_catalogue([mutant], src=tiny_project, jobs=1, isolation="subprocess")
    assert result.status == "baseline-failed" and "unmutated" in result.reason
    assert not gate_passed([result])
    assert summarize([result])["cpu"]["kill_rate"] == 0.0


def test_auto_isolation_starts_gpu_kill_commands_as_fresh_processes(tiny_project, monkeypatch):
    from oracle.mutate import runner

    made = []

    def spy(kind="fork", python=None):
        made.append(kind)
        return SubprocessExecutor()

    monkeypatch.setattr(runner, "make_executor", spy)
    breaks = Edit(file="b12x/calc.py", old="2 * x", new="3 * x")
    kill = ["tests/test_calc.py::test_double"]
    mutants = [_mutant([breaks], kill, id="c"), _mutant([breaks], kill, id="g", tier="gpu")]
    results = run_catalogue(mutants, src=tiny_project, gpu=True, jobs=2)
    assert [(r.id, r.status) for r in results] == [("c", "killed"), ("g", "killed")]
    assert sorted(made) == ["fork", "subprocess"]
    assert runner.default_jobs(mutants, gpu=True) <= runner.GPU_JOBS
    with pytest.raises(ValueError, match="isolation"):
        run_catalogue(mutants, src=tiny_project, isolation="thread")


def test_summary_counts_runnable_and_time():
    rows = [
        MutantResult("a", "R1", "gpu", "killed", seconds=2.0),
        MutantResult("b", "R2", "gpu", "baseline-failed", seconds=1.0),
        MutantResult("c", "R3", "gpu", "not-applicable"),
    ]
    gpu = summarize(rows)["gpu"]
    assert (gpu["runnable"], gpu["kill_rate"], gpu["seconds"]) == (2, 0.5, 3.0)


def test_cli_json_lists_survivors_and_renders_again(tmp_path, capsys):
    catalogue = tmp_path / "rot.toml"
    catalogue.write_text(ROT)
    report = tmp_path / "mutate.json"
    argv = ["--catalogue", str(catalogue), "--no-baseline", "--isolation", "subprocess"]
    assert mutate_main([*argv, "-q", "--only", "harmless", "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert f"SURVIVOR harmless (R7, cpu): not killed by {ROT_KILL}" in out
    data = json.loads(report.read_text())
    assert data["survivors"] == [
        {"id": "harmless", "tier": "cpu", "kill": data["results"][0]["kill"]}
    ]
    assert data["summary"]["cpu"]["runnable"] == 1
    assert mutate_main(["--from-json", str(report)]) == 1
    assert "tier cpu: kill rate 0.0%" in capsys.readouterr().out
