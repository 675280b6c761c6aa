"""``python -m oracle mutate [--tier cpu|gpu|all] [--json FILE] [--only ID,...]``.

Layout:
* :func:`build_parser` / :func:`main` (``argv -> exit code``). ``--tier`` selects the mutants
  (default ``cpu``); GPU mutants run only where CUDA is present, else they are reported
  "not-applicable" after checking that their rewrite still applies. ``--only`` takes mutant ids;
  ``--jobs`` the parallelism (default the core count, at most 6 while GPU mutants share the GPU);
  ``--timeout`` the limit per kill command; ``--no-baseline`` skips the unmutated run of the kill
  tests; ``--isolation`` ``auto`` (default: CPU kill commands forked from the preloaded server,
  GPU ones in fresh processes), ``fork`` or ``subprocess``; ``--catalogue`` another catalogue
  file; ``--list`` prints the catalogue; ``--from-json FILE`` re-renders a saved report.
* Output: a rich table (id, class, tier, status, killer or reason, seconds), then per tier the kill
  rate (killed / runnable), the survivors with the kill command that should have killed them, the
  baseline failures and the not-applicable mutants with their reasons. The JSON report
  (``--json``) holds every result (with its time), the per-tier summary and those lists.

JSON report: schema ``oracle.mutate/1`` (:data:`SCHEMA`; fields in ``docs/json_schemas.md``).
``--from-json`` refuses (exit 2, one line) a file that is unreadable, not JSON, of another
schema or missing keys; a file without ``schema`` is the pre-versioning layout, read the same.

``--tier gpu`` without a CUDA device is refused (exit 2) when mutants would run (the gate would
pass without running one). SIGINT / SIGTERM stop the run within seconds
(:func:`oracle.mutate.runner.abort`) and exit 130.

Exit code: 0 when no selected mutant survived, went stale, errored or had a failing baseline;
1 otherwise; 2 for a usage error (unknown id, an ``--only`` id of another tier, bad option,
unreadable --from-json, --tier gpu without CUDA); 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from oracle.arguments import nonempty, output_problem, read_json, seconds
from oracle.mutate.catalogue import load_catalogue
from oracle.mutate.runner import FAILING_STATUSES, gate_passed, run_catalogue, summarize

__all__ = ["SCHEMA", "build_parser", "main", "report_lines", "select"]

#: The JSON report's schema tag (docs/json_schemas.md).
SCHEMA = "oracle.mutate/1"
_REPORT_KEYS = ("summary", "results")

_STYLE = {
    "killed": "green",
    "survived": "bold red",
    "stale": "bold red",
    "error": "bold red",
    "baseline-failed": "bold red",
    "not-applicable": "yellow",
}


class _Refused(Exception):
    """A usage error; :func:`main` prints it as one line and returns 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's hook: one line instead of usage + message
        raise _Refused(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m oracle mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", choices=("cpu", "gpu", "all"), default="cpu")
    parser.add_argument("--json", metavar="FILE", type=nonempty, help="write the JSON report here")
    parser.add_argument("--only", metavar="IDS", type=nonempty, help="comma-separated mutant ids")
    parser.add_argument(
        "--jobs", type=int, default=None, help="parallel mutants (default: cores, 6 on a GPU)"
    )
    parser.add_argument("--timeout", type=seconds, default=300.0, help="seconds per kill command")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    parser.add_argument(
        "--isolation",
        choices=("auto", "fork", "subprocess"),
        default="auto",
        help="auto (default): fork CPU kill commands from a preloaded server, start GPU ones "
        "as fresh processes; fork or subprocess: one way for all",
    )
    parser.add_argument("--catalogue", metavar="TOML", type=nonempty, help="another catalogue file")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument(
        "--from-json", metavar="FILE", type=nonempty, help="re-render a saved JSON report"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="summary lines only")
    return parser


def select(mutants: Sequence, tier: str, only: str | None) -> list:
    """The mutants of ``tier`` (``all`` = every tier), restricted to ``only`` ids if given.

    An ``only`` id of another tier is refused, not run: ``--only`` with the default ``--tier
    cpu`` used to run a GPU mutant anyway, which on a CPU machine is "not-applicable", so the
    gate exited 0 having judged nothing (found with a stream-K GPU mutant).
    """
    if tier not in ("cpu", "gpu", "all"):
        raise ValueError(f"tier: expected cpu, gpu or all, got {tier!r}")
    chosen = [m for m in mutants if tier == "all" or m.tier == tier]
    if only:
        wanted = [i.strip() for i in only.split(",") if i.strip()]
        if not wanted:
            raise ValueError(f"only: {only!r} names no mutant id")
        tiers = {m.id: m.tier for m in mutants}
        unknown = [i for i in wanted if i not in tiers]
        if unknown:
            raise ValueError(f"only: unknown mutant id(s) {unknown}")
        other = [f"{i} ({tiers[i]})" for i in wanted if tier not in ("all", tiers[i])]
        if other:
            raise ValueError(
                f"only: {', '.join(other)} not in --tier {tier} (pass its tier or --tier all)"
            )
        chosen = [m for m in chosen if m.id in wanted]
    return chosen


def _cuda() -> bool:
    try:
        import torch  # lazy: the gate's parent process needs no torch

        return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
    except Exception:  # noqa: BLE001 - no usable CUDA means GPU mutants are not applicable
        return False


def _print_table(results, summary, console) -> None:
    from rich.table import Table  # lazy: rich stays off `contracts` (standard library alone)

    table = Table(title="mutation gate", show_lines=False)
    for col in ("id", "class", "tier", "status", "killer / reason", "s"):
        table.add_column(col, overflow="fold")
    for r in results:
        detail = r.killer or r.reason
        style = _STYLE.get(r.status, "")
        table.add_row(r.id, r.klass, r.tier, f"[{style}]{r.status}[/]", detail, f"{r.seconds:.1f}")
    console.print(table)


def _rate_lines(summary: dict) -> list[str]:
    lines = []
    for tier in sorted(summary):
        c = summary[tier]
        rate = "n/a" if c["kill_rate"] is None else f"{100 * c['kill_rate']:.1f}%"
        runnable = c.get("runnable", c["killed"] + c["survived"])
        lines.append(
            f"tier {tier}: kill rate {rate} ({c['killed']}/{runnable} runnable killed; "
            f"{c['survived']} survived, {c['not-applicable']} not-applicable, {c['stale']} stale, "
            f"{c['error']} error, {c.get('baseline-failed', 0)} baseline-failed; "
            f"{c.get('seconds', 0.0):.1f}s)"
        )
    return lines


def report_lines(results: list[dict]) -> list[str]:
    """Lines under the rates: survivors, baseline failures, not-applicable (from JSON rows)."""
    lines = []
    for r in results:
        if r["status"] == "survived":
            where = f"{r['id']} ({r['class']}, {r['tier']})"
            lines.append(f"SURVIVOR {where}: not killed by {r['kill']}")
        elif r["status"] == "baseline-failed":
            lines.append(f"BASELINE FAILED {r['id']} ({r['tier']}): {r['reason']}")
    for r in results:
        if r["status"] == "not-applicable":
            lines.append(f"not-applicable {r['id']} ({r['tier']}): {r['reason']}")
    return lines


def _report(args, results, summary, gpu) -> dict:
    rows = [r.to_json() for r in results]
    return {
        "schema": SCHEMA,
        "tier": args.tier,
        "gpu": gpu,
        "passed": gate_passed(results),
        "summary": summary,
        "survivors": [
            {"id": r["id"], "tier": r["tier"], "kill": r["kill"]}
            for r in rows
            if r["status"] == "survived"
        ],
        "not_applicable": [
            {"id": r["id"], "tier": r["tier"], "reason": r["reason"]}
            for r in rows
            if r["status"] == "not-applicable"
        ],
        "results": rows,
    }


def _load_saved(path: str) -> dict:
    """A saved mutate report, validated; ValueError (one line) otherwise."""
    try:
        data = read_json(path)
    except ValueError as exc:
        raise ValueError(f"--from-json: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--from-json: {path}: expected a JSON object")
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise ValueError(f"--from-json: {path}: schema {schema!r} is not {SCHEMA!r}")
    missing = [k for k in _REPORT_KEYS if k not in data]
    if missing:
        raise ValueError(f"--from-json: {path}: missing keys {missing}")
    if not isinstance(data["summary"], dict) or not isinstance(data["results"], list):
        raise ValueError(f"--from-json: {path}: 'summary' must be an object, 'results' a list")
    row_keys = {"id", "class", "tier", "status", "seconds", "killer", "reason", "kill"}
    for i, row in enumerate(data["results"]):
        if not isinstance(row, dict) or not row_keys <= set(row):
            raise ValueError(f"--from-json: {path}: results[{i}] lacks {sorted(row_keys)}")
        if not isinstance(row["seconds"], int | float) or isinstance(row["seconds"], bool):
            raise ValueError(f"--from-json: {path}: results[{i}].seconds is not a number")
    for tier, counts in data["summary"].items():
        if not isinstance(counts, dict) or not all(
            isinstance(counts.get(k), int) for k in ("killed", "survived", "stale", "error")
        ):
            raise ValueError(f"--from-json: {path}: summary[{tier!r}] lacks its counts")
    return data


def _render_saved(path: str) -> int:
    data = _load_saved(path)
    if not data["results"]:
        print(f"FAIL: {path} judged no mutant: a gate that ran nothing does not pass")
        return 1
    for line in _rate_lines(data["summary"]):
        print(line)
    for line in report_lines(data["results"]):
        print(line)
    for r in data["results"]:
        print(f"{r['id']:42s} {r['tier']:4s} {r['status']:15s} {r['seconds']:7.1f}s "
              f"{r['killer'] or r['reason']}")  # fmt: skip
    return 0 if data.get("passed") else 1


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While running, SIGTERM (e.g. ``timeout``) interrupts like Ctrl-C: KeyboardInterrupt.

    SIGINT is set to Python's own handler too: a process started by a parent that ignores it (a
    shell's background job, some CI runners) inherits SIG_IGN, and Python then never raises
    KeyboardInterrupt, so the run would go on to the end of every kill command."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gate (module docstring); a usage error is one line on stderr and exit 2."""
    try:
        return _main(argv)
    except _Refused as exc:
        print(f"python -m oracle mutate: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.from_json:
        try:
            return _render_saved(args.from_json)
        except ValueError as exc:
            print(f"python -m oracle mutate: error: {exc}", file=sys.stderr)
            return 2
    if args.json and (problem := output_problem(args.json)):
        parser.error(f"--json: {problem}")
    if args.catalogue and not Path(args.catalogue).is_file():
        parser.error(f"--catalogue: {args.catalogue} is not a file")
    try:
        mutants = load_catalogue(args.catalogue)
        chosen = select(mutants, args.tier, args.only)
    except ValueError as exc:
        parser.error(str(exc))
    if not chosen:
        parser.error(f"--tier {args.tier}: the catalogue has no mutant of this tier")
    if args.list:
        for m in chosen:
            print(f"{m.id:40s} {m.klass:4s} {m.tier:4s} {m.kill.describe()}")
        return 0
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs: expected a positive int, got {args.jobs}")
    gpu = _cuda() if any(m.tier == "gpu" for m in chosen) else False
    if args.tier == "gpu" and not gpu and any(m.tier == "gpu" for m in chosen):
        print(
            "python -m oracle mutate: error: --tier gpu: no CUDA device is visible; every GPU "
            "mutant would be not-applicable (use --tier all to check their rewrites apply)",
            file=sys.stderr,
        )
        return 2
    try:
        with _sigterm_interrupts():
            results = run_catalogue(
                chosen,
                gpu=gpu,
                jobs=args.jobs,
                baseline=not args.no_baseline,
                isolation=args.isolation,
                timeout=args.timeout,
            )
    except KeyboardInterrupt:
        print(
            "python -m oracle mutate: interrupted: kill commands stopped, temporary copies removed",
            file=sys.stderr,
        )
        return 130
    summary = summarize(results)
    report = _report(args, results, summary, gpu)
    if not args.quiet:
        from rich.console import (
            Console,  # lazy: rich stays off `contracts` (standard library alone)
        )

        console = Console(highlight=False)
        if not console.is_terminal:
            console = Console(highlight=False, width=160)
        _print_table(results, summary, console)
    for line in _rate_lines(summary):
        print(line)
    for line in report_lines(report["results"]):
        if not (args.quiet and line.startswith("not-applicable")):
            print(line)
    for r in results:
        if r.status in FAILING_STATUSES:
            print(f"FAIL {r.id}: {r.status}: {r.reason or r.kill}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"JSON report: {path}")
    return 0 if gate_passed(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
