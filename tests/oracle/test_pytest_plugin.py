"""The pytest plugin, run in a child pytest with CUDA hidden (so this holds on any machine).

One child session checks the three promises at once: a ``gpu``-marked test is skipped at
collection with the reason in the report (its body would fail), a failing test that filled
``oracle_case`` has its case saved (safetensors + JSON sidecar, no pickle) with the replay
command printed, and a passing test (and a failing one that filled nothing) saves nothing.
Each option then runs in a child process of its own, except ``slow_sweep`` and
``--slow-slice``: they touch neither torch nor CUDA, so their child session runs in process
(pytester).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # the slow_sweep / --slow-slice child session runs in process

CHILD_TESTS = textwrap.dedent(
    """
    import pytest
    import torch

    @pytest.mark.gpu
    def test_needs_gpu():
        raise AssertionError("a gpu test body must not run on a CPU-only machine")

    def test_fails_with_case(oracle_case):
        oracle_case.add("y", torch.arange(6, dtype=torch.float16).reshape(2, 3))
        oracle_case.meta.update(case_id="fails_with_case", seed=5)
        assert False, "oracle verdict: 1 of 6 elements differ"

    def test_passes_with_case(oracle_case):
        oracle_case.add("y", torch.zeros(2))
        oracle_case.meta["case_id"] = "passes_with_case"

    def test_fails_without_tensors(oracle_case):
        assert False
    """
)

INI = textwrap.dedent(
    """
    [pytest]
    addopts = -ra --strict-markers -p oracle.pytest_plugin
    markers =
        gpu: needs a CUDA device
        graph: graph
        slow: slow
        multi_gpu: two GPUs
    """
)


@pytest.mark.deep
def test_plugin_skips_gpu_tests_and_saves_failing_cases(tmp_path: Path):
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    (tmp_path / "pytest.ini").write_text(INI)
    results = tmp_path / "saved"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--oracle-results={results}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 failed, 1 passed, 1 skipped" in out, out
    assert "SKIPPED" in out and "needs a CUDA device; none is visible" in out
    assert "a gpu test body must not run" not in out
    saved = sorted(p.name for p in results.iterdir())
    assert saved == ["fails_with_case.json", "fails_with_case.safetensors"]
    sidecar = json.loads((results / "fails_with_case.json").read_text())
    assert sidecar["seed"] == 5
    assert sidecar["test"].endswith("test_child.py::test_fails_with_case")
    assert f"python -m oracle replay {results / 'fails_with_case.json'}" in out

    from oracle.report.results import load_case

    loaded = load_case(results / "fails_with_case.json")
    assert loaded.tensors["y"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


ORDER_TESTS = "\n".join(f"def test_{i:02d}():\n    pass\n" for i in range(12))


def _collected_order(tmp_path: Path, *extra: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *extra],
        cwd=tmp_path,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line.split("::")[-1] for line in proc.stdout.splitlines() if "::test_" in line]


@pytest.mark.deep
def test_shuffle_seed_reorders_collection_reproducibly(tmp_path: Path):
    (tmp_path / "test_order.py").write_text(ORDER_TESTS)
    (tmp_path / "pytest.ini").write_text(INI)
    plain = _collected_order(tmp_path)
    assert plain == [f"test_{i:02d}" for i in range(12)]
    shuffled = _collected_order(tmp_path, "--shuffle-seed", "7")
    assert sorted(shuffled) == plain and shuffled != plain
    assert _collected_order(tmp_path, "--shuffle-seed", "7") == shuffled  # same seed, same order
    assert _collected_order(tmp_path, "--shuffle-seed", "8") != shuffled


@pytest.mark.deep
def test_require_gpu_refuses_a_machine_without_one(tmp_path: Path):
    """``--require-gpu`` (passed by the device scripts) turns "every gpu test skipped, exit 0"
    into a usage error when no CUDA device is visible. Planted: the option ignored, the child
    skips ``test_needs_gpu`` and exits 0, and this test fails."""
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    (tmp_path / "pytest.ini").write_text(INI)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "gpu", "--require-gpu"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out  # pytest.ExitCode.USAGE_ERROR
    assert "--require-gpu: no CUDA device is visible" in out, out


SWEEP_TESTS = textwrap.dedent(
    """
    import pytest

    from oracle.pytest_plugin import slow_sweep

    @pytest.mark.slow
    @slow_sweep("i", lambda: range(7), lambda i: f"case{i}", reason="sweep wants -m slow")
    def test_sweep(i):
        assert isinstance(i, int)

    def test_fast():
        pass
    """
)


def test_slow_sweep_and_slow_slice(pytester: pytest.Pytester):
    """``slow_sweep``: without ``-m slow`` one placeholder item, skipped with the sweep's reason
    (the cases are never built); with it one item per case, named by ``id_of``. ``--slow-slice
    I/N`` keeps the slow tests at sorted positions I mod N (the rest are reported deselected)
    and leaves unmarked tests alone: the slices of one N are disjoint and cover every slow test.
    A malformed or out-of-range value is a usage error naming the form. In process (pytester),
    so it costs well under a second. Planted: the option ignored, every slice holds all 7."""
    pytester.makepyfile(test_sweep=SWEEP_TESTS)
    # pytest-benchmark warns in a child of an xdist worker; the child never benchmarks
    pytester.makeini(
        INI.replace("-p oracle.pytest_plugin", "-p oracle.pytest_plugin -p no:benchmark")
    )

    def collected(*args: str) -> tuple[list[str], pytest.RunResult]:
        result = pytester.runpytest("--collect-only", "-q", *args)
        assert result.ret == 0, result.outlines + result.errlines
        return [line.split("::")[-1] for line in result.outlines if "::test_" in line], result

    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_sweep.py:*: sweep wants -m slow"])
    assert collected()[0] == ["test_sweep[sweep]", "test_fast"]
    for index in range(3):
        items, result = collected("-m", "slow", "--slow-slice", f"{index}/3")
        assert items == [f"test_sweep[case{i}]" for i in range(index, 7, 3)]
        result.stdout.fnmatch_lines(
            [f"{len(items)}/8 tests collected ({8 - len(items)} deselected)*"]
        )
    # the unmarked test stays in every slice
    items, _ = collected("-m", "slow or not slow", "--slow-slice", "1/2")
    assert items == ["test_sweep[case1]", "test_sweep[case3]", "test_sweep[case5]", "test_fast"]
    for bad in ("2/2", "1", "x/3"):
        result = pytester.runpytest("--collect-only", "--slow-slice", bad)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (bad, result.outlines)
        result.stderr.fnmatch_lines(["*--slow-slice: expected I/N with integers 0 <= I < N*"])


DEEP_TESTS = textwrap.dedent(
    """
    import pytest

    @pytest.mark.deep
    def test_deep():
        pass

    def test_quick():
        pass
    """
)


def test_deep_tests_run_only_when_asked_for(pytester: pytest.Pytester):
    """``deep`` tests are deselected (reported as such, never skipped) from a directory run
    unless ``-m`` names ``deep``; a command line naming their file or node id (the mutation
    gate's kill commands) runs them. Planted: the deselection dropped, the quick run holds
    both; the named-file rule dropped, the node-id run holds nothing."""
    pytester.makepyfile(test_tiers=DEEP_TESTS)
    pytester.makeini(
        INI.replace("-p oracle.pytest_plugin", "-p oracle.pytest_plugin -p no:benchmark")
        + "    deep: deep\n"
    )
    quick = pytester.runpytest(".")
    quick.assert_outcomes(passed=1, deselected=1)
    quick.stdout.fnmatch_lines(["*deep tests*deselected, -m deep runs them*"])
    pytester.runpytest(".", "-m", "deep").assert_outcomes(passed=1, deselected=1)
    pytester.runpytest("test_tiers.py::test_deep").assert_outcomes(passed=1)
    pytester.runpytest("test_tiers.py").assert_outcomes(passed=2)
