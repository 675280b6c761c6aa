"""benchmarks/moe_trellis.py on CPU (nothing timed): the ratio and goal rows, extras, JSON from
synthetic timings, the baseline's route grouping, fail-soft cells, the budget, arguments."""

from __future__ import annotations

import json

import pytest
import torch


class FakeBench:
    """Synthetic timings in place of :class:`CudaMoeBench`; ``fail`` names ``(m, cell)`` that
    raise."""

    bf16_weights = "synthetic"

    def __init__(self, baseline=None, graph=None, fail=()):
        self.base, self.graph = baseline or {}, graph or {}
        self.fail, self.calls = set(fail), []

    def device(self):
        return {"name": "fake"}

    def hbm_bandwidth(self):
        return 4.0e12

    def experts_hit(self, m):
        return float(min(128, 8 * m))

    def _check(self, key):
        self.calls.append(key)
        if key in self.fail:
            raise RuntimeError(f"planted failure at {key}")

    def baseline(self, m):
        self._check((m, "baseline"))
        return self.base.get(m, 400.0), None

    def trellis_graph(self, m):
        self._check((m, "graph"))
        return self.graph.get(m, 100.0), None

    def trellis_eager(self, m):
        self._check((m, "eager"))
        return 150.0, None

    def extra(self, name, m):
        self._check((m, name))
        return 80.0, "detail"


def test_ratio_is_bf16_over_trellis_and_goals_are_floors(moe):
    cells = {
        (1, moe.BASELINE): moe.Cell(us=300.0),
        (1, moe.GRAPH): moe.Cell(us=100.0),  # 3.0 >= 2.5: meets
        (1, moe.EAGER): moe.Cell(us=120.0),
        (8, moe.BASELINE): moe.Cell(us=300.0),
        (8, moe.GRAPH): moe.Cell(us=100.0),  # 3.0 < 3.5: misses
    }
    per_expert = moe.expert_bytes(5120, 1536, 4)
    assert per_expert == 3 * 5120 * 1536 // 2
    rows = moe.build_rows(
        [1, 8], cells, experts_hit={1: 8.0}, bytes_per_expert=per_expert, hbm_bps=4.0e12
    )
    m1, m8 = rows
    assert m1["ratio_bf16_over_trellis"] == pytest.approx(3.0) and m1["meets_goal"] is True
    assert m8["ratio_bf16_over_trellis"] == pytest.approx(3.0) and m8["meets_goal"] is False
    assert m1["weight_bw_fraction"] == pytest.approx(8 * per_expert / 100e-6 / 4.0e12)
    assert m8["weight_bw_fraction"] is None  # experts hit unknown
    assert m8["errors"] == {moe.EAGER: "not measured"}
    lines = moe.ratio_table(rows).splitlines()
    assert lines[0].split() == ["M", "1", "8"]
    assert lines[1].split() == ["bf16/trellis", "3.00", "3.00*"]
    assert lines[2].split() == ["goal", ">=2.5", ">=3.5"]


def test_goal_row_is_the_issue_goal(moe):
    assert moe.GOALS == {1: 2.5, 8: 3.5, 64: 4.0, 512: 2.0, 4096: 1.1}
    args = moe.parse_args([])
    # the extras at every M (tiers and pairs tabled beside the uniform step), two pair kinds
    assert args.m == (1, 8, 64, 512, 4096) and args.extra_m == args.m
    assert args.pair_kinds == ("P33", "P24")
    assert moe.parse_args(["--quick"]).extra_m == (1, 64, 4096)
    assert moe.parse_args(["--pair-kind", "P44"]).pair_kinds == ("P44",)
    assert (args.hidden, args.intermediate, args.experts, args.top_k, args.bits) == (
        5120, 1536, 128, 8, 4,
    )  # fmt: skip


