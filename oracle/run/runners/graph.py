"""The CUDA-graph protocol over every op's plan / bind / run, as a consumer captures it.

Each :class:`GraphTarget` is one op of ``b12x.support`` on one small problem that reaches one
path: the decode op; the dense linear on the generic path with split-K, on decode + cuBLAS, on the
K6/MCG small-M row (planned on a simulated SM120, with vLLM-style one-element placeholders for
the generic scratch it must not touch), and as the raw GEMM through an external H128; the MoE
with a uniform stack, K3/K4 tiers and dynamic QSRT pairs; the grouped GEMM on its own. The
consumer fixture holds exactly the plan's buffers (plus the placeholders); two input sets of
the same shapes are swapped in place between replays. The protocol requires replay to equal eager
bit for bit under NaN and 0xFF poisoning, no allocator activity, stable addresses, and that
misuse raises; its ``reference`` step then judges every eager output with the op's judge
(the same judges as the differential runners).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from oracle.cases import declared
from oracle.cases.grids import Case
from oracle.cases.variants import variant_by_name
from oracle.judge import tolerance
from oracle.judge.tolerance import judge_exact
from oracle.report.report import CheckResult
from oracle.run.graph_protocol import ConsumerFixture, CudaBackend, GraphProtocol
from oracle.run.runners import dense, moe
from oracle.run.runners import inputs as case_inputs
from reference.trellis import decode

__all__ = ["GraphTarget", "graph_targets", "run_targets", "target_variants"]


@dataclasses.dataclass(frozen=True)
class GraphTarget:
    """One capture: op name in the contract, a grid-like case, and how to build the rest."""

    name: str
    op: str
    variant: str
    m: int
    k: int
    n: int
    experts: int | None = None
    top_k: int | None = None
    problem_changes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    simulated_part: bool = False
    raw: bool = False
    #: MoE: plan with the real device, as a serving engine does (its mainloop table needs the
    #: device: the shared decode, on sm_90 the wgmma tensor geometry); else without one.
    on_device: bool = False

    def case(self, seed: int) -> Any:
        return Case(variant_by_name(self.variant), self.m, self.k, self.n, self.experts,
                    self.top_k, seed)  # fmt: skip


TARGETS: tuple[GraphTarget, ...] = (
    GraphTarget("decode", "decode", "decode/mcg/k4/fp16", 1, 256, 256),
    GraphTarget("dense.generic_split_k", "dense", "dense/mcg/k4/fp16", 8, 1024, 256,
                problem_changes={"split_k": 4}),
    GraphTarget("dense.decode_matmul", "dense", "dense/sqg_e4m3/k3/bf16", 64, 256, 384),
    GraphTarget("dense.k6_mcg_small_m", "dense", "dense/mcg/k6/fp16", 16, 256, 256,
                simulated_part=True),
    GraphTarget("dense.raw_gemm", "dense", "dense/mul1/k5/rot_none/fp16", 9, 384, 128, raw=True),
    # M 100, N 512: the shared decode's wide row, on sm_90 the wgmma tensor-core row
    GraphTarget("dense.shared_decode", "dense", "dense/mcg/k4/fp16", 100, 256, 512),
    GraphTarget("moe.uniform", "moe", "moe/mcg/k4/fp16", 8, 256, 256, experts=8, top_k=2),
    GraphTarget("moe.tiers", "moe", "moe/mcg/k3/tiers_k3k4/fp16", 9, 256, 128, experts=8,
                top_k=2),
    GraphTarget("moe.pairs", "moe", "moe/mcg/k3/P24/fp16", 2, 256, 256, experts=8, top_k=2),
    # 75 routes per expert, planned on the device: the shared decode (sm_90: wgmma)
    GraphTarget("moe.shared_decode", "moe", "moe/mcg/k4/fp16", 300, 256, 256, experts=8,
                top_k=2, on_device=True),
    GraphTarget("moe_gemm", "moe_gemm", "moe/mcg/k4/bf16", 8, 256, 256, experts=4, top_k=2),
)  # fmt: skip


def target_variants() -> dict[str, tuple[str, ...]]:
    """Registry variant name -> the graph targets that capture it (for coverage)."""
    out: dict[str, list[str]] = {}
    for target in TARGETS:
        out.setdefault(target.variant, []).append(target.name)
    return {k: tuple(v) for k, v in out.items()}


def _dense(target: GraphTarget, device: Any):
    contract = declared.op_contract("dense")
    callback = dense.identity_h128 if target.raw else None
    part = dense.SIMULATED_PARTS[0] if target.simulated_part else None
    op = contract.graph_op(device=part, hadamard_128=callback)
    case0 = target.case(1)
    problem = {**dense.dense_problem(case0), **target.problem_changes}
    sets = [case_inputs.dense_inputs(target.case(s), device) for s in (1, 2)]

    def judge(got: torch.Tensor, inputs: Mapping[str, torch.Tensor]):
        weight = decode(inputs["trellis"], case0.variant.codebook)
        dtype = case_inputs.compute_dtype(case0)
        if target.raw:
            a = inputs["x"].to(torch.float16).to(dtype)
            return tolerance.judge_gemm(got.to(dtype), a, weight, compute_dtype=dtype)
        return tolerance.judge_linear(
            got, x=inputs["x"], weight=weight, suh=inputs["suh"], svh=inputs["svh"],
            compute_dtype=dtype,
        )  # fmt: skip

    return contract, op, problem, sets, judge


def _decode(target: GraphTarget, device: Any):
    contract = declared.op_contract("decode")
    v = target.case(1).variant
    problem = {"k": target.k, "n": target.n, "bits": v.bits, "codebook": v.codebook}
    sets = []
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        trellis = case_inputs.payload(gen, target.k // 16, target.n // 16, 16 * v.bits)
        sets.append({"trellis": trellis.to(device)})

    def judge(got, inputs):
        return judge_exact(got, decode(inputs["trellis"], v.codebook))

    return contract, contract.graph_op(), problem, sets, judge


def _moe(target: GraphTarget, device: Any):
    contract = declared.op_contract("moe")
    cases = [target.case(s) for s in (1, 2)]
    batches = [case_inputs.moe_inputs(c, device) for c in cases]
    problem = moe.moe_problem(cases[0], batches[0]["experts"], batches[0]["choices"])
    sets = [moe.flat_tensors(moe.moe_op_inputs(b)) for b in batches]
    by_set = {id(s["x"]): b for s, b in zip(sets, batches, strict=True)}
    dtype = case_inputs.compute_dtype(cases[0])

    def judge(got, inputs):
        batch = by_set[id(inputs["x"])]
        return tolerance.judge_moe(
            got, x=batch["x"], experts=batch["experts"], topk_weights=batch["topk_weights"],
            topk_ids=batch["topk_ids"], compute_dtype=dtype,
        )  # fmt: skip

    op = contract.graph_op(device=device if target.on_device else None)
    return contract, op, problem, sets, judge


def _moe_gemm(target: GraphTarget, device: Any):
    contract = declared.op_contract("moe_gemm")
    v = target.case(1).variant
    dtype = case_inputs.compute_dtype(target.case(1))
    tokens, k, n, e = target.m, target.k, target.n, target.experts
    routes = tokens * target.top_k
    problem = {
        "m": tokens, "top_k": target.top_k, "k": k, "n": n, "codebook": v.codebook,
        "bits": v.bits, "num_experts": e, "compute_dtype": dtype, "phase": "fc2", "pair": None,
    }  # fmt: skip
    sets = []
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        rows = torch.randint(0, k, (routes,), generator=gen)
        a = torch.zeros(routes, k, dtype=dtype)
        a[torch.arange(routes), rows] = 1.0
        ids = torch.stack([torch.randperm(e, generator=gen)[: target.top_k] for _ in range(tokens)])
        payload = case_inputs.payload(gen, e, k // 16, n // 16, 16 * v.bits)
        sets.append({"a": a.to(device), "topk_ids": ids.to(device), "payload": payload.to(device)})

    def judge(got, inputs):
        experts = inputs["topk_ids"].reshape(-1).long()
        rows = inputs["a"].argmax(dim=1)
        weights = torch.stack([decode(inputs["payload"][j], v.codebook) for j in range(e)])
        return judge_exact(got, weights[experts, rows].to(dtype))

    return contract, contract.graph_op(), problem, sets, judge


_BUILDERS: dict[str, Callable[[GraphTarget, Any], Any]] = {
    "decode": _decode,
    "dense": _dense,
    "moe": _moe,
    "moe_gemm": _moe_gemm,
}

#: Generic-path scratch a vLLM-style consumer provisions as one element on the K6 row.
K6_PLACEHOLDERS = ("gemm_output", "c_tmp", "rotated_compute", "gemm_output_f16")


def persistent_buffers(plan: Any) -> frozenset[str]:
    """The plan's buffers that carry state from one launch to the next and are never poisoned:
    those its specs mark ``zeroed`` (a lock workspace, the stream-K GEMM's flags), which the
    kernels leave zero again after every launch."""
    return frozenset(spec.name for spec in plan.buffers if spec.zeroed)


def _fixture(contract, op, problem, sets, *, placeholders: bool, device) -> Any:
    plan = op.plan(problem)
    buffers = dict(contract.allocate(plan, device))
    if placeholders:
        for name in K6_PLACEHOLDERS:
            buffers.setdefault(name, torch.empty(1, dtype=torch.float32, device=device))
    outputs = tuple(n for n in ("output", "out") if n in buffers)
    persistent = persistent_buffers(plan)
    scratch = tuple(n for n in buffers if n not in outputs and n not in persistent)
    inputs = {k: torch.empty_like(t) for k, t in sets[0].items()}
    return ConsumerFixture(buffers, inputs, sets, outputs=outputs, scratch=scratch)


def graph_targets() -> tuple[GraphTarget, ...]:
    return TARGETS


def run_targets(device: Any, *, only: tuple[str, ...] | None = None) -> list[CheckResult]:
    """Run the protocol over every target (or the ``only`` ones); one CheckResult each."""
    out = []
    for target in TARGETS:
        if only is not None and target.name not in only:
            continue
        name = f"gpu.graph.{target.name}"
        try:
            contract, op, problem, sets, judge = _BUILDERS[target.op](target, device)
            fixture = _fixture(contract, op, problem, sets, device=device,
                               placeholders=target.simulated_part)  # fmt: skip

            def verdict_of(got, inputs, judge=judge):
                verdict = judge(got, inputs)
                return verdict.passed, verdict.reason

            verdict = GraphProtocol(
                op, problem, fixture, CudaBackend(), replays=4,
                reference=lambda s, outs=fixture.outputs: {o: s for o in outs},
                judge=verdict_of,
            ).run()  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a crash is this target's failure
            out.append(CheckResult(name, "gpu", "fail", f"raised {type(exc).__name__}: {exc}"))
            continue
        status = "pass" if verdict.passed else "fail"
        metrics = {**verdict.metrics, "steps": {s.name: s.status for s in verdict.steps}}
        out.append(CheckResult(name, "gpu", status, "; ".join(verdict.reasons), metrics))
    return out
