"""Timing anchors shared by the benchmarks (imported as a sibling module by the scripts here).

* :func:`median_us` — median CUDA-event time of ``fn(i)`` in microseconds; ``i`` counts calls so
  a benchmark can rotate through several input copies and keep its working set out of the L2.
* :func:`capture_graph` — a CUDA graph of ``fn()`` after two warm-up calls on a side stream (the
  way a serving engine captures a step); time ``graph.replay`` with :func:`median_us`.
* :func:`hbm_copy_bandwidth` — bytes read + written per second of a 2 GiB device copy, the HBM
  anchor every benchmark reports its weight traffic against, measured in the same run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def median_us(
    fn: Callable[[int], object], *, warmup: int = 3, reps: int = 20, inner: int = 5
) -> float:
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    samples = []
    for r in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(inner):
            fn(r * inner + i)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(samples)


def hbm_copy_bandwidth() -> float:
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_us(lambda i: dst.copy_(src), reps=10, inner=2) * 1e-6)


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph
