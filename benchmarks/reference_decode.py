"""Time ``reference.trellis.decode`` on a random 4096×14336 K4 MCG layer (not a test).

Usage: ``python benchmarks/reference_decode.py [--k 4096] [--n 14336] [--bits 4] [--repeat 3]``.
Prints the best wall time of ``--repeat`` runs and weights per second, on CPU and, when one is
available, on CUDA (synchronised around each run). Random int16 payloads are legal tiles (§1.3).
"""

from __future__ import annotations

import argparse
import time

import torch

from reference import trellis


def _time_decode(payload: torch.Tensor, codebook: str, repeat: int) -> float:
    trellis.decode(payload[:1], codebook)  # build the codebook table and index maps once
    best = float("inf")
    for _ in range(repeat):
        if payload.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        trellis.decode(payload, codebook)
        if payload.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=14336)
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--codebook", default="mcg")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.k % 16 or args.n % 16:
        raise SystemExit("--k and --n must be multiples of 16")

    gen = torch.Generator().manual_seed(0)
    shape = (args.k // 16, args.n // 16, 16 * args.bits)
    payload = torch.randint(-32768, 32768, shape, generator=gen, dtype=torch.int16)
    weights = args.k * args.n
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"decode {args.k}x{args.n} K{args.bits} {args.codebook}, torch {torch.__version__}")
    for device in devices:
        seconds = _time_decode(payload.to(device), args.codebook, args.repeat)
        print(f"  {device:5s} {seconds:8.4f} s   {weights / seconds / 1e6:10.1f} Mweights/s")


if __name__ == "__main__":
    main()
