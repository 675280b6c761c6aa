"""GPU: curated grid cases through the oracle's runners, one per op, stack, path and dtype.

Each case runs exactly as in ``python -m oracle`` (the contract's plan / bind / run, the one
tolerance model); a failure saves the case and its message ends with the
``python -m oracle replay …`` command, so a failing test here prints how to replay it.
The full grid is the default job's business; these are the cases a kernel author wants to see
first when a change breaks something.

The curated filters are checked on CPU too: each must pass the oracle's own selection rule
(:func:`oracle.cases.grids.select_cases` refuses a filter, or an alternative of one, ``m=17|64``,
that selects nothing); the union below would hide such a filter. The curated dense cases must
also reach every dense dispatch path and every sm_90 mainloop row a grid case can reach.
"""

from __future__ import annotations

import pytest

from oracle.cases.grids import cases, parse_filter, select_cases

CURATED_FILTERS = (
    # dense linear: the generic GEMM (M = 17, 64) and decode + cuBLAS (M = 1024: the row starts
    # at 257 on sm_90, at 129 elsewhere), both dtypes, two families
    "op=dense,rotation=full,codebook=mcg,bits=4,k=640,n=768,m=17|64|1024",
    "op=dense,rotation=full,codebook=sqg_fp16,bits=6,dtype=bf16,k=640,n=768,m=9",
    # the K6/MCG small-M row (planned on a simulated SM120) and the raw GEMM
    "op=dense,rotation=full,codebook=mcg,bits=6,dtype=fp16,k=640,n=768,m=16|128",
    "op=dense,rotation=none,codebook=3inst,bits=2,k=768,n=640,m=1|129",
    # decode exactness: op, GEMM at M, the whole weight through the fused GEMM, grouped GEMM
    "op=decode,codebook=mcg|sqg_e4m3,bits=3,k=768,n=640,m=1",
    "op=decode,codebook=sqg_fp16,bits=5,dtype=bf16,k=640,n=768,m=1|64",
    # MoE: uniform, tiers, pairs
    "op=moe,tier_layout=none,pair_kind=none,codebook=mcg,bits=4,k=256,n=256,experts=8,m=1|17",
    "op=moe,tier_layout=k3k4,k=256,n=256,experts=8,m=9|64",
    "op=moe,pair_kind=P24|P43,codebook=mcg,k=512,n=256,experts=8,m=2|16",
)


def _curated() -> list[str]:
    # One walk over the GPU grid keeps every case that any curated filter selects (the union
    # of one ``cases(tier="gpu", filter=text)`` per filter, in a third of the collection time).
    selected = [parse_filter(text) for text in CURATED_FILTERS]
    found = cases(tier="gpu", filter=lambda case: any(keep(case) for keep in selected))
    return sorted({c.case_id for c in found})


@pytest.mark.parametrize("text", CURATED_FILTERS)
def test_every_curated_filter_passes_the_oracle_selection(text):
    assert select_cases(filter=text, tier="gpu")


def test_curated_dense_cases_reach_every_dispatch_path_and_every_hopper_mainloop_row():
    """Planned as the dense runner plans them (natively, here a simulated H200, sm_90; then on
    its simulated SM120 part, which takes the K6/MCG row), the curated dense cases reach every
    path of the dense dispatch table and every mainloop row a grid case can reach on sm_90:
    all but ``pinned_tile`` (``python -m oracle run --tile``'s business) and ``n_not_128`` (no
    grid shape has N % 128 != 0, checked here)."""
    from b12x.ops.dense.dispatch import PATH_NAMES
    from b12x.ops.dense.mainloop import ROWS
    from b12x.ops.dense.plan import plan_dense
    from oracle.cases.grids import parse_case_id
    from oracle.judge.tiles import DEVICES
    from oracle.run.runners.dense import SIMULATED_PARTS, dense_problem

    (hopper,) = [d for d in DEVICES if tuple(d.capability) == (9, 0)]
    paths, rows = set(), set()
    for case in map(parse_case_id, _curated()):
        if case.variant.op != "dense":
            continue
        for part in (hopper, *SIMULATED_PARTS):
            plan = plan_dense(**dense_problem(case), device=part)
            paths.add(plan.path)
            if part is hopper:
                rows.add(plan.mainloop_reasons[-1].split(":")[0])  # "<row>: selected"
    assert paths == set(PATH_NAMES)
    assert all(c.n % 128 == 0 for c in cases(tier="gpu", filter="op=dense"))
    assert rows == {row.name for row in ROWS} - {"pinned_tile", "n_not_128"}


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", _curated())
def test_case_passes_through_its_runner(case_id, tmp_path):
    import torch

    from oracle.cases.grids import parse_case_id
    from oracle.run.runners import run_case

    results = run_case(parse_case_id(case_id), device=torch.device("cuda"), results_dir=tmp_path)
    assert results, "a runner returned no result"
    failed = [f"{r.name}: {r.reason}" for r in results if r.status != "pass"]
    assert not failed, "\n".join(failed)


@pytest.mark.gpu
def test_every_graph_target_passes():
    import torch

    from oracle.run.runners.graph import run_targets

    results = run_targets(torch.device("cuda"))
    bad = [f"{r.name}: {r.reason}" for r in results if r.status != "pass"]
    assert not bad, "\n".join(bad)
