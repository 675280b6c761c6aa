"""Timing anchors shared by the benchmarks (imported as a sibling module by the scripts here).

* :func:`median_us` — median CUDA-event time of ``fn(i)`` in microseconds; ``i`` counts calls so
  a benchmark can rotate through several input copies and keep its working set out of the L2.
  ``max_s`` bounds the timed part: the warm-up calls give an estimate of one call and the
  sample count is cut (never below three samples) so a slow case does not eat the run's budget.
* :func:`capture_graph` — a CUDA graph of ``fn()`` after two warm-up calls on the stream the
  capture then uses (the way a serving engine captures a step: per-stream library state such as
  cuBLAS workspaces exists before the capture); time ``graph.replay`` with :func:`median_us`.
  A capture that fails is undone (current stream restored, torch's generator capture flag
  cleared by one empty capture) before the error propagates, so the next case still runs.
* :func:`paired_median_us` — two callables timed in alternating samples (``a``, ``b``, ``a``, …),
  their medians: both see the same clocks. A GPU under a sustained GEMM load lowers its SM clock
  (docs/evidence/bench-paired-timing.md), so a cell timed apart from its anchor can differ from it
  by that much for no reason of its own. :func:`alternate_medians` is the alternation itself, over
  any sampler (CPU-tested); :func:`over_baseline` times a set of graphs against one of them.
* :func:`hbm_copy_bandwidth` — bytes read + written per second of a 1 GiB device-to-device copy
  (2 GiB of traffic per copy), the HBM anchor every benchmark reports its weight traffic against,
  measured in the same run.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable

import torch


def _elapsed_us(run: Callable[[], object]) -> float:
    """Microseconds between CUDA events recorded before and after ``run()``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _warm_up(step: Callable[[int], object], warmup: int, reps: int, inner: int, max_s) -> int:
    """Run ``step(i)`` ``warmup`` times; the sample count, cut so that ``reps`` samples of
    ``inner`` steps fit ``max_s`` (never below three)."""
    us = _elapsed_us(lambda: [step(i) for i in range(warmup)])
    if max_s is not None and warmup > 0:
        per_step_s = us * 1e-6 / warmup
        reps = max(3, min(reps, int(max_s / max(per_step_s * inner, 1e-9))))
    return reps


def _sampler(fn: Callable[[int], object], warmup: int, inner: int) -> Callable[[int], float]:
    """Sample ``r``: the mean µs of ``inner`` calls ``fn(warmup + r·inner + i)``."""
    return lambda r: _elapsed_us(lambda: [fn(warmup + r * inner + i) for i in range(inner)]) / inner


def median_us(
    fn: Callable[[int], object],
    *,
    warmup: int = 3,
    reps: int = 20,
    inner: int = 5,
    max_s: float | None = None,
) -> float:
    reps = _warm_up(fn, warmup, reps, inner, max_s)
    sample = _sampler(fn, warmup, inner)
    return statistics.median(sample(r) for r in range(reps))


def alternate_medians(
    sample_a: Callable[[int], float], sample_b: Callable[[int], float], reps: int
) -> tuple[float, float]:
    """``reps`` samples of each, taken a, b, a, b, … (``sample(r)`` gets the sample index);
    the two medians."""
    a, b = [], []
    for r in range(reps):
        a.append(sample_a(r))
        b.append(sample_b(r))
    return statistics.median(a), statistics.median(b)


def paired_median_us(
    fn_a: Callable[[int], object],
    fn_b: Callable[[int], object],
    *,
    warmup: int = 3,
    reps: int = 20,
    inner: int = 5,
    max_s: float | None = None,
) -> tuple[float, float]:
    """:func:`median_us` of ``fn_a`` and ``fn_b`` with their samples alternated (each sample
    ``inner`` calls, ``i`` counting calls per callable); ``max_s`` bounds the pair's timed part."""
    reps = _warm_up(lambda i: (fn_a(i), fn_b(i)), warmup, reps, inner, max_s)
    return alternate_medians(_sampler(fn_a, warmup, inner), _sampler(fn_b, warmup, inner), reps)


def over_baseline(
    baseline: str, graphs: dict[str, torch.cuda.CUDAGraph], **timing
) -> dict[str, tuple[float, float]]:
    """``{name: (µs, µs / baseline µs)}`` for every graph: the one named ``baseline`` timed
    alone (ratio 1.0), every other one in alternation with it (:func:`paired_median_us`) and
    divided by the baseline's time in that pairing."""
    base = graphs[baseline]
    times = {baseline: (median_us(lambda i: base.replay(), **timing), 1.0)}
    for name, graph in graphs.items():
        if name != baseline:
            us, paired = paired_median_us(
                lambda i, g=graph: g.replay(), lambda i: base.replay(), **timing
            )
            times[name] = (us, us / paired)
    return times


def hbm_copy_bandwidth() -> float:
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / (median_us(lambda i: dst.copy_(src), reps=10, inner=2) * 1e-6)


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    caller = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    stream.wait_stream(caller)
    with torch.cuda.stream(stream):
        fn()
        fn()
    caller.wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            fn()
    except BaseException:
        _restore_after_failed_capture(caller)
        raise
    return graph


def _restore_after_failed_capture(stream: torch.cuda.Stream) -> None:
    """A failed ``capture_end`` skips torch's epilogue: the caller's stream is not restored and
    the default generator keeps its capture flag. Restore the stream; an empty capture clears
    the flag."""
    torch.cuda.set_stream(stream)
    healing = torch.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        with torch.cuda.graph(healing):
            pass
    torch.cuda.synchronize()
