"""Ctrl-C stops ``python -m oracle mutate`` within seconds and leaves nothing behind.

A one-mutant catalogue whose kill command is long (the oracle's compile family, tens of seconds
on two cores) runs in a subprocess with its own ``TMPDIR``. Once a kill command is running (a
process whose working directory is inside the mutant's copy), the test sends SIGINT to the CLI
process only, the way a terminal's Ctrl-C reaches the foreground process, and requires: exit
code 130 with "interrupted" (the kill command, tens of seconds long, would otherwise end with a
verdict and exit 0 or 1), no temporary copy left in ``TMPDIR``, and no process left running there
(neither the fork server nor a kill command). No elapsed time is asserted: the events are
polled for, so a loaded machine cannot fail the test by being slow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POLL_S = 120.0  # a cap on each poll (the kill command starting, the processes going)

CATALOGUE = """
[[mutant]]
id = "slow-harmless"
class = "R7"
tier = "cpu"
description = "a docstring edit; its kill command (compile every representative spec) is slow"
[[mutant.edit]]
file = "reference/routing.py"
old = "Bool tensor shaped like ``ids``"
new = "A bool tensor shaped like ``ids``"
[mutant.kill]
oracle = ["compile"]
"""


def _processes_under(directory: Path) -> list[int]:
    """Pids whose working directory is ``directory`` or below it."""
    root = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            found.append(int(entry.name))
    return found


def _kill_command_running(tmp: Path, cli_pid: int) -> bool:
    copies = list(tmp.glob("mutant-*/project"))
    return bool(copies) and any(pid != cli_pid for copy in copies for pid in _processes_under(copy))


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.deep
@pytest.mark.parametrize(
    ("isolation", "parent_ignores_sigint"),
    [("fork", False), ("fork", True), pytest.param("subprocess", False, marks=pytest.mark.slow)],
    ids=["fork", "fork-started-with-sigint-ignored", "subprocess"],
)
def test_sigint_stops_mutate_within_seconds_and_cleans_up(
    tmp_path, isolation, parent_ignores_sigint
):
    """``parent_ignores_sigint``: the CLI inherits SIG_IGN for SIGINT (a shell's background job,
    a CI runner started that way); it must still stop (found when ``.ci/run`` ran as ``&``)."""
    if not Path("/proc/self/cwd").exists():
        pytest.skip("needs /proc to see the kill command's processes")
    catalogue = tmp_path / "slow.toml"
    catalogue.write_text(CATALOGUE)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, "-m", "oracle", "mutate", "--catalogue", str(catalogue)]
    argv += ["--only", "slow-harmless", "--no-baseline", "--jobs", "1", "--timeout", "600"]
    argv += ["--isolation", isolation, "-q"]
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_ignore_sigint if parent_ignores_sigint else None,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + POLL_S
        while not _kill_command_running(tmp, proc.pid):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the kill command never started"
            time.sleep(0.2)
        assert proc.poll() is None, "the kill command finished before the interrupt"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=POLL_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out, out
    assert list(tmp.glob("mutant-*")) == [], "temporary copies left behind"
    deadline = time.monotonic() + POLL_S  # killed processes are reaped by init: poll /proc
    while _processes_under(tmp):
        assert time.monotonic() < deadline, "processes left running in the temporary directory"
        time.sleep(0.1)
