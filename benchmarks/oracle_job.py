"""Benchmark: the oracle's default job (``python -m oracle``), cold and warm, in fresh processes.

It runs the job twice in new subprocesses over one kernel cache directory: **cold** (the cache
directory and the job's results directory are emptied first) and **warm** (the same directories,
as the first run left them). Per run it prints the job's wall time, the number of checks in its
report ("cases"; on a GPU the differential grid's cases are among them), cases per second, and
what the runtime compile cache did, from :func:`b12x.runtime.compile_cache.stats` (each process
appends its stats to ``B12X_COMPILE_STATS`` at exit; sharded subprocesses are summed): compiles
and their seconds vs disk loads and theirs. It also counts files left in the job's working
directory (an empty scratch directory): anything there is a stray dump.

On a GPU the default job includes the differential grid, decode exactness and the graph protocol,
and the targets of the issue are printed next to the times: cold < 300 s, warm < 60 s. On a CPU
the job runs the CPU families only (fewer cases), and its compiles are the compile checks
(``b12x.support.compile_specialization``, three arches per specialization), which bypass the
runtime cache and are summarised in the job's own ``<results>/.compile_cache.json`` instead: the
runtime cache then reports no compiles and the cold/warm difference comes from that summary cache.
The script says so.

Layout (under ``--work``, default ``results/oracle_job/``; ``results/`` is git-ignored)::

    kernels/          the kernel cache both runs use (B12X_CACHE_DIR), unless --cache-dir
    oracle-results/   the job's --results directory (its compile summary cache lives here)
    cwd/              the job's working directory (must stay empty)
    cold.json, warm.json, cold.stats.jsonl, warm.stats.jsonl, cold.log, warm.log

and the summary (table data, environment) is written to ``--out`` (default
``results/oracle_job.json``).

A run past ``--timeout`` kills the job's whole process group, not only its parent: the GPU job's
worker processes (``python -m oracle run --shard i/N``) would otherwise go on compiling and
launching into the next run (a cold run that timed out on an H100 left two of its eight workers
running). Its row names the workers that wrote their compile stats
(``stats_shards``), so the ones missing are the ones that did not finish, and a run that wrote no
report sums the checks of the worker parts written during it (``partial``, :func:`partial_parts`),
so a failure in a finished worker shows even when the job as a whole ran out of time.

Usage: ``python benchmarks/oracle_job.py [--work DIR] [--cache-dir DIR] [--out FILE]
[--timeout S] [--runs cold,warm|cold|warm] [-- ORACLE ARGS...]``; ``--runs cold`` then, in a
later process on the same machine, ``--runs warm`` splits the two over two calls of a device
with a per-call time limit (the warm run reuses ``WORK`` as the cold one left it). Arguments
after ``--`` go to ``python -m oracle``, e.g.
``-- --only compile``. ``--cache-dir`` is never emptied unless it is inside ``--work``: point it
at your real cache to measure a warm run only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS_S = {"cold": 300.0, "warm": 60.0}  # the budgets for the GPU job
STAT_SUMS = ("compiles", "compile_s", "disk_loads", "disk_load_s", "disk_writes", "disk_write_s")


def _empty(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _sum_stats(path: Path) -> dict[str, Any]:
    """Sum the per-process lines of a ``B12X_COMPILE_STATS`` file; ``stats_shards`` are the
    ``--shard`` labels of the worker processes among them (those that exited)."""
    total: dict[str, Any] = {name: 0 for name in STAT_SUMS}
    total["processes"] = 0
    shards = []
    compiled: Counter[str] = Counter()
    resolved: set[str] = set()
    if path.is_file():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            total["processes"] += 1
            for name in STAT_SUMS:
                total[name] += record.get(name, 0)
            compiled.update(record.get("compiled_keys", []))
            resolved.update(record.get("resolved_keys", []))
            argv = record.get("argv", [])
            if "--shard" in argv[:-1]:
                shards.append(argv[argv.index("--shard") + 1])
    total["stats_shards"] = sorted(shards)
    # distinct specialisations the job resolved, and compiles of a key another process also built
    total["distinct_specialisations"] = len(resolved)
    total["distinct_compiled"] = len(compiled)
    total["duplicate_compiles"] = sum(compiled.values()) - len(compiled)
    for name in STAT_SUMS:
        if name.endswith("_s"):
            total[name] = round(total[name], 2)
    return total


def run_job(name: str, work: Path, cache_dir: Path, oracle_args: list[str], timeout: float):
    """One ``python -m oracle`` in a fresh process; returns the row of the table."""
    report = work / f"{name}.json"
    stats_file = work / f"{name}.stats.jsonl"
    cwd = work / "cwd"
    for stale in (report, stats_file):
        stale.unlink(missing_ok=True)
    _empty(cwd)
    env = dict(os.environ)
    env["B12X_CACHE_DIR"] = str(cache_dir)
    env["B12X_COMPILE_STATS"] = str(stats_file)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "oracle", "--json", str(report)]
    cmd += ["--results", str(work / "oracle-results"), "-q", *oracle_args]
    start = time.perf_counter()
    started = time.time()
    rc, log = run_group(cmd, cwd=cwd, env=env, timeout=timeout)
    wall = time.perf_counter() - start
    (work / f"{name}.log").write_text(log)
    summary: dict[str, Any] = {}
    environment: dict[str, Any] = {}
    case_time: dict[str, Any] = {}
    if report.is_file():
        data = json.loads(report.read_text())
        summary, environment = data.get("summary", {}), data.get("environment", {})
        case_time = case_seconds(data.get("checks", []))
        case_time["per_worker_s"] = worker_seconds(work / "oracle-results" / "workers")
    cases = summary.get("total", 0)
    return {
        "run": name,
        "rc": rc,
        "wall_s": round(wall, 2),
        "cases": cases,
        "cases_per_s": round(cases / wall, 2) if wall > 0 else None,
        "pass": summary.get("pass"),
        "fail": summary.get("fail"),
        "skip": summary.get("skip"),
        "by_tier": summary.get("by_tier"),
        "device": environment.get("device"),
        "stray_files": sorted(p.name for p in cwd.iterdir()),
        "case_seconds": case_time,
        **_sum_stats(stats_file),
        # no report (a timeout or a crash): what the workers that finished wrote, this run only
        "partial": None
        if report.is_file()
        else partial_parts(work / "oracle-results" / "workers", since=started),
    }


def run_group(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: float):
    """``(returncode or "timeout", stdout + stderr)`` of ``cmd`` run as the leader of a new
    process group; past ``timeout`` the whole group is killed (module docstring)."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return "timeout", (out or "") + (err or "")


