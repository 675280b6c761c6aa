"""Benchmark: the fused dense trellis GEMM over its mainloop knobs (register stages, the
cp.async shared-memory ring, unroll, split-K).

For K × N = 8192 × 28672 (MCG unless ``--codebook``) it times ``host.trellis_matmul`` for every
mainloop variant: ``smem_stages = 0`` (register stages) × ``depth`` (K16 rows in flight:
0 = load and decode the same row, 1 = the default ping-pong of two register stages, 2 = three
stages), and ``smem_stages`` = S > 0 (the cp.async ring of S slots, S - 1 rows in flight;
``depth`` does not apply) — each × ``unroll`` of the K loop × ``split_k`` (``auto`` = the
split the plan takes). The kernel geometry (M16 blocks and N16 tiles per warp, warps per CTA)
and the ``auto`` split are those of ``plan_dense`` (what ``run_dense`` launches), or with
``--geometry launcher`` the launcher's defaults (``tiles.choose_tiles``, 4 warps) and the split-K
table's split for them (:func:`b12x.ops.dense.split_k.split_k`). Every row shows the time, the
ratio to cuBLAS bf16 on a dequantised weight of the same shape (same run) and the weight bytes
per second; after each (bits, M) block the fastest variant is printed, and a summary of the
winners closes the run. The instruction side of the same knobs is ``benchmarks/sass_budget.py``
(CPU). Payloads rotate over copies larger than the L2.

Usage: ``python benchmarks/dense_mainloop_sweep.py [--m 1,16] [--bits 2,3,4,6]
[--smem-stages 0,2,3,4] [--depth 0,1,2] [--unroll 1,2] [--split-k auto] [--codebook mcg]
[--geometry planned|launcher]``
"""

from __future__ import annotations

import argparse

import torch
from bench_timing import median_us

from b12x.launch import host
from b12x.ops.dense import split_k as split_rule
from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.dense.plan import plan_dense

K, N = 8192, 28672
L2_BYTES = 60 * 2**20


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _splits(text: str) -> list[int | None]:
    return [None if v == "auto" else int(v) for v in text.split(",")]


def _geometry(m: int, bits: int, codebook: str, planned: bool) -> dict:
    """Kernel geometry and split of the variants at ``M``: the one ``plan_dense`` picks (what
    ``run_dense`` launches; ``planned``) or the launcher's defaults (``tiles.choose_tiles``, 4
    warps) with the split-K rule's split for them."""
    if planned:
        plan = plan_dense(
            m=m,
            k=K,
            n=N,
            bits=bits,
            codebook=codebook,
            x_dtype=torch.float16,
            device=torch.device("cuda"),
        )
        if plan.path != "generic":
            raise SystemExit(f"M={m} K{bits}: the plan takes path {plan.path}, not the GEMM")
        g = plan.geometry
        return dict(tiles=(g.m_tiles, g.n_tiles), warps=g.warps, split=plan.split_k)
    m_tiles, n_tiles = dense_tiles.choose_tiles(m, N)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split = split_rule.split_k(
        m=m, k=K, n=N, m_tiles=m_tiles, n_tiles=n_tiles, warps=4, sm_count=sms
    )
    return dict(tiles=(m_tiles, n_tiles), warps=4, split=split)


def _variants(args) -> list[dict]:
    """Keyword sets for trellis_matmul: depth only varies on the register path."""
    out = []
    for stages in _ints(args.smem_stages):
        for depth in _ints(args.depth) if stages == 0 else [1]:
            for unroll in _ints(args.unroll):
                for split_k in _splits(args.split_k):
                    out.append(
                        dict(smem_stages=stages, depth=depth, unroll=unroll, split_k=split_k)
                    )
    return out


def _label(kw: dict) -> str:
    depth = "-" if kw["smem_stages"] else str(kw["depth"])
    split = "auto" if kw["split_k"] is None else str(kw["split_k"])
    return (
        f"smem_stages={kw['smem_stages']} depth={depth} unroll={kw['unroll']} split_k={split:>4s}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", default="1,16")
    parser.add_argument("--bits", default="2,3,4,6")
    parser.add_argument("--smem-stages", default="0,2,3,4")
    parser.add_argument("--depth", default="0,1,2")
    parser.add_argument("--unroll", default="1,2")
    parser.add_argument("--split-k", default="auto", help="comma list of ints and/or 'auto'")
    parser.add_argument("--codebook", default="mcg")
    parser.add_argument(
        "--geometry",
        choices=("planned", "launcher"),
        default="planned",
        help="tiles and warps of plan_dense (default) or of the launcher's defaults",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    w_bf16 = [torch.randn(K, N, device="cuda").to(torch.bfloat16) for _ in range(2)]
    winners = []
    for bits in _ints(args.bits):
        nbytes = K * N * bits // 8
        copies = max(2, -(-3 * L2_BYTES // nbytes))
        payloads = [
            torch.randint(
                -(2**15), 2**15, (K // 16, N // 16, 16 * bits), device="cuda", dtype=torch.int32
            ).to(torch.int16)
            for _ in range(copies)
        ]
        for m in _ints(args.m):
            x = torch.randn(m, K, device="cuda").to(torch.float16)
            xb = x.to(torch.bfloat16)
            cublas = median_us(lambda i, xb=xb: torch.matmul(xb, w_bf16[i % 2]))
            best = None
            geo = _geometry(m, bits, args.codebook, args.geometry == "planned")
            print(
                f"K{bits} M={m}: {args.geometry} geometry tiles={geo['tiles']} "
                f"warps={geo['warps']} auto split_k={geo['split']}",
                flush=True,
            )
            for kw in _variants(args):
                launch = {
                    **kw,
                    "split_k": kw["split_k"] or geo["split"],
                    "tiles": geo["tiles"],
                    "warps": geo["warps"],
                }
                us = median_us(
                    lambda i, x=x, kw=launch, ps=payloads: host.trellis_matmul(
                        x, ps[i % len(ps)], args.codebook, **kw
                    )
                )
                head = f"{args.codebook} K{bits} M={m:4d} {_label(kw)}"
                print(
                    f"{head}: {us:8.1f} us  cuBLAS {cublas:8.1f} us  ratio {us / cublas:.3f}  "
                    f"weights {nbytes / (us * 1e-6) / 1e12:.2f} TB/s",
                    flush=True,
                )
                if best is None or us < best[0]:
                    best = (us, head, cublas)
            us, head, cublas = best
            line = f"BEST {head}: {us:8.1f} us  ratio {us / cublas:.3f}"
            print(line, flush=True)
            winners.append(line)
        del payloads
        torch.cuda.empty_cache()
    print("\n".join(["", "summary of the fastest variants:", *winners]))


if __name__ == "__main__":
    main()
