"""The tolerance model: the coarse gates (α × faithful per row block, floor only where
the faithful error is zero, worst-row cosine, NaN/Inf), the exact rounding and the envelope
machinery of :mod:`oracle.judge.envelope`, and the judges' interface (arguments, stages, metrics,
expert stacks). The planted-fault table is tests/oracle/test_planted_faults.py."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.judge import envelope as env
from oracle.judge.tolerance import (
    DEFAULT_TOLERANCES,
    Tolerance,
    judge,
    judge_exact,
    judge_gemm,
    judge_linear,
    judge_moe,
)
from oracle.pytest_plugin import scaled_examples
from reference import linear
from reference.hadamard import apply_blockwise_faithful
from reference.moe import ROUTE_STAGES, TrellisExperts

F16 = torch.float16

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


def test_floor_applies_only_where_the_faithful_error_is_zero():
    e, _ = references()
    tol = Tolerance(alpha=2.0, floor=1e-3, reason="test")
    tiny_error = e * (1 + 5e-4)
    assert judge(tiny_error, e, e.clone(), tol).passed  # faithful == exact: floor decides
    assert not judge(e * (1 + 2e-3), e, e.clone(), tol).passed
    assert judge(tiny_error, e, None, tol).passed  # no faithful reference: floor alone
    assert not judge(e * (1 + 2e-3), e, None, tol).passed
    # A small but nonzero faithful error: alpha decides, the floor must not rescue the output.
    small = e * (1 + 1e-5)
    verdict = judge(tiny_error, e, small, tol)
    assert not verdict.passed
    assert verdict.metrics.coarse_bound == pytest.approx(2e-5, rel=1e-6)
    assert verdict.details["floor_blocks"] == 0
    mixed = small.clone()
    mixed[:16] = e[:16]  # block 0 rounded nothing: only it uses the floor
    verdict = judge(e * (1 + 1.5e-5), e, mixed, tol)
    assert verdict.passed and verdict.details["floor_blocks"] == 1


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
    tol = Tolerance(alpha=100.0, floor=0.0, min_row_cosine=0.999, row_block=256, reason="test")
    y = f.clone()
    y[17] = 0.0  # block rel-L2 ≈ 1/16 < 100 · 1e-3, but that row's cosine is 0
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
    """Element-wise construction of the tolerance block rule with Python loops over rows."""
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


@settings(deadline=None, max_examples=scaled_examples(25))
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
    from oracle.cases.variants import variant_by_name

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


# ----------------------------------------------------------------------- exact rounding

FORMATS = {  # dtype: (significand bits, smallest normal exponent, largest finite)
    torch.float16: (11, -14, 65504.0),
    torch.bfloat16: (8, -126, float(torch.finfo(torch.bfloat16).max)),
    torch.float32: (24, -126, float(torch.finfo(torch.float32).max)),
}


def rational_round(value: float, dtype: torch.dtype, mode: str = "nearest") -> float:
    """Round ``value`` into ``dtype`` with exact rational arithmetic (the definition)."""
    precision, emin, largest = FORMATS[dtype]
    if value == 0 or not math.isfinite(value):
        return value
    x = Fraction(value)
    exponent = max(math.floor(math.log2(abs(value))), emin)
    while Fraction(2) ** (exponent + 1) <= abs(x):  # log2 rounding slop
        exponent += 1
    while exponent > emin and Fraction(2) ** exponent > abs(x):
        exponent -= 1
    spacing = Fraction(2) ** (exponent - precision + 1)
    q = x / spacing
    if mode == "toward_zero":
        n = math.trunc(q)
    else:
        n = math.floor(q)
        rest = q - n
        if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2):
            n += 1
    out = n * spacing
    if abs(out) > Fraction(largest):
        if mode == "toward_zero":
            return math.copysign(largest, value)
        return math.copysign(math.inf, value)
    return float(out)


HARD_FP16 = [
    1 + 2**-11 + 2**-40,  # above a tie by less than fp32 can see: torch's cast rounds it down
    1 + 2**-11,  # exact tie: to even (1.0)
    1 + 3 * 2**-11,  # exact tie: to even (1 + 2^-9)
    -(1 + 2**-11 + 2**-40),
    2**-25 + 2**-60,  # just above half the smallest subnormal: rounds up to 2^-24
    2**-25,  # exactly half the smallest subnormal: ties to even (0)
    3 * 2**-26,
    65504.0,
    65519.99999,  # below the overflow threshold
    65520.0,  # the threshold: ties to even -> 2^16 -> inf
    2**-14 - 2**-26,  # subnormal/normal border
    1e-300,
    -0.0,
]


@pytest.mark.parametrize("value", HARD_FP16)
def test_fp16_rounding_is_correct_where_torch_rounds_twice(value):
    want = rational_round(value, torch.float16)
    x = torch.tensor([value], dtype=torch.float64)
    got = env.round_to(x, torch.float16)
    assert got.dtype == torch.float16
    assert float(got) == want or (math.isnan(want) and math.isnan(float(got)))
    assert math.copysign(1, float(got)) == math.copysign(1, want)
    with np.errstate(over="ignore"):
        assert float(np.float16(value)) == want  # numpy converts float64 -> float16 directly


def test_torch_float64_to_float16_cast_is_wrong_on_the_double_rounding_case():
    """Why the judges never cast float64 to fp16 with torch (they would misjudge ties)."""
    x = torch.tensor([1 + 2**-11 + 2**-40], dtype=torch.float64)
    assert float(x.to(torch.float16)) == 1.0
    assert float(env.round_to(x, torch.float16)) == 1 + 2**-10


@settings(deadline=None, max_examples=scaled_examples(300))
@given(
    value=st.floats(allow_nan=False, allow_infinity=False, width=64),
    dtype=st.sampled_from(list(FORMATS)),
    mode=st.sampled_from(["nearest", "toward_zero"]),
)
def test_rounding_matches_rational_arithmetic(value, dtype, mode):
    got = float(env.round_values(torch.tensor([value], dtype=torch.float64), dtype, mode=mode))
    assert got == rational_round(value, dtype, mode)


@pytest.mark.parametrize("dtype", list(FORMATS))
def test_rounding_near_ties_and_binade_edges(dtype):
    precision, emin, _ = FORMATS[dtype]
    g = torch.Generator().manual_seed(1)
    base = torch.randint(1 << (precision - 1), 1 << precision, (200,), generator=g).double()
    exponent = torch.randint(emin - precision, 40, (200,), generator=g)
    spacing = torch.ldexp(torch.ones(200, dtype=torch.float64), exponent)
    values = []
    for offset in (0.5, 0.5 - 2**-30, 0.5 + 2**-30, 0.25, 0.999):
        values.append((base + offset) * spacing)
    x = torch.cat(values)
    got = env.round_values(x, dtype)
    want = torch.tensor([rational_round(float(v), dtype) for v in x], dtype=torch.float64)
    assert torch.equal(got, want)


def test_ulp_of_each_binade_and_the_subnormals():
    x = torch.tensor([1.0, 1.5, 2.0, 2**-14, 2**-20, 0.0, -3.0], dtype=torch.float64)
    assert env.ulp(x, torch.float16).tolist() == [
        2**-10,
        2**-10,
        2**-9,
        2**-24,
        2**-24,
        2**-24,
        2**-9,
    ]
    assert env.ulp(torch.tensor([1.0], dtype=torch.float64), torch.bfloat16).item() == 2**-7
    with pytest.raises(ValueError, match="dtype"):
        env.ulp(x, torch.int32)


# ----------------------------------------------------------------------- envelope machinery


def test_hadamard_fp32_error_stays_inside_gamma_h():
    """The reference's fp32 butterfly against float64 on wide-range inputs: the bound
    ``γ_H·|H||v|`` holds and is not vacuous (the worst case uses a good part of it)."""
    g = torch.Generator().manual_seed(2)
    v = torch.randn(64, 512, generator=g) * torch.exp(3 * torch.randn(64, 512, generator=g))
    v = v.clamp(-6e4, 6e4).to(torch.float16).float()
    fp32 = apply_blockwise_faithful(v).double()
    exact = env.exact_h128(v)
    ratio = (fp32 - exact).abs() / (env.GAMMA_H * env.abs_h128(v.double().abs()))
    assert float(ratio.max()) <= 1.0
    assert float(ratio.max()) > 0.05


def test_gemm_envelope_is_the_same_in_any_chunking():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 200, generator=g).half()  # K not a multiple of 16: padded
    b = torch.randn(200, 37, generator=g).half()
    whole = env.gemm_envelope(env.Bound.exact(a), b)
    small = env.gemm_envelope(env.Bound.exact(a), b, memory_budget=1)
    for field in ("centre", "sound", "det", "var", "sys"):
        assert torch.equal(getattr(whole, field), getattr(small, field)), field
    assert torch.allclose(whole.centre, a.double() @ b.double(), rtol=0, atol=1e-12)
    fuzzy = env.Bound.interval(a.double() - 1e-3, a.double() + 1e-3)
    wide = env.gemm_envelope(fuzzy, b)
    chunked = env.gemm_envelope(fuzzy, b, memory_budget=1)
    for field in ("var", "sound", "sys"):  # matmuls of other shapes may differ in the last bit
        assert torch.allclose(getattr(wide, field), getattr(chunked, field), rtol=1e-12, atol=0)
    assert bool((wide.radius > whole.radius).all())


def test_gemm_envelope_batches_are_the_single_gemms():
    """Leading dims are independent GEMMs: each batch entry's bound is the one it gets alone, bit
    for bit (the MoE judge stacks the experts that share a route count)."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 4, 200, generator=g).half()
    b = torch.randn(3, 200, 24, generator=g).half()
    for bound in (
        env.Bound.exact(a),
        env.Bound.interval(a.double() - 1e-3, a.double() + 1e-3),
    ):
        batched = env.gemm_envelope(bound, b)
        for i in range(3):
            alone = env.gemm_envelope(env.Bound(*(t[i] for t in dataclasses.astuple(bound))), b[i])
            for field in ("centre", "sound", "det", "var", "sys"):
                assert torch.equal(getattr(batched, field)[i], getattr(alone, field)), field
    with pytest.raises(ValueError, match="b must have shape"):
        env.gemm_envelope(env.Bound.exact(a), b[:2])