def case_seconds(checks: list[dict[str, Any]], slowest: int = 8) -> dict[str, Any]:
    """Where the GPU grid's time went: per op, the summed wall of its cases (``case_wall_s``,
    which every runner result carries: executions, references and judges of one case, counted
    once per case) and the slowest cases. Worker processes run concurrently, so the sums exceed
    the job's wall time by up to the worker count."""
    walls: dict[str, float] = {}
    for check in checks:
        wall = (check.get("metrics") or {}).get("case_wall_s")
        parts = check.get("name", "").split(".")
        if wall is None or len(parts) < 3 or parts[0] != "gpu":
            continue
        walls[f"{parts[1]}.{parts[2]}"] = float(wall)
    per_op: dict[str, float] = {}
    for key, wall in walls.items():
        op = key.split(".", 1)[0]
        per_op[op] = round(per_op.get(op, 0.0) + wall, 2)
    top = sorted(walls.items(), key=lambda item: -item[1])[:slowest]
    return {"per_op_s": per_op, "slowest": [[key, round(w, 3)] for key, w in top]}


def partial_parts(parts_dir: Path, *, since: float) -> dict[str, Any] | None:
    """The checks of the worker parts (``part_<tag>.json``) written at or after ``since`` (epoch
    seconds), summed by status with the first failing names; ``None`` when there is none. A job
    killed at its timeout writes no report, but the workers that finished wrote theirs: a
    failure among them must show, and a part older than the run (a warm run reuses the cold
    run's results directory) must not pass for this run's."""
    tags, counts, failed = [], Counter(), []
    for tag, checks in _parts(parts_dir, since=since):
        tags.append(tag)
        for check in checks:
            counts[check.get("status")] += 1
            if check.get("status") == "fail":
                failed.append(check.get("name"))
    if not tags:
        return None
    return {"parts": tags, **{k: counts[k] for k in ("pass", "fail", "skip")},
            "failed": failed[:5]}  # fmt: skip


def worker_seconds(parts_dir: Path) -> dict[str, float]:
    """Summed case wall per worker process (``part_<tag>.json`` of a one-GPU job's workers):
    how evenly the shard plan spread the grid. Empty when the job ran in one process."""
    out: dict[str, float] = {}
    for tag, checks in _parts(parts_dir):
        out[tag] = round(sum(case_seconds(checks)["per_op_s"].values()), 2)
    return out


def _parts(parts_dir: Path, *, since: float | None = None):
    """``(tag, checks)`` of each readable ``part_<tag>.json`` under ``parts_dir``, by name; with
    ``since`` (epoch seconds) only those written at or after it."""
    for part in sorted(parts_dir.glob("part_*.json")):
        try:
            if since is not None and part.stat().st_mtime < since:
                continue
            checks = json.loads(part.read_text()).get("checks", [])
        except (OSError, ValueError):
            continue
        yield part.stem.removeprefix("part_"), checks


