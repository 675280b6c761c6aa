"""oracle.run.sharding on CPU: the plan, the shard runner's manifest, the merge, the CLI, the
launcher.

Expectations are derived independently of the code under test: partition and coverage are set
identities over the input cases; the balance bound is the longest-processing-time bound
(``max load <= total / N + largest group``) with loads recomputed here from the public cost
model; merged summary counts are the sums of statuses counted over the fake parts; the launcher
runs a fake shard command (no GPU) whose processes meet at a file barrier, which only concurrent
processes can pass, and whose serial phase checks that every parallel part already exists.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from oracle.cases import grids as G
from oracle.cases.variants import Variant
from oracle.checks import CheckContext
from oracle.cli import build_parser, main
from oracle.report.report import CheckResult, Report
from oracle.run import sharding as S

VARIANT_NAMES = (
    "decode/mcg/k4/fp16",
    "decode/mcg/k4/bf16",
    "dense/mcg/k4/fp16",
    "dense/mcg/k4/rot_none/bf16",
    "dense/3inst/k2/fp16",
)


@functools.cache
def sample_cases() -> tuple[G.Case, ...]:
    variants = tuple(Variant.from_name(name) for name in VARIANT_NAMES)
    return tuple(G.cases(tier="gpu", variants=variants))


def test_sample_has_heavy_and_several_groups():
    cases = sample_cases()
    assert any(c.heavy for c in cases) and not all(c.heavy for c in cases)
    assert len({S.kernel_group(c) for c in cases if not c.heavy}) >= 8


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_plan_is_a_partition_with_memory_heavy_cases_serial(count):
    cases = sample_cases()
    plan = S.plan_shards(cases, count)
    assert plan.count == count and len(plan.shards) == count
    ids = [c.case_id for shard in plan.shards for c in shard] + [c.case_id for c in plan.serial]
    assert len(ids) == len(set(ids)) == len(cases)  # disjoint and covering
    assert set(ids) == {c.case_id for c in cases}
    alone = {c.case_id for c in cases if G.needs_whole_gpu(c)}
    assert alone and {c.case_id for c in plan.serial} == alone
    assert not any(G.needs_whole_gpu(c) for shard in plan.shards for c in shard)


def test_moe_cases_heavy_by_expert_count_are_sharded_not_serial():
    """A 256-expert stack of small experts is heavy (its weights), not memory-heavy: it runs
    in a shard; a 7168x2048 expert needs a GPU to itself and waits for the serial phase."""
    moe = tuple(G.cases(tier="gpu", variants=(Variant.from_name("moe/mcg/k4/fp16"),)))
    plan = S.plan_shards(moe, 4)
    sharded = {c.case_id for shard in plan.shards for c in shard}
    by_count = [c for c in moe if c.heavy and c.k * c.n < G.WHOLE_GPU_EXPERT_KN]
    assert by_count and {c.case_id for c in by_count} <= sharded
    assert plan.serial and all(c.k * c.n >= G.WHOLE_GPU_EXPERT_KN for c in plan.serial)


@pytest.mark.parametrize("count", [2, 3, 5])
def test_a_kernel_group_is_never_split(count):
    plan = S.plan_shards(sample_cases(), count)
    owners: dict[str, set[int]] = {}
    for index, shard in enumerate(plan.shards):
        for case in shard:
            owners.setdefault(S.kernel_group(case), set()).add(index)
    assert all(len(where) == 1 for where in owners.values()), owners
    assert {key: where.pop() for key, where in owners.items()} == dict(plan.groups)


@pytest.mark.parametrize("count", [2, 3, 4, 7])
def test_loads_match_the_cost_model_and_the_lpt_bound(count):
    plan = S.plan_shards(sample_cases(), count)
    group_cost: Counter[str] = Counter()
    loads = []
    for shard in plan.shards:
        keys = {S.kernel_group(c) for c in shard}
        load = S.COMPILE_COST * len(keys) + sum(S.estimate_cost(c) for c in shard)
        loads.append(load)
        for case in shard:
            group_cost[S.kernel_group(case)] += S.estimate_cost(case)
    assert plan.loads == pytest.approx(loads)
    biggest = S.COMPILE_COST + max(group_cost.values())
    total = sum(loads)
    assert max(loads) <= total / count + biggest + 1e-9
    assert max(loads) >= max(total / count, biggest) - 1e-9  # no plan beats the lower bound


def test_plan_ignores_input_order_and_keeps_groups_contiguous():
    cases = list(sample_cases())
    shuffled = cases[:]
    random.Random(3).shuffle(shuffled)
    a, b = S.plan_shards(cases, 3), S.plan_shards(shuffled, 3)
    assert [{c.case_id for c in s} for s in a.shards] == [{c.case_id for c in s} for s in b.shards]
    for shard in a.shards:  # a shard runs one group after another (compile once, reuse)
        keys = [S.kernel_group(c) for c in shard]
        runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        assert len(runs) == len(set(runs))


def test_custom_group_key_and_cost_are_honoured():
    cases = [c for c in sample_cases() if not c.heavy]
    plan = S.plan_shards(cases, 2, group_key=lambda c: c.variant.name, cost=lambda c: 1.0)
    for shard in plan.shards:
        names = {c.variant.name for c in shard}
        other = {c.variant.name for s in plan.shards if s is not shard for c in s}
        assert not names & other


def test_kernel_group_depends_on_m_only_through_the_tile():
    from b12x.ops.dense.dispatch import DECODE_MATMUL_MIN_M
    from b12x.ops.dense.tiles import choose_tiles

    dense = [c for c in sample_cases() if c.variant.op == "dense"]

    def launched(c):  # what the GPU runner compiles first for this case
        v = c.variant
        if v.rotation == "full" and c.m >= DECODE_MATMUL_MIN_M:
            return ("decode", v.codebook, v.bits)
        return ("gemm", v.codebook, v.bits, v.compute_dtype, choose_tiles(c.m, c.n))

    for a in dense[::7]:
        for b in dense[::5]:
            assert (S.kernel_group(a) == S.kernel_group(b)) == (launched(a) == launched(b))
    decode = [c for c in sample_cases() if c.variant.op == "decode"]
    assert {S.kernel_group(c) for c in decode} == {"decode/mcg/k4"}  # one kernel, any M/dtype


def test_estimate_cost_grows_with_work():
    v = Variant.from_name("dense/mcg/k4/fp16")
    small, wide, tall = G.Case(v, 1, 128, 128), G.Case(v, 1, 1024, 1024), G.Case(v, 4096, 128, 128)
    assert S.CASE_OVERHEAD <= S.estimate_cost(small) < S.estimate_cost(wide)
    assert S.estimate_cost(small) < S.estimate_cost(tall)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"count": 0}, "count"),
        ({"count": True}, "count"),
        ({"count": 2, "cost": lambda c: float("nan")}, "cost"),
        ({"count": 2, "cost": lambda c: -1.0}, "cost"),
        ({"count": 2, "group_key": lambda c: ""}, "group_key"),
    ],
)
def test_plan_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        S.plan_shards(sample_cases()[:4], **kwargs)


def test_plan_rejects_duplicate_cases():
    case = sample_cases()[0]
    with pytest.raises(ValueError, match="duplicate"):
        S.plan_shards([case, case], 2)


# --- shard specs and the CLI -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spec"),
    [("0/4", S.ShardSpec(0, 4)), (" 3/4 ", S.ShardSpec(3, 4)), ("0/1", S.ShardSpec(0, 1))],
)
def test_parse_shard_accepts(text, spec):
    assert S.parse_shard(text) == spec
    assert spec.label == text.strip() and spec.phase == "parallel"


def test_parse_serial():
    spec = S.parse_shard("serial")
    assert spec == S.SERIAL and spec.label == "serial" and spec.phase == "serial"


@pytest.mark.parametrize("text", ["4/4", "-1/4", "a/b", "1", "0/0", "", "1/2/3", "serial/2"])
def test_parse_shard_rejects(text):
    with pytest.raises(ValueError, match="shard"):
        S.parse_shard(text)
    with pytest.raises(TypeError):
        S.parse_shard(3)


def test_cli_parses_shard_and_gpus(capsys):
    parser = build_parser()
    assert parser.parse_args(["run", "--shard", "1/3"]).shard == S.ShardSpec(1, 3)
    assert parser.parse_args(["run", "--shard", "serial"]).shard == S.SERIAL
    assert parser.parse_args(["run", "--gpus", "all"]).gpus == "all"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["run", "--shard", "3/3"])
    assert exc.value.code == 2 and "--shard" in capsys.readouterr().err


def test_cli_rejects_shard_with_gpus_and_gpus_without_devices(monkeypatch):
    with pytest.raises(SystemExit, match="exclude"):
        main(["run", "--shard", "0/2", "--gpus", "2"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SystemExit, match="no CUDA device"):
        main(["run", "--gpus", "all"])


def test_cli_shard_writes_a_manifest(tmp_path):
    case = next(c for c in sample_cases() if c.variant.name == "dense/mcg/k4/fp16")
    parts = []
    for label in ("0/2", "1/2"):
        out = tmp_path / f"{label[0]}.json"
        argv = ["run", "--shard", label, "--case", case.case_id, "--tier", "cpu", "-q"]
        assert main([*argv, "--json", str(out), "--results", str(tmp_path)]) == 0
        parts.append(json.loads(out.read_text())["environment"]["shard"])
    assert [p["label"] for p in parts] == ["0/2", "1/2"]
    assert all(p["executed"] is False for p in parts)
    assigned = [cid for p in parts for cid in p["cases"]]
    from oracle.run.grid import unrunnable_reason

    assert assigned == ([case.case_id] if unrunnable_reason(case) is None else [])
    assert parts[0]["grid"] == parts[1]["grid"]
    assert parts[0]["grid"]["total"] == len(assigned)
    merged = S.merge_reports([tmp_path / "0.json", tmp_path / "1.json"])
    assert merged.summary()["fail"] == 0


def test_visible_gpus():
    env = {"CUDA_VISIBLE_DEVICES": "3, 5,7"}
    assert S.visible_gpus("all", environ=env) == ["3", "5", "7"]
    assert S.visible_gpus("2", environ=env) == ["3", "5"]
    for bad in ("4", "0", "x", "-1"):
        with pytest.raises(ValueError, match="gpus"):
            S.visible_gpus(bad, environ=env)
    with pytest.raises(ValueError, match="no CUDA device"):
        S.visible_gpus("all", environ={"CUDA_VISIBLE_DEVICES": ""})


def test_passthrough_args_keep_the_selection():
    args = argparse.Namespace(tier="gpu", filter="bits=4", case=None, max_cases=7, results="r")
    assert S.passthrough_args(args) == [
        "--tier",
        "gpu",
        "--filter",
        "bits=4",
        "--max-cases",
        "7",
        "--results",
        "r",
    ]


# --- fake partial reports and the merge --------------------------------------------------------

ENV = {"python": "3", "torch": "t", "numpy": "n", "cutlass": "c", "git_sha": "abc", "platform": "p"}


def _status(case: G.Case) -> tuple[str, str]:
    if case.m == 17:
        return "fail", "too far"
    if case.m == 9:
        return "skip", "not today"
    return "pass", ""


def fake_parts(count: int, *, cases=None) -> list[Report]:
    cases = sample_cases() if cases is None else cases
    plan = S.plan_shards(cases, count)
    grid = S.grid_summary((c.case_id for c in cases), len(plan.serial))
    specs = [S.ShardSpec(i, count) for i in range(count)] + ([S.SERIAL] if plan.serial else [])
    parts = []
    for gpu, spec in enumerate(specs):
        mine = plan.cases_for(spec)
        checks = [CheckResult(f"gpu.dense.{c.case_id}", "gpu", *_status(c)) for c in mine]
        if spec.index == 0:
            checks.append(CheckResult("gpu.heavy", "gpu", "skip", "left out"))
        if spec.phase == "parallel":
            checks.append(CheckResult("gpu.graph.decode", "gpu", "pass"))
        manifest = {
            "label": spec.label,
            "index": spec.index,
            "count": spec.count,
            "phase": spec.phase,
            "cases": [c.case_id for c in mine],
            "executed": True,
            "grid": grid,
            "cuda_visible_devices": str(gpu if spec.index is not None else 0),
        }
        env = {**ENV, "device": f"H200 #{gpu}", "shard": manifest}
        parts.append(Report(checks, environment=env))
    return parts


def _status_counts(reports) -> Counter:
    return Counter(check.status for r in reports for check in r.checks)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_merge_adds_up_and_lists_every_device(count, tmp_path):
    parts = fake_parts(count)
    paths = [p.to_json(tmp_path / f"part{i}.json") for i, p in enumerate(parts)]
    merged = S.merge_reports(paths[::-1])  # order of the parts does not matter
    summary = merged.summary()
    expected = _status_counts(parts)
    assert (summary["pass"], summary["fail"], summary["skip"]) == (
        expected["pass"],
        expected["fail"],
        expected["skip"],
    )
    assert summary["total"] == sum(len(p.checks) for p in parts)
    case_ids = [S.case_id_of_check(c.name) for c in merged.checks]
    assert sorted(filter(None, case_ids)) == sorted(c.case_id for c in sample_cases())
    graph = sorted(c.name for c in merged.checks if c.name.startswith("gpu.graph"))
    want = (
        ["gpu.graph.decode"]
        if count == 1
        else [f"gpu.graph.decode@{i}/{count}" for i in range(count)]
    )
    assert graph == sorted(want)
    assert [c.name for c in merged.checks].count("gpu.heavy") == 1
    env = merged.environment()
    labels = [f"{i}/{count}" for i in range(count)] + ["serial"]
    assert [d["shard"] for d in env["devices"]] == labels
    assert {d["device"] for d in env["devices"]} == {f"H200 #{i}" for i in range(count + 1)}
    assert env["git_sha"] == "abc" and env["shards"]["count"] == count
    assert Report.from_json(merged.to_json(tmp_path / "merged.json")).summary() == summary


def test_merge_rejects_a_duplicate_case_result():
    parts = fake_parts(2)
    stolen = next(c for c in parts[0].checks if S.case_id_of_check(c.name))
    parts[1].checks.append(stolen)
    with pytest.raises(ValueError, match="duplicate result"):
        S.merge_reports(parts)


def test_merge_rejects_the_same_case_assigned_twice():
    parts = fake_parts(2)
    parts[1].environment()  # materialise, then edit the manifest
    parts[1]._environment["shard"]["cases"] = list(parts[1]._environment["shard"]["cases"])
    parts[1]._environment["shard"]["cases"].append(parts[0].environment()["shard"]["cases"][0])
    with pytest.raises(ValueError, match="assigned to shards"):
        S.merge_reports(parts)


def test_merge_detects_a_missing_or_duplicate_shard():
    parts = fake_parts(3)
    with pytest.raises(ValueError, match=r"missing shard\(s\) \['1/3'\]"):
        S.merge_reports([parts[0], parts[2], parts[3]])
    with pytest.raises(ValueError, match=r"missing shard\(s\) \['serial'\]"):
        S.merge_reports(parts[:3])
    with pytest.raises(ValueError, match="duplicate shard"):
        S.merge_reports([*parts, parts[1]])
    with pytest.raises(ValueError, match="shard count"):
        S.merge_reports(parts, expected_count=4)


def test_merge_detects_a_missing_case_result_and_a_foreign_one():
    parts = fake_parts(2)
    dropped = next(c for c in parts[0].checks if S.case_id_of_check(c.name))
    parts[0].checks.remove(dropped)
    with pytest.raises(ValueError, match="no result for case"):
        S.merge_reports(parts)
    parts = fake_parts(2)
    moved = next(c for c in parts[0].checks if S.case_id_of_check(c.name))
    parts[0].checks.remove(moved)
    parts[1].checks.append(moved)
    with pytest.raises(ValueError, match="not assigned"):
        S.merge_reports(parts)


def test_merge_rejects_parts_of_different_grids_and_reports_without_manifest():
    a = fake_parts(2)
    b = fake_parts(2, cases=sample_cases()[:-1])
    with pytest.raises(ValueError, match="different grids"):
        S.merge_reports([a[0], b[1], a[2]])
    with pytest.raises(ValueError, match="manifest"):
        S.merge_reports([Report([], environment=dict(ENV))])
    bad = fake_parts(2)
    bad[0]._environment["shard"] = {**bad[0]._environment["shard"], "label": "7/2"}
    with pytest.raises(ValueError, match="bad shard label"):
        S.merge_reports(bad)
    bad[0]._environment["shard"] = {**bad[0]._environment["shard"], "label": "1/2"}
    with pytest.raises(ValueError, match="disagrees with its label"):
        S.merge_reports(bad)


def test_merge_turns_a_crashed_shard_into_a_failure():
    parts = fake_parts(2)
    merged = S.merge_reports([parts[0], parts[2]], crashed={"1/2": "exited -9"})
    crash = [c for c in merged.checks if c.name == "oracle.shard.1/2"]
    assert len(crash) == 1 and crash[0].status == "fail" and "exited -9" in crash[0].reason
    assert merged.exit_code() == 1 and merged.environment()["shards"]["crashed"] == ["1/2"]


# --- the shard runner, with the GPU runner faked -----------------------------------------------


def test_run_shard_runs_its_slice_and_merges(monkeypatch):
    from oracle.run import grid

    cases = tuple(c for c in sample_cases() if c.variant.name == "dense/mcg/k4/fp16")
    boom = cases[1].case_id

    def fake_case_results(case, ctx):
        if case.case_id == boom:
            raise RuntimeError("kernel exploded")
        return [CheckResult(f"gpu.dense.{case.case_id}", "gpu", "pass")]

    monkeypatch.setattr(grid, "case_results", fake_case_results)
    monkeypatch.setattr(
        grid, "graph_results", lambda ctx: [CheckResult("gpu.graph.x", "gpu", "pass")]
    )
    note = CheckResult("gpu.moe.unrunnable", "gpu", "skip", "3 case(s): no runner")
    selection = S.Selection(cases, (note,))
    ctx = CheckContext(tier="gpu", cuda=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", _h100)  # the shard plans on its GPU
    specs = [S.ShardSpec(0, 2), S.ShardSpec(1, 2), S.SERIAL]
    parts = [S.run_shard(ctx, spec, selection=selection) for spec in specs]
    shard0 = parts[0].environment()["shard"]
    assert shard0["executed"] is True and shard0["cuda_visible_devices"] == "6"
    assert [c.name for c in parts[1].checks].count("gpu.moe.unrunnable") == 0
    assert not any(c.name.startswith("gpu.graph") for c in parts[2].checks)  # serial: grid only
    merged = S.merge_reports(parts)
    by_name = {c.name: c for c in merged.checks}
    assert by_name[f"gpu.dense.{boom}"].status == "fail"
    assert "kernel exploded" in by_name[f"gpu.dense.{boom}"].reason
    assert "gpu.moe.unrunnable" in by_name
    graph = [name for name in by_name if name.startswith("gpu.graph")]
    assert graph == ["gpu.graph.x"]  # the graph protocol runs once, on the first parallel shard
    ids = {S.case_id_of_check(n) for n in by_name} - {None}
    assert ids == {c.case_id for c in cases}


def test_run_shard_without_cuda_says_why():
    cases = tuple(c for c in sample_cases() if c.variant.op == "decode")[:5]
    report = S.run_shard(CheckContext(), S.ShardSpec(0, 1), selection=S.Selection(cases, ()))
    (check,) = report.checks
    assert check.status == "skip" and "no CUDA device" in check.reason
    assert report.environment()["shard"]["cases"] == [c.case_id for c in cases]


# --- the launcher, with a fake shard command ---------------------------------------------------

FAKE_SHARD = r"""
import json, os, sys, time
from pathlib import Path
json_path, label, plan_file = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
out, plan = json_path.parent, json.loads(plan_file.read_text())
me = plan["shards"][label]
if label in plan.get("hang", []):
    time.sleep(60)