def test_stage_check_counts_violations_and_reports_the_first():
    centre = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    bound = env.Bound.exact(centre)
    stage = env.stage_set("demo", bound, torch.float16)
    y = torch.tensor([[1.0, 2.0, 3.00390625, float("nan")]], dtype=torch.float16)
    report = env.check_stage(stage, y)
    assert (report.checked, report.violations) == (4, 2)
    assert report.first_violation == (0, 2)
    assert "demo: 2 of 4 elements outside" in report.reasons[0]
    assert report.worst_excess_ulp == math.inf
    rows = torch.tensor([False])
    assert env.check_stage(stage, y, rows=rows).checked == 0


def test_bias_gate_flags_a_constant_shift_inside_wide_sets():
    """Sets ±3 ulp wide around random centres: +1 ulp stays inside every set but moves the
    mean deviation by 1; round-to-nearest values pass."""
    g = torch.Generator().manual_seed(4)
    centre = (torch.rand(64, 64, generator=g, dtype=torch.float64) + 1) * 2
    unit = env.ulp(centre, torch.float16)
    bound = env.Bound(centre, 3 * unit, 3 * unit, torch.zeros_like(unit), torch.zeros_like(unit))
    stage = env.stage_set("wide", bound, torch.float16)
    good = env.round_to(centre, torch.float16)
    assert env.check_stage(stage, good).passed
    shifted = env.round_to(good.double() + unit, torch.float16)
    report = env.check_stage(stage, shifted)
    assert report.violations == 0 and not report.passed
    assert report.bias_mean_ulp == pytest.approx(1.0, abs=0.05)
    truncated = env.round_to(centre, torch.float16, mode="toward_zero")
    report = env.check_stage(stage, truncated)
    assert report.violations == 0 and not report.passed
    assert report.bias_signed_mean_ulp == pytest.approx(-0.5, abs=0.05)


