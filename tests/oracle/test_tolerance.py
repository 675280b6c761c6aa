"""The design §6 tolerance rule: α × faithful per row block, floor, worst-row cosine, NaN/Inf."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.tolerance import DEFAULT_TOLERANCES, Tolerance, judge, judge_exact

DELTA = 1e-3  # faithful rel-L2, exactly, in every row and block


def references(rows: int = 64, cols: int = 32, seed: int = 0):
    """Exact reference e and a faithful reference f with rel-L2 exactly DELTA in every row."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(rows, cols, dtype=torch.float64, generator=g)
    signs = torch.randint(0, 2, (rows, cols), generator=g).to(torch.float64) * 2 - 1
    f = e + DELTA * e.abs() * signs  # |f - e| = DELTA·|e| elementwise
    return e, f


def test_faithful_quality_output_passes_and_two_and_a_half_alpha_fails():
    e, f = references()
    tol = Tolerance(alpha=2.0, floor=0.0, min_row_cosine=0.999, row_block=16, reason="test")
    good = judge(e + 1.5 * (f - e), e, f, tol)
    assert good.passed and good.reasons == ()
    assert good.metrics.ratio == pytest.approx(1.5, rel=1e-9)
    bad = judge(e + 2.5 * tol.alpha * (f - e), e, f, tol)
    assert not bad.passed
    assert "4 of 4 row blocks" in bad.reason
    assert bad.metrics.ratio == pytest.approx(5.0, rel=1e-9)  # metrics reported on failure too
    just_over = judge(e + 1.01 * tol.alpha * (f - e), e, f, tol)
    just_under = judge(e + 0.99 * tol.alpha * (f - e), e, f, tol)
    assert not just_over.passed and just_under.passed


def test_floor_applies_when_faithful_error_is_tiny():
    e, _ = references()
    tol = Tolerance(alpha=2.0, floor=1e-3, reason="test")
    tiny_error = e * (1 + 5e-4)
    assert judge(tiny_error, e, e.clone(), tol).passed  # faithful == exact: floor decides
    assert not judge(e * (1 + 2e-3), e, e.clone(), tol).passed
    assert judge(tiny_error, e, None, tol).passed  # no faithful reference: floor alone
    assert not judge(e * (1 + 2e-3), e, None, tol).passed


def test_single_bad_row_that_a_mean_would_hide_fails():
    e, f = references(rows=256)
    tol = Tolerance(alpha=2.0, floor=0.0, reason="test")
    y = f.clone()
    y[200] = e[200] * 1.02  # rel error 0.02 in one row of 256
    verdict = judge(y, e, f, tol)
    global_rel = verdict.metrics.rel_l2
    assert global_rel <= tol.alpha * DELTA  # the global mean alone would pass
    assert not verdict.passed
    assert "rows 192..207" in verdict.reason
    assert verdict.details["failing_row_blocks"] == [12]


def test_worst_row_cosine_catches_a_zeroed_row_inside_a_passing_block():
    e, f = references(rows=256)
    tol = Tolerance(alpha=2.0, floor=0.1, min_row_cosine=0.999, row_block=256, reason="test")
    y = f.clone()
    y[17] = 0.0  # block rel-L2 ≈ 1/16 < floor, but that row's cosine is 0
    verdict = judge(y, e, f, tol)
    assert not verdict.passed
    assert len(verdict.reasons) == 1 and "cosine" in verdict.reason and "row 17" in verdict.reason


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_output_always_fails(poison):
    e, f = references()
    lenient = Tolerance(alpha=1e6, floor=1e6, min_row_cosine=-1.0, reason="test: anything goes")
    y = f.clone()
    y[3, 5] = poison
    verdict = judge(y, e, f, lenient)
    assert not verdict.passed
    assert "non-finite" in verdict.reasons[0]


def test_exact_tolerance_uses_torch_equal_semantics():
    a = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert judge_exact(a, a.clone()).passed
    b = a.clone()
    b[1, 2] = 99
    b[2, 3] = 98
    verdict = judge_exact(a, b)
    assert not verdict.passed
    assert verdict.details == {"mismatches": 2, "first_mismatch": [1, 2]}
    assert "2 of 12" in verdict.reason and "(1, 2)" in verdict.reason
    exact_tol = Tolerance(exact=True, reason="test: exact")
    assert not judge(a.float(), b.float(), None, exact_tol).passed
    assert judge(a.float(), a.float(), None, exact_tol).passed


def test_judge_exact_matches_torch_equal_on_edge_cases():
    pairs = [
        (torch.tensor([0.0]), torch.tensor([-0.0])),
        (torch.tensor([float("nan")]), torch.tensor([float("nan")])),
        (torch.ones(2, dtype=torch.float16), torch.ones(2, dtype=torch.float32)),
        (torch.ones(2, 3), torch.ones(3, 2)),
        (torch.ones(4), torch.ones(4)),
    ]
    expected = [True, False, False, False, True]
    for (a, b), want in zip(pairs, expected, strict=True):
        same_dtype_and_shape = a.dtype == b.dtype and a.shape == b.shape
        assert want == (same_dtype_and_shape and torch.equal(a, b))
        assert judge_exact(a, b).passed == want