tag = "serial" if label == "serial" else label.split("/")[0]
(out / f"started_{tag}").write_text(os.environ["CUDA_VISIBLE_DEVICES"])
(out / f"threads_{tag}").write_text(os.environ["OMP_NUM_THREADS"])
if label == "serial":
    if not all((out / f"part_{i}.json").is_file() for i in range(plan["count"])):
        sys.exit(4)  # the serial phase must start after every parallel part is written
else:
    deadline = time.monotonic() + 30
    while not all((out / f"started_{i}").exists() for i in range(plan["count"])):
        if time.monotonic() > deadline:
            sys.exit(3)  # the parallel shards did not run at the same time
        time.sleep(0.02)
if label in plan.get("crash", []):
    print("boom: simulated crash")
    sys.exit(5)
checks = [{"name": f"gpu.dense.{c}", "tier": "gpu", "status": "pass", "reason": "",
           "metrics": {}} for c in me["cases"]]
if label != "serial":
    checks.append({"name": "gpu.graph.decode", "tier": "gpu", "status": "pass", "reason": "",
                   "metrics": {}})
manifest = {**me, "executed": True, "grid": plan["grid"],
            "cuda_visible_devices": os.environ["CUDA_VISIBLE_DEVICES"],
            "argv": sys.argv[4:]}
