"""plan / bind / run of the dense trellis linear: buffer contracts (R4), capture errors, no
allocation in run, and the CUDA-graph protocol on CPU and (marked) on the GPU.

Buffer tables are written by hand from spec §3.3 (generic) and §5.5 (K6/MCG small-M). On CPU the
kernels of ``b12x.launch.host`` are replaced by in-place stand-ins that record their arguments
(the ``fake_kernels`` fixture of ``tests/b12x/conftest.py``), so the orchestration (which buffer
each launch reads and writes) is checked without a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from b12x.kernels.geometry import GemmGeometry
from b12x.launch.specs import KernelSpec
from b12x.ops.dense import allocate_dense_buffers, bind_dense, plan_dense, run_dense
from b12x.ops.dense import plan as plan_mod
from b12x.ops.dense.plan import DenseOp
from b12x.runtime import compile_cache as cc
from b12x.runtime.scratch import BufferNotProvided
from oracle.judge.tiles import SimulatedDevice
from oracle.pytest_plugin import scaled_examples
from oracle.run.graph_protocol import (
    ConsumerFixture,
    GraphProtocol,
    SimulatedBackend,
    capture_graph,
)

F16, BF16, F32, I32 = torch.float16, torch.bfloat16, torch.float32, torch.int32
RTX = SimulatedDevice("rtx_pro_6000", 188, 227 * 1024, (12, 0))
H200 = SimulatedDevice("h200", 132, 227 * 1024, (9, 0))
SMALL_SM120 = SimulatedDevice("sm120_16sm", 16, 101_376, (12, 0))
GENERIC_SCRATCH = {"gemm_output", "c_tmp", "rotated_compute", "gemm_output_f16"}


@pytest.fixture(autouse=True)
def _restore_freeze():
    yield
    cc.unfreeze()


def _plan(device=RTX, **overrides):
    args = dict(m=64, k=2048, n=4096, bits=6, codebook="mcg", x_dtype=F16)
    return plan_dense(device=device, **{**args, **overrides})


def _table(plan):
    return {b.name: (b.shape, b.dtype) for b in plan.buffers}


# ------------------------------------------------------------------ buffer contracts per path

CASES = {
    "k6_fp16": (
        dict(),
        {"output": ((64, 4096), F16), "rotated_f16": ((64, 2048), F16), "workspace": ((754,), I32)},
    ),
    "k6_bf16_x": (
        dict(x_dtype=BF16),
        {
            "output": ((64, 4096), BF16),
            "rotated_f16": ((64, 2048), F16),
            "output_f16": ((64, 4096), F16),
            "workspace": ((754,), I32),  # max(4*188 + 2, 4096/16)
        },
    ),
    "k6_workspace_n16_floor": (
        dict(device=SMALL_SM120, n=8192),
        {"output": ((64, 8192), F16), "rotated_f16": ((64, 2048), F16), "workspace": ((512,), I32)},
    ),
    "generic_split4": (  # generic needs M < 129 (decode_matmul from 129) and no K6 (bits 5)
        dict(m=63, bits=5, split_k=4),
        {
            "output": ((63, 4096), F16),
            "rotated_f16": ((63, 2048), F16),
            "gemm_output": ((63, 4096), F16),
            "c_tmp": ((4, 63, 4096), F32),
        },
    ),
    "generic_no_split": (
        dict(m=63, bits=5, split_k=1),
        {
            "output": ((63, 4096), F16),
            "rotated_f16": ((63, 2048), F16),
            "gemm_output": ((63, 4096), F16),
        },
    ),
    "generic_bf16_everything": (
        dict(m=63, x_dtype=BF16, compute_dtype=BF16, split_k=2),
        {
            "output": ((63, 4096), BF16),
            "output_f16": ((63, 4096), F16),
            "gemm_output": ((63, 4096), BF16),
            "c_tmp": ((2, 63, 4096), F32),
            "rotated_compute": ((63, 2048), BF16),
        },
    ),
    "decode_matmul": (
        dict(m=2048, bits=4),
        {
            "output": ((2048, 4096), F16),
            "rotated_f16": ((2048, 2048), F16),
            "gemm_output": ((2048, 4096), F16),
            "weight_f16": ((2048, 4096), F16),
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_buffer_specs_per_path(case):
    overrides, expected = CASES[case]
    assert _table(_plan(**overrides)) == expected


@pytest.mark.parametrize("x_dtype", [F16, BF16])
@pytest.mark.parametrize("m", [1, 17, 128])
def test_k6_path_needs_no_generic_scratch(x_dtype, m):
    plan = _plan(m=m, x_dtype=x_dtype)
    assert plan.path == "k6_mcg_small_m"
    assert not set(plan.buffer_names) & GENERIC_SCRATCH
    assert plan.buffer("workspace").zeroed


def test_split_k_matches_the_launcher_arithmetic():
    # K16 rows = 128: a request of 3 gives ceil(128/3) = 43 rows per split -> 3 launched slices;
    # a request of 5 gives 26 rows -> ceil(128/26) = 5; a request of 100 gives 2 rows -> 64.
    for requested, launched in ((3, 3), (5, 5), (100, 64)):
        plan = _plan(device=H200, m=63, split_k=requested)
        assert plan.split_k == launched
        assert plan.buffer("c_tmp").shape == (launched, 63, 4096)


def test_split_k_is_rejected_off_the_generic_path():
    with pytest.raises(ValueError, match="split_k: only the generic path"):
        _plan(split_k=2)


def test_plan_rejects_bad_arguments_naming_them():
    with pytest.raises(ValueError, match="bits"):
        _plan(codebook="sqg_e4m3", bits=6)
    with pytest.raises(ValueError, match="codebook"):
        _plan(codebook="nope")
    with pytest.raises(TypeError, match="x_dtype"):
        _plan(x_dtype=F32)
    with pytest.raises(ValueError, match="k/n"):
        _plan(k=2000)
    with pytest.raises(ValueError, match="m"):
        _plan(m=0)
    with pytest.raises(ValueError, match="tile"):
        _plan(m=129, tile=[32, 512, 256])  # the FC2-only tile pinned on the dense linear


def test_plan_refuses_a_payload_row_past_the_32_bit_stride():
    """The GEMM steps between payload K16 rows with a 32-bit stride (2·N·bits bytes, widened at
    the multiply by the row index): the plan refuses N that would wrap it, at the boundary."""
    from b12x.runtime.validate import check_row_stride

    n_max = (2**31 - 1) // 8 // 128 * 128  # the largest N in 128s at K4 whose row fits
    assert check_row_stride("n", n_max, 4) <= 2**31 - 1
    with pytest.raises(ValueError, match=r"n: .* payload K16 row, past the kernels' 32-bit"):
        _plan(n=n_max + 128, codebook="mcg", bits=4)
    with pytest.raises(ValueError, match="n: 268435456 columns at 6 bits"):
        _plan(n=2**28, codebook="mcg", bits=6)


def test_pinned_tile_sets_the_kernel_geometry():
    plan = _plan(device=H200, m=129, tile=[64, 128, 128])
    g = plan.geometry
    assert (plan.tile.tile_k, plan.tile.tile_n, g.warps, g.n_tiles) == (64, 128, 4, 2)
    gemm = [s for s in plan.kernel_specs if s.kind == "gemm"]
    geometry = GemmGeometry(m_tiles=4, n_tiles=2, warps=4)
    assert gemm == [
        KernelSpec("gemm", "mcg", 6, geometry=geometry, write_partials=plan.split_k > 1)
    ]


@settings(deadline=None, max_examples=scaled_examples(40))
@given(
    m=st.sampled_from([1, 16, 63, 64, 127, 128, 129, 1024, 1025]),
    kn=st.sampled_from([(256, 256), (2048, 4096), (512, 6144)]),
    bits_codebook=st.sampled_from([(6, "mcg"), (4, "mcg"), (6, "sqg_fp16"), (3, "sqg_e4m3")]),
    x_dtype=st.sampled_from([F16, BF16]),
    compute_dtype=st.sampled_from([F16, BF16]),
    external=st.booleans(),
    device=st.sampled_from([RTX, H200, SMALL_SM120, SimulatedDevice("gb10", 48, 101_376, (12, 1))]),
)
def test_buffer_contract_rules_hold_on_every_plan(
    m, kn, bits_codebook, x_dtype, compute_dtype, external, device
):
    """Spec §3.3/§5.5 restated as rules, checked on whatever path the plan takes."""
    (k, n), (bits, codebook) = kn, bits_codebook
    plan = plan_dense(
        m=m,
        k=k,
        n=n,
        bits=bits,
        codebook=codebook,
        x_dtype=x_dtype,
        compute_dtype=compute_dtype,
        external_rotation=external,
        device=device,
    )
    names = set(plan.buffer_names)
    k6 = (
        device.capability == (12, 0)
        and m <= 128
        and bits == 6
        and codebook == "mcg"
        and compute_dtype == F16
        and not external
    )
    assert (plan.path == "k6_mcg_small_m") == k6
    assert ("input_f16" in names) == (x_dtype == BF16 and external)  # the callback's fp16 x
    assert ("output_f16" in names) == (x_dtype == BF16)
    assert ("rotated_f16" in names) == (compute_dtype == F16 or external)
    assert plan.buffer("output").dtype == x_dtype
    assert ("workspace" in names) == k6
    if k6:
        assert not names & GENERIC_SCRATCH
    else:
        assert plan.buffer("gemm_output").dtype == compute_dtype
        assert ("rotated_compute" in names) == (compute_dtype == BF16)
        assert ("gemm_output_f16" in names) == (compute_dtype == BF16 and external)
        assert ("c_tmp" in names) == (plan.path == "generic" and plan.split_k > 1)
        decoded = {"weight_f16", "weight_compute"} & names
        # sm_90: swap-AB up to 256, for every decoder but D3L (it spills in the tensor-core loops)
        threshold = 257 if device.capability == (9, 0) and codebook != "sqg_fp16" else 129
        assert bool(decoded) == (plan.path == "decode_matmul") == (m >= threshold)
        assert decoded <= {"weight_compute" if compute_dtype == BF16 else "weight_f16"}


# ------------------------------------------------------------------ bind


def test_bind_keeps_caller_buffers_by_identity():
    plan = _plan(m=63, x_dtype=BF16, compute_dtype=BF16, split_k=2)
    buffers = allocate_dense_buffers(plan, "cpu")
    bound = bind_dense(plan, **buffers)
    for name, tensor in buffers.items():
        assert bound.buffers[name] is tensor
        assert bound.buffers[name].data_ptr() == tensor.data_ptr()
    assert int(allocate_dense_buffers(_plan(), "cpu")["workspace"].abs().sum()) == 0


def _generic_buffers(plan, **replace):
    buffers = allocate_dense_buffers(plan, "cpu")
    buffers.update(replace)
    return buffers


def test_generic_path_rejects_the_one_element_placeholder_naming_it():
    plan = _plan(m=63, bits=5, split_k=4)
    placeholder = torch.empty(1, dtype=F32)
    with pytest.raises(BufferNotProvided, match=r"scratch `c_tmp`: expected shape \(4, 63, 4096\)"):
        bind_dense(plan, **_generic_buffers(plan, c_tmp=placeholder))


def test_generic_placeholder_under_capture_says_not_initialized(monkeypatch):
    plan = _plan(m=63, bits=5, split_k=4)
    buffers = _generic_buffers(plan, c_tmp=torch.empty(1, dtype=F32))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(
        BufferNotProvided, match="scratch `c_tmp` is not initialized for CUDA graph capture"
    ):
        bind_dense(plan, **buffers)
    del buffers["gemm_output"]
    with pytest.raises(
        BufferNotProvided, match="scratch `gemm_output` is not initialized for CUDA graph capture"
    ):
        bind_dense(plan, **buffers)


def test_k6_binds_under_capture_with_consumer_placeholders(monkeypatch):
    plan = _plan()
    buffers = allocate_dense_buffers(plan, "cpu")
    consumer = {**buffers, "c_tmp": torch.empty(1, dtype=F32), "gemm_output": torch.empty(1)}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    bound = bind_dense(plan, **consumer)
    assert set(bound.buffers) == {"output", "rotated_f16", "workspace"}


def test_allocation_is_refused_during_capture(monkeypatch):
    plan = _plan()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="during CUDA graph capture"):
        allocate_dense_buffers(plan, "cpu")


def _misaligned(shape, dtype):
    numel = 1
    for s in shape:
        numel *= s
    return torch.empty(numel + 8, dtype=dtype)[1 : 1 + numel].view(shape)


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("rotated_f16", lambda: torch.empty(64, 2048, dtype=BF16), "expected dtype torch.float16"),
        ("rotated_f16", lambda: torch.empty(2048, 64, dtype=F16).t(), "must be contiguous"),
        ("rotated_f16", lambda: _misaligned((64, 2048), F16), "16-byte aligned"),
        ("workspace", lambda: torch.empty(753, dtype=I32), r"expected shape \(754,\)"),
        ("output", lambda: torch.empty(64, 4096, dtype=F16, device="meta"), "device"),
    ],
)
def test_bind_validates_each_buffer(name, make, message):
    plan = _plan()
    buffers = {**allocate_dense_buffers(plan, "cpu"), name: make()}
    with pytest.raises(BufferNotProvided, match=message) as info:
        bind_dense(plan, **buffers)
    assert f"`{name}`" in str(info.value) or name == "output"


def test_bind_rejects_unknown_names():
    plan = _plan()
    with pytest.raises(ValueError, match=r"unknown buffer name\(s\) \['ctmp'\]"):
        bind_dense(plan, **allocate_dense_buffers(plan, "cpu"), ctmp=torch.empty(1))


# ------------------------------------------------------------------ run (CPU stand-in kernels)


SMALL = dict(m=8, k=256, n=256, bits=6, codebook="mcg")


def _inputs(m=8, k=256, n=256, bits=6, x_dtype=F16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(m, k, generator=g).to(x_dtype),
        "trellis": torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16),
        "suh": torch.randn(k, generator=g).sign().to(F16),
        "svh": torch.randn(n, generator=g).sign().to(F16),
    }


def _run(bound, inputs, **kw):
    return run_dense(bound, inputs["x"], inputs["trellis"], inputs["suh"], inputs["svh"], **kw)


def test_k6_run_launches_into_caller_buffers(fake_kernels):
    plan = plan_dense(device=RTX, x_dtype=BF16, **SMALL)
    buffers = allocate_dense_buffers(plan, "cpu")
    bound = bind_dense(plan, **buffers)
    inputs = _inputs(x_dtype=BF16)
    out = _run(bound, inputs)
    ptr = {name: t.data_ptr() for name, t in buffers.items()}
    kinds = [c[0] for c in fake_kernels.calls]
    assert kinds == ["rotate_input", "gemm", "rotate_output"]
    rot_in, gemm, rot_out = fake_kernels.calls
    # The input rotation reads the caller's bf16 x (it rounds to fp16 itself) ...
    assert rot_in[1] is inputs["x"] and rot_in[2].data_ptr() == ptr["rotated_f16"]
    assert (gemm[1].data_ptr(), gemm[2].data_ptr()) == (ptr["rotated_f16"], ptr["output_f16"])
    assert gemm[3] is None and gemm[4].splits == 1  # no split-K scratch on the K6 path
    assert gemm[4] is plan.launches.gemm  # the plan's step, launched as built
    # ... and, without a bias, the output rotation writes the bf16 output itself (no copy).
    assert rot_out[1].data_ptr() == ptr["output_f16"] and rot_out[2].data_ptr() == ptr["output"]
    assert out.data_ptr() == ptr["output"]
    # stand-in math: y = fp16(x)*suh (first 256 cols) * svh, then cast to bf16
    expect = (inputs["x"].to(F16) * inputs["suh"] * inputs["svh"]).to(BF16)
    assert torch.equal(out, expect)


def test_bias_is_added_to_the_fp16_output_before_the_bf16_copy(fake_kernels):
    plan = plan_dense(device=RTX, x_dtype=BF16, **SMALL)
    buffers = allocate_dense_buffers(plan, "cpu")
    inputs = _inputs(x_dtype=BF16)
    bias = torch.linspace(-1, 1, 256).to(F16)
    out = _run(bind_dense(plan, **buffers), inputs, bias=bias)
    expect = ((inputs["x"].to(F16) * inputs["suh"] * inputs["svh"]) + bias).to(BF16)
    assert torch.equal(out, expect)
    assert torch.equal(buffers["output_f16"].to(BF16), out)


def test_generic_run_uses_c_tmp_and_converting_rotations(fake_kernels):
    plan = plan_dense(device=H200, x_dtype=BF16, compute_dtype=BF16, split_k=2, **SMALL)
    buffers = allocate_dense_buffers(plan, "cpu")
    bound = bind_dense(plan, **buffers)
    _run(bound, _inputs(x_dtype=BF16))
    gemm = next(c for c in fake_kernels.calls if c[0] == "gemm")
    assert gemm[1].data_ptr() == buffers["rotated_compute"].data_ptr()
    assert gemm[2].data_ptr() == buffers["gemm_output"].data_ptr()
    assert gemm[3] is buffers["c_tmp"] and gemm[4].splits == plan.split_k == 2
    assert gemm[4].geometry == plan.geometry and gemm[4].reduce is not None
    rot_in, rot_out = fake_kernels.calls[0], fake_kernels.calls[-1]
    # The rotations convert on their own: bf16 x in, the bf16 operand out, the bf16 GEMM output
    # in, the bf16 output out (no fp16 staging and no copy).
    assert [c[0] for c in fake_kernels.calls] == ["rotate_input", "gemm", "rotate_output"]
    assert rot_in[2].data_ptr() == buffers["rotated_compute"].data_ptr()
    assert rot_out[1].data_ptr() == buffers["gemm_output"].data_ptr()
    assert rot_out[2].data_ptr() == buffers["output"].data_ptr()


def test_external_h128_callback_gets_the_contract_arguments(fake_kernels):
    plan = plan_dense(device=RTX, x_dtype=F16, external_rotation=True, **SMALL)
    assert plan.path == "generic"  # an external H128 makes the K6 path ineligible
    buffers = allocate_dense_buffers(plan, "cpu")
    bound = bind_dense(plan, **buffers)
    seen = []

    def had_r_128(inp, out, pre, post, scale):
        seen.append((inp.data_ptr(), out.data_ptr(), pre, post, scale))
        out.copy_(inp)

    inputs = _inputs()
    _run(bound, inputs, hadamard_128=had_r_128)
    assert len(seen) == 2
    assert seen[0][:2] == (inputs["x"].data_ptr(), buffers["rotated_f16"].data_ptr())
    assert seen[0][2] is inputs["suh"] and seen[0][3:] == (None, 1.0)
    assert seen[1][:2] == (buffers["gemm_output"].data_ptr(), buffers["output"].data_ptr())
    assert seen[1][2] is None and seen[1][3] is inputs["svh"] and seen[1][4] == 1.0
    assert [c[0] for c in fake_kernels.calls] == ["gemm"]


def test_dense_op_hands_its_h128_callback_to_every_run(fake_kernels):
    """DenseOp(device, hadamard_128=...): the consumer's door to the raw GEMM (identity H128)."""
    seen = []

    def identity(inp, out, pre, post, scale):
        seen.append((pre is not None, post is not None, scale))
        out.copy_(inp)

    op = DenseOp(H200, hadamard_128=identity)
    plan = op.plan(dict(SMALL, x_dtype=F16))
    assert plan.problem.external_rotation and plan.path == "generic"
    bound = op.bind(plan, allocate_dense_buffers(plan, "cpu"))
    inputs = _inputs()
    for _ in range(2):
        op.run(bound, inputs)
    assert seen == [(True, False, 1.0), (False, True, 1.0)] * 2
    assert [c[0] for c in fake_kernels.calls] == ["gemm"] * 2
    with pytest.raises(TypeError, match="hadamard_128"):
        DenseOp(H200, hadamard_128=42)
    with pytest.raises(ValueError, match="external_rotation"):
        DenseOp(H200).plan(dict(SMALL, x_dtype=F16, external_rotation=True))


