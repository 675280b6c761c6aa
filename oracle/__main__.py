"""Entry point of ``python -m oracle`` (see :mod:`oracle.cli` for the commands)."""

from __future__ import annotations

import sys

from oracle.cli import main

if __name__ == "__main__":
    sys.exit(main())
