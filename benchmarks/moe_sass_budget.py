"""CPU-side launch budget of a MoE step's grouped GEMMs: SASS per decoded weight and parallelism.

What it measures
----------------
The GLM-like step (hidden 5120, intermediate 1536, 128 experts, top-8, MCG, the options of
``moe_trellis.py``) is planned on the CPU for each stack of ``--stacks`` at each M of ``--m``:
``uniform`` (K4), ``tiers`` (K3/K4 over 64 + 64 experts) and ``pair`` (P33 on FC1 and FC2, base
K3). For every grouped-GEMM launch of the plan (FC1 and FC2; a tiered phase is one launch per
tier) it prints

* the **steady loop** of the compiled kernel (``sass_budget.py``'s rule: the backward branch
  holding the most MMAs) as instructions per decoded weight per thread, total and by issue pipe;
* the **launch geometry**: threads per CTA, the live CTAs at most (live route blocks x N-tiles:
  one block per routed expert at small M; a tier's launch its share of them, the experts split
  evenly between the tiers) and the K16 rows one warp streams (its K slice). A shared-decode
  launch (large M) prints its geometry with ``shared`` in place of a per-weight count.

A launch whose weights stream slowly with a per-weight cost like another's is short of memory
parallelism (too few warps, each over a long K range) rather than of issue slots; the table makes
that visible without a GPU. Planning uses the simulated ``h200`` part (an H100's limits too), so
the rows are the ones a Hopper device plans; the kernels compile for ``--arch`` (default sm_90).
It is a diagnostic, not a timing: the GPU decides (``moe_trellis.py``, ``moe_geometry_sweep.py``).

Usage: ``python benchmarks/moe_sass_budget.py [--stacks uniform,tiers,pair] [--m 1,8,64]
[--arch sm_90] [--json out.json]`` (needs ``nvdisasm``: ``pip install nvidia-cuda-nvdisasm``)
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys

from bench_cli import int_list
from sass_budget import CLASSES, compile_cubin, disassemble, find_nvdisasm, parse_sass, pipe_class
from sass_budget import steady_loop as find_steady_loop

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 5120, 1536, 128, 8
STACKS = {
    "uniform": dict(bits=4, num_experts=EXPERTS),
    "tiers": dict(
        bits=(3, 4), num_experts=(EXPERTS // 2, EXPERTS // 2), num_global_experts=EXPERTS
    ),
    "pair": dict(bits=3, num_experts=EXPERTS, fc1_pair="P33", fc2_pair="P33"),
}


def plan_step(stack: str, m: int):
    """The MoE plan of ``stack`` at ``m`` tokens for a simulated Hopper part (CPU only)."""
    import torch

    from b12x.ops.moe.plan import plan_moe
    from oracle.cli.explain import simulated_device

    part = simulated_device(name="h200")
    return plan_moe(
        m=m, top_k=TOP_K, hidden=HIDDEN, intermediate=INTERMEDIATE, codebook="mcg",
        w13_layout="packed", x_dtype=torch.bfloat16, compute_dtype=torch.float16, device=part,
        **STACKS[stack],
    )  # fmt: skip


def launch_row(
    spec, *, phase: str, m: int, k: int, n: int, tiers: int, nvdisasm: str, arch: str
) -> dict:
    """One launch: its steady loop per decoded weight and its parallelism (module docstring)."""
    comp = compile_cubin(spec, arch)
    instrs, labels = parse_sass(disassemble(comp.cubin, nvdisasm))
    body = find_steady_loop(instrs, labels)
    classes = collections.Counter(pipe_class(i.opcode) for i in body)
    # per-warp mainloop: two HMMA per M16 block and N16 tile, eight weights per thread; the
    # shared decode's loop is not counted per weight here (its MMAs cover the CTA)
    weights = None if spec.m_warps else 8 * classes["mma"] // (2 * spec.m_tiles)
    ctas = -(-live_blocks(spec, m) // tiers) * (n // spec.n_group)
    return {
        "phase": phase, "bits": spec.bits, "pair": spec.pair, "k_split": spec.k_split,
        "threads": spec.cta_threads, "live_ctas_max": ctas,
        "k16_rows_per_warp": k // 16 // (1 if spec.m_warps else spec.k_split),
        "registers": comp.registers, "spill_bytes": comp.spill_bytes,
        "loop_instructions": len(body), "weights_per_iteration": weights,
        "per_weight": None if weights is None else len(body) / weights,
        "class_per_weight": {c: classes.get(c, 0) / weights for c in CLASSES} if weights else {},
    }  # fmt: skip


def live_blocks(spec, m: int) -> int:
    """Live route blocks of a launch at most: one per routed expert while routes <= experts,
    else every expert's routes (even routing) in blocks of ``spec.block_size``."""
    routes = m * TOP_K
    if routes <= EXPERTS:
        return routes
    return EXPERTS * -(-routes // EXPERTS // spec.block_size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=lambda t: t.split(","), default=list(STACKS))
    parser.add_argument("--m", type=int_list, default=(1, 8, 64))
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.stacks) - set(STACKS))
    if unknown:
        parser.error(f"--stacks: unknown {unknown}; known: {sorted(STACKS)}")
    tool = find_nvdisasm()
    if tool is None:
        print("nvdisasm not found: pip install nvidia-cuda-nvdisasm", file=sys.stderr)
        return 2
    head = "  ".join(f"{c:>5s}" for c in CLASSES[:6])
    print(f"stack    M    phase bits k_split threads CTAs<=  rows/warp  instr/w  {head}")
    rows = []
    for stack in args.stacks:
        for m in args.m:
            plan = plan_step(stack, m)
            for phase, specs, (k, n) in (
                ("fc1", plan.fc1_spec, (HIDDEN, 2 * INTERMEDIATE)),
                ("fc2", plan.fc2_spec, (INTERMEDIATE, HIDDEN)),
            ):
                for spec in specs:
                    row = launch_row(spec, phase=phase, m=m, k=k, n=n, tiers=len(specs),
                                     nvdisasm=tool, arch=args.arch)  # fmt: skip
                    rows.append({"stack": stack, "m": m, **row})
                    per = "  ".join(f"{v:5.2f}" for v in list(row["class_per_weight"].values())[:6])
                    total = "shared" if row["per_weight"] is None else f"{row['per_weight']:.2f}"
                    print(
                        f"{stack:8s} {m:<4d} {phase:5s} {spec.bits:4d} {spec.k_split:7d} "
                        f"{row['threads']:7d} {row['live_ctas_max']:6d} "
                        f"{row['k16_rows_per_warp']:10d} {total:>8s}  {per}",
                        flush=True,
                    )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