def test_run_validates_before_any_launch(fake_kernels):
    plan = plan_dense(device=RTX, x_dtype=F16, **SMALL)
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cpu"))
    good = _inputs()
    bad = {
        "x": ({**good, "x": good["x"].float()}, TypeError, "x: expected dtype"),
        "m": ({**good, "x": torch.zeros(9, 256, dtype=F16)}, ValueError, "live M=9"),
        "trellis": ({**good, "trellis": good["trellis"][:, :, :80]}, ValueError, "trellis"),
        "suh": ({**good, "suh": good["suh"][:128]}, ValueError, "suh"),
        "svh": ({**good, "svh": good["svh"].float()}, TypeError, "svh"),
    }
    for inputs, error, message in bad.values():
        with pytest.raises(error, match=message):
            _run(bound, inputs)
    with pytest.raises(ValueError, match="hadamard_128"):
        _run(bound, good, hadamard_128=lambda *a: None)
    with pytest.raises(TypeError, match="bound"):
        run_dense(plan, **good)
    assert fake_kernels.calls == []


def test_live_m_below_plan_writes_only_its_rows(fake_kernels):
    plan = plan_dense(device=RTX, x_dtype=F16, **SMALL)
    buffers = allocate_dense_buffers(plan, "cpu")
    buffers["output"].fill_(float("nan"))
    bound = bind_dense(plan, **buffers)
    inputs = _inputs(m=3)
    out = _run(bound, inputs)
    assert out.shape == (3, 256) and out.data_ptr() == buffers["output"].data_ptr()
    assert not torch.isnan(buffers["output"][:3]).any()
    assert torch.isnan(buffers["output"][3:]).all()


