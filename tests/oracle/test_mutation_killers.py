"""Tests added because the mutation gate found a survivor (each names the mutant it kills).

* ``seed-shifted-positional-call`` / ``shared-body-relies-on-default`` (R1): the call rules of the
  contract checker over the real b12x, without the signature-lock comparison (the lock has its
  own test, and lock churn while a signature is being changed on purpose must not blind the gate
  to a stale call site).
* ``codebook-default-flipped`` (R11): the CPU stand-in kernels of the plan/bind/run tests ignore
  the codebook, so a launch that silently fell back to a default codebook passed. Here every launch
  of :func:`b12x.dense.run_dense` is spied on and must receive the planned codebook, on every path.
"""

from __future__ import annotations

import pytest
import torch

from b12x.dense import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.dense import plan as plan_mod
from oracle.contracts import check_package, default_root
from oracle.contracts.check import DEFAULT_SLOTS_PATH
from oracle.tiles import SimulatedDevice

RTX = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))
H200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))


class CodebookSpy:
    """Stand-ins for the launches that decode weights; each records the codebook it was given."""

    def __init__(self):
        self.seen = []

    def trellis_matmul(self, *args, **kwargs):
        self.seen.append(("trellis_matmul", kwargs.get("codebook", args[2:3] or None)))
        kwargs["out"].zero_()

    def decode_weight(self, *args, **kwargs):
        self.seen.append(("decode_weight", kwargs.get("codebook", args[1:2] or None)))
        kwargs["out"].zero_()

    @staticmethod
    def rotate(y, s, *, out_dtype, out):
        out.copy_(y)


@pytest.fixture
def spy(monkeypatch):
    fake = CodebookSpy()
    host = plan_mod.host_kernels
    monkeypatch.setattr(host, "trellis_matmul", fake.trellis_matmul)
    monkeypatch.setattr(host, "decode_weight", fake.decode_weight)
    monkeypatch.setattr(host, "rotate_input", fake.rotate)
    monkeypatch.setattr(host, "rotate_output", fake.rotate)
    return fake


def _unwrap(value):
    return value[0] if isinstance(value, tuple | list) else value


@pytest.mark.parametrize(
    ("device", "m", "codebook", "bits", "path"),
    [
        (H200, 8, "mcg", 4, "generic"),
        (H200, 8, "3inst", 3, "generic"),
        (H200, 8, "sqg_fp16", 6, "generic"),
        (RTX, 8, "mcg", 6, "k6_mcg_small_m"),
        (H200, 1040, "mul1", 4, "decode_matmul"),
    ],
)
def test_run_dense_forwards_the_planned_codebook(spy, device, m, codebook, bits, path):
    k = n = 256
    plan = plan_dense(
        m=m, k=k, n=n, bits=bits, codebook=codebook, x_dtype=torch.float16, device=device
    )
    assert plan.path == path
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cpu"))
    x = torch.zeros(m, k, dtype=torch.float16)
    trellis = torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16)
    ones_k, ones_n = torch.ones(k, dtype=torch.float16), torch.ones(n, dtype=torch.float16)
    run_dense(bound, x, trellis, ones_k, ones_n)
    assert spy.seen, "no decoding launch was made"
    assert [(name, _unwrap(cb)) for name, cb in spy.seen] == [
        (name, codebook) for name, _ in spy.seen
    ]


def test_b12x_call_sites_bind_to_their_callees():
    report = check_package(default_root(), slots_path=DEFAULT_SLOTS_PATH)
    assert report.counts["resolved_calls"] > 0
    assert report.violations == [], "\n".join(v.format() for v in report.violations)
