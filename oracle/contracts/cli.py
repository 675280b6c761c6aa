"""Command line: ``python -m oracle contracts [--root DIR] [--json FILE] [--lock FILE]
[--update-lock] [--slots FILE] [--no-lock] [--min-entry-calls PCT] [-v]`` (also
``python -m oracle.contracts``).

Layout
------
* :func:`main` parses ``argv``, optionally rewrites the lock (``--update-lock``), runs
  :func:`~.check.check_package`, prints one line per violation
  ``path:line: [rule] caller -> callee: parameter <- expression (message)``, a summary and
  ``entry calls: R/T resolved (P%)`` (calls into marked entries, :mod:`.entries`; ``-v`` also
  lists each unresolved one ``path:line: [entry-call] caller -> callee: why``), writes the JSON
  report when asked, and returns the exit status.

Invariants
----------
* The JSON report (``--json``) carries ``schema`` = :data:`SCHEMA` (``oracle.contracts/1``) ahead
  of :meth:`~.check.ContractReport.to_json`'s keys; fields in ``docs/json_schemas.md``.
* Exit status 1 when there is any violation, or when ``--min-entry-calls PCT`` is given and
  resolved/total*100 < PCT (one line says so; no minimum by default: the entry-call metric is
  reported, not enforced, until every launch goes through a record); 0 otherwise; 2 for bad
  usage (a PCT outside 0..100 too) or an input the
  checker refuses (a root that is not a directory, an unreadable lock or slots file), printed as
  ONE line ``python -m oracle contracts: error: ...`` on stderr, never a traceback.
* Defaults: the root is the installed ``b12x`` package; when the root *is* b12x, the lock and
  slots default to ``fixtures/abi_lock.json`` and ``fixtures/pinned_slots.json``. For any other
  root only an explicit ``--lock``/``--slots`` is used (another package has its own lock).
* ``--update-lock`` is the only way the lock is written; it bumps the ABI version only when a
  signature changed, and the check that follows runs against the rewritten lock.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from oracle.arguments import nonempty, output_problem

from .check import DEFAULT_LOCK_PATH, DEFAULT_SLOTS_PATH, check_package, default_root
from .entries import format_percent
from .index import build_index
from .lock import update_lock

#: The JSON report's schema tag (docs/json_schemas.md).
SCHEMA = "oracle.contracts/1"


class _Refused(Exception):
    """A usage error or refused input; :func:`main` prints it as one line and returns 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's hook: one line instead of usage + message
        raise _Refused(f"{message} (see {self.prog} --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m oracle contracts",
        description="Static ABI contract checker: binds every call into the package by name.",
    )
    parser.add_argument("--root", type=Path, help="package directory (default: installed b12x)")
    parser.add_argument("--json", type=nonempty, help="write violations and a summary to FILE")
    parser.add_argument(
        "--lock", type=Path, help="ABI signature lock (default for b12x: fixtures/abi_lock.json)"
    )
    parser.add_argument(
        "--update-lock",
        action="store_true",
        help="rewrite the lock; bumps abi_version iff a signature changed",
    )
    parser.add_argument(
        "--slots",
        type=Path,
        help="pinned slots JSON (default for b12x: fixtures/pinned_slots.json)",
    )
    parser.add_argument("--no-lock", action="store_true", help="skip the signature lock check")
    parser.add_argument(
        "--min-entry-calls",
        type=_percent,
        default=100.0,
        metavar="PCT",
        help="exit 1 when fewer than PCT %% of the calls into marked entries resolve "
        "(default 100: every launch is bound to its kernel's signature; 0 reports only)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="also print infos")
    return parser


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage in 0..100, got {text}")
    return value


def _display_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return path


def main(argv: list[str] | None = None) -> int:
    """Run the checker; return 1 on any violation, 0 otherwise, 2 when refused (one line)."""
    try:
        return _main(argv)
    except (_Refused, ValueError, OSError) as exc:
        message = " ".join(str(exc).split())
        print(f"python -m oracle contracts: error: {message}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.json is not None and (problem := output_problem(args.json)):
        raise _Refused(f"--json: {problem}")
    root = (args.root or default_root()).resolve()
    is_b12x = root == default_root()
    lock = args.lock if args.lock is not None else (DEFAULT_LOCK_PATH if is_b12x else None)
    slots = args.slots
    if slots is None and is_b12x and DEFAULT_SLOTS_PATH.is_file():
        slots = DEFAULT_SLOTS_PATH
    if args.no_lock:
        if args.update_lock:
            raise _Refused("--update-lock and --no-lock contradict each other")
        lock = None
    if args.update_lock:
        if lock is None:
            raise _Refused("--update-lock needs --lock FILE for this root")
        version, changed = update_lock(build_index(root), lock)
        state = "bumped" if changed else "unchanged"
        print(f"contracts: wrote {_display_path(str(lock))}: abi_version {version} ({state})")

    report = check_package(root, lock_path=lock, slots_path=slots)
    for violation in report.violations:
        print(violation.format(Path.cwd()))
    if args.verbose:
        for info in report.infos:
            print(info.format(Path.cwd()))
    rules = ", ".join(f"{rule}: {n}" for rule, n in report.by_rule().items())
    counts = report.counts
    print(
        f"contracts: {len(report.violations)} violation(s)"
        + (f" ({rules})" if rules else "")
        + f", {len(report.infos)} info(s); {counts['resolved_calls']}/{counts['calls']} calls "
        f"resolved, {counts['locked_signatures']} locked signature(s), "
        f"{counts['pinned_slots']} pinned slot(s) in {_display_path(str(root))}"
        + ("" if lock is not None else " [no lock check]")
    )
    entries = report.entry_calls
    percent = format_percent(entries.percent)
    print(f"entry calls: {entries.resolved}/{entries.total} resolved ({percent}%)")
    if args.verbose:
        for call in entries.unresolved:
            print(call.format(Path.cwd()))
    if args.json is not None:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps({"schema": SCHEMA, **report.to_json()}, indent=2) + "\n", encoding="utf-8"
        )
    status = 0 if report.ok else 1
    if counts["calls"] == 0:
        print(f"FAIL: contracts judged nothing: no call to bind under {_display_path(str(root))}")
        status = 1
    minimum = args.min_entry_calls
    if minimum is not None and entries.below(minimum):
        print(
            f"contracts: entry calls {entries.resolved}/{entries.total} resolved ({percent}%) "
            f"is below --min-entry-calls {format_percent(minimum)}%"
            + ("" if args.verbose else " (-v lists the unresolved calls)")
        )
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
