"""Launch the swap-AB dense GEMM alone, for a profiler (issue 14): ``--m`` tokens, one geometry.

Usage: ``ncu ... python benchmarks/swap_ab_profile.py --m 256 --geometry 16x1x8 --slots 2x6``
(``MTxNTxW``: tokens per CTA / 16, N16 tiles per warp, warps; ``rows x stages``; ``--cluster
C``: CTAs sharing each token tile). It runs the
GEMM ``--launches`` times on an 8192 x 28672 MCG K4 bf16 layer (the first launch compiles).
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--geometry", default="16x1x8")
    parser.add_argument("--slots", default="2x6")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--shape", default="8192x28672")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--cluster", type=int, default=1)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("swap_ab_profile.py: needs a CUDA device", file=sys.stderr)
        return 1
    from b12x.launch import host

    k, n = (int(v) for v in args.shape.split("x"))
    mt, nt, warps = (int(v) for v in args.geometry.split("x"))
    rows, stages = (int(v) for v in args.slots.split("x"))
    payload = torch.empty((k // 16, n // 16, 32 * args.bits), dtype=torch.uint8, device="cuda")
    payload = payload.random_().view(torch.int16)
    x = (torch.randn(args.m, k, device="cuda") * 0.5).to(torch.bfloat16)
    out = torch.empty(args.m, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(args.launches):
        host.trellis_matmul(
            x, payload, "mcg", out=out, tiles=(mt, nt), warps=warps, m_warps=warps,
            shared_rows=rows, smem_stages=stages, wgmma=True, swap_ab=True, cluster=args.cluster,
        )  # fmt: skip
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
