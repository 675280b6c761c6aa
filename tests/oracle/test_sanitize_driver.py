"""CPU: ``scripts/sanitize_driver.py`` never passes an empty selection as a clean run.

The sanitizer session runs the driver under memcheck and racecheck and reports "0 errors"; a
``--only`` that matches no case used to run nothing and exit 0 (found on the H100:
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


def test_the_tensor_core_cases_plan_the_kernels_they_name(monkeypatch):
    """The sanitizer's dense tensor-core cases plan, on an H100-shaped device, the mainloop their
    names say (stream-K: swap-AB alone, swap-AB CTA pairs, the deep row), so a planner change
    cannot quietly move "0 errors" onto another kernel. The driver checks this itself before any
    allocation; here it is checked on CPU. Planted: the pairs case expecting cluster 1 raises the
    driver's mismatch instead of reaching the allocation."""
    from b12x.ops.dense.tiles import DeviceLimits

    driver = _driver()
    h100 = DeviceLimits("H100 (simulated)", 132, 232448, (9, 0))
    plan_on_device = driver.plan_dense
    monkeypatch.setattr(driver, "plan_dense", lambda **kw: plan_on_device(**{"device": h100, **kw}))

    class Planned(Exception):
        pass

    def stop_before_allocating(plan, device):
        raise Planned(plan)

    monkeypatch.setattr(driver, "allocate_dense_buffers", stop_before_allocating)
    for name, cluster in (("dense_wgmma", 1), ("dense_wgmma_pairs", 2), ("dense_wgmma_deep", 1)):
        assert name in driver.WGMMA_CASES
        try:
            driver.CASES[name]()
        except Planned as planned:
            plan = planned.args[0]
        g = plan.geometry
        assert (g.wgmma, g.stream_k, g.cluster) == (True, True, cluster), name
        assert {"stream_k_partials", "stream_k_flags"} <= set(plan.buffer_names), name


def test_a_selection_that_skips_every_case_is_not_a_clean_run(monkeypatch, capsys):
    """Off sm_90 the wgmma cases are skipped and counted; a selection of only those used to
    print "driver: 0 ok, 0 failed, 3 skipped" and exit 0, so ``sanitize.sh`` reported "memcheck:
    0 errors" over a run that sanitised nothing. The driver now exits 2 (and the script requires
    a nonzero ok count). Planted: the check removed, main returns 0 and the test fails."""
    driver = _driver()
    monkeypatch.setattr(driver.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(driver.torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert driver.main(["--only", "dense_wgmma"]) == 2
    out = capsys.readouterr().out
    assert "driver: 0 ok, 0 failed, 3 skipped" in out and "nothing was sanitised" in out
