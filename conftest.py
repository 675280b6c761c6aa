"""Root pytest configuration.

Order matters here: the GPU each xdist worker may see is pinned *before* anything imports torch
or initialises CUDA, so this module imports nothing heavy at the top. Worker ``gwN`` sees GPU
``N mod count`` as its ``cuda:0``; the parent process (no xdist) keeps what it was given.
The rest of the machinery (markers, collection-time GPU skips, hypothesis profiles, saving
failing cases) lives in :mod:`oracle.pytest_plugin`.
"""

from __future__ import annotations

import os


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
    index = int(worker[2:]) % len(gpus)
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


_pin_worker_gpu()
_one_cpu_thread_per_worker()

pytest_plugins = ["oracle.pytest_plugin"]
