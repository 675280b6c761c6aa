"""plan / bind / run of the decode op (b12x.ops.decode): the buffer contract, validation before any
launch, no allocation in run, and the graph protocol on CPU (stand-in kernel) and on the GPU.

The buffer table (one fp16 ``output`` [K, N]) and the payload shape ``[K/16, N/16, 16·bits]``
are written from spec §1.2/§1.5, not read back from the plan.
"""

from __future__ import annotations

import pytest
import torch

from b12x.formats import FORMATS
from b12x.ops.decode import (
    DecodeOp,
    allocate_decode_buffers,
    bind_decode,
    plan_decode,
    run_decode,
)
from b12x.ops.decode import plan as decode_mod
from b12x.runtime import compile_cache as cc
from b12x.runtime.scratch import BufferNotProvided
from oracle.judge.tiles import SimulatedDevice
from oracle.run.graph_protocol import ConsumerFixture, GraphProtocol, SimulatedBackend

H200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))


@pytest.fixture(autouse=True)
def _restore_freeze():
    yield
    cc.unfreeze()


@pytest.mark.parametrize(
    ("codebook", "bits"), [(c, b) for c, f in FORMATS.items() for b in f.legal_bits]
)
def test_plan_has_one_fp16_output_k_by_n(codebook, bits):
    plan = plan_decode(k=64, n=128, bits=bits, codebook=codebook)
    assert [(b.name, b.shape, b.dtype, b.role) for b in plan.buffers] == [
        ("output", (64, 128), torch.float16, "output")
    ]
    assert plan.problem.payload_shape == (4, 8, 16 * bits)
    assert [(s.kind, s.codebook, s.bits) for s in plan.kernel_specs] == [("decode", codebook, bits)]


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"k": 0}, ValueError, "k: expected a positive int"),
        ({"k": 40}, ValueError, "k: expected a multiple of 16"),
        ({"n": 8}, ValueError, "n: expected a multiple of 16"),
        ({"n": True}, TypeError, "n:"),
        ({"bits": 4.0}, TypeError, "bits"),
        ({"bits": 9}, ValueError, "bits"),
        ({"codebook": "sqg_fp16", "bits": 4}, ValueError, "bits"),
        ({"codebook": "exl2"}, ValueError, "codebook"),
        ({"codebook": None}, TypeError, "codebook"),
    ],
)
def test_plan_rejects_bad_arguments_naming_them(overrides, error, match):
    args = dict(k=64, n=128, bits=4, codebook="mcg")
    with pytest.raises(error, match=match):
        plan_decode(**{**args, **overrides})


def test_plan_is_keyword_only():
    with pytest.raises(TypeError):
        plan_decode(64, 128, 4, "mcg")  # type: ignore[misc]


def test_bind_keeps_the_output_by_identity_and_checks_it():
    plan = plan_decode(k=64, n=128, bits=4, codebook="mcg")
    buffers = allocate_decode_buffers(plan, "cpu")
    bound = bind_decode(plan, **buffers)
    assert bound.buffers["output"] is buffers["output"]
    with pytest.raises(BufferNotProvided, match=r"output `output`: expected shape \(64, 128\)"):
        bind_decode(plan, output=torch.empty(64, 127, dtype=torch.float16))
    with pytest.raises(BufferNotProvided, match="expected dtype torch.float16"):
        bind_decode(plan, output=torch.empty(64, 128, dtype=torch.bfloat16))
    with pytest.raises(BufferNotProvided, match="`output` is missing"):
        bind_decode(plan)
    with pytest.raises(ValueError, match=r"unknown buffer name\(s\) \['out'\]"):
        bind_decode(plan, **buffers, out=torch.empty(1))
    with pytest.raises(TypeError, match="plan"):
        bind_decode(object(), **buffers)


class FakeDecode:
    def __init__(self):
        self.calls = []

    def __call__(self, trellis, codebook, *, out):
        self.calls.append((trellis, codebook, out))
        count = min(out.numel(), trellis.numel())  # in place: words -> fp16 values, rest zero
        out.zero_()
        out.view(-1).narrow(0, 0, count).copy_(trellis.view(-1).narrow(0, 0, count))


@pytest.fixture
def fake_decode(monkeypatch):
    fake = FakeDecode()
    monkeypatch.setattr(decode_mod.launchers, "decode_weight", fake)
    return fake


