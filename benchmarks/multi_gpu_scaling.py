"""Wall time of the oracle's GPU grid on 1 GPU vs N GPUs of one host (not a test).

Usage: ``python benchmarks/multi_gpu_scaling.py [--gpus N|all] [--filter EXPR] [--max-cases C]
[--out DIR]``.

Runs ``python -m oracle run --gpus 1`` and ``--gpus N`` on the same selection (each a fresh
process tree, so each pays its own compiles: a kernel group compiles once per run in both), and
prints the wall times, the speed-up ``t1 / tN`` and the parallel efficiency ``speed-up / N``,
plus the estimated per-shard loads of the plan (:func:`oracle.run.sharding.plan_shards`) so that an
imbalance is visible. It then compares the two merged reports case by case: the same verdict for
every case is expected (a case's inputs depend only on its id). On a host with fewer than two
visible GPUs it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from oracle.report.report import Report
from oracle.run import sharding


def _run(gpus: int, args: argparse.Namespace, out: Path) -> tuple[float, Report, int]:
    report_json = out / f"gpus{gpus}.json"
    cmd = [sys.executable, "-m", "oracle", "run", "--gpus", str(gpus), "-q"]
    cmd += ["--json", str(report_json), "--results", str(out / f"results{gpus}")]
    if args.filter:
        cmd += ["--filter", args.filter]
    if args.max_cases is not None:
        cmd += ["--max-cases", str(args.max_cases)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if not report_json.is_file():
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit(f"the {gpus}-GPU run wrote no report (exit {proc.returncode})")
    return wall, Report.from_json(report_json), proc.returncode


def _verdicts(report: Report) -> dict[str, str]:
    return {
        cid: check.status
        for check in report.checks
        if (cid := sharding.case_id_of_check(check.name)) is not None
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="all", help="N or 'all' (default)")
    parser.add_argument("--filter", default=None, help="grid filter (default: the default job)")
    parser.add_argument("--max-cases", type=int, default=None)
    parser.add_argument("--out", default="results/multi_gpu_scaling")
    args = parser.parse_args()

    try:
        gpus = sharding.visible_gpus(args.gpus)
    except ValueError as exc:
        print(f"multi-GPU scaling: nothing to compare ({exc}); exiting 0")
        return 0
    if len(gpus) < 2:
        print(f"multi-GPU scaling: needs two or more GPUs, {len(gpus)} visible; exiting 0")
        return 0
    n = len(gpus)
    selection = sharding.select_cases(filter=args.filter, max_cases=args.max_cases)
    plan = sharding.plan_shards(selection.runnable, n)
    loads = ", ".join(f"{load:.0f}" for load in plan.loads)
    print(f"{len(selection.runnable)} case(s) in {len(plan.groups)} kernel group(s)")
    print(f"  plan over {n} GPUs: estimated loads [{loads}], {len(plan.serial)} heavy (serial)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t1, one, rc1 = _run(1, args, out)
    tn, many, rcn = _run(n, args, out)
    speedup = t1 / tn if tn > 0 else float("inf")
    print(f"  1 GPU : {t1:9.1f} s  (exit {rc1}, {one.summary()['total']} checks)")
    print(f"  {n} GPUs: {tn:9.1f} s  (exit {rcn}, {many.summary()['total']} checks)")
    print(f"  speed-up {speedup:.2f}x, parallel efficiency {speedup / n:.0%}")

    a, b = _verdicts(one), _verdicts(many)
    differ = sorted(cid for cid in a.keys() | b.keys() if a.get(cid) != b.get(cid))
    if differ:
        print(f"  verdicts differ for {len(differ)} case(s), e.g. {differ[:5]}")
        return 1
    print(f"  same verdict for all {len(a)} case(s) on 1 and {n} GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
