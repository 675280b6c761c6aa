"""``python -m oracle``: the default job and the subcommands (README.md).

Commands:
* (none) — the default job: :data:`oracle.checks.FAMILIES` in order (on CPU one ``skip`` line per
  GPU family saying why; on a GPU also the differential grid, decode exactness, graph protocol).
* ``run`` — ``--filter EXPR`` / ``--case ID`` select grid cases (``--max-cases N``: a stratified
  sample); ``--tile KxNxT [--codebook C] [--bits B]`` qualifies one tile, compiles its kernel
  specialisations for sm_80/sm_90/sm_120 and on a GPU runs the grid cases pinned to it
  (:mod:`oracle.checks.tile_run`; nothing about a tile passes without compiling);
  ``--compile-all`` / ``--compile-budget S``; ``--gpus N|all`` shards over GPUs and merges one
  report, ``--shard I/N|serial`` runs one slice.
* ``grid`` — list case ids (runs nothing, needs no device). ``contracts`` and ``mutate`` delegate
  to :func:`oracle.contracts.cli.main` and :func:`oracle.mutate.cli.main`.
* ``replay PATH`` — load a saved case (no pickle), check it against its id, recompute its
  references, rerun the kernel when CUDA is present, print the verdict.
* ``report JSON`` — print a report as a table; ``--png DIR`` and ``--tile-map CASE`` write plots.

Common options: ``--json FILE``, ``--results DIR``, ``--tier cpu|gpu|auto``, ``--require-gpu``,
``-q``.

Refusals: every selection, tile, family, input and output file and the device are validated
before anything runs; a refusal prints ONE line, ``python -m oracle <command>: error: <why>``,
to stderr and exits 2 (never a traceback). :func:`refuse` is the one place that does so (argparse
errors included); it raises :class:`Refused`, a ``SystemExit`` with code 2. Exit codes: 0 every
check passed (skips never fail); 1 a check failed; 2 refused; 130 interrupted (Ctrl-C, in every
command). The full notes: docs/notes/oracle.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, NoReturn

from oracle import checks
from oracle.arguments import budget_seconds, nonempty, output_problem, positive_int
from oracle.checks.dispatch_tiles import parse_tile
from oracle.contracts import cli as contracts_cli
from oracle.mutate import cli as mutate_cli
from oracle.report.report import Report, plot_error_vs_shape, plot_points, plot_tile_error_map
from oracle.report.results import load_case

__all__ = ["Refused", "UsageError", "build_parser", "main", "refuse", "write_json_or_refuse"]

ARCH_NOTE = "sm_80, sm_90, sm_120"


class UsageError(Exception):
    """A refusal of the command line (one-line message); :func:`main` prints it and exits 2."""


class Refused(SystemExit):
    """Exit code 2 after a one-line refusal was printed; ``str()`` is the message."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def refuse(prog: str, message: str) -> NoReturn:
    """Print ``<prog>: error: <message>`` as ONE line on stderr and raise :class:`Refused`."""
    line = " ".join(str(message).split())
    print(f"{prog}: error: {line}", file=sys.stderr)
    raise Refused(line)


