"""The generic dispatch checks pass on a good table and CATCH broken ones (R2).

The test double is a tiny first-match table with a K6/MCG small-M row (spec §5.5 gate:
capability (12,0), M <= 128, K6, MCG, unpaired, fp16 compute, no external H128, no explicit
tile) above a generic row. Broken variants: the row deleted from routing, the M gate off by one,
an undeclared path, a non-deterministic explain, a row that hijacks the small-M band.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from oracle.judge.dispatch import (
    Boundary,
    Explanation,
    Path,
    check_boundaries,
    check_determinism,
    check_reachability,
    check_table,
    validate_table,
)

BASE = dict(
    capability=(12, 0),
    m=1,
    bits=6,
    codebook="mcg",
    pair_kind=None,
    compute_dtype="fp16",
    external_rotation=False,
    explicit_tile=None,
)


def k6_gate(case, m_max=128):
    return (
        case["capability"] == (12, 0)
        and case["m"] <= m_max
        and case["bits"] == 6
        and case["codebook"] == "mcg"
        and case["pair_kind"] is None
        and case["compute_dtype"] == "fp16"
        and not case["external_rotation"]
        and case["explicit_tile"] is None
    )


K6 = Path("k6_mcg_small_m", k6_gate)
GENERIC = Path("generic", lambda case: True)

BOUNDARIES = (
    Boundary("k6 M band", {**BASE}, "m", 128, 129, "k6_mcg_small_m", "generic"),
    Boundary("k6 arch", {**BASE}, "capability", (12, 0), (12, 1), "k6_mcg_small_m", "generic"),
    Boundary("k6 bits", {**BASE}, "bits", 6, 5, "k6_mcg_small_m", "generic"),
    Boundary("k6 codebook", {**BASE}, "codebook", "mcg", "3inst", "k6_mcg_small_m", "generic"),
    Boundary("k6 pin", {**BASE}, "explicit_tile", None, (64, 256), "k6_mcg_small_m", "generic"),
)


@dataclasses.dataclass
class FirstMatchTable:
    """Declared ``paths`` (what is implemented) and ``rows`` (what explain routes through)."""

    paths: tuple
    rows: tuple
    boundaries: tuple = BOUNDARIES
    name: str = "double"

    def explain(self, case):
        reasons = []
        for row in self.rows:
            if row.predicate(case):
                reasons.append(f"{row.name}: gate holds")
                return Explanation(row.name, tuple(reasons))
            reasons.append(f"{row.name}: gate false")
        raise ValueError("no row matched")


def grid():
    for m, bits, cap in itertools.product((1, 8, 128, 129, 512), (5, 6), ((12, 0), (12, 1))):
        yield {**BASE, "m": m, "bits": bits, "capability": cap}


def good_table():
    return FirstMatchTable(paths=(K6, GENERIC), rows=(K6, GENERIC))


def test_good_table_passes_every_check():
    outcomes = check_table(good_table(), grid())
    assert [o.check for o in outcomes] == [
        "dispatch.boundaries",
        "dispatch.reachability",
        "dispatch.determinism",
        "dispatch.consistency",
    ]
    assert all(o.passed for o in outcomes), [o.failures for o in outcomes]
    hits = outcomes[1].metrics["hits"]
    # independent count: K6 rows of the grid are m <= 128, bits 6, cap (12,0): m in {1,8,128}
    # -> 3 grid points, plus one "below" side for each of the 5 boundaries.
    assert hits["k6_mcg_small_m"] == 3 + 5


def test_deleted_row_is_caught_as_unreachable_and_at_boundaries():
    table = FirstMatchTable(paths=(K6, GENERIC), rows=(GENERIC,))
    reach = check_reachability(table, grid())
    assert not reach.passed
    assert any("`k6_mcg_small_m` is unreachable" in f for f in reach.failures)
    bounds = check_boundaries(table)
    assert not bounds.passed
    assert bounds.metrics["failures"] == 5  # every "below" side now routes to generic


def test_deleted_declaration_is_caught_at_boundaries():
    table = FirstMatchTable(paths=(GENERIC,), rows=(GENERIC,))
    bounds = check_boundaries(table)
    assert any("is not declared" in f for f in bounds.failures)


def test_boundary_off_by_one_is_caught_on_the_right_side():
    off = Path("k6_mcg_small_m", lambda c: k6_gate(c, m_max=127))
    table = FirstMatchTable(paths=(off, GENERIC), rows=(off, GENERIC))
    bounds = check_boundaries(table)
    assert bounds.metrics["failures"] == 1
    (failure,) = bounds.failures
    assert "k6 M band (below: m=128)" in failure and "chose `generic`" in failure


def test_hijacking_row_is_caught():
    hijack = Path("tiny_m", lambda c: c["m"] <= 8)
    table = FirstMatchTable(paths=(hijack, K6, GENERIC), rows=(hijack, K6, GENERIC))
    bounds = check_boundaries(table)
    # the base case has m = 1, so every boundary except the M band's sides is hijacked below
    assert not bounds.passed
    assert all("chose `tiny_m`" in f for f in bounds.failures)


def test_undeclared_path_is_caught():
    secret = Path("secret", lambda c: c["bits"] == 5)
    table = FirstMatchTable(paths=(K6, GENERIC), rows=(K6, secret, GENERIC))
    reach = check_reachability(table, grid())
    assert any("undeclared path `secret`" in f for f in reach.failures)


def test_nondeterministic_explain_is_caught():
    class Flaky(FirstMatchTable):
        calls = 0

        def explain(self, case):
            Flaky.calls += 1
            return Explanation("generic" if Flaky.calls % 2 else "k6_mcg_small_m")

    out = check_determinism(Flaky(paths=(K6, GENERIC), rows=()), grid())
    assert not out.passed and "not deterministic" in out.failures[0]


def test_mutating_explain_is_caught():
    class Mutating(FirstMatchTable):
        def explain(self, case):
            result = super().explain(case)
            case["m"] = 0
            return result

    out = check_determinism(Mutating(paths=(K6, GENERIC), rows=(K6, GENERIC)), [dict(BASE)])
    assert any("mutated the case" in f for f in out.failures)


def test_validation_names_the_missing_member():
    class NoExplain:
        name = "x"
        paths = ()
        boundaries = ()

    with pytest.raises(TypeError, match="`explain`"):
        validate_table(NoExplain())
    with pytest.raises(ValueError, match="duplicated path names"):
        validate_table(FirstMatchTable(paths=(K6, K6), rows=()))
    with pytest.raises(ValueError, match="below and above are equal"):
        Boundary("b", BASE, "m", 1, 1, "a", "b")


def test_boundaries_declared_as_plain_mappings_are_accepted_and_validated():
    plain = tuple(dataclasses.asdict(b) for b in BOUNDARIES)  # what b12x can declare
    table = FirstMatchTable(paths=(K6, GENERIC), rows=(K6, GENERIC), boundaries=plain)
    assert check_boundaries(table).passed
    off = Path("k6_mcg_small_m", lambda c: k6_gate(c, m_max=127))
    broken = FirstMatchTable(paths=(off, GENERIC), rows=(off, GENERIC), boundaries=plain)
    assert check_boundaries(broken).metrics["failures"] == 1
    partial = ({k: v for k, v in plain[0].items() if k != "expect_above"},)
    with pytest.raises(TypeError, match="expect_above"):
        validate_table(FirstMatchTable(paths=(K6, GENERIC), rows=(), boundaries=partial))