def test_tolerance_validation_and_overrides_need_reasons():
    with pytest.raises(ValueError, match="reason"):
        Tolerance(reason="")
    with pytest.raises(ValueError, match="alpha"):
        Tolerance(alpha=0.0)
    with pytest.raises(ValueError, match="floor"):
        Tolerance(floor=-1.0)
    with pytest.raises(ValueError, match="row_block"):
        Tolerance(row_block=0)
    base = DEFAULT_TOLERANCES["fp16"]
    with pytest.raises(ValueError, match="reason"):
        base.override(reason="default", alpha=3.0)
    with pytest.raises(ValueError, match="reason"):
        base.override(reason="  ", alpha=3.0)
    with pytest.raises(ValueError, match="unknown"):
        base.override(reason="why", beta=3.0)
    changed = base.override(reason="measured drift on sm_120", alpha=3.0)
    assert changed.alpha == 3.0 and changed.floor == base.floor
    assert DEFAULT_TOLERANCES["bf16"].floor > DEFAULT_TOLERANCES["fp16"].floor


def test_judge_rejects_bad_arguments():
    e, f = references(rows=4, cols=4)
    with pytest.raises(ValueError, match="shape"):
        judge(e[:2], e, f)
    with pytest.raises(TypeError, match="tol"):
        judge(e, e, f, tol={"alpha": 2})
    with pytest.raises(TypeError, match="y"):
        judge(e.tolist(), e, f)


def naive_block_verdicts(y, e, f, tol):
    """Element-wise construction of the §6 block rule with Python loops over rows."""
    rows = e.shape[0]
    verdicts = []
    for start in range(0, rows, tol.row_block):
        err = ref = ferr = 0.0
        for r in range(start, min(start + tol.row_block, rows)):
            for c in range(e.shape[1]):
                ev, yv, fv = float(e[r, c]), float(y[r, c]), float(f[r, c])
                err += (yv - ev) ** 2
                ferr += (fv - ev) ** 2
                ref += ev**2
        rel_y, rel_f = (err / ref) ** 0.5, (ferr / ref) ** 0.5
        verdicts.append(rel_y <= max(tol.alpha * rel_f, tol.floor))
    return verdicts


@settings(deadline=None, max_examples=25)
@given(
    rows=st.sampled_from([1, 5, 16, 17, 33]),
    cols=st.sampled_from([1, 8, 24]),
    row_block=st.sampled_from([1, 4, 16]),
    scale=st.sampled_from([0.5, 1.9, 2.1, 4.0]),
    bad_row=st.integers(min_value=0, max_value=32),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_block_rule_matches_an_elementwise_construction(
    rows, cols, row_block, scale, bad_row, seed
):
    e, f = references(rows, cols, seed)
    y = e + scale * (f - e)
    y[bad_row % rows] = e[bad_row % rows] * (1 + 3 * DELTA)
    tol = Tolerance(alpha=2.0, floor=0.0, min_row_cosine=-1.0, row_block=row_block, reason="t")
    naive = naive_block_verdicts(y, e, f, tol)
    verdict = judge(y, e, f, tol)
    failing = [i for i, ok in enumerate(naive) if not ok]
    assert verdict.details["failing_row_blocks"] == failing
    assert verdict.passed == all(naive)


@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
def test_registry_tolerance_on_reference_dense_layers(dtype_name):
    """The faithful reference stands in for a correct kernel (ratio 1: passes); the same layer
    decoded with the wrong codebook (an R-class codebook swap) must fail."""
    from oracle.variants import variant_by_name
    from reference import linear

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    tol = variant_by_name(f"dense/mcg/k4/{dtype_name}").tolerance
    g = torch.Generator().manual_seed(3)
    k = n = 256
    payload = torch.randint(
        -(1 << 15), 1 << 15, (k // 16, n // 16, 64), dtype=torch.int16, generator=g
    )
    suh = (torch.rand(k, generator=g) + 0.5).half()
    svh = (torch.rand(n, generator=g) * 0.02 + 0.01).half()
    x = torch.randn(17, k, generator=g).to(dtype)
    layer = linear.TrellisLinear(payload, suh, svh, "mcg")
    exact = linear.forward(x, layer, precision="exact")
    faithful = linear.forward(x, layer, precision="faithful", compute_dtype=dtype)
    verdict = judge(faithful, exact, faithful, tol)
    assert verdict.passed, verdict.reason
    assert verdict.metrics.rel_l2 < tol.floor
    swapped = linear.TrellisLinear(payload, suh, svh, "3inst")
    wrong = linear.forward(x, swapped, precision="faithful", compute_dtype=dtype)
    bad = judge(wrong, exact, faithful, tol)
    assert not bad.passed and bad.metrics.rel_l2 > 0.5
