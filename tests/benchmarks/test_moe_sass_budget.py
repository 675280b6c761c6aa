"""CPU: benchmarks/moe_sass_budget.py, the MoE launches' SASS per weight and parallelism.

The live-block bound is checked against hand counts; one planned launch (the uniform K4 FC1 at
M = 1) is compiled and its row checked for self-consistency and for the geometry its spec fixes.
"""

from __future__ import annotations

import pytest

from tests.benchmarks.conftest import load_script


@pytest.fixture
def tool(monkeypatch):
    return load_script(monkeypatch, "moe_sass_budget")


def test_live_blocks_counts_one_block_per_routed_expert_then_even_routing(tool):
    """8 routes of M = 1: at most 8 experts, one 16-slot block each; M = 64 (512 routes over
    128 experts, 4 each): one 16-slot block per expert; M = 512 (32 routes each): two 16-slot
    blocks or one 128-slot block per expert. Planted: ceil dropped, M = 64 gives 0 blocks."""

    class Spec:
        def __init__(self, block_size):
            self.block_size = block_size

    assert tool.live_blocks(Spec(16), 1) == 8
    assert tool.live_blocks(Spec(16), 64) == 128
    assert tool.live_blocks(Spec(16), 512) == 256
    assert tool.live_blocks(Spec(128), 512) == 128


def test_the_stacks_plan_the_step_on_a_simulated_hopper(tool):
    """Every stack plans both phases (a tiered phase one launch per tier), without a GPU."""
    launches = {s: tool.plan_step(s, 1) for s in tool.STACKS}
    assert [len(launches["tiers"].fc1_spec), len(launches["tiers"].fc2_spec)] == [2, 2]
    assert {s.pair for s in launches["pair"].kernel_specs} == {"P33"}
    assert {s.bits for s in launches["uniform"].kernel_specs} == {4}


@pytest.mark.deep
def test_a_planned_launch_row_is_consistent(tool):
    """The uniform FC1 launch at M = 1: its pipe classes add up to the loop, the loop holds MMAs,
    one decoded weight costs a handful of instructions (the dense loops sit at 6-8), and the
    geometry is the spec's: 48 N-tiles of 64 columns x 8 routed experts, K/16/k_split rows per
    warp. Planted: weights counted per CTA instead of per thread puts per_weight below 1."""
    nvdisasm = tool.find_nvdisasm()
    assert nvdisasm, "nvdisasm is a dev dependency (nvidia-cuda-nvdisasm)"
    spec = tool.plan_step("uniform", 1).fc1_spec[0]
    row = tool.launch_row(
        spec, phase="fc1", m=1, k=tool.HIDDEN, n=2 * tool.INTERMEDIATE, tiers=1,
        nvdisasm=nvdisasm, arch="sm_90",
    )  # fmt: skip
    assert row["spill_bytes"] == 0 and row["weights_per_iteration"] > 0
    total = sum(row["class_per_weight"].values()) * row["weights_per_iteration"]
    assert total == pytest.approx(row["loop_instructions"])
    assert 4.0 < row["per_weight"] < 12.0, row
    assert row["live_ctas_max"] == 8 * (2 * tool.INTERMEDIATE // spec.n_group)
    assert row["k16_rows_per_warp"] == tool.HIDDEN // 16 // spec.k_split
    assert row["threads"] == 32 * spec.warps * spec.k_split
