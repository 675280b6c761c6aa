"""CPU: ``scripts/sanitize_driver.py`` never passes an empty selection as a clean run.

The sanitizer session runs the driver under memcheck and racecheck and reports "0 errors"; a
``--only`` that matches no case used to run nothing and exit 0 (found on the H100 on 2026-12-06:
``--only dense_swap_cluster,dense_swap_ab`` matched nothing, "driver: 0 ok"). The driver now
exits 2 before touching a device. Planted: the check removed, the selection falls through to
the CUDA check, which on this machine prints "skip all" instead of naming the selection.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DRIVER = Path(__file__).resolve().parents[2] / "scripts" / "sanitize_driver.py"


def _driver():
    spec = importlib.util.spec_from_file_location("sanitize_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_selection_matching_no_case_fails(capsys):
    driver = _driver()
    assert driver.main(["--only", "dense_swap_cluster,dense_swap_ab"]) == 2
    assert "matches no case" in capsys.readouterr().out


def test_the_swap_cases_are_selectable(capsys):
    driver = _driver()
    assert driver.main(["--only", "dense_swap", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["dense_swap_ab", "dense_swap_cluster"]
    assert "dense_swap_cluster" in driver.WGMMA_CASES  # skipped and counted off sm_90
