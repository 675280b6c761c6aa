"""Benchmark: the fused trellis MoE against a dequantised bf16 grouped MoE in cuBLAS.

GLM-like geometry by default: hidden 5120, intermediate 1536, 128 experts, top-8, MCG K4,
``packed`` FC1, M = 1, 8, 64, 512, 4096. Per M it prints:

* ``trellis graph``: one CUDA-graph replay of the whole :func:`b12x.ops.moe.run.run_moe` sequence
  (route packing, rotations, grouped trellis GEMMs, boundary, top-k sum), caller-owned buffers;
* ``trellis eager``: the same sequence launched eagerly (launch overhead included);
* ``bf16 graph``: the baseline, captured too: for each routed expert (grouping fixed on the host
  outside the timing) ``rows @ W13_bf16[e]`` → ``silu(gate)·up`` → ``@ W2_bf16[e]`` →
  ``index_add_`` of ``w·y`` (cuBLAS on the decoded weights, no rotations);
* ratios baseline / trellis (> 1 means the trellis MoE is faster) and the weight bytes moved
  per second of the trellis graph as a fraction of the HBM copy bandwidth measured in the run.

Usage: ``python benchmarks/moe_trellis.py [--m 1,8,64] [--bits 4] [--layout packed]
[--experts 128] [--hidden 5120] [--intermediate 1536] [--top-k 8] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from bench_timing import capture_graph as _graph
from bench_timing import hbm_copy_bandwidth, median_us

from b12x.launch import host
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe


def make_weights(args):
    e, h, i, b = args.experts, args.hidden, args.intermediate, args.bits
    dev = "cuda"

    def payload(*shape):
        return torch.randint(-(2**15), 2**15, shape, dtype=torch.int32, device=dev).to(torch.int16)

    def scales(rows, width):
        sign = torch.where(torch.rand(rows, width, device=dev) < 0.5, -1.0, 1.0)
        return (sign * (0.8 + 0.4 * torch.rand(rows, width, device=dev))).half()

    if args.layout == "packed":
        w13 = payload(e, h // 16, 2 * i // 16, 16 * b)
    else:
        w13 = payload(2, e, h // 16, i // 16, 16 * b)
    w2 = payload(e, i // 16, h // 16, 16 * b)
    gate = scales(1, h)
    tables = dict(
        gate_suh=gate,
        up_suh=gate if args.layout == "packed" else scales(1, h),
        intermediate_rotations=scales(e, 3 * i),
        down_svh=scales(1, h),
    )
    return w13, w2, tables


def dequantise(args, w13, w2):
    """bf16 ``W13 [E, H, 2I]`` and ``W2 [E, I, H]`` decoded by the b12x decode kernel."""
    e = args.experts
    w13_bf16 = torch.empty(
        e, args.hidden, 2 * args.intermediate, dtype=torch.bfloat16, device="cuda"
    )
    w2_bf16 = torch.empty(e, args.intermediate, args.hidden, dtype=torch.bfloat16, device="cuda")
    for x in range(e):
        if args.layout == "packed":
            w13_bf16[x] = host.decode_weight(w13[x], args.codebook)
        else:
            w13_bf16[x, :, : args.intermediate] = host.decode_weight(w13[0, x], args.codebook)
            w13_bf16[x, :, args.intermediate :] = host.decode_weight(w13[1, x], args.codebook)
        w2_bf16[x] = host.decode_weight(w2[x], args.codebook)
    return w13_bf16, w2_bf16


def bench_m(args, m, weights, bf16_weights, bandwidth) -> dict:
    w13, w2, tables = weights
    h, i, e, k = args.hidden, args.intermediate, args.experts, args.top_k
    x = (0.05 * torch.randn(m, h, device="cuda")).to(torch.bfloat16)  # keeps fp16 finite
    logits = torch.randn(m, e, device="cuda")
    topk_w, topk_ids = torch.softmax(logits, -1).topk(k, dim=-1)
    topk_w = topk_w / topk_w.sum(-1, keepdim=True)
    plan = plan_moe(
        m=m, top_k=k, hidden=h, intermediate=i, codebook=args.codebook, bits=args.bits,
        num_experts=e, w13_layout=args.layout, x_dtype=torch.bfloat16,
        compute_dtype=torch.float16,
    )  # fmt: skip
    bound = bind_moe(plan, **allocate_moe_buffers(plan, "cuda"))
    inputs = MoeInputs(
        x, topk_w, topk_ids, (w13,), (w2,), tables["gate_suh"],
        tables["up_suh"] if args.layout == "proj" else None,
        tables["intermediate_rotations"], tables["down_svh"],
    )  # fmt: skip
    eager_us = median_us(lambda i: run_moe(bound, inputs), reps=15, inner=3)
    graph = _graph(lambda: run_moe(bound, inputs))
    graph_us = median_us(lambda i: graph.replay(), reps=15, inner=3)

    w13_bf16, w2_bf16 = bf16_weights
    flat_ids = topk_ids.reshape(-1)
    groups = []
    for expert in torch.unique(flat_ids).tolist():
        routes = (flat_ids == expert).nonzero().reshape(-1)
        groups.append((expert, routes // k, topk_w.reshape(-1)[routes].to(torch.bfloat16)[:, None]))
    out = torch.zeros(m, h, dtype=torch.bfloat16, device="cuda")

    def baseline():
        out.zero_()
        for expert, tokens, weight in groups:
            hidden = x.index_select(0, tokens) @ w13_bf16[expert]
            act = F.silu(hidden[:, :i]) * hidden[:, i:]
            out.index_add_(0, tokens, (act @ w2_bf16[expert]) * weight)

    base_graph = _graph(baseline)
    base_us = median_us(lambda i: base_graph.replay(), reps=15, inner=3)
    per_expert = (w13.numel() + w2.numel()) * 2 // e
    trellis_bytes = len(groups) * per_expert
    row = {
        "m": m,
        "experts_hit": len(groups),
        "trellis_graph_us": graph_us,
        "trellis_eager_us": eager_us,
        "bf16_graph_us": base_us,
        "ratio_bf16_over_trellis": base_us / graph_us,
        "weight_bw_fraction": trellis_bytes / (graph_us * 1e-6) / bandwidth,
    }
    print(
        f"M={m:5d} experts={len(groups):3d}  trellis graph {graph_us:9.1f} us  eager "
        f"{eager_us:9.1f} us  bf16 graph {base_us:9.1f} us  bf16/trellis {base_us / graph_us:5.2f}"
        f"  weight BW {row['weight_bw_fraction']:5.1%} of copy",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", default="1,8,64,512,4096")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--codebook", default="mcg")
    parser.add_argument("--layout", default="packed", choices=("packed", "proj"))
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    bandwidth = hbm_copy_bandwidth()
    print(f"HBM copy bandwidth: {bandwidth / 1e9:.0f} GB/s; {torch.cuda.get_device_name()}")
    weights = make_weights(args)
    bf16_weights = dequantise(args, weights[0], weights[1])
    rows = []
    for m in args.m.split(","):
        rows.append(bench_m(args, int(m), weights, bf16_weights, bandwidth))
        torch.cuda.empty_cache()  # the previous M's buffers and graphs are gone with its frame
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "copy_bandwidth": bandwidth, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
