"""Tests added because the mutation gate found a survivor (each names the mutant it kills).

* ``seed-shifted-positional-call`` / ``shared-body-relies-on-default`` (R1): the call rules of the
  contract checker over the real b12x, without the signature-lock comparison (the lock has its
  own test, and lock churn while a signature is being changed on purpose must not blind the gate
  to a stale call site).
* ``codebook-default-flipped`` (R11): the CPU stand-in kernels of the plan/bind/run tests ignore
  the codebook, so a launch that silently fell back to a default codebook passed. Here every launch
  of :func:`b12x.ops.dense.run_dense` is spied on and must receive the planned codebook, on every
  path.
* ``moe-route-block-size-static`` (R12/R15): no test pinned the MoE ``m_tiles``, so a planner
  whose route block ignored the pin (packing in the automatic block size while the launches
  compile the pinned one) survived. Here every plan, pinned or automatic, uniform or tiered,
  must pack routes in the block size of every kernel it launches, with buffers to match.
* ``bf16-as-fp16-custom-op-static`` (R14): the dense custom op's CUDA implementation is spied on
  (its ``plan_dense`` call) on CPU: the requested compute dtype must reach the plan.
* ``barrier-removed-static`` (R13): a warp's shared-memory hand-off (lanes store, other lanes
  load) needs a barrier between the stores and the loads; on one GPU the race rarely shows, so
  the decode kernel's PTX is checked instead: no ``ld.shared`` may follow an ``st.shared``
  without a ``bar.warp.sync`` / ``bar.sync`` / ``barrier.sync`` in between.
"""

from __future__ import annotations

import re

import pytest
import torch

from b12x.ops.dense import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.dense import plan as plan_mod
from oracle.contracts import check_package, default_root
from oracle.contracts.check import DEFAULT_SLOTS_PATH
from oracle.judge.tiles import SimulatedDevice

RTX = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))
H200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))


class CodebookSpy:
    """Stand-ins for the launches that decode weights; each records the codebook it was given."""

    def __init__(self):
        self.seen = []

    def launch_gemm(self, step, *, out, **buffers):
        self.seen.append(("gemm", step.spec.codebook))
        out.zero_()

    def launch_decode(self, spec, payload, out):
        self.seen.append(("decode_weight", spec.codebook))
        out.zero_()

    @staticmethod
    def rotate(spec, y, s, out):
        out.copy_(y)


@pytest.fixture
def spy(monkeypatch):
    fake = CodebookSpy()
    host = plan_mod.launchers
    monkeypatch.setattr(host, "launch_gemm", fake.launch_gemm)
    monkeypatch.setattr(host, "launch_decode", fake.launch_decode)
    monkeypatch.setattr(host, "launch_rotation", fake.rotate)
    return fake


def _unwrap(value):
    return value[0] if isinstance(value, tuple | list) else value


@pytest.mark.parametrize(
    ("device", "m", "codebook", "bits", "path"),
    [
        (H200, 8, "mcg", 4, "generic"),
        (H200, 8, "3inst", 3, "generic"),
        (H200, 8, "sqg_fp16", 6, "generic"),
        (RTX, 8, "mcg", 6, "k6_mcg_small_m"),
        (H200, 1040, "mul1", 4, "decode_matmul"),
    ],
)
def test_run_dense_forwards_the_planned_codebook(spy, device, m, codebook, bits, path):
    k = n = 256
    plan = plan_dense(
        m=m, k=k, n=n, bits=bits, codebook=codebook, x_dtype=torch.float16, device=device
    )
    assert plan.path == path
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cpu"))
    x = torch.zeros(m, k, dtype=torch.float16)
    trellis = torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16)
    ones_k, ones_n = torch.ones(k, dtype=torch.float16), torch.ones(n, dtype=torch.float16)
    run_dense(bound, x, trellis, ones_k, ones_n)
    assert spy.seen, "no decoding launch was made"
    assert [(name, _unwrap(cb)) for name, cb in spy.seen] == [
        (name, codebook) for name, _ in spy.seen
    ]


def test_b12x_call_sites_bind_to_their_callees():
    report = check_package(default_root(), slots_path=DEFAULT_SLOTS_PATH)
    assert report.counts["resolved_calls"] > 0
    assert report.violations == [], "\n".join(v.format() for v in report.violations)


