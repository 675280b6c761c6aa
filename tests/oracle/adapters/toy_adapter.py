"""A CPU kernel behind the adapter contract, for the adapter tests (docs/adapters.md).

Format ``plain``: the weight itself, ``W [K, N]`` fp16 (the reference mapping is the
identity). The "kernel" multiplies in fp32 scratch, like a tensor core with fp32 accumulation,
and allocates nothing when it runs (its scratch comes from ``allocate``, as a capture-safe
kernel's must). ``FAULT`` plants one defect at a time (the tests set it):
``"weight"`` one wrong weight, ``"unwritten"`` the last output row left as it was, ``"scale"``
the scale applied twice, ``"allocate"`` a fresh output each call (not capture-safe).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from oracle.adapters import AdapterOp, KernelAdapter, WeightFormat

FAULT: str | None = None


def _random(*, k, n, generator):
    """Multiples of 1/8 in [-8, 8): exact in fp16 and bf16, whichever the op computes in."""
    return {"w": (torch.randint(-64, 64, (k, n), generator=generator) / 8).to(torch.float16)}


def _reference(weights):
    return weights["w"]


@dataclasses.dataclass(frozen=True)
class _Plan:
    m: int
    k: int
    n: int
    scale: float
    dtype: torch.dtype


class _Op:
    name = "toy.gemm"

    def plan(self, problem):
        return _Plan(problem["m"], problem["k"], problem["n"], problem["scale"],
                     problem["compute_dtype"])  # fmt: skip

    def bind(self, plan, buffers):
        for name in ("output", "xf", "wf", "acc"):
            if name not in buffers:
                raise KeyError(f"toy gemm: buffer `{name}` is missing")
        return plan, buffers

    def run(self, bound, inputs):
        plan, b = bound
        b["xf"].copy_(inputs["x"])
        b["wf"].copy_(inputs["w"])
        if FAULT == "weight":
            b["wf"][b["wf"].shape[0] // 2, -1] += 0.75
        torch.mm(b["xf"], b["wf"], out=b["acc"])
        b["acc"].mul_(plan.scale)
        if FAULT == "scale":
            b["acc"].mul_(plan.scale)
        out = torch.empty_like(b["output"]) if FAULT == "allocate" else b["output"]
        rows = out.shape[0] - 1 if FAULT == "unwritten" else out.shape[0]
        out[:rows].copy_(b["acc"][:rows])
        return out

    def freeze(self):
        return contextlib.nullcontext()


def _allocate(plan, device):
    def fp32(*shape):
        return torch.empty(*shape, dtype=torch.float32, device=device)

    output = torch.empty(plan.m, plan.n, dtype=plan.dtype, device=device)
    return {"output": output, "xf": fp32(plan.m, plan.k), "wf": fp32(plan.k, plan.n),
            "acc": fp32(plan.m, plan.n)}  # fmt: skip


ADAPTER = KernelAdapter(
    name="toy",
    formats={"plain": WeightFormat("plain", _random, _reference, k_multiple=64, n_multiple=128)},
    ops=(
        AdapterOp(
            "gemm",
            formats=("plain",),
            compute_dtypes=(torch.float16, torch.bfloat16),
            graph_op=_Op,
            allocate=_allocate,
            max_m=16,
            scales=(1.0, 0.25),
        ),
    ),  # fmt: skip
    unavailable=lambda: None,
)
