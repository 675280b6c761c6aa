"""The dense dispatch table (R2): both sides of every boundary, reachability, explain reasons.

Every expected path below is written from spec §5.5 (PR #136 gate) and §4.2 of the regression
classes, not read back from the table.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from b12x.dense import dispatch as D
from b12x.dense import plan_dense
from oracle import dispatch as O
from oracle.tiles import SimulatedDevice

K6 = "k6_mcg_small_m"
BASE = {
    "capability": (12, 0),
    "m": 64,
    "bits": 6,
    "codebook": "mcg",
    "pair_kind": None,
    "compute_dtype": "float16",
    "external_rotation": False,
    "explicit_tile": None,
}
RTX = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))


class OracleView:
    """``oracle.dispatch`` wants its own ``Boundary`` objects; b12x declares the same fields."""

    def __init__(self, table=D.TABLE):
        self.name = table.name
        self.paths = table.paths
        self.boundaries = [O.Boundary(**dataclasses.asdict(b)) for b in table.boundaries]
        self.explain = table.explain


GRID = [
    {**BASE, "m": m, "bits": b, "codebook": cb, "compute_dtype": dt, "capability": cap}
    for m, b, cb, dt, cap in itertools.product(
        (1, 8, 9, 16, 17, 127, 128, 129, 1024, 1025, 4096),
        (3, 4, 6),
        ("mcg", "sqg_fp16"),
        ("float16", "bfloat16"),
        ((12, 0), (12, 1), (9, 0), (8, 0)),
    )
]


def test_oracle_generic_checks_pass():
    outcomes = O.check_table(OracleView(), GRID)
    assert [o.failures for o in outcomes] == [(), (), (), ()]
    hits = outcomes[1].metrics["hits"]
    assert all(hits[name] > 0 for name in D.PATH_NAMES)


@pytest.mark.parametrize(
    ("field", "inside", "outside", "reason"),
    [
        ("m", 128, 129, "m=129 > 128"),
        ("bits", 6, 5, "bits=5 != 6"),
        ("codebook", "mcg", "sqg_fp16", "codebook='sqg_fp16' != 'mcg'"),
        ("codebook", "mcg", "3inst", "codebook='3inst' != 'mcg'"),
        ("compute_dtype", "float16", "bfloat16", "compute_dtype=bfloat16 != float16"),
        ("compute_dtype", torch.float16, torch.bfloat16, "compute_dtype=bfloat16 != float16"),
        ("external_rotation", False, True, "external H128"),
        ("capability", (12, 0), (12, 1), "capability=(12, 1)"),
        ("capability", (12, 0), (9, 0), "capability=(9, 0)"),
        ("capability", (12, 0), (8, 0), "capability=(8, 0)"),
        ("explicit_tile", None, (64, 256, 256), "explicit_tile=(64, 256, 256)"),
    ],
)
def test_k6_boundary_both_sides(field, inside, outside, reason):
    assert D.explain({**BASE, field: inside}).path == K6
    got = D.explain({**BASE, field: outside})
    assert got.path == "generic"
    assert got.reasons[0].startswith(f"{K6}: ") and reason in got.reasons[0]
    assert got.reasons[-1] == "generic: selected"


def test_k6_reaches_m_1_and_large_m_takes_decode_matmul():
    assert D.explain({**BASE, "m": 1}).path == K6
    assert D.explain({**BASE, "m": 1024}).path == "generic"
    assert D.explain({**BASE, "m": 1025}).path == "decode_matmul"
    pinned = D.explain({**BASE, "m": 4096, "explicit_tile": (64, 128, 128)})
    assert pinned.path == "generic"


def test_fail_closed_for_paired_and_pre_sm80():
    with pytest.raises(ValueError, match="pair_kind='P24' is paired"):
        D.explain({**BASE, "pair_kind": "P24"})
    with pytest.raises(ValueError, match=r"capability=\(7, 5\) < \(8, 0\)"):
        D.explain({**BASE, "capability": (7, 5)})
    with pytest.raises(ValueError, match="unknown field"):
        D.explain({**BASE, "tile": 1})


def test_explain_does_not_mutate_the_case():
    case = {**BASE, "compute_dtype": torch.bfloat16}
    snapshot = dict(case)
    D.explain(case)
    assert case == snapshot


def test_removed_k6_row_is_caught_by_the_oracle(monkeypatch):
    monkeypatch.setattr(D, "ROWS", tuple(r for r in D.ROWS if r.name != K6))
    outcome = O.check_boundaries(OracleView())
    assert not outcome.passed
    assert any("k6_small_m_M" in f for f in outcome.failures)


def test_hijacking_row_is_caught_by_the_oracle(monkeypatch):
    monkeypatch.setattr(D, "ROWS", (D.GENERIC_ROW, *D.ROWS))
    assert not O.check_boundaries(OracleView()).passed


def _plan(device, **overrides):
    args = dict(m=64, k=2048, n=4096, bits=6, codebook="mcg", x_dtype=torch.float16)
    return plan_dense(device=device, **{**args, **overrides})


@pytest.mark.parametrize(
    ("device_cap", "overrides", "path"),
    [
        ((12, 0), {}, K6),
        ((12, 0), {"m": 128}, K6),
        ((12, 0), {"m": 129}, "generic"),
        ((12, 0), {"x_dtype": torch.bfloat16}, K6),  # bf16 x is fine: fp16 compute, input copy
        ((12, 0), {"compute_dtype": torch.bfloat16}, "generic"),
        ((12, 0), {"bits": 5}, "generic"),
        ((12, 0), {"codebook": "sqg_fp16"}, "generic"),
        ((12, 0), {"external_rotation": True}, "generic"),
        ((12, 0), {"tile": [64, 256, 256]}, "generic"),
        ((12, 1), {}, "generic"),
        ((9, 0), {}, "generic"),
        ((8, 0), {}, "generic"),
        ((9, 0), {"m": 1025}, "decode_matmul"),
    ],
)
def test_public_plan_entry_follows_the_table(device_cap, overrides, path):
    device = SimulatedDevice("sim", 132, 227 * 1024, device_cap)
    plan = _plan(device, **overrides)
    assert plan.path == path
    assert plan.reasons[-1] == f"{path}: selected"


def test_every_path_is_reachable_from_plan_dense():
    seen = {
        _plan(RTX).path,
        _plan(RTX, m=129).path,
        _plan(RTX, m=2048).path,
    }
    assert seen == set(D.PATH_NAMES)
