"""The checks ``python -m oracle`` runs, one module per layer (docs/architecture.md, README.md).

Layout
------
* :class:`CheckContext` carries what a family needs: the tier (``"cpu"`` or ``"gpu"``), whether
  CUDA is usable, the grid filter, the results directory (failing cases are saved there), and an
  optional ``progress(total) -> advance()`` factory for long loops.
* Every family module exposes ``run(ctx) -> list[CheckResult]`` and never raises for a failing
  check: a crash inside a family becomes one ``fail`` result naming the family (see :func:`run`).
* :data:`FAMILIES` is the default job's order: fingerprints, layout, contracts, dispatch/tiles,
  coverage, compile (all CPU tier) then gpu (the differential grid, decode exactness, graph
  protocol).
  On a CPU machine the gpu family reports one ``skip`` line per check family, with the reason.
  When the gpu family hands the grid to worker processes (:func:`oracle.checks.gpu.in_workers`),
  :func:`run` starts it first and runs the CPU families while the workers judge (the parent only
  waits on them); the report keeps this order either way.
* Families import b12x lazily; when b12x declares nothing for a family, its check is a ``skip``
  with a plain reason, never a silent pass.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from oracle.report.report import CheckResult

__all__ = ["FAMILIES", "CheckContext", "cuda_available", "run", "run_family"]

FAMILIES: tuple[str, ...] = (
    "fingerprints",
    "layout",
    "contracts",
    "dispatch_tiles",
    "coverage",
    "compile",
    "gpu",
)
CPU_FAMILIES = FAMILIES[:-1]


def cuda_available() -> bool:
    """True when torch sees a usable CUDA device (a broken driver counts as none)."""
    try:
        import torch  # lazy: torch stays off the CLI's light commands

        return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
    except Exception:  # noqa: BLE001
        return False


@dataclasses.dataclass
class CheckContext:
    tier: str = "cpu"
    cuda: bool = False
    filter: str | None = None
    case: str | None = None
    tile: str | None = None
    results_dir: Path = Path("results")
    max_cases: int | None = None
    heavy: bool = False
    workers: int = 1
    progress: Callable[[str, int], Callable[[], None]] | None = None

    def __post_init__(self) -> None:
        if self.tier not in ("cpu", "gpu"):
            raise ValueError(f"CheckContext: tier must be 'cpu' or 'gpu', got {self.tier!r}")
        self.results_dir = Path(self.results_dir)

    def advance(self, label: str, total: int) -> Callable[[], None]:
        """A callable to call once per item of a loop of ``total`` items (no-op without a bar)."""
        if self.progress is None or total <= 0:
            return lambda: None
        return self.progress(label, total)


def run_family(name: str, ctx: CheckContext) -> list[CheckResult]:
    """Run one family; an exception inside it becomes a single ``fail`` result."""
    if name not in FAMILIES:
        raise ValueError(f"run_family: unknown family {name!r}; known: {FAMILIES}")
    tier = "gpu" if name == "gpu" else "cpu"
    try:
        module = importlib.import_module(f"oracle.checks.{name}")
        return list(module.run(ctx))
    except Exception as exc:  # noqa: BLE001 - the report shows it; nothing passes silently
        tail = traceback.format_exc(limit=3).strip().splitlines()[-1]
        return [
            CheckResult(
                f"{name}", tier, "fail", f"family crashed: {type(exc).__name__}: {exc} ({tail})"
            )
        ]


def run(ctx: CheckContext, families: tuple[str, ...] = FAMILIES) -> list[CheckResult]:
    """Run ``families`` and concatenate their results in the order given (module docstring:
    a gpu family run by worker processes overlaps the CPU families)."""
    results: dict[str, list[CheckResult]] = {}
    background = None
    if "gpu" in families and len(families) > 1 and _gpu_in_workers(ctx):

        def gpu_family() -> None:
            try:
                results["gpu"] = run_family("gpu", ctx)
            except BaseException as exc:  # noqa: BLE001 - reported, never a silent gap
                why = f"family crashed in its thread: {type(exc).__name__}: {exc}"
                results["gpu"] = [CheckResult("gpu", "gpu", "fail", why)]

        background = threading.Thread(target=gpu_family, name="oracle-gpu-workers", daemon=True)
        background.start()
    try:
        for name in families:
            if background is None or name != "gpu":
                results[name] = run_family(name, ctx)
    except BaseException:  # Ctrl-C: the workers share our process group and got it too
        if background is not None:
            background.join(timeout=5)
        raise
    if background is not None:
        background.join()
    return [r for name in families for r in results[name]]


def _gpu_in_workers(ctx: CheckContext) -> bool:
    try:
        from oracle.checks.gpu import in_workers  # lazy: torch stays off the CLI's light commands
    except Exception:  # noqa: BLE001 - run_family reports the import failure
        return False
    return in_workers(ctx)
