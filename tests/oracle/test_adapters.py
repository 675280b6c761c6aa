"""The kernel-adapter contract (oracle.adapters, oracle.run.adapter) on a CPU kernel.

A toy kernel (``tests/oracle/adapters/toy_adapter.py``) goes through the whole path an adapted
kernel takes: the grid, the consumer's door, the envelope judge, the graph protocol (simulated
backend), a saved failure and its replay, and the CLI. Each planted fault of the toy kernel
(a wrong weight, an unwritten row, a doubled scale, an allocating run) must be caught.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oracle.adapters import (
    ADAPTERS,
    AdapterError,
    AdapterOp,
    KernelAdapter,
    WeightFormat,
    load_adapter,
)
from oracle.cli import main
from oracle.run import adapter as run
from oracle.run.replay import replay

HERE = Path(__file__).resolve().parent / "adapters"
sys.path.insert(0, str(HERE))
import toy_adapter  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOY = toy_adapter.ADAPTER


@pytest.fixture(autouse=True)
def _no_fault():
    toy_adapter.FAULT = None
    yield
    toy_adapter.FAULT = None


def _case(**changes):
    base = dict(adapter="toy", op="gemm", fmt="plain", dtype="fp16", m=5, k=256, n=128,
                scale_exp=-2, seed=3)  # fmt: skip
    return run.AdapterCase(**(base | changes))


def test_grid_visits_every_m_shape_dtype_and_scale_and_ids_round_trip():
    grid = run.adapter_grid(TOY)
    assert {c.m for c in grid} == {m for m in run.M_VALUES if m <= 16}
    assert {(c.k, c.n) for c in grid} == set(run.SHAPES)
    assert {(c.dtype, c.scale) for c in grid} == {(d, s) for d in ("fp16", "bf16")
                                                  for s in (1.0, 0.25)}  # fmt: skip
    assert len({c.case_id for c in grid}) == len(grid)
    for case in grid[:20]:
        assert run.parse_adapter_case_id(case.case_id) == case


def test_a_faithful_kernel_passes_and_each_planted_fault_fails(tmp_path):
    case = _case()
    assert run.run_adapter_case(TOY, case, device="cpu", results_dir=tmp_path).status == "pass"
    for fault in ("weight", "unwritten", "scale"):
        toy_adapter.FAULT = fault
        result = run.run_adapter_case(TOY, case, device="cpu", results_dir=tmp_path)
        assert result.status == "fail", fault
        assert "replay: python -m oracle replay" in result.reason


def test_graph_protocol_passes_and_catches_a_run_that_allocates():
    results = run.run_adapter_graph(TOY, device="cpu")
    assert [r.name for r in results] == ["adapter.toy.graph.gemm.plain.fp16",
                                         "adapter.toy.graph.gemm.plain.bf16"]  # fmt: skip
    assert all(r.status == "pass" for r in results), [r.reason for r in results]
    toy_adapter.FAULT = "allocate"
    assert all(r.status == "fail" for r in run.run_adapter_graph(TOY, device="cpu"))


def test_a_saved_failure_replays_and_an_edited_input_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(ADAPTERS, "toy", "toy_adapter:ADAPTER")
    toy_adapter.FAULT = "weight"
    result = run.run_adapter_case(TOY, _case(), device="cpu", results_dir=tmp_path, kernel="toy")
    saved = result.reason.rsplit("python -m oracle replay ", 1)[1].strip()
    again, _ = replay(saved, cuda=False)
    assert again.status == "fail" and again.name.startswith("replay.adapter.toy.gemm.")
    meta = json.loads(Path(saved).read_text())
    meta["case_id"] = _case(seed=4).case_id  # the file no longer belongs to its id
    Path(saved).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="is not the input"):
        replay(saved, cuda=False)


def test_contract_refusals_name_the_problem():
    fmt = WeightFormat("f", toy_adapter._random, toy_adapter._reference, 64, 128)
    op = AdapterOp("gemm", ("f",), (torch.float16,), toy_adapter._Op, toy_adapter._allocate, 8)
    assert op.refusal(fmt, m=9, k=64, n=128) == "m = 9 is outside 1..8"
    assert "k = 96 is not a positive multiple of 64" in op.refusal(fmt, m=1, k=96, n=128)
    with pytest.raises(AdapterError, match="names formats"):
        KernelAdapter("x", {}, (op,), lambda: None)
    with pytest.raises(AdapterError, match="declares no op"):
        KernelAdapter("x", {"f": fmt}, (), lambda: None)
    with pytest.raises(AdapterError, match="unknown kernel"):
        load_adapter("nonsense")
    with pytest.raises(AdapterError, match="not a KernelAdapter"):
        load_adapter("toy_adapter:FAULT")
    with pytest.raises(AdapterError, match="power of two"):
        run._scale_exponent(0.3)
    with pytest.raises(ValueError, match="expected <adapter>"):
        run.parse_adapter_case_id("toy-gemm")


def _cli(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "oracle", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)  # fmt: skip


@pytest.mark.deep
def test_cli_judges_a_kernel_by_module_path(tmp_path):
    proc = _cli("run", "--kernel", "toy_adapter:ADAPTER", "--max-cases", "3", "-q",
                "--results", str(tmp_path), "--json", str(tmp_path / "r.json"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [c["name"] for c in json.loads((tmp_path / "r.json").read_text())["checks"]]
    assert len(names) == 5 and sum(n.startswith("adapter.toy.graph.") for n in names) == 2


def _in_process(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # a refusal raises SystemExit(2) after printing its line
        return exc.code


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--kernel", "nonsense"), "--kernel: unknown kernel 'nonsense'"),
        (("--kernel", "toy_adapter:ADAPTER", "--tile", "wide"), "--tile is b12x's"),
        (("--kernel", "toy_adapter:ADAPTER", "--case", "x"), "--case: 'x' is not a case"),
    ],
)
def test_cli_refusals_are_one_line(args, line, capsys):
    assert _in_process(["run", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and line in err, err


def test_quack_refuses_in_one_line_where_it_cannot_run(capsys):
    if load_adapter("quack").unavailable() is None:
        pytest.skip("quack runs here: tests/oracle/test_adapters_gpu.py judges it")
    assert _in_process(["run", "--kernel", "quack"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("python -m oracle run: error: --kernel quack: quack"), err


def test_drift_localises_an_adapted_kernels_wrong_weight(tmp_path, monkeypatch):
    from oracle.cli.drift import drift

    monkeypatch.setitem(ADAPTERS, "toy", "toy_adapter:ADAPTER")
    toy_adapter.FAULT = "weight"  # W[K/2, N-1] off by 0.75
    case = _case(m=16, k=64, n=128, scale_exp=0)
    result = run.run_adapter_case(TOY, case, device="cpu", results_dir=tmp_path, kernel="toy")
    report = drift(result.reason.rsplit("python -m oracle replay ", 1)[1].strip())
    assert report.case_id == case.case_id and report.rotation == "none"
    assert report.error_map.columns[0].n == 127  # the wrong weight's output column
    if report.error_map.least_squares == "unique":
        assert (report.error_map.entries[0].k, report.error_map.entries[0].n) == (32, 127)
