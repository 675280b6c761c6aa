"""The dense dispatch table (R2): both sides of every boundary, reachability, explain reasons.

Every expected path below is written from spec §5.5 (PR #136 gate) and R2's boundaries,
not read back from the table. The decode_matmul threshold (M >= 129) is the measured
crossover (docs/evidence/dense-decode-matmul-threshold.md): the generic GEMM's shared-decode
mainloop beats decode + cuBLAS for one 128-row M tile and loses from two. M = 128 stays fused, M =
129 decodes first; the K6 row (M <= 128) and decode_matmul no longer overlap.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from b12x.ops.dense import dispatch as D
from b12x.ops.dense import plan_dense
from oracle.judge import dispatch as O
from oracle.judge.tiles import SimulatedDevice

K6 = "k6_mcg_small_m"
BASE = {
    "capability": (12, 0),
    "m": 32,  # below the decode_matmul threshold: a failed K6 gate falls to generic
    "bits": 6,
    "codebook": "mcg",
    "pair_kind": None,
    "compute_dtype": "float16",
    "external_rotation": False,
    "explicit_tile": None,
}
RTX = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))


class OracleView:
    """``oracle.judge.dispatch`` wants its own ``Boundary`` objects; b12x declares the same
    fields."""

    def __init__(self, table=D.TABLE):
        self.name = table.name
        self.paths = table.paths
        self.boundaries = [O.Boundary(**dataclasses.asdict(b)) for b in table.boundaries]
        self.explain = table.explain


LEGAL = {"mcg": (3, 4, 6), "sqg_fp16": (5, 6)}  # explain rejects illegal (codebook, bits)
GRID = [
    {**BASE, "m": m, "bits": b, "codebook": cb, "compute_dtype": dt, "capability": cap}
    for m, b, cb, dt, cap in itertools.product(
        (1, 8, 9, 16, 17, 32, 48, 63, 64, 127, 128, 129, 1024, 1025, 4096),
        (3, 4, 5, 6),
        ("mcg", "sqg_fp16"),
        ("float16", "bfloat16"),
        ((12, 0), (12, 1), (9, 0), (8, 0)),
    )
    if b in LEGAL[cb]
]


def test_oracle_generic_checks_pass():
    outcomes = O.check_table(OracleView(), GRID)
    assert [o.failures for o in outcomes] == [(), (), (), ()]
    hits = outcomes[1].metrics["hits"]
    assert all(hits[name] > 0 for name in D.PATH_NAMES)


@pytest.mark.parametrize(
    ("field", "inside", "outside", "reason"),
    [
        ("m", 128, 129, "m=129 > 128"),
        ("bits", 6, 5, "bits=5 != 6"),
        ("codebook", "mcg", "sqg_fp16", "codebook='sqg_fp16' has no cooperative K6 kernel"),
        ("codebook", "mcg", "3inst", "codebook='3inst' has no cooperative K6 kernel"),
        ("compute_dtype", "float16", "bfloat16", "compute_dtype=bfloat16 != float16"),
        ("compute_dtype", torch.float16, torch.bfloat16, "compute_dtype=bfloat16 != float16"),
        ("external_rotation", False, True, "external H128"),
        ("capability", (12, 0), (12, 1), "capability=(12, 1)"),
        ("capability", (12, 0), (9, 0), "capability=(9, 0)"),
        ("capability", (12, 0), (8, 0), "capability=(8, 0)"),
        ("explicit_tile", None, (64, 256, 256), "explicit_tile=(64, 256, 256)"),
    ],
)
def test_k6_boundary_both_sides(field, inside, outside, reason):
    assert D.explain({**BASE, field: inside}).path == K6
    got = D.explain({**BASE, field: outside})
    fallback = "decode_matmul" if field == "m" else "generic"  # M = 129 >= 129; the rest M = 32
    assert got.path == fallback
    assert got.reasons[0].startswith(f"{K6}: ") and reason in got.reasons[0]
    assert got.reasons[-1] == f"{fallback}: selected"


def test_k6_reaches_m_1_and_m_from_129_takes_decode_matmul():
    assert D.explain({**BASE, "m": 1}).path == K6
    assert D.explain({**BASE, "m": 128}).path == K6
    assert D.explain({**BASE, "m": 129}).path == "decode_matmul"
    not_k6 = {**BASE, "bits": 4}
    assert D.explain({**not_k6, "m": 128}).path == "generic"
    below = D.explain({**not_k6, "m": 128}).reasons
    assert below[1] == "decode_matmul: m=128 < 129"
    assert D.explain({**not_k6, "m": 129}).path == "decode_matmul"
    assert D.explain({**not_k6, "m": 4096, "capability": (9, 0)}).path == "decode_matmul"
    pinned = D.explain({**BASE, "m": 4096, "explicit_tile": (64, 128, 128)})
    assert pinned.path == "generic"


@pytest.mark.parametrize("cap", [(12, 0), (12, 1), (9, 0), (8, 0)])
@pytest.mark.parametrize("m", [1, 16, 32, 48, 63, 64, 65, 128, 129, 256, 257, 1024, 4096])
def test_decode_matmul_threshold_is_the_measured_crossover(cap, m):
    """Off the K6 gate (K4), M >= 129 decodes first on every sm_80+ part but sm_90 (two
    shared-decode M tiles lose to decode + cuBLAS), where the swap-AB mainloop keeps the fused
    GEMM up to one 256-token tile (docs/evidence/dense-decode-matmul-threshold.md); below, the
    fused GEMM."""
    got = D.explain({**BASE, "capability": cap, "bits": 4, "m": m}).path
    threshold = 257 if cap == (9, 0) else 129
    assert got == ("decode_matmul" if m >= threshold else "generic")


def test_decode_matmul_min_m_is_the_one_threshold():
    import re
    from pathlib import Path

    assert D.DECODE_MATMUL_MIN_M == 129
    package = Path(D.__file__).resolve().parents[1]
    sources = {p: p.read_text() for p in package.rglob("*.py")}
    defines = [
        p.name for p, text in sources.items() if re.search(r"^DECODE_MATMUL_MIN_M\s*=", text, re.M)
    ]
    assert defines == ["dispatch.py"]
    # one front door: no second dense linear beside plan / bind / run (b12x.dense_linear is gone)
    assert not [p for p, text in sources.items() if "def trellis_linear" in text]
    sides = {(b.below, b.above) for b in D.BOUNDARIES if b.expect_above == "decode_matmul"}
    assert (128, 129) in sides


def test_fail_closed_for_paired_and_pre_sm80():
    with pytest.raises(ValueError, match="pair_kind='P24' is paired"):
        D.explain({**BASE, "pair_kind": "P24"})
    with pytest.raises(ValueError, match=r"capability=\(7, 5\) < \(8, 0\)"):
        D.explain({**BASE, "capability": (7, 5)})
    with pytest.raises(ValueError, match="unknown field"):
        D.explain({**BASE, "tile": 1})


def test_explain_does_not_mutate_the_case():
    case = {**BASE, "compute_dtype": torch.bfloat16}
    snapshot = dict(case)
    D.explain(case)
    assert case == snapshot


def test_removed_k6_row_is_caught_by_the_oracle(monkeypatch):
    monkeypatch.setattr(D, "ROWS", tuple(r for r in D.ROWS if r.name != K6))
    outcome = O.check_boundaries(OracleView())
    assert not outcome.passed
    assert any("k6_small_m_M" in f for f in outcome.failures)


def test_hijacking_row_is_caught_by_the_oracle(monkeypatch):
    monkeypatch.setattr(D, "ROWS", (D.GENERIC_ROW, *D.ROWS))
    assert not O.check_boundaries(OracleView()).passed


def _plan(device, **overrides):
    args = dict(m=32, k=2048, n=4096, bits=6, codebook="mcg", x_dtype=torch.float16)
    return plan_dense(device=device, **{**args, **overrides})


@pytest.mark.parametrize(
    ("device_cap", "overrides", "path"),
    [
        ((12, 0), {}, K6),
        ((12, 0), {"m": 128}, K6),
        ((12, 0), {"m": 64}, K6),
        ((12, 0), {"m": 129}, "decode_matmul"),
        ((12, 0), {"m": 64, "bits": 5}, "generic"),
        ((12, 0), {"m": 129, "bits": 5}, "decode_matmul"),
        ((12, 0), {"m": 64, "compute_dtype": torch.bfloat16}, "generic"),
        ((12, 0), {"m": 129, "compute_dtype": torch.bfloat16}, "decode_matmul"),
        ((12, 0), {"x_dtype": torch.bfloat16}, K6),  # bf16 x is fine: fp16 compute, input copy
        ((12, 0), {"compute_dtype": torch.bfloat16}, "generic"),
        ((12, 0), {"bits": 5}, "generic"),
        ((12, 0), {"codebook": "sqg_fp16"}, "generic"),
        ((12, 0), {"external_rotation": True}, "generic"),
        ((12, 0), {"tile": [64, 256, 256]}, "generic"),
        ((12, 1), {}, "generic"),
        ((9, 0), {}, "generic"),
        ((8, 0), {}, "generic"),
        ((9, 0), {"m": 64}, "generic"),
        ((9, 0), {"m": 128}, "generic"),
        ((9, 0), {"m": 256}, "generic"),  # the swap-AB mainloop's one token tile
        ((9, 0), {"m": 257}, "decode_matmul"),
        ((9, 0), {"m": 1025}, "decode_matmul"),
        ((9, 0), {"m": 129, "tile": [64, 256, 256]}, "generic"),
    ],
)
def test_public_plan_entry_follows_the_table(device_cap, overrides, path):
    device = SimulatedDevice("sim", 132, 227 * 1024, device_cap)
    plan = _plan(device, **overrides)
    assert plan.path == path
    assert plan.reasons[-1] == f"{path}: selected"


def test_every_path_is_reachable_from_plan_dense():
    seen = {
        _plan(RTX).path,
        _plan(RTX, bits=5).path,
        _plan(RTX, m=129).path,
    }
    assert seen == set(D.PATH_NAMES)


# --- the custom op (the one front door) launches the table's path -------------------------------


@pytest.mark.parametrize(
    ("cap", "m", "bits", "compute_dtype", "external", "path"),
    [
        ((9, 0), 128, 4, torch.float16, False, "generic"),
        ((9, 0), 256, 4, torch.float16, False, "generic"),
        ((9, 0), 257, 4, torch.float16, False, "decode_matmul"),
        ((9, 0), 257, 6, torch.bfloat16, True, "decode_matmul"),
        ((8, 0), 129, 4, torch.float16, False, "decode_matmul"),
        ((8, 0), 4096, 2, torch.float16, False, "decode_matmul"),
        ((12, 0), 64, 6, torch.float16, False, K6),  # K6 row first
        ((12, 0), 128, 6, torch.float16, False, K6),
        ((12, 0), 129, 6, torch.float16, False, "decode_matmul"),
        ((12, 0), 64, 6, torch.float16, True, "generic"),  # external H128: not K6
        ((12, 0), 129, 6, torch.float16, True, "decode_matmul"),
        ((12, 1), 64, 6, torch.float16, False, "generic"),
        ((12, 1), 129, 6, torch.float16, False, "decode_matmul"),
        ((12, 0), 16, 4, torch.float16, False, "generic"),
    ],
)
def test_plan_path_follows_the_table(cap, m, bits, compute_dtype, external, path):
    """What the old ``auto_path`` answered, now asked of the one front door (plan_dense)."""
    device = SimulatedDevice("sim", 132, 227 * 1024, cap)
    plan = _plan(device, m=m, bits=bits, compute_dtype=compute_dtype, external_rotation=external)
    assert plan.path == path


@pytest.mark.parametrize(("m", "launched"), [(256, "fused"), (257, "decode")])
def test_custom_op_launches_the_table_path(monkeypatch, m, launched):
    """The custom op's real implementation on CPU stand-ins: plan → bind → run picks the
    table's path (the device is replaced by a simulated H200; everything else is the op's)."""
    import b12x.ops.dense.custom_op as ops
    from b12x.ops.dense import plan as plan_mod

    k = n = 128
    seen = []
    h200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))

    def on_h200(**kw):
        assert kw.pop("device") == torch.device("cpu")
        return plan_dense(device=h200, **kw)

    def fused(step, *, a, payload, out, scratch, flags):
        seen.append("fused")
        out.zero_()

    def decode(spec, payload, out):
        seen.append("decode")
        out.zero_()

    def rotate(spec, x, s, out):
        out.copy_(x)

    host = plan_mod.launchers
    monkeypatch.setattr(ops, "plan_dense", on_h200)
    monkeypatch.setattr(host, "launch_rotation", rotate)
    monkeypatch.setattr(host, "launch_gemm", fused)
    monkeypatch.setattr(host, "launch_decode", decode)
    x = torch.zeros(m, k, dtype=torch.float16)
    trellis = torch.zeros(k // 16, n // 16, 64, dtype=torch.int16)
    ones = torch.ones(k, dtype=torch.float16)
    y = ops.trellis_dense_linear._init_fn(x, trellis, ones, ones, "mcg")
    assert seen == [launched] and y.shape == (m, n)


# --- the decode_matmul path at its threshold: planned scratch, capture-safe run (CPU) ------------


class _InPlaceKernels:
    """CPU stand-ins for the host launchers: in place into the caller's buffers, recording."""

    def __init__(self):
        self.calls = []

    def launch_rotation(self, spec, x, scale, out):
        self.calls.append("rotate_input" if spec.kind == "rotate_in" else "rotate_output")
        out.copy_(x)
        out.mul_(scale)

    def launch_decode(self, spec, payload, out):
        self.calls.append(("decode_weight", spec.codebook, out.data_ptr()))
        out.fill_(0.25)

    def launch_gemm(self, *args, **kwargs):
        raise AssertionError("the decode_matmul path launched the fused GEMM")