env = {"git_sha": "abc", "device": "fake GPU " + os.environ["CUDA_VISIBLE_DEVICES"],
       "shard": manifest}
json_path.write_text(json.dumps({"checks": checks, "environment": env}))
"""


def _fake_plan(tmp_path: Path, count: int, *, light: bool = False, **extra) -> Path:
    cases = tuple(c for c in sample_cases() if not (light and c.heavy))
    plan = S.plan_shards(cases, count)
    specs = [S.ShardSpec(i, count) for i in range(count)] + [S.SERIAL]
    shards = {
        s.label: {
            "label": s.label,
            "index": s.index,
            "count": s.count,
            "phase": s.phase,
            "cases": [c.case_id for c in plan.cases_for(s)],
        }
        for s in specs
    }
    grid = S.grid_summary((c.case_id for c in cases), len(plan.serial))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"count": count, "grid": grid, "shards": shards, **extra}))
    return path


def _fake_command(plan_file: Path):
    def command(spec, json_path, passthrough):
        return [sys.executable, "-c", FAKE_SHARD, str(json_path), spec.label, str(plan_file)] + [
            *passthrough
        ]

    return command


def test_launcher_pins_each_shard_runs_them_together_then_serial(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(S.os, "cpu_count", lambda: 16)
    plan_file = _fake_plan(tmp_path, 2)
    report, runs = S.run_multi_gpu(
        ["5", "7"],
        tmp_path / "shards",
        serial=True,
        passthrough=["--filter", "bits=4"],
        command=_fake_command(plan_file),
        timeout=60,
    )
    assert [(r.spec.label, r.gpu, r.returncode) for r in runs] == [
        ("0/2", "5", 0),
        ("1/2", "7", 0),
        ("serial", "5", 0),
    ]
    devices = {d["shard"]: d["cuda_visible_devices"] for d in report.environment()["devices"]}
    assert devices == {"0/2": "5", "1/2": "7", "serial": "5"}
    assert report.summary()["pass"] == len(sample_cases()) + 2 and report.exit_code() == 0
    part = json.loads(runs[0].json_path.read_text())
    assert part["environment"]["shard"]["argv"] == ["--filter", "bits=4"]
    # two shards started together get half the cores each; the serial phase alone gets all
    threads = {p.name: p.read_text() for p in (tmp_path / "shards").glob("threads_*")}
    assert threads == {"threads_0": "8", "threads_1": "8", "threads_serial": "16"}


def test_launcher_reports_a_crashed_and_a_hung_shard(tmp_path):
    plan_file = _fake_plan(tmp_path, 2, light=True, crash=["1/2"])
    report, runs = S.run_multi_gpu(
        ["0", "1"], tmp_path / "a", serial=False, command=_fake_command(plan_file), timeout=60
    )
    crash = {c.name: c for c in report.checks}["oracle.shard.1/2"]
    assert crash.status == "fail" and "exited 5" in crash.reason and "boom" in crash.reason
    assert runs[1].returncode == 5 and not runs[1].ok and report.exit_code() == 1

    plan_file = _fake_plan(tmp_path, 1, light=True, hang=["0/1"])
    report, runs = S.run_multi_gpu(
        ["3"], tmp_path / "b", serial=False, command=_fake_command(plan_file), timeout=1.0
    )
    assert runs[0].returncode is None
    (check,) = report.checks
    assert check.name == "oracle.shard.0/1" and "timed out" in check.reason


def test_a_failed_launch_kills_the_shards_already_started(tmp_path):
    pid_file = tmp_path / "pid"
    sleeper = (  # write-then-rename: the pid file never exists half-written
        f"import os, pathlib, time; pathlib.Path({str(pid_file)!r} + '.tmp')"
        f".write_text(str(os.getpid())); os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r})"
        "; time.sleep(60)"
    )

    def command(spec, json_path, passthrough):
        if spec.index == 0:
            return [sys.executable, "-c", sleeper]
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # the first shard is running before the second one fails
        return [str(tmp_path / "no-such-program")]

    jobs = [(S.ShardSpec(0, 2), "0"), (S.ShardSpec(1, 2), "1")]
    with pytest.raises(FileNotFoundError):
        S.launch_shards(jobs, tmp_path / "out", command=command)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


@pytest.mark.deep
@pytest.mark.slow  # a real subprocess importing torch: ~3-8 s on a loaded 2-core machine
def test_cli_gpus_end_to_end_on_cpu(tmp_path, monkeypatch, capsys):
    """The real parent/shard wiring (one shard keeps it cheap; merging several is tested above
    with the fake command): a `python -m oracle run --shard 0/1` process pinned to GPU 4."""
    case = next(c for c in sample_cases() if c.variant.name == "dense/mcg/k4/fp16")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    out = tmp_path / "merged.json"
    argv = ["run", "--gpus", "all", "--case", case.case_id, "--tier", "cpu", "-q"]
    assert main([*argv, "--json", str(out), "--results", str(tmp_path / "r")]) == 0
    assert "shard 0/1 on GPU 4: exit 0" in capsys.readouterr().out
    data = json.loads(out.read_text())
    devices = [(d["shard"], d["cuda_visible_devices"]) for d in data["environment"]["devices"]]
    assert devices == [("0/1", "4")]
    assert [c["name"] for c in data["checks"]] == ["gpu.shard"]  # CPU tier: one skip, why
    assert data["checks"][0]["reason"].startswith("1 case(s) of shard 0/1 not run: ")
    assert (tmp_path / "r" / "shards" / "part_0.json").is_file()


def _h100():
    from b12x.ops.dense.tiles import DeviceLimits

    return DeviceLimits("H100 (simulated)", 132, 232448, (9, 0))


def _plain_dense(cases):
    return [c for c in cases if c.variant.op == "dense" and c.variant.pair_kind is None
            and c.variant.tier_layout is None]  # fmt: skip


@pytest.mark.parametrize("count", [3, 8])
def test_planned_groups_give_each_product_kernel_one_shard(count):
    """Planned on the shard's device (an H100 here), every GEMM or decode kernel that computes a
    dense case's product is compiled by one shard only. Planted: the device-free key (no
    ``device``) sends M 129..256, which sm_90 plans on the stream-K swap-AB mainloop, to the
    decode kernel's group, and the same GEMM lands on two shards (3 of 3 runs fail)."""
    from oracle.run.runners.dense import planned_product_spec

    h100 = _h100()
    plan = S.plan_shards(sample_cases(), count, device=h100)
    owners: dict[object, set[int]] = {}
    for index, shard in enumerate(plan.shards):
        for case in _plain_dense(shard):
            owners.setdefault(planned_product_spec(case, h100), set()).add(index)
    assert {s.kind for s in owners} >= {"gemm", "gemm_stream_k", "decode"}  # every row planned
    split = {spec: shards for spec, shards in owners.items() if len(shards) > 1}
    assert not split, split


