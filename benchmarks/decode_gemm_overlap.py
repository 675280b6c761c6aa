"""Benchmark: can the decode of decode_matmul hide under its GEMM? (issue 14, large-M rows).

The ``decode_matmul`` path runs the weight decode (memory-bound: it reads the payload and
writes the ``[K, N]`` weight) and then cuBLAS (tensor-bound from M of about a thousand) one after
the other, so its time is their sum. This script measures the upper bound of overlapping them:
the weight split into ``C`` column chunks, each with its own contiguous payload ``[K/16, N/(16C),
16b]`` (copied once, before timing), weight ``[K, N/C]`` and output ``[M, N/C]``; chunk ``c`` is
decoded on one stream while cuBLAS multiplies chunk ``c - 1`` on another (an event per chunk
orders each GEMM after its decode). Rotations are left out: both variants would pay them alike.

It prints, per M, the times in us of: the two in sequence (today's path), the decode alone, the
GEMM alone (one ``[K, N]`` weight) and the pipelined form for each chunk count, each variant
also over the sequence timed in alternating samples with it
(:func:`bench_timing.paired_median_us`: a sustained GEMM load lowers the SM clock, so variants
timed apart are not comparable). Every variant is one replayed CUDA graph
(:func:`bench_timing.capture_graph`; the two-stream one forks from and joins the capturing
stream). Random MCG payloads, fp16 compute, as the path plans it for bf16 x. A pipelined time
near the GEMM alone would mean the decode can hide; near the sequence, that the GEMM leaves it
no room (cuBLAS's kernels fill every SM).

Result: docs/evidence/dense-decode-matmul-bounds.md (the decode does not hide).

Usage: ``python benchmarks/decode_gemm_overlap.py [--m 1024,4096] [--chunks 2,4,7] [--bits 4]
[--k 8192] [--n 28672] [--json FILE]``. Needs a CUDA device; without one it prints one line and
exits 1.
"""

from __future__ import annotations

import argparse
import sys

import torch
from bench_cli import (
    int_list,
    positive_int,
    ratio_cells,
    refuse_without_cuda,
    render_table,
    write_json,
)
from bench_timing import capture_graph, over_baseline


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int_list, default=(1024, 4096), help="token counts")
    parser.add_argument("--chunks", type=int_list, default=(2, 4, 7), help="column chunks")
    parser.add_argument("--bits", type=positive_int, default=4, help="trellis bits (MCG)")
    parser.add_argument("--k", type=positive_int, default=8192, help="input features")
    parser.add_argument("--n", type=positive_int, default=28672, help="output features")
    parser.add_argument("--json", default=None, help="write the times here")
    args = parser.parse_args(argv)
    for c in args.chunks:
        if args.n % (16 * c):
            parser.error(f"--chunks: N = {args.n} is not a multiple of 16 x {c}")
    if args.k % 16:
        parser.error(f"--k: {args.k} is not a multiple of 16")
    return args


def chunk_columns(n: int, chunks: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each column chunk: equal, N16-aligned (N is a multiple of 16C)."""
    width = n // chunks
    return [(c * width, (c + 1) * width) for c in range(chunks)]


class Layer:
    """One random layer on the GPU: payload, activations and the buffers of each variant."""

    def __init__(self, m: int, k: int, n: int, bits: int):
        self.payload = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 16 * bits),
                                     dtype=torch.int16, device="cuda")  # fmt: skip
        self.x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        self.weight = torch.empty(k, n, device="cuda", dtype=torch.float16)
        self.out = torch.empty(m, n, device="cuda", dtype=torch.float16)

    def sequence(self, decode) -> None:
        decode(self.payload, out=self.weight)
        torch.mm(self.x, self.weight, out=self.out)

    def pipelined(self, decode, chunks: int):
        """A callable running the two-stream form with ``chunks`` chunks (its buffers are made
        here, once, and live in the closure)."""
        cols = chunk_columns(self.weight.shape[1], chunks)
        parts = [self.payload[:, a // 16 : b // 16].contiguous() for a, b in cols]
        weights = [torch.empty(self.weight.shape[0], b - a, device="cuda",
                               dtype=torch.float16) for a, b in cols]  # fmt: skip
        outs = [torch.empty(self.x.shape[0], b - a, device="cuda", dtype=torch.float16)
                for a, b in cols]  # fmt: skip
        side = torch.cuda.Stream()

        def run() -> None:
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            decoded = []
            with torch.cuda.stream(side):
                for part, weight in zip(parts, weights, strict=True):
                    decode(part, out=weight)
                    event = torch.cuda.Event()
                    event.record(side)
                    decoded.append(event)
            for event, weight, out in zip(decoded, weights, outs, strict=True):
                main.wait_event(event)
                torch.mm(self.x, weight, out=out)
            main.wait_stream(side)

        return run


def measure(m: int, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Per variant ``(µs, µs / sequence µs)``, each in alternation with the sequence."""
    from b12x.launch import host

    def decode(payload, *, out):
        return host.decode_weight(payload, "mcg", out=out)

    layer = Layer(m, args.k, args.n, args.bits)
    variants = {
        "sequence": lambda: layer.sequence(decode),
        "decode": lambda: decode(layer.payload, out=layer.weight),
        "gemm": lambda: torch.mm(layer.x, layer.weight, out=layer.out),
    }
    for chunks in args.chunks:
        variants[f"pipelined x{chunks}"] = layer.pipelined(decode, chunks)
    return over_baseline("sequence", {name: capture_graph(fn) for name, fn in variants.items()})


def main(argv=None) -> int:
    args = parse_args(argv)
    refused = refuse_without_cuda("decode_gemm_overlap.py", torch.cuda.is_available())
    if refused is not None:
        return refused
    results = {}
    for m in args.m:
        results[m] = measure(m, args)
        torch.cuda.empty_cache()
    device = torch.cuda.get_device_name()
    print(f"decode + cuBLAS, K={args.k} N={args.n} MCG K{args.bits}, CUDA graphs, us "
          f"(time / sequence timed in alternation); {device}")  # fmt: skip
    names = list(next(iter(results.values())))
    print(render_table(["M", *names], ratio_cells(results, names)))
    if args.json:
        payload = {"device": device, "k": args.k, "n": args.n, "bits": args.bits,
                   "us_and_ratio": {str(m): t for m, t in results.items()}}  # fmt: skip
        write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
