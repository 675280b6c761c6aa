"""Benchmark (issue 14): the dense trellis linear against its anchors and the public peer, one run.

Layer ``K × N = 8192 × 28672`` (K in features, N out features; ``--shape KxN``), MCG codebook,
bf16 activations, M = 1, 16, 64, 256, 1024, 4096 (``--m``), b12x K2, K3, K4, K6 (``--bits``).
Everything below is measured in the same process, on the same device, in this order:

1. **HBM copy bandwidth** (:func:`bench_timing.hbm_copy_bandwidth`): the roofline anchor; every
   cell's weight bytes per second are reported as a fraction of it.
2. **cuBLAS bf16** on the dequantised weight: the K4 payload (else the first ``--bits``) decoded
   by b12x's decode kernel, held as a bf16 ``[N, K]`` weight the way a bf16 engine holds it,
   ``y = x @ Wᵀ`` (``torch.mm``). The denominator of every ratio.
3. **b12x**: the whole linear (input rotation, trellis GEMM or decode + GEMM, output rotation)
   through the front door: ``plan_dense`` → ``allocate_dense_buffers`` → ``bind_dense`` once,
   ``run_dense`` captured in a CUDA graph; the path is the one the dispatch table picks.
4. **Peer**: quack-kernels 0.6.5 ``quack.gemm_w4.gemm_w4a16(x, blob, out=y, wformat="qtip")``,
   the SM90 CuTe DSL W4A16 GEMM over 4-bit 3INST trellis weights. Its weight is a random
   tail-biting stream blob ``uint8 [N/64, K/64, 128, 16]`` run through quack's own offline prep
   ``quack.gemm_w4.prepare_w4_weight(q, None, wformat="qtip")``. Each timed peer cell is also
   judged: up to 8 rows of its output against ``x @ Wᵀ`` with ``W`` decoded from the same blob
   by ``reference.qtip`` (docs/format.md §8), by the oracle's ``judge_gemm``; the verdict is in
   the cell's detail. The whole peer is judged by ``python -m oracle run --kernel quack``
   (docs/adapters.md). quack is imported only after every b12x kernel has been built (importing
   quack patches CuTe DSL classes process-wide). When it cannot be imported the run prints
   ``peer unavailable: <reason>`` and goes on without it.

Every timed callable is captured in CUDA graphs (capture after warm-up on the capture stream) and
the replays are timed with CUDA events (median of samples). Each b12x cell is timed in alternating
samples with its M's cuBLAS graphs (:func:`bench_timing.paired_median_us`) and its ratio is over
that paired anchor time (JSON ``anchor_us``): a sustained GEMM load lowers the SM clock, so a cell
timed apart from its anchor was compared across clocks (docs/evidence/bench-paired-timing.md). The
cuBLAS column is the anchor timed alone, before the row's cells. The peer is timed alone and divided
by that column: the one run that alternated it with the anchor's graphs stopped at M = 4096 on an
illegal memory access inside quack (earlier unpaired runs that day were clean; not investigated), so
its ratios can carry the clock skew above. Weights are rotated past the L2: each cell holds ``max(2,
⌈3 · 60 MiB / weight bytes⌉)`` copies of its weight (random payloads: any bit pattern is a valid
trellis stream, and the time does not depend on the values), one graph per copy, and replay ``i``
runs copy ``i mod copies``, so every replay reads cold memory.

Output: a per-cell line as it is measured, then two tables: time ÷ cuBLAS bf16 per M (lower is
better) with the goal column (≤ 0.60, 0.65, 0.80, 0.95, 1.05, 1.05 at M = 1, 16, 64, 256, 1024,
4096; ``*`` marks a b12x cell above its goal) and the absolute µs; a cell that failed or was
skipped is ``n/a`` with a footnote. ``--json F`` writes the schema ``bench.dense_trellis/2``
(docs/json_schemas.md), rewritten after every M so a killed run keeps what it measured.

Fail-soft: a failing anchor, b12x cell or peer is reported and the run goes on; ``--budget-s``
(default 130) stops starting new measurements once spent and reports the rest as skipped.
``--quick``: M = 1, 64, 4096 unless ``--m`` is given, and fewer timing samples.
Extras kept from the earlier script: ``--dispatch`` times, per (bits, M), the fused trellis GEMM
against decode + cuBLAS (eager, fp16, GEMM only) next to the dispatch table's pick, to check
``DECODE_MATMUL_MIN_M`` (after the b12x cells, before the peer; JSON ``dispatch``); ``--sweep``
times GEMM tile / depth / split-K variants instead of everything else.

Exit status: 0 when at least one b12x cell was measured, 1 otherwise or without a CUDA device,
2 for bad arguments.

Usage: ``python benchmarks/dense_trellis.py [--m 1,16,64] [--bits 2,3,4,6] [--shape 8192x28672]
[--quick] [--no-peer] [--budget-s 130] [--json out.json] [--dispatch | --sweep]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from bench_cli import (
    Cell,
    Deadline,
    finite_or_none,
    fmt_cell,
    int_list,
    measure,
    record_device_and_hbm,
    refuse_without_cuda,
    render_table,
    short_error,
    write_json,
)
from bench_peer import Peer, judge_peer_rows, load_peer, peer_weight
from bench_timing import capture_graph, hbm_copy_bandwidth, median_us, paired_median_us

SCHEMA = "bench.dense_trellis/2"
CODEBOOK = "mcg"
DEFAULT_SHAPE = (8192, 28672)
DEFAULT_M = (1, 16, 64, 256, 1024, 4096)
QUICK_M = (1, 64, 4096)
DEFAULT_BITS = (2, 3, 4, 6)
#: time ÷ cuBLAS bf16 the b12x linear should reach at each M (issue 14).
GOALS = {1: 0.60, 16: 0.65, 64: 0.80, 256: 0.95, 1024: 1.05, 4096: 1.05}
L2_BYTES = 60 * 2**20
ANCHOR_BITS = 4
CUBLAS = "cuBLAS bf16"
PEER = "quack 4-bit"
PEER_API = 'quack.gemm_w4.gemm_w4a16(act, blob, out=out, wformat="qtip")'
PEER_PREP = 'quack.gemm_w4.prepare_w4_weight(q, None, wformat="qtip")'
PEER_VERSION = "0.6.5"
PEER_NOTE = "random qtip streams; each cell judged on up to 8 rows against reference.qtip"
TIMING = {"warmup": 3, "reps": 20, "inner": 5, "max_s": 1.0}
QUICK_TIMING = {"warmup": 2, "reps": 6, "inner": 2, "max_s": 0.3}


def b12x_column(bits: int) -> str:
    return f"b12x K{bits}"


def copies_for(nbytes: int) -> int:
    """Weight copies a cell rotates through so its working set is three L2s or more."""
    return max(2, -(-3 * L2_BYTES // max(nbytes, 1)))


# --- arguments ------------------------------------------------------------------------------------


def shape_arg(text: str) -> tuple[int, int]:
    """``"8192x28672"`` → ``(K, N)``; both positive multiples of 128 (H128 blocks)."""
    try:
        k, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KxN (e.g. 8192x28672), got {text!r}") from None
    if k < 128 or n < 128 or k % 128 or n % 128:
        raise argparse.ArgumentTypeError(f"K and N must be positive multiples of 128, got {text!r}")
    return k, n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dense_trellis.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--m", type=int_list, default=None, help="M list (default 1,16,...,4096)")
    parser.add_argument("--bits", type=int_list, default=DEFAULT_BITS, help="b12x K-bits list")
    parser.add_argument("--shape", type=shape_arg, default=DEFAULT_SHAPE, help="layer KxN")
    parser.add_argument("--compute-dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--quick", action="store_true", help="M = 1,64,4096, fewer samples")
    parser.add_argument("--no-peer", action="store_true", help="do not import or time quack")
    parser.add_argument("--budget-s", type=float, default=130.0, help="0 = no budget")
    parser.add_argument("--json", default=None, help="write the report here")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dispatch", action="store_true", help="also check the dispatch table")
    mode.add_argument("--sweep", action="store_true", help="time GEMM tile/split variants only")
    mode.add_argument(
        "--split-sweep",
        type=int_list,
        default=None,
        help="time the whole linear (plan/bind/run, graphed) at these split_k values and auto",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    from b12x.runtime.validate import check_codebook_bits

    for bits in args.bits:
        try:
            check_codebook_bits(CODEBOOK, bits)
        except ValueError as exc:
            parser.error(f"argument --bits: {exc}")
    if args.m is None:
        args.m = QUICK_M if args.quick else DEFAULT_M
    if args.budget_s < 0:
        parser.error("argument --budget-s: expected >= 0 (0 = no budget)")
    return args


# --- the report (pure: CPU-tested) --------------------------------------------------------------


def columns_for(bits: Sequence[int]) -> list[str]:
    return [b12x_column(b) for b in bits] + [PEER]


def weight_bytes(k: int, n: int, bits: Sequence[int]) -> dict[str, int]:
    """Bytes of weight one call reads, per column (the payload, quack's 4-bit blob, bf16)."""
    out = {b12x_column(b): k * n * b // 8 for b in bits}
    out.update({PEER: k * n // 2, CUBLAS: 2 * k * n})
    return out


def build_rows(
    ms: Sequence[int],
    columns: Sequence[str],
    cells: dict[tuple[int, str], Cell],
    *,
    nbytes: dict[str, int],
    hbm_bps: float | None,
) -> list[dict]:
    """One row per M: cuBLAS bf16 µs and, per column, µs, ratio = µs ÷ cuBLAS bf16 µs (the
    anchor timed in alternation with the cell, ``anchor_us``, when there is one; else the row's
    own cuBLAS cell), ``meets_goal`` (b12x columns with a goal at this M), weight bytes per
    second as a fraction of the HBM copy bandwidth, detail and error."""

    def bw(col: str, us: float | None) -> float | None:
        if us is None or not hbm_bps:
            return None
        return finite_or_none(nbytes[col] / (us * 1e-6) / hbm_bps)

    rows = []
    for m in ms:
        base = cells.get((m, CUBLAS), Cell(error="not measured"))
        goal = GOALS.get(m)
        row = {
            "m": m,
            "goal": goal,
            "cublas_bf16_us": base.us,
            "cublas_weight_bw_fraction": bw(CUBLAS, base.us),
            "cublas_error": base.error,
            "cells": {},
        }
        for col in columns:
            cell = cells.get((m, col), Cell(error="not measured"))
            ratio = None
            anchor = _denominator(cell, base.us)
            if cell.us is not None and anchor:
                ratio = finite_or_none(cell.us / anchor)
            meets = None
            if ratio is not None and goal is not None and col != PEER:
                meets = ratio <= goal
            row["cells"][col] = {
                "us": cell.us,
                "anchor_us": cell.anchor_us,
                "ratio": ratio,
                "meets_goal": meets,
                "weight_bw_fraction": bw(col, cell.us),
                "detail": cell.detail,
                "error": cell.error,
                "skipped": cell.skipped,
            }
        rows.append(row)
    return rows


def ratio_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """time ÷ cuBLAS bf16 per M and column, ``*`` on a b12x cell above its goal, goal column."""
    lines = []
    for row in rows:
        line = [str(row["m"])]
        for col in columns:
            c = row["cells"][col]
            line.append(fmt_cell(c["ratio"], ".3f", mark="*" if c["meets_goal"] is False else ""))
        line.append("-" if row["goal"] is None else f"<={row['goal']:.2f}")
        lines.append(line)
    return render_table(["M", *columns, "goal"], lines)


def us_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Absolute microseconds per M: cuBLAS bf16 and every column."""
    lines = [
        [str(r["m"]), fmt_cell(r["cublas_bf16_us"], ".1f")]
        + [fmt_cell(r["cells"][col]["us"], ".1f") for col in columns]
        for r in rows
    ]
    return render_table(["M", CUBLAS, *columns], lines)


def footnotes(rows: Sequence[dict], columns: Sequence[str]) -> list[str]:
    """Why a cell is n/a: ``M=<m>[,<m>...] <column>: <error>``, one line per column and error."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        if row["cublas_error"]:
            grouped.setdefault((CUBLAS, row["cublas_error"]), []).append(row["m"])
        for col in columns:
            error = row["cells"][col]["error"]
            if error:
                grouped.setdefault((col, error), []).append(row["m"])
    return [f"M={','.join(map(str, ms))} {col}: {error}" for (col, error), ms in grouped.items()]


def summary_text(report: dict) -> str:
    """The closing text: peer line, both tables, footnotes."""
    columns, rows = report["columns"], report["rows"]
    parts = []
    peer = report["peer"]
    if not peer["available"]:
        parts.append(f"peer unavailable: {peer['reason']}")
    hbm = report["anchors"]["hbm_copy_Bps"]
    hbm_text = "n/a" if hbm is None else f"{hbm / 1e12:.2f} TB/s"
    k, n = report["problem"]["k"], report["problem"]["n"]
    parts.append(
        f"\ntime / cuBLAS bf16 (b12x: over cuBLAS timed in alternation with the cell; lower "
        f"is better; * = b12x above its goal); K={k} N={n} "
        f"{report['problem']['codebook'].upper()}, bf16 x, CUDA graphs, L2-rotated weights; "
        f"HBM copy {hbm_text}"
    )
    parts.append(ratio_table(rows, columns))
    parts.append("\nabsolute time (us)")
    parts.append(us_table(rows, columns))
    notes = footnotes(rows, columns)
    if notes:
        parts.append("\nnotes:")
        parts.extend(f"  {line}" for line in notes)
    if peer["available"]:
        parts.append(f"peer: quack-kernels {peer['version']}, {peer['api']} ({peer['note']})")
    return "\n".join(parts)


def new_report(args: argparse.Namespace, timing: dict) -> dict:
    k, n = args.shape
    return {
        "schema": SCHEMA,
        "complete": False,
        "elapsed_s": 0.0,
        "device": None,
        "problem": {
            "k": k,
            "n": n,
            "codebook": CODEBOOK,
            "x_dtype": "bfloat16",
            "compute_dtype": "float16" if args.compute_dtype == "fp16" else "bfloat16",
            "m": list(args.m),
            "bits": list(args.bits),
        },
        "settings": {
            "quick": args.quick,
            "budget_s": args.budget_s or None,
            "timing": dict(timing),
            "l2_bytes_assumed": L2_BYTES,
            "copies": {col: copies_for(b) for col, b in weight_bytes(k, n, args.bits).items()},
            "cuda_graphs": True,
        },
        "anchors": {"hbm_copy_Bps": None, "hbm_error": None, "cublas_weight": None},
        "peer": {
            "column": PEER,
            "api": PEER_API,
            "prep": PEER_PREP,
            "expected_version": PEER_VERSION,
            "version": None,
            "available": False,
            "reason": "not loaded yet",
            "note": PEER_NOTE,
        },
        "columns": columns_for(args.bits),
        "rows": [],
        "dispatch": None,
    }


def collect(
    args: argparse.Namespace,
    bench: Any,
    *,
    peer_loader: Callable[[], Peer] = load_peer,
    deadline: Deadline | None = None,
    log: Callable[[str], None] = print,
    on_progress: Callable[[dict], None] | None = None,
    after_b12x: Callable[[dict], None] | None = None,
) -> dict:
    """Measure every cell through ``bench`` (a :class:`CudaDenseBench` or a test double) in the
    documented order and return the report. ``bench`` methods: ``device() -> dict``,
    ``hbm_bandwidth() -> float``, ``cublas(m)``, ``b12x(m, bits)``, ``prepare_peer(peer)``,
    ``peer(m, peer)``, each ``-> (µs, detail)`` (``prepare_peer`` returns nothing).
    ``after_b12x(report)`` runs after the last b12x cell and before the peer is imported (the
    ``--dispatch`` extra builds more b12x kernels there)."""
    timing = QUICK_TIMING if args.quick else TIMING
    deadline = deadline or Deadline(args.budget_s or None)
    report = new_report(args, timing)
    k, n = args.shape
    columns = report["columns"]
    nbytes = weight_bytes(k, n, args.bits)
    cells: dict[tuple[int, str], Cell] = {}

    def refresh(complete: bool = False) -> None:
        report["rows"] = build_rows(
            args.m, columns, cells, nbytes=nbytes, hbm_bps=report["anchors"]["hbm_copy_Bps"]
        )
        report["elapsed_s"] = round(deadline.elapsed(), 3)
        report["complete"] = complete
        if on_progress is not None:
            on_progress(report)

    record_device_and_hbm(bench, report, log)
    log(f"problem: K={k} N={n} {CODEBOOK}, bf16 x")

    for m in args.m:
        cell = cells[m, CUBLAS] = measure(lambda m=m: bench.cublas(m), deadline)
        report["anchors"]["cublas_weight"] = getattr(bench, "cublas_weight", None)
        log(_cell_line(m, CUBLAS, cell, None))
        for bits in args.bits:
            col = b12x_column(bits)
            cells[m, col] = measure(lambda m=m, b=bits: bench.b12x(m, b), deadline)
            log(_cell_line(m, col, cells[m, col], cell.us))
        refresh()

    if after_b12x is not None:
        after_b12x(report)
    if args.no_peer:
        peer = Peer(False, "not requested (--no-peer)")
    elif deadline.expired():
        peer = Peer(False, deadline.reason())
    else:
        peer = peer_loader()
    report["peer"].update(available=peer.available, reason=peer.reason, version=peer.version)
    if peer.available and peer.version != PEER_VERSION:
        log(f"peer: quack-kernels {peer.version} (this benchmark was written for {PEER_VERSION})")
    if peer.available:
        try:
            bench.prepare_peer(peer)
        except Exception as exc:  # noqa: BLE001
            peer = Peer(False, f"weight prep failed: {short_error(exc)}", peer.version)
            report["peer"].update(available=False, reason=peer.reason)
    if not peer.available:
        log(f"peer unavailable: {peer.reason}")
    for m in args.m:
        if peer.available:
            cells[m, PEER] = measure(lambda m=m: bench.peer(m, peer), deadline)
            log(_cell_line(m, PEER, cells[m, PEER], cells[m, CUBLAS].us))
        else:
            cells[m, PEER] = Cell(error=f"peer unavailable: {peer.reason}", skipped=True)
        refresh()
    refresh(complete=True)
    return report


def _denominator(cell: Cell, row_anchor_us: float | None) -> float | None:
    """A cell's ratio denominator: its paired anchor time, else the row's cuBLAS cell."""
    return cell.anchor_us if cell.anchor_us is not None else row_anchor_us


def _cell_line(m: int, col: str, cell: Cell, base_us: float | None) -> str:
    if cell.us is None:
        return f"M={m:5d} {col:12s} n/a ({cell.error})"
    base_us = _denominator(cell, base_us)
    ratio = f"  {cell.us / base_us:.3f}x cuBLAS" if base_us else ""
    if ratio and cell.anchor_us is not None:
        ratio += f" (paired: {cell.anchor_us:.1f} us)"
    detail = f"  [{cell.detail}]" if cell.detail else ""
    return f"M={m:5d} {col:12s} {cell.us:10.1f} us{ratio}{detail}"


def any_b12x_measured(report: dict) -> bool:
    return any(
        cell["us"] is not None
        for row in report["rows"]
        for col, cell in row["cells"].items()
        if col != PEER
    )


# --- the CUDA side --------------------------------------------------------------------------------


class CudaDenseBench:
    """The measurements of :func:`collect` on the current CUDA device (see the module
    docstring for what each one times)."""

    def __init__(self, args: argparse.Namespace, timing: dict):
        self.k, self.n = args.shape
        self.bits = tuple(args.bits)
        self.timing = dict(timing)
        self.compute_dtype = torch.float16 if args.compute_dtype == "fp16" else torch.bfloat16
        self.suh = (torch.rand(self.k, device="cuda") * 0.02 + 0.01).to(torch.float16)
        self.svh = (torch.rand(self.n, device="cuda") + 0.5).to(torch.float16)
        self._payloads: dict[int, list[torch.Tensor]] = {}
        self._anchor: list[torch.Tensor] | None = None
        #: M -> the cuBLAS anchor's graphs (their x and out live in the closures)
        self._anchor_graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self._peer_blobs: list[torch.Tensor] | None = None
        self._peer_weight: torch.Tensor | None = None
        self.cublas_weight: str | None = None

    def device(self) -> dict:
        return {
            "name": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__,
        }

    def hbm_bandwidth(self) -> float:
        return hbm_copy_bandwidth()

    def payloads(self, bits: int) -> list[torch.Tensor]:
        """Random int16 payloads ``[K/16, N/16, 16·bits]``, enough copies to overflow the L2."""
        if bits not in self._payloads:
            shape = (self.k // 16, self.n // 16, 32 * bits)  # bytes; viewed as int16 below
            self._payloads[bits] = [
                torch.empty(shape, dtype=torch.uint8, device="cuda").random_().view(torch.int16)
                for _ in range(copies_for(self.k * self.n * bits // 8))
            ]
        return self._payloads[bits]

    def _anchor_weights(self) -> list[torch.Tensor]:
        if self._anchor is None:
            from b12x.launch import host

            bits = ANCHOR_BITS if ANCHOR_BITS in self.bits else self.bits[0]
            count = copies_for(2 * self.k * self.n)
            try:
                payloads = self.payloads(bits)
                self._anchor = []
                for i in range(count):
                    decoded = host.decode_weight(payloads[i % len(payloads)], CODEBOOK)
                    weight = torch.empty(self.n, self.k, dtype=torch.bfloat16, device="cuda")
                    self._anchor.append(weight.copy_(decoded.t()))
                self.cublas_weight = f"b12x K{bits} payloads decoded (MCG), bf16 [N, K]"
            except Exception as exc:  # noqa: BLE001 -- the anchor still runs on random weights
                self._anchor = [
                    torch.randn(self.n, self.k, device="cuda").to(torch.bfloat16)
                    for _ in range(count)
                ]
                self.cublas_weight = f"random bf16 [N, K] (decode failed: {short_error(exc)})"
        return self._anchor

    def _time_graphs(self, graphs: list[torch.cuda.CUDAGraph]) -> float:
        return median_us(lambda i: graphs[i % len(graphs)].replay(), **self.timing)

    def _time_paired(
        self, m: int, graphs: list[torch.cuda.CUDAGraph]
    ) -> tuple[float, float | None]:
        """The cell's graphs and this M's anchor graphs in alternating samples: (cell µs,
        anchor µs), both under the same clocks; (cell µs, None) when the anchor failed."""
        anchor = self._anchor_graphs.get(m)
        if anchor is None:  # the anchor failed at this M: the cell alone, no pairing
            return self._time_graphs(graphs), None
        return paired_median_us(
            lambda i: graphs[i % len(graphs)].replay(),
            lambda i: anchor[i % len(anchor)].replay(),
            **self.timing,
        )

    def cublas(self, m: int) -> tuple[float, str | None]:
        weights = self._anchor_weights()
        x = torch.randn(m, self.k, device="cuda").to(torch.bfloat16)
        out = torch.empty(m, self.n, device="cuda", dtype=torch.bfloat16)
        graphs = [capture_graph(lambda w=w: torch.mm(x, w.t(), out=out)) for w in weights]
        self._anchor_graphs[m] = graphs
        return self._time_graphs(graphs), None

    def b12x(self, m: int, bits: int, split_k: int | None = None) -> tuple[float, str | None]:
        from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense

        plan = plan_dense(
            m=m, k=self.k, n=self.n, bits=bits, codebook=CODEBOOK, x_dtype=torch.bfloat16,
            compute_dtype=self.compute_dtype, split_k=split_k,
        )  # fmt: skip
        bound = bind_dense(plan, **allocate_dense_buffers(plan, "cuda"))
        x = torch.randn(m, self.k, device="cuda").to(torch.bfloat16)
        suh, svh = self.suh, self.svh
        graphs = [
            capture_graph(lambda p=p: run_dense(bound, x, p, suh, svh)) for p in self.payloads(bits)
        ]
        us, anchor_us = self._time_paired(m, graphs)
        return us, f"path {plan.path}", anchor_us

    def prepare_peer(self, peer: Peer) -> None:
        """quack's own prep of random 4-bit qtip streams ``uint8 [N/64, K/64, 128, 16]``."""
        if self.n % 64 or self.k % 64:
            raise ValueError(f"quack qtip needs K and N multiples of 64, got {self.k}x{self.n}")
        self._peer_blobs = []
        for _ in range(copies_for(self.k * self.n // 2)):
            q = torch.empty(
                (self.n // 64, self.k // 64, 128, 16), dtype=torch.uint8, device="cuda"
            ).random_()
            self._peer_blobs.append(peer.prepare(q, None, wformat="qtip")[0])
        # b12x's payloads and the anchor's graphs and weights are not needed any more; the
        # peer's are
        self._payloads.clear()
        self._anchor_graphs.clear()
        self._anchor = None
        torch.cuda.empty_cache()

    def peer(self, m: int, peer: Peer) -> tuple[float, str | None]:
        blobs = self._peer_blobs
        x = torch.randn(m, self.k, device="cuda").to(torch.bfloat16)
        out = torch.empty(m, self.n, device="cuda", dtype=torch.bfloat16)

        def call(blob: torch.Tensor) -> None:
            peer.gemm(x, blob, out=out, wformat="qtip")

        try:
            graphs = [capture_graph(lambda b=b: call(b)) for b in blobs]
        except Exception as exc:  # noqa: BLE001 -- time it eagerly and say so
            us = median_us(lambda i: call(blobs[i % len(blobs)]), **self.timing)
            return us, f"eager: graph capture failed ({short_error(exc, 80)}); " + self._judge_peer(
                x, call, blobs[0], out
            )
        return self._time_graphs(graphs), "graph; " + self._judge_peer(x, call, blobs[0], out)

    def _judge_peer(self, x, call, blob, out) -> str:
        """Run the peer once on blob 0 and judge its rows (:func:`bench_peer.judge_peer_rows`)."""
        call(blob)
        torch.cuda.synchronize()
        if self._peer_weight is None:  # decoded once, on the GPU, from blob 0
            self._peer_weight = peer_weight(blob)
        return judge_peer_rows(out, x, self._peer_weight)


# --- extras kept from the earlier script (GPU) ----------------------------------------------------


def dispatch_path(m: int, bits: int, capability: tuple[int, int]) -> str:
    """What the dense table picks for an MCG fp16 case: ``"decode_matmul"`` or ``"fused (row)"``."""
    from b12x.ops.dense import dispatch

    case = {"capability": capability, "m": m, "bits": bits, "codebook": CODEBOOK}
    picked = dispatch.explain(case).path
    return "decode_matmul" if picked == "decode_matmul" else f"fused ({picked})"


def dispatch_line(bits: int, m: int, picked: str, times: dict[str, float | None]) -> str:
    """One line: the dispatch pick next to the fused and decode+cuBLAS GEMM times."""
    fused, decoded = times.get("fused"), times.get("decode_matmul")
    text = f"K{bits} M={m:5d} dispatch -> {picked:22s}"
    text += f" fused {fused:9.1f} us" if fused is not None else " fused         - "
    text += f"  decode+cuBLAS {decoded:9.1f} us" if decoded is not None else ""
    if fused is not None and decoded is not None:
        faster = "fused" if fused <= decoded else "decode_matmul"
        verdict = "agrees" if picked.split()[0] == faster else "DISAGREES"
        text += f"  faster: {faster} ({max(fused, decoded) / min(fused, decoded):.2f}x) {verdict}"
    return text


def auto_split(m: int, k: int, n: int, tiles: tuple[int, int] | None = None) -> int:
    """The split the dense rule picks for ``M × K × N`` (the launcher takes what it is given)."""
    from b12x.ops.dense import split_k as split_rule
    from b12x.ops.dense import tiles as dense_tiles

    m_tiles, n_tiles = dense_tiles.choose_tiles(m, n) if tiles is None else tiles
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return split_rule.split_k(
        m=m, k=k, n=n, m_tiles=m_tiles, n_tiles=n_tiles, warps=4, sm_count=sms
    )


def fused_launch(m: int, k: int, n: int, bits: int) -> dict:
    """The generic path's GEMM launch at ``M`` (whatever the path table picks): the mainloop
    table's shared-decode geometry and split, else the per-warp decode at the auto split."""
    from b12x.ops.dense import mainloop

    shared = mainloop.explain({"path": "generic", "m": m, "n": n, "bits": bits}).value
    if shared is None:
        return {"split_k": auto_split(m, k, n)}
    return {
        "split_k": shared.split_k, "tiles": (shared.m_tiles, shared.n_tiles),
        "warps": shared.warps, "m_warps": shared.m_warps, "shared_rows": shared.shared_rows,
        "smem_stages": shared.smem_stages,
    }  # fmt: skip


def dispatch_check(bench: CudaDenseBench, args, deadline: Deadline, log) -> list[dict]:
    """Per (bits, M): the fused trellis GEMM (the mainloop the plan would run on the generic
    path: :func:`fused_launch`) and decode + cuBLAS (eager, fp16 x, GEMM only) against the
    dispatch table's pick, to check ``DECODE_MATMUL_MIN_M`` on this device."""
    from b12x.launch import host
    from b12x.ops.dense import dispatch

    log(f"\ndispatch: decode_matmul for M >= {dispatch.DECODE_MATMUL_MIN_M} (off the K6 row)")
    capability = torch.cuda.get_device_capability()
    rows = []
    for bits in args.bits:
        ps = bench.payloads(bits)
        for m in args.m:
            x = torch.randn(m, bench.k, device="cuda").to(torch.float16)
            launch = fused_launch(m, bench.k, bench.n, bits)

            def fused(i, x=x, ps=ps, kw=launch):
                return host.trellis_matmul(x, ps[i % len(ps)], CODEBOOK, **kw)

            def decode_matmul(i, x=x, ps=ps):
                return torch.matmul(x, host.decode_weight(ps[i % len(ps)], CODEBOOK))

            cells = {
                path: measure(lambda fn=fn: (median_us(fn, **bench.timing), None), deadline)
                for path, fn in (("fused", fused), ("decode_matmul", decode_matmul))
            }
            picked = dispatch_path(m, bits, capability)
            times = {path: cell.us for path, cell in cells.items()}
            row = {"bits": bits, "m": m, "dispatch": picked}
            row.update({f"{path}_us": cell.us for path, cell in cells.items()})
            row["errors"] = {path: cell.error for path, cell in cells.items() if cell.error}
            rows.append(row)
            log(dispatch_line(bits, m, picked, times))
    return rows


SWEEP_TILES = {"small": ((1, 2), (1, 4)), "large": ((2, 2), (2, 4), (4, 1), (4, 2))}


def sweep(bench: CudaDenseBench, args) -> None:
    """Time the decode kernel, and the fused GEMM over tiles, load depth and split counts; print
    the fastest configuration per (bits, M) next to the one the host heuristics pick."""
    from b12x.launch import host

    k, n = args.shape
    for bits in args.bits:
        ps = bench.payloads(bits)
        dec = median_us(lambda i, ps=ps: host.decode_weight(ps[i % len(ps)], CODEBOOK))
        written = 2 * k * n / (dec * 1e-6) / 1e12
        print(f"sweep K{bits} decode_weight: {dec:.1f} us ({written:.2f} TB/s written)", flush=True)
        for m in args.m:
            x = torch.randn(m, k, device="cuda").to(torch.float16)
            auto = auto_split(m, k, n)
            default = median_us(
                lambda i, x=x, ps=ps, s=auto: host.trellis_matmul(
                    x, ps[i % len(ps)], CODEBOOK, split_k=s
                )
            )
            results = []
            for tiles in SWEEP_TILES["small" if m <= 16 else "large"]:
                for depth in (1, 2, 4):
                    for split in (None, 4, 8, 16):
                        try:
                            s = auto_split(m, k, n, tiles) if split is None else split
                            us = median_us(
                                lambda i, x=x, t=tiles, d=depth, s=s, ps=ps: host.trellis_matmul(
                                    x, ps[i % len(ps)], CODEBOOK, tiles=t, depth=d, split_k=s
                                )
                            )
                        except Exception as exc:  # noqa: BLE001 -- a spec that does not build
                            print(f"sweep K{bits} M={m} tiles={tiles} depth={depth}: {exc}")
                            break
                        results.append((us, tiles, depth, split))
            if results:
                best = min(results, key=lambda r: r[0])
                print(
                    f"sweep K{bits} M={m}: heuristic {default:.1f} us; best {best[0]:.1f} us "
                    f"at tiles={best[1]} depth={best[2]} split={best[3]}",
                    flush=True,
                )
        bench._payloads.pop(bits, None)


def split_sweep(bench: CudaDenseBench, args) -> None:
    """The whole linear through the front door at each requested ``split_k`` next to the split
    the split-K table picks (auto), per (bits, M): the evidence for the table's small-M rule."""
    from b12x.ops.dense.plan import plan_dense

    k, n = args.shape
    for bits in args.bits:
        for m in args.m:
            # the plan bench.b12x times (same dtypes), read for its split and path
            auto = plan_dense(
                m=m, k=k, n=n, bits=bits, codebook=CODEBOOK, x_dtype=torch.bfloat16,
                compute_dtype=bench.compute_dtype,
            )  # fmt: skip
            cells = [f"auto({auto.split_k}) {bench.b12x(m, bits)[0]:.1f}"]
            for split in args.split_sweep:
                cells.append(f"{split}: {bench.b12x(m, bits, split_k=split)[0]:.1f}")
            print(f"split K{bits} M={m} [{auto.path}] us: " + "  ".join(cells), flush=True)
        bench._payloads.pop(bits, None)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    refusal = refuse_without_cuda("dense_trellis.py", torch.cuda.is_available())
    if refusal is not None:
        return refusal
    timing = QUICK_TIMING if args.quick else TIMING
    torch.manual_seed(0)
    bench = CudaDenseBench(args, timing)
    if args.sweep:
        sweep(bench, args)
        return 0
    if args.split_sweep:
        split_sweep(bench, args)
        return 0
    deadline = Deadline(args.budget_s or None)

    def save(report: dict) -> None:
        if args.json:
            write_json(args.json, report)

    def log(line: str) -> None:
        print(line, flush=True)

    def dispatch_extra(report: dict) -> None:
        if args.dispatch:
            report["dispatch"] = dispatch_check(bench, args, deadline, log)

    report = collect(
        args, bench, deadline=deadline, log=log, on_progress=save, after_b12x=dispatch_extra
    )
    print(summary_text(report), flush=True)
    if not any_b12x_measured(report):
        print("dense_trellis.py: no b12x cell was measured (see the notes)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