# ------------------------------------------------------------------ the graph protocol


def _consumer(plan, device, *, placeholders, x_dtype=F16):
    """A vLLM-style consumer's buffers: the plan's, plus one-element generic placeholders."""
    p = plan.problem
    buffers = allocate_dense_buffers(plan, device)
    buffers.update(placeholders)
    gen = dict(m=p.m, k=p.k, n=p.n, bits=p.bits, x_dtype=x_dtype)
    inputs = {k_: v.to(device) for k_, v in _inputs(**gen, seed=0).items()}
    sets = [{k_: v.to(device) for k_, v in _inputs(**gen, seed=s).items()} for s in (1, 2)]
    scratch = tuple(n_ for n_ in buffers if n_ not in ("output", "workspace"))
    return ConsumerFixture(buffers, inputs, sets, outputs=("output",), scratch=scratch)


def _placeholders(device):
    return {
        "c_tmp": torch.empty(1, dtype=F32, device=device),
        "gemm_output": torch.empty(1, dtype=F16, device=device),
    }


@pytest.fixture
def simulated(monkeypatch, fake_kernels):
    backend = SimulatedBackend()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: backend.capturing)
    return backend


@pytest.mark.parametrize("x_dtype", [F16, BF16])
def test_cpu_protocol_k6_captures_with_one_element_generic_scratch(simulated, x_dtype):
    problem = dict(SMALL, x_dtype=x_dtype)
    op = DenseOp(RTX)
    fixture = _consumer(op.plan(problem), "cpu", placeholders=_placeholders("cpu"), x_dtype=x_dtype)
    verdict = GraphProtocol(op, problem, fixture, simulated).run()
    assert verdict.passed, verdict.reasons
    assert verdict.step("misuse.compile_in_capture").status == "pass"
    assert {"c_tmp", "gemm_output"} <= set(verdict.metrics["buffers_unused"])