def _decode_inputs(m, k, n, bits, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(m, k, generator=g).to(torch.float16),
        "trellis": torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16),
        "suh": torch.randn(k, generator=g).sign().to(torch.float16),
        "svh": torch.randn(n, generator=g).sign().to(torch.float16),
    }


@pytest.mark.parametrize("compute_dtype", [torch.float16, torch.bfloat16])
def test_decode_matmul_at_m_257_is_planned_and_capture_safe(monkeypatch, compute_dtype):
    from b12x.ops.dense import plan as plan_mod
    from b12x.ops.dense.plan import DenseOp, allocate_dense_buffers
    from oracle.run.graph_protocol import ConsumerFixture, GraphProtocol, SimulatedBackend

    fake = _InPlaceKernels()
    for name in ("launch_rotation", "launch_decode", "launch_gemm"):
        monkeypatch.setattr(plan_mod.launchers, name, getattr(fake, name))
    backend = SimulatedBackend()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: backend.capturing)
    h200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))
    m, k, n, bits = 257, 256, 384, 4  # sm_90's decode_matmul threshold
    problem = dict(
        m=m, k=k, n=n, bits=bits, codebook="mcg", x_dtype=torch.float16, compute_dtype=compute_dtype
    )
    op = DenseOp(h200)
    plan = op.plan(problem)
    assert plan.path == "decode_matmul" and plan.split_k == 1
    shapes = {b.name: (b.shape, b.dtype) for b in plan.buffers}
    # The decoded Wq, K x N, in the compute dtype (the decode kernel writes bf16 itself).
    weight = "weight_compute" if compute_dtype == torch.bfloat16 else "weight_f16"
    assert shapes[weight] == ((k, n), compute_dtype)
    assert not {"weight_f16", "weight_compute"} - {weight} & set(shapes)
    assert "c_tmp" not in shapes
    buffers = allocate_dense_buffers(plan, "cpu")
    sets = [_decode_inputs(m, k, n, bits, seed) for seed in (1, 2)]
    fixture = ConsumerFixture(
        buffers,
        _decode_inputs(m, k, n, bits, 0),
        sets,
        outputs=("output",),
        scratch=tuple(name for name in buffers if name != "output"),
    )
    verdict = GraphProtocol(op, problem, fixture, backend).run()
    assert verdict.passed, verdict.reasons
    assert verdict.step("misuse.compile_in_capture").status == "pass"
    assert weight in verdict.metrics["buffers_read"]
    decoded = [c for c in fake.calls if isinstance(c, tuple)]
    assert decoded and all(c[1:] == ("mcg", buffers[weight].data_ptr()) for c in decoded)
