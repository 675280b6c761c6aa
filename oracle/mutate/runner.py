"""Running mutants: copy the project, apply one mutant, run its kill command, record the verdict.

Layout:
* :func:`copy_project` copies only :data:`COPIED_PATHS` into a fresh directory (``__pycache__``
  too; the bytecode of every file a mutant edits is deleted).
* :func:`child_env` / :func:`probe_imports`: kill commands run in the copy, with the copy FIRST on
  ``PYTHONPATH`` and every other project checkout dropped, so the copy is what gets imported.
* :func:`run_mutant` → :class:`MutantResult`: ``not-applicable``, ``stale``, ``killed`` (with the
  ``killer``), ``survived`` or ``error``. :func:`run_baseline` runs the kill commands once on an
  unmutated copy: a kill test that already fails there makes its mutants ``baseline-failed``.
* :func:`run_catalogue` runs mutants in parallel (threads driving subprocesses, up to ``jobs``,
  at most :data:`GPU_JOBS` on the GPU); ``isolation="auto"`` forks CPU kill commands from the
  preloaded server and starts GPU ones fresh. :func:`summarize` gives the kill rate per tier,
  :func:`gate_passed` the verdict.

Interruption: every kill-command process group and temporary copy is registered while it lives;
:func:`abort` (on SIGINT) kills the groups, refuses new ones (:class:`Cancelled`) and removes the
copies, so ``python -m oracle mutate`` stops within seconds and leaves nothing behind. The full
notes: docs/notes/oracle.md.

Invariants:
* Nothing is written outside the temporary directories, which are removed afterwards.
* Pytest runs with ``-x -q -p no:cacheprovider --assert=plain`` and the repository's own
  ``addopts``; the ``PYTEST_*`` variables of an enclosing pytest are not inherited.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from oracle.mutate.catalogue import Mutant, StaleMutant, apply_mutant

__all__ = [
    "COPIED_PATHS",
    "Cancelled",
    "abort",
    "live_temp_dirs",
    "FAILING_STATUSES",
    "STATUSES",
    "MutantResult",
    "Completed",
    "ForkExecutor",
    "SubprocessExecutor",
    "GPU_JOBS",
    "child_env",
    "child_pythonpath",
    "copy_project",
    "default_jobs",
    "foreign_path_entries",
    "is_project_checkout",
    "make_executor",
    "gate_passed",
    "probe",
    "probe_imports",
    "project_root",
    "run_baseline",
    "run_catalogue",
    "run_mutant",
    "summarize",
]

COPIED_PATHS = (
    "reference",
    "b12x",
    "oracle",
    "tests",
    "fixtures",
    "pyproject.toml",
    "conftest.py",
)
STATUSES = ("killed", "survived", "not-applicable", "stale", "error", "baseline-failed")
FAILING_STATUSES = frozenset({"survived", "stale", "error", "baseline-failed"})
#: Default parallelism when GPU mutants run: kill commands compile on the CPU and share one GPU.
GPU_JOBS = 6
_IGNORED = shutil.ignore_patterns(".hypothesis", ".pytest_cache", "results", "*.ptx")
_FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+)", re.MULTILINE)
_NOT_FOUND = re.compile(r"ERROR: (?:file or directory )?not found: (\S+)")
_ORACLE_FAIL = re.compile(r"^FAIL (\S+?):", re.MULTILINE)


# --- interruption: every process and temporary copy is registered while it lives -------------

_ABORT = threading.Event()
_LIVE_LOCK = threading.Lock()
_LIVE_PROCS: set[subprocess.Popen] = set()
_LIVE_DIRS: set[str] = set()
UNWIND_S = 10.0  # how long an interrupted run waits for its threads to remove their copies


class Cancelled(Exception):
    """The run was interrupted (:func:`abort`): no new kill command or copy is started."""


def _spawn(argv: list[str], **kwargs) -> subprocess.Popen:
    """Popen in a new session (its own process group), registered until :func:`_forget`."""
    with _LIVE_LOCK:
        if _ABORT.is_set():
            raise Cancelled("mutation run interrupted")
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        _LIVE_PROCS.add(proc)
    return proc


def _forget(proc: subprocess.Popen) -> None:
    with _LIVE_LOCK:
        _LIVE_PROCS.discard(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, OSError):
        proc.kill()


@contextlib.contextmanager
def _temp_dir(prefix: str) -> Iterator[str]:
    """A registered temporary directory, removed on exit (also by :func:`abort`)."""
    if _ABORT.is_set():
        raise Cancelled("mutation run interrupted")
    path = tempfile.mkdtemp(prefix=prefix)
    with _LIVE_LOCK:
        _LIVE_DIRS.add(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        with _LIVE_LOCK:
            _LIVE_DIRS.discard(path)


def _check_abort() -> None:
    if _ABORT.is_set():
        raise Cancelled("mutation run interrupted")


def live_temp_dirs() -> list[str]:
    """The temporary copies that exist now (empty once a run has finished or been aborted)."""
    with _LIVE_LOCK:
        return sorted(_LIVE_DIRS)


def abort() -> None:
    """Stop everything now: kill every registered process group and refuse new ones."""
    _ABORT.set()
    with _LIVE_LOCK:
        procs = list(_LIVE_PROCS)
    for proc in procs:
        _kill_group(proc)


def _remove_live_dirs() -> None:
    with _LIVE_LOCK:
        dirs = list(_LIVE_DIRS)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
        with _LIVE_LOCK:
            _LIVE_DIRS.discard(path)


def project_root() -> Path:
    """The repository root this ``oracle`` package lives in."""
    return Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class MutantResult:
    id: str
    klass: str
    tier: str
    status: str
    killer: str = ""
    seconds: float = 0.0
    reason: str = ""
    kill: str = ""
    description: str = ""

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["class"] = data.pop("klass")
        return data


def copy_project(src: str | Path, dst: str | Path) -> Path:
    """Copy :data:`COPIED_PATHS` of ``src`` into the new directory ``dst``; returns ``dst``."""
    src, dst = Path(src), Path(dst)
    if not (src / "b12x").is_dir():
        raise ValueError(f"src: {src} is not the project root (no b12x/)")
    dst.mkdir(parents=True, exist_ok=False)
    for name in COPIED_PATHS:
        source = src / name
        if source.is_dir():
            shutil.copytree(source, dst / name, ignore=_IGNORED)
        elif source.is_file():
            shutil.copy2(source, dst / name)
    return dst


def _drop_bytecode(root: Path, files: Iterable[str]) -> None:
    for rel in files:
        path = root / rel
        for cached in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
            cached.unlink()


def is_project_checkout(entry: str) -> bool:
    """True for a path entry that is a checkout of this project (holds ``b12x/__init__.py``)."""
    if not entry or entry == ".":
        return True  # the working directory: a kill command's cwd is the copy itself
    try:
        return (Path(entry) / "b12x" / "__init__.py").is_file()
    except OSError:
        return False


def foreign_path_entries(pythonpath: str | None) -> list[str]:
    """The entries of ``pythonpath`` that are not project checkouts (a carried DSL, wheels)."""
    entries = (pythonpath or "").split(os.pathsep)
    return [e for e in dict.fromkeys(entries) if not is_project_checkout(e)]


def child_pythonpath(root: str | Path, inherited: str | None) -> str:
    """``PYTHONPATH`` of a kill command: the copy first, then the non-project inherited entries."""
    return os.pathsep.join([str(root), *foreign_path_entries(inherited)])


def child_env(root: str | Path) -> dict[str, str]:
    """The environment of a kill command: the copy first on the path, no enclosing pytest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = child_pythonpath(root, os.environ.get("PYTHONPATH"))
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    return env


