"""GPU checks (design §5.3–5.5): decode exactness, the differential grid, the graph protocol.

On a machine without CUDA every family is ONE ``skip`` line with reason ``"no CUDA device"``
(:data:`FAMILY_NAMES`), never thousands. With CUDA:

* ``gpu.decode.<case>`` — ``b12x.kernels.host.decode_weight`` equals ``reference.trellis.decode``
  bitwise (:func:`oracle.tolerance.judge_exact`) for every decode case of the grid.
* ``gpu.dense.<case>`` — the dense op against the exact (fp64) and faithful references with the
  variant's tolerance (:func:`oracle.tolerance.judge`): rotation ``full`` runs the dense front
  door (``b12x.dense.plan``: plan → allocate → bind → run), rotation ``none`` runs
  ``b12x.kernels.host.trellis_matmul``.
* ``gpu.graph.<op>`` — :class:`oracle.graph_protocol.GraphProtocol` with the CUDA backend over
  the ops ``b12x.support.graph_ops()`` declares, else over the oracle's plan/bind/run adapters
  of the host decode and GEMM wrappers (:mod:`oracle.checks.gpu_ops`).

Cases come from :func:`oracle.grids.cases` (tier ``gpu``, the CLI's filter; without one the
default job leaves the heavy shapes out and says so in a ``gpu.heavy`` skip line), restricted to
variants with kernel coverage; references are computed on the GPU too; ops without a runner
here are one ``skip`` per op with the reason.
A failing case is saved (:func:`oracle.results.save_case`: inputs, kernel output, case and
verdict) and its reason carries the exact replay command. :func:`replay_saved` re-judges a saved
case: it recomputes the references from the saved inputs (CPU is enough) and, with CUDA, reruns
the kernel too.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from oracle.report import CheckResult

__all__ = ["FAMILY_NAMES", "kernel_output", "make_inputs", "references", "replay_saved", "run"]

FAMILY_NAMES = ("gpu.decode_exactness", "gpu.differential_grid", "gpu.graph_protocol")
RUNNABLE = {("decode", "none"), ("dense", "full"), ("dense", "none")}
INPUT_SCALE = 1e-1


def _runnable(case: Any) -> str | None:
    """None when this module can run the case, else the reason it cannot."""
    v = case.variant
    if v.kernel_coverage is None:
        return v.no_coverage_reason or "no kernel coverage declared"
    if (v.op, v.rotation) not in RUNNABLE or v.pair_kind is not None or v.tier_layout is not None:
        return f"no GPU runner in the oracle for op={v.op} rotation={v.rotation} pairs/tiers"
    return None


def make_inputs(case: Any, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Seeded inputs of one case (payload is uniform random words: every tile is valid)."""
    v = case.variant
    gen = torch.Generator().manual_seed(case.seed)
    words = torch.randint(
        -(1 << 15), 1 << 15, (case.k // 16, case.n // 16, 16 * v.bits), generator=gen
    )
    out = {"trellis": words.to(torch.int16)}
    if v.op == "dense":
        dtype = torch.bfloat16 if v.compute_dtype == "bf16" else torch.float16
        out["x"] = (torch.randn(case.m, case.k, generator=gen) * INPUT_SCALE).to(dtype)
        if v.rotation == "full":
            sign = lambda n: torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)  # noqa: E731
            out["suh"] = (sign(case.k) * (0.5 + torch.rand(case.k, generator=gen))).half()
            out["svh"] = (sign(case.n) * (0.5 + torch.rand(case.n, generator=gen))).half()
    return {k: t.to(device) for k, t in out.items()}


