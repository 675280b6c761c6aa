"""Command-line and report helpers shared by the benchmarks (pure Python, no CUDA: CPU-tested).

* :func:`int_list` — an ``argparse`` type for ``--m 1,16,64``: positive integers, no repeats;
  anything else is an argparse error (exit 2, the message names the flag); :func:`positive_int`
  for one such value.
* :func:`refuse_without_cuda` — the one-line refusal (exit 1) a benchmark prints instead of a
  traceback when no CUDA device is present.
* :class:`Deadline` — a wall-clock budget: a benchmark checks it before each measurement and
  reports what it had to skip, so one run fits the caller's time limit.
* :class:`Cell` / :func:`measure` — one fail-soft measurement: the budget checked first, an
  exception recorded as the cell's error.
* :func:`record_device_and_hbm` — the device facts and the HBM copy anchor every report starts
  with, a failure recorded rather than raised.
* :func:`short_error` — one line of an exception for a table footnote or a JSON field.
* :func:`write_json` — strict JSON (non-finite floats refused) written by atomic rename, so a run
  killed mid-write never leaves half a file; the benchmarks rewrite it after every row.
* :func:`fmt_cell` / :func:`render_table` — fixed-width text tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from oracle.arguments import positive_int  # noqa: F401 - the oracle CLI's type, re-exported


def int_list(text: str) -> tuple[int, ...]:
    """``"1,16,64"`` → ``(1, 16, 64)``; empty items, non-integers, values < 1 and repeats are
    refused with :class:`argparse.ArgumentTypeError` (argparse turns it into exit 2)."""
    items = [item.strip() for item in str(text).split(",")]
    values = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of positive integers, got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected positive integers, got {value} in {text!r}")
        if value in values:
            raise argparse.ArgumentTypeError(f"{value} is listed twice in {text!r}")
        values.append(value)
    return tuple(values)


def refuse_without_cuda(prog: str, cuda_available: bool) -> int | None:
    """``None`` when a CUDA device is present, else print one line to stderr and return 1."""
    if cuda_available:
        return None
    print(
        f"{prog}: needs a CUDA device (torch.cuda.is_available() is False); nothing measured",
        file=sys.stderr,
    )
    return 1


class Deadline:
    """``budget_s`` seconds of wall clock from construction (``None``: no limit)."""

    def __init__(self, budget_s: float | None, clock: Callable[[], float] = time.monotonic):
        self.budget_s, self.clock, self.start = budget_s, clock, clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.budget_s is not None and self.elapsed() >= self.budget_s

    def reason(self) -> str:
        return f"skipped: the {self.budget_s:g} s budget was spent"


def short_error(exc: BaseException, limit: int = 160) -> str:
    """``"TypeName: first line of the message"``, at most ``limit`` characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass
class Cell:
    """One measurement: microseconds and a detail (planned path, timing mode), or an error
    (``skipped`` when the budget was spent before it). ``anchor_us``: the anchor timed in
    alternation with this cell (:func:`bench_timing.paired_median_us`), when it was."""

    us: float | None = None
    detail: str | None = None
    error: str | None = None
    skipped: bool = False
    anchor_us: float | None = None


def measure(fn: Callable[[], tuple], deadline: Deadline) -> Cell:
    """Run one measurement unless the budget is spent; an exception becomes the cell's error.
    ``fn`` returns ``(us, detail)`` or ``(us, detail, anchor_us)``."""
    if deadline.expired():
        return Cell(error=deadline.reason(), skipped=True)
    try:
        us, detail, *paired = fn()
    except Exception as exc:  # noqa: BLE001 -- fail-soft: report, go on
        return Cell(error=short_error(exc))
    return Cell(us=us, detail=detail, anchor_us=paired[0] if paired else None)


def record_device_and_hbm(bench: Any, report: dict, log: Callable[[str], None]) -> None:
    """The anchors every benchmark starts with: ``report["device"]`` (``bench.device()``) and the
    HBM copy bandwidth ``report["anchors"]["hbm_copy_Bps"]`` (``bench.hbm_bandwidth()``); a
    failure of either is recorded (``{"error": …}`` / ``anchors["hbm_error"]``) and logged, never
    raised, so the run goes on."""
    try:
        report["device"] = bench.device()
    except Exception as exc:  # noqa: BLE001
        report["device"] = {"error": short_error(exc)}
    log(f"device: {report['device']}")
    try:
        report["anchors"]["hbm_copy_Bps"] = bench.hbm_bandwidth()
        log(f"HBM copy bandwidth: {report['anchors']['hbm_copy_Bps'] / 1e9:.0f} GB/s")
    except Exception as exc:  # noqa: BLE001
        report["anchors"]["hbm_error"] = short_error(exc)
        log(f"HBM copy bandwidth: failed: {report['anchors']['hbm_error']}")


def write_json(path: str, payload: dict) -> None:
    """Write ``payload`` as strict JSON to ``path`` through a temporary file and a rename."""
    text = json.dumps(payload, indent=1, allow_nan=False) + "\n"  # refuses before any write
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def finite_or_none(value: float | None) -> float | None:
    """``value`` when it is a finite number, else ``None`` (JSON has no NaN/Infinity)."""
    return value if value is not None and math.isfinite(value) else None


def fmt_cell(
    value: float | None, spec: str = ".2f", *, mark: str = "", missing: str = "n/a"
) -> str:
    """A number formatted with ``spec`` plus ``mark``, or ``missing``."""
    return missing if value is None else f"{value:{spec}}{mark}"


def ratio_cells(
    times: dict[int, dict[str, tuple[float, float]]], names: Sequence[str]
) -> list[list[str]]:
    """Table rows from :func:`bench_timing.over_baseline` results per M: ``M``, then per name
    ``µs (ratio)``."""
    return [
        [str(m), *(f"{by_name[n][0]:.1f} ({by_name[n][1]:.3f})" for n in names)]
        for m, by_name in times.items()
    ]


def render_table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    """Right-aligned columns, each as wide as its widest entry, two spaces apart."""
    widths = [max(len(str(row[c])) for row in [header, *lines]) for c in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *lines]
    )