def _table(rows: list[dict[str, Any]], gpu: bool) -> str:
    cols = [
        ("run", "run"),
        ("rc", "rc"),
        ("wall_s", "wall s"),
        ("cases", "cases"),
        ("cases_per_s", "cases/s"),
        ("compiles", "compiles"),
        ("distinct_compiled", "distinct"),
        ("compile_s", "compile s"),
        ("disk_loads", "disk loads"),
        ("disk_load_s", "load s"),
        ("disk_writes", "writes"),
        ("stray", "stray files"),
    ]
    if gpu:
        cols.append(("target", "target"))
    cells = []
    for row in rows:
        shown = dict(row, stray=len(row["stray_files"]))
        if gpu:
            limit = TARGETS_S[row["run"]]
            verdict = "ok" if row["wall_s"] < limit else "OVER"
            shown["target"] = f"< {limit:.0f} s {verdict}"
        cells.append([str(shown.get(key, "")) for key, _ in cols])
    widths = [max(len(title), *(len(c[i]) for c in cells)) for i, (_, title) in enumerate(cols)]
    lines = ["  ".join(title.rjust(w) for (_, title), w in zip(cols, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    return "\n".join(lines)


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    oracle_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, oracle_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=str(ROOT / "results" / "oracle_job"))
    parser.add_argument("--cache-dir", help="kernel cache (default: WORK/kernels, emptied)")
    parser.add_argument("--out", default=str(ROOT / "results" / "oracle_job.json"))
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    parser.add_argument(
        "--runs",
        default="cold,warm",
        choices=("cold,warm", "cold", "warm"),
        help="which runs (default both); 'warm' alone reuses WORK as an earlier run left it",
    )
    args = parser.parse_args(argv)
    runs = args.runs.split(",")

    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else work / "kernels"
    if "cold" in runs:
        if work in cache_dir.parents:
            _empty(cache_dir)  # cold means cold; a --cache-dir outside WORK is never touched
        _empty(work / "oracle-results")
    gpu = _has_gpu()
    rows = []
    for name in runs:  # one line per run as it ends: a device call cut short still shows it
        print(f"{name}: running (timeout {args.timeout:.0f} s)", flush=True)
        rows.append(run_job(name, work, cache_dir, oracle_args, args.timeout))
        row = rows[-1]
        print(f"{name}: rc={row['rc']} wall {row['wall_s']} s, {row['cases']} checks "
              f"({row['pass']} pass / {row['fail']} fail / {row['skip']} skip), "
              f"{row['compiles']} compiles of {row['distinct_compiled']} distinct keys "
              f"({row['distinct_specialisations']} specialisations resolved)",
              flush=True)  # fmt: skip
    for row in rows:
        if row["case_seconds"].get("per_op_s"):
            print(f"{row['run']}: case seconds per op {row['case_seconds']['per_op_s']}; "
                  f"slowest {row['case_seconds']['slowest'][:4]}; "
                  f"per worker {row['case_seconds'].get('per_worker_s')}")  # fmt: skip

    print(f"python -m oracle {' '.join(oracle_args)}".rstrip() + f"  (cache: {cache_dir})")
    print(_table(rows, gpu))
    notes = []
    if not gpu:
        notes.append(
            "CPU only: the default job runs the CPU families (no grid), so it has fewer cases. "
            "Its compiles are the compile checks, which bypass the runtime cache (0 compiles "
            "above) and are summarised in oracle-results/.compile_cache.json: that summary "
            "cache, not the kernel cache, makes the warm run faster here. The GPU targets "
            "(cold < 300 s, warm < 60 s) apply on a GPU."
        )
    for row in rows:
        if row["rc"] not in (0, 1):
            notes.append(
                f"{row['run']}: python -m oracle exited {row['rc']} (see {row['run']}.log)"
            )
        if row["partial"]:
            part = row["partial"]
            notes.append(
                f"{row['run']}: no report; {len(part['parts'])} worker part(s) written this run: "
                f"{part['pass']} pass / {part['fail']} fail / {part['skip']} skip"
                + (f", failing: {part['failed']}" if part["fail"] else "")
            )
        if row["rc"] == "timeout" and row["stats_shards"]:
            done = ", ".join(row["stats_shards"])
            notes.append(f"{row['run']}: workers that finished before the kill: {done}")
        if row["stray_files"]:
            notes.append(f"{row['run']}: stray files in the working dir: {row['stray_files'][:5]}")
    for note in notes:
        print("note:", note)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "gpu": gpu,
                "targets_s": TARGETS_S,
                "oracle_args": oracle_args,
                "rows": rows,
                "notes": notes,
                "work": str(work),
                "cache_dir": str(cache_dir),
            },
            indent=1,
        )
    )
    print(f"JSON: {out}")
    return 0 if all(row["rc"] in (0, 1) for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
