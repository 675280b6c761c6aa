"""The hypothesis profiles take effect: no test pins its example count or its randomness.

A literal example count (or derandomisation) in a test's ``@settings`` overrides the
loaded profile, so ``--hypothesis-profile stress`` would still run that test's few examples and
replay the same ones. Tests give their budget as their ``ci`` count through
:func:`oracle.pytest_plugin.scaled_examples`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import settings

from oracle.pytest_plugin import CI_EXAMPLES, scaled_examples

TESTS = Path(__file__).resolve().parent
PINNED = re.compile(r"max_examples\s*=\s*\d|derandomize\s*=\s*True")


def pinned_settings(root: Path) -> list[str]:
    """``file:line`` of every literal example count or derandomisation under ``root``."""
    found = []
    for path in sorted(root.rglob("test_*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PINNED.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_no_test_pins_its_examples_or_its_seed():
    assert pinned_settings(TESTS) == []


def test_the_finder_sees_a_pinned_count(tmp_path):
    count, seed = "max_examples" + "=40", "derandomize" + "=True"  # not a pin of this file
    (tmp_path / "test_x.py").write_text(f"@settings(deadline=None, {count})\n")
    (tmp_path / "test_y.py").write_text(f"@settings(\n    {seed},\n)\n")
    assert pinned_settings(tmp_path) == [
        f"test_x.py:1: @settings(deadline=None, {count})",
        f"test_y.py:2: {seed},",
    ]


@pytest.mark.parametrize("profile, expected", [("ci", 30), ("dev", 20), ("stress", 1000)])
def test_a_budget_scales_with_the_loaded_profile(profile, expected):
    before = settings.default
    try:
        settings.load_profile(profile)
        assert scaled_examples(CI_EXAMPLES // 2) == expected
        assert scaled_examples(1) >= 1
    finally:
        settings.register_profile("_restore", before)
        settings.load_profile("_restore")


def test_ci_is_derandomised_and_stress_is_not():
    assert settings.get_profile("ci").derandomize is True
    assert settings.get_profile("stress").derandomize is False
    assert settings.get_profile("stress").max_examples > 10 * CI_EXAMPLES
