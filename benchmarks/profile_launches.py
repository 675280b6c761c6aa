"""Where the time of one MoE step and one dense linear goes: every GPU kernel, its count and time.

Runs :func:`b12x.ops.moe.run.run_moe` (GLM-like geometry of ``moe_trellis.py``) and the dense
linear through its front door (``b12x.ops.dense.plan``: plan → bind → run; 8192 × 28672, MCG) at
small M under ``torch.profiler`` and prints, per kernel name, the launch count and total
device time, largest first, plus the step's sum. This is a diagnostic for the launch sequence
(how much of a step is glue versus the trellis GEMMs), not a benchmark: its times include
profiler overhead and are never quoted as ratios.

Usage: ``python benchmarks/profile_launches.py [--m 1,8] [--top 25] [--only dense|moe]
[--stacks uniform,tiers,pair] [--shared-decode off|wide|tensor] [--x-dtype bf16|fp16]
[--anchor]``

The dense linear runs with bf16 activations by default, as ``dense_trellis.py`` times it;
``--anchor`` adds the cuBLAS bf16 GEMM that benchmark divides by, under the same profiler, so
the table shows which launches sit on top of a GEMM as fast as the anchor.

``--stacks`` picks the MoE stacks tabled: ``uniform`` (MCG K4), ``tiers`` (K3/K4 tiers over a
seeded half/half split) and ``pair`` (P33 on FC1 and FC2 over the K3 base): the same plans and
payloads as ``moe_trellis.py``'s extras (:meth:`moe_trellis.CudaMoeBench.extra_step`).

``--only dense --m 1 --bits 4`` is also the target for a kernel profile of the dense linear
(``ncu --clock-control none python benchmarks/profile_launches.py --plain ...``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import types

import torch
from bench_cli import int_list
from moe_trellis import SHARED_PINS, CudaMoeBench, make_weights
from torch.profiler import ProfilerActivity, profile

from b12x.ops.dense.plan import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.moe.plan import allocate_moe_buffers, bind_moe, plan_moe
from b12x.ops.moe.run import MoeInputs, run_moe


def _table(label: str, fn, top: int, *, plain: bool = False) -> None:
    """Three warm-up calls, then one call under ``torch.profiler`` and its kernel table; with
    ``plain`` the fourth call runs without it (an outside profiler such as ncu is attached)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if plain:
        fn()
        torch.cuda.synchronize()
        return
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name[:90]]
            entry[0] += 1
            entry[1] += event.device_time
    launches = sum(c for c, _ in totals.values())
    device_us = sum(t for _, t in totals.values())
    print(f"== {label}: {launches} kernels, {device_us:.1f} us of device time")
    for name, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {us:9.1f} us  x{count:<3d} {name}")


def _moe(cli) -> None:
    args = types.SimpleNamespace(
        experts=128, hidden=5120, intermediate=1536, top_k=8, bits=4, codebook="mcg",
        layout="packed",
    )  # fmt: skip
    w13, w2, tables = make_weights(args)
    for m in cli.m:
        x = (0.05 * torch.randn(m, args.hidden, device="cuda")).to(torch.bfloat16)
        topk_w, topk_ids = torch.softmax(torch.randn(m, args.experts, device="cuda"), -1).topk(8)
        plan = plan_moe(
            m=m, top_k=8, hidden=args.hidden, intermediate=args.intermediate, codebook="mcg",
            bits=4, num_experts=args.experts, w13_layout="packed", x_dtype=torch.bfloat16,
            compute_dtype=torch.float16, device=torch.device("cuda"),
            shared_decode=cli.shared_decode,
        )  # fmt: skip
        bound = bind_moe(plan, **allocate_moe_buffers(plan, "cuda"))
        inputs = MoeInputs(
            x, topk_w, topk_ids, (w13,), (w2,), tables["gate_suh"], None,
            tables["intermediate_rotations"], tables["down_svh"],
        )  # fmt: skip
        run = functools.partial(run_moe, bound, inputs)
        if "uniform" in cli.stacks:
            _table(f"run_moe M={m}", run, cli.top, plain=cli.plain)
        for stack, extra in (("tiers", "tiers K3/K4"), ("pair", "pair P33")):
            if stack in cli.stacks:
                bench_args = types.SimpleNamespace(
                    **vars(args), pair_kinds=("P33",), routings=1, shared_decode=cli.shared_decode
                )
                step, extra_inputs, detail = CudaMoeBench(bench_args, {}).extra_step(extra, m)
                run = functools.partial(run_moe, step, extra_inputs[0])
                _table(f"run_moe M={m} {extra} ({detail})", run, cli.top, plain=cli.plain)


def _dense(cli) -> None:
    k, n = 8192, 28672
    x_dtype = torch.bfloat16 if cli.x_dtype == "bf16" else torch.float16
    suh = torch.full((k,), 0.02, device="cuda", dtype=torch.float16)
    svh = torch.ones(n, device="cuda", dtype=torch.float16)
    for bits in cli.bits:
        shape = (k // 16, n // 16, 16 * bits)
        trellis = torch.randint(-(2**15), 2**15, shape, device="cuda").to(torch.int16)
        for m in cli.m:
            x = torch.randn(m, k, device="cuda").to(x_dtype)
            plan = plan_dense(m=m, k=k, n=n, bits=bits, codebook="mcg", x_dtype=x_dtype)
            bound = bind_dense(plan, **allocate_dense_buffers(plan, "cuda"))
            run = functools.partial(run_dense, bound, x, trellis, suh, svh)
            _table(f"dense linear M={m} K{bits} ({plan.path})", run, cli.top, plain=cli.plain)
    if cli.anchor and not cli.plain:  # the ratio denominator of dense_trellis.py, same profiler
        weight = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        for m in cli.m:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            mm = functools.partial(torch.mm, x, weight.t(), out=out)
            _table(f"cuBLAS bf16 anchor M={m} (x @ W[N, K]^T)", mm, cli.top)


def _stacks(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(set(names) - {"uniform", "tiers", "pair"})
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected uniform,tiers,pair, got {text!r}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int_list, default=(1, 8))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--only", choices=("dense", "moe"), default=None)
    parser.add_argument("--bits", type=int_list, default=(4,), help="dense K-bits list (MCG)")
    parser.add_argument("--plain", action="store_true", help="run without torch.profiler (ncu)")
    parser.add_argument(
        "--x-dtype", choices=("bf16", "fp16"), default="bf16", help="dense activations (bf16)"
    )
    parser.add_argument(
        "--anchor", action="store_true", help="dense: also table cuBLAS bf16 on a [N, K] weight"
    )
    parser.add_argument(
        "--stacks", type=_stacks, default=("uniform",), help="MoE stacks: uniform,tiers,pair"
    )
    parser.add_argument(
        "--shared-decode",
        choices=SHARED_PINS,
        default=None,
        help="pin the MoE grouped GEMMs' mainloop (default: the moe_mainloop table)",
    )
    cli = parser.parse_args()
    torch.manual_seed(0)
    if cli.only != "dense":  # the MoE weights are made only when the MoE step runs
        _moe(cli)
    if cli.only != "moe":
        _dense(cli)


if __name__ == "__main__":
    main()