def write_json_or_refuse(prog: str, path: str, payload: Any) -> Path:
    """``payload`` as strict JSON (indent 2, no NaN literals, a final newline) in the ``--json``
    file ``path``; a write error is a refusal naming it."""
    out = Path(path)
    try:
        out.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        refuse(prog, f"--json: cannot write {path}: {exc.strerror or exc}")
    return out


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (:func:`refuse`), not usage + message."""

    def error(self, message: str) -> NoReturn:  # argparse's hook
        refuse(self.prog, f"{message} (see {self.prog} --help)")


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    parser.add_argument(
        "--json", metavar="FILE", type=nonempty, default=default(None), help="write the JSON report"
    )
    parser.add_argument(
        "--results",
        metavar="DIR",
        type=nonempty,
        default=default("results"),
        help="where failing cases are saved (default ./results)",
    )
    parser.add_argument(
        "--tier",
        choices=("cpu", "gpu", "auto"),
        default=default("auto"),
        help="cpu: CPU checks only; gpu: also GPU checks (refused without CUDA); "
        "auto (default): gpu when CUDA is present",
    )
    parser.add_argument(
        "--require-gpu",
        action="store_true",
        default=default(False),
        help="refuse to run (exit 2) when no CUDA device is visible",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default(False),
        help="no table or progress bar; the summary line only",
    )


def _add_workers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="GPU grid: N worker processes on the one GPU (compiles are CPU-bound); default "
        "half the cores, at most 8; 1 runs in-process",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m oracle", description=__doc__.split("\n\n")[0])
    _add_common(parser, suppress=False)
    parser.add_argument(
        "--only",
        metavar="FAMILIES",
        type=nonempty,
        help="default job: comma-separated families to run (default: all of "
        "fingerprints,layout,contracts,dispatch_tiles,compile,gpu)",
    )
    _add_workers(parser)
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run checks for one case, a grid filter or one tile")
    run.add_argument(
        "--filter", type=nonempty, help="grid filter, e.g. 'codebook=mcg,bits=6,m<=128'"
    )
    run.add_argument("--case", type=nonempty, help="one case id (see `grid`)")
    run.add_argument(
        "--kernel",
        type=nonempty,
        metavar="NAME|MODULE:ATTR",
        help="judge another kernel through its adapter (docs/adapters.md): e.g. quack",
    )
    run.add_argument(
        "--tile", type=nonempty, help="qualify, compile and (on a GPU) run one tile: NAME or KxNxT"
    )
    run.add_argument(
        "--codebook", type=nonempty, help="with --tile: compile only this codebook's kernels"
    )
    run.add_argument("--bits", type=positive_int, help="with --tile: only this bit rate")
    run.add_argument(
        "--max-cases",
        type=positive_int,
        default=None,
        help="a stratified sample of N grid cases (every variant, M and dtype first)",
    )
    run.add_argument(
        "--heavy",
        action="store_true",
        help="the heavy shapes (left out of the default job); shard them with --gpus",
    )
    _add_workers(run)
    run.add_argument("--compile-all", action="store_true", help="compile every specialization")
    run.add_argument(
        "--compile-budget",
        type=budget_seconds,
        default=None,
        metavar="S",
        help="compile time budget in seconds (0: none)",
    )
    run.add_argument(
        "--shard",
        type=_shard_arg,
        metavar="I/N|serial",
        help="run one slice of the GPU grid: slice I of N (0-based) or the serial heavy phase",
    )
    run.add_argument(
        "--gpus",
        metavar="N|all",
        help="shard the GPU grid over N GPUs of this host (one pinned process each), one report",
    )
    grid = sub.add_parser("grid", help="list grid cases")
    grid.add_argument("--filter", type=nonempty, help="grid filter expression")
    grid.add_argument("--op", choices=("decode", "dense", "moe"))
    contracts = sub.add_parser("contracts", help="static ABI contracts (oracle.contracts.cli)")
    contracts.add_argument("args", nargs=argparse.REMAINDER)
    mutate = sub.add_parser("mutate", help="mutation gate (oracle.mutate.cli)", add_help=False)
    mutate.add_argument("args", nargs=argparse.REMAINDER)
    for name, what in (
        ("explain", "print the plan b12x makes for one problem (CPU)"),
        ("drift", "exact vs faithful vs kernel, error map in weight space (CPU)"),
    ):
        delegate = sub.add_parser(name, help=f"{what} (oracle.{name})", add_help=False)
        delegate.add_argument("args", nargs=argparse.REMAINDER)
    replay = sub.add_parser("replay", help="replay a saved failing case")
    replay.add_argument("path", type=nonempty)
    coverage = sub.add_parser(
        "coverage", help="per variant: declared by b12x?, judged by which runners, default cases"
    )
    coverage.add_argument(
        "--json", metavar="FILE", type=nonempty, help="write the coverage JSON (oracle.coverage/1)"
    )
    coverage.add_argument("-q", "--quiet", action="store_true", help="problems and totals only")
    report = sub.add_parser("report", help="render a JSON report")
    report.add_argument("report_json", type=nonempty)
    report.add_argument(
        "--png", metavar="DIR", type=nonempty, help="write error-vs-shape plots here"
    )
    report.add_argument(
        "--tile-map", metavar="CASE", type=nonempty, help="per-tile error map of one saved case"
    )
    for p in (run, grid, replay, report):
        _add_common(p, suppress=True)
    return parser


def _shard_arg(text: str) -> Any:
    from oracle.run.sharding import parse_shard  # lazy: torch stays off the light commands

    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --- device -----------------------------------------------------------------------------------


def _no_cuda_reason() -> str:
    """Why torch sees no CUDA device, in a few words."""
    try:
        import torch  # lazy: torch stays off the light commands
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"

    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return "CUDA_VISIBLE_DEVICES is empty"
    return "torch.cuda.is_available() is False (no driver or device)"


def _resolve_tier(args: argparse.Namespace) -> tuple[str, bool]:
    """``(tier, cuda)`` for a command that runs checks; refuses ``--tier gpu`` or
    ``--require-gpu`` on a machine without CUDA, and ``--require-gpu`` with ``--tier cpu``."""
    if args.require_gpu and args.tier == "cpu":
        raise UsageError("--require-gpu contradicts --tier cpu")
    cuda = checks.cuda_available()
    if (args.tier == "gpu" or args.require_gpu) and not cuda:
        flag = "--tier gpu" if args.tier == "gpu" else "--require-gpu"
        raise UsageError(f"{flag}: no CUDA device is visible ({_no_cuda_reason()})")
    tier = args.tier if args.tier != "auto" else ("gpu" if cuda else "cpu")
    return tier, cuda


def _no_device_flags(args: argparse.Namespace, command: str) -> None:
    if args.require_gpu:
        raise UsageError(f"--require-gpu does not apply to `{command}` (it runs no GPU check)")


# --- output -----------------------------------------------------------------------------------


def _progress_factory(args: argparse.Namespace, stack: Any) -> Any:
    """A ``progress(label, total) -> advance()`` for CheckContext, or None when quiet."""
    if args.quiet or not sys.stdout.isatty():
        return None
    # lazy: rich stays off `contracts` (standard library alone)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = stack.enter_context(
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        )
    )

    def factory(label: str, total: int):
        task = progress.add_task(label, total=total)
        return lambda: progress.advance(task)

    return factory


def _workers(args: argparse.Namespace, *, cuda: bool, tier: str) -> int:
    """``--workers``, else the default for a GPU job that runs more than one case."""
    from oracle.checks.gpu import default_workers  # lazy: torch stays off the light commands

    if getattr(args, "workers", None) is not None:
        return args.workers
    if not cuda or tier != "gpu" or getattr(args, "case", None):
        return 1
    return default_workers()


def _context(args: argparse.Namespace, progress: Any = None, *, tier: str, cuda: bool) -> Any:
    ctx = checks.CheckContext(
        tier=tier,
        cuda=cuda,
        filter=getattr(args, "filter", None),
        case=getattr(args, "case", None),
        tile=getattr(args, "tile", None),
        results_dir=Path(args.results),
        max_cases=getattr(args, "max_cases", None),
        heavy=bool(getattr(args, "heavy", False)),
        workers=_workers(args, cuda=cuda, tier=tier),
        progress=progress,
    )
    ctx.all_specs = bool(getattr(args, "compile_all", False))
    budget = getattr(args, "compile_budget", None)
    if budget is not None:
        ctx.compile_budget_s = budget
    return ctx


#: Skip reasons the closing line spells out; the rest are counted (all are in the table / JSON).
SKIP_REASONS_SHOWN = 6


def _skip_line(skips: list, tier: str = "GPU") -> str:
    """One line naming the skipped checks of a tier (the first six) and their distinct reasons
    (the first :data:`SKIP_REASONS_SHOWN`, then how many more: a run with 160 "b12x.support does
    not declare ..." reasons stays one readable line)."""
    names = ", ".join(c.name for c in skips[:6]) + (" …" if len(skips) > 6 else "")
    reasons = sorted({c.reason for c in skips})
    shown = "; ".join(reasons[:SKIP_REASONS_SHOWN])
    more = len(reasons) - SKIP_REASONS_SHOWN
    if more > 0:
        shown += f"; and {more} more reason(s) (each in the table without -q, and in --json)"
    return f"{tier} checks skipped ({len(skips)}): {names} — {shown}"


def _finish(report: Any, args: argparse.Namespace) -> int:
    """Print the table (or summary), write JSON, name the skipped checks; return exit code."""
    from rich.console import Console  # lazy: rich stays off `contracts` (standard library alone)

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)
    if args.quiet:
        s = report.summary()
        print(f"{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped")
        for check in report.checks:
            if check.status == "fail":
                print(f"FAIL {check.name}: {check.reason}")
    else:
        report.print_table(console)
    gpu_skips = [c for c in report.checks if c.tier == "gpu" and c.status == "skip"]
    if gpu_skips:
        print(_skip_line(gpu_skips))
    cpu_skips = [c for c in report.checks if c.tier == "cpu" and c.status == "skip"]
    if cpu_skips:  # e.g. a compile budget spent: checks this run did not do, said at the end
        print(_skip_line(cpu_skips, "CPU"))
    if args.json:
        try:
            print(f"JSON report: {report.to_json(args.json)}")
        except OSError as exc:
            raise UsageError(f"--json: cannot write {args.json}: {exc.strerror or exc}") from None
    return report.exit_code()