def probe(root: str | Path, execute=None) -> dict:
    """What a kill command in the copy at ``root`` sees (through ``execute``, default a
    subprocess): ``modules`` (where ``reference``, ``b12x``, ``oracle``, ``oracle.mutate`` were
    imported from), ``sys_path`` and ``pythonpath``."""
    execute = SubprocessExecutor() if execute is None else execute
    proc = execute("module", ["oracle.mutate.probe"], Path(root), 120.0)
    if proc.returncode != 0:
        raise RuntimeError(
            f"probe failed (rc={proc.returncode}): {_tail(proc.stdout + proc.stderr)}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def probe_imports(root: str | Path, execute=None) -> dict[str, str]:
    """Where ``reference``, ``b12x``, ``oracle`` and ``oracle.mutate`` are imported from when a
    kill command runs in the copy at ``root`` (see :func:`probe`)."""
    return probe(root, execute)["modules"]


def _pytest_args(node_ids: Sequence[str], *, stop_first: bool) -> list[str]:
    args = [*node_ids, "-q", "-p", "no:cacheprovider", "--no-header", "--assert=plain"]
    return args + (["-x"] if stop_first else [])


def _oracle_args(family: str) -> list[str]:
    return ["oracle", "--only", family, "--tier", "cpu", "-q"]


@dataclasses.dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str = ""


class SubprocessExecutor:
    """Each kill command is a fresh ``python -m ...`` process in the copy (portable, slower)."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python

    def __call__(self, kind: str, args: list[str], root: Path, timeout: float) -> Completed:
        argv = [self.python, "-m", "pytest", *args] if kind == "pytest" else [self.python, "-m"]
        if kind != "pytest":
            argv += args
        proc = _spawn(
            argv,
            cwd=root,
            env=child_env(root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)  # the whole group: a kill command's own children go too
            proc.communicate()
            raise
        finally:
            _forget(proc)
        _check_abort()
        return Completed(proc.returncode, stdout, stderr)

    def close(self) -> None:
        pass


class ForkExecutor:
    """Kill commands forked from :mod:`oracle.mutate.forkserver` (third-party imports done once).

    Thread-safe: several runner threads may call it at once; a reader thread matches replies."""

    def __init__(self, python: str = sys.executable) -> None:
        server = Path(__file__).resolve().parent / "forkserver.py"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
        # Keep what the kill commands need besides the project (a carried CuTe DSL); drop any
        # project checkout, so the server itself can import nothing of the project.
        foreign = foreign_path_entries(env.pop("PYTHONPATH", None))
        if foreign:
            env["PYTHONPATH"] = os.pathsep.join(foreign)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
        # Its own session: the forked children share its process group, so abort() can kill
        # the server and every running kill command with one killpg.
        self._proc = _spawn(
            [python, str(server)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        ready = self._proc.stdout.readline()
        if not ready.strip():
            raise RuntimeError("forkserver: did not start")
        self._lock = threading.Lock()
        self._waiters: dict[int, concurrent.futures.Future] = {}
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                reply = json.loads(line)
            except ValueError:  # a line cut short by a killed server
                continue
            with self._lock:
                waiter = self._waiters.pop(reply.get("id"), None)
            if waiter is not None:
                waiter.set_result(int(reply["rc"]))
        with self._lock:
            for waiter in self._waiters.values():
                waiter.set_exception(RuntimeError("forkserver: exited"))
            self._waiters.clear()

    def __call__(self, kind: str, args: list[str], root: Path, timeout: float) -> Completed:
        log = root.parent / f"kill-{time.monotonic_ns()}.log"
        waiter: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            rid = self._next
            self._next += 1
            self._waiters[rid] = waiter
        _check_abort()
        self._send({"id": rid, "cwd": str(root), "kind": kind, "argv": args, "log": str(log)})
        try:
            rc = waiter.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self._send({"kill": rid})
            waiter.result(timeout=60)
            raise subprocess.TimeoutExpired(args, timeout) from None
        except RuntimeError:
            _check_abort()  # the server was killed by abort(): say so
            raise
        _check_abort()
        return Completed(rc, log.read_text(encoding="utf-8", errors="replace"))

    def _send(self, message: dict) -> None:
        with self._lock:
            try:
                self._proc.stdin.write(json.dumps(message) + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                _check_abort()
                raise

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                with contextlib.suppress(BrokenPipeError, OSError):
                    self._proc.stdin.close()
                try:
                    self._proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    _kill_group(self._proc)
                    self._proc.wait()
        finally:
            _forget(self._proc)


def make_executor(isolation: str = "fork", python: str = sys.executable):
    """``"fork"`` (where ``os.fork`` exists; else a subprocess executor) or ``"subprocess"``."""
    if isolation not in ("fork", "subprocess"):
        raise ValueError(f"isolation: expected 'fork' or 'subprocess', got {isolation!r}")
    if isolation == "fork" and hasattr(os, "fork"):
        return ForkExecutor(python)
    return SubprocessExecutor(python)


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _verdict_pytest(proc: subprocess.CompletedProcess) -> tuple[str, str, str]:
    """(status, killer, reason) of one pytest kill run."""
    out = proc.stdout + proc.stderr
    missing = _NOT_FOUND.findall(out)
    if missing:
        return "stale", "", f"kill node id(s) not found: {', '.join(missing)}"
    if proc.returncode == 0:
        return "survived", "", _tail(proc.stdout, 1)
    if proc.returncode == 5:
        return "stale", "", "kill command collected no tests"
    failed = _FAILED_LINE.findall(out)
    if failed:
        return "killed", failed[0][1], ""
    if proc.returncode in (1, 2, 3, 4):
        return "killed", f"pytest rc={proc.returncode}", _tail(out)
    return "error", "", f"pytest rc={proc.returncode}: {_tail(out)}"


def _verdict_oracle(proc: subprocess.CompletedProcess, family: str) -> tuple[str, str, str]:
    out = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return "survived", "", _tail(proc.stdout, 1)
    if proc.returncode == 1:
        names = _ORACLE_FAIL.findall(out)
        return "killed", f"oracle:{names[0] if names else family}", ""
    if proc.returncode == 2 or "unknown families" in out:
        return "stale", "", f"oracle family {family!r} does not run: {_tail(out)}"
    return "killed", f"oracle:{family} rc={proc.returncode}", _tail(out)


def _kill(mutant: Mutant, root: Path, execute, timeout: float) -> tuple[str, str, str]:
    """Run the kill command in ``root``; the first failing part kills."""
    status, killer, reason = "survived", "", ""
    if mutant.kill.pytest:
        proc = execute("pytest", _pytest_args(mutant.kill.pytest, stop_first=True), root, timeout)
        status, killer, reason = _verdict_pytest(proc)
        if status != "survived":
            return status, killer, reason
    for family in mutant.kill.oracle:
        proc = execute("module", _oracle_args(family), root, timeout)
        status, killer, reason = _verdict_oracle(proc, family)
        if status != "survived":
            return status, killer, reason
    return status, killer, reason


def _missing_requirements(mutant: Mutant, src: Path) -> list[str]:
    return [p for p in mutant.requires if not (src / p).exists()]


def run_mutant(
    mutant: Mutant,
    *,
    src: str | Path | None = None,
    gpu: bool = False,
    execute=None,
    timeout: float = 300.0,
) -> MutantResult:
    """Copy the project at ``src`` (default: this repository), apply ``mutant``, run its kill.

    ``execute`` runs the kill command (a :class:`ForkExecutor` or :class:`SubprocessExecutor`;
    default: a fresh subprocess per command)."""
    if not isinstance(mutant, Mutant):
        raise TypeError(f"mutant: expected Mutant, got {type(mutant).__name__}")
    src = project_root() if src is None else Path(src)
    execute = SubprocessExecutor() if execute is None else execute
    started = time.monotonic()

    def result(status: str, killer: str = "", reason: str = "") -> MutantResult:
        return MutantResult(
            mutant.id,
            mutant.klass,
            mutant.tier,
            status,
            killer,
            round(time.monotonic() - started, 2),
            reason,
            mutant.kill.describe(),
            mutant.description,
        )

    if not mutant.edits:
        return result("not-applicable", reason=mutant.not_applicable_reason)
    missing = _missing_requirements(mutant, src)
    if missing:
        return result(
            "not-applicable", reason=f"{mutant.not_applicable_reason} (missing {missing})"
        )
    with _temp_dir(f"mutant-{mutant.id}-") as tmp:
        root = copy_project(src, Path(tmp) / "project")
        _check_abort()
        try:
            apply_mutant(mutant, root)
        except StaleMutant as exc:
            return result("stale", reason=str(exc))
        _drop_bytecode(root, mutant.files)
        if mutant.tier == "gpu" and not gpu:
            return result("not-applicable", reason="gpu tier: no CUDA device (rewrite applies)")
        try:
            status, killer, reason = _kill(mutant, root, execute, timeout)
        except subprocess.TimeoutExpired:
            return result("error", reason=f"kill command timed out after {timeout:.0f}s")
        return result(status, killer, reason)


def _runnable(mutant: Mutant, gpu: bool) -> bool:
    return bool(mutant.edits) and (mutant.tier == "cpu" or gpu)


def run_baseline(
    mutants: Sequence[Mutant],
    *,
    src: str | Path | None = None,
    execute=None,
    timeout: float = 600.0,
) -> dict[str, str]:
    """Run every distinct kill test of ``mutants`` once on an unmutated copy.

    Returns ``{mutant id: reason}`` for mutants whose kill command already fails (or does not
    resolve, or times out) there; such a kill proves nothing, so those mutants must not count as
    killed."""
    src = project_root() if src is None else Path(src)
    execute = SubprocessExecutor() if execute is None else execute
    node_ids = list(dict.fromkeys(n for m in mutants for n in m.kill.pytest))
    families = list(dict.fromkeys(f for m in mutants for f in m.kill.oracle))
    bad: dict[str, str] = {}
    with _temp_dir("mutant-baseline-") as tmp:
        root = copy_project(src, Path(tmp) / "project")
        _check_abort()
        if node_ids:
            try:
                proc = execute("pytest", _pytest_args(node_ids, stop_first=False), root, timeout)
            except subprocess.TimeoutExpired:
                proc = Completed(-1, f"baseline timed out after {timeout:.0f}s")
            out = proc.stdout + proc.stderr
            broken = {n for _, n in _FAILED_LINE.findall(out)} | set(_NOT_FOUND.findall(out))
            if proc.returncode not in (0, 1) and not broken:
                broken = set(node_ids)
            for m in mutants:
                hit = sorted(n for n in m.kill.pytest if any(b.startswith(n) for b in broken))
                if hit:
                    bad[m.id] = f"kill test(s) fail on the unmutated project: {', '.join(hit)}"
        for family in families:
            try:
                rc = execute("module", _oracle_args(family), root, timeout).returncode
            except subprocess.TimeoutExpired:
                rc = -1
            if rc != 0:
                for m in mutants:
                    if family in m.kill.oracle:
                        bad.setdefault(m.id, f"oracle family {family} fails unmutated")
    return bad


def default_jobs(mutants: Sequence[Mutant], gpu: bool) -> int:
    """The core count; at most :data:`GPU_JOBS` when GPU kill commands share the one GPU."""
    cores = os.cpu_count() or 1
    if gpu and any(m.tier == "gpu" and m.edits for m in mutants):
        return max(1, min(cores, GPU_JOBS))
    return cores


def run_catalogue(
    mutants: Sequence[Mutant],
    *,
    src: str | Path | None = None,
    gpu: bool = False,
    jobs: int | None = None,
    baseline: bool = True,
    isolation: str = "auto",
    execute=None,
    timeout: float = 300.0,
    on_result: Callable[[MutantResult], None] | None = None,
) -> list[MutantResult]:
    """Run ``mutants`` (in parallel up to ``jobs``, default :func:`default_jobs`), catalogue order.

    The baseline (unmutated) runs of the kill commands go first in the same pool, one per
    executor; a mutant whose kill command fails there is ``baseline-failed``, never killed.
    ``execute`` reuses a caller's executor for every kill command (left open); otherwise
    ``isolation`` picks: ``"fork"``, ``"subprocess"``, or ``"auto"`` (fork for CPU mutants, fresh
    processes for GPU mutants on a GPU), and the executors made here are closed at the end."""
    if isolation not in ("auto", "fork", "subprocess"):
        raise ValueError(f"isolation: expected 'auto', 'fork' or 'subprocess', got {isolation!r}")
    if jobs is None:
        jobs = default_jobs(mutants, gpu)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected a positive int, got {jobs!r}")
    owned: dict[str, object] = {}

    def executor_for(m: Mutant):
        if execute is not None:
            return execute
        kind = isolation
        if kind == "auto":
            kind = "subprocess" if (gpu and m.tier == "gpu") else "fork"
        if kind not in owned:
            owned[kind] = make_executor(kind)
        return owned[kind]

    _ABORT.clear()  # a fresh run (an earlier one in this process may have been aborted)
    bad: dict[str, str] = {}
    results: dict[str, MutantResult] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    futures: list[concurrent.futures.Future] = []
    try:
        runnable = [m for m in mutants if _runnable(m, gpu)]
        groups: dict[int, tuple[object, list[Mutant]]] = {}
        for m in runnable:
            ex = executor_for(m)
            groups.setdefault(id(ex), (ex, []))[1].append(m)
        base = []
        if baseline:
            base = [
                pool.submit(run_baseline, ms, src=src, execute=ex, timeout=2 * timeout)
                for ex, ms in groups.values()
            ]
        pending = {
            pool.submit(
                run_mutant, m, src=src, gpu=gpu, execute=executor_for(m), timeout=timeout
            ): m
            for m in mutants
        }
        futures = [*base, *pending]
        for future in base:
            bad.update(future.result())
        for future in concurrent.futures.as_completed(pending):
            r = future.result()
            if r.id in bad and r.status in ("killed", "survived"):
                why = bad[r.id]
                r = dataclasses.replace(r, status="baseline-failed", killer="", reason=why)
            results[r.id] = r
            if on_result is not None:
                on_result(r)
    except BaseException:  # Ctrl-C (KeyboardInterrupt) or a crash: stop everything now
        abort()
        pool.shutdown(wait=False, cancel_futures=True)
        concurrent.futures.wait(futures, timeout=UNWIND_S)  # threads remove their copies
        _remove_live_dirs()
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        for ex in owned.values():
            with contextlib.suppress(Exception):
                ex.close()
    return [results[m.id] for m in mutants]


def summarize(results: Sequence[MutantResult]) -> dict[str, dict]:
    """Per tier: the count of each status, ``runnable`` (every mutant that was not
    not-applicable), ``kill_rate`` = killed / runnable (``None`` when nothing ran) and
    ``seconds`` (the summed time of the tier's mutants)."""
    out: dict[str, dict] = {}
    for r in results:
        tier = out.setdefault(r.tier, {s: 0 for s in STATUSES} | {"seconds": 0.0})
        tier[r.status] += 1
        tier["seconds"] = round(tier["seconds"] + r.seconds, 2)
    for counts in out.values():
        runnable = sum(counts[s] for s in STATUSES if s != "not-applicable")
        counts["runnable"] = runnable
        counts["kill_rate"] = None if runnable == 0 else counts["killed"] / runnable
    return out


def gate_passed(results: Sequence[MutantResult]) -> bool:
    """True iff no result is survived, stale, error or baseline-failed."""
    return not any(r.status in FAILING_STATUSES for r in results)
