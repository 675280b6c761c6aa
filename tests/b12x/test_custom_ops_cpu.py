"""CPU tier: the custom ops hand EVERY argument through to plan / bind / run unchanged.

``torch.ops.b12x.trellis_dense_linear`` and ``torch.ops.b12x.trellis_moe`` are one front door
each: their real implementation validates, plans, allocates, binds and runs. Here the plan /
allocate / bind / run functions the op modules call are replaced by recorders, and the op's real
implementation (the ``CustomOpDef``'s wrapped function) runs on CPU tensors, and on fake CUDA
tensors (``FakeTensorMode``, no GPU needed). Each plan keyword must equal what the caller passed
(or what the schema's convention maps it to: ``split_k=0`` → ``None``, ``compute_dtype=None`` →
fp16), and run must receive the caller's tensors by identity. A wrapper that drops or swaps an
argument fails here (the planted faults of the module's history: tile dropped, split_k and
compute dtype swapped, a pair choice dropped).
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import b12x.ops.dense.custom_op as dense_ops
import b12x.ops.moe.custom_op as moe_ops

F16, BF16 = torch.float16, torch.bfloat16


class Recorder:
    """Stand-ins for plan / allocate / bind / run that record their arguments."""

    def __init__(self):
        self.calls: dict[str, tuple[tuple, dict]] = {}
        self.plan_obj = types.SimpleNamespace(name="plan")
        self.buffers = {"output": object()}
        self.bound = types.SimpleNamespace(name="bound")
        self.cloned = types.SimpleNamespace(name="a copy of the output")
        self.output = types.SimpleNamespace(name="output", clone=lambda: self.cloned)

    def stand_in(self, name, result):
        def record(*args, **kwargs):
            assert name not in self.calls, f"{name} called twice"
            self.calls[name] = (args, kwargs)
            return result

        return record


@contextlib.contextmanager
def _devices(kind):
    """CPU tensors, or fake CUDA tensors (the op's CUDA path without a GPU)."""
    if kind == "cpu":
        yield "cpu"
    else:
        with FakeTensorMode(allow_non_fake_inputs=False):
            yield "cuda"


# ------------------------------------------------------------------------------- dense linear


@pytest.fixture
def dense_rec(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(dense_ops, "plan_dense", rec.stand_in("plan", rec.plan_obj))
    monkeypatch.setattr(dense_ops, "allocate_dense_buffers", rec.stand_in("allocate", rec.buffers))
    monkeypatch.setattr(dense_ops, "bind_dense", rec.stand_in("bind", rec.bound))
    monkeypatch.setattr(dense_ops, "run_dense", rec.stand_in("run", rec.output))
    return rec


DENSE_CASES = [
    # (x_dtype, codebook, bits, bias, tile, split_k, compute_dtype)
    (F16, "mcg", 6, False, None, 0, None),
    (BF16, "mcg", 4, True, [64, 256, 256], 3, torch.bfloat16),
    (F16, "sqg_e4m3", 3, True, [64, 128, 128], 0, torch.float16),
    (BF16, "sqg_fp16", 5, False, None, 7, torch.float16),
    (F16, "3inst", 2, False, (128, 64, 128), 1, torch.bfloat16),
]


@pytest.mark.parametrize("kind", ["cpu", "fake_cuda"])
@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: f"{c[1]}{c[2]}-{c[4]}-{c[5]}")
def test_dense_op_hands_every_argument_to_plan_and_run(dense_rec, kind, case):
    x_dtype, codebook, bits, with_bias, tile, split_k, compute_dtype = case
    m, k, n = 5, 256, 384
    with _devices(kind) as dev:
        x = torch.zeros(m, k, dtype=x_dtype, device=dev)
        trellis = torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16, device=dev)
        suh = torch.ones(k, dtype=F16, device=dev)
        svh = torch.ones(n, dtype=F16, device=dev)
        bias = torch.ones(n, dtype=F16, device=dev) if with_bias else None
        y = dense_ops.trellis_dense_linear._init_fn(
            x, trellis, suh, svh, codebook, bias, tile, split_k, compute_dtype
        )
    rec = dense_rec
    assert y is rec.output
    args, plan_kw = rec.calls["plan"]
    assert args == ()
    assert plan_kw == {
        "m": m,
        "k": k,
        "n": n,
        "bits": bits,
        "codebook": codebook,
        "x_dtype": x_dtype,
        "compute_dtype": compute_dtype or F16,
        "external_rotation": False,
        "tile": None if tile is None else list(tile),
        "split_k": split_k or None,
        "device": x.device,
    }
    assert rec.calls["allocate"] == ((rec.plan_obj, x.device), {})
    bind_args, bind_kw = rec.calls["bind"]
    assert bind_args == (rec.plan_obj,) and bind_kw == rec.buffers
    run_args, run_kw = rec.calls["run"]
    assert run_args[0] is rec.bound
    assert all(a is b for a, b in zip(run_args[1:], (x, trellis, suh, svh), strict=True))
    assert set(run_kw) == {"bias"} and run_kw["bias"] is bias


