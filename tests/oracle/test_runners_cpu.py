"""The dense runner's judging on CPU, with the kernel replaced by a fake op behind a fake
contract: a faithful output passes, each planted fault fails and is saved for replay.

The fake op follows the contract's protocol (plan → allocate → bind → run into the bound
``output``; the raw path also exposes its ``gemm_output`` stage), so everything the runner does
around the kernel — inputs from the case id, poisoned buffers, the judge, the observed stage,
the output = x.dtype(fp16(gemm)) check, saving a failing case — runs as on a GPU.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch

from oracle.cases.grids import cases

F16 = torch.float16


def _fake_contract(fault: str | None):
    from b12x.support import OpContract
    from reference import linear
    from reference.trellis import decode

    class FakeDenseOp:
        def __init__(self, device=None, hadamard_128=None):
            self.external = hadamard_128 is not None

        def plan(self, problem):
            return types.SimpleNamespace(path="generic", problem=dict(problem))

        def bind(self, plan, buffers):
            return plan, buffers

        def run(self, bound, inputs):
            plan, buffers = bound
            p = plan.problem
            weight = decode(inputs["trellis"], p["codebook"]).clone()
            if fault == "wrong_weight":
                weight[5, 7] += 2.0  # one decoded weight off by far more than rounding
            x, dtype = inputs["x"], p["compute_dtype"]
            if p["external_rotation"]:
                gemm = linear.faithful_gemm_compute(x.to(F16), weight, compute_dtype=dtype)
                if fault == "unwritten_stage":
                    gemm = gemm.clone().fill_(float("nan"))
                buffers["gemm_output"].copy_(gemm)
                y = gemm.to(F16).to(x.dtype)
            else:
                y = linear.forward_decoded(
                    x, weight, inputs["suh"], inputs["svh"], precision="faithful",
                    compute_dtype=dtype,
                )  # fmt: skip
            if fault == "tile_scaled":
                y = y.clone()
                y[:16, :16] *= 1.01
            buffers["output"].copy_(y)

    def allocate(plan, device):
        p = plan.problem
        out = {"output": torch.empty(p["m"], p["n"], dtype=p["x_dtype"], device=device)}
        if p["external_rotation"]:
            out["gemm_output"] = torch.empty(p["m"], p["n"], dtype=p["compute_dtype"])
        return out

    def never(*args, **kwargs):
        raise AssertionError("the runner goes through the graph op")

    return OpContract(
        name="dense", plan=never, bind=never, run=never, allocate=allocate,
        graph_op=FakeDenseOp, custom_op=None, variants=(), dispatch=(), tiles=None,
        observables={"gemm_output": "gemm"},
    )  # fmt: skip


@functools.cache  # a frozen Case: the grid walk runs once per (rotation, dtype), not per test
def _case(rotation: str, dtype: str = "fp16"):
    text = f"codebook=mcg,bits=4,m=17,k=128,n=128,rotation={rotation},dtype={dtype}"
    return cases(op="dense", tier="gpu", filter=text)[0]


# the linear (rotation full) exposes no raw GEMM stage, so "unwritten_stage" is raw-path only
FAULTS = {"full": (None, "wrong_weight", "tile_scaled"),
          "none": (None, "wrong_weight", "tile_scaled", "unwritten_stage")}  # fmt: skip


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize(
    ("rotation", "fault"), [(rot, fault) for rot, faults in FAULTS.items() for fault in faults]
)
def test_dense_runner_passes_faithful_and_fails_planted_faults(
    monkeypatch, tmp_path, rotation, dtype, fault
):
    from oracle.cases import declared
    from oracle.run.runners import run_case

    monkeypatch.setattr(declared, "op_contract", lambda name: _fake_contract(fault))
    case = _case(rotation, dtype)
    (result,) = run_case(case, device="cpu", results_dir=tmp_path)
    assert result.name == f"gpu.dense.{case.case_id}"
    if fault is None:
        assert result.status == "pass", result.reason
        assert not list(tmp_path.iterdir())
    else:
        assert result.status == "fail", (fault, result.reason)
        assert "replay: python -m oracle replay" in result.reason
        assert list(tmp_path.glob("*.json"))


# --- run --tile on a GPU: the pinned tile reaches plan; no qualifying case is a failure -------


def _pinning_contract(seen: list, qualifies):
    contract = _fake_contract(None)
    base = contract.graph_op

    class PinnedOp(base):
        def plan(self, problem):
            seen.append(dict(problem))
            if "tile" in problem and not qualifies(problem):
                raise ValueError(f"tile: pinned {problem['tile']} rejected: N={problem['n']}")
            plan = super().plan(problem)
            spec = problem.get("tile")
            plan.tile = None if spec is None else types.SimpleNamespace(
                tile_k=spec[0], tile_n=spec[1], cta_threads=spec[2]
            )  # fmt: skip
            return plan

    import dataclasses

    return dataclasses.replace(contract, graph_op=PinnedOp)


def test_a_pinned_tile_reaches_plan_and_names_the_result(monkeypatch, tmp_path):
    from oracle.cases import declared
    from oracle.run.grid import select_grid
    from oracle.run.runners import run_case

    seen: list = []
    contract = _pinning_contract(seen, lambda p: p["n"] % 256 == 0)
    monkeypatch.setattr(declared, "op_contract", lambda name: contract)
    text = "op=dense,codebook=mcg,bits=4,m=17,rotation=full,dtype=fp16"
    runnable, notes = select_grid(filter=text, tile="64x256x256")
    assert runnable and all(c.n % 256 == 0 for c in runnable), notes
    assert not [n for n in notes if n.status == "fail"]
    assert {tuple(p["tile"]) for p in seen} == {(64, 256, 256)}
    seen.clear()
    (result,) = run_case(runnable[0], device="cpu", results_dir=tmp_path, tile="64x256x256")
    assert result.status == "pass", result.reason
    assert result.name == f"gpu.dense.{runnable[0].case_id}.tile_64x256x256"
    assert seen and all(p["tile"] == [64, 256, 256] for p in seen)


def test_a_selection_no_case_qualifies_for_fails_naming_the_tile(monkeypatch):
    from oracle.cases import declared
    from oracle.run.grid import select_grid

    contract = _pinning_contract([], lambda p: False)
    monkeypatch.setattr(declared, "op_contract", lambda name: contract)
    runnable, notes = select_grid(filter="op=dense,m=17,codebook=mcg,bits=4", tile="64x256x256")
    assert runnable == []
    (fail,) = [n for n in notes if n.status == "fail"]
    assert fail.name == "gpu.tile_64x256x256"
    assert "no grid case of this selection qualifies" in fail.reason and "rejected" in fail.reason


def test_the_graph_fixture_never_poisons_a_zeroed_buffer():
    """The graph protocol poisons scratch before each replay; a buffer whose spec is ``zeroed``
    carries state between launches (the K6 lock workspace, the stream-K GEMM's flags, which a
    poisoned value would leave waiting forever) and must be kept. Derived from the specs, so a
    new zeroed buffer is kept without a name list to update."""
    from b12x.ops.dense.plan import plan_dense
    from oracle.judge.tiles import SimulatedDevice
    from oracle.run.runners.graph import persistent_buffers

    h200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))
    sm120 = SimulatedDevice("sm120", 188, 99 * 1024, (12, 0))
    problem = dict(k=8192, n=1024, bits=4, codebook="mcg", x_dtype=torch.float16)
    assert persistent_buffers(plan_dense(device=h200, m=8, **problem)) == frozenset()
    k6 = plan_dense(device=sm120, m=4, **{**problem, "bits": 6})
    assert k6.path == "k6_mcg_small_m"
    assert persistent_buffers(k6) == {"workspace"}
    assert persistent_buffers(plan_dense(device=h200, m=64, **problem)) == {"stream_k_flags"}