# ----------------------------------------------------------------------- the judges' interface


def _gemm_operands(seed=0, m=4, k=256, n=64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).half(), (0.1 * torch.randn(k, n, generator=g)).half()


def test_judge_gemm_reports_the_stage_and_the_applied_bounds():
    x, w = _gemm_operands()
    y = (x.float() @ w.float()).half()
    verdict = judge_gemm(y, x, w, compute_dtype=torch.float16)
    assert verdict.passed, verdict.reason
    stage = verdict.details["stages"]["gemm"]
    assert stage["observed"] and stage["checked"] == y.numel() and stage["violations"] == 0
    assert stage["bias_applied"] and abs(stage["bias_mean_ulp"]) <= stage["bias_bound_ulp"]
    m = verdict.metrics
    assert m.envelope_checked == y.numel() and m.envelope_violations == 0
    assert 0 < m.envelope_worst_ratio <= 1.0 and m.envelope_worst_excess_ulp == 0
    assert m.coarse_ratio == pytest.approx(0.5) and m.coarse_bound > 0
    assert m.bias_bound_ulp > 0 and m.bias_mean_ulp is not None
    assert verdict.to_dict()["metrics"]["coarse_bound"] == m.coarse_bound
    bad = y.clone()
    bad[1, 3] = -bad[1, 3]
    verdict = judge_gemm(bad, x, w, compute_dtype=torch.float16)
    assert not verdict.passed and verdict.metrics.envelope_violations == 1
    assert "gemm: 1 of 256 elements outside" in verdict.reason and "(1, 3)" in verdict.reason


