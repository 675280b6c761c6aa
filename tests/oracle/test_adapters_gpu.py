"""The quack adapter on a GPU: a slice of its grid and the graph protocol (docs/adapters.md).

The full grid runs with ``python -m oracle run --kernel quack``; this test keeps a slice of it in
the GPU tier. quack is an optional peer: where it cannot run (not installed), the test skips
with the adapter's own one-line reason.
"""

from __future__ import annotations

import pytest

from oracle.adapters import load_adapter
from oracle.run import adapter as run

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def quack():
    adapter = load_adapter("quack")
    why = adapter.unavailable()
    if why is not None:
        pytest.skip(why)
    return adapter


def test_a_slice_of_the_grid_is_judged_and_passes(quack, tmp_path):
    grid = run.adapter_grid(quack)
    picked = grid[:: len(grid) // 12]
    results = [run.run_adapter_case(quack, c, device="cuda", results_dir=tmp_path) for c in picked]
    failed = [f"{r.name}: {r.reason}" for r in results if r.status != "pass"]
    assert not failed, "\n".join(failed)


def test_the_graph_protocol_passes(quack):
    (result,) = run.run_adapter_graph(quack, device="cuda")
    assert result.status == "pass", result.reason
    assert result.metrics["steps"]["capture"] == "pass"
