"""``python -m oracle.mutate.probe``: print (JSON) where ``reference``, ``b12x``, ``oracle`` and
``oracle.mutate`` were imported from (``modules``), with the process's ``sys_path`` and
``pythonpath`` (``PYTHONPATH``). The mutation runner's tests use it to prove that kill commands
import the project copy, not the editable install or a project root on ``PYTHONPATH``, and that
other ``PYTHONPATH`` entries (a carried CuTe DSL) survive. Imports nothing heavy."""

from __future__ import annotations

import json
import os
import sys

import b12x
import oracle
import oracle.mutate
import reference

if __name__ == "__main__":
    modules = (reference, b12x, oracle, oracle.mutate)
    print(
        json.dumps(
            {
                "modules": {m.__name__: m.__file__ for m in modules},
                "sys_path": sys.path,
                "pythonpath": os.environ.get("PYTHONPATH", ""),
            }
        )
    )
