"""List the lab notebook left in the code: long docstrings, date stamps, timing lines.

For every .py file under the given roots, reports each module, class or function
docstring of at least ``--lines`` newlines (default 30), each date stamp
(``YYYY-MM-DD``) and each docstring or comment line that carries a timing
(a number followed by µs, us or ms). Exits 1 when the counts pass
``--max-long``, ``--max-dates`` or ``--max-timings``; a limit left out is not
checked. Measurements belong in docs/evidence/, not in code.

    python scripts/lab_notes.py b12x oracle reference --max-long 10 --max-dates 0
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

DATE = re.compile(r"20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]")
TIMING = re.compile(r"\d(?:\.\d+)?\s*(?:µs|us|ms)\b")
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class FileNotes:
    """What one file carries: long docstrings, dated lines, timing lines."""

    path: Path
    long_docstrings: list[tuple[str, int, int]] = field(default_factory=list)
    dates: list[tuple[int, str]] = field(default_factory=list)
    timings: list[int] = field(default_factory=list)


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, _DOC_NODES) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def _comment_lines(source: str) -> set[int]:
    lines: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                lines.add(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        pass
    return lines


def scan_file(path: Path, min_lines: int = 30) -> FileNotes:
    """Scan one file; a docstring is long when it holds ``min_lines`` newlines or more."""
    source = path.read_text(encoding="utf-8")
    notes = FileNotes(path)
    tree = ast.parse(source, filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, _DOC_NODES):
            continue
        newlines = (ast.get_docstring(node, clean=False) or "").count("\n")
        if newlines >= min_lines:
            name = "<module>" if isinstance(node, ast.Module) else node.name
            notes.long_docstrings.append((name, getattr(node, "lineno", 1), newlines))
    text_lines = _docstring_lines(tree) | _comment_lines(source)
    for number, line in enumerate(source.splitlines(), start=1):
        match = DATE.search(line)
        if match:
            notes.dates.append((number, match.group()))
        if number in text_lines and TIMING.search(line):
            notes.timings.append(number)
    return notes


def scan(roots: list[Path], min_lines: int = 30) -> list[FileNotes]:
    """Scan every .py file under ``roots`` (files or directories), sorted by path."""
    files: list[Path] = []
    for root in roots:
        files.extend([root] if root.is_file() else sorted(root.rglob("*.py")))
    return [scan_file(path, min_lines) for path in files]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--lines", type=int, default=30, help="long docstring: newlines >= N")
    parser.add_argument("--max-long", type=int, default=None)
    parser.add_argument("--max-dates", type=int, default=None)
    parser.add_argument("--max-timings", type=int, default=None)
    parser.add_argument("-q", "--quiet", action="store_true", help="print the totals only")
    args = parser.parse_args(argv)

    notes = scan(args.roots, args.lines)
    n_long = sum(len(n.long_docstrings) for n in notes)
    n_dates = sum(len(n.dates) for n in notes)
    n_timings = sum(len(n.timings) for n in notes)
    if not args.quiet:
        for n in notes:
            for name, lineno, newlines in n.long_docstrings:
                print(f"{n.path}:{lineno}: docstring of {name}: {newlines} lines")
            for lineno, date in n.dates:
                print(f"{n.path}:{lineno}: date {date}")
            if n.timings:
                print(f"{n.path}: {len(n.timings)} timing lines (first at {n.timings[0]})")
    files_timed = sum(1 for n in notes if n.timings)
    print(
        f"long docstrings (>= {args.lines} lines): {n_long}; dates: {n_dates}; "
        f"timing lines: {n_timings} in {files_timed} files"
    )
    over = [
        f"{what} {count} > {limit}"
        for what, count, limit in (
            ("long docstrings", n_long, args.max_long),
            ("dates", n_dates, args.max_dates),
            ("timing lines", n_timings, args.max_timings),
        )
        if limit is not None and count > limit
    ]
    for line in over:
        print(f"over the limit: {line}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