# --- the default job ----------------------------------------------------------------------------


def _cmd_default(args: argparse.Namespace) -> int:

    families = checks.FAMILIES
    if args.only is not None:
        families = tuple(f.strip() for f in args.only.split(",") if f.strip())
        unknown = [f for f in families if f not in checks.FAMILIES]
        if unknown or not families:
            raise UsageError(
                f"--only: unknown families {unknown or [args.only]}; "
                f"known: {', '.join(checks.FAMILIES)}"
            )
    tier, cuda = _resolve_tier(args)
    with contextlib.ExitStack() as stack:
        ctx = _context(args, _progress_factory(args, stack), tier=tier, cuda=cuda)
        report = Report(checks.run(ctx, families))
    return _finish(report, args)


# --- run ------------------------------------------------------------------------------------------


def _validate_run_selection(args: argparse.Namespace) -> None:
    """Validate ``--filter``/``--case``/``--max-cases`` against the grid, and require at least one
    case the oracle can run on a GPU (else nothing would ever be judged)."""
    # lazy: torch stays off the light commands
    from oracle.cases.grids import select_cases
    from oracle.cases.sampling import stratified_cover_size

    if not (args.filter or args.case):
        return
    selected = select_cases(filter=args.filter, case=args.case, tier="gpu")
    from oracle.run.grid import select_grid  # lazy: torch stays off the light commands

    runnable, notes = select_grid(case=args.case, filter=args.filter, max_cases=None)
    if not runnable:
        why = "; ".join(n.reason for n in notes if n.status == "skip") or "no runner"
        raise UsageError(
            f"the selection matches {len(selected)} grid case(s), none of which the oracle can "
            f"run on a GPU ({why})"
        )
    if args.max_cases is not None:
        cover = stratified_cover_size(runnable)
        if args.max_cases < cover:
            print(
                f"note: --max-cases {args.max_cases} is below the {cover} cases needed to visit "
                "every variant, M and compute dtype of the selection once",
                file=sys.stderr,
            )