def test_cpu_protocol_generic_full_buffers_passes(simulated):
    problem = dict(SMALL, x_dtype=BF16, compute_dtype=BF16, split_k=2)
    op = DenseOp(H200)
    fixture = _consumer(op.plan(problem), "cpu", placeholders={}, x_dtype=BF16)
    verdict = GraphProtocol(op, problem, fixture, simulated).run()
    assert verdict.passed, verdict.reasons
    assert "c_tmp" in verdict.metrics["buffers_read"]


def test_cpu_protocol_generic_with_placeholder_fails_naming_the_buffer(simulated):
    problem = dict(SMALL, x_dtype=F16, split_k=2)
    op = DenseOp(H200)
    plan = op.plan(problem)
    full = allocate_dense_buffers(plan, "cpu")
    fixture = _consumer(
        plan,
        "cpu",
        placeholders={"c_tmp": torch.empty(1, dtype=F32), "gemm_output": full["gemm_output"]},
    )
    verdict = GraphProtocol(op, problem, fixture, simulated).run()
    assert not verdict.passed
    assert verdict.step("bind").status == "fail"
    assert "scratch `c_tmp`" in verdict.step("bind").detail


def test_cpu_protocol_catches_an_allocating_run(simulated, monkeypatch):
    """Mutant: a run that allocates its own rotated buffer is caught (the mutation gate)."""

    def allocating_rotate(spec, x, scale, out):
        out.copy_(x * scale)  # x * scale allocates a fresh tensor

    monkeypatch.setattr(plan_mod.launchers, "launch_rotation", allocating_rotate)
    problem = dict(SMALL, x_dtype=F16)
    op = DenseOp(RTX)
    fixture = _consumer(op.plan(problem), "cpu", placeholders={})
    verdict = GraphProtocol(op, problem, fixture, simulated).run()
    assert verdict.step("capture").status == "fail"


