"""Judging an adapted kernel (:mod:`oracle.adapters`): its grid, its differential runs, its
CUDA-graph protocol and the replay of its saved failures.

* :class:`AdapterCase` is one point: adapter, op, format, compute dtype, ``M x K x N``, the
  output scale ``2**scale_exp`` and a seed; its id (``quack-gemm-qtip-bf16_m17_k2048_n1024_a0_s5``)
  regenerates every input (:func:`regenerate`), so a saved case replays.
* :func:`adapter_grid` is the stratified grid: every M of :data:`M_VALUES` (bucket edges from 1 to
  4096) with every shape of :data:`SHAPES` the op accepts, the scales and dtypes cycled along it.
* :func:`run_adapter_case` is the consumer's door (plan → allocate → poison → bind → run), judged
  by :func:`oracle.judge.tolerance.judge_gemm` against ``scale · x @ W`` with ``W`` from the
  format's reference mapping; a failure saves its inputs and output (``kind: "adapter"``).
* :func:`run_adapter_graph` runs :class:`oracle.run.graph_protocol.GraphProtocol` over each
  (op, format, dtype) on a small problem: replay bitwise equal to eager under poisoning, no
  allocation, each eager output judged (:class:`CudaBackend` on a GPU, else the simulated one).
* :func:`replay_adapter_case` re-judges a saved file: inputs checked against the id bit for bit,
  then the kernel rerun (CUDA, adapter available) or the saved output judged again.

Invariants: the reference weight comes from the format's ``reference_weight`` (reference code),
never from the kernel; scales are powers of two, so ``scale · (x @ W)`` is judged exactly as
``x @ (scale · W)``; a crash is the case's failure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
from pathlib import Path
from typing import Any

import torch

from oracle.adapters import AdapterError, KernelAdapter, WeightFormat, load_adapter
from oracle.judge.tolerance import judge_gemm
from oracle.report.report import CheckResult
from oracle.report.results import (
    CaseFileError,
    LoadedCase,
    replay_command,
    same_bits,
    save_case,
)
from oracle.run.graph_protocol import ConsumerFixture, CudaBackend, GraphProtocol, SimulatedBackend
from oracle.run.runners.common import poison

__all__ = [
    "M_VALUES",
    "SHAPES",
    "AdapterCase",
    "adapter_grid",
    "parse_adapter_case_id",
    "reference_weight",
    "regenerate",
    "replay_adapter_case",
    "run_adapter_case",
    "run_adapter_graph",
    "saved_adapter_case",
]

#: M bucket edges: one token, warp and tile edges, decode to prefill.
M_VALUES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256,
            257, 511, 512, 1000, 1024, 2047, 2048, 4096)  # fmt: skip
#: (K, N) shapes: the smallest legal tile up to a 4096-deep reduction.
SHAPES = ((64, 128), (128, 256), (256, 128), (512, 384), (1024, 1024), (2048, 512),
          (3072, 256), (4096, 1024))  # fmt: skip
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_ID = re.compile(
    r"^(?P<adapter>[A-Za-z0-9]+)-(?P<op>[a-z0-9]+)-(?P<fmt>[A-Za-z0-9]+)-(?P<dtype>bf16|fp16)"
    r"_m(?P<m>\d+)_k(?P<k>\d+)_n(?P<n>\d+)_a(?P<a>-?\d+)_s(?P<s>\d+)$"
)


@dataclasses.dataclass(frozen=True)
class AdapterCase:
    """One adapted-kernel grid point (module docstring)."""

    adapter: str
    op: str
    fmt: str
    dtype: str
    m: int
    k: int
    n: int
    scale_exp: int
    seed: int

    @property
    def case_id(self) -> str:
        return (
            f"{self.adapter}-{self.op}-{self.fmt}-{self.dtype}_m{self.m}_k{self.k}_n{self.n}"
            f"_a{self.scale_exp}_s{self.seed}"
        )

    @property
    def scale(self) -> float:
        return 2.0**self.scale_exp

    @property
    def compute_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def problem(self) -> dict[str, Any]:
        return {"m": self.m, "k": self.k, "n": self.n, "format": self.fmt,
                "compute_dtype": self.compute_dtype, "scale": self.scale}  # fmt: skip


def parse_adapter_case_id(case_id: str) -> AdapterCase:
    """Inverse of :attr:`AdapterCase.case_id` (ValueError naming the expected form)."""
    match = _ID.match(case_id) if isinstance(case_id, str) else None
    if match is None:
        raise ValueError(
            f"adapter case id {case_id!r}: expected <adapter>-<op>-<format>-<bf16|fp16>"
            "_m<M>_k<K>_n<N>_a<scale exponent>_s<seed>"
        )
    ints = {f: int(match[f]) for f in ("m", "k", "n", "a", "s")}
    return AdapterCase(match["adapter"], match["op"], match["fmt"], match["dtype"], ints["m"],
                       ints["k"], ints["n"], ints["a"], ints["s"])  # fmt: skip


def _dtype_name(dtype: torch.dtype) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise AdapterError(f"compute dtype {dtype} is not bf16 or fp16")


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def adapter_grid(adapter: KernelAdapter) -> list[AdapterCase]:
    """Every (M, shape) the adapter's ops accept, per op and format; scales and compute dtypes
    cycle along the grid so that each appears at every shape (module docstring)."""
    label = adapter.name
    out = []
    for op in adapter.ops:
        for fmt_name in op.formats:
            fmt = adapter.formats[fmt_name]
            variants = [(d, s) for d in op.compute_dtypes for s in op.scales]
            for i, (m, (k, n)) in enumerate((m, s) for m in M_VALUES for s in SHAPES):
                if op.refusal(fmt, m=m, k=k, n=n) is not None:
                    continue
                dtype, scale = variants[i % len(variants)]
                exp = _scale_exponent(scale)
                point = f"{label}/{op.name}/{fmt_name}/{m}/{k}/{n}"
                out.append(AdapterCase(label, op.name, fmt_name, _dtype_name(dtype), m, k, n,
                                       exp, _seed(point) % 100_000))  # fmt: skip
    return out


def _scale_exponent(scale: float) -> int:
    mantissa, exponent = math.frexp(scale)
    if mantissa != 0.5:
        raise AdapterError(f"scale {scale} is not a power of two (the judge needs it exact)")
    return exponent - 1


def regenerate(adapter: KernelAdapter, case: AdapterCase, device: Any) -> dict[str, torch.Tensor]:
    """The case's inputs, from its id alone: ``x [M, K]`` (normal, compute dtype) and the format's
    random weight tensors."""
    generator = torch.Generator().manual_seed(case.seed)
    fmt = _format(adapter, case)
    weights = fmt.random_weights(k=case.k, n=case.n, generator=generator)
    x = torch.randn(case.m, case.k, generator=generator).to(case.compute_dtype)
    return {k: t.to(device) for k, t in {"x": x, **weights}.items()}


def _format(adapter: KernelAdapter, case: AdapterCase) -> WeightFormat:
    if case.adapter != adapter.name:
        raise AdapterError(f"case {case.case_id} is not a case of adapter {adapter.name!r}")
    op = adapter.op(case.op)
    if case.fmt not in op.formats:
        raise AdapterError(f"op {case.op!r} of {adapter.name!r} has no format {case.fmt!r}")
    return adapter.formats[case.fmt]


def _judge(adapter, case, inputs, y):
    w = reference_weight(adapter, case, inputs).to(y.device)
    return judge_gemm(y, inputs["x"], w, compute_dtype=case.compute_dtype)


def _execute(adapter, case, inputs, device) -> torch.Tensor:
    op = adapter.op(case.op)
    graph_op = op.graph_op()
    plan = graph_op.plan(case.problem())
    buffers = dict(op.allocate(plan, device))
    for buffer in buffers.values():  # the output and any scratch: an unwritten element shows
        poison(buffer)
    graph_op.run(graph_op.bind(plan, buffers), inputs)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return buffers["output"]


def run_adapter_case(
    adapter: KernelAdapter,
    case: AdapterCase,
    *,
    device: Any,
    results_dir: Path,
    kernel: str | None = None,
) -> CheckResult:
    """One case through the adapter's door, judged (module docstring). ``kernel``: how the
    adapter was named (``--kernel``), saved so that replay finds it again."""
    name = f"adapter.{case.adapter}.{case.op}.{case.case_id}"
    start = time.perf_counter()
    try:
        inputs = regenerate(adapter, case, device)
        y = _execute(adapter, case, inputs, device)
        verdict = _judge(adapter, case, inputs, y)
    except Exception as exc:  # noqa: BLE001 - the case fails with the exception's text
        return CheckResult(name, "gpu", "fail", f"raised {type(exc).__name__}: {exc}")
    metrics = {**verdict.metrics.to_dict(), "kernel": adapter.name, "m": case.m, "k": case.k,
               "n": case.n, "case_wall_s": round(time.perf_counter() - start, 4)}  # fmt: skip
    if verdict.passed:
        return CheckResult(name, "gpu", "pass", "", metrics)
    meta = {"case_id": case.case_id, "kind": "adapter", "kernel": kernel or adapter.name,
            "execution": name, "verdict": verdict.to_dict()}  # fmt: skip
    try:
        tail = " — replay: " + replay_command(save_case(meta, {**inputs, "y": y}, results_dir))
    except Exception as exc:  # noqa: BLE001 - never mask the verdict
        tail = f" — could not save the case: {type(exc).__name__}: {exc}"
    return CheckResult(name, "gpu", "fail", verdict.reason + tail, metrics)


def run_adapter_graph(adapter: KernelAdapter, *, device: Any) -> list[CheckResult]:
    """The CUDA-graph protocol over every (op, format, dtype), two input sets (module docstring)."""
    out = []
    for op in adapter.ops:
        for fmt_name in op.formats:
            for dtype in op.compute_dtypes:
                cases = [AdapterCase(adapter.name, op.name, fmt_name, _dtype_name(dtype), 8, 256,
                                     256, 0, seed) for seed in (1, 2)]  # fmt: skip
                out.append(_graph_check(adapter, op, cases, device))
    return out


def _graph_check(adapter, op, cases, device) -> CheckResult:
    case = cases[0]
    name = f"adapter.{adapter.name}.graph.{op.name}.{case.fmt}.{case.dtype}"
    try:
        graph_op = op.graph_op()
        sets = [regenerate(adapter, c, device) for c in cases]
        buffers = dict(op.allocate(graph_op.plan(case.problem()), device))
        fixture = ConsumerFixture(
            buffers, {k: torch.empty_like(t) for k, t in sets[0].items()}, sets,
            outputs=("output",), scratch=tuple(b for b in buffers if b != "output"),
        )  # fmt: skip

        def judge(got, inputs):
            verdict = _judge(adapter, case, inputs, got)
            return verdict.passed, verdict.reason

        cuda = torch.device(device).type == "cuda"
        verdict = GraphProtocol(
            graph_op, case.problem(), fixture, CudaBackend() if cuda else SimulatedBackend(),
            replays=4, reference=lambda s: {"output": s}, judge=judge,
        ).run()  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a crash is this check's failure
        return CheckResult(name, "gpu", "fail", f"raised {type(exc).__name__}: {exc}")
    metrics = {**verdict.metrics, "steps": {s.name: s.status for s in verdict.steps}}
    status = "pass" if verdict.passed else "fail"
    return CheckResult(name, "gpu", status, "; ".join(verdict.reasons), metrics)


def saved_adapter_case(
    loaded: LoadedCase,
) -> tuple[KernelAdapter, AdapterCase, dict[str, torch.Tensor]]:
    """``(adapter, case, inputs)`` of a file saved by :func:`run_adapter_case`, after checking that
    every saved input equals what its id regenerates (:class:`CaseFileError` otherwise)."""
    where = str(loaded.path)
    kernel = loaded.meta.get("kernel")
    if not isinstance(kernel, str) or not kernel:
        raise CaseFileError(f"{where}: an adapter case names no kernel")
    try:
        adapter = load_adapter(kernel)
        case = parse_adapter_case_id(loaded.meta["case_id"])
        want = regenerate(adapter, case, "cpu")
    except (ValueError, AdapterError) as exc:
        raise CaseFileError(f"{where}: {exc}") from None
    if set(loaded.tensors) != {*want, "y"}:
        raise CaseFileError(f"{where}: tensors {sorted(loaded.tensors)} are not {sorted(want)} + y")
    for key, tensor in want.items():
        if not same_bits(loaded.tensors[key], tensor):
            raise CaseFileError(f"{where}: saved `{key}` is not the input {case.case_id} makes")
    return adapter, case, want


def reference_weight(adapter: KernelAdapter, case: AdapterCase, inputs) -> torch.Tensor:
    """``scale · W [K, N]`` in float64, from the format's reference mapping."""
    weights = {k: t for k, t in inputs.items() if k != "x"}
    w = _format(adapter, case).reference_weight(weights).to(torch.float64)
    return w * case.scale


def replay_adapter_case(loaded: LoadedCase, *, cuda: bool) -> CheckResult:
    """Re-judge a saved adapter case (module docstring); :class:`CaseFileError` when the file
    disagrees with its id."""
    adapter, case, inputs = saved_adapter_case(loaded)
    execution = loaded.meta.get("execution") or f"adapter.{case.adapter}.{case.op}.{case.case_id}"
    if cuda and adapter.unavailable() is None:
        result = run_adapter_case(adapter, case, device="cuda", results_dir=loaded.path.parent,
                                  kernel=loaded.meta["kernel"])  # fmt: skip
        why = f"kernel rerun on CUDA; {result.reason or 'within tolerance'}"
        return CheckResult(f"replay.{result.name}", "gpu", result.status, why, result.metrics)
    verdict = _judge(adapter, case, inputs, loaded.tensors["y"])
    why = "saved kernel output (references only); " + (verdict.reason or "within tolerance")
    status = "pass" if verdict.passed else "fail"
    return CheckResult(f"replay.{execution}", "cpu", status, why, verdict.metrics.to_dict())