def test_extras_compare_with_the_same_m_baseline_and_uniform_step(moe):
    cells = {
        (4096, moe.BASELINE): moe.Cell(us=1100.0),
        (4096, moe.GRAPH): moe.Cell(us=1000.0),
        (4096, "tiers K3/K4"): moe.Cell(us=880.0, detail="64 K3 + 64 K4 experts"),
    }
    names = ["tiers K3/K4", "pair P33"]
    tiers, pair = moe.build_extras(
        [4096], names, cells, experts_hit={4096: 128.0}, hbm_bps=4.0e12,
        bytes_per_expert={n: moe.expert_bytes(5120, 1536, moe.stack_bits(n)) for n in names},
    )  # fmt: skip
    assert tiers["ratio_bf16_over_stack"] == pytest.approx(1.25)
    assert tiers["time_over_uniform"] == pytest.approx(0.88)
    # the tiers stream 128 experts at their mean 3.5 bits per weight
    stream = 128 * 3 * 5120 * 1536 * 3.5 / 8
    assert tiers["weight_bw_fraction"] == pytest.approx(stream / 880e-6 / 4.0e12)
    assert pair["graph_us"] is None and pair["error"] == "not measured"
    assert pair["weight_bw_fraction"] is None
    lines = moe.extras_table([tiers, pair]).splitlines()
    bw = f"{100 * tiers['weight_bw_fraction']:.1f}%"
    assert lines[1].split() == ["tiers", "K3/K4", "4096", "880.0", "1100.0", "1.25", "0.88", bw]


def test_stack_bits_are_the_mean_payload_rates(moe):
    """The tiers' mean over the half/half split, each pair kind its records' mean rate as b12x
    defines the kinds (``dynamic``: P33 or P24, both 3)."""
    from b12x.kernels.moe_gemm import PAIR_KINDS

    assert moe.stack_bits("tiers K3/K4") == 3.5
    for kind, rates in PAIR_KINDS.items():
        assert moe.stack_bits(f"pair {kind}") == sum(rates) / 2, kind
    assert moe.stack_bits("pair dynamic") == 3.0
    assert set(moe.PAIR_MEAN_BITS) == set(moe.PAIR_CHOICES)


def test_group_routes_groups_each_expert_with_its_tokens_and_weights(moe):
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.125, 0.875]])
    groups = moe.group_routes(weights, ids, num_experts=4)
    assert [g[0] for g in groups] == [0, 1, 2]  # expert 3 is not routed
    tokens = {e: t.tolist() for e, t, _ in groups}
    assert tokens == {0: [0, 2], 1: [1], 2: [0, 1, 2]}
    route_w = {e: w.reshape(-1).float().tolist() for e, _, w in groups}
    assert route_w == {0: [0.25, 0.125], 1: [0.5], 2: [0.75, 0.5, 0.875]}
    assert all(w.dtype == torch.bfloat16 and w.shape[1] == 1 for _, _, w in groups)


def test_full_run_with_synthetic_timings(moe, tmp_path):
    args = moe.parse_args(["--m", "1,64", "--extra-m", "1,4096", "--pair-kinds", "P33"])
    written = []
    bench = FakeBench(baseline={1: 250.0, 64: 420.0}, graph={1: 100.0, 64: 100.0})
    report = moe.collect(
        args, bench, log=lambda line: None,
        on_progress=lambda r: written.append(json.loads(json.dumps(r, allow_nan=False))),
    )  # fmt: skip
    assert report["schema"] == "bench.moe_trellis/2" and report["complete"]
    assert report["problem"]["pair_kinds"] == ["P33"]
    assert [r["ratio_bf16_over_trellis"] for r in report["rows"]] == [2.5, 4.2]
    assert [r["meets_goal"] for r in report["rows"]] == [True, True]
    assert [(e["m"], e["stack"]) for e in report["extras"]] == [
        (1, "tiers K3/K4"), (1, "pair P33"), (4096, "tiers K3/K4"), (4096, "pair P33"),
    ]  # fmt: skip
    assert report["extras"][0]["ratio_bf16_over_stack"] == pytest.approx(250 / 80)
    # M = 4096 is not in --m: its baseline is measured once, for the extras only
    assert bench.calls.count((4096, "baseline")) == 1 and (4096, "graph") not in bench.calls
    assert report["extras"][2]["time_over_uniform"] is None
    # M = 4096's experts hit is measured for the extras too: its weight stream is known
    assert bench.calls.count((4096, "baseline")) == 1
    assert report["extras"][2]["weight_bw_fraction"] is not None
    assert bench.calls.count((1, "baseline")) == 1  # shared by the row and the extras
    assert written[0]["complete"] is False and written[-1]["complete"] is True
    text = moe.summary_text(report)
    assert "bf16/trellis" in text and ">=2.5" in text and "pair P33" in text


