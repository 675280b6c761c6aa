"""Report: exact JSON schema, summary counts, rich table, PNG plots."""

from __future__ import annotations

import functools
import io
import json
import math

import pytest
import torch
from rich.console import Console

from oracle.cases.grids import cases
from oracle.judge.metrics import compute_metrics
from oracle.report.report import CheckResult, Report, plot_error_vs_shape, plot_tile_error_map

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@functools.cache  # frozen Cases: the grid walk runs once, each test builds its own Report
def _sample_grid() -> tuple:
    return tuple(cases(op="dense", filter="codebook=mcg,bits=6,dtype=fp16,k=128,n=128,m=1|9|17"))


def sample_report() -> Report:
    report = Report()
    e = torch.linspace(1, 2, 64, dtype=torch.float64).reshape(4, 16)
    grid = _sample_grid()
    assert len(grid) == 6  # 3 Ms x (full rotation, no rotation)
    for i, case in enumerate(grid):
        y = e * (1 + 1e-4 * (i + 1))
        metrics = compute_metrics(y, e, e * (1 + 1e-4)).to_dict()
        metrics.update(variant=case.variant.name, m=case.m, k=case.k, n=case.n)
        report.add(
            name=case.case_id,
            tier="gpu",
            status="pass" if i % 5 else "fail",
            reason="" if i % 5 else "rel-L2 over the bound",
            metrics=metrics,
        )
    report.add(CheckResult("fingerprints", "cpu", "pass"))
    report.add(CheckResult("gpu grid", "gpu", "skip", reason="no CUDA device"))
    nan_metrics = compute_metrics(torch.tensor([float("nan")]), torch.ones(1)).to_dict()
    report.add(CheckResult("nan case", "cpu", "fail", reason="non-finite", metrics=nan_metrics))
    return report


