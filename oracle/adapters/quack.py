"""The first adapter: quack-kernels' W4A16 trellis GEMM, ``gemm_w4a16(act, blob, wformat="qtip")``.

One op, ``gemm``: ``out[M, N] = tensor_scale · act[M, K] @ W[N, K]^T`` with ``act`` bf16,
``out`` bf16 and ``W`` decoded in registers from the QTIP blob ``uint8 [N/64, K/64, 128, 16]``
(format ``qtip``, docs/format.md §8). In the oracle's terms the weight is ``W^T [K, N]``,
decoded by :func:`reference.qtip.decode` from the same blob. quack pads N to a multiple of 128
only into an output it allocates itself, which a graph-captured consumer cannot use, so the
adapter takes N in multiples of 128 and K in multiples of 64 (the blob's tile). quack is an
optional peer (``pip install quack-kernels==0.6.5``), imported only when a case runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from oracle.adapters import AdapterOp, KernelAdapter, WeightFormat
from reference import qtip

__all__ = ["ADAPTER"]

_MODULE = "quack.gemm_w4"


def _unavailable() -> str | None:
    try:
        import quack.gemm_w4  # noqa: F401 - the availability probe
    except Exception as exc:  # noqa: BLE001 - any import failure is "not here", said in one line
        if isinstance(exc, ModuleNotFoundError) and exc.name == "quack":
            return "quack-kernels is not installed (pip install quack-kernels==0.6.5)"
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"quack does not import here ({type(exc).__name__}: {first})"
    if not torch.cuda.is_available():
        return "quack's gemm_w4a16 needs a CUDA device and this machine has none"
    major, _ = torch.cuda.get_device_capability()
    if major < 9:
        return f"quack's gemm_w4a16 needs sm_90 or newer, this GPU is sm_{major}x"
    return None


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("quack-kernels")
    except Exception:  # noqa: BLE001 - not installed
        return None


def _random_blob(*, k: int, n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Any 16 bytes are a legal stream (every 16-bit window is a state)."""
    shape = (n // 64, k // 64, 128, 16)
    return {"blob": torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)}


def _reference_weight(weights: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return qtip.decode(weights["blob"]).t()  # on the blob's device


@dataclasses.dataclass(frozen=True)
class _Plan:
    m: int
    k: int
    n: int
    scale: float


@dataclasses.dataclass(frozen=True)
class _Bound:
    plan: _Plan
    output: torch.Tensor


class _GemmOp:
    """The graph-op protocol over ``gemm_w4a16`` (:mod:`oracle.run.graph_protocol`)."""

    name = "quack.gemm_w4a16"

    def plan(self, problem: Mapping[str, Any]) -> _Plan:
        if problem.get("format") != "qtip" or problem.get("compute_dtype") != torch.bfloat16:
            raise ValueError("quack gemm: format 'qtip' with bf16 compute only")
        return _Plan(problem["m"], problem["k"], problem["n"], float(problem["scale"]))

    def bind(self, plan: _Plan, buffers: Mapping[str, torch.Tensor]) -> _Bound:
        if "output" not in buffers:
            raise KeyError("quack gemm: buffer `output` is missing")
        out = buffers["output"]
        if tuple(out.shape) != (plan.m, plan.n) or out.dtype != torch.bfloat16:
            raise ValueError(f"quack gemm: output must be bf16 [{plan.m}, {plan.n}]")
        return _Bound(plan, out)

    def run(self, bound: _Bound, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        from quack.gemm_w4 import gemm_w4a16  # lazy: quack patches CuTe DSL on import

        gemm_w4a16(
            inputs["x"], inputs["blob"], tensor_scale=bound.plan.scale, out=bound.output,
            wformat="qtip",
        )  # fmt: skip
        return bound.output

    def freeze(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # quack keeps its own compile cache; nothing to pin


def _allocate(plan: _Plan, device: Any) -> dict[str, torch.Tensor]:
    return {"output": torch.empty(plan.m, plan.n, dtype=torch.bfloat16, device=device)}


QTIP = WeightFormat("qtip", _random_blob, _reference_weight, k_multiple=64, n_multiple=128)

ADAPTER = KernelAdapter(
    name="quack",
    formats={"qtip": QTIP},
    ops=(
        AdapterOp(
            "gemm",
            formats=("qtip",),
            compute_dtypes=(torch.bfloat16,),
            graph_op=_GemmOp,
            allocate=_allocate,
            max_m=1 << 16,
            scales=(1.0, 0.5, 2.0),
        ),
    ),  # fmt: skip
    unavailable=_unavailable,
    version=_version,
)