# ------------------------------------------------------------------ GPU tier


def _cuda_limits(capability=None):
    limits = plan_mod.device_limits()
    return limits if capability is None else dataclasses.replace(limits, capability=capability)


def _random_layer(m, k, n, bits, x_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 16 * bits), generator=g)
    return {
        "x": (torch.randn(m, k, generator=g) * 0.5).to(x_dtype).cuda(),
        "trellis": words.to(torch.int16).cuda(),
        "suh": torch.randn(k, generator=g).sign().to(F16).cuda(),
        "svh": (torch.randn(n, generator=g).sign() * 0.125).to(F16).cuda(),
    }


def _rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("x_dtype", "compute_dtype", "capability", "m"),
    [
        (F16, F16, None, 33),
        (BF16, BF16, None, 33),
        (F16, F16, (12, 0), 16),
        (BF16, F16, (12, 0), 16),
        (F16, F16, None, 1100),
    ],
)
def test_gpu_run_matches_the_faithful_reference(x_dtype, compute_dtype, capability, m):
    from reference.linear import TrellisLinear, forward

    k, n, bits = 512, 256, 6
    inputs = _random_layer(m, k, n, bits, x_dtype)
    plan = plan_dense(
        m=m,
        k=k,
        n=n,
        bits=bits,
        codebook="mcg",
        x_dtype=x_dtype,
        compute_dtype=compute_dtype,
        device=_cuda_limits(capability),
    )
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cuda"))
    y = _run(bound, inputs).clone()
    layer = TrellisLinear(inputs["trellis"].cpu(), inputs["suh"].cpu(), inputs["svh"].cpu(), "mcg")
    x_cpu = inputs["x"].cpu()
    exact = forward(x_cpu, layer, "exact")
    faithful = forward(x_cpu, layer, "faithful", compute_dtype=compute_dtype)
    bound_err = max(2 * _rel_l2(faithful, exact), 1e-3)
    assert _rel_l2(y.cpu(), exact) <= bound_err, (plan.path, _rel_l2(y.cpu(), exact), bound_err)


