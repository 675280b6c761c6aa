"""A fork server for kill commands: heavy third-party imports once, one fork per kill command.

Layout
------
* The preloaded modules are moved to the permanent GC generation (``gc.freeze``): pytest calls
  ``gc.collect()`` several times at exit, which would otherwise walk torch's object graph.
* Run as a script (``python .../forkserver.py``), never as ``oracle.mutate.forkserver``, so the
  server process imports nothing of the project: only the standard library and
  :data:`PRELOAD` (torch, numpy, pytest, hypothesis, rich, cutlass, where installed).
* Protocol, one JSON object per line. Requests on stdin:
  ``{"id": n, "cwd": ROOT, "kind": "pytest"|"module", "argv": [...], "log": FILE}`` runs
  ``pytest.main(argv)`` (or ``python -m argv[0] argv[1:]``) in a forked child whose working
  directory and first ``sys.path`` entry are ROOT (a project copy), with ``PYTHONPATH=ROOT`` and
  stdout/stderr written to FILE; ``{"kill": n}`` kills request n's child. Replies on stdout:
  ``{"id": n, "rc": exit code}`` when the child ends (a signal -s gives ``128 + s``).
* EOF on stdin: the server kills its remaining children and exits.

Invariants
----------
* A child first drops every already-imported project module (``reference``, ``b12x``,
  ``oracle``, ``tests``, ``conftest``), this script's directory and every other project checkout
  (a path holding ``b12x/__init__.py``, e.g. the original root a device's ``env.sh`` exports)
  from ``sys.path`` and ``PYTHONPATH``, and puts ROOT first on both, so the copy at ROOT is what
  the kill command imports; other entries (a carried CuTe DSL) stay. The server itself runs no
  torch op before forking and never initialises CUDA: GPU kill commands are not forked
  (:class:`~oracle.mutate.runner.SubprocessExecutor` runs them).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import sys
import traceback

PRELOAD = (
    "torch",
    "numpy",
    "pytest",
    "_pytest.python",
    "hypothesis",
    "rich.console",
    "rich.table",
    "safetensors.torch",
    "cutlass",
    "cutlass.cute",
)
PROJECT_PACKAGES = ("reference", "b12x", "oracle", "tests", "conftest")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    # Everything imported so far lives as long as the server: keep it out of the collector, so
    # the children's gc.collect() calls (pytest runs several at exit) stay cheap.
    gc.collect()
    gc.freeze()


def _purge_project_modules() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in PROJECT_PACKAGES:
            del sys.modules[name]


def _is_checkout(entry: str) -> bool:
    """A path entry that is a checkout of the project (or the cwd): never ahead of the copy."""
    if not entry or entry == ".":
        return True
    try:
        return os.path.isfile(os.path.join(entry, "b12x", "__init__.py"))
    except OSError:
        return False


def _child(request: dict) -> int:
    root = request["cwd"]
    os.chdir(root)
    keep = [p for p in sys.path if p not in (_HERE, root) and not _is_checkout(p)]
    sys.path[:] = [root, *keep]
    _purge_project_modules()
    importlib.invalidate_caches()
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    foreign = [p for p in dict.fromkeys(inherited) if p != root and not _is_checkout(p)]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *foreign])
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives until _exit
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115
    argv = list(request["argv"])
    try:
        if request["kind"] == "pytest":
            import pytest  # lazy: optional; only pytest kill commands need it

            return int(pytest.main(argv))
        sys.argv = [argv[0], *argv[1:]]
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # noqa: BLE001 - report the crash in the log, exit non-zero
        traceback.print_exc()
        return 3


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve() -> None:
    _preload()
    _reply({"ready": True})
    children: dict[int, int] = {}  # pid -> request id
    by_id: dict[int, int] = {}
    open_input = True
    while open_input or children:
        if open_input:
            ready, _, _ = select.select([sys.stdin], [], [], 0.05)
        else:
            ready = []
            for pid in list(children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if ready:
            line = sys.stdin.readline()
            if not line:
                open_input = False
                continue
            request = json.loads(line)
            if "kill" in request:
                pid = by_id.get(request["kill"])
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                continue
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    code = _child(request)
                finally:
                    with contextlib.suppress(Exception):
                        sys.stdout.flush()
                        sys.stderr.flush()
                    os._exit(code & 0xFF)
            children[pid] = request["id"]
            by_id[request["id"]] = pid
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            rid = children.pop(pid, None)
            by_id.pop(rid, None)
            if rid is not None:
                signalled = os.WIFSIGNALED(status)
                rc = 128 + os.WTERMSIG(status) if signalled else os.WEXITSTATUS(status)
                _reply({"id": rid, "rc": rc})


if __name__ == "__main__":
    serve()
