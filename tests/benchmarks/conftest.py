"""Fixtures for the benchmark scripts' CPU tests: each script imports its siblings
(``bench_cli``, ``bench_timing``) by bare name, as it does when run from ``benchmarks/``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(monkeypatch: pytest.MonkeyPatch, name: str):
    """A fresh import of ``benchmarks/<name>.py`` with ``benchmarks/`` on ``sys.path``."""
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    for module in (name, "bench_cli", "bench_timing"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return importlib.import_module(name)


@pytest.fixture
def bench_cli(monkeypatch):
    return load_script(monkeypatch, "bench_cli")


@pytest.fixture
def timing(monkeypatch):
    return load_script(monkeypatch, "bench_timing")


@pytest.fixture
def dense(monkeypatch):
    return load_script(monkeypatch, "dense_trellis")


@pytest.fixture
def moe(monkeypatch):
    return load_script(monkeypatch, "moe_trellis")


@pytest.fixture
def fake_clock():
    """A clock factory: ``fake_clock(step)`` advances ``step`` seconds on every read."""

    def make(step: float):
        state = {"now": 0.0}

        def clock() -> float:
            state["now"] += step
            return state["now"]

        return clock

    return make


@pytest.fixture
def shared_sweep(monkeypatch):
    return load_script(monkeypatch, "dense_shared_decode_sweep")


@pytest.fixture
def forms(monkeypatch):
    return load_script(monkeypatch, "cublas_gemm_forms")


@pytest.fixture
def overlap(monkeypatch):
    return load_script(monkeypatch, "decode_gemm_overlap")
