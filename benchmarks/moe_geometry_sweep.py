"""Grouped-GEMM geometry sweep at small M: how many CTAs a MoE FC1/FC2 launch keeps busy.

What it measures
----------------
One grouped trellis GEMM (``b12x.ops.moe.gemm_op``: plan → bind → run, graphed) of the GLM-like
MoE (hidden 5120, intermediate 1536, 128 experts, top-8, MCG K4, fp16 compute) per phase and M,
with the planned spec and with each geometry of ``--geometries`` (``n_tiles x warps x depth``,
optionally ``x k_split``). A geometry that keeps the planned K split sums each output in the
same order, so its output must be bit-identical to the planned geometry's, which the sweep
checks; one with another K split (``2x2x8x8``: eight K groups) changes the summation order only,
so its output must match the planned one to fp32 rounding (``close``: within 1e-3 of the
output's largest magnitude). Such a cell is evidence for the K-split table
(:data:`b12x.ops.moe.dispatch.K_SPLIT`), which may only key on K (batch invariance). Per cell:
median graphed time, the live CTAs of the launch (``N / (16·n_tiles·warps)`` per live route
block) against the device's SMs, and the weight stream as a share of the HBM copy bandwidth
measured in the same run. ``--routings`` routings are cycled so that the experts read differ
from one replay to the next (the weights of 8 experts at M = 1 are 63 MB for FC1, more than the
L2).

This is the evidence for the MoE geometry table's small-M rows
(:data:`b12x.ops.moe.dispatch.GEMM_GEOMETRY`, :data:`b12x.ops.moe.fc2_tile.FC2_TILE`), not a
benchmark of the whole step (``moe_trellis.py``).

``--pair KIND`` (P22 … P44) sweeps the QSRT pair launch of each phase (MCG base 3; FC1 records
on N, FC2 on K) over ``--k-splits`` (default 1,2,4: the planned geometry with its K split
replaced; the planned one is the pair kernel's k_split 1), judged like the K-split cells.

Usage: ``python benchmarks/moe_geometry_sweep.py [--m 1,8] [--phases fc1,fc2]
[--geometries 1x4x8,2x4x8,...] [--pair P33 [--k-splits 1,2,4]] [--routings 4] [--hidden 5120]
[--intermediate 1536] [--experts 128] [--top-k 8] [--json out.json]`` (the shape options
default to the GLM-like MoE; e.g. ``--hidden 2048 --intermediate 768`` is a Qwen3-30B-A3B-like
one, whose FC2 has no K split)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch
from bench_cli import int_list
from bench_timing import capture_graph, hbm_copy_bandwidth, median_us
from moe_trellis import PAIR_BASE_BITS, PAIR_MEAN_BITS, random_payload

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K, BITS = 5120, 1536, 128, 8, 4
DEFAULT_GEOMETRIES = "1x4x8,2x4x8,1x8x8,2x8x8,1x2x8,4x4x8,4x8x2,1x4x4,2x4x4"
#: a K-split cell's output against the planned one: fp32 rounding of a reordered sum only
CLOSE_OF_MAX = 1e-3


def _geometries(text: str) -> list[tuple[int, int, int, int | None]]:
    """``n_tiles x warps x depth[x k_split]`` per comma-separated part (k_split None: planned)."""
    out = []
    for part in text.split(","):
        try:
            values = [int(v) for v in part.strip().split("x")]
        except ValueError:
            values = []
        if len(values) not in (3, 4):
            raise argparse.ArgumentTypeError(
                f"expected n_tiles x warps x depth [x k_split], got {part!r}"
            )
        out.append((*values, None) if len(values) == 3 else tuple(values))
    return out


def _problem(phase: str, hidden: int, intermediate: int) -> tuple[int, int]:
    """(K, N) of the phase: FC1 ``[H] -> [2I]`` (packed gate|up), FC2 ``[I] -> [H]``."""
    return (hidden, 2 * intermediate) if phase == "fc1" else (intermediate, hidden)


def _legal(spec, k: int, n: int) -> str | None:
    try:
        spec.check_k(k)
    except ValueError as exc:
        return str(exc)
    if n % spec.n_group:
        return f"N={n} is not a multiple of {spec.n_group}"
    if (k // 16 // spec.k_split) % spec.depth:
        return f"depth {spec.depth} does not divide the K slice"
    return None


def _time_cell(run_moe_gemm, bound, a, payload, routings) -> tuple[torch.Tensor, float]:
    """The first routing's output (a copy) and the median graphed time over the routings."""

    def run(ids):
        return run_moe_gemm(bound, a=a, topk_ids=ids, payload=payload, modes=None)

    out = run(routings[0]).clone()
    graphs = [capture_graph(lambda ids=ids: run(ids)) for ids in routings]
    return out, median_us(lambda i: graphs[i % len(graphs)].replay(), reps=15, inner=4)