@pytest.mark.gpu
def test_gpu_live_m_below_planned_capacity():
    from reference.linear import TrellisLinear, forward

    k, n, bits = 512, 256, 5
    inputs = _random_layer(20, k, n, bits, F16, seed=3)
    plan = plan_dense(
        m=48,
        k=k,
        n=n,
        bits=bits,
        codebook="sqg_fp16",
        x_dtype=F16,
        split_k=2,
        device=_cuda_limits(),
    )
    buffers = allocate_dense_buffers(plan, "cuda")
    buffers["output"].fill_(float("nan"))
    y = _run(bind_dense(plan, **buffers), inputs)
    assert y.shape == (20, n) and torch.isnan(buffers["output"][20:]).all()
    cpu = {name: t.cpu() for name, t in inputs.items()}
    layer = TrellisLinear(cpu["trellis"], cpu["suh"], cpu["svh"], "sqg_fp16")
    exact = forward(cpu["x"], layer, "exact")
    faithful = forward(cpu["x"], layer, "faithful")
    assert _rel_l2(y.cpu(), exact) <= max(2 * _rel_l2(faithful, exact), 1e-3)


@pytest.mark.gpu
@pytest.mark.graph
def test_gpu_protocol_k6_captures_with_one_element_generic_scratch():
    from oracle.run.graph_protocol import CudaBackend

    problem = dict(m=16, k=512, n=256, bits=6, codebook="mcg", x_dtype=BF16)
    op = DenseOp(_cuda_limits((12, 0)))  # the K6 gate is SM120-only; simulate it here
    plan = op.plan(problem)
    assert plan.path == "k6_mcg_small_m"
    fixture = _consumer(plan, "cuda", placeholders=_placeholders("cuda"), x_dtype=BF16)
    verdict = GraphProtocol(op, problem, fixture, CudaBackend()).run()
    assert verdict.passed, verdict.reasons