def _cmd_run(args: argparse.Namespace) -> int:
    from oracle.checks import tile_run  # lazy: torch stays off the light commands

    if args.kernel:
        return _cmd_run_kernel(args)
    if args.case and args.filter:
        raise UsageError("use --case or --filter, not both")
    if (args.codebook is not None or args.bits is not None) and not args.tile:
        raise UsageError("--codebook and --bits narrow a --tile run; give --tile NAME or KxNxT")
    if sum((args.shard is not None, args.gpus is not None, bool(args.tile))) > 1:
        raise UsageError("--shard, --gpus and --tile exclude each other")
    if args.tile:
        tile = _parse_tile(args.tile)
        args.tile = "x".join(map(str, tile))  # one spelling downstream: the shape
        _validate_narrowing(args)
    tier, cuda = _resolve_tier(args)
    _validate_run_selection(args)
    if args.shard is not None or args.gpus is not None:
        from oracle.run import sharding  # lazy: torch stays off the light commands

        if args.gpus is not None:
            try:
                report = sharding.run_multi_gpu_cli(args)
            except ValueError as exc:  # sharding's refusals ("no CUDA device", ...): one line
                raise UsageError(str(exc)) from None
            return _finish(report, args)
        return _finish(sharding.run_shard(_context(args, tier=tier, cuda=cuda), args.shard), args)
    with contextlib.ExitStack() as stack:
        ctx = _context(args, _progress_factory(args, stack), tier=tier, cuda=cuda)
        report = Report()
        if args.tile:
            report.extend(
                tile_run.tile_checks(
                    ctx, text=args.tile, tile=tile, codebook=args.codebook, bits=args.bits
                )
            )
        else:
            if args.compile_all or args.compile_budget is not None:
                report.extend(checks.run_family("compile", ctx))
            report.extend(checks.run_family("gpu", ctx))
    return _finish(report, args)


