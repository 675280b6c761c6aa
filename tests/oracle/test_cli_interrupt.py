"""Ctrl-C while kernels compile: ``python -m oracle run --compile-all`` exits 130 with one line.

The child wraps ``b12x.support.compile_specialization`` to touch a marker as each compile
starts; once the marker exists the test sends SIGINT and waits for the exit (no elapsed-time
assertion). Required: exit 130, stderr exactly ``python -m oracle run: interrupted``, no
traceback and no ``terminate called`` abort from the compiler's native frames
(:mod:`oracle.checks.interrupts` defers the interrupt to the next safe point). Planted: without the
``KeyboardInterrupt`` branch of ``oracle.cli.main`` the child prints a traceback and exits 1.
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
POLL_S = 300.0  # a cap on the wait for the first compile to start (imports on a loaded machine)

CHILD = """
import pathlib, sys
import b12x.support as support
import oracle.cli
marker = pathlib.Path(sys.argv[1])
original = support.compile_specialization
def announced(spec, arch):
    marker.touch()
    return original(spec, arch)
support.compile_specialization = announced
argv = ["run", "--compile-all", "--compile-budget", "0", "-q", "--results", sys.argv[2]]
sys.exit(oracle.cli.main(argv))
"""


@pytest.mark.deep
def test_ctrl_c_while_compiling_is_exit_130_with_one_line(tmp_path):
    if not hasattr(signal, "SIGINT"):
        pytest.skip("needs POSIX signals")
    marker = tmp_path / "compiling"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", B12X_CACHE_DIR="off")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(marker), str(tmp_path / "results")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + POLL_S
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no compile started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=POLL_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert err == "python -m oracle run: interrupted\n", err
    assert "Traceback" not in out + err and "terminate called" not in out + err
