"""The split-K table of the dense GEMM (R2, R15): both sides of every threshold, reachability,
the same answer as the measured rule (the table and its keyword form ``split_k``), and
plan_dense asking it.

The rule is restated here from its description (H200 sweep: aim for ~12 CTAs per SM at M <= 16,
~4 above; every slice keeps >= 16 K16 rows; at most 64 slices), not read back from the table.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from b12x.ops.dense import plan_dense
from b12x.ops.dense import split_k as S
from oracle.judge import dispatch as O
from oracle.judge.tiles import SimulatedDevice

H200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))


def measured_rule(m, k, n, *, m_tiles, n_tiles, warps, sm_count):
    ctas = (n // (16 * n_tiles * warps)) * -(-m // (16 * m_tiles))
    per_sm = 12 if m <= 8 else 6 if m <= 16 else 4  # depth: the GEMV, mid small M, the rest
    wanted = max(1, -(-per_sm * sm_count // max(ctas, 1)))
    return max(1, min(wanted, k // 16 // 16, 64))


GRID = [
    dict(m=m, k=k, n=n, m_tiles=mt, n_tiles=nt, warps=w, sm_count=sms)
    for m, k, n, mt, nt, w, sms in itertools.product(
        (1, 8, 9, 16, 17, 33, 64, 129, 1024),
        (128, 384, 512, 3584, 3840, 8192, 16128, 16384),
        (256, 4096, 28672),
        (1, 2, 4),
        (2, 4),
        (4, 8),
        (16, 56, 57, 85, 86, 132),
    )
]


def test_oracle_generic_checks_pass():
    outcomes = O.check_table(S.TABLE, GRID[::7])
    assert [o.failures for o in outcomes] == [(), (), (), ()]
    hits = outcomes[1].metrics["hits"]
    assert all(hits[row.name] > 0 for row in S.ROWS), hits


def test_every_boundary_names_literal_sides_on_both_sides():
    """Each threshold of the rule has a declared boundary (hand-listed here, not derived)."""
    sides = {(b.field, b.below, b.above) for b in S.BOUNDARIES}
    for expected in [
        ("path", "generic", "decode_matmul"),
        ("path", "generic", "k6_mcg_small_m"),
        ("requested", None, 4),
        ("k", 384, 512),
        ("m", 8, 9),
        ("m", 16, 17),
        ("sm_count", 56, 57),
        ("k", 3584, 3840),
        ("sm_count", 85, 86),
        ("k", 16128, 16384),
    ]:
        assert expected in sides, expected


def test_table_equals_the_measured_rule_on_the_grid():
    for case in GRID:
        assert S.explain(case).split_k == measured_rule(**case), case
        assert S.split_k(**case) == measured_rule(**case), case


def test_explicit_requests_and_other_paths():
    assert S.explain({"requested": 7}).split_k == 7
    assert S.explain({"requested": 7}).path == "explicit"
    for path in ("decode_matmul", "k6_mcg_small_m"):
        got = S.explain({"path": path})
        assert (got.path, got.split_k) == ("off_generic_path", 1)


@pytest.mark.parametrize("row", [r.name for r in S.ROWS])
def test_a_removed_row_is_caught_by_the_oracle(monkeypatch, row):
    monkeypatch.setattr(S, "ROWS", tuple(r for r in S.ROWS if r.name != row))
    view = type("View", (), {})()
    view.name, view.paths, view.boundaries, view.explain = "split", S.ROWS, S.BOUNDARIES, S.explain
    assert not O.check_boundaries(view).passed


def test_a_moved_threshold_is_caught_by_the_oracle(monkeypatch):
    monkeypatch.setattr(S, "SMALL_M_MAX", 17)  # M = 17 would still count as small
    assert not O.check_boundaries(S.TABLE).passed


def test_a_moved_gemv_threshold_is_caught_by_the_oracle(monkeypatch):
    monkeypatch.setattr(S, "GEMV_M_MAX", 9)  # M = 9 would keep 15 slices of partials
    assert not O.check_boundaries(S.TABLE).passed


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("m", 0, ValueError),
        ("m", True, TypeError),
        ("k", 2.0, TypeError),
        ("sm_count", -1, ValueError),
        ("requested", 0, ValueError),
        ("requested", False, TypeError),
        ("path", "fused", ValueError),
        ("path", None, TypeError),
    ],
)
def test_explain_rejects_bad_fields_naming_them(field, value, error):
    with pytest.raises(error, match=field):
        S.explain({field: value})
    with pytest.raises(ValueError, match="unknown field"):
        S.explain({"splits": 3})


def test_plan_dense_asks_the_table(monkeypatch):
    plan = plan_dense(
        m=16, k=8192, n=28672, bits=4, codebook="mcg", x_dtype=torch.float16, device=H200
    )
    assert plan.path == "generic" and plan.split_reasons[-1] == "fill_mid_m: selected"
    assert plan.split_k == 8  # 112 CTAs: ceil(6*132/112) = 8, K allows 32
    assert plan.buffer("c_tmp").shape == (8, 16, 28672)
    seen = []
    real = S.explain

    def spy(case):
        seen.append(dict(case))
        return S.SplitExplanation("spy", ("spy: selected",), 3)

    monkeypatch.setattr(S, "explain", spy)
    spied = plan_dense(
        m=16, k=8192, n=28672, bits=4, codebook="mcg", x_dtype=torch.float16, device=H200
    )
    assert spied.split_k == 3 and spied.split_reasons == ("spy: selected",)
    assert seen == [
        {
            "path": "generic",
            "requested": None,
            "planned": None,  # M = 16: the per-warp decode (b12x.ops.dense.mainloop)
            "m": 16,
            "k": 8192,
            "n": 28672,
            "m_tiles": 1,
            "n_tiles": plan.geometry.n_tiles,
            "warps": plan.geometry.warps,
            "sm_count": 132,
        }
    ]
    monkeypatch.setattr(S, "explain", real)


def test_plan_dense_off_the_generic_path_asks_too():
    rtx = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))
    plan = plan_dense(
        m=8, k=2048, n=4096, bits=6, codebook="mcg", x_dtype=torch.float16, device=rtx
    )
    assert plan.path == "k6_mcg_small_m" and plan.split_k == 1
    assert plan.split_reasons == ("off_generic_path: selected",)
