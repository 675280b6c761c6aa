"""``python -m oracle.contracts``: the same as ``python -m oracle contracts``."""

import sys

from .cli import main

sys.exit(main())