# --- run --kernel ---------------------------------------------------------------------------------

#: ``run`` options that select b12x's own grid, tiles or compiles: not an adapted kernel's.
_B12X_ONLY = ("filter", "tile", "codebook", "bits", "heavy", "compile_all", "compile_budget",
              "shard", "gpus")  # fmt: skip


def _cmd_run_kernel(args: argparse.Namespace) -> int:
    """``run --kernel NAME [--case ID] [--max-cases N]``: the adapter's grid and graph protocol."""
    from oracle import adapters  # lazy: torch stays off the light commands
    from oracle.run import adapter as adapter_run

    given = [f"--{o.replace('_', '-')}" for o in _B12X_ONLY if getattr(args, o) not in (None, 0)]
    if given:
        raise UsageError(f"--kernel judges an adapted kernel's own grid; {given[0]} is b12x's")
    try:
        adapter = adapters.load_adapter(args.kernel)
    except adapters.AdapterError as exc:
        raise UsageError(f"--kernel: {exc}") from None
    tier, cuda = _resolve_tier(args)
    why = adapter.unavailable()
    if why is not None:
        raise UsageError(f"--kernel {args.kernel}: {why}")
    grid = adapter_run.adapter_grid(adapter)
    if args.case:
        grid = [c for c in grid if c.case_id == args.case]
        if not grid:
            raise UsageError(f"--case: {args.case!r} is not a case of kernel {adapter.name!r}")
    elif args.max_cases is not None and args.max_cases < len(grid):
        step = len(grid) / args.max_cases  # evenly along M and shapes (the grid's order)
        grid = [grid[int(i * step)] for i in range(args.max_cases)]
    device = "cuda" if cuda and tier == "gpu" else "cpu"
    results_dir = Path(args.results)
    report = Report()
    for case in grid:
        report.add(adapter_run.run_adapter_case(
            adapter, case, device=device, results_dir=results_dir, kernel=args.kernel,
        ))  # fmt: skip
    if not args.case:
        report.extend(adapter_run.run_adapter_graph(adapter, device=device))
    return _finish(report, args)


# --- run --tile -----------------------------------------------------------------------------------


