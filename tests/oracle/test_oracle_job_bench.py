"""benchmarks/oracle_job.py's case-time summary (CPU): per-op sums count each case once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


@pytest.mark.deep
def test_a_timed_out_job_takes_its_workers_with_it(tmp_path):
    """Past the timeout the job's whole process group dies: a worker the job started cannot run
    on into the next run. The worker announces its pid before the job says it started, then
    sleeps; the test polls for the worker to be gone (no elapsed-time assertion: the events are
    the timeout verdict and the worker's death). Planted: a kill of the parent alone
    (``subprocess.run(timeout=)``) leaves the worker alive and the poll fails."""
    import os
    import sys
    import time

    pidfile = tmp_path / "worker.pid"
    (tmp_path / "worker.py").write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    (tmp_path / "job.py").write_text(
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(tmp_path / 'worker.py')!r}],\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"while not os.path.exists({str(pidfile)!r}):\n    time.sleep(0.01)\n"
        "print('started', flush=True)\ntime.sleep(60)\n"
    )
    job = str(tmp_path / "job.py")
    rc, log = _module().run_group(
        [sys.executable, job], cwd=tmp_path, env=dict(os.environ), timeout=4
    )
    assert rc == "timeout" and "started" in log, log
    pid = int(pidfile.read_text())
    for _ in range(300):  # poll: the kill is asynchronous, the reaping by init too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0:
            break  # a zombie awaiting its parent's reaper is dead
        time.sleep(0.1)
    else:
        raise AssertionError(f"worker {pid} outlived the job's timeout")


def test_the_row_names_the_workers_that_wrote_stats(tmp_path):
    import json

    stats = tmp_path / "cold.stats.jsonl"
    lines = [{"argv": ["oracle", "run", "--shard", s], "compiles": 1, "compiled_keys": ["a"],
              "resolved_keys": ["a", "b"]} for s in ("6/8", "1/8")]  # fmt: skip
    lines.append({"argv": ["oracle"], "compiles": 2, "compiled_keys": ["c", "d"],
                  "resolved_keys": ["c", "d"]})  # the parent: no shard  # fmt: skip
    stats.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    got = _module()._sum_stats(stats)
    assert got["stats_shards"] == ["1/8", "6/8"] and got["processes"] == 3
    assert got["compiles"] == 4
    # key "a" was built by two workers: one duplicate; a, b, c, d resolved
    assert (got["distinct_compiled"], got["duplicate_compiles"]) == (3, 1)
    assert got["distinct_specialisations"] == 4
    assert _module()._sum_stats(tmp_path / "missing.jsonl")["stats_shards"] == []


def test_a_job_without_report_shows_its_finished_workers_checks(tmp_path):
    """A job killed at its timeout writes no report; the parts its finished workers wrote are
    summed (a failure among them named), and a part from before the run is not counted.
    Planted: without the age check the stale part's failure is counted and the test fails."""
    import json
    import os
    import time

    def part(tag, statuses, age_s=0.0):
        path = tmp_path / f"part_{tag}.json"
        checks = [{"name": f"gpu.dense.{tag}.{i}", "tier": "gpu", "status": s}
                  for i, s in enumerate(statuses)]  # fmt: skip
        path.write_text(json.dumps({"checks": checks}))
        if age_s:
            past = time.time() - age_s
            os.utime(path, (past, past))

    part("0", ["fail"], age_s=3600)  # the cold run's, left for the warm run
    since = time.time() - 1
    part("1", ["pass", "pass", "skip"])
    part("2", ["pass", "fail"])
    (tmp_path / "part_3.json").write_text("{not json")
    got = _module().partial_parts(tmp_path, since=since)
    assert got == {"parts": ["1", "2"], "pass": 3, "fail": 1, "skip": 1,
                   "failed": ["gpu.dense.2.1"]}  # fmt: skip
    assert _module().partial_parts(tmp_path, since=time.time() + 60) is None
    assert _module().partial_parts(tmp_path / "absent", since=since) is None
