"""Benchmark: cuBLAS time of the decode_matmul GEMM in each dtype and weight layout (issue 14).

The ``decode_matmul`` path of the dense linear (:mod:`b12x.ops.dense.dispatch`) decodes the
weight to ``[K, N]`` in the compute dtype and multiplies with ``torch.mm``; the benchmark's cuBLAS
anchor multiplies bf16 ``x`` by a ``W[N, K]`` weight (``x @ W.T``). Under the profiler the two
GEMMs pick different cuBLAS kernels (``nvjet_sm90_hsh_*_NNT`` against ``nvjet_sm90_tst_*_TNT``),
and this script separates the two differences: it times ``out = a @ w`` on random operands for
every pair of

* dtype: fp16 or bf16 (operands and output), and
* weight form: ``[K, N]`` row-major (``NN``, what the decode writes) or ``W[N, K]`` transposed
  (``TN``, the anchor's form),

each as a replayed CUDA graph of one ``torch.mm`` (:func:`bench_timing.capture_graph`); every
form is timed in alternating samples with the anchor's form
(:func:`bench_timing.paired_median_us`), because a sustained GEMM load lowers the SM clock and
forms timed one after the other are compared across clocks
(docs/evidence/bench-paired-timing.md). One weight (``K·N·2`` bytes;
470 MB at the default 8192 x 28672) is far larger than any L2, so the operands are not rotated.
It prints one row per M with the four times in us and each one over bf16 ``TN`` (the anchor's
form, paired), and writes them to ``--json``. Not yet run in this paired form.

Usage: ``python benchmarks/cublas_gemm_forms.py [--m 1024,4096] [--k 8192] [--n 28672]
[--json FILE]``. Needs a CUDA device; without one it prints one line and exits 1.
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

#: (column name, torch dtype, weight stored as W[N, K] and passed transposed).
FORMS = (
    ("fp16 NN", torch.float16, False),
    ("fp16 TN", torch.float16, True),
    ("bf16 NN", torch.bfloat16, False),
    ("bf16 TN", torch.bfloat16, True),
)
#: The column every time is divided by: the anchor's dtype and form.
ANCHOR = "bf16 TN"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int_list, default=(1024, 4096), help="token counts")
    parser.add_argument("--k", type=positive_int, default=8192, help="input features")
    parser.add_argument("--n", type=positive_int, default=28672, help="output features")
    parser.add_argument("--json", default=None, help="write the times here")
    return parser.parse_args(argv)


def form_graph(m: int, k: int, n: int, dtype: torch.dtype, transposed: bool):
    """A CUDA graph of one ``torch.mm(a, w, out=out)`` with random operands (kept alive by the
    captured closure)."""
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn((n, k) if transposed else (k, n), device="cuda", dtype=dtype)
    rhs = w.t() if transposed else w
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    return capture_graph(lambda: torch.mm(a, rhs, out=out))


def time_forms(m: int, k: int, n: int) -> dict[str, tuple[float, float]]:
    """Per form ``(µs, µs / anchor µs)``, each form in alternation with the anchor's
    (:func:`bench_timing.over_baseline`)."""
    graphs = {name: form_graph(m, k, n, dt, tr) for name, dt, tr in FORMS}
    return over_baseline(ANCHOR, graphs)


def main(argv=None) -> int:
    args = parse_args(argv)
    refused = refuse_without_cuda("cublas_gemm_forms.py", torch.cuda.is_available())
    if refused is not None:
        return refused
    times: dict[int, dict[str, tuple[float, float]]] = {}
    for m in args.m:
        times[m] = time_forms(m, args.k, args.n)
        torch.cuda.empty_cache()
    device = torch.cuda.get_device_name()
    print(f"cuBLAS torch.mm, K={args.k} N={args.n}, CUDA graphs, us (time / {ANCHOR} timed in "
          f"alternation); {device}")  # fmt: skip
    names = [name for name, _, _ in FORMS]
    print(render_table(["M", *names], ratio_cells(times, names)))
    if args.json:
        payload = {"device": device, "k": args.k, "n": args.n, "anchor": ANCHOR,
                   "us_and_ratio": {str(m): row for m, row in times.items()}}  # fmt: skip
        write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
