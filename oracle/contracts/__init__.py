"""Static ABI contract checker (standard library only): binds every call into a package's own
functions to the callee's signature, by name, without importing the package.

Layout (one module per concern)
-------------------------------
* :mod:`.binding` signatures from source, and CPython-exact binding of an ``ast.Call``.
* :mod:`.index`   parse a package: modules, imports, functions, classes, attribute types.
* :mod:`.resolve` walk every call site and resolve it to a package function.
* :mod:`.rules`   call rules (arity, unknown keyword, duplicate binding, shifted argument, shared
  body positional/default/unpacking, pinned slot) and the :class:`Violation` record.
* :mod:`.entries` calls into marked entries (``@abi_entry``/``@shared_body``), launches of compiled
  kernels and launch records (``entry = "pkg.mod.KernelClass"``): the ``entry_calls`` metric
  and the ``launch-record`` rule.
* :mod:`.slots`   pinned semantic slots (``fixtures/pinned_slots.json``).
* :mod:`.lock`    signature lock with ABI version (``fixtures/abi_lock.json``).
* :mod:`.check`   :func:`check_package` / :func:`check_b12x` → :class:`ContractReport`.
* :mod:`.cli`     ``python -m oracle contracts`` (``main(argv) -> int``).

Invariants: nothing here imports torch, cutlass or the checked package; the CLI module is not
imported by this package so that ``python -m oracle.contracts.cli`` runs cleanly.
"""

from .binding import Binding, Param, Signature, bind_call, signature_of
from .check import (
    DEFAULT_LOCK_PATH,
    DEFAULT_SLOTS_PATH,
    ContractReport,
    check_b12x,
    check_package,
    default_root,
)
from .entries import EntryCall, EntryCalls
from .index import PackageIndex, build_index
from .lock import check_lock, update_lock
from .rules import Violation
from .slots import PinnedSlot, load_slots

__all__ = [
    "DEFAULT_LOCK_PATH",
    "DEFAULT_SLOTS_PATH",
    "Binding",
    "ContractReport",
    "EntryCall",
    "EntryCalls",
    "PackageIndex",
    "Param",
    "PinnedSlot",
    "Signature",
    "Violation",
    "bind_call",
    "build_index",
    "check_b12x",
    "check_lock",
    "check_package",
    "default_root",
    "load_slots",
    "signature_of",
    "update_lock",
]
