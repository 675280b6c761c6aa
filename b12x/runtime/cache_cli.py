"""``python -m b12x.runtime.cache_cli [--dir DIR] [--clear]``: show or clear the kernel disk cache.

A module of its own (not ``compile_cache``'s ``__main__``): ``b12x.runtime`` imports
``compile_cache`` as a package, so running that module as a script makes Python warn on every
call. A cache root that is not a directory (a regular file, or a path under one) is refused
with one line and exit 2 before anything is read or removed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from b12x.runtime.compile_cache import DISK_FORMAT, cache_root, clear, entry_files
from b12x.runtime.disk_store import CACHE_DIR_ENV

PROG = "python -m b12x.runtime.cache_cli"


def root_problem(root: Path) -> str | None:
    """Why ``root`` cannot be a cache directory (it, or the nearest part of it that exists, is not
    a directory), or None when it is one or can be made one."""
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.is_dir():
        return None
    if probe == root:
        return f"{root} is not a directory"
    return f"{root} cannot be a directory: {probe} is not one"


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m b12x.runtime.compile_cache [--dir DIR] [--clear]``: show or clear the cache."""

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Show (default) or clear the b12x kernel disk cache.",
    )
    parser.add_argument("--dir", help="cache root (default: $B12X_CACHE_DIR, XDG or ~/.cache)")
    parser.add_argument("--clear", action="store_true", help="delete every cached kernel")
    args = parser.parse_args(None if argv is None else list(argv))
    root = Path(args.dir) if args.dir else cache_root()
    if root is None:
        print(f"disk cache is off ({CACHE_DIR_ENV}={os.environ.get(CACHE_DIR_ENV)})")
        return 0
    problem = root_problem(root)
    if problem:
        source = "--dir" if args.dir else CACHE_DIR_ENV
        print(f"{parser.prog}: {source}: {problem}", file=sys.stderr)
        return 2
    if args.clear:
        print(f"removed {clear(root)} kernel entries under {root}")
        return 0
    files = entry_files(root) if root.is_dir() else []
    size = sum(p.stat().st_size for p in files if p.is_file())
    print(f"root: {root}")
    print(f"entries: {len(files)} ({size / 1e6:.1f} MB) in format v{DISK_FORMAT} and older")
    print(f"clear with: python -m b12x.runtime.cache_cli --clear  (or rm -r {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
