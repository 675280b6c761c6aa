"""oracle.contracts.lints: the R9 (Int32 index x stride, a product widened after it wrapped) and R11
(codebook default) lints.

Each rule is shown to fire on a hand-written bad snippet and to stay quiet on the good form; the
real b12x must be clean (the mutation gate's R9 and R11 mutants are killed by that test).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from oracle.contracts.lints import lint_package, lint_source


def _rules(text: str) -> list[str]:
    return [f.rule for f in lint_source(text, "m.py")]


def test_real_b12x_is_lint_clean():
    findings = lint_package()
    assert findings == [], "\n".join(map(str, findings))


@pytest.mark.parametrize(
    "bad",
    [
        "dst = base + (Int32(kt * 16 + row) * n + col) * 2",
        "off = stride * Int32(page)",
        "off = cutlass.Int32(row) * row_bytes",
        "off = Int32(page * stride)",
    ],
)
def test_int32_index_products_are_flagged(bad):
    assert _rules(bad) == ["int32-index-product"]


@pytest.mark.parametrize(
    "good",
    [
        "dst = base + ((Int64(kt) * 16 + row) * n + col) * 2",
        "start = (Int32(lane) * 8 + 257) * bits - 16",
        "h = s * Uint32(multiplier)",
        "x = Int32(-2) * 4",
        "y = Int32(a + b)",
    ],
)
def test_int64_products_literal_scales_and_uint32_hashes_pass(good):
    assert _rules(good) == []


@pytest.mark.parametrize(
    "bad",
    [
        "dst = base + (Int64(kt * 16 + row) * n + col) * 2",
        "run = Int64(bx * (lay.cta_tiles * 32 * bits))",
        "row = Int64(payload.shape[1] * (4 * 8 * self.bits))",
        "off = cutlass.Int64(c * 16)",
        "off = Int64((a + b) * stride)",
    ],
)
def test_products_widened_after_the_fact_are_flagged(bad):
    assert _rules(bad) == ["widened-after-product"]


@pytest.mark.parametrize(
    "good",
    [
        "run = Int64(bx) * (lay.cta_tiles * 32 * bits)",
        "row = Int64(4 * 8 * self.bits)",
        "rec = Int64(2 * RECORD_ROWS * 32 * self.rates[0])",
        "off = Int64(tid + 16)",
        "off = Int64(f(a * b))",
    ],
)
def test_widened_operands_and_compile_time_products_pass(good):
    assert _rules(good) == []


@pytest.mark.parametrize(
    "bad",
    [
        "def f(x, codebook='mcg'): pass",
        "def f(x, *, trellis_codebook='sqg_e4m3'): pass",
        "def f(x, bits=4): pass",
        "class K:\n    def __init__(self, fmt=DEFAULT): pass",
    ],
)
def test_codebook_and_rate_defaults_are_flagged(bad):
    assert _rules(bad) == ["codebook-default"]


@pytest.mark.parametrize(
    "good",
    ["def f(x, codebook, *, bits): pass", "def f(codebook, bits=None): pass", "def f(n=4): pass"],
)
def test_explicit_codebooks_and_none_defaults_pass(good):
    assert _rules(good) == []


def test_unparsable_source_is_a_finding_not_a_pass():
    assert _rules("def f(:\n") == ["parse-error"]


def test_package_walk_and_cli_exit_codes(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "ok.py").write_text("x = Int64(i) * stride\n")
    assert lint_package(pkg) == []
    (pkg / "bad.py").write_text("\n\ny = Int32(i) * stride\n")
    [finding] = lint_package(pkg)
    assert (finding.rule, finding.line, finding.path.endswith("bad.py")) == (
        "int32-index-product",
        3,
        True,
    )
    cmd = [sys.executable, "-m", "oracle.contracts.lints", str(pkg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "bad.py:3" in proc.stdout


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(TypeError, match="text"):
        lint_source(b"x = 1")
    with pytest.raises(TypeError, match="root"):
        lint_package(3)
    with pytest.raises(ValueError, match="root"):
        lint_package(tmp_path / "missing")


def test_an_exemption_needs_its_reason_and_a_finding_to_exempt():
    bad = "run = Int64(bx * stride)"
    assert _rules(f"# lint-ok widened-after-product: the plan bounds bx * stride\n{bad}") == []
    assert _rules(f"{bad}  # lint-ok widened-after-product: the plan bounds it") == []
    # no reason: the finding stays and the exemption is one
    assert sorted(_rules(f"# lint-ok widened-after-product\n{bad}")) == [
        "bad-exemption", "widened-after-product"]  # fmt: skip
    # another rule's exemption exempts nothing; one above code, not alone on its line, neither
    assert sorted(_rules(f"# lint-ok codebook-default: no\n{bad}")) == [
        "bad-exemption", "widened-after-product"]  # fmt: skip
    assert sorted(_rules(f"x = 1  # lint-ok widened-after-product: y\n{bad}")) == [
        "bad-exemption", "widened-after-product"]  # fmt: skip
    # an exemption left behind after the code it excused was fixed
    assert _rules("# lint-ok widened-after-product: stale\nrun = Int64(bx) * stride") == [
        "bad-exemption"]  # fmt: skip