def test_judge_gemm_accepts_a_bf16_result_stored_as_fp16():
    x, w = _gemm_operands(1)
    y = (x.bfloat16().float() @ w.bfloat16().float()).bfloat16()
    assert judge_gemm(y, x, w, compute_dtype=torch.bfloat16).passed
    assert judge_gemm(y.half(), x, w, compute_dtype=torch.bfloat16).passed
    assert not judge_gemm(y.half(), x, w, compute_dtype=torch.float16).passed


def test_judge_gemm_fails_non_finite_output():
    x, w = _gemm_operands(2)
    y = (x.float() @ w.float()).half()
    y[0, 0] = float("inf")
    verdict = judge_gemm(y, x, w, compute_dtype=torch.float16)
    assert not verdict.passed and "non-finite" in verdict.reason


def test_judges_name_the_bad_argument():
    x, w = _gemm_operands(3)
    y = (x.float() @ w.float()).half()
    with pytest.raises(ValueError, match="compute_dtype"):
        judge_gemm(y, x, w, compute_dtype=torch.float32)
    with pytest.raises(TypeError, match="weight"):
        judge_gemm(y, x, w.int(), compute_dtype=torch.float16)
    with pytest.raises(ValueError, match="x must have shape"):
        judge_gemm(y, x[:, :-1], w, compute_dtype=torch.float16)
    with pytest.raises(ValueError, match="y must have shape"):
        judge_gemm(y[:, :-1], x, w, compute_dtype=torch.float16)
    with pytest.raises(TypeError, match="y must have dtype"):
        judge_gemm(y.float(), x, w, compute_dtype=torch.float16)
    with pytest.raises(TypeError, match="tolerance"):
        judge_gemm(y, x, w, compute_dtype=torch.float16, tolerance={"alpha": 2})
    k, n = 128, 128
    args = {
        "x": torch.zeros(2, k, dtype=torch.float16),
        "weight": torch.zeros(k, n, dtype=torch.float16),
        "suh": torch.ones(k, dtype=torch.float16),
        "svh": torch.ones(n, dtype=torch.float16),
        "compute_dtype": torch.float16,
    }
    y = torch.zeros(2, n, dtype=torch.float16)
    assert judge_linear(y, **args).passed
    with pytest.raises(ValueError, match="unknown stages"):
        judge_linear(y, **args, observed={"fc1": y})
    with pytest.raises(ValueError, match=r"observed\['gemm'\] must have shape"):
        judge_linear(y, **args, observed={"gemm": y[:1]})
    with pytest.raises(TypeError, match=r"observed\['rotated'\] must have dtype"):
        judge_linear(y, **args, observed={"rotated": args["x"].float()})
    with pytest.raises(ValueError, match="svh must have shape"):
        judge_linear(y, **{**args, "svh": torch.ones(n + 1, dtype=torch.float16)})
    with pytest.raises(TypeError, match="bias must have dtype"):
        judge_linear(y, **args, bias=torch.zeros(n))
    with pytest.raises(ValueError, match="weight must have shape"):
        judge_linear(y, **{**args, "weight": torch.zeros(k, 100, dtype=torch.float16)})
    with pytest.raises(TypeError, match="experts"):
        judge_moe(
            y, x=args["x"], experts=object(), topk_weights=torch.ones(2, 1),
            topk_ids=torch.zeros(2, 1, dtype=torch.int64), compute_dtype=torch.float16,
        )  # fmt: skip


