"""benchmarks/dense_trellis.py on CPU (nothing timed): the ratio table and JSON from synthetic
timings, the peer-unavailable path with quack's import made to fail, fail-soft anchors, the
budget, argument validation and the refusal without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class FakeBench:
    """Synthetic timings in place of :class:`CudaDenseBench`; ``fail`` names cells that raise,
    as ``(m, "cublas" | bits | "peer")``."""

    cublas_weight = "synthetic"

    def __init__(self, cublas=None, b12x=None, peer_us=50.0, fail=()):
        self.cublas_us = cublas or {}
        self.b12x_us = b12x or {}
        self.peer_us, self.fail, self.calls = peer_us, set(fail), []

    def device(self):
        return {"name": "fake"}

    def hbm_bandwidth(self):
        return 4.0e12

    def _check(self, key):
        self.calls.append(key)
        if key in self.fail:
            raise RuntimeError(f"planted failure at {key}\nsecond line")

    def cublas(self, m):
        self._check((m, "cublas"))
        return self.cublas_us.get(m, 100.0), None

    def b12x(self, m, bits):
        self._check((m, bits))
        return self.b12x_us.get((m, bits), 10.0 * bits), "path generic"

    def prepare_peer(self, peer):
        self.calls.append("prepare_peer")

    def peer(self, m, peer):
        self._check((m, "peer"))
        return self.peer_us, "graph"


def _available_peer(dense):
    return dense.Peer(True, None, dense.PEER_VERSION, gemm=lambda *a, **k: None)


def test_ratio_is_time_over_cublas_and_goals_are_checked(dense):
    cells = {
        (1, dense.CUBLAS): dense.Cell(us=200.0),
        (1, "b12x K4"): dense.Cell(us=100.0),  # 0.5 <= 0.60: meets
        (1, "b12x K6"): dense.Cell(us=150.0),  # 0.75 > 0.60: misses
        (1, dense.PEER): dense.Cell(us=140.0),
    }
    columns = ["b12x K4", "b12x K6", dense.PEER]
    nbytes = dense.weight_bytes(8192, 28672, (4, 6))
    (row,) = dense.build_rows([1], columns, cells, nbytes=nbytes, hbm_bps=4.0e12)
    assert row["goal"] == 0.60
    k4, k6, peer = (row["cells"][c] for c in columns)
    assert k4["ratio"] == pytest.approx(0.5) and k4["meets_goal"] is True
    assert k6["ratio"] == pytest.approx(0.75) and k6["meets_goal"] is False
    assert peer["ratio"] == pytest.approx(0.7) and peer["meets_goal"] is None  # no goal for quack
    assert k4["weight_bw_fraction"] == pytest.approx(8192 * 28672 / 2 / 100e-6 / 4.0e12)
    assert row["cublas_weight_bw_fraction"] == pytest.approx(2 * 8192 * 28672 / 200e-6 / 4.0e12)


def test_a_paired_anchor_time_is_the_ratio_s_denominator(dense):
    """A cell timed in alternation with the anchor is divided by that paired time, not by the
    row's cuBLAS cell timed before it (a falling clock between the two skewed the ratio)."""
    cells = {
        (4096, dense.CUBLAS): dense.Cell(us=2600.0),
        (4096, "b12x K3"): dense.Cell(us=3600.0, anchor_us=3000.0),  # both under a slower clock
        (4096, "b12x K4"): dense.Cell(us=3100.0),  # not paired: over the row's anchor
    }
    columns = ["b12x K3", "b12x K4"]
    (row,) = dense.build_rows([4096], columns, cells, nbytes={}, hbm_bps=None)
    k3, k4 = (row["cells"][c] for c in columns)
    assert k3["ratio"] == pytest.approx(1.2) and k3["anchor_us"] == 3000.0
    assert k4["ratio"] == pytest.approx(3100 / 2600) and k4["anchor_us"] is None
    assert row["cublas_bf16_us"] == 2600.0
    line = dense._cell_line(4096, "b12x K3", cells[4096, "b12x K3"], 2600.0)
    assert "1.200x cuBLAS (paired: 3000.0 us)" in line


