"""Benchmark: the dense trellis GEMM / linear against cuBLAS bf16 and the HBM copy bandwidth.

For K × N = 8192 × 28672 at K-bits 2, 3, 4, 6 (MCG) and M = 1, 4, 16, 32, 48, 64, 256, 1024, 4096
it prints, per case: the trellis GEMM time (in-register decode, rotated activations in, fp16 out),
the full linear time (rotations + GEMM), the weight bytes moved per second as a fraction of the
HBM copy bandwidth measured in the same run, and the ratio to cuBLAS bf16 on the dequantised
weight (``x_bf16 @ W_bf16``) measured in the same run. Payloads are rotated over several copies
so the working set exceeds the L2; timings are medians of CUDA-event samples.

Per (bits, M) a ``dispatch`` line then puts the path the dense dispatch table picks on this
device (:func:`b12x.ops.dense.dispatch.explain`; the K6 and generic rows run the fused GEMM) next to
the fused and decode+cuBLAS GEMM times, names the faster one and says whether the table agrees,
so the decode_matmul threshold (``DECODE_MATMUL_MIN_M``) can be checked against the measurement.
M = 32 and 48 sit between the last fused win (16) and the first decode+cuBLAS win (64) of the
2026-12-02 H200 run.

Usage: ``python benchmarks/dense_trellis.py [--m 1,4,16] [--bits 2,3,4,6] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_timing import capture_graph, hbm_copy_bandwidth
from bench_timing import median_us as _time_us

from b12x.launch import host
from b12x.ops.dense import dispatch
from b12x.ops.dense import split_k as split_rule
from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.dense.plan import (
    allocate_dense_buffers,
    bind_dense,
    device_limits,
    plan_dense,
    run_dense,
)

K, N = 8192, 28672
L2_BYTES = 60 * 2**20


def graph_linear_us(m: int, bits: int, payloads, suh, svh) -> tuple[float, str]:
    """The whole linear as a serving engine runs it: plan once, bind caller buffers, capture
    ``run_dense`` in one CUDA graph per payload copy (weights stay out of the L2), time replays.
    Returns ``(microseconds, planned path)``."""
    plan = plan_dense(m=m, k=K, n=N, bits=bits, codebook="mcg", x_dtype=torch.float16)
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cuda"))
    x = torch.randn(m, K, device="cuda").to(torch.float16)
    graphs = [capture_graph(lambda p=p: run_dense(bound, x, p, suh, svh)) for p in payloads[:3]]
    us = _time_us(lambda i: graphs[i % len(graphs)].replay())
    return us, plan.path


def bound_linear(m: int, bits: int, path: str):
    """The linear through the front door (plan → allocate → bind), steered onto ``path``:
    ``"fused"`` pins the auto-selected tile (an explicit tile always takes the generic row);
    ``"decode_matmul"`` plans as the table says and returns ``None`` where the table does not
    pick decode_matmul at this M (the front door cannot force it)."""
    tile = None
    if path == "fused":
        limits = device_limits()
        tile = dense_tiles.auto_select(dense_tiles.TileProblem("dense", m, K, N, bits), limits)
    plan = plan_dense(m=m, k=K, n=N, bits=bits, codebook="mcg", x_dtype=torch.float16, tile=tile)
    if path == "decode_matmul" and plan.path != "decode_matmul":
        return None
    return bind_dense(plan, **allocate_dense_buffers(plan, "cuda"))


def _copies(nbytes: int) -> int:
    return max(2, -(-3 * L2_BYTES // max(nbytes, 1)))


def dispatch_path(m: int, bits: int, capability: tuple[int, int]) -> str:
    """What the dense table picks for an MCG fp16 case: ``"fused"`` or ``"decode_matmul"``."""
    case = {"capability": capability, "m": m, "bits": bits, "codebook": "mcg"}
    picked = dispatch.explain(case).path
    return "decode_matmul" if picked == "decode_matmul" else f"fused ({picked})"


def dispatch_line(bits: int, m: int, picked: str, times: dict[str, float]) -> str:
    """One table line: the dispatch pick next to the fused and decode+cuBLAS GEMM times."""
    fused, decoded = times.get("fused"), times.get("decode_matmul")
    text = f"K{bits} M={m:5d} dispatch -> {picked:22s}"
    text += f" fused {fused:9.1f} us" if fused is not None else " fused         - "
    text += f"  decode+cuBLAS {decoded:9.1f} us" if decoded is not None else ""
    if fused is not None and decoded is not None:
        faster = "fused" if fused <= decoded else "decode_matmul"
        verdict = "agrees" if picked.split()[0] == faster else "DISAGREES"
        text += f"  faster: {faster} ({max(fused, decoded) / min(fused, decoded):.2f}x) {verdict}"
    return text


SWEEP_TILES = {"small": ((1, 2), (1, 4)), "large": ((2, 2), (2, 4), (4, 1), (4, 2))}


def auto_split(m: int, tiles: tuple[int, int] | None = None) -> int:
    """The split the dense rule picks for ``M × K × N`` (the launcher takes what it is given)."""
    m_tiles, n_tiles = host.choose_tiles(m, N) if tiles is None else tiles
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return split_rule.split_k(
        m=m, k=K, n=N, m_tiles=m_tiles, n_tiles=n_tiles, warps=4, sm_count=sms
    )


def sweep(ms, bit_list) -> None:
    """Time the decode kernel, and the fused GEMM over tiles, load depth and split counts; print
    the fastest configuration per (bits, M) next to the one the host heuristics pick."""
    for bits in bit_list:
        payloads = [
            torch.randint(
                -(2**15), 2**15, (K // 16, N // 16, 16 * bits), device="cuda", dtype=torch.int32
            ).to(torch.int16)
            for _ in range(_copies(K * N * bits // 8))
        ]
        dec = _time_us(lambda i, ps=payloads: host.decode_weight(ps[i % len(ps)], "mcg"))
        print(
            f"sweep K{bits} decode_weight: {dec:.1f} us "
            f"({2 * K * N / (dec * 1e-6) / 1e12:.2f} TB/s written)",
            flush=True,
        )
        for m in ms:
            x = torch.randn(m, K, device="cuda").to(torch.float16)
            auto = auto_split(m)
            default = _time_us(
                lambda i, x=x, s=auto, ps=payloads: host.trellis_matmul(
                    x, ps[i % len(ps)], "mcg", split_k=s
                )
            )
            results = []
            for tiles in SWEEP_TILES["small" if m <= 16 else "large"]:
                for depth in (1, 2, 4):
                    for split in (None, 4, 8, 16):
                        try:
                            s = auto_split(m, tiles) if split is None else split
                            us = _time_us(
                                lambda i, x=x, t=tiles, d=depth, s=s, ps=payloads: (
                                    host.trellis_matmul(
                                        x, ps[i % len(ps)], "mcg", tiles=t, depth=d, split_k=s
                                    )
                                )
                            )
                        except (
                            Exception
                        ) as exc:  # a spec that does not build is reported, not fatal
                            print(f"sweep K{bits} M={m} tiles={tiles} depth={depth}: {exc}")
                            break
                        results.append((us, tiles, depth, split))
            best = min(results)
            print(
                f"sweep K{bits} M={m}: heuristic {default:.1f} us; best {best[0]:.1f} us at "
                f"tiles={best[1]} depth={best[2]} split={best[3]}",
                flush=True,
            )
        del payloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--m", default="1,4,16,32,48,64,256,1024,4096")
    parser.add_argument("--bits", default="2,3,4,6")
    parser.add_argument("--json", default=None)
    parser.add_argument("--paths", default="fused,decode_matmul")
    parser.add_argument("--sweep", action="store_true", help="time GEMM tile/split variants")
    args = parser.parse_args()
    if args.sweep:
        sweep([int(v) for v in args.m.split(",")], [int(v) for v in args.bits.split(",")])
        return
    ms = [int(v) for v in args.m.split(",")]
    bit_list = [int(v) for v in args.bits.split(",")]
    paths = args.paths.split(",")
    torch.manual_seed(0)
    bw = hbm_copy_bandwidth()
    capability = torch.cuda.get_device_capability()
    print(f"HBM copy bandwidth: {bw / 1e12:.2f} TB/s  (K={K}, N={N}, capability {capability})")
    print(f"dispatch: decode_matmul for M >= {dispatch.DECODE_MATMUL_MIN_M} (off the K6 row)")

    w_bf16 = [torch.randn(K, N, device="cuda").to(torch.bfloat16) for _ in range(2)]
    rows = []
    summary = []
    cublas = {}
    for m in ms:
        x = torch.randn(m, K, device="cuda").to(torch.bfloat16)
        cublas[m] = _time_us(lambda i, x=x: torch.matmul(x, w_bf16[i % 2]))
    suh = (torch.rand(K, device="cuda") * 0.02 + 0.01).to(torch.float16)
    svh = (torch.rand(N, device="cuda") + 0.5).to(torch.float16)
    for bits in bit_list:
        nbytes = K * N * bits // 8
        payloads = [
            torch.randint(
                -(2**15), 2**15, (K // 16, N // 16, 16 * bits), device="cuda", dtype=torch.int32
            ).to(torch.int16)
            for _ in range(_copies(nbytes))
        ]
        for m in ms:
            x16 = torch.randn(m, K, device="cuda").to(torch.float16)
            picked = dispatch_path(m, bits, capability)
            times = {}
            for path in paths:
                if path == "fused":
                    auto = auto_split(m)
                    gemm = _time_us(
                        lambda i, x=x16, s=auto, ps=payloads: host.trellis_matmul(
                            x, ps[i % len(ps)], "mcg", split_k=s
                        )
                    )
                else:
                    gemm = _time_us(
                        lambda i, x=x16, ps=payloads: torch.matmul(
                            x, host.decode_weight(ps[i % len(ps)], "mcg")
                        )
                    )
                bound = bound_linear(m, bits, path)
                full = None  # the table never plans decode_matmul at this M
                if bound is not None:
                    full = _time_us(
                        lambda i, x=x16, b=bound, ps=payloads: run_dense(
                            b, x, ps[i % len(ps)], suh, svh
                        )
                    )
                times[path] = gemm
                row = {
                    "bits": bits,
                    "m": m,
                    "path": path,
                    "dispatch": picked,
                    "gemm_us": gemm,
                    "linear_us": full,
                    "cublas_bf16_us": cublas[m],
                    "weight_bw_frac": nbytes / (gemm * 1e-6) / bw,
                    "ratio_gemm": gemm / cublas[m],
                    "ratio_linear": None if full is None else full / cublas[m],
                }
                rows.append(row)
                linear = "      n/a" if full is None else f"{full:9.1f}"
                ratio = "n/a" if full is None else f"{row['ratio_linear']:.3f}"
                print(
                    f"K{bits} M={m:5d} {path:13s} gemm {gemm:9.1f} us  linear {linear} us  "
                    f"cuBLAS {cublas[m]:9.1f} us  ratio {row['ratio_gemm']:.3f} / "
                    f"{ratio}  weight BW {100 * row['weight_bw_frac']:.1f}%",
                    flush=True,
                )
            graph_us, planned = graph_linear_us(m, bits, payloads, suh, svh)
            rows.append(
                {"bits": bits, "m": m, "path": f"linear_graph:{planned}", "dispatch": picked,
                 "linear_graph_us": graph_us, "cublas_bf16_us": cublas[m],
                 "ratio_linear_graph": graph_us / cublas[m]}
            )  # fmt: skip
            print(
                f"K{bits} M={m:5d} linear (plan/run in a CUDA graph, path {planned}) "
                f"{graph_us:9.1f} us  ratio to cuBLAS {graph_us / cublas[m]:.3f}",
                flush=True,
            )
            summary.append(
                dispatch_line(bits, m, picked, times)
                + f" | graph linear {graph_us:.1f} us = {graph_us / cublas[m]:.2f}x cuBLAS"
            )
            print(summary[-1], flush=True)
        del payloads
        torch.cuda.empty_cache()
    print("\ndispatch vs measurement (GEMM times):")
    for line in summary:
        print(line)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"hbm_copy_Bps": bw, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