def _linear_layer(seed=5, k=256, n=256, m=8):
    g = torch.Generator().manual_seed(seed)
    payload = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 64), generator=g).to(torch.int16)
    layer = linear.TrellisLinear(
        payload, (torch.rand(k, generator=g) + 0.5).half(),
        (torch.rand(n, generator=g) * 0.02 + 0.01).half(), "mcg",
    )  # fmt: skip
    return layer, torch.randn(m, k, generator=g).half()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_judge_linear_stages_and_the_faithful_reference(dtype):
    layer, x = _linear_layer()
    x = x.to(dtype)
    w = layer.decode()
    y = linear.forward(x, layer, precision="faithful", compute_dtype=dtype)
    rotated = linear.faithful_input_rotation(x, layer.suh)
    gemm = linear.faithful_gemm_compute(rotated, w, compute_dtype=dtype)
    kwargs = {"x": x, "weight": w, "suh": layer.suh, "svh": layer.svh, "compute_dtype": dtype}
    verdict = judge_linear(y, **kwargs)
    stages = verdict.details["stages"]
    assert verdict.passed, verdict.reason
    assert [stages[s]["observed"] for s in ("rotated", "gemm", "output")] == [False, False, True]
    assert stages["rotated"]["composed_into"] == "gemm"
    verdict = judge_linear(y, **kwargs, observed={"rotated": rotated, "gemm": gemm})
    assert verdict.passed, verdict.reason
    assert verdict.details["observed"] == ["gemm", "rotated"]
    assert verdict.metrics.envelope_checked == rotated.numel() + gemm.numel() + y.numel()
    # a wrong observed stage is reported at that stage, and the output judged from it passes
    broken = gemm.clone()
    broken[2, 7] = broken[2, 7] * 2 + 1
    verdict = judge_linear(y, **kwargs, observed={"rotated": rotated, "gemm": broken})
    assert not verdict.passed
    assert verdict.details["stages"]["gemm"]["violations"] == 1


def _tiers():
    from reference.tiers import MixedTierExperts

    def tier(seed, e, bits):
        g = torch.Generator().manual_seed(seed)

        def payload(*shape):
            return torch.randint(-(2**15), 2**15, shape, generator=g).to(torch.int16)

        def scales(*shape):
            sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
            return (sign * (0.5 + torch.rand(*shape, generator=g))).half()

        return TrellisExperts(
            payload(2, e, 8, 8, 16 * bits), payload(e, 8, 8, 16 * bits), scales(e, 128),
            scales(e, 128), scales(e, 384), scales(1, 128), "mcg", "proj",
        )  # fmt: skip

    return MixedTierExperts(tier(1, 3, 3), tier(2, 2, 4), 3, 4, "mcg", [5, 0, 3], [1, 7], 9)


def test_judge_moe_on_mixed_tiers_routes_by_global_id():
    from reference.tiers import mixed_moe_forward

    mixed = _tiers()
    g = torch.Generator().manual_seed(6)
    x = (0.5 * torch.randn(6, 128, generator=g)).half()
    ids = torch.tensor([[5, 1], [0, 7], [3, 2], [8, 5], [-1, 1], [2, 4]])  # 2, 4, 8 unmapped
    w = torch.rand(6, 2, generator=g) + 0.1
    w[4, 0] = float("nan")  # an inactive route's weight never leaks
    y = mixed_moe_forward(x, mixed, w, ids, precision="faithful").half()
    verdict = judge_moe(y, x=x, experts=mixed, topk_weights=w, topk_ids=ids, compute_dtype=F16)
    assert verdict.passed, verdict.reason
    assert verdict.details["active_routes"] == 7
    dropped = w.clone()
    dropped[1, 1] = 0.0  # the kernel lost token 1's tier-1 route
    bad = mixed_moe_forward(x, mixed, dropped, ids, precision="faithful").half()
    verdict = judge_moe(bad, x=x, experts=mixed, topk_weights=w, topk_ids=ids, compute_dtype=F16)
    assert not verdict.passed and verdict.details["stages"]["output"]["violations"] > 0