def test_paired_cells_from_the_bench_reach_the_report(dense):
    class PairedBench(FakeBench):
        def b12x(self, m, bits):
            us, detail = super().b12x(m, bits)
            return us, detail, 2 * self.cublas_us.get(m, 100.0)

    args = dense.parse_args(["--m", "1", "--bits", "4", "--no-peer"])
    report = dense.collect(args, PairedBench(cublas={1: 100.0}, b12x={(1, 4): 50.0}),
                           log=lambda line: None)  # fmt: skip
    cell = report["rows"][0]["cells"]["b12x K4"]
    assert cell["anchor_us"] == 200.0 and cell["ratio"] == pytest.approx(0.25)


def test_ratio_table_text(dense):
    cells = {(m, dense.CUBLAS): dense.Cell(us=100.0) for m in (1, 4096)}
    cells[1, "b12x K2"] = dense.Cell(us=30.0)
    cells[4096, "b12x K2"] = dense.Cell(us=110.0)  # 1.10 > 1.05
    columns = ["b12x K2", dense.PEER]
    rows = dense.build_rows([1, 4096], columns, cells, nbytes={}, hbm_bps=None)
    lines = dense.ratio_table(rows, columns).splitlines()
    assert lines[0].split() == ["M", "b12x", "K2", "quack", "4-bit", "goal"]
    assert lines[1].split() == ["1", "0.300", "n/a", "<=0.60"]
    assert lines[2].split() == ["4096", "1.100*", "n/a", "<=1.05"]
    us_lines = dense.us_table(rows, columns).splitlines()
    assert us_lines[1].split() == ["1", "100.0", "30.0", "n/a"]


def test_full_run_with_synthetic_timings_writes_a_schema_report(dense, tmp_path):
    args = dense.parse_args(["--m", "1,16", "--bits", "2,4", "--json", str(tmp_path / "r.json")])
    written = []
    bench = FakeBench(cublas={1: 100.0, 16: 120.0}, b12x={(1, 2): 40.0, (16, 4): 130.0})
    report = dense.collect(
        args, bench, peer_loader=lambda: _available_peer(dense), log=lambda line: None,
        on_progress=lambda r: written.append(json.loads(json.dumps(r, allow_nan=False))),
    )  # fmt: skip
    assert report["schema"] == "bench.dense_trellis/2" and report["complete"]
    assert report["columns"] == ["b12x K2", "b12x K4", "quack 4-bit"]
    assert [r["m"] for r in report["rows"]] == [1, 16]
    assert report["rows"][0]["cells"]["b12x K2"]["ratio"] == pytest.approx(0.4)
    assert report["rows"][1]["cells"]["b12x K4"]["ratio"] == pytest.approx(130 / 120)
    assert report["rows"][1]["cells"]["b12x K4"]["meets_goal"] is False  # goal 0.65 at M=16
    assert report["rows"][1]["cells"]["quack 4-bit"]["ratio"] == pytest.approx(50 / 120)
    assert report["peer"]["available"] and report["anchors"]["hbm_copy_Bps"] == 4.0e12
    assert written[0]["complete"] is False and written[-1]["complete"] is True
    # order: anchors and b12x per M, then the peer (imported after every b12x kernel)
    assert bench.calls.index("prepare_peer") > bench.calls.index((16, 4))


def test_peer_unavailable_when_quack_cannot_be_imported(dense, monkeypatch):
    monkeypatch.setitem(sys.modules, "quack", None)  # `import quack` raises ImportError
    monkeypatch.setitem(sys.modules, "quack.gemm_w4", None)
    peer = dense.load_peer()
    assert not peer.available and "quack" in peer.reason
    logged = []
    args = dense.parse_args(["--m", "1,64", "--bits", "4"])
    bench = FakeBench()
    report = dense.collect(args, bench, log=logged.append)
    assert f"peer unavailable: {peer.reason}" in logged
    assert report["peer"]["available"] is False and report["peer"]["reason"] == peer.reason
    assert "prepare_peer" not in bench.calls and (1, "peer") not in bench.calls
    for row in report["rows"]:
        assert row["cells"]["b12x K4"]["ratio"] == pytest.approx(0.4)  # b12x still measured
        assert row["cells"]["quack 4-bit"]["us"] is None
        assert row["cells"]["quack 4-bit"]["error"].startswith("peer unavailable")
    text = dense.summary_text(report)
    assert text.splitlines()[0] == f"peer unavailable: {peer.reason}"
    assert dense.any_b12x_measured(report)


