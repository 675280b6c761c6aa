"""plan / bind / run adapters of b12x's host wrappers, for the graph protocol (GPU tier).

Until b12x declares capture-safe ops itself (``b12x.support.graph_ops()`` returning
``(name, op, problem, fixture)`` tuples, the fixture a plain dict with the fields of
:class:`~oracle.graph_protocol.ConsumerFixture`, since b12x never imports oracle), the protocol
runs over these adapters:

* ``decode`` — ``host.decode_weight(trellis, codebook, out=buffers["out"])``;
* ``gemm_split_k`` — ``host.trellis_matmul(a, trellis, codebook, split_k=4, out=..., scratch=...)``
  with a consumer fixture providing exactly ``out`` and ``scratch`` (fp32 ``[4·M·N]``).

``freeze`` / ``unfreeze`` call ``b12x.kernels.specs.freeze``; ``compile_unwarmed`` asks for a
GEMM specialization warm-up never built (``unroll=3``). The adapters add no allocation of their
own; whatever the protocol finds (e.g. a wrapper that allocates a missing buffer instead of
raising) is b12x's behaviour.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from oracle.graph_protocol import ConsumerFixture

__all__ = ["graph_targets"]

M, K, N, SPLITS = 8, 256, 256, 4
CODEBOOK, BITS = "mcg", 4


class _HostOp:
    def __init__(self, name: str):
        self.name = name

    def plan(self, problem: dict) -> dict:
        return dict(problem)

    def freeze(self) -> None:
        from b12x.kernels.specs import freeze

        freeze(True)

    def unfreeze(self) -> None:
        from b12x.kernels.specs import freeze

        freeze(False)

    def compile_unwarmed(self, plan: dict) -> Any:
        from b12x.kernels.host import device_arch
        from b12x.kernels.specs import KernelSpec, compiled

        spec = KernelSpec("gemm", CODEBOOK, BITS, m_tiles=1, n_tiles=2, unroll=3)
        return compiled(spec, device_arch(torch.device("cuda")))


class _DecodeOp(_HostOp):
    def bind(self, plan: dict, buffers: Any) -> dict:
        return {"out": buffers["out"]}

    def run(self, bound: dict, inputs: dict) -> None:
        from b12x.kernels.host import decode_weight

        decode_weight(inputs["trellis"], CODEBOOK, out=bound["out"])


class _GemmOp(_HostOp):
    def bind(self, plan: dict, buffers: Any) -> dict:
        return {
            "out": buffers["out"],
            "scratch": buffers.get("scratch"),
            "split_k": plan["split_k"],
        }

    def run(self, bound: dict, inputs: dict) -> None:
        from b12x.kernels.host import trellis_matmul

        trellis_matmul(
            inputs["a"],
            inputs["trellis"],
            CODEBOOK,
            split_k=bound["split_k"],
            out=bound["out"],
            scratch=bound["scratch"],
        )


def _payload(gen: torch.Generator) -> torch.Tensor:
    words = torch.randint(-(1 << 15), 1 << 15, (K // 16, N // 16, 16 * BITS), generator=gen)
    return words.to(torch.int16).cuda()


def _adapters() -> list[tuple[str, Any, Any, ConsumerFixture]]:
    gen = torch.Generator().manual_seed(7)
    trellis_sets = [{"trellis": _payload(gen)} for _ in range(2)]
    decode_fixture = ConsumerFixture(
        buffers={"out": torch.zeros(K, N, dtype=torch.float16, device="cuda")},
        inputs={"trellis": torch.zeros_like(trellis_sets[0]["trellis"])},
        input_sets=trellis_sets,
        outputs=("out",),
    )
    a_sets = [
        {"a": (torch.randn(M, K, generator=gen) * 0.1).half().cuda(), "trellis": _payload(gen)}
        for _ in range(2)
    ]
    gemm_fixture = ConsumerFixture(
        buffers={
            "out": torch.zeros(M, N, dtype=torch.float16, device="cuda"),
            "scratch": torch.zeros(SPLITS * M * N, dtype=torch.float32, device="cuda"),
        },
        inputs={k: torch.zeros_like(t) for k, t in a_sets[0].items()},
        input_sets=a_sets,
        outputs=("out",),
        scratch=("scratch",),
    )
    return [
        ("decode", _DecodeOp("decode"), {"k": K, "n": N}, decode_fixture),
        (
            "gemm_split_k",
            _GemmOp("gemm_split_k"),
            {"m": M, "k": K, "n": N, "split_k": SPLITS},
            gemm_fixture,
        ),
    ]


def graph_targets() -> list[tuple[str, Any, Any, ConsumerFixture]]:
    """b12x's declared graph ops when it has them, else the adapters above."""
    try:
        support = importlib.import_module("b12x.support")
    except ImportError:
        support = None
    hook = getattr(support, "graph_ops", None)
    if callable(hook):
        declared = [
            (name, op, problem, fx if isinstance(fx, ConsumerFixture) else ConsumerFixture(**fx))
            for name, op, problem, fx in hook()
        ]
        if declared:
            return declared
    return _adapters()
