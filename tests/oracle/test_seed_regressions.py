"""The two seed incidents (§5.3, §5.5), replayed against the real b12x.

Each seed's mutants (from the mutation catalogue) are applied to a temporary copy of the real
b12x; the oracle's checks must fail on that regressed copy and pass on the real tree.

* Seed 1, mixed K3/K4 ABI drift (9bbae678): a shared body grows parameters under a stale
  positional call (arguments shift), and a codebook parameter gains a default that a call site
  silently relies on. Caught by the contract checker's call rules and by the codebook lint.
* Seed 2, K6 small-M removal (9bbae678 / b12x#136): the K6/MCG small-M dispatch row is gone, so
  M <= 128 K6 MCG falls into the generic scheduler, whose split-K scratch the vLLM consumer does
  not provide. Caught by the dispatch checks (both sides of every declared boundary) and by
  binding the consumer's one-element placeholders under (simulated) capture.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from b12x.ops.dense import allocate_dense_buffers, bind_dense, plan_dense
from b12x.ops.dense import dispatch as real_dispatch
from b12x.ops.dense import plan as plan_mod
from b12x.runtime.scratch import BufferNotProvided
from oracle.contracts import check_package, default_root
from oracle.contracts.check import DEFAULT_SLOTS_PATH
from oracle.contracts.lints import lint_package
from oracle.judge import dispatch as O
from oracle.judge.tiles import SimulatedDevice
from oracle.mutate import apply_mutant, load_catalogue

SEED1 = ("seed-shifted-positional-call", "codebook-default-flipped")
SEED2 = ("k6-small-m-row-removed",)
RTX = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))


def _regressed_b12x(tmp_path: Path, mutant_ids) -> Path:
    """A copy of the real b12x (under ``tmp_path/b12x``) with the seed mutants applied."""
    shutil.copytree(default_root(), tmp_path / "b12x", ignore=shutil.ignore_patterns("*.pyc"))
    by_id = {m.id: m for m in load_catalogue()}
    for mutant_id in mutant_ids:
        apply_mutant(by_id[mutant_id], tmp_path)
    return tmp_path / "b12x"


def _call_rule_violations(root: Path):
    return check_package(root, slots_path=DEFAULT_SLOTS_PATH).violations


# ------------------------------------------------------------------------------------ seed 1


def test_seed1_real_b12x_binds_cleanly_and_has_no_codebook_default():
    assert _call_rule_violations(default_root()) == []
    assert [f for f in lint_package() if f.rule == "codebook-default"] == []


def test_seed1_shifted_positional_call_is_caught(tmp_path):
    regressed = _regressed_b12x(tmp_path, SEED1)
    found = _call_rule_violations(regressed)
    at_body = [v for v in found if v.callee.endswith("decode_and_accumulate")]
    rules = {v.rule for v in at_body}
    assert "shared-body-positional" in rules
    assert "shifted-argument" in rules  # a_frags lands in the new lut_addr_fc2 slot
    shifted = {v.parameter: v.expression for v in at_body if v.rule == "shifted-argument"}
    assert shifted.get("lut_addr_fc2") == "a_frags"


def test_seed1_codebook_default_is_caught(tmp_path):
    regressed = _regressed_b12x(tmp_path, SEED1)
    flagged = [f for f in lint_package(regressed) if f.rule == "codebook-default"]
    assert [(Path(f.path).name, "gemm_step" in f.message) for f in flagged] == [("host.py", True)]


# ------------------------------------------------------------------------------------ seed 2


def _load_dispatch(path: Path):
    name = f"_seed2_dispatch_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


class _View:
    """``oracle.judge.dispatch`` wants its own ``Boundary`` objects; b12x declares the same
    fields."""

    def __init__(self, module):
        table = module.TABLE
        self.name = table.name
        self.paths = table.paths
        self.boundaries = [O.Boundary(**dataclasses.asdict(b)) for b in table.boundaries]
        self.explain = table.explain


def _failures(module) -> list[str]:
    return [
        f for o in O.check_table(_View(module), O.boundary_cases(_View(module))) for f in o.failures
    ]


@pytest.fixture
def regressed_dispatch(tmp_path):
    return _load_dispatch(_regressed_b12x(tmp_path, SEED2) / "ops" / "dense" / "dispatch.py")


def test_seed2_dispatch_checks_pass_on_the_real_table():
    assert _failures(real_dispatch) == []


def test_seed2_removed_k6_row_fails_the_dispatch_checks(regressed_dispatch):
    failures = _failures(regressed_dispatch)
    assert failures
    assert any("k6_mcg_small_m" in f for f in failures)


def _consumer_buffers(plan):
    """vLLM's provisioning for K6 small-M: the plan's own buffers minus generic scratch, plus
    one-element placeholders for the generic GEMM scratch (b12x#136)."""
    generic = {"gemm_output", "c_tmp", "rotated_compute", "gemm_output_f16"}
    own = {k: v for k, v in allocate_dense_buffers(plan, "cpu").items() if k not in generic}
    return {
        **own,
        "c_tmp": torch.empty(1, dtype=torch.float32),
        "gemm_output": torch.empty(1, dtype=torch.float16),
    }


# M = 32: without the K6 row it falls to the generic scheduler (decode_matmul starts at M = 64)
K6_PROBLEM = dict(m=32, k=2048, n=4096, bits=6, codebook="mcg", x_dtype=torch.float16)


def test_seed2_real_k6_plan_captures_with_the_consumer_placeholders(monkeypatch):
    plan = plan_dense(device=RTX, **K6_PROBLEM)
    assert plan.path == "k6_mcg_small_m"
    buffers = _consumer_buffers(plan)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    bound = bind_dense(plan, **buffers)
    assert set(bound.buffers) == {"output", "rotated_f16", "workspace"}


def test_seed2_regressed_dispatch_breaks_capture_naming_the_scratch(
    monkeypatch, regressed_dispatch
):
    monkeypatch.setattr(plan_mod, "dense_dispatch", regressed_dispatch)
    plan = plan_dense(device=RTX, **K6_PROBLEM)
    assert plan.path == "generic"  # fell into the generic scheduler
    buffers = _consumer_buffers(plan)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(BufferNotProvided, match="is not initialized for CUDA graph capture"):
        bind_dense(plan, **buffers)
