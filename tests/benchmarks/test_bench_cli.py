"""benchmarks/bench_cli.py and bench_timing.py (CPU): arguments, the budget, strict JSON,
tables, the sample loop and its pairing on a fake clock, the probe scripts' refusal without
CUDA."""

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


def test_alternate_medians_interleaves_the_two_samplers(timing):
    """Samples alternate a, b, a, b, ... so a clock that drifts during the pair affects both."""
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


def test_median_us_calls_and_sample_budget_on_a_fake_clock(timing, monkeypatch):
    """The sample loop shared by median_us and paired_median_us: warm-up calls first, then
    ``inner`` calls per sample with running indices; ``max_s`` cuts the samples (never below 3)."""
    monkeypatch.setattr(timing, "_elapsed_us", lambda run: (run(), 1000.0 * 2)[1])
    calls = []
    assert timing.median_us(calls.append, warmup=2, reps=4, inner=3) == 2000.0 / 3
    assert calls == list(range(2 + 4 * 3))
    calls.clear()
    # warm-up: 2000 us for 2 calls = 1 ms a call; 3 inner calls a sample -> 10 ms fits 3 samples
    timing.median_us(calls.append, warmup=2, reps=20, inner=3, max_s=0.010)
    assert len(calls) == 2 + 3 * 3
    pairs = []
    timing.paired_median_us(lambda i: pairs.append(("a", i)), lambda i: pairs.append(("b", i)),
                            warmup=1, reps=3, inner=2)  # fmt: skip
    assert pairs[:2] == [("a", 0), ("b", 0)]  # warm-up: one of each
    assert pairs[2:] == [(n, i) for r in range(3) for n in "ab" for i in (1 + 2 * r, 2 + 2 * r)]


@pytest.mark.parametrize("script", ["cublas_gemm_forms", "decode_gemm_overlap"])
def test_probe_scripts_refuse_without_cuda_in_one_line(monkeypatch, capsys, script):
    from tests.benchmarks.conftest import load_script  # a script per parameter, no fixture

    module = load_script(monkeypatch, script)
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    assert module.main(["--m", "1024"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"{script}.py: needs a CUDA device (torch.cuda.is_available() is False); nothing measured"
    ]


def test_over_baseline_divides_each_graph_by_its_own_pairing(timing, monkeypatch):
    """Every graph is replayed in alternation with the baseline, on a clock that slows with every
    replay: the ratio stays the cost ratio because both sides of a pairing drift together."""
    replays, clock = [], {"elapsed": 0.0, "slowdown": 1.0}

    class FakeGraph:
        def __init__(self, name, cost):
            self.name, self.cost = name, cost

        def replay(self):
            replays.append(self.name)
            clock["elapsed"] += self.cost * clock["slowdown"]
            clock["slowdown"] *= 1.001

    def elapsed_us(run):
        clock["elapsed"] = 0.0
        run()
        return clock["elapsed"]

    monkeypatch.setattr(timing, "_elapsed_us", elapsed_us)
    graphs = {"base": FakeGraph("base", 100.0), "slow": FakeGraph("slow", 150.0)}
    times = timing.over_baseline("base", graphs, warmup=1, reps=5, inner=1)
    assert times["base"][1] == 1.0 and times["base"][0] == pytest.approx(100.0, rel=0.01)
    assert times["slow"][1] == pytest.approx(1.5, rel=0.002)
    paired = replays[1 + 5 :]  # after the baseline's own warm-up and samples
    assert paired == ["slow", "base"] * (1 + 5)


def test_ratio_cells_show_microseconds_and_ratio_in_the_given_order(bench_cli):
    times = {1024: {"b": (500.0, 1.0), "a": (620.0, 1.24)}}
    assert bench_cli.ratio_cells(times, ["a", "b"]) == [["1024", "620.0 (1.240)", "500.0 (1.000)"]]