def test_the_planned_key_follows_the_sm90_rows():
    """On sm_90 the dispatch plans stream-K ``wgmma`` GEMMs at M 33..256 and decode-then-GEMM
    only from M 257; the planned key says so, the device-free one does not (module docstring)."""
    h100 = _h100()
    v = Variant.from_name("dense/mcg/k4/fp16")
    decode_key = S.kernel_group(G.Case(Variant.from_name("decode/mcg/k4/fp16"), 1, 4096, 4096))
    at = {m: S.kernel_group(G.Case(v, m, 4096, 4096), device=h100) for m in (1, 64, 200, 300)}
    assert "kind='gemm_stream_k'" in at[200] and "cluster=2" in at[200]
    assert "kind='gemm_stream_k'" in at[64] and at[64] != at[200]
    assert "kind='gemm'" in at[1] and "wgmma=False" in at[1]
    assert "DecodeFormat('mcg')" in at[1]  # a format by name, never by object address
    assert at[300] == decode_key
    assert S.kernel_group(G.Case(v, 200, 4096, 4096)) == decode_key  # the device-free estimate
    assert S.kernel_group(G.Case(v, 200, 4096, 4096), device=h100) == at[200]  # deterministic


def test_a_shard_with_cuda_groups_by_its_device(monkeypatch):
    """A shard with CUDA plans its slice with the planned key on its own GPU (here the current
    device is faked as a simulated H100); without CUDA it keeps the device-free key. Planted:
    the device left out, the plan keeps the device-free groups and the test fails."""
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", _h100)
    spec = S.ShardSpec(0, 3)
    planned = S.plan_shards(sample_cases(), 3, device=_h100())
    free = S.plan_shards(sample_cases(), 3)
    assert planned.groups != free.groups
    assert S.shard_plan(sample_cases(), spec, cuda=True).groups == planned.groups
    assert S.shard_plan(sample_cases(), spec, cuda=False).groups == free.groups
