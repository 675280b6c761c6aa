"""benchmarks/oracle_job.py's case-time summary (CPU): per-op sums count each case once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("oracle_job", ROOT / "benchmarks/oracle_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_case_seconds_counts_each_case_once_and_ranks_the_slowest():
    checks = [
        {"name": "gpu.dense.caseA.native", "metrics": {"case_wall_s": 2.0}},
        {"name": "gpu.dense.caseA.k6@sm_120", "metrics": {"case_wall_s": 2.0}},  # same case
        {"name": "gpu.moe.caseB", "metrics": {"case_wall_s": 5.0}},
        {"name": "gpu.graph.dense", "metrics": {}},  # no case time: not counted
        {"name": "fingerprints.x", "metrics": {"case_wall_s": 9.0}},  # not a GPU case
    ]
    got = _module().case_seconds(checks, slowest=2)
    assert got["per_op_s"] == {"dense": 2.0, "moe": 5.0}
    assert got["slowest"] == [["moe.caseB", 5.0], ["dense.caseA", 2.0]]


def test_worker_seconds_sums_each_part_once_and_skips_unreadable(tmp_path):
    import json

    def part(tag, checks):
        (tmp_path / f"part_{tag}.json").write_text(json.dumps({"checks": checks}))

    part("0of2", [
        {"name": "gpu.dense.caseA.native", "metrics": {"case_wall_s": 2.0}},
        {"name": "gpu.dense.caseA.k6@sm_120", "metrics": {"case_wall_s": 2.0}},  # same case
        {"name": "gpu.moe.caseB", "metrics": {"case_wall_s": 5.0}},
    ])  # fmt: skip
    part("1of2", [{"name": "gpu.decode.caseC", "metrics": {"case_wall_s": 1.5}}])
    (tmp_path / "part_serial.json").write_text("{not json")
    got = _module().worker_seconds(tmp_path)
    assert got == {"0of2": 7.0, "1of2": 1.5}
    assert _module().worker_seconds(tmp_path / "absent") == {}
