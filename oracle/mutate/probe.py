"""``python -m oracle.mutate.probe``: print (JSON) the files ``reference``, ``b12x``, ``oracle``
and ``oracle.mutate`` were imported from. The mutation runner's tests use it to prove that kill
commands import the project copy, not the editable install. Imports nothing heavy."""

from __future__ import annotations

import json

import b12x
import oracle
import oracle.mutate
import reference

if __name__ == "__main__":
    modules = (reference, b12x, oracle, oracle.mutate)
    print(json.dumps({m.__name__: m.__file__ for m in modules}))