@pytest.mark.gpu
@pytest.mark.graph
def test_gpu_protocol_generic_with_placeholder_raises_naming_it():
    from oracle.run.graph_protocol import CudaBackend

    problem = dict(m=16, k=512, n=256, bits=6, codebook="mcg", x_dtype=F16, split_k=2)
    op = DenseOp(_cuda_limits())
    plan = op.plan(problem)
    assert plan.path == "generic"
    fixture = _consumer(plan, "cuda", placeholders=_placeholders("cuda"))
    verdict = GraphProtocol(op, problem, fixture, CudaBackend()).run()
    assert verdict.step("bind").status == "fail"
    assert (
        "`c_tmp`" in verdict.step("bind").detail or "`gemm_output`" in verdict.step("bind").detail
    )
    # Under a real capture, a missing buffer raises the capture-phrased error naming it.
    buffers = allocate_dense_buffers(plan, "cuda")
    buffers["c_tmp"] = None
    missing = "`c_tmp` is not initialized for CUDA graph"
    with pytest.raises(BufferNotProvided, match=missing):
        capture_graph(lambda: bind_dense(plan, **buffers))


@pytest.mark.gpu
@pytest.mark.graph
def test_gpu_protocol_generic_full_buffers_bf16():
    from oracle.run.graph_protocol import CudaBackend

    problem = dict(
        m=40, k=512, n=256, bits=4, codebook="sqg_e4m3", x_dtype=BF16, compute_dtype=BF16, split_k=2
    )
    op = DenseOp(_cuda_limits())
    fixture = _consumer(op.plan(problem), "cuda", placeholders={}, x_dtype=BF16)
    verdict = GraphProtocol(op, problem, fixture, CudaBackend()).run()
    assert verdict.passed, verdict.reasons


# ------------------------------------------------------------------ the custom op


def _op_args(device, m=4, k=256, n=256, bits=6, x_dtype=F16):
    return (
        torch.zeros(m, k, dtype=x_dtype, device=device),
        torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16, device=device),
        torch.ones(k, dtype=F16, device=device),
        torch.ones(n, dtype=F16, device=device),
        "mcg",
    )


