"""How many distinct dense kernel specialisations the oracle's default GPU job plans (CPU only).

The default job's grid (:func:`oracle.run.grid.select_grid`, the stratified 1200 cases) is planned
for a simulated Hopper part (``h200`` of :data:`oracle.judge.tiles.DEVICES`, the planning limits of
an H100 too) and, as the dense runner does, for each simulated part whose dispatch takes another
path. Every ``plan.kernel_specs`` entry of a dense case is counted: distinct specialisations vs
uses. The MoE and decode cases are listed but not planned here (their runners plan on the real
device). A job that compiles close to one kernel per distinct specialisation shares compiles
well; a count near the number of uses would mean the cases share none.

    CUTE_DSL_ARCH=sm_90 python scripts/job_specialisations.py
"""

from __future__ import annotations

import collections
import sys


def main() -> int:
    from oracle.cases import declared
    from oracle.cli.explain import simulated_device
    from oracle.run.grid import select_grid
    from oracle.run.runners import dense as dense_runner

    part = simulated_device(name="h200")
    cases, _ = select_grid()
    ops = collections.Counter(c.variant.op for c in cases)
    contract = declared.op_contract("dense")
    uses: collections.Counter[str] = collections.Counter()
    kind_of: dict[str, str] = {}
    planned = 0
    for case in cases:
        v = case.variant
        if v.op != "dense" or v.pair_kind is not None or v.tier_layout is not None:
            continue
        callback = dense_runner.identity_h128 if v.rotation == "none" else None
        problem = dense_runner.dense_problem(case)
        native = contract.graph_op(device=part, hadamard_128=callback).plan(problem)
        plans = [native]
        for other in dense_runner.SIMULATED_PARTS:
            plan = contract.graph_op(device=other, hadamard_128=callback).plan(problem)
            if plan.path != native.path:
                plans.append(plan)
        planned += 1
        for plan in plans:
            for spec in plan.kernel_specs:
                uses[repr(spec)] += 1
                kind_of[repr(spec)] = spec.kind
    print(f"default job: {len(cases)} cases {dict(ops)}")
    print(f"dense cases planned on {part.name}: {planned}; kernel specs used {sum(uses.values())} "
          f"times, {len(uses)} distinct")  # fmt: skip
    kinds = collections.Counter(kind_of.values())
    print("distinct by kind:", dict(kinds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