def test_dense_op_validates_before_planning(dense_rec):
    x = torch.zeros(5, 256, dtype=F16)
    trellis = torch.zeros(16, 24, 64, dtype=torch.int16)
    ones = torch.ones(256, dtype=F16)
    with pytest.raises(ValueError, match="svh"):
        dense_ops.trellis_dense_linear._init_fn(x, trellis, ones, ones, "mcg")
    assert dense_rec.calls == {}


def test_dense_fake_impl_returns_m_by_n_on_fake_cuda():
    with FakeTensorMode():
        x = torch.zeros(3, 256, dtype=BF16, device="cuda")
        trellis = torch.zeros(16, 8, 64, dtype=torch.int16, device="cuda")
        suh = torch.ones(256, dtype=F16, device="cuda")
        svh = torch.ones(128, dtype=F16, device="cuda")
        y = torch.ops.b12x.trellis_dense_linear(x, trellis, suh, svh, "mcg")
        assert (tuple(y.shape), y.dtype, y.device.type) == ((3, 128), BF16, "cuda")
        with pytest.raises(ValueError, match="tile"):
            torch.ops.b12x.trellis_dense_linear(x, trellis, suh, svh, "mcg", None, [0, 64, 128])
        with pytest.raises(ValueError, match="suh: expected device"):
            torch.ops.b12x.trellis_dense_linear(x, trellis, suh.to("cpu"), svh, "mcg")


def test_dense_op_on_cpu_tensors_raises_naming_x():
    x = torch.zeros(3, 256, dtype=F16)
    args = (x, torch.zeros(16, 8, 64, dtype=torch.int16), torch.ones(256, dtype=F16))
    with pytest.raises(ValueError, match="x: .*CUDA"):
        torch.ops.b12x.trellis_dense_linear(*args, torch.ones(128, dtype=F16), "mcg")


# ------------------------------------------------------------------------------------- MoE


