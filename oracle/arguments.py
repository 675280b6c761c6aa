"""Checks every command applies to its arguments before it does any work (standard library only).

* :func:`nonempty` — an ``argparse`` ``type=`` refusing an empty or blank value: ``--case "$ID"``
  with ``ID`` unset must not mean "no case given" and run everything.
* :func:`output_problem` — why a path cannot receive a file (or, ``directory=True``, files): it is
  empty, an existing directory (or a name ending in ``/``) where a file is asked, a file where a
  directory is, lies
  under a regular file, or its nearest existing directory is not writable. Parents that do not
  exist yet are created when writing, so a missing parent is not a problem.
* :func:`seconds` / :func:`budget_seconds` — ``argparse`` types for a positive (a budget: a
  non-negative, 0 = none) finite number of seconds (``nan`` and ``inf`` are refused: every
  comparison with ``nan`` is false, so a ``nan`` limit never fires); :func:`positive_int`.
* :func:`read_json` — a JSON file, or ``ValueError`` with one line: unreadable, not JSON, or
  nested too deeply for the decoder (a ``RecursionError`` otherwise).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = [
    "budget_seconds",
    "nonempty",
    "output_problem",
    "positive_int",
    "read_json",
    "seconds",
]


def nonempty(value: str) -> str:
    """``value`` unless empty or blank (``argparse`` type)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty value (an unset shell variable?)")
    return value


def _seconds(value: str, *, zero: bool) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        which = "finite seconds >= 0" if zero else "positive finite seconds"
        raise argparse.ArgumentTypeError(f"expected {which}, got {value!r}")
    return number


def seconds(value: str) -> float:
    """A positive, finite number of seconds (``argparse`` type)."""
    return _seconds(value, zero=False)


def budget_seconds(value: str) -> float:
    """A finite number of seconds >= 0 (``argparse`` type; 0 means no budget)."""
    return _seconds(value, zero=True)


def positive_int(value: str) -> int:
    """A positive integer (``argparse`` type)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def output_problem(path: str, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file (``directory``: a directory of files), or None."""
    if not str(path).strip():
        return "empty path (an unset shell variable?)"
    if not directory and str(path).endswith(("/", os.sep)):
        return f"{path} names a directory (trailing /), not a file"
    target = Path(path)
    if target.exists():
        if directory and not target.is_dir():
            return f"{path} exists and is not a directory"
        if not directory and target.is_dir():
            return f"{path} is a directory"
        if not os.access(target, os.W_OK):
            return f"{path} is not writable"
        return None
    probe = target.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{path} lies under {probe}, which is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{path}: {probe} is not writable"
    return None


def read_json(path: str) -> Any:
    """The JSON value in ``path``; ``ValueError`` naming the path and the problem otherwise."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to read") from None
