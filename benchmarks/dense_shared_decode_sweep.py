"""Sweep (issue 14): the shared-decode dense GEMM against the per-warp decode and the front door.

What it answers: at which M, and with which geometry, the shared-decode mainloop of
:mod:`b12x.kernels.dense_gemm` (the CTA decodes each K16 row once into shared memory, then
``m_warps x warps/m_warps`` warps multiply it) beats the paths the dense dispatch table has
today: the per-warp decode GEMM (``generic``) and decode + cuBLAS (``decode_matmul``).

Everything is the GEMM alone (activations already rotated; no H128), bf16, on one layer
(``--shape``, default 8192 x 28672, MCG), per M of ``--m``:

* **check** first, per geometry at ``--check-m`` (default 100: a partial M tile and idle warps):
  the shared-decode output must equal the per-warp decode's **bit for bit** at the same split
  (both issue the same ``mma.sync`` sequence per output element, in K order), and the split-K
  output must equal a float32 reference ``x @ decode(W)`` within bf16 rounding. A mismatch is
  printed as ``CHECK FAIL`` and the geometry is not timed.
* **time**: every geometry x split, the per-warp decode at the split the split-K table picks
  for it (``dense_trellis.auto_split``), the whole linear as the plan runs it (the front door:
  decode + cuBLAS from the dispatch threshold on), and cuBLAS alone on a bf16 weight (the
  anchor), in CUDA graphs over payload copies that rotate past the L2 (median of event-timed
  replays). Output: one line per cell, then per M the best shared-decode cell against the
  per-warp decode and the front door; ``--json F`` writes every cell.

Usage: ``python benchmarks/dense_shared_decode_sweep.py [--m 16,64,256] [--bits 4]
[--geometries 1x1x8x8,...] [--splits 1,2,4] [--slots 1x4,2x3] [--json out.json]``; a
geometry is ``m_tiles x n_tiles x warps x m_warps`` (a trailing ``w``: the ``wgmma`` mainloop,
sm_90, whose bit identity with ``mma.sync`` is reported but only the error bound is required),
a trailing ``s``: the swap-AB mainloop, sm_90, ``MT`` 0 = fit M), a slot ``shared_rows x
smem_stages`` (the swap-AB mainloop takes 4..8 stages, the shared decode 3..4; a pair a
geometry refuses is reported and skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial

import torch
from bench_cli import int_list
from bench_timing import capture_graph, median_us
from dense_trellis import auto_split, copies_for

CODEBOOK = "mcg"
DEFAULT_GEOMETRIES = ("1x1x8x8", "2x1x8x4", "1x2x8x4", "2x2x8x4", "1x1x4x4", "1x2x8x8w")


def geometry(text: str) -> tuple[int, int, int, int, bool, bool, int, bool]:
    """``MTxNTxWxMW``, with a trailing ``w`` for the wgmma mainloop (``1x1x8x8w``) or ``s``
    for the swap-AB mainloop (``0x1x8x8s``; ``MT`` 0 = ``ceil(M / 16)`` token blocks, at most
    16), ``sC`` for a swap-AB cluster of ``C`` CTAs sharing each token tile (``16x1x8x8s2``);
    a final ``k`` runs either on the stream-K schedule (``1x2x8x8wk``, ``16x1x8x8s2k``;
    :mod:`b12x.kernels.stream_k`)."""
    cluster = 1
    body = text.removesuffix("k")  # a k after a tensor mainloop's suffix: stream-K
    stream_k = text.endswith("k") and (body.endswith(("w", "s")) or body[-2:-1] == "s")
    text = body if stream_k else text
    if text[-1:].isdigit() and text[-2:-1] == "s":
        text, cluster = text[:-1], int(text[-1])
    swap = text.endswith("s")
    tensor = swap or text.endswith("w")
    parts = tuple(int(v) for v in text.removesuffix("w").removesuffix("s").split("x"))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"expected MTxNTxWxMW[w|s|sC][k], got {text!r}")
    return (*parts, tensor, swap, cluster, stream_k)


def geometry_name(g) -> str:
    cluster = str(g[6]) if g[6] > 1 else ""
    suffix = "s" + cluster if g[5] else "w" if g[4] else ""
    return "x".join(map(str, g[:4])) + suffix + ("k" if g[7] else "")


def swap_tiles(m_tiles: int, m: int) -> int:
    """A swap-AB geometry's token blocks at M (``m_tiles`` 0: fit M, at most 16)."""
    return m_tiles or min(16, -(-m // 16))


def front_door(m, k, n, bits, payloads, graphed) -> tuple[float, str]:
    """The whole linear as the plan runs it (bf16 x, fp16 compute, both H128s): the dispatch
    table's path, decode + cuBLAS included from its threshold on."""
    from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense

    plan = plan_dense(
        m=m, k=k, n=n, bits=bits, codebook=CODEBOOK, x_dtype=torch.bfloat16,
        compute_dtype=torch.float16,
    )  # fmt: skip
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cuda"))
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    suh = torch.ones(k, device="cuda", dtype=torch.float16)
    svh = torch.ones(n, device="cuda", dtype=torch.float16)
    return graphed([partial(run_dense, bound, x, p, suh, svh) for p in payloads]), plan.path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int_list, default=(16, 32, 64, 128, 256, 1024, 4096))
    parser.add_argument("--bits", type=int_list, default=(4,))
    parser.add_argument("--shape", default="8192x28672")
    parser.add_argument("--geometries", default=",".join(DEFAULT_GEOMETRIES))
    parser.add_argument("--splits", type=int_list, default=(1, 2, 4, 8))
    parser.add_argument("--slots", default="1x4,2x3,1x3", help="shared_rows x smem_stages pairs")
    parser.add_argument("--check-m", type=int, default=100)
    parser.add_argument("--codebooks", default=CODEBOOK, help="codebooks checked (timed: mcg)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("dense_shared_decode_sweep.py: needs a CUDA device", file=sys.stderr)
        return 1
    from b12x.launch import host
    from b12x.ops.dense import tiles as dense_tiles

    k, n = (int(v) for v in args.shape.split("x"))
    geos = [geometry(g) for g in args.geometries.split(",")]
    slots = [tuple(int(v) for v in t.split("x")) for t in args.slots.split(",")]
    report = {"shape": [k, n], "cells": [], "checks": []}
    timing = {"reps": 15, "inner": 3}

    def payloads(bits, count):
        shape = (k // 16, n // 16, 32 * bits)
        return [
            torch.empty(shape, dtype=torch.uint8, device="cuda").random_().view(torch.int16)
            for _ in range(count)
        ]

    def graphed(fns) -> float:
        graphs = [capture_graph(fn) for fn in fns]
        return median_us(lambda i: graphs[i % len(graphs)].replay(), **timing)

    def shared(x, p, g, split, slot, out, scratch, codebook=CODEBOOK):
        mt, nt, w, mw, tensor, swap, cluster, stream_k = g
        if swap:
            mt = swap_tiles(mt, x.shape[0])
        rows, stages = slot
        return host.trellis_matmul(
            x, p, codebook, split_k=split, out=out, scratch=scratch, tiles=(mt, nt), warps=w,
            m_warps=mw, shared_rows=rows, smem_stages=stages, wgmma=tensor, swap_ab=swap,
            cluster=cluster, stream_k=stream_k, flags=flags if stream_k else None,
        )  # fmt: skip

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flags = torch.zeros(sms, dtype=torch.int32, device="cuda")  # stream-K: one CTA per SM

    # ---- checks
    for codebook in args.codebooks.split(","):
        for bits in args.bits:
            try:
                p = payloads(bits, 1)[0]
            except Exception as exc:  # noqa: BLE001
                print(f"check {codebook} K{bits}: {exc}")
                continue
            m = args.check_m
            x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
            w = host.decode_weight(p, codebook).float()
            ref = x.float() @ w
            scale = ref.abs().max().item()
            for g in geos:
                for rows in slots:
                    for split in (1,) if g[7] else (1, 3):  # stream-K splits K itself
                        try:
                            mt, nt, warps, mw, tensor, swap, *_ = g
                            got = shared(x, p, g, split, rows, None, None, codebook)
                            if swap:  # the per-warp kernel's own tile at this M
                                mt, nt = dense_tiles.choose_tiles(m, n)
                                warps = 4
                            base = host.trellis_matmul(
                                x, p, codebook, split_k=split, tiles=(mt, nt), warps=warps
                            )
                            torch.cuda.synchronize()
                            exact = torch.equal(got, base)
                            err = (got.float() - ref).abs().max().item() / scale
                            # wgmma sums a K16 product in the tensor core's own order: bit
                            # identity with mma.sync is reported, the error bound must hold
                            ok = (exact or tensor) and err < 2e-2
                        except Exception as exc:  # noqa: BLE001
                            ok, exact, err = False, False, float("nan")
                            print(f"check {codebook} K{bits} {g} rows={rows}: {exc}")
                        line = (
                            f"check {codebook} K{bits} M={m} geo={geometry_name(g)} "
                            f"rows={rows} split={split}: bit-exact vs per-warp={exact} "
                            f"rel err {err:.2e} {'ok' if ok else 'CHECK FAIL'}"
                        )
                        print(line, flush=True)
                        check = {"codebook": codebook, "bits": bits, "geo": g, "rows": rows,
                                 "split": split, "ok": ok}  # fmt: skip
                        report["checks"].append(check)
    failed = {(tuple(c["geo"]), c["rows"]) for c in report["checks"] if not c["ok"]}

    # ---- timing
    for bits in args.bits:
        ps = payloads(bits, copies_for(k * n * bits // 8))
        weights = None
        for m in args.m:
            x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            if weights is None:
                weights = [
                    torch.randn(k, n, device="cuda").to(torch.bfloat16)
                    for _ in range(copies_for(2 * k * n))
                ]
            cublas = graphed([partial(torch.mm, x, w, out=out) for w in weights])
            mt, nt = dense_tiles.choose_tiles(m, n)
            auto = auto_split(m, k, n)
            most = max(auto, *args.splits)
            scratch = torch.empty(max(most * m * n, 8 << 20), device="cuda", dtype=torch.float32)
            per_warp = graphed(
                [
                    partial(
                        host.trellis_matmul,
                        x,
                        p,
                        CODEBOOK,
                        split_k=auto,
                        out=out,
                        scratch=scratch,
                        tiles=(mt, nt),
                    )  # fmt: skip
                    for p in ps
                ]
            )
            front, path = front_door(m, k, n, bits, ps, graphed)
            print(
                f"K{bits} M={m}: cuBLAS {cublas:.1f} us; front door ({path}, fp16 compute, "
                f"whole linear) {front:.1f} ({front / cublas:.2f}); per-warp split {auto} "
                f"{per_warp:.1f} ({per_warp / cublas:.2f})",
                flush=True,
            )
            best = None
            for g in geos:
                for rows in slots:
                    if (g, rows) in failed:
                        continue
                    for split in (1,) if g[7] else args.splits:
                        try:
                            us = graphed(
                                [partial(shared, x, p, g, split, rows, out, scratch) for p in ps]
                            )
                        except Exception as exc:  # noqa: BLE001
                            print(f"  {g} rows={rows} split={split}: {exc}")
                            continue
                        print(
                            f"  shared {geometry_name(g)} rows={rows} split={split}: "
                            f"{us:.1f} us ({us / cublas:.2f})",
                            flush=True,
                        )
                        cell = {"bits": bits, "m": m, "geo": g, "rows": rows, "split": split,
                                "us": us, "cublas_us": cublas}  # fmt: skip
                        report["cells"].append(cell)
                        if best is None or us < best["us"]:
                            best = cell
            if best is not None:
                print(
                    f"BEST K{bits} M={m}: shared {geometry_name(best['geo'])} rows={best['rows']} "
                    f"split={best['split']} {best['us']:.1f} us = {best['us'] / cublas:.2f} "
                    f"x cuBLAS; front door ({path}) {front / cublas:.2f}; per-warp "
                    f"{per_warp / cublas:.2f}",
                    flush=True,
                )
            report.setdefault("anchors", []).append(
                {
                    "bits": bits,
                    "m": m,
                    "cublas_us": cublas,
                    "front_door_us": front,
                    "front_door_path": path,
                    "per_warp_us": per_warp,
                    "per_warp_split": auto,
                }  # fmt: skip
            )
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(report, fh, indent=1)
        del ps
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