@pytest.fixture
def moe_rec(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(moe_ops, "plan_moe", rec.stand_in("plan", rec.plan_obj))
    monkeypatch.setattr(moe_ops, "plan_tiered_moe", rec.stand_in("plan", rec.plan_obj))
    monkeypatch.setattr(moe_ops, "allocate_moe_buffers", rec.stand_in("allocate", rec.buffers))
    monkeypatch.setattr(moe_ops, "bind_moe", rec.stand_in("bind", rec.bound))
    monkeypatch.setattr(moe_ops, "run_moe", rec.stand_in("run", rec.output))
    return rec


H, I, E, TOP_K, M = 256, 512, 6, 2, 3
RATE_SUM = {"P22": 4, "P33": 6, "P24": 6, "P43": 7, "P44": 8, "dynamic": 6}  # b_lo + b_hi


def _moe_args(dev, *, layout, x_dtype, bits=4, codebook="mcg", pairs=(None, None), tiers=False):
    z = lambda *shape, dtype=F16: torch.zeros(*shape, dtype=dtype, device=dev)  # noqa: E731
    fc1_pair, fc2_pair = pairs
    stacks = [(3, 2), (4, 4)] if tiers else [(bits, E)]  # (bits, experts) per tier
    w13, w2 = [], []
    for b, e in stacks:
        if fc1_pair is not None:
            words = (H // 16) * (I // 256) * 128 * RATE_SUM[fc1_pair]  # one projection
            shape = (e, 2 * words) if layout == "packed" else (2, e, words)
            w13.append(z(*shape, dtype=torch.int16))
        elif layout == "packed":
            w13.append(z(e, H // 16, 2 * I // 16, 16 * b, dtype=torch.int16))
        else:
            w13.append(z(2, e, H // 16, I // 16, 16 * b, dtype=torch.int16))
        if fc2_pair is not None:
            words = (I // 256) * (H // 16) * 128 * RATE_SUM[fc2_pair]
            w2.append(z(e, words, dtype=torch.int16))
        else:
            w2.append(z(e, I // 16, H // 16, 16 * b, dtype=torch.int16))
    experts = sum(e for _, e in stacks)
    return dict(
        x=z(M, H, dtype=x_dtype),
        topk_weights=z(M, TOP_K, dtype=torch.float32),
        topk_ids=z(M, TOP_K, dtype=torch.int32),
        w13=w13,
        w2=w2,
        gate_suh=z(experts, H),
        up_suh=z(experts, H) if layout == "proj" else None,
        intermediate_rotations=z(experts, 3 * I),
        down_svh=z(experts, H),
        codebook=codebook,
        w13_layout=layout,
        global_to_combined=z(10, dtype=torch.int32) if tiers else None,
        descriptor_map=z(experts, dtype=torch.int32) if tiers else None,
        compute_dtype=None,
        fc1_pair=fc1_pair,
        fc2_pair=fc2_pair,
        fc1_modes=z(E, dtype=torch.int32) if fc1_pair == "dynamic" else None,
        fc2_modes=z(E, dtype=torch.int32) if fc2_pair == "dynamic" else None,
    )


MOE_CASES = {
    "uniform_packed_fp16": dict(layout="packed", x_dtype=F16),
    "uniform_proj_bf16_sqg": dict(layout="proj", x_dtype=BF16, bits=3, codebook="sqg_e4m3"),
    "pairs_p24_dynamic": dict(layout="packed", x_dtype=F16, bits=3, pairs=("P24", "dynamic")),
    "pairs_fc2_only": dict(layout="proj", x_dtype=BF16, bits=3, pairs=(None, "P43")),
    "pairs_fc1_dynamic": dict(layout="proj", x_dtype=F16, bits=3, pairs=("dynamic", None)),
    "tiers_packed": dict(layout="packed", x_dtype=F16, tiers=True),
    "tiers_proj_bf16": dict(layout="proj", x_dtype=BF16, tiers=True),
}


@pytest.mark.parametrize("kind", ["cpu", "fake_cuda"])
@pytest.mark.parametrize("compute_dtype", [None, F16, BF16])
@pytest.mark.parametrize("name", sorted(MOE_CASES))
def test_moe_op_hands_every_argument_to_plan_and_run(moe_rec, kind, compute_dtype, name):
    spec = MOE_CASES[name]
    with _devices(kind) as dev:
        args = _moe_args(dev, **spec)
        args["compute_dtype"] = compute_dtype
        y = moe_ops.trellis_moe._init_fn(**args)
    rec = moe_rec
    assert y is rec.cloned  # the op returns a copy of run's output view
    plan_args, plan_kw = rec.calls["plan"]
    assert plan_args == ()
    common = {
        "m": M,
        "top_k": TOP_K,
        "hidden": H,
        "intermediate": I,
        "w13_layout": spec["layout"],
        "x_dtype": spec["x_dtype"],
        "compute_dtype": compute_dtype or F16,
    }
    if spec.get("tiers"):
        want = {
            **common,
            "codebook": "mcg",
            "tier0_bits": 3,
            "tier1_bits": 4,
            "tier0_experts": 2,
            "tier1_experts": 4,
            "num_global_experts": 10,
        }
    else:
        want = {
            **common,
            "codebook": spec.get("codebook", "mcg"),
            "bits": spec.get("bits", 4),
            "num_experts": E,
        }
        fc1_pair, fc2_pair = spec.get("pairs", (None, None))
        if (fc1_pair, fc2_pair) != (None, None):
            want.update(fc1_pair=fc1_pair, fc2_pair=fc2_pair)
    assert plan_kw == want
    assert rec.calls["allocate"] == ((rec.plan_obj, args["x"].device), {})
    bind_args, bind_kw = rec.calls["bind"]
    assert bind_args == (rec.plan_obj,) and bind_kw == rec.buffers
    (bound, inputs), run_kw = rec.calls["run"]
    assert bound is rec.bound and run_kw == {}
    for field in (
        "x", "topk_weights", "topk_ids", "gate_suh", "up_suh", "intermediate_rotations",
        "down_svh", "global_to_combined", "descriptor_map", "fc1_modes", "fc2_modes",
    ):  # fmt: skip
        assert getattr(inputs, field) is args[field], field
    for field in ("w13", "w2"):
        got = getattr(inputs, field)
        assert isinstance(got, tuple) and len(got) == len(args[field])
        assert all(a is b for a, b in zip(got, args[field], strict=True)), field


def test_moe_fake_impl_returns_m_by_h_on_fake_cuda():
    with FakeTensorMode():
        args = _moe_args("cuda", layout="packed", x_dtype=BF16)
        y = torch.ops.b12x.trellis_moe(**args)
        assert (tuple(y.shape), y.dtype, y.device.type) == ((M, H), BF16, "cuda")


def test_moe_op_on_cpu_tensors_raises_naming_x():
    args = _moe_args("cpu", layout="packed", x_dtype=F16)
    with pytest.raises(ValueError, match="x: .*CUDA"):
        torch.ops.b12x.trellis_moe(**args)