def test_judge_moe_inactive_routes_must_contribute_exactly_zero():
    mixed = _tiers()
    x = torch.full((2, 128), 0.25, dtype=torch.float16)
    ids = torch.tensor([[-1, 9], [5, -7]])
    w = torch.ones(2, 2)
    y = torch.zeros(2, 128, dtype=torch.float16)
    from reference.tiers import mixed_moe_forward

    y[1] = mixed_moe_forward(x, mixed, w, ids, precision="faithful")[1].half()
    verdict = judge_moe(y, x=x, experts=mixed, topk_weights=w, topk_ids=ids, compute_dtype=F16)
    assert verdict.passed, verdict.reason
    stale = y.clone()
    stale[0, 17] = 2**-14  # token 0 has no active route: anything but zero is a leak
    verdict = judge_moe(stale, x=x, experts=mixed, topk_weights=w, topk_ids=ids, compute_dtype=F16)
    assert not verdict.passed
    assert verdict.details["stages"]["output"]["first_violation"] == [0, 17]


def test_judge_moe_on_a_paired_stack_with_observed_stages():
    from reference.moe import stack_moe_forward, stack_route_stages
    from reference.moe_pairs import PairedExperts, p33_from_uniform

    g = torch.Generator().manual_seed(8)

    def payload(*shape):
        return torch.randint(-(2**15), 2**15, shape, generator=g).to(torch.int16)

    e, h, i = 4, 128, 256
    w2 = payload(e, i // 16, h // 16, 48)
    scales = (torch.rand(e, 3 * i, generator=g) + 0.5).half()
    suh = (torch.rand(e, h, generator=g) + 0.5).half()
    paired = PairedExperts(
        payload(2, e, h // 16, i // 16, 48), torch.stack([p33_from_uniform(w2[x], "k") for x in
        range(e)]), suh, suh.flip(0), scales, (torch.rand(1, h, generator=g) + 0.5).half(), "mcg",
        "proj", None, "P33",
    )  # fmt: skip
    x = (0.5 * torch.randn(5, h, generator=g)).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(5)])
    w = torch.rand(5, 2, generator=g)
    y = stack_moe_forward(x, paired, w, ids, precision="faithful").half()
    stages, active = stack_route_stages(x, paired, ids)
    observed = {name: stages[name] for name in ("rotated_gate", "rotated_up", "fc1", "fc2")}
    verdict = judge_moe(
        y, x=x, experts=paired, topk_weights=w, topk_ids=ids, compute_dtype=F16, observed=observed
    )
    assert verdict.passed, verdict.reason
    assert bool(active.all())
    reported = verdict.details["stages"]
    assert reported["activated"]["observed"] is False and reported["fc2"]["checked"] == 10 * h