# ------------------------------------------------------------------ MoE plan vs launch geometry


@pytest.mark.parametrize("m_tiles", [None, 1, 2, 4])
@pytest.mark.parametrize("tiered", [False, True])
def test_moe_plan_packs_routes_in_the_block_size_it_launches(m_tiles, tiered):
    from b12x.ops.moe.plan import plan_moe

    bits, experts = ((3, 4), (3, 5)) if tiered else (3, 8)
    plan = plan_moe(
        m=16, top_k=2, hidden=256, intermediate=128, codebook="mcg", bits=bits,
        num_experts=experts, w13_layout="packed", x_dtype=torch.float16,
        num_global_experts=10 if tiered else None, m_tiles=m_tiles,
    )  # fmt: skip
    routes = plan.routes
    assert {s.block_size for s in plan.kernel_specs} == {routes.block_size}
    if m_tiles is not None:
        assert routes.block_size == 16 * m_tiles
    assert routes.capacity % routes.block_size == 0
    shapes = {b.name: b.shape for b in plan.buffers}
    assert shapes["block_expert_ids"] == (routes.num_blocks,)
    assert shapes["packed_route_slots"] == (routes.capacity + routes.routes,)


# ------------------------------------------------------------------ dense custom op compute dtype


class _Planned(Exception):
    pass


@pytest.mark.parametrize("compute_dtype", [None, torch.float16, torch.bfloat16])
def test_dense_op_plans_the_requested_compute_dtype(monkeypatch, compute_dtype):
    import b12x.ops.dense.custom_op as ops

    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        raise _Planned

    impl = getattr(ops.trellis_dense_linear, "_init_fn", None)
    assert callable(impl), "torch.library.custom_op no longer exposes the implementation"
    monkeypatch.setattr(ops, "plan_dense", spy)
    k = n = 256
    args = (
        torch.zeros(4, k, dtype=torch.float16),
        torch.zeros(k // 16, n // 16, 16 * 4, dtype=torch.int16),
        torch.ones(k, dtype=torch.float16),
        torch.ones(n, dtype=torch.float16),
        "mcg",
    )
    with pytest.raises(_Planned):
        impl(*args, None, None, 0, compute_dtype)
    assert seen["compute_dtype"] == (compute_dtype or torch.float16)
    assert seen["codebook"] == "mcg"


# ------------------------------------------------------------------ shared-memory hand-off barrier

_ST_SHARED = re.compile(r"\bst\.shared\b")
_LD_SHARED = re.compile(r"\bld\.shared\b")
_BARRIER = re.compile(r"\b(bar\.warp\.sync|bar\.sync|barrier\.sync|bar\.red)\b")


def unguarded_shared_loads(ptx: str) -> list[int]:
    """PTX line numbers of ``ld.shared`` reached (in text order) after an ``st.shared`` with no
    barrier in between. Text order over-approximates control flow, which only makes it stricter
    for the straight-line hand-offs the kernels use."""
    bad, dirty = [], False
    for number, line in enumerate(ptx.splitlines(), 1):
        code = line.split("//")[0]
        if line.lstrip().startswith(".entry") or line.lstrip().startswith(".visible .entry"):
            dirty = False
        if _BARRIER.search(code):
            dirty = False
        if _LD_SHARED.search(code) and dirty:
            bad.append(number)
        if _ST_SHARED.search(code):
            dirty = True
    return bad


def test_the_barrier_check_flags_a_missing_barrier():
    ok = "st.shared.u16 [%r1], t;\nbar.warp.sync -1;\nld.shared.v4.u32 {%r2}, [%r3];\n"
    assert unguarded_shared_loads(ok) == []
    assert unguarded_shared_loads(ok.replace("bar.warp.sync -1;", "add.s32 %r4, 1;")) == [3]


@pytest.mark.parametrize("codebook, bits", [("mcg", 4), ("sqg_e4m3", 3)])
def test_shared_memory_handoffs_have_a_barrier(codebook, bits):
    from b12x import support
    from b12x.launch.specs import KernelSpec

    ptx = support.compile_specialization(KernelSpec("decode", codebook, bits), "sm_90").ptx
    assert _ST_SHARED.search(ptx) and _LD_SHARED.search(ptx), "the kernel no longer stages in smem"
    assert unguarded_shared_loads(ptx) == []