def _payload(k, n, bits, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**10), 2**10, (k // 16, n // 16, 16 * bits), generator=g)
    return words.to(torch.int16)


def test_run_launches_into_the_bound_output(fake_decode):
    plan = plan_decode(k=64, n=128, bits=4, codebook="sqg_e4m3")
    buffers = allocate_decode_buffers(plan, "cpu")
    trellis = _payload(64, 128, 4)
    out = run_decode(bind_decode(plan, **buffers), trellis)
    assert out is buffers["output"]
    (call,) = fake_decode.calls
    assert call[0] is trellis and call[1] == "sqg_e4m3" and call[2] is buffers["output"]


def test_run_validates_before_any_launch(fake_decode):
    plan = plan_decode(k=64, n=128, bits=4, codebook="mcg")
    bound = bind_decode(plan, **allocate_decode_buffers(plan, "cpu"))
    good = _payload(64, 128, 4)
    bad = [
        (good.to(torch.int32), TypeError, "trellis: expected dtype torch.int16"),
        (good[:, :, :48].contiguous(), ValueError, r"trellis: expected shape \(4, 8, 64\)"),
        (_payload(64, 128, 3), ValueError, "trellis: expected shape"),
        (good.transpose(0, 1), ValueError, "trellis"),
        (good.to("meta"), ValueError, "trellis: expected device cpu"),
        (None, TypeError, "trellis: expected a torch.Tensor"),
    ]
    for trellis, error, match in bad:
        with pytest.raises(error, match=match):
            run_decode(bound, trellis)
    with pytest.raises(TypeError, match="bound"):
        run_decode(plan, good)
    assert fake_decode.calls == []


def test_cpu_graph_protocol_passes(monkeypatch, fake_decode):
    backend = SimulatedBackend()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: backend.capturing)
    problem = dict(k=64, n=128, bits=4, codebook="mcg")
    op = DecodeOp(H200)
    plan = op.plan(problem)
    fixture = ConsumerFixture(
        allocate_decode_buffers(plan, "cpu"),
        {"trellis": _payload(64, 128, 4, seed=0)},
        [{"trellis": _payload(64, 128, 4, seed=s)} for s in (1, 2)],
        outputs=("output",),
    )
    verdict = GraphProtocol(op, problem, fixture, backend).run()
    assert verdict.passed, verdict.reasons
    assert verdict.step("misuse.compile_in_capture").status == "pass"


def test_cpu_graph_protocol_catches_an_allocating_run(monkeypatch):
    backend = SimulatedBackend()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: backend.capturing)

    def allocating(trellis, codebook, *, out):
        out.copy_(torch.zeros(out.shape, dtype=out.dtype))  # a fresh tensor inside run

    monkeypatch.setattr(decode_mod.launchers, "decode_weight", allocating)
    problem = dict(k=64, n=128, bits=4, codebook="mcg")
    op = DecodeOp(H200)
    fixture = ConsumerFixture(
        allocate_decode_buffers(op.plan(problem), "cpu"),
        {"trellis": _payload(64, 128, 4)},
        [{"trellis": _payload(64, 128, 4, seed=1)}],
        outputs=("output",),
    )
    verdict = GraphProtocol(op, problem, fixture, backend).run()
    assert verdict.step("capture").status == "fail"


def test_graph_op_rejects_bad_mappings():
    op = DecodeOp(H200)
    with pytest.raises(TypeError, match="problem"):
        op.plan([("k", 64)])
    plan = op.plan(dict(k=64, n=128, bits=4, codebook="mcg"))
    with pytest.raises(TypeError, match="buffers"):
        op.bind(plan, None)
    bound = op.bind(plan, allocate_decode_buffers(plan, "cpu"))
    with pytest.raises(ValueError, match="trellis"):
        op.run(bound, {})


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("codebook", "bits"), [(c, b) for c, f in FORMATS.items() for b in f.legal_bits]
)
def test_gpu_decode_op_is_bit_exact(codebook, bits):
    from reference import trellis as ref_trellis

    trellis = torch.randint(
        -(2**15), 2**15, (4, 8, 16 * bits), generator=torch.Generator().manual_seed(bits)
    ).to(torch.int16)
    plan = plan_decode(k=64, n=128, bits=bits, codebook=codebook)
    bound = bind_decode(plan, **allocate_decode_buffers(plan, "cuda"))
    got = run_decode(bound, trellis.cuda())
    assert torch.equal(got.cpu(), ref_trellis.decode(trellis, codebook))


@pytest.mark.gpu
@pytest.mark.graph
def test_gpu_graph_protocol_passes():
    from oracle.run.graph_protocol import CudaBackend

    problem = dict(k=64, n=128, bits=6, codebook="sqg_fp16")
    op = DecodeOp()
    plan = op.plan(problem)
    sets = [{"trellis": _payload(64, 128, 6, seed=s).cuda()} for s in (1, 2)]
    fixture = ConsumerFixture(
        allocate_decode_buffers(plan, "cuda"),
        {"trellis": _payload(64, 128, 6).cuda()},
        sets,
        outputs=("output",),
    )
    verdict = GraphProtocol(op, problem, fixture, CudaBackend()).run()
    assert verdict.passed, verdict.reasons
