"""Benchmark (issue 15): one fused trellis MoE step against a dequantised bf16 grouped cuBLAS MoE.

GLM-like geometry by default: hidden 5120, intermediate 1536, 128 experts, top-8, MCG K4,
``packed`` FC1, bf16 x (fp16 compute), M (tokens) = 1, 8, 64, 512, 4096. Measured in one
process, on one device:

* **HBM copy bandwidth** (:func:`bench_timing.hbm_copy_bandwidth`), the roofline anchor.
* **bf16 graph** (the baseline): for each routed expert (grouping fixed on the host outside the
  timing) ``rows @ W13_bf16[e]`` → ``silu(gate)·up`` → ``@ W2_bf16[e]`` → ``index_add_`` of
  ``w·y``: cuBLAS on the weights the b12x decode kernel dequantised from the trellis payload, no
  rotations, the whole step captured in one CUDA graph.
* **trellis graph**: one replay of a CUDA graph of :func:`b12x.ops.moe.run.run_moe` (route
  packing, rotations, grouped trellis GEMMs, boundary, top-k sum) over buffers bound once
  (``plan_moe`` with the CUDA device, as a serving engine plans; ``bind_moe``); **trellis eager**:
  the same sequence launched eagerly (host launch overhead included).
* the ratio **bf16 graph ÷ trellis graph** (> 1: the trellis MoE is faster) against the goal row
  (≥ 2.5, 3.5, 4.0, 2.0, 1.1 at M = 1, 8, 64, 512, 4096; ``*`` marks a miss), and the trellis
  graph's weight bytes per second (payload bytes of the experts a routing hits) as a fraction
  of the copy bandwidth.
* **extras** at every M of ``--m`` (or ``--extra-m``), graphed like the uniform step and
  compared with the same M's bf16 baseline and uniform step, with their weight stream over the
  copy bandwidth: **tiers** (mixed K3/K4: half of the experts, a seeded random half, in a K3
  tier, the rest K4; ``plan_tiered_moe`` with the tier maps) and **QSRT pair kinds**
  (``--pair-kinds``, default P33 and P24, each on FC1 and FC2 over the K3 base).

Weights are random trellis payloads (any bit pattern is a valid stream; time does not depend on
the values). ``--routings R`` (default 2) independent seeded routings are cycled, one graph per
routing, replay ``i`` running routing ``i mod R``, so at small M successive replays touch other
experts and do not re-read an L2-resident working set; both sides see the same routings. Times
are medians of CUDA-event samples; each cell's timed part is capped (about a second) so the
M = 4096 cells stay short.

Fail-soft: a failing cell (baseline, step, tier, pair) is reported as ``n/a`` with a footnote
and the run goes on; ``--budget-s`` (default 130) stops starting new cells once spent and
reports the rest as skipped. ``--quick``: M = 1, 64, 4096 unless ``--m`` is given, fewer samples.
``--json F`` writes the schema ``bench.moe_trellis/2`` (docs/json_schemas.md), rewritten after
every M so a killed run keeps what it measured.

Exit status: 0 when at least one trellis step was measured, 1 otherwise or without a CUDA
device, 2 for bad arguments.

Usage: ``python benchmarks/moe_trellis.py [--m 1,8,64,512,4096] [--extra-m M,...] [--bits 4]
[--layout packed] [--experts 128] [--hidden 5120] [--intermediate 1536] [--top-k 8]
[--pair-kinds P33,P24] [--no-tiers] [--no-pair] [--routings 2] [--quick] [--budget-s 130]
[--json out.json]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from bench_cli import (
    Cell,
    Deadline,
    finite_or_none,
    fmt_cell,
    int_list,
    measure,
    positive_int,
    record_device_and_hbm,
    refuse_without_cuda,
    render_table,
    short_error,
    write_json,
)
from bench_timing import capture_graph, hbm_copy_bandwidth, median_us

SCHEMA = "bench.moe_trellis/2"
DEFAULT_M = (1, 8, 64, 512, 4096)
QUICK_M = (1, 64, 4096)
DEFAULT_PAIR_KINDS = ("P33", "P24")
#: bf16 time ÷ trellis time the fused MoE step should reach at each M (issue 15).
GOALS = {1: 2.5, 8: 3.5, 64: 4.0, 512: 2.0, 4096: 1.1}
TIER_BITS = (3, 4)
PAIR_BASE_BITS = 3
PAIR_CHOICES = ("P22", "P33", "P24", "P43", "P44", "dynamic")
#: Mean payload bits per weight of each pair kind (``dynamic``: P33 or P24, both 3).
PAIR_MEAN_BITS = {"P22": 2.0, "P33": 3.0, "P24": 3.0, "P43": 3.5, "P44": 4.0, "dynamic": 3.0}
#: The MoE mainloop pins (b12x.ops.moe.mainloop.SHARED_PINS; tests check they agree).
SHARED_PINS = ("off", "wide", "tensor")
TIMING = {"warmup": 3, "reps": 15, "inner": 3, "max_s": 1.0}
QUICK_TIMING = {"warmup": 2, "reps": 5, "inner": 2, "max_s": 0.3}
BASELINE, GRAPH, EAGER = "bf16 graph", "trellis graph", "trellis eager"


# --- arguments ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe_trellis.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--m", type=int_list, default=None, help="M list (default 1,8,64,512,4096)")
    parser.add_argument("--extra-m", type=int_list, default=None, help="M of extras (default: --m)")
    parser.add_argument("--bits", type=positive_int, default=4)
    parser.add_argument("--codebook", default="mcg")
    parser.add_argument("--layout", default="packed", choices=("packed", "proj"))
    parser.add_argument("--experts", type=positive_int, default=128)
    parser.add_argument("--hidden", type=positive_int, default=5120)
    parser.add_argument("--intermediate", type=positive_int, default=1536)
    parser.add_argument("--top-k", type=positive_int, default=8)
    parser.add_argument(
        "--pair-kinds", "--pair-kind", dest="pair_kinds", type=_pair_kinds,
        default=DEFAULT_PAIR_KINDS, help="pair kinds timed as extras (default P33,P24)",
    )  # fmt: skip
    parser.add_argument("--no-tiers", action="store_true", help="skip the K3/K4 tier extra")
    parser.add_argument("--no-pair", action="store_true", help="skip the pair extra")
    parser.add_argument("--routings", type=positive_int, default=2, help="routings cycled")
    parser.add_argument("--quick", action="store_true", help="M = 1,64,4096, fewer samples")
    parser.add_argument(
        "--shared-decode",
        choices=SHARED_PINS,
        default=None,
        help="pin the grouped GEMMs' mainloop (default: the moe_mainloop table decides)",
    )
    parser.add_argument("--budget-s", type=float, default=130.0, help="0 = no budget")
    parser.add_argument("--json", default=None, help="write the report here")
    return parser


def _pair_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(","))
    bad = [k for k in kinds if k not in PAIR_CHOICES]
    if bad or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"expected distinct kinds of {', '.join(PAIR_CHOICES)}, got {text!r}"
        )
    return kinds


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate: the uniform problem at the largest M goes through b12x's own
    metadata-only validator (:func:`b12x.ops.moe.plan.check_moe_problem`), so a problem the
    planner would refuse is an argument error (exit 2), not a failure mid-run."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.m is None:
        args.m = QUICK_M if args.quick else DEFAULT_M
    if args.extra_m is None:
        args.extra_m = args.m
    if args.budget_s < 0:
        parser.error("argument --budget-s: expected >= 0 (0 = no budget)")
    from b12x.ops.moe.plan import check_moe_problem

    try:
        check_moe_problem(
            m=max((*args.m, *args.extra_m)), top_k=args.top_k, hidden=args.hidden,
            intermediate=args.intermediate, codebook=args.codebook, bits=args.bits,
            num_experts=args.experts, w13_layout=args.layout, x_dtype=torch.bfloat16,
            compute_dtype=torch.float16, num_global_experts=None, m_tiles=None, fc1_pair=None,
            fc2_pair=None,
        )  # fmt: skip
    except (TypeError, ValueError) as exc:
        parser.error(f"the MoE problem: {exc}")
    return args


# --- the report (pure: CPU-tested) ---------------------------------------------------------------


def expert_bytes(hidden: int, intermediate: int, bits: float) -> float:
    """Payload bytes of one expert: FC1 ``H × 2I`` and FC2 ``I × H`` at ``bits`` per weight (a
    mixed stack's mean rate may be fractional)."""
    return 3 * hidden * intermediate * bits / 8


def extra_names(args: argparse.Namespace) -> list[str]:
    names = []
    if not args.no_tiers:
        names.append(f"tiers K{TIER_BITS[0]}/K{TIER_BITS[1]}")
    if not args.no_pair:
        names.extend(f"pair {kind}" for kind in args.pair_kinds)
    return names


def stack_bits(name: str) -> float:
    """Mean payload bits per weight of an extra (``tiers…``: the two tiers' mean over the
    half/half split; ``pair KIND``: the kind's mean rate)."""
    if name.startswith("tiers"):
        return sum(TIER_BITS) / len(TIER_BITS)
    return PAIR_MEAN_BITS[name.removeprefix("pair ")]


def build_rows(
    ms: Sequence[int],
    cells: dict[tuple[int, str], Cell],
    *,
    experts_hit: dict[int, float],
    bytes_per_expert: int,
    hbm_bps: float | None,
) -> list[dict]:
    """One row per M: the three times, ratio = bf16 graph µs ÷ trellis graph µs, the goal and
    whether it is met, and the trellis graph's weight bytes per second over the copy bandwidth."""
    rows = []
    for m in ms:
        base, graph, eager = (
            cells.get((m, c), Cell(error="not measured")) for c in (BASELINE, GRAPH, EAGER)
        )
        ratio = None
        if base.us is not None and graph.us:
            ratio = finite_or_none(base.us / graph.us)
        goal = GOALS.get(m)
        bw = None
        if graph.us and hbm_bps and m in experts_hit:
            bw = finite_or_none(experts_hit[m] * bytes_per_expert / (graph.us * 1e-6) / hbm_bps)
        rows.append(
            {
                "m": m,
                "goal": goal,
                "experts_hit": experts_hit.get(m),
                "bf16_graph_us": base.us,
                "trellis_graph_us": graph.us,
                "trellis_eager_us": eager.us,
                "ratio_bf16_over_trellis": ratio,
                "meets_goal": None if ratio is None or goal is None else ratio >= goal,
                "weight_bw_fraction": bw,
                "errors": {
                    name: c.error
                    for name, c in ((BASELINE, base), (GRAPH, graph), (EAGER, eager))
                    if c.error
                },
            }
        )
    return rows


def build_extras(
    extra_ms: Sequence[int],
    names: Sequence[str],
    cells: dict[tuple[int, str], Cell],
    *,
    experts_hit: dict[int, float] | None = None,
    bytes_per_expert: dict[str, float] | None = None,
    hbm_bps: float | None = None,
) -> list[dict]:
    """One entry per (extra M, stack): its graph µs, bf16 graph ÷ it, its time over the uniform
    step's at the same M, and its weight bytes per second (``experts_hit`` x the stack's
    ``bytes_per_expert``) over the copy bandwidth."""
    experts_hit, bytes_per_expert = experts_hit or {}, bytes_per_expert or {}
    out = []
    for m in extra_ms:
        base = cells.get((m, BASELINE), Cell(error="not measured"))
        uniform = cells.get((m, GRAPH), Cell(error="not measured"))
        for name in names:
            cell = cells.get((m, name), Cell(error="not measured"))
            ratio = over_uniform = None
            if cell.us:
                if base.us is not None:
                    ratio = finite_or_none(base.us / cell.us)
                if uniform.us:
                    over_uniform = finite_or_none(cell.us / uniform.us)
            bw = None
            if cell.us and hbm_bps and name in bytes_per_expert and m in experts_hit:
                stream = experts_hit[m] * bytes_per_expert[name]
                bw = finite_or_none(stream / (cell.us * 1e-6) / hbm_bps)
            out.append(
                {
                    "m": m,
                    "stack": name,
                    "graph_us": cell.us,
                    "bf16_graph_us": base.us,
                    "ratio_bf16_over_stack": ratio,
                    "time_over_uniform": over_uniform,
                    "weight_bw_fraction": bw,
                    "detail": cell.detail,
                    "error": cell.error,
                    "skipped": cell.skipped,
                }
            )
    return out


def ratio_table(rows: Sequence[dict]) -> str:
    """M across; a ``bf16/trellis`` row (``*`` = below the goal) and the ``goal`` row."""
    ratios = [
        fmt_cell(r["ratio_bf16_over_trellis"], ".2f", mark="*" if r["meets_goal"] is False else "")
        for r in rows
    ]
    goals = ["-" if r["goal"] is None else f">={r['goal']:.1f}" for r in rows]
    header = ["M", *(str(r["m"]) for r in rows)]
    return render_table(header, [["bf16/trellis", *ratios], ["goal", *goals]])


def times_table(rows: Sequence[dict]) -> str:
    """Per M: experts hit, the three times (µs) and the weight bandwidth fraction."""
    lines = [
        [
            str(r["m"]),
            fmt_cell(r["experts_hit"], ".1f"),
            fmt_cell(r["bf16_graph_us"], ".1f"),
            fmt_cell(r["trellis_graph_us"], ".1f"),
            fmt_cell(r["trellis_eager_us"], ".1f"),
            fmt_cell(_percent(r["weight_bw_fraction"]), ".1f", mark="%"),
        ]
        for r in rows
    ]
    header = [
        "M", "experts hit", "bf16 graph us", "trellis graph us", "trellis eager us",
        "weight BW/copy",
    ]  # fmt: skip
    return render_table(header, lines)


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction


def extras_table(extras: Sequence[dict]) -> str:
    lines = [
        [
            e["stack"],
            str(e["m"]),
            fmt_cell(e["graph_us"], ".1f"),
            fmt_cell(e["bf16_graph_us"], ".1f"),
            fmt_cell(e["ratio_bf16_over_stack"], ".2f"),
            fmt_cell(e["time_over_uniform"], ".2f"),
            fmt_cell(_percent(e["weight_bw_fraction"]), ".1f", mark="%"),
        ]
        for e in extras
    ]
    header = [
        "stack", "M", "graph us", "bf16 graph us", "bf16/stack", "time/uniform", "weight BW/copy",
    ]  # fmt: skip
    return render_table(header, lines)


def footnotes(rows: Sequence[dict], extras: Sequence[dict]) -> list[str]:
    """Why a cell is n/a: ``M=<m>[,<m>...] <cell>: <error>``, one line per cell and error."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        for name, error in row["errors"].items():
            grouped.setdefault((name, error), []).append(row["m"])
    for extra in extras:
        if extra["error"]:
            grouped.setdefault((extra["stack"], extra["error"]), []).append(extra["m"])
    return [f"M={','.join(map(str, ms))} {name}: {error}" for (name, error), ms in grouped.items()]


def summary_text(report: dict) -> str:
    p = report["problem"]
    hbm = report["anchors"]["hbm_copy_Bps"]
    parts = [
        f"\nbf16 graph time / trellis graph time (higher is better; * = below the goal); "
        f"H={p['hidden']} I={p['intermediate']} E={p['experts']} top-{p['top_k']} "
        f"{p['codebook'].upper()} K{p['bits']} {p['layout']}; HBM copy "
        + ("n/a" if hbm is None else f"{hbm / 1e9:.0f} GB/s"),
        ratio_table(report["rows"]),
        "",
        times_table(report["rows"]),
    ]
    if report["extras"]:
        parts.append("\nextras (CUDA graphs, same routings and bf16 baseline)")
        parts.append(extras_table(report["extras"]))
    notes = footnotes(report["rows"], report["extras"])
    if notes:
        parts.append("\nnotes:")
        parts.extend(f"  {line}" for line in notes)
    return "\n".join(parts)


def new_report(args: argparse.Namespace, timing: dict) -> dict:
    half = args.experts // 2
    return {
        "schema": SCHEMA,
        "complete": False,
        "elapsed_s": 0.0,
        "device": None,
        "problem": {
            "hidden": args.hidden,
            "intermediate": args.intermediate,
            "experts": args.experts,
            "top_k": args.top_k,
            "codebook": args.codebook,
            "bits": args.bits,
            "layout": args.layout,
            "x_dtype": "bfloat16",
            "compute_dtype": "float16",
            "m": list(args.m),
            "extra_m": list(args.extra_m),
            "tiers": None
            if args.no_tiers
            else {"bits": list(TIER_BITS), "experts": [half, args.experts - half]},
            "pair_kinds": [] if args.no_pair else list(args.pair_kinds),
            "shared_decode": args.shared_decode,
        },
        "settings": {
            "quick": args.quick,
            "budget_s": args.budget_s or None,
            "timing": dict(timing),
            "routings": args.routings,
            "cuda_graphs": True,
        },
        "anchors": {"hbm_copy_Bps": None, "hbm_error": None, "bf16_weights": None},
        "rows": [],
        "extras": [],
    }


def collect(
    args: argparse.Namespace,
    bench: Any,
    *,
    deadline: Deadline | None = None,
    log: Callable[[str], None] = print,
    on_progress: Callable[[dict], None] | None = None,
) -> dict:
    """Measure every cell through ``bench`` (a :class:`CudaMoeBench` or a test double) and
    return the report. ``bench`` methods: ``device() -> dict``, ``hbm_bandwidth() -> float``,
    ``experts_hit(m) -> float`` (mean over the routings), and ``baseline(m)``,
    ``trellis_graph(m)``, ``trellis_eager(m)``, ``extra(name, m)``, each ``-> (µs, detail)``."""
    timing = QUICK_TIMING if args.quick else TIMING
    deadline = deadline or Deadline(args.budget_s or None)
    report = new_report(args, timing)
    names = extra_names(args)
    cells: dict[tuple[int, str], Cell] = {}
    hit: dict[int, float] = {}
    per_expert = expert_bytes(args.hidden, args.intermediate, args.bits)
    extra_bytes = {n: expert_bytes(args.hidden, args.intermediate, stack_bits(n)) for n in names}

    def refresh(complete: bool = False) -> None:
        report["rows"] = build_rows(
            args.m, cells, experts_hit=hit, bytes_per_expert=per_expert,
            hbm_bps=report["anchors"]["hbm_copy_Bps"],
        )  # fmt: skip
        report["extras"] = build_extras(
            args.extra_m, names, cells, experts_hit=hit, bytes_per_expert=extra_bytes,
            hbm_bps=report["anchors"]["hbm_copy_Bps"],
        )  # fmt: skip
        report["elapsed_s"] = round(deadline.elapsed(), 3)
        report["complete"] = complete
        if on_progress is not None:
            on_progress(report)

    record_device_and_hbm(bench, report, log)

    def baseline(m: int) -> Cell:
        if (m, BASELINE) not in cells:
            cells[m, BASELINE] = measure(lambda: bench.baseline(m), deadline)
            report["anchors"]["bf16_weights"] = getattr(bench, "bf16_weights", None)
            log(_cell_line(m, BASELINE, cells[m, BASELINE]))
        return cells[m, BASELINE]

    def count_experts_hit(m: int) -> None:
        if m in hit:
            return
        try:
            hit[m] = bench.experts_hit(m)
        except Exception as exc:  # noqa: BLE001 -- the BW column goes n/a
            log(f"M={m}: experts hit unknown ({short_error(exc)})")

    for m in args.m:
        count_experts_hit(m)
        base = baseline(m)
        for name, fn in ((GRAPH, bench.trellis_graph), (EAGER, bench.trellis_eager)):
            cells[m, name] = measure(lambda fn=fn, m=m: fn(m), deadline)
            log(_cell_line(m, name, cells[m, name], base.us))
        refresh()
    for m in args.extra_m:
        count_experts_hit(m)
        base = baseline(m)
        for name in names:
            cells[m, name] = measure(lambda name=name, m=m: bench.extra(name, m), deadline)
            log(_cell_line(m, name, cells[m, name], base.us))
        refresh()
    refresh(complete=True)
    return report


def _cell_line(m: int, name: str, cell: Cell, base_us: float | None = None) -> str:
    if cell.us is None:
        return f"M={m:5d} {name:14s} n/a ({cell.error})"
    ratio = f"  bf16/this {base_us / cell.us:5.2f}" if base_us is not None and cell.us else ""
    detail = f"  [{cell.detail}]" if cell.detail else ""
    return f"M={m:5d} {name:14s} {cell.us:10.1f} us{ratio}{detail}"


# --- the CUDA side --------------------------------------------------------------------------------


def random_payload(shape: Sequence[int]) -> torch.Tensor:
    """Uniformly random int16 words (every bit random) of ``shape`` on the GPU."""
    *lead, last = shape
    return (
        torch.empty((*lead, 2 * last), dtype=torch.uint8, device="cuda").random_().view(torch.int16)
    )


def group_routes(
    topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int
) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """The baseline's host-side grouping of one routing: per routed expert, in expert order,
    ``(expert, token indices, bf16 route weights [n, 1])``; route ``r = t·top_k + j`` is token
    ``t``'s ``j``-th choice. Ids must lie in ``[0, num_experts)``."""
    top_k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    groups, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            routes = order[start : start + count]
            weight = topk_weights.reshape(-1)[routes].to(torch.bfloat16)[:, None]
            groups.append((expert, routes // top_k, weight))
        start += count
    return groups


def make_weights(args):
    """Uniform random payloads ``(w13, w2)`` and rotation tables (also used by
    ``profile_launches.py``): ``packed`` ``w13 [E, H/16, 2I/16, 16b]`` or ``proj``
    ``[2, E, H/16, I/16, 16b]``, ``w2 [E, I/16, H/16, 16b]``; sign-random fp16 scales."""
    e, h, i, b = args.experts, args.hidden, args.intermediate, args.bits
    dev = "cuda"

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, device=dev) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, device=dev))).half()

    if args.layout == "packed":
        w13 = random_payload((e, h // 16, 2 * i // 16, 16 * b))
    else:
        w13 = random_payload((2, e, h // 16, i // 16, 16 * b))
    w2 = random_payload((e, i // 16, h // 16, 16 * b))
    gate = scales(1, h)
    tables = dict(
        gate_suh=gate,
        up_suh=gate if args.layout == "packed" else scales(1, h),
        intermediate_rotations=scales(e, 3 * i),
        down_svh=scales(1, h),
    )
    return w13, w2, tables


def dequantise(args, w13, w2):
    """bf16 ``W13 [E, H, 2I]`` and ``W2 [E, I, H]`` decoded by the b12x decode kernel."""
    from b12x.launch import host

    e = args.experts
    w13_bf16 = torch.empty(
        e, args.hidden, 2 * args.intermediate, dtype=torch.bfloat16, device="cuda"
    )
    w2_bf16 = torch.empty(e, args.intermediate, args.hidden, dtype=torch.bfloat16, device="cuda")
    for x in range(e):
        if args.layout == "packed":
            w13_bf16[x] = host.decode_weight(w13[x], args.codebook)
        else:
            w13_bf16[x, :, : args.intermediate] = host.decode_weight(w13[0, x], args.codebook)
            w13_bf16[x, :, args.intermediate :] = host.decode_weight(w13[1, x], args.codebook)
        w2_bf16[x] = host.decode_weight(w2[x], args.codebook)
    return w13_bf16, w2_bf16


class CudaMoeBench:
    """The measurements of :func:`collect` on the current CUDA device (module docstring)."""

    def __init__(self, args: argparse.Namespace, timing: dict):
        self.args, self.timing = args, dict(timing)
        self._weights = None
        self._bf16 = None
        self._steps: dict[int, tuple] = {}
        self.bf16_weights: str | None = None

    # shared state ---------------------------------------------------------------------------------

    def device(self) -> dict:
        return {
            "name": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__,
        }

    def hbm_bandwidth(self) -> float:
        return hbm_copy_bandwidth()

    def weights(self):
        if self._weights is None:
            self._weights = make_weights(self.args)
        return self._weights

    def batch(self, m: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Seeded ``x [M, H]`` bf16 and ``--routings`` ``(topk_weights, topk_ids)`` pairs: the
        same for every cell of this M, whatever ran before."""
        a = self.args
        gen = torch.Generator(device="cuda")
        gen.manual_seed(7919 * m)
        x = 0.05 * torch.randn(m, a.hidden, device="cuda", generator=gen)  # fp16-safe scale
        x = x.to(torch.bfloat16)
        routes = []
        for _ in range(a.routings):
            logits = torch.randn(m, a.experts, device="cuda", generator=gen)
            w, ids = torch.softmax(logits, -1).topk(a.top_k, dim=-1)
            routes.append(((w / w.sum(-1, keepdim=True)).contiguous(), ids.contiguous()))
        return x, routes

    def experts_hit(self, m: int) -> float:
        _, routes = self.batch(m)
        return sum(int(ids.unique().numel()) for _, ids in routes) / len(routes)

    def _time(self, fn: Callable[[int], object]) -> float:
        return median_us(fn, **self.timing)

    def _graphs(self, run: Callable[[Any], object], inputs: list) -> float:
        graphs = [capture_graph(lambda i=i: run(i)) for i in inputs]
        return self._time(lambda n: graphs[n % len(graphs)].replay())

    # the baseline ---------------------------------------------------------------------------------

    def baseline(self, m: int) -> tuple[float, str | None]:
        a = self.args
        if self._bf16 is None:
            w13, w2, _ = self.weights()
            self._bf16 = dequantise(a, w13, w2)
            self.bf16_weights = f"b12x decode of the K{a.bits} payloads, bf16 [E, H, 2I], [E, I, H]"
        w13_bf16, w2_bf16 = self._bf16
        x, routes = self.batch(m)
        i = a.intermediate
        out = torch.zeros(m, a.hidden, dtype=torch.bfloat16, device="cuda")
        plans = [group_routes(w, ids, a.experts) for w, ids in routes]

        def step(groups) -> None:
            out.zero_()
            for expert, tokens, weight in groups:
                hidden = x.index_select(0, tokens) @ w13_bf16[expert]
                act = F.silu(hidden[:, :i]) * hidden[:, i:]
                out.index_add_(0, tokens, (act @ w2_bf16[expert]) * weight)

        return self._graphs(step, plans), None

    # the trellis step -----------------------------------------------------------------------------

    def _step(self, m: int):
        if m not in self._steps:
            from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
            from b12x.ops.moe.run import MoeInputs

            a = self.args
            w13, w2, tables = self.weights()
            plan = plan_moe(
                m=m, top_k=a.top_k, hidden=a.hidden, intermediate=a.intermediate,
                codebook=a.codebook, bits=a.bits, num_experts=a.experts, w13_layout=a.layout,
                x_dtype=torch.bfloat16, compute_dtype=torch.float16,
                device=torch.device("cuda"), shared_decode=a.shared_decode,
            )  # fmt: skip
            bound = bind_moe(plan, **allocate_moe_buffers(plan, "cuda"))
            x, routes = self.batch(m)
            inputs = [
                MoeInputs(
                    x=x,
                    topk_weights=w,
                    topk_ids=ids,
                    w13=(w13,),
                    w2=(w2,),
                    gate_suh=tables["gate_suh"],
                    up_suh=tables["up_suh"] if a.layout == "proj" else None,
                    intermediate_rotations=tables["intermediate_rotations"],
                    down_svh=tables["down_svh"],
                )
                for w, ids in routes
            ]
            self._steps = {m: (bound, inputs)}  # one M's buffers at a time
        return self._steps[m]

    def trellis_graph(self, m: int) -> tuple[float, str | None]:
        from b12x.ops.moe.run import run_moe

        bound, inputs = self._step(m)
        return self._graphs(lambda inp: run_moe(bound, inp), inputs), None

    def trellis_eager(self, m: int) -> tuple[float, str | None]:
        from b12x.ops.moe.run import run_moe

        bound, inputs = self._step(m)
        return self._time(lambda n: run_moe(bound, inputs[n % len(inputs)])), None

    # extras ---------------------------------------------------------------------------------------

    def extra(self, name: str, m: int) -> tuple[float, str | None]:
        from b12x.ops.moe.run import run_moe

        bound, inputs, detail = self.extra_step(name, m)
        return self._graphs(lambda inp: run_moe(bound, inp), inputs), detail

    def extra_step(self, name: str, m: int) -> tuple[object, list, str]:
        """``(bound, inputs per routing, detail)`` of the extra ``name`` (``tiers…`` or
        ``pair…``) at ``M = m``: random payloads of the plan's shapes, bound buffers (also the
        step ``profile_launches.py --stacks`` tables)."""
        from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe
        from b12x.ops.moe.run import MoeInputs, payload_shapes

        self._steps.clear()
        a = self.args
        _, _, tables = self.weights()
        if name.startswith("tiers"):
            plan, fields, detail = self._tier_plan(m)
        else:
            plan, fields, detail = self._pair_plan(m, name.removeprefix("pair "))
        shapes = payload_shapes(plan.problem)
        payloads = [(random_payload(s13), random_payload(s2)) for s13, s2 in shapes]
        bound = bind_moe(plan, **allocate_moe_buffers(plan, "cuda"))
        x, routes = self.batch(m)
        inputs = [
            MoeInputs(
                x=x,
                topk_weights=w,
                topk_ids=ids,
                w13=tuple(p[0] for p in payloads),
                w2=tuple(p[1] for p in payloads),
                gate_suh=tables["gate_suh"],
                up_suh=tables["up_suh"] if a.layout == "proj" else None,
                intermediate_rotations=tables["intermediate_rotations"],
                down_svh=tables["down_svh"],
                **fields,
            )
            for w, ids in routes
        ]
        return bound, inputs, detail

    def _tier_plan(self, m: int):
        """K3/K4 tiers over a seeded random half/half split of the experts."""
        from b12x.ops.moe.tiers import build_tiered_maps, plan_tiered_moe

        a = self.args
        e0 = a.experts // 2
        perm = torch.randperm(a.experts, generator=torch.Generator().manual_seed(15)).tolist()
        g2c, descriptors = build_tiered_maps(perm[:e0], perm[e0:], a.experts)
        plan = plan_tiered_moe(
            m=m, top_k=a.top_k, hidden=a.hidden, intermediate=a.intermediate,
            codebook=a.codebook, tier0_bits=TIER_BITS[0], tier1_bits=TIER_BITS[1],
            tier0_experts=e0, tier1_experts=a.experts - e0, num_global_experts=a.experts,
            w13_layout=a.layout, x_dtype=torch.bfloat16, compute_dtype=torch.float16,
            shared_decode=a.shared_decode, device=torch.device("cuda"),
        )  # fmt: skip
        fields = {"global_to_combined": g2c.cuda(), "descriptor_map": descriptors.cuda()}
        return plan, fields, f"{e0} K{TIER_BITS[0]} + {a.experts - e0} K{TIER_BITS[1]} experts"

    def _pair_plan(self, m: int, kind: str):
        """Pair ``kind`` on FC1 (N axis) and FC2 (K axis) over the K3 base."""
        from b12x.ops.moe.plan import plan_moe

        a = self.args
        plan = plan_moe(
            m=m, top_k=a.top_k, hidden=a.hidden, intermediate=a.intermediate,
            codebook=a.codebook, bits=PAIR_BASE_BITS, num_experts=a.experts,
            w13_layout=a.layout, x_dtype=torch.bfloat16, compute_dtype=torch.float16,
            fc1_pair=kind, fc2_pair=kind, shared_decode=a.shared_decode,
            device=torch.device("cuda"),
        )  # fmt: skip
        fields = {}
        if kind == "dynamic":  # per expert P33 (0) or P24 (1), seeded
            gen = torch.Generator().manual_seed(15)
            for phase in ("fc1", "fc2"):
                modes = torch.randint(0, 2, (a.experts,), generator=gen, dtype=torch.int32)
                fields[f"{phase}_modes"] = modes.cuda()
        return plan, fields, f"fc1_pair = fc2_pair = {kind}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    refusal = refuse_without_cuda("moe_trellis.py", torch.cuda.is_available())
    if refusal is not None:
        return refusal
    torch.manual_seed(0)
    bench = CudaMoeBench(args, QUICK_TIMING if args.quick else TIMING)

    def save(report: dict) -> None:
        if args.json:
            write_json(args.json, report)

    def log(line: str) -> None:
        print(line, flush=True)

    report = collect(args, bench, log=log, on_progress=save)
    print(summary_text(report), flush=True)
    if not any(r["trellis_graph_us"] is not None for r in report["rows"]):
        print("moe_trellis.py: no trellis step was measured (see the notes)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