def test_failing_cells_are_reported_not_fatal(moe):
    args = moe.parse_args(["--m", "1,8", "--extra-m", "1", "--no-pair"])
    bench = FakeBench(fail={(1, "baseline"), (8, "eager"), (1, "tiers K3/K4")})
    report = moe.collect(args, bench, log=print)
    m1, m8 = report["rows"]
    assert m1["bf16_graph_us"] is None and m1["ratio_bf16_over_trellis"] is None
    assert m1["trellis_graph_us"] == 100.0
    assert m8["trellis_eager_us"] is None and m8["ratio_bf16_over_trellis"] == 4.0
    assert [e["stack"] for e in report["extras"]] == ["tiers K3/K4"]
    assert moe.footnotes(report["rows"], report["extras"]) == [
        "M=1 bf16 graph: RuntimeError: planted failure at (1, 'baseline')",
        "M=8 trellis eager: RuntimeError: planted failure at (8, 'eager')",
        "M=1 tiers K3/K4: RuntimeError: planted failure at (1, 'tiers K3/K4')",
    ]


def test_the_budget_skips_what_is_left(moe, fake_clock):
    args = moe.parse_args(["--m", "1,8,64", "--budget-s", "6"])
    report = moe.collect(args, FakeBench(), deadline=moe.Deadline(6, clock=fake_clock(1.0)),
                         log=print)  # fmt: skip
    last = report["rows"][-1]
    assert last["trellis_graph_us"] is None and "budget" in last["errors"][moe.GRAPH]
    assert all(e["skipped"] for e in report["extras"])
    assert report["rows"][0]["trellis_graph_us"] == 100.0


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--m", "0"], "argument --m"),
        (["--m", "1,1"], "argument --m"),
        (["--extra-m", "x"], "argument --extra-m"),
        (["--routings", "0"], "argument --routings"),
        (["--pair-kind", "P99"], "argument --pair-kinds"),
        (["--pair-kinds", "P33,P33"], "argument --pair-kinds"),
        (["--hidden", "100"], "hidden"),
        (["--top-k", "200"], "top_k"),
        (["--bits", "9"], "bits"),
        (["--shared-decode", "thin"], "argument --shared-decode"),
    ],
)
def test_bad_arguments_exit_2(moe, capsys, argv, text):
    with pytest.raises(SystemExit) as exc:
        moe.main(argv)
    assert exc.value.code == 2
    assert text in capsys.readouterr().err


def test_without_cuda_main_refuses_in_one_line(moe, monkeypatch, capsys):
    monkeypatch.setattr(moe.torch.cuda, "is_available", lambda: False)
    assert moe.main(["--m", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA device" in err[0]


def test_pins_and_pair_kinds_are_the_planners(moe):
    """The benchmark lists the planner's choices without importing b12x at module level."""
    from b12x.ops.moe.dispatch import PAIR_CHOICES
    from b12x.ops.moe.mainloop import SHARED_PINS

    assert tuple(moe.SHARED_PINS) == tuple(SHARED_PINS)
    assert tuple(moe.PAIR_CHOICES) == tuple(PAIR_CHOICES)
