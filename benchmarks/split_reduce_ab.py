"""How the small-M split-K sum is best done (issue 14's M = 1 and 16 rows): the per-warp dense
GEMM plus its reduce, timed as one CUDA graph on an 8192 x 28672 MCG layer, for each variant:

* ``partials S``: fp32 partials ``[S, M, N]`` in global memory, then the split-ordered reduce
  kernel (the planned small-M path at S = 15);
* ``cluster S``: the S splits of each output tile as one thread-block cluster, summed in
  distributed shared memory (:mod:`b12x.kernels.dense_gemm`, "Cluster reduce"; S <= 8).

The activations rotate through copies past the L2 only if ``--copies`` > 1 (the payload,
117 MB at K4, is past it anyway). Each variant's output is checked bit-identical to the first
variant of the same split count before it is timed. Prints one line per (bits, M) with every
variant's microseconds; ``--json`` writes them.

Usage: ``python benchmarks/split_reduce_ab.py [--m 1,16] [--bits 2,4,6]
[--variants partials15,partials8,cluster8,cluster4] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_timing import capture_graph, median_us  # noqa: E402


def _variant(text: str) -> tuple[str, int]:
    for kind in ("partials", "cluster"):
        if text.startswith(kind) and text[len(kind) :].isdigit():
            return kind, int(text[len(kind) :])
    raise argparse.ArgumentTypeError(f"variant: expected partialsS or clusterS, got {text!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", default="1,16")
    parser.add_argument("--bits", default="2,4,6")
    parser.add_argument("--variants", default="partials15,partials8,cluster8,cluster4")
    parser.add_argument("--shape", default="8192x28672")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    variants = [_variant(v) for v in args.variants.split(",")]
    if not torch.cuda.is_available():
        print("split_reduce_ab.py: needs a CUDA device", file=sys.stderr)
        return 1
    from b12x.launch import host
    from oracle.runners import inputs as case_inputs

    k, n = (int(v) for v in args.shape.split("x"))
    rows = []
    print(f"{'bits':>4} {'M':>4} " + " ".join(f"{k}{s:>2}".rjust(12) for k, s in variants))
    for bits in (int(b) for b in args.bits.split(",")):
        gen = torch.Generator().manual_seed(bits)
        payload = case_inputs.payload(gen, k // 16, n // 16, 16 * bits).cuda()
        for m in (int(v) for v in args.m.split(",")):
            a = (torch.randn(m, k, generator=gen) * 0.5).half().cuda()
            scratch = torch.empty(15 * m * n, dtype=torch.float32, device="cuda")
            first_of: dict[int, torch.Tensor] = {}
            times = {}
            for kind, splits in variants:
                out = torch.empty(m, n, dtype=torch.float16, device="cuda")
                launch = dict(
                    split_k=splits, out=out, tiles=(1, 2), warps=8,
                    scratch=None if kind == "cluster" else scratch[: splits * m * n],
                    reduce_in_cluster=kind == "cluster",
                )  # fmt: skip

                def step(a=a, payload=payload, launch=launch):
                    host.trellis_matmul(a, payload, "mcg", **launch)

                step()
                torch.cuda.synchronize()
                ref = first_of.setdefault(splits, out.clone())
                same = torch.equal(ref.view(torch.int16), out.view(torch.int16))
                graph = capture_graph(step)
                us = median_us(lambda i, g=graph: g.replay(), reps=30, max_s=10)
                times[f"{kind}{splits}"] = {"us": us, "bit_identical": same}
            rows.append({"bits": bits, "m": m, "times": times})
            cells = " ".join(
                f"{v['us']:10.1f}{'' if v['bit_identical'] else '!'}".rjust(12)
                for v in times.values()
            )
            print(f"{bits:>4} {m:>4} {cells}", flush=True)
    print("('!' = not bit-identical to the first variant of the same split count)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