def sweep(args) -> dict:
    from b12x.ops.moe.gemm_op import (
        allocate_moe_gemm_buffers,
        bind_moe_gemm,
        moe_gemm_payload_shape,
        plan_moe_gemm,
        run_moe_gemm,
    )

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hbm = hbm_copy_bandwidth()
    print(f"HBM copy {hbm / 1e9:.0f} GB/s, {sms} SMs", flush=True)
    rows = []
    gen = torch.Generator(device="cuda")
    experts, top_k = args.experts, args.top_k
    bits = PAIR_BASE_BITS if args.pair else BITS
    stack = f"pair {args.pair} (base K{bits})" if args.pair else f"K{bits}"
    print(f"H={args.hidden} I={args.intermediate} E={experts} top-{top_k} MCG {stack}", flush=True)
    cells = [("", (None, None, None, ks)) for ks in args.k_splits] if args.pair else [
        ("", g) for g in args.geometries
    ]  # fmt: skip
    for phase in args.phases:
        k, n = _problem(phase, args.hidden, args.intermediate)
        payload = None
        for m in args.m:
            gen.manual_seed(7919 * m)
            a = (0.05 * torch.randn(m * top_k, k, device="cuda", generator=gen)).half()
            routings = []
            for _ in range(args.routings):
                logits = torch.randn(m, experts, device="cuda", generator=gen)
                routings.append(logits.topk(top_k, dim=-1).indices.contiguous())
            experts_read = sum(int(r.unique().numel()) for r in routings) / len(routings)
            rate = PAIR_MEAN_BITS[args.pair] if args.pair else bits
            weight_bytes = experts_read * k * n * rate / 8
            plan = plan_moe_gemm(
                m=m, top_k=top_k, k=k, n=n, codebook="mcg", bits=bits, num_experts=experts,
                compute_dtype=torch.float16, phase=phase, pair=args.pair,
                device=torch.device("cuda"),
            )  # fmt: skip
            if payload is None:
                payload = random_payload(moe_gemm_payload_shape(plan.problem))
            reference = None
            for label, geometry in [("planned", None), *cells]:
                spec = plan.spec
                if geometry is not None:
                    n_tiles, warps, depth, k_split = geometry
                    k_split = spec.k_split if k_split is None else k_split
                    try:
                        spec = dataclasses.replace(
                            spec, n_tiles=n_tiles or spec.n_tiles, warps=warps or spec.warps,
                            depth=depth or spec.depth, k_split=k_split,
                        )  # fmt: skip
                    except ValueError as exc:
                        print(f"{phase} M={m} {geometry}: illegal ({exc})", flush=True)
                        continue
                    why = _legal(spec, k, n)
                    if why:
                        print(f"{phase} M={m} {geometry}: illegal ({why})", flush=True)
                        continue
                cell = dataclasses.replace(plan, spec=spec)
                bound = bind_moe_gemm(cell, **allocate_moe_gemm_buffers(cell, "cuda"))

                out, us = _time_cell(run_moe_gemm, bound, a, payload, routings)
                if reference is None:
                    reference, planned_split = out, spec.k_split
                same = bool(torch.equal(out, reference))
                scale = float(reference.float().abs().max())
                diff = float((out.float() - reference.float()).abs().max())
                # the planned K split: bit-identical; another: the same sums reordered
                ok = same if spec.k_split == planned_split else diff <= CLOSE_OF_MAX * scale
                live_blocks = min(cell.routes.num_blocks, m * top_k)
                ctas = live_blocks * (n // spec.n_group)
                row = {
                    "phase": phase, "m": m, "label": label or "sweep",
                    "geometry": [spec.n_tiles, spec.warps, spec.depth], "k_split": spec.k_split,
                    "threads": spec.cta_threads, "live_ctas_max": ctas, "sms": sms,
                    "us": us, "weight_bw_of_hbm": weight_bytes / (us * 1e-6) / hbm,
                    "bit_identical_to_planned": same, "max_abs_diff_to_planned": diff,
                    "agrees_with_planned": ok,
                }  # fmt: skip
                rows.append(row)
                geo = "x".join(str(v) for v in row["geometry"])
                print(
                    f"{phase} M={m:<3d} {geo:>7s} k_split {spec.k_split} {label:8s} "
                    f"{us:8.1f} us  CTAs<={ctas:4d} ({spec.cta_threads} thr)  "
                    f"weights {row['weight_bw_of_hbm']:.2f} of HBM  identical={same} "
                    f"agrees={ok}",
                    flush=True,
                )
    return {"hbm_copy_bytes_per_s": hbm, "sms": sms, "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int_list, default=(1, 8))
    parser.add_argument("--phases", type=lambda t: t.split(","), default=("fc1", "fc2"))
    parser.add_argument("--geometries", type=_geometries, default=_geometries(DEFAULT_GEOMETRIES))
    parser.add_argument(
        "--pair",
        choices=[k for k in PAIR_MEAN_BITS if k != "dynamic"],
        default=None,
        help="sweep this QSRT pair kind's launch over --k-splits",
    )
    parser.add_argument("--k-splits", type=int_list, default=(1, 2, 4))
    parser.add_argument("--routings", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="H: FC1's K, FC2's N")
    parser.add_argument("--intermediate", type=int, default=INTERMEDIATE, help="I: FC2's K")
    parser.add_argument("--experts", type=int, default=EXPERTS)
    parser.add_argument("--top-k", type=int, default=TOP_K)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_geometry_sweep.py: needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    report = sweep(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0 if all(r["agrees_with_planned"] for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
