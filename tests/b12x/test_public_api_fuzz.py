"""CPU tier: hostile values against every public entry of b12x (docs/architecture.md).

Each entry starts from a valid baseline call; hypothesis replaces one or two of its arguments
with values from a pool of hostile ones (wrong types, bools for ints, floats, NaN, negative /
zero / huge ints, unknown strings, wrong dtypes, CPU and meta tensors, wrong shapes,
non-contiguous and misaligned tensors, objects) and calls it. The only exceptions allowed are
``TypeError``/``ValueError`` whose message names an argument of that entry (or one of its
fields / buffers); and a call whose edited arguments are invalid must never return. Validity is
declared per entry below, from the documented domains (not read back from b12x).

Direct ``torch.ops.b12x.*`` calls are fuzzed with tensor arguments and schema-typed scalars: a
value of the wrong *schema* type never reaches b12x (torch's dispatcher rejects it first), so
those go through the Python front door :func:`b12x.ops.dense.custom_op.dense_linear` and the fake
implementations instead, which are fuzzed with everything.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import b12x.ops.dense.custom_op as dense_ops
import b12x.ops.moe.custom_op as moe_ops
from b12x.ops.decode import allocate_decode_buffers, bind_decode, plan_decode, run_decode
from b12x.ops.dense import dispatch, mainloop, split_k
from b12x.ops.dense import tiles as T
from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.moe.plan import ALL_BUFFER_NAMES, allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe
from b12x.ops.moe.tiers import plan_tiered_moe
from oracle.judge.tiles import SimulatedDevice
from oracle.pytest_plugin import scaled_examples

F16, BF16, F32, I16, I32 = torch.float16, torch.bfloat16, torch.float32, torch.int16, torch.int32
H200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))
MISSING = object()  # "drop this argument"


def _isint(v: Any) -> bool:
    return type(v) is int


def _pos(v: Any) -> bool:
    return _isint(v) and v > 0


def _extent(v: Any) -> bool:
    """A dimension the kernels can index: positive and within 32-bit shapes (2**31 - 1)."""
    return _pos(v) and v <= 2**31 - 1


# --------------------------------------------------------------------------- the hostile pool
# key -> factory(base) where base is the argument's baseline value; a factory may return
# MISSING (drop the argument) or raise NotApplicable for a base it cannot derive from.


class NotApplicable(Exception):
    pass


def _tensor_only(fn):
    def make(base):
        if not isinstance(base, torch.Tensor):
            raise NotApplicable
        return fn(base)

    return make


def _noncontig(t):
    if t.dim() < 2 or t.shape[0] < 2 or t.shape[-1] < 2:
        raise NotApplicable
    return torch.empty(t.shape[::-1], dtype=t.dtype, device=t.device).transpose(0, -1)


def _misaligned(t):
    flat = torch.zeros(t.numel() + 16, dtype=t.dtype, device=t.device)
    return flat[1 : 1 + t.numel()].view(t.shape)


def _shorter(t):
    if t.shape[-1] < 2:
        raise NotApplicable
    return torch.zeros(*t.shape[:-1], t.shape[-1] - 1, dtype=t.dtype, device=t.device)


def _other_dtype(t):
    return torch.zeros(t.shape, dtype=F32 if t.dtype != F32 else F16, device=t.device)


def _to_device(dev):
    def move(t):
        if t.device.type == dev:
            raise NotApplicable
        return torch.zeros(t.shape, dtype=t.dtype, device=dev)

    return move


POOL: dict[str, Callable[[Any], Any]] = {
    "missing": lambda b: MISSING,
    "none": lambda b: None,
    "true": lambda b: True,
    "false": lambda b: False,
    "zero": lambda b: 0,
    "one": lambda b: 1,
    "minus_one": lambda b: -1,
    "two": lambda b: 2,
    "three": lambda b: 3,
    "four": lambda b: 4,
    "forty_two": lambda b: 42,
    "huge": lambda b: 2**63,
    "float_four": lambda b: 4.0,
    "float_half": lambda b: 0.5,
    "nan": lambda b: math.nan,
    "no": lambda b: "no",
    "empty": lambda b: "",
    "mcg": lambda b: "mcg",
    "sqg_fp16": lambda b: "sqg_fp16",
    "proj": lambda b: "proj",
    "P24": lambda b: "P24",
    "dynamic": lambda b: "dynamic",
    "cuda": lambda b: "cuda",
    "meta": lambda b: "meta",
    "cpu": lambda b: "cpu",
    "f32": lambda b: F32,
    "i16": lambda b: I16,
    "f16": lambda b: F16,
    "bf16": lambda b: BF16,
    "object": lambda b: object(),
    "pair": lambda b: [64, 256],
    "tile_zero": lambda b: [0, 64, 128],
    "tile_negative": lambda b: [64, -256, 256],
    "tile_bools": lambda b: [True, 256, 256],
    "tile_floats": lambda b: [64.0, 256, 256],
    "tile_dense": lambda b: [64, 256, 256],
    "tile_fc2": lambda b: [32, 512, 256],
    "tile_unlisted": lambda b: (1, 2, 3),
    "cap_float": lambda b: (9.0, 0),
    "cap_three": lambda b: (9, 0, 0),
    "cap_sm120": lambda b: (12, 0),
    "dict": lambda b: {},
    "tiny_device": lambda b: SimulatedDevice("tiny", 1, 1024, (8, 0)),
    "bad_device": lambda b: BadDevice(),
    "cpu_f32_vec": lambda b: torch.zeros(4, dtype=F32),
    "meta_f16_vec": lambda b: torch.zeros(4, dtype=F16, device="meta"),
    "t_meta": _tensor_only(_to_device("meta")),
    "t_cpu": _tensor_only(_to_device("cpu")),
    "t_dtype": _tensor_only(_other_dtype),
    "t_short": _tensor_only(_shorter),
    "t_noncontig": _tensor_only(_noncontig),
    "t_misaligned": _tensor_only(_misaligned),
    "t_same": _tensor_only(lambda t: torch.zeros(t.shape, dtype=t.dtype, device=t.device)),
}
KEYS = sorted(POOL)


class BadDevice:
    """A simulated device with an impossible SM count."""

    name, sm_count, max_shared_mem, capability = "bad", 0, 1024, (9, 0)


@dataclasses.dataclass(frozen=True)
class Entry:
    """A public entry: a baseline (fresh per call), how to call it, the names its messages may
    use, and which edits are valid (True), invalid (False) or either (None)."""

    call: Callable[[dict], Any]
    baseline: Callable[[], dict]
    names: tuple[str, ...]
    valid: Callable[[str, str, Any, dict], bool | None]
    always_raises: bool = False  # run entries on a CPU-only machine: nothing can launch


# --------------------------------------------------------------------------- dense


def _dense_problem():
    return dict(
        m=8, k=256, n=256, bits=4, codebook="mcg", x_dtype=F16, compute_dtype=F16,
        external_rotation=False, tile=None, split_k=None, device=H200,
    )  # fmt: skip


def _tile_ok(value, problem):
    try:
        tile = value if isinstance(value, T.Tile) else T.deserialize(value)
        return T.qualify(tile, problem, H200)[0]
    except (TypeError, ValueError):
        return False


def _dense_valid(arg, key, v, base):
    dtypes = (F16, BF16)
    rules = {
        "m": lambda: _extent(v),
        "k": lambda: _extent(v) and v % 128 == 0,
        "n": lambda: _extent(v) and v % 128 == 0,
        "bits": lambda: _isint(v) and 1 <= v <= 8,
        "codebook": lambda: v in ("3inst", "mcg", "mul1", "sqg_e4m3"),
        "x_dtype": lambda: any(v is d for d in dtypes),
        "compute_dtype": lambda: any(v is d for d in dtypes),
        "external_rotation": lambda: v is True or v is False,
        "tile": lambda: v is None or _tile_ok(v, T.TileProblem("dense", 8, 256, 256, 4)),
        "split_k": lambda: v is None or _pos(v),
        "device": lambda: None if isinstance(v, SimulatedDevice) else False,  # may be too small
    }
    if v is MISSING:  # defaults; device=None is the current CUDA device (none here)
        return arg in ("compute_dtype", "external_rotation", "tile", "split_k")
    return rules[arg]()


DENSE_PROBLEM_NAMES = tuple(_dense_problem()) + ("k/n",)


@functools.cache
def _plan_for_bind():
    return plan_dense(**{**_dense_problem(), "split_k": 2, "x_dtype": BF16, "compute_dtype": BF16})


def _bind_baseline():
    plan = _plan_for_bind()
    return {"plan": plan, **allocate_dense_buffers(plan, "cpu")}


def _bind_valid(arg, key, v, base):
    if arg == "plan":
        return False
    return key == "t_same"


def _call_bind(a):
    a = dict(a)
    plan = a.pop("plan")
    return bind_dense(plan, **a)


def _run_baseline():
    plan = plan_dense(**_dense_problem())
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cpu"))
    return dict(
        bound=bound, x=torch.zeros(8, 256, dtype=F16),
        trellis=torch.zeros(16, 16, 64, dtype=I16), suh=torch.ones(256, dtype=F16),
        svh=torch.ones(256, dtype=F16), bias=None, hadamard_128=None,
    )  # fmt: skip


def _call_run(a):
    return run_dense(
        a["bound"], a["x"], a["trellis"], a["suh"], a["svh"], bias=a["bias"],
        hadamard_128=a["hadamard_128"],
    )  # fmt: skip


def _alloc_valid(arg, key, v, base):
    if arg == "plan":
        return False
    return isinstance(v, str) and v in ("cpu", "meta")


# --------------------------------------------------------------------------- custom ops


def _op_baseline(device="meta"):
    z = lambda *s, dtype=F16: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
    return dict(
        x=z(4, 256), trellis=z(16, 16, 64, dtype=I16), suh=z(256), svh=z(256), codebook="mcg",
        bias=None, tile=None, split_k=0, compute_dtype=None,
    )  # fmt: skip


def _op_valid(arg, key, v, base):
    """The fake implementation's domain (metadata only: a pinned tile is qualified at plan
    time, on the device, so here any three positive ints pass)."""
    if v is MISSING:
        return arg in ("bias", "tile", "split_k", "compute_dtype")
    if isinstance(v, torch.Tensor):
        return key == "t_same" or (arg == "x" and v.dtype == BF16 and v.device.type == "meta")
    rules = {
        "codebook": lambda: v in ("3inst", "mcg", "mul1", "sqg_e4m3"),
        "tile": lambda: (
            v is None or (isinstance(v, list | tuple) and len(v) == 3 and all(_pos(c) for c in v))
        ),
        "split_k": lambda: _isint(v) and 0 <= v < 2**63,
        "compute_dtype": lambda: v is None or v is F16 or v is BF16,
        "bias": lambda: v is None,
    }
    return rules.get(arg, lambda: False)()


def _call_op_python(a):
    """The Python front door of the custom op (every argument, every type)."""
    a = {k: v for k, v in a.items() if v is not MISSING}
    x, trellis, suh, svh = (a.pop(k, None) for k in ("x", "trellis", "suh", "svh"))
    return dense_ops.dense_linear(x, trellis, suh, svh, **a)


def _call_op_fake(a):
    a = {k: v for k, v in a.items() if v is not MISSING}
    return dense_ops._trellis_dense_linear_fake(**a)


def _call_op_torch(a):
    a = {k: v for k, v in a.items() if v is not MISSING}
    return torch.ops.b12x.trellis_dense_linear(**a)


def _op_torch_valid(arg, key, v, base):
    return _op_valid(arg, key, v, base)


# schema-typed values only for the direct torch.ops call (module docstring)
SCHEMA_OK = {
    **{name: (lambda v: isinstance(v, torch.Tensor)) for name in ("x", "trellis", "suh", "svh")},
    "bias": lambda v: v is None or isinstance(v, torch.Tensor),
    "codebook": lambda v: isinstance(v, str),
    "tile": lambda v: (
        v is None or (isinstance(v, list | tuple) and all(_isint(c) and abs(c) < 2**63 for c in v))
    ),
    "split_k": lambda v: _isint(v) and abs(v) < 2**63,
    "compute_dtype": lambda v: v is None or isinstance(v, torch.dtype),
}


# --------------------------------------------------------------------------- decode


def _decode_valid(arg, key, v, base):
    if v is MISSING:
        return False
    return {
        "k": lambda: _extent(v) and v % 16 == 0,
        "n": lambda: _extent(v) and v % 16 == 0,
        "bits": lambda: _isint(v) and 1 <= v <= 8,
        "codebook": lambda: v in ("3inst", "mcg", "mul1", "sqg_e4m3"),
    }[arg]()


@functools.cache
def _decode_plan():
    return plan_decode(k=64, n=128, bits=4, codebook="mcg")


# --------------------------------------------------------------------------- MoE


def _moe_problem():
    return dict(
        m=4, top_k=2, hidden=256, intermediate=256, codebook="mcg", bits=4, num_experts=4,
        w13_layout="packed", x_dtype=F16, compute_dtype=F16, num_global_experts=None,
        m_tiles=None, fc1_pair=None, fc2_pair=None, device=None,
    )  # fmt: skip


def _moe_valid(arg, key, v, base):
    optional = ("compute_dtype", "num_global_experts", "m_tiles", "fc1_pair", "fc2_pair", "device")
    if v is MISSING:
        return arg in optional
    mult = lambda: _extent(v) and v % 128 == 0  # noqa: E731
    return {
        "m": lambda: _pos(v) and (v < 10**6 or None),
        "top_k": lambda: _pos(v) and v <= 4,
        "hidden": mult,
        "intermediate": mult,
        "codebook": lambda: v in ("3inst", "mcg", "mul1", "sqg_e4m3"),
        "bits": lambda: _isint(v) and 1 <= v <= 8,
        "num_experts": lambda: _pos(v) and v >= 2 and (v < 10**6 or None),
        "w13_layout": lambda: v in ("packed", "proj"),
        "x_dtype": lambda: v is F16 or v is BF16,
        "compute_dtype": lambda: v is F16 or v is BF16,
        "num_global_experts": lambda: v is None,
        "m_tiles": lambda: v is None or (_isint(v) and v in (1, 2, 4)),
        "fc1_pair": lambda: v is None,  # bits = 4: pairs need the base 3
        "fc2_pair": lambda: v is None,
        "device": lambda: v is None or isinstance(v, SimulatedDevice),
    }[arg]()


def _tier_problem():
    return dict(
        m=4, top_k=2, hidden=256, intermediate=256, codebook="mcg", tier0_bits=3, tier1_bits=4,
        tier0_experts=2, tier1_experts=2, num_global_experts=8, w13_layout="packed",
        x_dtype=F16, compute_dtype=F16,
    )  # fmt: skip


def _tier_valid(arg, key, v, base):
    if v is MISSING:
        return False
    return {
        "m": lambda: _pos(v) and (v < 10**6 or None),
        "top_k": lambda: _pos(v) and (v <= 4 or None),
        "hidden": lambda: _extent(v) and v % 128 == 0,
        "intermediate": lambda: _extent(v) and v % 128 == 0,
        "codebook": lambda: v == "mcg",
        "tier0_bits": lambda: _isint(v) and 1 <= v <= 8,
        "tier1_bits": lambda: _isint(v) and 1 <= v <= 8,
        # both tiers' experts must fit the 8 global ids of the base (the other tier's 2 or <= 4)
        "tier0_experts": lambda: _pos(v) and v <= 256 and (True if v <= 4 else None),
        "tier1_experts": lambda: _pos(v) and v <= 256 and (True if v <= 4 else None),
        # at least tier0 + tier1 experts (<= 256 each): below 512 it depends on the other edits
        "num_global_experts": lambda: _pos(v) and (None if v < 512 else True),
        "w13_layout": lambda: v in ("packed", "proj"),
        "x_dtype": lambda: v is F16 or v is BF16,
        "compute_dtype": lambda: v is F16 or v is BF16,
    }[arg]()


@functools.cache
def _moe_plan():
    return plan_moe(**{k: v for k, v in _moe_problem().items()})


@functools.cache
def _moe_bound():
    return bind_moe(_moe_plan(), **allocate_moe_buffers(_moe_plan(), "cpu"))


def _moe_run_baseline():
    bound = _moe_bound()
    z = lambda *s, dtype=F16: torch.zeros(*s, dtype=dtype)  # noqa: E731
    return dict(
        bound=bound, x=z(4, 256), topk_weights=z(4, 2, dtype=F32), topk_ids=z(4, 2, dtype=I32),
        w13=(z(4, 16, 32, 64, dtype=I16),), w2=(z(4, 16, 16, 64, dtype=I16),),
        gate_suh=z(4, 256), up_suh=None, intermediate_rotations=z(4, 768), down_svh=z(4, 256),
    )  # fmt: skip


def _call_run_moe(a):
    fields = {k: v for k, v in a.items() if k != "bound" and v is not MISSING}
    return run_moe(a["bound"], MoeInputs(**fields))


def _moe_op_baseline():
    z = lambda *s, dtype=F16: torch.zeros(*s, dtype=dtype, device="meta")  # noqa: E731
    return dict(
        x=z(4, 256), topk_weights=z(4, 2, dtype=F32), topk_ids=z(4, 2, dtype=I32),
        w13=[z(4, 16, 32, 64, dtype=I16)], w2=[z(4, 16, 16, 64, dtype=I16)], gate_suh=z(4, 256),
        up_suh=None, intermediate_rotations=z(4, 768), down_svh=z(4, 256), codebook="mcg",
        w13_layout="packed",
    )  # fmt: skip


def _moe_op_valid(arg, key, v, base):
    if v is MISSING:  # every baseline argument is required (schema: no default)
        return False
    if isinstance(v, torch.Tensor):
        # route ids and weights are read by torch ops only: no 16-byte alignment needed
        torch_read = key == "t_misaligned" and arg in ("topk_ids", "topk_weights")
        any_float = key == "t_dtype" and arg == "topk_weights"  # fp16 weights are floats too
        return key == "t_same" or torch_read or any_float
    return {
        "codebook": lambda: v in ("3inst", "mcg", "mul1", "sqg_e4m3"),
        "w13_layout": lambda: v == "packed" or (None if v == "proj" else False),  # + up_suh
        "up_suh": lambda: v is None,
    }.get(arg, lambda: False)()


def _call_moe_fake(a):
    a = {k: v for k, v in a.items() if v is not MISSING}
    return moe_ops._trellis_moe_fake(**a)


# --------------------------------------------------------------------------- tables and tiles


def _case_valid(arg, key, v, base):
    if v is MISSING:
        return True  # every field has a default
    return {
        "capability": lambda: (
            isinstance(v, tuple | list) and len(v) == 2 and all(_isint(c) and c >= 0 for c in v)
        ),
        "m": lambda: _pos(v),
        "bits": lambda: _isint(v) and 1 <= v <= 8,
        "codebook": lambda: v in ("3inst", "mcg", "mul1", "sqg_e4m3", "sqg_fp16") and None,
        "pair_kind": lambda: False if not (v is None or isinstance(v, str)) else None,
        "compute_dtype": lambda: v in ("float16", "bfloat16") or v is F16 or v is BF16,
        "external_rotation": lambda: v is True or v is False,
        "explicit_tile": lambda: (
            v is None or (isinstance(v, list | tuple) and len(v) == 3 and all(_pos(c) for c in v))
        ),
    }[arg]()


def _split_valid(arg, key, v, base):
    if v is MISSING:
        return True
    if arg == "path":
        return v in dispatch.PATH_NAMES
    if arg in ("requested", "planned"):
        return v is None or _pos(v)
    return _pos(v)


def _mainloop_valid(arg, key, v, base):
    if v is MISSING:
        return True  # every field has a default
    if arg == "path":
        return v in dispatch.PATH_NAMES
    if arg == "bits":
        return _isint(v) and 1 <= v <= 8
    if arg == "pinned":
        return isinstance(v, bool)
    if arg == "capability":
        return _case_valid(arg, key, v, base)
    if arg == "wide_tile_cap":  # a decoder's tile hint: one of the registry's values
        return _isint(v) and v in (2, 4)
    return _pos(v)


def _tile_problem():
    return T.TileProblem("dense", 8, 256, 256, 4)


def _tiles_valid(arg, key, v, base):
    if v is MISSING:
        return False
    if arg == "problem":
        return isinstance(v, T.TileProblem)
    if arg == "device":  # a well-formed device may still be too small for any tile
        return None if isinstance(v, SimulatedDevice) else False
    return None  # tile/spec: judged by the entry


def _pin_valid(arg, key, v, base):
    if arg == "spec":
        return False if v is MISSING else _tile_ok(v, _tile_problem())
    return _tiles_valid(arg, key, v, base)


def _deserialize_valid(arg, key, v, base):
    return isinstance(v, list | tuple) and len(v) == 3 and all(_pos(c) for c in v)


def _qualify_valid(arg, key, v, base):
    if arg == "tile":
        return isinstance(v, T.Tile)
    return _tiles_valid(arg, key, v, base)


ENTRIES: dict[str, Entry] = {
    "plan_dense": Entry(
        lambda a: plan_dense(**{k: v for k, v in a.items() if v is not MISSING}),
        _dense_problem, DENSE_PROBLEM_NAMES, _dense_valid,
    ),
    "bind_dense": Entry(
        _call_bind, _bind_baseline,
        ("plan", "buffers", "output", "input_f16", "rotated_f16", "output_f16", "gemm_output",
         "c_tmp", "rotated_compute", "gemm_output_f16"),
        _bind_valid,
    ),
    "run_dense": Entry(
        _call_run, _run_baseline,
        ("bound", "x", "trellis", "suh", "svh", "bias", "hadamard_128", "device"),
        lambda *a: False, always_raises=True,
    ),
    "allocate_dense": Entry(
        lambda a: allocate_dense_buffers(a["plan"], a["device"]),
        lambda: dict(plan=_plan_for_bind(), device="cpu"), ("plan", "device"), _alloc_valid,
    ),
    "dense_op_python": Entry(
        _call_op_python, _op_baseline,
        ("x", "trellis", "suh", "svh", "codebook", "bias", "tile", "split_k", "compute_dtype",
         "bits", "k/n"),
        _op_valid,
    ),
    "dense_op_fake": Entry(
        _call_op_fake, _op_baseline,
        ("x", "trellis", "suh", "svh", "codebook", "bias", "tile", "split_k", "compute_dtype",
         "bits", "k/n"),
        _op_valid,
    ),
    "dense_op_torch": Entry(
        _call_op_torch, _op_baseline,
        ("x", "trellis", "suh", "svh", "codebook", "bias", "tile", "split_k", "compute_dtype",
         "bits", "k/n"),
        _op_torch_valid,
    ),
    "plan_decode": Entry(
        lambda a: plan_decode(**{k: v for k, v in a.items() if v is not MISSING}),
        lambda: dict(k=64, n=128, bits=4, codebook="mcg"), ("k", "n", "bits", "codebook"),
        _decode_valid,
    ),
    "bind_decode": Entry(
        lambda a: bind_decode(a["plan"], **{k: v for k, v in a.items() if k != "plan"}),
        lambda: {"plan": _decode_plan(), **allocate_decode_buffers(_decode_plan(), "cpu")},
        ("plan", "output", "buffers"), _bind_valid,
    ),
    "run_decode": Entry(
        lambda a: run_decode(a["bound"], a["trellis"]),
        lambda: dict(
            bound=bind_decode(_decode_plan(), **allocate_decode_buffers(_decode_plan(), "cpu")),
            trellis=torch.zeros(4, 8, 64, dtype=I16),
        ),
        ("bound", "trellis", "device"), lambda *a: False, always_raises=True,
    ),
    "allocate_decode": Entry(
        lambda a: allocate_decode_buffers(a["plan"], a["device"]),
        lambda: dict(plan=_decode_plan(), device="cpu"), ("plan", "device"), _alloc_valid,
    ),
    "plan_moe": Entry(
        lambda a: plan_moe(**{k: v for k, v in a.items() if v is not MISSING}),
        _moe_problem, tuple(_moe_problem()) + ("hidden/intermediate", "bits/num_experts"),
        _moe_valid,
    ),
    "plan_tiered_moe": Entry(
        lambda a: plan_tiered_moe(**{k: v for k, v in a.items() if v is not MISSING}),
        _tier_problem,
        tuple(_tier_problem()) + ("hidden/intermediate", "bits", "num_experts"), _tier_valid,
    ),
    "bind_moe": Entry(
        lambda a: bind_moe(a["plan"], **{k: v for k, v in a.items() if k != "plan"}),
        lambda: {"plan": _moe_plan(), **_moe_bound().buffers},
        ("plan", "buffers", *ALL_BUFFER_NAMES), _bind_valid,
    ),
    "run_moe": Entry(
        _call_run_moe, _moe_run_baseline,
        ("bound", "inputs", "x", "topk_weights", "topk_ids", "w13", "w2", "gate_suh", "up_suh",
         "intermediate_rotations", "down_svh", "global_to_combined", "descriptor_map",
         "fc1_modes", "fc2_modes", "device"),
        lambda *a: False, always_raises=True,
    ),
    "allocate_moe": Entry(
        lambda a: allocate_moe_buffers(a["plan"], a["device"]),
        lambda: dict(plan=_moe_plan(), device="cpu"), ("plan", "device"), _alloc_valid,
    ),
    "moe_op_fake": Entry(
        _call_moe_fake, _moe_op_baseline,
        ("x", "topk_weights", "topk_ids", "w13", "w2", "gate_suh", "up_suh",
         "intermediate_rotations", "down_svh", "codebook", "w13_layout", "global_to_combined",
         "descriptor_map", "fc1_pair", "fc2_pair", "fc1_modes", "fc2_modes", "compute_dtype",
         "bits", "hidden/intermediate", "num_experts", "top_k", "m", "w13/w2"),
        _moe_op_valid,
    ),
    "dispatch_explain": Entry(
        lambda a: dispatch.explain({k: v for k, v in a.items() if v is not MISSING}),
        lambda: {**dispatch.DEFAULT_CASE, "m": 32}, ("case",) + tuple(dispatch.DEFAULT_CASE),
        _case_valid,
    ),
    "split_k_explain": Entry(
        lambda a: split_k.explain({k: v for k, v in a.items() if v is not MISSING}),
        lambda: dict(split_k.DEFAULT_CASE), ("case",) + tuple(split_k.DEFAULT_CASE),
        _split_valid,
    ),
    "mainloop_explain": Entry(
        lambda a: mainloop.explain({k: v for k, v in a.items() if v is not MISSING}),
        lambda: dict(mainloop.DEFAULT_CASE), ("case",) + tuple(mainloop.DEFAULT_CASE),
        _mainloop_valid,
    ),
    "tiles_qualify": Entry(
        lambda a: T.qualify(a["tile"], a["problem"], a["device"]),
        lambda: dict(tile=T.Tile(64, 256, 256), problem=_tile_problem(), device=H200),
        ("tile", "problem", "device"), _qualify_valid,
    ),
    "tiles_pin": Entry(
        lambda a: T.pin(a["spec"], a["problem"], a["device"]),
        lambda: dict(spec=[64, 256, 256], problem=_tile_problem(), device=H200),
        ("tile", "spec", "problem", "device"), _pin_valid,
    ),
    "tiles_deserialize": Entry(
        lambda a: T.deserialize(a["spec"]), lambda: dict(spec=[64, 256, 256]), ("tile", "spec"),
        _deserialize_valid,
    ),
    "tiles_auto_select": Entry(
        lambda a: T.auto_select(a["problem"], a["device"]),
        lambda: dict(problem=_tile_problem(), device=H200), ("problem", "device"), _tiles_valid,
    ),
}  # fmt: skip


def _names_an_argument(message: str, names: tuple[str, ...]) -> bool:
    return any(re.search(rf"(^|\W){re.escape(n)}(\W|$)", message) for n in names)


def check_call(entry_name: str, edits: list[tuple[str, str]]) -> None:
    entry = ENTRIES[entry_name]
    args = entry.baseline()
    final: dict[str, tuple[str, Any]] = {}  # a later edit of the same argument wins
    for arg, key in edits:
        if arg not in args:
            continue
        try:
            value = POOL[key](args[arg])
        except NotApplicable:
            continue
        if entry_name == "dense_op_torch" and arg in SCHEMA_OK and not SCHEMA_OK[arg](value):
            continue  # rejected by torch's schema check before b12x runs (module docstring)
        final[arg] = (key, value)
    verdicts = [entry.valid(arg, key, value, args[arg]) for arg, (key, value) in final.items()]
    args.update({arg: value for arg, (_, value) in final.items()})
    try:
        entry.call(args)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        assert _names_an_argument(message, entry.names), (
            f"{entry_name}{edits}: {type(exc).__name__} names no argument: {message}"
        )
        if not entry.always_raises:  # an invalid (or undecided) edit is what may raise
            assert any(v is not True for v in verdicts), (
                f"{entry_name}{edits}: valid arguments rejected: {message}"
            )
        return
    assert not entry.always_raises, f"{entry_name}{edits}: accepted on a CPU-only machine"
    assert False not in verdicts, f"{entry_name}{edits}: invalid value accepted"


def _calls(entry: str):
    args = sorted(ENTRIES[entry].baseline())
    edit = st.tuples(st.sampled_from(args), st.sampled_from(KEYS))
    return st.tuples(st.just(entry), st.lists(edit, min_size=1, max_size=3))


CALLS = st.sampled_from(sorted(ENTRIES)).flatmap(_calls)


@settings(
    deadline=None,
    max_examples=scaled_examples(800),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(call=CALLS)
@example(call=("plan_moe", [("bits", "float_four")]))
@example(call=("plan_moe", [("m_tiles", "true")]))
@example(call=("plan_moe", [("bits", "bad_device")]))
@example(call=("plan_moe", [("num_experts", "huge")]))
@example(call=("plan_dense", [("external_rotation", "no")]))
@example(call=("plan_dense", [("tile", "tile_zero")]))
@example(call=("plan_dense", [("device", "meta")]))
@example(call=("plan_dense", [("device", "tiny_device")]))
@example(call=("dispatch_explain", [("codebook", "no")]))
@example(call=("dispatch_explain", [("bits", "forty_two")]))
@example(call=("dispatch_explain", [("capability", "cap_float")]))
@example(call=("dispatch_explain", [("external_rotation", "no")]))
@example(call=("dispatch_explain", [("m", "true")]))
@example(call=("tiles_pin", [("spec", "tile_zero")]))
@example(call=("tiles_qualify", [("device", "bad_device")]))
@example(call=("tiles_auto_select", [("device", "tiny_device")]))
@example(call=("allocate_dense", [("device", "cuda")]))
@example(call=("allocate_moe", [("device", "huge")]))
@example(call=("bind_decode", [("output", "t_meta")]))
@example(call=("run_moe", [("x", "t_same")]))
@example(call=("dense_op_torch", [("x", "t_cpu")]))
@example(call=("dense_op_torch", [("bias", "no")]))
@example(call=("dense_op_fake", [("split_k", "huge")]))
@example(call=("dense_op_fake", [("bias", "P24"), ("bias", "missing")]))
@example(call=("moe_op_fake", [("codebook", "P24")]))
@example(call=("moe_op_fake", [("down_svh", "P24")]))
@example(call=("moe_op_fake", [("topk_weights", "t_cpu")]))
@example(call=("moe_op_fake", [("x", "t_short")]))
def test_public_entries_reject_hostile_values_naming_them(call):
    """One to three hostile edits at a time (the shrunk failures are the explicit examples)."""
    check_call(*call)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_single_edit(entry):
    """Exhaustive over one edit (every argument × every pool value): cheap and complete."""
    for arg in sorted(ENTRIES[entry].baseline()):
        for key in KEYS:
            check_call(entry, [(arg, key)])