def references(
    case: Any, inputs: dict[str, torch.Tensor], device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(exact, faithful)``, computed on ``device`` (reference/ is device-agnostic torch) and
    returned on the CPU."""
    exact, faithful = _references_on(case, {k: t.to(device) for k, t in inputs.items()})
    return exact.cpu(), (faithful.cpu() if faithful is not None else None)


def _references_on(
    case: Any, cpu: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    from reference import linear, trellis

    v = case.variant
    weight = trellis.decode(cpu["trellis"], v.codebook)
    if v.op == "decode":
        return weight, None
    x = cpu["x"]
    dtype = torch.bfloat16 if v.compute_dtype == "bf16" else torch.float16
    if v.rotation == "full":
        exact = linear.forward_decoded(
            x, weight, cpu["suh"], cpu["svh"], precision="exact", compute_dtype=dtype
        )
        faithful = linear.forward_decoded(
            x, weight, cpu["suh"], cpu["svh"], precision="faithful", compute_dtype=dtype
        )
        return exact, faithful
    exact = x.double() @ weight.double()
    faithful = linear.faithful_gemm(x, weight, dtype).to(x.dtype)
    return exact, faithful


def kernel_output(case: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Run b12x on CUDA for one case; returns the output on CPU."""
    from b12x.kernels import host

    v = case.variant
    dev = {k: t.cuda() for k, t in inputs.items()}
    if v.op == "decode":
        y = host.decode_weight(dev["trellis"], v.codebook)
    elif v.rotation == "full":
        from b12x.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense

        dtype = torch.bfloat16 if v.compute_dtype == "bf16" else torch.float16
        x = dev["x"]
        plan = plan_dense(
            m=x.shape[0],
            k=x.shape[1],
            n=dev["trellis"].shape[1] * 16,
            bits=v.bits,
            codebook=v.codebook,
            x_dtype=x.dtype,
            compute_dtype=dtype,
            device=x.device,
        )
        bound = bind_dense(plan, **allocate_dense_buffers(plan, x.device))
        y = run_dense(bound, x, dev["trellis"], dev["suh"], dev["svh"])
    else:
        y = host.trellis_matmul(dev["x"], dev["trellis"], v.codebook)
    torch.cuda.synchronize()
    return y.cpu()


def _judge(case: Any, y: torch.Tensor, exact: torch.Tensor, faithful: torch.Tensor | None):
    from oracle.tolerance import judge, judge_exact

    if case.variant.op == "decode":
        return judge_exact(y, exact)
    return judge(y, exact, faithful, case.variant.tolerance)


def _save(case: Any, inputs: dict, y: torch.Tensor, verdict: Any, results_dir: Path) -> str:
    from oracle.results import replay_command, save_case

    meta = {
        "case_id": case.case_id,
        "case": case.to_dict(),
        "verdict": verdict.to_dict(),
        "kind": "grid",
    }
    path = save_case(meta, {**{k: t.cpu() for k, t in inputs.items()}, "y": y}, results_dir)
    return replay_command(path)


def _case_result(case: Any, ctx: Any) -> CheckResult:
    family = "decode" if case.variant.op == "decode" else "dense"
    name = f"gpu.{family}.{case.case_id}"
    inputs = make_inputs(case)
    try:
        y = kernel_output(case, inputs)
    except Exception as exc:  # noqa: BLE001 - a crash is this case's failure
        return CheckResult(name, "gpu", "fail", f"kernel raised {type(exc).__name__}: {exc}")
    exact, faithful = references(case, inputs, "cuda" if ctx.cuda else "cpu")
    verdict = _judge(case, y, exact, faithful)
    metrics = {
        **verdict.metrics.to_dict(),
        "variant": case.variant.name,
        "m": case.m,
        "k": case.k,
        "n": case.n,
    }
    if verdict.passed:
        return CheckResult(name, "gpu", "pass", "", metrics)
    command = _save(case, inputs, y, verdict, ctx.results_dir)
    return CheckResult(name, "gpu", "fail", f"{verdict.reason} — replay: {command}", metrics)


def select_grid(
    *, case: str | None = None, filter: str | None = None, max_cases: int | None = None
) -> tuple[list[Any], list[CheckResult]]:
    """The grid cases a GPU run executes, and one skip line per reason for those it leaves out.

    The single place that decides the selection: the one-GPU job and every shard of a multi-GPU
    run (:mod:`oracle.sharding`) call it, so their case lists cannot drift apart. Without a case
    or a filter, the default job leaves the heavy shapes to an explicit ``--filter heavy=true``.
    """
    from oracle.grids import cases, parse_case_id

    notes: list[CheckResult] = []
    if case:
        pool = [parse_case_id(case)]
    elif filter:
        pool = cases(tier="gpu", filter=filter, max_cases=max_cases)
    else:
        pool = cases(tier="gpu", filter="heavy=false", max_cases=max_cases)
        heavy = len(cases(tier="gpu", filter="heavy=true"))
        why = f"{heavy} heavy case(s) not in the default job: run --filter heavy=true"
        notes.append(CheckResult("gpu.heavy", "gpu", "skip", why))
    runnable, skipped = [], Counter()
    for item in pool:
        why = _runnable(item)
        if why is None:
            runnable.append(item)
        else:
            skipped[(item.variant.op, why)] += 1
    notes += [
        CheckResult(f"gpu.{op}.unrunnable", "gpu", "skip", f"{count} case(s): {why}")
        for (op, why), count in sorted(skipped.items())
    ]
    return runnable, notes


def _grid(ctx: Any) -> list[CheckResult]:
    runnable, out = select_grid(case=ctx.case, filter=ctx.filter, max_cases=ctx.max_cases)
    advance = ctx.advance("differential grid", len(runnable))
    for case in runnable:
        out.append(_case_result(case, ctx))
        advance()
    return out


def _graph(ctx: Any) -> list[CheckResult]:
    from oracle.checks.gpu_ops import graph_targets
    from oracle.graph_protocol import CudaBackend, GraphProtocol

    out = []
    for name, op, problem, fixture in graph_targets():
        verdict = GraphProtocol(op, problem, fixture, CudaBackend()).run()
        status = "pass" if verdict.passed else "fail"
        out.append(
            CheckResult(
                f"gpu.graph.{name}",
                "gpu",
                status,
                "; ".join(verdict.reasons),
                {**verdict.metrics, "steps": {s.name: s.status for s in verdict.steps}},
            )
        )
    return out


def run(ctx: Any) -> list[CheckResult]:
    if not ctx.cuda:
        return [CheckResult(n, "gpu", "skip", "no CUDA device") for n in FAMILY_NAMES]
    if ctx.tier != "gpu":
        return [CheckResult(n, "gpu", "skip", "tier cpu selected (--tier)") for n in FAMILY_NAMES]
    return _grid(ctx) + _graph(ctx)


def replay_saved(path: str | Path, *, cuda: bool) -> tuple[CheckResult, Any]:
    """Re-judge a saved grid case: references recomputed; kernel rerun when ``cuda``."""
    from oracle.grids import parse_case_id
    from oracle.results import load_case

    loaded = load_case(path)
    try:
        case = parse_case_id(loaded.meta["case_id"])
    except (KeyError, ValueError) as exc:
        reason = f"not a grid case, cannot rerun ({exc}); inspect it with oracle.results.load_case"
        return CheckResult(f"replay.{loaded.path.stem}", "cpu", "skip", reason), None
    v = case.variant
    if (v.op, v.rotation) not in RUNNABLE or v.pair_kind is not None or v.tier_layout is not None:
        why = f"no runner in the oracle for op={v.op} rotation={v.rotation} pairs/tiers"
        return CheckResult(f"replay.{case.case_id}", "cpu", "skip", why), None
    inputs = {k: t.contiguous() for k, t in loaded.tensors.items() if k != "y"}
    exact, faithful = references(case, inputs, "cuda" if cuda else "cpu")
    if cuda:
        y, how = kernel_output(case, inputs), "kernel rerun on CUDA"
    else:
        y, how = loaded.tensors["y"].contiguous(), "saved kernel output (no CUDA: references only)"
    verdict = _judge(case, y, exact, faithful)
    status = "pass" if verdict.passed else "fail"
    reason = f"{how}; " + (verdict.reason or "within tolerance")
    return CheckResult(
        f"replay.{case.case_id}",
        "gpu" if cuda else "cpu",
        status,
        reason,
        verdict.metrics.to_dict(),
    ), verdict
