"""Benchmark: the fused dense trellis GEMM over its mainloop knobs (register stages, unroll).

For K × N = 8192 × 28672 (MCG unless ``--codebook``) it times ``host.trellis_matmul`` for every
``depth`` (K16 rows in flight: 0 = load and decode the same row, 1 = the default ping-pong of
two register stages, 2 = three stages) × ``unroll`` of the stage-group loop, at the automatic
split-K, next to cuBLAS bf16 on a dequantised weight of the same shape (same run). It prints the
time, the ratio to cuBLAS and the weight bytes per second; the instruction side of the same
knobs is ``benchmarks/sass_budget.py`` (CPU). Payloads rotate over copies larger than the L2.

Usage: ``python benchmarks/dense_mainloop_sweep.py [--m 1,4,16] [--bits 2,3,4,6]
[--depth 0,1,2] [--unroll 1,2] [--codebook mcg]``
"""

from __future__ import annotations

import argparse

import torch
from bench_timing import median_us

from b12x.kernels import host

K, N = 8192, 28672
L2_BYTES = 60 * 2**20


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", default="1,4,16")
    parser.add_argument("--bits", default="2,3,4,6")
    parser.add_argument("--depth", default="0,1,2")
    parser.add_argument("--unroll", default="1,2")
    parser.add_argument("--codebook", default="mcg")
    args = parser.parse_args()
    torch.manual_seed(0)
    w_bf16 = [torch.randn(K, N, device="cuda").to(torch.bfloat16) for _ in range(2)]
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
            for depth in _ints(args.depth):
                for unroll in _ints(args.unroll):
                    us = median_us(
                        lambda i, x=x, d=depth, u=unroll, ps=payloads: host.trellis_matmul(
                            x, ps[i % len(ps)], args.codebook, depth=d, unroll=u
                        )
                    )
                    print(
                        f"{args.codebook} K{bits} M={m:4d} depth={depth} unroll={unroll}: "
                        f"{us:8.1f} us  cuBLAS {cublas:8.1f} us  ratio {us / cublas:.3f}  "
                        f"weights {nbytes / (us * 1e-6) / 1e12:.2f} TB/s",
                        flush=True,
                    )
        del payloads
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
