"""Root pytest configuration.

Order matters here: the GPU each xdist worker may see is pinned *before* anything imports torch
or initialises CUDA, so this module imports nothing heavy at the top. Worker ``gwN`` sees GPU
``N mod count`` as its ``cuda:0``; the parent process (no xdist) keeps what it was given.
The GPUs are ``B12X_TEST_GPUS`` (comma-separated ids), else ``CUDA_VISIBLE_DEVICES``, else every
GPU the driver lists. A worker that replaces a crashed one (``--max-worker-restart``) gets a new
id (``gw<next>``), so the controller also stamps each worker's *slot* into its environment
(``B12X_GPU_SLOT``, via xdist's ``pytest_xdist_setupnodes``); the replacement inherits the slot
and with it the crashed worker's GPU instead of doubling up on another.
The rest of the machinery (markers, collection-time GPU skips, hypothesis profiles, saving
failing cases) lives in :mod:`oracle.pytest_plugin`.
"""

from __future__ import annotations

import os

import pytest


def _pin_worker_gpu() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    visible = os.environ.get("B12X_TEST_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        count = _count_gpus_without_cuda_init()
        if count <= 0:
            return
        gpus = [str(i) for i in range(count)]
    else:
        gpus = [g for g in visible.split(",") if g.strip()]
        if not gpus:
            return
    os.environ.setdefault("B12X_TEST_GPUS", ",".join(gpus))
    slot = os.environ.get("B12X_GPU_SLOT", "")
    index = (int(slot) if slot.isdigit() else int(worker[2:])) % len(gpus)
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index]


def _count_gpus_without_cuda_init() -> int:
    """Count NVIDIA devices from /proc, never through the CUDA driver (that would initialise it)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _one_cpu_thread_per_worker() -> None:
    """xdist already runs one worker per core; intra-op threads on top of that oversubscribe."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs) -> None:
    """Controller side: worker i keeps slot i, also when xdist replaces it after a crash (the
    replacement reuses the crashed worker's spec, environment included)."""
    for slot, spec in enumerate(specs):
        spec.env.setdefault("B12X_GPU_SLOT", str(slot))


_pin_worker_gpu()
_one_cpu_thread_per_worker()

pytest_plugins = ["oracle.pytest_plugin"]
