"""The typed contract b12x declares to the oracle (``docs/oracle_contract.md`` §1).

Expected variants are written here from the spec's legality table (§1.1/§2) and the pair record
rates (§4.3), not read back from b12x: a variant b12x stops declaring, or one it declares without
support, fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest
import torch

import b12x.support as support
from b12x.ops.decode import plan as decode_plan
from b12x.ops.dense import dispatch as dense_dispatch
from b12x.ops.dense import mainloop as dense_mainloop
from b12x.ops.dense import plan as dense_plan
from b12x.ops.dense import split_k as dense_split_k
from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.moe import custom_op as moe_ops
from b12x.ops.moe import dispatch as moe_dispatch
from b12x.ops.moe import gemm_op as moe_gemm
from b12x.ops.moe import plan as moe_plan
from b12x.ops.moe import run as moe_run
from oracle.judge import dispatch as oracle_dispatch
from oracle.judge import tiles as oracle_tiles

LEGAL = {
    "3inst": range(1, 9),
    "mcg": range(1, 9),
    "mul1": range(1, 9),
    "sqg_e4m3": range(2, 5),
    "sqg_fp16": range(5, 7),
}
PAIRS = {"P22": (2, 2), "P33": (3, 3), "P24": (2, 4), "P43": (4, 3), "P44": (4, 4)}
DTYPES = (torch.float16, torch.bfloat16)
STAGES = {"rotated", "gemm", "rotated_gate", "rotated_up", "fc1", "activated", "fc2"}


def _keys(variants):
    return [
        (v.codebook, v.bits, v.compute_dtype, v.rotation, v.pair_kind, v.pair_modes, v.tier_bits,
         v.layouts)
        for v in variants
    ]  # fmt: skip


def test_ops_and_lookup():
    assert tuple(op.name for op in support.OPS) == ("decode", "dense", "moe", "moe_gemm")
    for op in support.OPS:
        assert support.op_contract(op.name) is op
    with pytest.raises(ValueError, match=r"unknown op 'linear'.*'moe', 'moe_gemm'"):
        support.op_contract("linear")
    with pytest.raises(ValueError, match="known ops"):
        support.op_contract(None)


def test_contract_records_are_frozen():
    op = support.op_contract("dense")
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.name = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.variants[0].bits = 1
    assert isinstance(op.variants, tuple) and isinstance(op.dispatch, tuple)
    with pytest.raises(TypeError):
        op.observables["x"] = "y"


def test_entry_points_are_the_front_doors():
    decode = support.op_contract("decode")
    assert (decode.plan, decode.bind, decode.run, decode.allocate, decode.graph_op) == (
        decode_plan.plan_decode,
        decode_plan.bind_decode,
        decode_plan.run_decode,
        decode_plan.allocate_decode_buffers,
        decode_plan.DecodeOp,
    )
    assert decode.custom_op is None and decode.dispatch == () and decode.tiles is None
    dense = support.op_contract("dense")
    assert (dense.plan, dense.bind, dense.run, dense.allocate, dense.graph_op) == (
        dense_plan.plan_dense,
        dense_plan.bind_dense,
        dense_plan.run_dense,
        dense_plan.allocate_dense_buffers,
        dense_plan.DenseOp,
    )
    assert dense.custom_op == "b12x::trellis_dense_linear"
    assert dense.dispatch == (dense_dispatch.TABLE, dense_split_k.TABLE, dense_mainloop.TABLE)
    assert dense.tiles is dense_tiles.REGISTRY
    moe = support.op_contract("moe")
    assert (moe.plan, moe.bind, moe.run, moe.allocate, moe.graph_op) == (
        moe_plan.plan_moe,
        moe_plan.bind_moe,
        moe_run.run_moe,
        moe_plan.allocate_moe_buffers,
        moe_ops.MoeOp,
    )
    assert moe.custom_op == "b12x::trellis_moe" and moe.dispatch == moe_dispatch.TABLES
    grouped = support.op_contract("moe_gemm")
    assert (grouped.plan, grouped.bind, grouped.run, grouped.allocate, grouped.graph_op) == (
        moe_gemm.plan_moe_gemm,
        moe_gemm.bind_moe_gemm,
        moe_gemm.run_moe_gemm,
        moe_gemm.allocate_moe_gemm_buffers,
        moe_gemm.MoeGemmOp,
    )
    assert grouped.custom_op is None and grouped.dispatch == moe_dispatch.TABLES
    assert dict(grouped.observables) == {"out": "gemm"}
    assert all(v.op == "moe_gemm" and v.rotation == "none" for v in grouped.variants)


def test_plans_are_keyword_only_and_custom_ops_exist():
    for op in support.OPS:
        params = inspect.signature(op.plan).parameters.values()
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), op.name
        if op.custom_op is not None:
            namespace, name = op.custom_op.split("::")
            assert hasattr(getattr(torch.ops, namespace), name)


def test_graph_ops_follow_the_protocol():
    device = oracle_tiles.SimulatedDevice("h200", 132, 227 * 1024, (9, 0))
    for op in support.OPS:
        graph_op = op.graph_op(device)
        for method in ("plan", "bind", "run", "freeze", "compile_unwarmed"):
            assert callable(getattr(graph_op, method)), (op.name, method)
    dense = support.op_contract("dense").graph_op(device, hadamard_128=lambda *a: None)
    problem = dict(m=8, k=256, n=256, bits=4, codebook="mcg", x_dtype=torch.float16)
    assert dense.plan(problem).problem.external_rotation is True
    with pytest.raises(ValueError, match="external_rotation"):
        dense.plan({**problem, "external_rotation": False})


def test_dispatch_tables_and_tiles_satisfy_the_oracle_protocols():
    for op in support.OPS:
        for table in op.dispatch:
            oracle_dispatch.validate_table(table)
            assert oracle_dispatch.check_boundaries(table).passed, table.name
        if op.tiles is not None:
            oracle_tiles.validate_registry(op.tiles)


def test_observables_name_plan_buffers_and_judge_stages():
    dense = support.op_contract("dense").observables
    assert dict(dense) == {"rotated_f16": "rotated", "gemm_output": "gemm"}
    assert set(dense) <= set(dense_plan.BUFFER_NAMES)
    moe = support.op_contract("moe").observables
    assert set(moe) <= set(moe_plan.ALL_BUFFER_NAMES)
    assert set(moe.values()) == {"rotated_gate", "rotated_up", "fc1", "activated", "fc2"}
    for op in support.OPS:
        assert set(op.observables.values()) <= STAGES


def test_decode_variants_every_legal_codebook_bits_both_dtypes():
    got = _keys(support.op_contract("decode").variants)
    want = [
        (cb, b, dt, "none", None, (), None, ())
        for cb, bits in LEGAL.items()
        for b in bits
        for dt in DTYPES
    ]
    assert sorted(map(str, got)) == sorted(map(str, want))
    assert len(set(map(str, got))) == len(got)


def test_dense_variants_both_rotations_with_their_paths():
    variants = support.op_contract("dense").variants
    want = {
        (cb, b, dt, rot) for cb, bits in LEGAL.items() for b in bits for dt in DTYPES
        for rot in ("full", "none")
    }  # fmt: skip
    got = [(v.codebook, v.bits, v.compute_dtype, v.rotation) for v in variants]
    assert set(got) == want and len(got) == len(want)
    for v in variants:
        k6 = (v.codebook, v.bits, v.compute_dtype, v.rotation) == ("mcg", 6, torch.float16, "full")
        expected = ("k6_mcg_small_m",) if k6 else ()
        assert v.paths == (*expected, "decode_matmul", "generic"), v
        assert v.pair_kind is None and v.tier_bits is None and v.layouts == ()


def test_moe_variants_uniform_tiers_and_pairs():
    variants = support.op_contract("moe").variants
    uniform = [v for v in variants if v.pair_kind is None and v.tier_bits is None]
    assert {(v.codebook, v.bits, v.compute_dtype) for v in uniform} == {
        (cb, b, dt) for cb, bits in LEGAL.items() for b in bits for dt in DTYPES
    }
    tiers = [v for v in variants if v.tier_bits is not None]
    assert {(v.codebook, v.bits, v.tier_bits, v.compute_dtype) for v in tiers} == {
        ("mcg", 3, (3, 4), dt) for dt in DTYPES
    }
    pairs = [v for v in variants if v.pair_kind is not None]
    want = {
        (cb, kind, dt)
        for cb, bits in LEGAL.items()
        for kind, rates in PAIRS.items()
        if {3, *rates} <= set(bits)
        for dt in DTYPES
    }
    assert {(v.codebook, v.pair_kind, v.compute_dtype) for v in pairs} == want
    assert len(pairs) == len(want) and all(v.bits == 3 for v in pairs)
    for v in pairs:
        dynamic = v.pair_kind in ("P33", "P24")
        assert v.pair_modes == (("static", "dynamic") if dynamic else ("static",)), v
    assert all(v.layouts == ("packed", "proj") and v.rotation == "full" for v in variants)
    assert len(set(map(str, _keys(variants)))) == len(variants)


def test_deprecated_views_are_derived_from_ops(monkeypatch):
    dense_entries = [e for e in support.supported_variants() if e["op"] == "dense_linear"]
    assert len(dense_entries) == len(support.op_contract("dense").variants) // 2
    assert len(support.supported_moe_variants()) == 2 * len(support.op_contract("moe").variants)
    ops = tuple(
        dataclasses.replace(op, variants=op.variants[:1]) for op in support.OPS
    )  # a smaller declaration must shrink the views
    monkeypatch.setattr(support, "_ops", lambda: ops)
    assert len(support.supported_variants()) == 2  # one decode (fp16), one dense entry
    assert len(support.supported_moe_variants()) == 2  # one variant, two layouts
    for fn in (support.supported_variants, support.supported_moe_variants):
        assert "Deprecated" in fn.__doc__


def test_importing_support_stays_light():
    code = (
        "import sys, b12x.support; "
        "print('cutlass' in sys.modules, 'b12x.ops.moe.plan' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
