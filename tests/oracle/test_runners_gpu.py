"""GPU: curated grid cases through the oracle's runners, one per op, stack, path and dtype.

Each case runs exactly as in ``python -m oracle`` (the contract's plan / bind / run, the one
tolerance model); a failure saves the case and its message ends with the
``python -m oracle replay …`` command, so a failing test here prints how to replay it.
The full grid is the default job's business; these are the cases a kernel author wants to see
first when a change breaks something.
"""

from __future__ import annotations

import pytest

from oracle.grids import cases, parse_filter

pytestmark = pytest.mark.gpu

CURATED_FILTERS = (
    # dense linear: generic (M < 64) and decode + cuBLAS (M >= 64), both dtypes, two families
    "op=dense,rotation=full,codebook=mcg,bits=4,k=768,n=640,m=17|64",
    "op=dense,rotation=full,codebook=sqg_fp16,bits=6,dtype=bf16,k=768,n=640,m=9",
    # the K6/MCG small-M row (planned on a simulated SM120) and the raw GEMM
    "op=dense,rotation=full,codebook=mcg,bits=6,dtype=fp16,k=768,n=640,m=16|128",
    "op=dense,rotation=none,codebook=3inst,bits=2,k=768,n=640,m=1|129",
    # decode exactness: op, GEMM at M, the whole weight through the fused GEMM, grouped GEMM
    "op=decode,codebook=mcg|sqg_e4m3,bits=3,k=768,n=640,m=1",
    "op=decode,codebook=sqg_fp16,bits=5,dtype=bf16,k=768,n=640,m=1|64",
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


@pytest.mark.parametrize("case_id", _curated())
def test_case_passes_through_its_runner(case_id, tmp_path):
    import torch

    from oracle.grids import parse_case_id
    from oracle.runners import run_case

    results = run_case(parse_case_id(case_id), device=torch.device("cuda"), results_dir=tmp_path)
    assert results, "a runner returned no result"
    failed = [f"{r.name}: {r.reason}" for r in results if r.status != "pass"]
    assert not failed, "\n".join(failed)


def test_every_graph_target_passes():
    import torch

    from oracle.runners.graph import run_targets

    results = run_targets(torch.device("cuda"))
    bad = [f"{r.name}: {r.reason}" for r in results if r.status != "pass"]
    assert not bad, "\n".join(bad)