def _parse_tile(text: str) -> tuple[int, int, int]:
    """A registry entry name or ``KxNxT`` → three positive ints; anything else is a usage error
    (exit 2)."""
    try:
        spec = parse_tile(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if len(spec) != 3 or min(spec) < 1:
        raise UsageError(
            f"--tile: expected three positive integers tile_k x tile_n x cta_threads, e.g. "
            f"64x256x256, got {text!r}"
        )
    return spec  # type: ignore[return-value]


def _validate_narrowing(args: argparse.Namespace) -> None:
    from oracle.cases.variants import CODEBOOK_BITS  # lazy: torch stays off the light commands

    if args.codebook is not None and args.codebook not in CODEBOOK_BITS:
        raise UsageError(
            f"--codebook: unknown codebook {args.codebook!r}; known: {', '.join(CODEBOOK_BITS)}"
        )
    if args.bits is not None:
        legal = (
            CODEBOOK_BITS[args.codebook]
            if args.codebook is not None
            else tuple(sorted({b for bits in CODEBOOK_BITS.values() for b in bits}))
        )
        if args.bits not in legal:
            whose = f"codebook {args.codebook}" if args.codebook else "any codebook"
            raise UsageError(
                f"--bits: {args.bits} is not legal for {whose}; legal: {', '.join(map(str, legal))}"
            )


# --- grid, replay, report -------------------------------------------------------------------------


def _cmd_grid(args: argparse.Namespace) -> int:
    from oracle.cases.grids import select_cases  # lazy: torch stays off the light commands

    _no_device_flags(args, "grid")
    tier = args.tier if args.tier != "auto" else "gpu"
    found = select_cases(op=args.op, filter=args.filter, tier=tier)
    for case in found:
        print(case.case_id)
    print(f"{len(found)} case(s) (tier {tier})", file=sys.stderr)
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    # lazy: torch stays off the light commands
    from oracle.checks.gpu import replay_saved
    from oracle.run.replay import check_grid_case

    loaded = load_case(args.path)
    if loaded.meta.get("kind") != "adapter":  # an adapted kernel's case has no grid variant
        check_grid_case(loaded)
    tier, cuda = _resolve_tier(args)
    result, _ = replay_saved(args.path, cuda=cuda and tier == "gpu")
    if result.status == "skip":
        raise UsageError(f"cannot re-judge {loaded.meta['case_id']}: {result.reason}")
    return _finish(Report([result]), args)


def _cmd_report(args: argparse.Namespace) -> int:
    _no_device_flags(args, "report")
    out_dir = args.png or (args.results if args.tile_map else None)
    if out_dir is not None and (problem := output_problem(out_dir, directory=True)):
        raise UsageError(f"{'--png' if args.png else '--results'}: {problem}")
    report = Report.from_json(args.report_json)
    if not report.checks:
        print(f"FAIL: {args.report_json} holds no check: a report that judged nothing fails")
        return 1
    tile_case = None
    if args.tile_map:
        from oracle.run.replay import check_grid_case  # lazy: torch stays off the light commands

        loaded = load_case(args.tile_map)
        tile_case = (check_grid_case(loaded), loaded)
    if args.png or args.tile_map:
        try:
            import matplotlib  # noqa: F401  # lazy: matplotlib is optional (dev extra)
        except ImportError:
            raise UsageError("--png/--tile-map: matplotlib is not installed") from None
    if args.png and not plot_points(report):
        raise UsageError(
            f"--png: nothing plottable in {args.report_json}: no check carries a numeric rel_l2 "
            "with a variant and M, K, N (in its metrics or a case id in its name)"
        )
    if not args.quiet:
        report.print_table()
    if args.png:
        for path in plot_error_vs_shape(report, args.png):
            print(f"wrote {path}")
    if tile_case is not None:
        from oracle.run.runners import exact_output  # lazy: torch stays off the light commands

        case, loaded = tile_case
        exact = exact_output(case)
        out_dir = Path(args.png or args.results)
        png = plot_tile_error_map(loaded.tensors["y"], exact, out_dir / f"{case.case_id}_tiles.png")
        print(f"wrote {png}")
    return report.exit_code()


def _cmd_coverage(args: argparse.Namespace) -> int:
    """Per registry variant: declared by b12x, judged by which runners, cases in the default
    job (:mod:`oracle.run.coverage`; CPU only, nothing runs). Exit 1 when
    :func:`oracle.run.coverage.problems` finds a declared variant nothing judges or the default
    job leaves out."""
    from oracle.run import coverage  # lazy: torch stays off the light commands

    records = coverage.coverage()
    found = coverage.problems()
    if not args.quiet:
        width = max(len(r.id) for r in records)
        print(f"{'variant':<{width}}  declared  cases  runners / reason")
        for r in records:
            detail = ", ".join(r.runners) if r.declared else r.reason
            print(f"{r.id:<{width}}  {'yes' if r.declared else 'no':<8}  {r.default_cases:>5}  "
                  f"{detail}")  # fmt: skip
    declared = [r for r in records if r.declared]
    print(
        f"{len(records)} variants, {len(declared)} declared by b12x, "
        f"{sum(r.default_cases for r in records)} cases in the default job, "
        f"{len(found)} problem(s)"
    )
    if not args.quiet:
        for t in coverage.tile_coverage():
            print(f"tile {t.name} {t.shape} ({t.registry}): qualifies on {t.qualified}/{t.points}"
                  f" points, {t.specializations} kernel specialisation(s)")  # fmt: skip
    for problem in found:
        print(f"PROBLEM {problem}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(coverage.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if found else 0


# --- entry ----------------------------------------------------------------------------------------


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file or directory the command will write, checked before it does any work."""
    outputs = [("--json", getattr(args, "json", None), False)]
    if args.command in (None, "run", "replay"):
        outputs.append(("--results", getattr(args, "results", None), True))
    for option, value, directory in outputs:
        if value is not None and (problem := output_problem(value, directory=directory)):
            raise UsageError(f"{option}: {problem}")


def _refusal_types() -> tuple[type[BaseException], ...]:
    """The error types that mean "refused" (exit 2); their modules are imported lazily, so an
    error can only be one of them when its module is loaded."""
    types: list[type[BaseException]] = [UsageError]
    for module, name in (
        ("oracle.cases.grids", "SelectionError"),
        ("oracle.report.report", "ReportFileError"),
        ("oracle.report.results", "CaseFileError"),
    ):
        loaded = sys.modules.get(module)
        if loaded is not None:
            types.append(getattr(loaded, name))
    return tuple(types)


def _command_name(argv: Sequence[str]) -> str:
    for word in argv:
        if word in ("run", "grid", "replay", "report", "contracts", "mutate", "coverage",
                    "explain", "drift"):  # fmt: skip
            return f" {word}"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code (module docstring). A refusal is printed as
    one line on stderr and raises :class:`Refused` (``SystemExit`` with code 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(f"python -m oracle{_command_name(argv)}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not isinstance(exc, _refusal_types()):
            raise
        refuse(f"python -m oracle{_command_name(argv)}", str(exc))


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "contracts":  # the delegates print their own one-line refusals
        rest = argv[argv.index("contracts") + 1 :]
        if rest and rest[0] == "--":
            rest = rest[1:]
        return contracts_cli.main(rest)
    if args.command == "mutate":
        return mutate_cli.main(argv[argv.index("mutate") + 1 :])
    if args.command in ("explain", "drift"):  # the delegates print their own one-line refusals
        delegate = import_module(f"oracle.cli.{args.command}")
        return delegate.main(argv[argv.index(args.command) + 1 :])
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is not None and args.only is not None:
        raise UsageError(f"--only selects families of the default job, not of `{args.command}`")
    _check_outputs(args)
    handlers = {
        None: _cmd_default,
        "run": _cmd_run,
        "grid": _cmd_grid,
        "replay": _cmd_replay,
        "report": _cmd_report,
        "coverage": _cmd_coverage,
    }
    return handlers[args.command](args)