def test_custom_op_fake_path_passes_opcheck_on_meta():
    import b12x.ops.dense.custom_op  # noqa: F401 - registers the op

    op = torch.ops.b12x.trellis_dense_linear.default
    result = torch.library.opcheck(op, _op_args("meta", x_dtype=BF16))
    assert set(result.values()) == {"SUCCESS"}, result
    y = torch.ops.b12x.trellis_dense_linear(*_op_args("meta", m=3, n=384))
    assert (tuple(y.shape), y.dtype, y.device.type) == ((3, 384), F16, "meta")


def test_custom_op_validates_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    import b12x.ops.dense.custom_op  # noqa: F401

    with FakeTensorMode() as mode:
        x, trellis, suh, svh, cb = (
            mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in _op_args("cpu")
        )
        y = torch.ops.b12x.trellis_dense_linear(x, trellis, suh, svh, cb)
        assert tuple(y.shape) == (4, 256)
        with pytest.raises(TypeError, match="x: expected dtype"):
            torch.ops.b12x.trellis_dense_linear(x.float(), trellis, suh, svh, cb)
        with pytest.raises(ValueError, match="bits"):
            torch.ops.b12x.trellis_dense_linear(x, trellis, suh, svh, "sqg_e4m3")
        with pytest.raises(ValueError, match="svh"):
            torch.ops.b12x.trellis_dense_linear(x, trellis, suh, svh[:128], cb)
        with pytest.raises(ValueError, match="tile"):
            torch.ops.b12x.trellis_dense_linear(x, trellis, suh, svh, cb, None, [64, 256])


@pytest.mark.gpu
def test_custom_op_full_opcheck_and_tile_pin_on_cuda():
    import b12x.ops.dense.custom_op as ops

    op = torch.ops.b12x.trellis_dense_linear.default
    args = _random_layer(33, 512, 256, 6, F16)
    call = (args["x"], args["trellis"], args["suh"], args["svh"], "mcg")
    result = torch.library.opcheck(op, call)
    assert set(result.values()) == {"SUCCESS"}, result
    pinned = ops.dense_linear(*call[:4], codebook="mcg", tile=[64, 128, 128], split_k=2)
    plan = plan_dense(
        m=33,
        k=512,
        n=256,
        bits=6,
        codebook="mcg",
        x_dtype=F16,
        tile=[64, 128, 128],
        split_k=2,
        device=_cuda_limits(),
    )
    bound = bind_dense(plan, **allocate_dense_buffers(plan, "cuda"))
    assert torch.equal(pinned, _run(bound, args))
    with pytest.raises(ValueError, match="fc2 only"):
        ops.dense_linear(*call[:4], codebook="mcg", tile=[32, 512, 256])


# ------------------------------------------------------------------ warm-up set


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("compute_dtype", [F16, BF16])
@pytest.mark.parametrize("x_dtype", [F16, BF16])
@pytest.mark.parametrize(("device", "m"), [(RTX, 8), (H200, 8), (H200, 129)])
def test_plan_kernel_specs_cover_every_kernel_run_resolves(
    monkeypatch, device, m, x_dtype, compute_dtype, bias
):
    """The warm-up set (``plan.kernel_specs``) holds every specialisation ``run_dense`` asks the
    compile cache for, on every path (K6, generic, decode_matmul), with and without a bias: a
    frozen cache warmed from the plan never meets an unwarmed spec (the host wrappers run on CPU
    tensors, their tensor checks off, with the compiled kernel replaced by a recorder)."""
    from b12x.launch import host

    resolved = []
    monkeypatch.setattr(host, "_kernel", lambda spec, device: resolved.append(spec) or _no_op)
    monkeypatch.setattr(host, "_check_tensor", _no_op)  # CPU tensors: the CUDA check would stop
    kw = dict(SMALL, m=m, x_dtype=x_dtype, compute_dtype=compute_dtype)
    if m == 8 and device is RTX and compute_dtype == BF16:
        kw["bits"] = 5  # the K6 row wants fp16 compute; K5 keeps the generic path comparable
    plan = plan_dense(device=device, **kw)
    inputs = _inputs(m=m, bits=kw["bits"], x_dtype=x_dtype)
    bias_t = torch.ones(256, dtype=F16) if bias else None
    _run(bind_dense(plan, **allocate_dense_buffers(plan, "cpu")), inputs, bias=bias_t)
    assert resolved and set(resolved) <= set(plan.kernel_specs), (plan.path, resolved)


def _no_op(*args, **kwargs):
    return None
