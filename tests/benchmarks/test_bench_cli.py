"""benchmarks/bench_cli.py (CPU): list arguments, the budget, strict JSON, table rendering."""

from __future__ import annotations

import argparse
import json
import math

import pytest


def test_int_list_accepts_positive_distinct_integers(bench_cli):
    assert bench_cli.int_list("1,16, 64") == (1, 16, 64)
    assert bench_cli.int_list("4096") == (4096,)


@pytest.mark.parametrize("text", ["", "1,,2", "0", "-4", "1,x", "1.5", "8,8"])
def test_int_list_refuses_bad_lists(bench_cli, text):
    with pytest.raises(argparse.ArgumentTypeError):
        bench_cli.int_list(text)


@pytest.mark.parametrize("text", ["0", "-1", "two", "1,2"])
def test_positive_int_refuses(bench_cli, text):
    with pytest.raises(argparse.ArgumentTypeError):
        bench_cli.positive_int(text)


def test_deadline_expires_after_its_budget(bench_cli, fake_clock):
    deadline = bench_cli.Deadline(2.5, clock=fake_clock(1.0))  # start = 1
    assert not deadline.expired()  # 2 - 1 = 1 s
    assert not deadline.expired()  # 2 s
    assert deadline.expired()  # 3 s >= 2.5
    assert "2.5 s budget" in deadline.reason()
    assert not bench_cli.Deadline(None, clock=fake_clock(1e9)).expired()


def test_write_json_is_strict_and_leaves_no_temporary(bench_cli, tmp_path):
    path = tmp_path / "r.json"
    bench_cli.write_json(str(path), {"schema": "x/1", "v": 1.5})
    assert json.loads(path.read_text()) == {"schema": "x/1", "v": 1.5}
    with pytest.raises(ValueError):
        bench_cli.write_json(str(path), {"v": math.nan})
    assert json.loads(path.read_text())["v"] == 1.5  # the good file survives a failed write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_short_error_is_one_bounded_line(bench_cli):
    text = bench_cli.short_error(RuntimeError("first line\nsecond line"))
    assert text == "RuntimeError: first line"
    assert len(bench_cli.short_error(ValueError("x" * 500), limit=40)) == 40


def test_render_table_right_aligns_columns(bench_cli):
    text = bench_cli.render_table(["M", "value"], [["1", "0.5"], ["4096", "12.25"]])
    assert text.splitlines() == ["   M  value", "   1    0.5", "4096  12.25"]
    assert bench_cli.fmt_cell(None) == "n/a"
    assert bench_cli.fmt_cell(0.123, ".2f", mark="*") == "0.12*"
    assert bench_cli.finite_or_none(math.inf) is None


class _Bench:
    def __init__(self, fail: bool):
        self.fail = fail

    def device(self):
        if self.fail:
            raise RuntimeError("no device facts")
        return {"name": "H200"}

    def hbm_bandwidth(self):
        if self.fail:
            raise RuntimeError("copy failed")
        return 4.2e12


@pytest.mark.parametrize("fail", [False, True])
def test_device_and_hbm_anchors_are_recorded_and_a_failure_never_raises(bench_cli, fail):
    report, lines = {"anchors": {"hbm_copy_Bps": None}}, []
    bench_cli.record_device_and_hbm(_Bench(fail), report, lines.append)
    if fail:
        assert report["device"] == {"error": "RuntimeError: no device facts"}
        assert report["anchors"] == {"hbm_copy_Bps": None, "hbm_error": "RuntimeError: copy failed"}
        assert lines[-1] == "HBM copy bandwidth: failed: RuntimeError: copy failed"
    else:
        assert report["device"] == {"name": "H200"}
        assert report["anchors"] == {"hbm_copy_Bps": 4.2e12}
        assert lines == ["device: {'name': 'H200'}", "HBM copy bandwidth: 4200 GB/s"]


def test_alternate_medians_interleaves_the_two_samplers(monkeypatch):
    """Samples alternate a, b, a, b, ... so a clock that drifts during the pair affects both."""
    from tests.benchmarks.conftest import load_script

    timing = load_script(monkeypatch, "bench_timing")
    order, clock = [], iter(range(100))

    def sampler(name):
        def sample(r):
            order.append((name, r))
            return float(next(clock))  # a steadily slowing device

        return sample

    a, b = timing.alternate_medians(sampler("a"), sampler("b"), 5)
    assert order == [(n, r) for r in range(5) for n in ("a", "b")]
    assert (a, b) == (4.0, 5.0)  # medians of 0,2,4,6,8 and 1,3,5,7,9: one step apart


def test_measure_keeps_a_paired_anchor_time(bench_cli):
    deadline = bench_cli.Deadline(None)
    assert bench_cli.measure(lambda: (10.0, "d"), deadline).anchor_us is None
    cell = bench_cli.measure(lambda: (10.0, "d", 12.5), deadline)
    assert (cell.us, cell.detail, cell.anchor_us) == (10.0, "d", 12.5)
