"""``python -m oracle``: the default job and the subcommands (design §5, §8).

Commands
--------
* (none) — the default job: :data:`oracle.checks.FAMILIES` in order. On CPU: fingerprints,
  layout, contracts, dispatch/tiles, kernel compile checks, and one ``skip`` line per GPU check
  family saying why; on a GPU also the differential grid, decode exactness and graph protocol.
* ``run`` — ``--filter EXPR`` / ``--case ID`` select grid cases for the GPU families;
  ``--tile TILE`` qualifies one tile on the simulated devices (pin vs the one predicate) and
  compiles the kernel specializations its registry maps it to for every arch (on a GPU it then
  runs the grid and graph families; on CPU it says they were skipped);
  ``--compile-all`` / ``--compile-budget S`` widen the compile family.
  ``--gpus N|all`` shards the grid over N GPUs (one pinned subprocess each, heavy cases in a
  serial phase) and merges one report; ``--shard I/N|serial`` runs one slice (oracle.sharding).
* ``grid`` — list case ids for ``--filter`` / ``--op`` and the tier.
* ``contracts`` — delegates its arguments to :func:`oracle.contracts.cli.main`.
* ``mutate`` — the mutation gate; delegates to :func:`oracle.mutate.cli.main`
  (``[--tier cpu|gpu|all] [--json FILE] [--only ID,...]``).
* ``replay PATH`` — load a saved case (no pickle), recompute its references, rerun the kernel
  when CUDA is present, print the verdict.
* ``report JSON`` — print the JSON report as a table; ``--png DIR`` writes error-vs-shape plots
  per variant; ``--tile-map CASE`` writes the per-tile error map of one saved case.

Common options (before or after the command): ``--json FILE``, ``--results DIR`` (default
``./results``), ``--tier cpu|gpu|auto``, ``-q``. Exit code: 1 when any check failed, else 0
(skips never fail); 2 for a usage error (argparse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]


def _add_common(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    parser.add_argument(
        "--json", metavar="FILE", default=default(None), help="write the JSON report"
    )
    parser.add_argument(
        "--results",
        metavar="DIR",
        default=default("results"),
        help="where failing cases are saved (default ./results)",
    )
    parser.add_argument(
        "--tier",
        choices=("cpu", "gpu", "auto"),
        default=default("auto"),
        help="cpu: CPU checks only; gpu: also GPU checks; auto: gpu when CUDA is present",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default(False),
        help="no table or progress bar; the summary line only",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oracle", description=__doc__.split("\n\n")[0])
    _add_common(parser, suppress=False)
    parser.add_argument(
        "--only",
        metavar="FAMILIES",
        help="default job: comma-separated families to run (default: all of "
        "fingerprints,layout,contracts,dispatch_tiles,compile,gpu)",
    )
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run checks for one case, a grid filter or one tile")
    run.add_argument("--filter", help="grid filter, e.g. 'codebook=mcg,bits=6,m<=128'")
    run.add_argument("--case", help="one case id (see `grid`)")
    run.add_argument("--tile", help="qualify and compile one tile, e.g. 32x512x256")
    run.add_argument("--max-cases", type=int, default=None, help="cap the number of grid cases")
    run.add_argument("--compile-all", action="store_true", help="compile every specialization")
    run.add_argument(
        "--compile-budget",
        type=float,
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
    grid.add_argument("--filter", help="grid filter expression")
    grid.add_argument("--op", choices=("decode", "dense", "moe"))
    contracts = sub.add_parser("contracts", help="static ABI contracts (oracle.contracts.cli)")
    contracts.add_argument("args", nargs=argparse.REMAINDER)
    mutate = sub.add_parser("mutate", help="mutation gate (oracle.mutate.cli)", add_help=False)
    mutate.add_argument("args", nargs=argparse.REMAINDER)
    replay = sub.add_parser("replay", help="replay a saved failing case")
    replay.add_argument("path")
    report = sub.add_parser("report", help="render a JSON report")
    report.add_argument("report_json")
    report.add_argument("--png", metavar="DIR", help="write error-vs-shape plots here")
    report.add_argument("--tile-map", metavar="CASE", help="per-tile error map of one saved case")
    for p in (run, grid, replay, report):
        _add_common(p, suppress=True)
    return parser


def _shard_arg(text: str) -> Any:
    from oracle.sharding import parse_shard

    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _console(quiet: bool) -> Any:
    from rich.console import Console

    return (
        Console(stderr=False, quiet=False, highlight=False, soft_wrap=False) if not quiet else None
    )


def _progress_factory(args: argparse.Namespace, stack: Any) -> Any:
    """A ``progress(label, total) -> advance()`` for CheckContext, or None when quiet."""
    if args.quiet or not sys.stdout.isatty():
        return None
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


def _context(args: argparse.Namespace, progress: Any = None) -> Any:
    from oracle.checks import CheckContext, cuda_available

    cuda = cuda_available()
    tier = args.tier if args.tier != "auto" else ("gpu" if cuda else "cpu")
    ctx = CheckContext(
        tier=tier,
        cuda=cuda,
        filter=getattr(args, "filter", None),
        case=getattr(args, "case", None),
        tile=getattr(args, "tile", None),
        results_dir=Path(args.results),
        max_cases=getattr(args, "max_cases", None),
        progress=progress,
    )
    ctx.all_specs = bool(getattr(args, "compile_all", False))
    budget = getattr(args, "compile_budget", None)
    if budget is not None:
        ctx.compile_budget_s = budget
    return ctx


def _finish(report: Any, args: argparse.Namespace) -> int:
    """Print the table (or summary), write JSON, name the skipped GPU checks; return exit code."""
    from rich.console import Console

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
        reasons = sorted({c.reason for c in gpu_skips})
        print(
            f"GPU checks skipped ({len(gpu_skips)}): {', '.join(c.name for c in gpu_skips[:6])}"
            f"{' …' if len(gpu_skips) > 6 else ''} — {'; '.join(reasons)}"
        )
    if args.json:
        print(f"JSON report: {report.to_json(args.json)}")
    return report.exit_code()


def _cmd_default(args: argparse.Namespace) -> int:
    import contextlib

    from oracle.checks import FAMILIES, run
    from oracle.report import Report

    families = FAMILIES
    if args.only:
        families = tuple(f.strip() for f in args.only.split(",") if f.strip())
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise SystemExit(
                f"python -m oracle: --only: unknown families {unknown}; known: {FAMILIES}"
            )
    with contextlib.ExitStack() as stack:
        ctx = _context(args, _progress_factory(args, stack))
        report = Report(run(ctx, families))
    return _finish(report, args)


def _cmd_run(args: argparse.Namespace) -> int:
    import contextlib

    from oracle.checks import compile as compile_checks
    from oracle.checks import gpu, run_family
    from oracle.checks.dispatch_tiles import qualify_tile, tile_specializations
    from oracle.report import Report

    if args.case and args.filter:
        raise SystemExit("python -m oracle run: use --case or --filter, not both")
    if args.shard is not None or args.gpus is not None:  # multi-GPU sharding (oracle.sharding)
        from oracle import sharding

        if args.tile or (args.shard is not None and args.gpus is not None):
            raise SystemExit("python -m oracle run: --shard, --gpus and --tile exclude each other")
        if args.gpus is not None:
            return _finish(sharding.run_multi_gpu_cli(args), args)
        return _finish(sharding.run_shard(_context(args), args.shard), args)
    with contextlib.ExitStack() as stack:
        ctx = _context(args, _progress_factory(args, stack))
        report = Report()
        if args.tile:
            report.extend(qualify_tile(args.tile))
            specs, why = tile_specializations(args.tile)
            if specs is None:
                report.add(name=f"compile.tile_{args.tile}", tier="cpu", status="skip", reason=why)
            else:
                report.extend(compile_checks.run(ctx, specs=specs, budget_s=0))
            if ctx.cuda and ctx.tier == "gpu":
                report.extend(gpu.run(ctx))
            else:
                why = "no CUDA device" if not ctx.cuda else "tier cpu selected (--tier)"
                report.extend([_skip(f"{n}.tile_{args.tile}", why) for n in gpu.FAMILY_NAMES])
        else:
            if args.compile_all or args.compile_budget is not None:
                report.extend(run_family("compile", ctx))
            report.extend(run_family("gpu", ctx))
    return _finish(report, args)


def _skip(name: str, reason: str) -> Any:
    from oracle.report import CheckResult

    return CheckResult(name, "gpu", "skip", reason)


def _cmd_grid(args: argparse.Namespace) -> int:
    from oracle.grids import cases

    ctx_tier = args.tier if args.tier != "auto" else "gpu"
    found = cases(op=args.op, filter=args.filter, tier=ctx_tier)
    for case in found:
        print(case.case_id)
    print(f"{len(found)} case(s) (tier {ctx_tier})", file=sys.stderr)
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from oracle.checks import cuda_available
    from oracle.checks.gpu import replay_saved
    from oracle.report import Report

    cuda = cuda_available() and args.tier != "cpu"
    result, _ = replay_saved(args.path, cuda=cuda)
    return _finish(Report([result]), args)


def _cmd_report(args: argparse.Namespace) -> int:
    from oracle.report import Report, plot_error_vs_shape, plot_tile_error_map

    report = Report.from_json(args.report_json)
    if not args.quiet:
        report.print_table()
    if args.png:
        for path in plot_error_vs_shape(report, args.png):
            print(f"wrote {path}")
    if args.tile_map:
        from oracle.checks.gpu import references
        from oracle.grids import parse_case_id
        from oracle.results import load_case

        loaded = load_case(args.tile_map)
        case = parse_case_id(loaded.meta["case_id"])
        exact, _ = references(case, {k: t for k, t in loaded.tensors.items() if k != "y"})
        out_dir = Path(args.png or args.results)
        png = plot_tile_error_map(loaded.tensors["y"], exact, out_dir / f"{case.case_id}_tiles.png")
        print(f"wrote {png}")
    return report.exit_code()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "contracts":
        from oracle.contracts.cli import main as contracts_main

        rest = argv[argv.index("contracts") + 1 :]
        if rest and rest[0] == "--":
            rest = rest[1:]
        return contracts_main(rest)
    if args.command == "mutate":
        from oracle.mutate.cli import main as mutate_main

        return mutate_main(argv[argv.index("mutate") + 1 :])
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    handlers = {
        None: _cmd_default,
        "run": _cmd_run,
        "grid": _cmd_grid,
        "replay": _cmd_replay,
        "report": _cmd_report,
    }
    return handlers[args.command](args)