def test_a_failing_anchor_or_peer_is_reported_not_fatal(dense):
    args = dense.parse_args(["--m", "1,16", "--bits", "4"])
    bench = FakeBench(fail={(16, "cublas"), (1, "peer")})
    report = dense.collect(args, bench, peer_loader=lambda: _available_peer(dense), log=print)
    m1, m16 = report["rows"]
    assert m16["cublas_bf16_us"] is None and "planted failure" in m16["cublas_error"]
    assert m16["cells"]["b12x K4"]["us"] == 40.0 and m16["cells"]["b12x K4"]["ratio"] is None
    assert m1["cells"]["quack 4-bit"]["error"].startswith("RuntimeError: planted failure")
    assert m16["cells"]["quack 4-bit"]["us"] == 50.0
    notes = dense.footnotes(report["rows"], report["columns"])
    assert notes == [
        "M=1 quack 4-bit: RuntimeError: planted failure at (1, 'peer')",
        "M=16 cuBLAS bf16: RuntimeError: planted failure at (16, 'cublas')",
    ]
    assert report["complete"]


def test_the_budget_skips_what_is_left_and_says_so(dense, fake_clock):
    args = dense.parse_args(["--m", "1,16,64", "--bits", "4", "--budget-s", "5"])
    deadline = dense.Deadline(5, clock=fake_clock(1.0))
    bench = FakeBench()
    report = dense.collect(
        args, bench, peer_loader=lambda: _available_peer(dense), deadline=deadline, log=print
    )
    measured = [(r["m"], c) for r in report["rows"] for c, v in r["cells"].items() if v["us"]]
    assert measured and len(measured) < 6
    skipped = report["rows"][-1]["cells"]["b12x K4"]
    assert skipped["skipped"] and "budget" in skipped["error"]
    assert report["peer"]["available"] is False and "budget" in report["peer"]["reason"]
    assert report["complete"]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--m", "0"], "--m"),
        (["--m", "1,,16"], "--m"),
        (["--m", "abc"], "--m"),
        (["--bits", "9"], "--bits"),
        (["--shape", "8192x100"], "--shape"),
        (["--shape", "8192"], "--shape"),
        (["--budget-s", "-1"], "--budget-s"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(dense, capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        dense.main(argv)
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_defaults_and_quick(dense):
    args = dense.parse_args([])
    assert args.m == (1, 16, 64, 256, 1024, 4096) and args.bits == (2, 3, 4, 6)
    assert args.shape == (8192, 28672)
    assert dense.parse_args(["--quick"]).m == (1, 64, 4096)
    assert dense.parse_args(["--quick", "--m", "16"]).m == (16,)
    assert dense.GOALS == {1: 0.60, 16: 0.65, 64: 0.80, 256: 0.95, 1024: 1.05, 4096: 1.05}


def test_without_cuda_main_refuses_in_one_line(dense, monkeypatch, capsys):
    monkeypatch.setattr(dense.torch.cuda, "is_available", lambda: False)
    assert dense.main(["--m", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA device" in err[0]


@pytest.mark.deep
@pytest.mark.parametrize("script", ["dense_trellis.py", "moe_trellis.py"])
def test_scripts_help_and_refuse_as_processes(script):
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    run = [sys.executable, str(ROOT / "benchmarks" / script)]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "usage:" in shown.stdout and "--json" in shown.stdout and "--quick" in shown.stdout
    refused = subprocess.run([*run, "--m", "1"], capture_output=True, text=True, env=env,
                             timeout=120)  # fmt: skip
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"{script}: needs a CUDA device (torch.cuda.is_available() is False); nothing measured"
    ]