def test_json_schema_is_exact(tmp_path):
    report = sample_report()
    path = report.to_json(tmp_path / "out" / "report.json")
    data = json.loads(path.read_text())  # strict JSON: no NaN literals
    assert set(data) == {"schema", "checks", "summary", "environment"}
    assert data["schema"] == "oracle.report/2"
    for check in data["checks"]:
        assert set(check) == {"name", "tier", "status", "reason", "metrics"}
        assert check["tier"] in ("cpu", "gpu") and check["status"] in ("pass", "fail", "skip")
        assert isinstance(check["reason"], str) and isinstance(check["metrics"], dict)
    assert data["checks"][-1]["metrics"]["rel_l2"] == "nan"
    assert "NaN" not in path.read_text()
    assert {"python", "torch", "numpy", "cutlass", "device", "git_sha"} <= set(data["environment"])
    assert data["environment"]["device"] == (
        "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    )


def test_summary_counts_per_tier_and_status():
    summary = sample_report().summary()
    # 6 grid checks: i = 0, 5 fail; plus fingerprints pass, gpu grid skip, nan case fail.
    assert summary["total"] == 9
    assert (summary["pass"], summary["fail"], summary["skip"]) == (5, 3, 1)
    assert summary["by_tier"]["gpu"] == {"pass": 4, "fail": 2, "skip": 1}
    assert summary["by_tier"]["cpu"] == {"pass": 1, "fail": 1, "skip": 0}
    assert summary["ok"] is False
    assert Report([CheckResult("a", "cpu", "skip", reason="why")]).exit_code() == 0


def test_from_json_round_trips(tmp_path):
    report = sample_report()
    path = report.to_json(tmp_path / "report.json")
    again = Report.from_json(path)
    assert [c.name for c in again.checks] == [c.name for c in report.checks]
    assert again.summary() == report.summary()
    assert math.isnan(again.checks[-1].metrics["rel_l2"])
    assert again.checks[0].metrics["m"] == report.checks[0].metrics["m"]
    assert again.environment() == json.loads(path.read_text())["environment"]


def test_check_result_validation():
    with pytest.raises(ValueError, match="tier"):
        CheckResult("x", "tpu", "pass")
    with pytest.raises(ValueError, match="status"):
        CheckResult("x", "cpu", "ok")
    with pytest.raises(ValueError, match="reason"):
        CheckResult("x", "cpu", "skip")
    with pytest.raises(ValueError, match="checks"):
        Report.from_dict({"summary": {}})


def test_print_table_shows_names_statuses_and_metrics():
    buffer = io.StringIO()
    sample_report().print_table(Console(file=buffer, width=200, color_system=None))
    text = buffer.getvalue()
    assert "fingerprints" in text and "no CUDA device" in text
    assert "skip" in text and "fail" in text and "rel_l2=" in text
    assert "5 passed, 3 failed, 1 skipped" in text


def test_error_vs_shape_pngs_are_written(tmp_path):
    report = sample_report()
    json_path = report.to_json(tmp_path / "r.json")
    written = plot_error_vs_shape(json_path, tmp_path / "png")
    variants = {c.metrics["variant"] for c in report.checks if "variant" in c.metrics}
    assert len(written) == len(variants) == 2  # dense full and rot_none variants
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_points_fall_back_to_the_case_id_in_the_name(tmp_path):
    case = cases(op="dense", max_cases=1)[0]
    report = Report([CheckResult(f"gemm:{case.case_id}", "gpu", "pass", metrics={"rel_l2": 1e-4})])
    written = plot_error_vs_shape(report, tmp_path)
    assert [p.name for p in written] == [case.variant.name.replace("/", "-") + ".png"]


def test_tile_error_map_png(tmp_path):
    ref = torch.ones(64, 64)
    y = ref.clone()
    y[40, 10] = 3.0
    path = plot_tile_error_map(y, ref, tmp_path / "tiles" / "map.png", tile=16)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_print_table_can_hide_passing_checks():
    buffer = io.StringIO()
    sample_report().print_table(
        Console(file=buffer, width=200, color_system=None), show_passing=False
    )
    text = buffer.getvalue()
    assert "nan case" in text and "gpu grid" in text and "fingerprints" not in text
    assert "5 passed, 3 failed, 1 skipped" in text


# --- strict reading: ReportFileError, one line ------------------------------------------------


def _write(tmp_path, data, name="r.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _valid(tmp_path):
    return json.loads(sample_report().to_json(tmp_path / "valid.json").read_text())


def _refusals(tmp_path):
    base = _valid(tmp_path)
    failing_ok = {**base, "summary": {**base["summary"], "fail": 0, "ok": True}}
    mutate = {"schema": "oracle.mutate/1", "results": []}
    first = base["checks"][0]
    return [
        ("not json {", "is not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({**base, "schema": "oracle.report/9"}, "unknown report schema 'oracle.report/9'"),
        (mutate, "mutate --from-json"),
        ({**base, "extra": 1}, "unknown top-level keys ['extra']"),
        ({k: v for k, v in base.items() if k != "checks"}, "'checks' must be a list"),
        ({**base, "checks": [{"name": "a", "tier": "cpu"}]}, "lacks ['status']"),
        ({**base, "checks": [{**first, "tier": "tpu"}]}, "tier must be one of"),
        ({**base, "checks": [{**first, "status": "PASS"}]}, "status must be one of"),
        ({**base, "checks": [{**first, "reason": 3}]}, "reason must be a str"),
        ({**base, "checks": [{**first, "metrics": [1]}]}, "metrics must be a mapping"),
        ({**base, "checks": [{**first, "colour": "red"}]}, "unknown keys ['colour']"),
        ({**base, "checks": ["x"]}, "must be an object"),
        (failing_ok, "disagrees with the checks"),
        ({**base, "environment": []}, "'environment' must be an object"),
    ]


def test_reading_refuses_corrupt_and_foreign_files(tmp_path):
    from oracle.report.report import ReportFileError

    for i, (data, needle) in enumerate(_refusals(tmp_path)):
        path = _write(tmp_path, data, f"bad{i}.json")
        with pytest.raises(ReportFileError) as info:
            Report.from_json(path)
        assert needle in str(info.value) and "\n" not in str(info.value), (i, str(info.value))
    with pytest.raises(ReportFileError, match="cannot read"):
        Report.from_json(tmp_path)  # a directory
    with pytest.raises(ReportFileError, match="cannot read"):
        Report.from_json(tmp_path / "absent.json")


def test_reading_accepts_the_current_and_the_unversioned_layout(tmp_path):
    data = _valid(tmp_path)
    assert Report.from_dict(data).summary() == sample_report().summary()
    legacy = {k: v for k, v in data.items() if k != "schema"}  # oracle.report/1
    assert Report.from_dict(legacy).summary() == sample_report().summary()
    minimal = {"checks": [{"name": "a", "tier": "cpu", "status": "pass"}]}
    assert Report.from_dict(minimal).summary()["pass"] == 1
