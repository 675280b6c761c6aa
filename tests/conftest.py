"""Session-wide settings of the test tree (the root ``conftest.py`` pins GPUs and loads the
oracle plugin; ``tests/b12x/conftest.py`` holds the b12x fixtures).

* Garbage-collector generations: after collection, and again whenever a worker moves on to
  another test module, garbage is collected and what survives is moved to the permanent
  generation (``gc.freeze``). What lives that long (torch, the CuTe DSL, test modules and their
  parameters, module caches) is then not walked again by every full collection the next
  tests trigger (the DSL builds millions of small IR objects per compile) nor by pytest's
  ``gc.collect()`` calls at exit. Frozen objects are still freed by reference counting; only
  reference cycles among them wait for the end of the process. ``oracle.mutate.forkserver``
  freezes its preloaded modules for the same reason.
"""

from __future__ import annotations

import gc

import pytest


def _freeze_survivors() -> None:
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session) -> None:
    _freeze_survivors()


@pytest.hookimpl(trylast=True)  # after the module's fixtures are finalised
def pytest_runtest_teardown(item, nextitem) -> None:
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _freeze_survivors()
