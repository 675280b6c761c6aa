"""``python -m oracle mutate``: the JSON report's schema tag and the refusals (exit 2, one line)."""

from __future__ import annotations

import argparse
import json

import pytest

from oracle.mutate import cli as mutate_cli
from oracle.mutate.runner import MutantResult


def _saved(tmp_path, **changes):
    args = argparse.Namespace(tier="cpu")
    results = [MutantResult("a", "R1", "cpu", "killed", "t::x", 1.0, "", "pytest t::x")]
    data = mutate_cli._report(args, results, mutate_cli.summarize(results), False)
    data.update(changes)
    path = tmp_path / "mutate.json"
    path.write_text(json.dumps(data))
    return path, data


def test_the_report_carries_its_schema_and_renders_again(tmp_path, capsys):
    path, data = _saved(tmp_path)
    assert data["schema"] == mutate_cli.SCHEMA == "oracle.mutate/1"
    assert mutate_cli.main(["--from-json", str(path)]) == 0
    legacy = {k: v for k, v in data.items() if k != "schema"}
    path.write_text(json.dumps(legacy))
    assert mutate_cli.main(["--from-json", str(path)]) == 0


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"schema": "oracle.report/2"}, "schema 'oracle.report/2' is not 'oracle.mutate/1'"),
        ({"results": "x"}, "'results' a list"),
        ({"results": [{"id": "a"}]}, "results[0] lacks"),
        ({"summary": None}, "'summary' must be an object"),
    ],
)
def test_from_json_refuses_foreign_and_corrupt_files(tmp_path, capsys, change, needle):
    path, _ = _saved(tmp_path, **change)
    assert mutate_cli.main(["--from-json", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_from_json_refuses_unreadable_files(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{ nope")
    assert mutate_cli.main(["--from-json", str(bad)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert mutate_cli.main(["--from-json", str(tmp_path / "absent.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_gpu_tier_without_cuda_is_refused_not_green(monkeypatch, capsys):
    monkeypatch.setattr(mutate_cli, "_cuda", lambda: False)
    monkeypatch.setattr(mutate_cli, "run_catalogue", lambda *a, **k: pytest.fail("nothing may run"))
    assert mutate_cli.main(["--tier", "gpu"]) == 2
    assert "--tier gpu: no CUDA device" in capsys.readouterr().err
    assert mutate_cli.main(["--tier", "gpu", "--list"]) == 0  # listing needs no device