def test_judge_moe_batches_experts_without_changing_the_verdict(monkeypatch):
    """Experts with equal route counts are judged in one batch: the verdict, every count and
    the first violation are those of judging each expert alone (BATCH_WEIGHT_ELEMENTS = 1), on a
    correct output and on one with a planted wrong element, every stage observed."""
    from oracle.judge import moe_judge
    from reference.moe import stack_moe_forward, stack_route_stages

    stack = _tiers().tier0  # 3 experts, proj layout
    g = torch.Generator().manual_seed(13)
    x = (0.5 * torch.randn(6, 128, generator=g)).half()
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 1], [1, 2], [2, -1]])  # 4, 4, 3 routes
    w = torch.rand(6, 2, generator=g) + 0.1
    y = stack_moe_forward(x, stack, w, ids, precision="faithful").half()
    wrong = y.clone()
    wrong[3, 40] = wrong[3, 40] * 2 + 1
    stages, _ = stack_route_stages(x, stack, ids)
    observed = {name: stages[name] for name in moe_judge.MOE_STAGES}
    batches = []
    real = moe_judge._moe_experts

    def spy(rows, batch, *args):
        batches.append(len(batch.experts))
        return real(rows, batch, *args)

    monkeypatch.setattr(moe_judge, "_moe_experts", spy)
    verdicts = {}
    default = moe_judge.BATCH_WEIGHT_ELEMENTS
    for limit in (default, 1):
        monkeypatch.setattr(moe_judge, "BATCH_WEIGHT_ELEMENTS", limit)
        verdicts[limit] = [
            judge_moe(
                out,
                x=x,
                experts=stack,
                topk_weights=w,
                topk_ids=ids,
                compute_dtype=F16,
                observed=observed,
            )  # fmt: skip
            for out in (y, wrong)
        ]
    # per judged output: 3 routes (expert 2) alone, then 4 routes (experts 0 and 1) together
    assert batches == [1, 2] * 2 + [1, 1, 1] * 2
    batched, alone = verdicts[default], verdicts[1]
    assert batched[0].passed and alone[0].passed, batched[0].reason
    assert not batched[1].passed and not alone[1].passed
    for together, single in zip(batched, alone, strict=True):
        for name, stage in together.details["stages"].items():
            other = single.details["stages"][name]
            for key in ("checked", "violations", "first_violation"):
                assert stage.get(key) == other.get(key), (name, key)
            assert stage.get("worst_ratio") == pytest.approx(other.get("worst_ratio"), rel=1e-9)
    assert batched[1].details["stages"]["output"]["first_violation"] == [3, 40]
    assert all(batched[0].details["stages"][name]["observed"] for name in moe_judge.MOE_STAGES)


def test_route_stages_reproduce_the_faithful_route_outputs():
    """reference.moe's stage functions are the faithful chain, not a copy of it."""
    from reference.moe import stack_route_outputs, stack_route_stages

    mixed = _tiers()
    x = (0.5 * torch.randn(4, 128, generator=torch.Generator().manual_seed(9))).half()
    ids = torch.tensor([[0, 1], [2, -1], [4, 0], [1, 2]])
    stages, active = stack_route_stages(x, mixed.tier0, ids)
    outputs, active_ref = stack_route_outputs(x, mixed.tier0, ids, precision="faithful")
    assert torch.equal(active, active_ref.reshape(-1))
    assert torch.equal(stages["term"], outputs.reshape(8, 128))
    assert set(stages) == set(ROUTE_STAGES)


def test_judge_moe_references_are_the_reference_forwards_bit_for_bit(monkeypatch):
    """The judge decodes each routed expert once and builds its exact and faithful references
    from those weights: they must be reference.moe's / reference.tiers' forwards exactly (a
    planted drift, e.g. the faithful term computed in the exact chain, fails here)."""
    from oracle.judge import moe_judge
    from reference.moe import stack_moe_forward
    from reference.tiers import mixed_moe_forward

    seen = {}

    def capture(y, exact, faithful, tol):
        seen.update(exact=exact, faithful=faithful)
        return real(y, exact, faithful, tol)

    real = moe_judge.coarse_verdict
    monkeypatch.setattr(moe_judge, "coarse_verdict", capture)
    mixed = _tiers()
    g = torch.Generator().manual_seed(12)
    x = (0.5 * torch.randn(6, 128, generator=g)).half()
    global_ids = torch.tensor([[5, 1], [0, 7], [3, 2], [8, 5], [-1, 1], [2, 4]])
    local_ids = torch.tensor([[0, 1], [2, -1], [1, 0], [1, 2], [-1, 0], [2, 1]])
    w = torch.rand(6, 2, generator=g) + 0.1
    w[4, 0] = float("nan")
    for stack, ids, forward in (
        (mixed, global_ids, mixed_moe_forward),
        (mixed.tier1, local_ids, stack_moe_forward),
    ):
        for cd in (F16, torch.bfloat16):
            faithful = forward(x, stack, w, ids, precision="faithful", compute_dtype=cd)
            exact = forward(x, stack, w, ids, precision="exact")
            verdict = judge_moe(
                faithful.half(), x=x, experts=stack, topk_weights=w, topk_ids=ids,
                compute_dtype=cd,
            )  # fmt: skip
            assert verdict.passed, verdict.reason
            assert torch.equal(seen["exact"], exact)
            assert torch.equal(seen["faithful"], faithful.half())
