"""Every launch of a compiled kernel passes the positional arguments of its kernel's entry.

The compiled tvm-ffi callables take positional arguments only, in the order of the kernel's
``__call__`` (less ``self`` and the environment ``stream``). These tests replace each compile
lookup by a recorder, call the host launch helpers on small CPU tensors and compare what reached
the "compiled" callable with the tuple stated here, by name, from the kernel's documented
parameter order and the inputs the test built. They passed on the positional call sites before
the launch records (:mod:`b12x.launch.records`) replaced them, and pin that the records pass the
very same arguments. The second half tests the records themselves: construction by keyword only,
a missing or unknown field named, and the derivation check failing when a kernel's signature
changes under its record.
"""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest
import torch

import b12x.launch.host as host
import b12x.ops.moe.boundary as boundary
import b12x.ops.moe.pairs as pairs_mod
import b12x.ops.moe.run as run_mod
from b12x.formats import resolve_format
from b12x.kernels.moe_boundary import MoeBoundarySpec
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch import records as launch
from b12x.launch.specs import KernelSpec

ARCH = "sm_90"
LUT = 0x5EED00  # the LUT address every patched lookup returns (a value no other slot has)


def describe(value):
    """What the kernel receives from one positional argument: a tensor's dtype, shape, strides
    and address (views are new objects; the bytes they name are what matters), or a typed int."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.stride(), value.data_ptr())
    return (type(value).__name__, value)


class Recorder:
    """Stands in for a compile lookup: records the spec it was asked for and, for every call of
    the returned callable, the positional arguments (keywords are refused: tvm-ffi takes none)."""

    def __init__(self):
        self.specs = []
        self.calls = []

    def lookup(self, spec, arch_or_device):
        self.specs.append(spec)

        def compiled(*args, **kwargs):
            assert not kwargs, f"a compiled kernel takes positional arguments only, got {kwargs}"
            self.calls.append(args)

        return compiled

    def check(self, *expected_calls):
        got = [tuple(describe(a) for a in call) for call in self.calls]
        want = [tuple(describe(a) for a in call) for call in expected_calls]
        assert got == want


def words(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


# ------------------------------------------------------------------------------ kernels/host.py


@pytest.fixture
def host_recorder(monkeypatch):
    rec = Recorder()
    luts = []
    monkeypatch.setattr(host, "_kernel", rec.lookup)
    monkeypatch.setattr(host, "_check_tensor", lambda *args, **kwargs: None)  # is_cuda et al.

    def lut_addr(fmt, device):
        luts.append(fmt)
        return LUT

    monkeypatch.setattr(host, "_lut_addr", lut_addr)
    rec.luts = luts
    return rec


def payload(k: int, n: int, bits: int) -> torch.Tensor:
    return torch.randint(-(2**15), 2**15, (k // 16, n // 16, 16 * bits), dtype=torch.int16)


def test_decode_weight_passes_payload_out_lut(host_recorder):
    trellis = payload(64, 128, 3)
    out = torch.empty(64, 128, dtype=torch.float16)
    assert host.decode_weight(trellis, "mcg", out=out) is out
    # TrellisDecodeKernel.__call__(payload, out, lut_addr, stream)
    host_recorder.check((trellis.view(torch.int32), out.view(torch.int16), LUT))
    assert host_recorder.specs == [KernelSpec("decode", "mcg", 3)]
    assert host_recorder.luts == [resolve_format("mcg", 3)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_trellis_matmul_without_split_passes_one_split(host_recorder, dtype):
    m, k, n = 5, 256, 128
    a = torch.randn(m, k).to(dtype)
    trellis = payload(k, n, 4)
    out = torch.empty(m, n, dtype=dtype)
    host.trellis_matmul(a, trellis, "sqg_e4m3", split_k=1, out=out, tiles=(1, 2))
    k_rows = k // 16  # one split: every K16 row
    # DenseTrellisGemmKernel.__call__(a, payload, out, lut_addr, k_rows_per_split, splits, stream)
    host_recorder.check((words(a), words(trellis), words(out), LUT, k_rows, 1))
    (spec,) = host_recorder.specs
    assert (spec.kind, spec.write_partials, spec.bf16) == ("gemm", False, dtype == torch.bfloat16)


@pytest.mark.parametrize(("split_k", "rows_per_split", "splits"), [(2, 8, 2), (3, 6, 3)])
def test_trellis_matmul_split_passes_partials_then_reduces(
    host_recorder, split_k, rows_per_split, splits
):
    m, k, n = 3, 256, 128  # 16 K16 rows: split 2 -> 8 rows each, split 3 -> 6, 6, 4
    a = torch.randn(m, k).to(torch.float16)
    trellis = payload(k, n, 2)
    out = torch.empty(m, n, dtype=torch.float16)
    scratch = torch.empty(splits * m * n + 7, dtype=torch.float32)
    host.trellis_matmul(a, trellis, "3inst", split_k=split_k, out=out, scratch=scratch)
    partials = scratch[: splits * m * n].view(splits, m, n)
    host_recorder.check(
        # DenseTrellisGemmKernel.__call__(a, payload, out, lut_addr, k_rows_per_split, splits)
        (words(a), words(trellis), partials, LUT, rows_per_split, splits),
        # SplitKReduceKernel.__call__(partials, out, stream)
        (partials, words(out)),
    )
    gemm, reduce = host_recorder.specs
    assert gemm.write_partials and reduce == KernelSpec("reduce", bf16=False)


@pytest.mark.parametrize("kind", ["rotate_in", "rotate_out"])
@pytest.mark.parametrize(
    ("in_dtype", "out_dtype"), [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)]
)
def test_rotations_pass_x_scale_out(host_recorder, kind, in_dtype, out_dtype):
    x = torch.randn(4, 256).to(in_dtype)
    scale = torch.randn(256).to(torch.float16)
    out = torch.empty(4, 256, dtype=out_dtype)
    rotate = host.rotate_input if kind == "rotate_in" else host.rotate_output
    assert rotate(x, scale, out_dtype=out_dtype, out=out) is out
    # InputRotationKernel.__call__(x, suh, out, stream) / OutputRotationKernel(y, svh, out, ...)
    host_recorder.check((words(x), words(scale), words(out)))
    bf16 = torch.bfloat16
    assert host_recorder.specs == [
        KernelSpec(kind, in_bf16=in_dtype == bf16, out_bf16=out_dtype == bf16)
    ]


# ------------------------------------------------------------------------ moe/run.py, pairs.py


def gemm_context(blocks: int = 3, capacity: int = 48, experts: int = 4) -> run_mod.GemmContext:
    return run_mod.GemmContext(
        arch=ARCH,
        block_expert_ids=torch.arange(blocks, dtype=torch.int32),
        route_count=torch.tensor([capacity - 5], dtype=torch.int32),
        route_rows=torch.arange(capacity, dtype=torch.int32),
        descriptors=torch.arange(experts, dtype=torch.int32),
    )


@pytest.fixture
def moe_recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(run_mod, "compiled", rec.lookup)
    monkeypatch.setattr(pairs_mod, "compiled", rec.lookup)
    monkeypatch.setattr(run_mod, "_lut_addr", lambda spec, device: LUT)
    monkeypatch.setattr(pairs_mod, "_lut_addr", lambda spec, device: LUT)
    return rec


@pytest.mark.parametrize("layout", ["packed", "proj"])
@pytest.mark.parametrize("tier", [0, 1])
def test_grouped_gemm_passes_the_kernel_parameters_in_order(moe_recorder, layout, tier):
    spec = MoeGemmSpec("mcg", 4, True, m_tiles=1, n_tiles=2)
    e, k, n, routes = 3, 128, 256, 10
    ctx = gemm_context(experts=e)
    shape = (e, k // 16, n // 16, 16 * spec.bits)
    if layout == "proj":
        shape = (2, *shape)
    stack = torch.zeros(shape, dtype=torch.int16)
    experts = e if layout == "packed" else 2 * e
    expert_base, out_col = (0, 0) if layout == "packed" else (e, n)
    a = torch.randn(routes, k).to(torch.bfloat16)
    out = torch.empty(routes, 2 * n, dtype=torch.bfloat16)
    run_mod.launch_grouped_gemm(
        spec=spec, codebook="mcg", ctx=ctx, tier=tier, a=a, payload=stack,
        num_payload_experts=experts, out=out, expert_base=expert_base, out_col=out_col,
    )  # fmt: skip
    flat = stack.view(torch.int32).reshape(experts * (k // 16), n // 16, 8 * spec.bits)
    # MoeGroupedGemmKernel.__call__(a, payload, out, block_expert_ids, route_count, route_rows,
    #                               descriptors, lut_addr, tier, expert_base, out_col_word, stream)
    moe_recorder.check(
        (
            words(a), flat, words(out), ctx.block_expert_ids, ctx.route_count, ctx.route_rows,
            ctx.descriptors, LUT, tier, expert_base, out_col // 2,
        )
    )  # fmt: skip
    assert moe_recorder.specs == [spec]


@pytest.mark.parametrize(
    ("pair", "rate_axis"), [("P24", "n"), ("dynamic", "n"), ("P44", "k"), ("dynamic", "k")]
)
def test_paired_gemm_passes_modes_at_its_own_slot(moe_recorder, pair, rate_axis):
    spec = MoeGemmSpec("mcg", 3, False, m_tiles=1, n_tiles=2, warps=8 if rate_axis == "n" else 4,
                       depth=8, pair=pair, rate_axis=rate_axis)  # fmt: skip
    e, k, n, routes = 2, 256, 256, 6
    ctx = gemm_context(experts=e)
    s = 8 if pair == "P44" else 6  # b_lo + b_hi: 6 for P24 and both dynamic kinds
    stack = torch.zeros(e, (k // 16) * (n // 256) * 128 * s, dtype=torch.int16)  # int16 / expert
    modes = torch.tensor([1, 0], dtype=torch.int32) if pair == "dynamic" else None
    a = torch.randn(routes, k).to(torch.float16)
    out = torch.empty(routes, 2 * n, dtype=torch.float16)
    pairs_mod.launch_paired_gemm(
        spec=spec, codebook="mcg", ctx=ctx, a=a, payload=stack, num_payload_experts=e,
        modes=modes, out=out, n=n, expert_base=0, out_col=n,
    )  # fmt: skip
    if rate_axis == "n":  # [E·K/16, N/256, 64·s]
        view = stack.view(torch.int32).view(e * (k // 16), n // 256, spec.pair_words)
    else:  # [E·K/256, N/16, 64·s]
        view = stack.view(torch.int32).view(e * (k // 256), n // 16, spec.pair_words)
    # MoePairGemmKernel.__call__(a, payload, out, block_expert_ids, route_count, route_rows,
    #     descriptors, modes, lut_addr, tier, expert_base, out_col_word, stream); a static kind
    #     never reads `modes`: the descriptors fill the slot.
    table = modes if modes is not None else ctx.descriptors
    moe_recorder.check(
        (
            words(a), view, words(out), ctx.block_expert_ids, ctx.route_count, ctx.route_rows,
            ctx.descriptors, table, LUT, 0, 0, n // 2,
        )
    )  # fmt: skip
    assert moe_recorder.specs == [spec]


# ---------------------------------------------------------------------------- moe/boundary.py


@pytest.fixture
def boundary_recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(boundary, "compiled", rec.lookup)
    return rec


@pytest.mark.parametrize("proj", [False, True])
def test_rotate_inputs_passes_gate_and_up(boundary_recorder, proj):
    m, h, e, top_k = 3, 256, 4, 2
    n = m * top_k
    x = torch.randn(m, h).to(torch.bfloat16)
    gate_suh = torch.randn(e, h).to(torch.float16)
    up_suh = torch.randn(1, h).to(torch.float16) if proj else None
    route_expert = torch.tensor([0, 1, 2, 3, 4, 1], dtype=torch.int64)
    out_gate = torch.empty(n, h, dtype=torch.float16)
    out_up = torch.empty(n, h, dtype=torch.float16) if proj else None
    boundary.rotate_inputs(
        arch=ARCH, x=x, gate_suh=gate_suh, up_suh=up_suh, route_expert=route_expert,
        out_gate=out_gate, out_up=out_up, top_k=top_k, num_experts=e,
    )  # fmt: skip
    # MoeRotateKernel.__call__(x, gate_suh, up_suh, route_expert, out_gate, out_up, top_k,
    #                          num_experts, stream); packed: gate's tables fill the up slots.
    boundary_recorder.check(
        (
            words(x), words(gate_suh), words(up_suh if proj else gate_suh), route_expert,
            words(out_gate), words(out_up if proj else out_gate), top_k, e,
        )
    )  # fmt: skip
    assert boundary_recorder.specs == [MoeBoundarySpec("rotate", True, False, proj=proj)]


def test_activate_passes_fc1_rotations_out(boundary_recorder):
    n, i, e = 4, 128, 3
    fc1 = torch.randn(n, 2 * i).to(torch.float16)
    rotations = torch.randn(e, 3 * i).to(torch.float16)
    route_expert = torch.tensor([2, 0, 3, 1], dtype=torch.int64)
    out = torch.empty(n, i, dtype=torch.bfloat16)
    boundary.activate(
        arch=ARCH, fc1=fc1, rotations=rotations, route_expert=route_expert, out=out, num_experts=e
    )
    # MoeActivateKernel.__call__(fc1, rotations, route_expert, out, num_experts, stream)
    boundary_recorder.check((words(fc1), words(rotations), route_expert, words(out), e))
    assert boundary_recorder.specs == [MoeBoundarySpec("activate", False, True)]


def test_reduce_output_passes_the_route_tables_and_weights(boundary_recorder):
    m, h, e, top_k = 2, 256, 3, 3
    n = m * top_k
    fc2 = torch.randn(n, h).to(torch.bfloat16)
    svh = torch.randn(e, h).to(torch.float16)
    route_expert = torch.tensor([0, 1, 2, 3, 1, 0], dtype=torch.int64)
    route_inactive = torch.tensor([False, False, False, True, False, False])
    weights = torch.rand(n, dtype=torch.float32)
    out = torch.empty(m, h, dtype=torch.float16)
    boundary.reduce_output(
        arch=ARCH, fc2=fc2, svh=svh, route_expert=route_expert, route_inactive=route_inactive,
        weights=weights, out=out, top_k=top_k, num_experts=e,
    )  # fmt: skip
    # MoeReduceKernel.__call__(fc2, svh, route_expert, route_inactive, weights, out, num_experts,
    #                          stream); the bool mask travels as its bytes.
    boundary_recorder.check(
        (
            words(fc2), words(svh), route_expert, route_inactive.view(torch.uint8), weights,
            words(out), e,
        )
    )  # fmt: skip
    assert boundary_recorder.specs == [MoeBoundarySpec("reduce", True, False, top_k=top_k)]


# ------------------------------------------------------------------------------ the records


def kernel_order(record) -> tuple[str, ...]:
    """The kernel entry's parameters, read here straight from its ``__call__``."""
    module, _, name = record.entry.rpartition(".")
    kernel = getattr(__import__(module, fromlist=[name]), name)
    names = tuple(inspect.signature(kernel.__call__).parameters)
    assert names[0] == "self" and names[-1] == "stream"
    return names[1:-1]


def build(record, **overrides):
    """A record whose every field holds a distinct marker (its own name), ``overrides`` on top."""
    values = {f.name: f"<{f.name}>" for f in dataclasses.fields(record)}
    values.update(overrides)
    return record(**values)


@pytest.mark.parametrize("record", launch.RECORDS, ids=lambda r: r.__name__)
def test_record_args_follow_the_kernel_signature(record):
    order = kernel_order(record)
    assert {f.name for f in dataclasses.fields(record)} == set(order)
    assert record.parameters() == order
    assert build(record).args() == tuple(f"<{name}>" for name in order)


def test_check_records_covers_every_compiled_kernel_class():
    checked = launch.check_records()
    assert set(checked) == {r.__name__ for r in launch.RECORDS}
    entries = {r.entry for r in launch.RECORDS}
    assert len(entries) == len(launch.RECORDS)  # one record per kernel class
    assert {e.rpartition(".")[0] for e in entries} == {
        "b12x.kernels.trellis_decode",
        "b12x.kernels.dense_gemm",
        "b12x.kernels.split_k_reduce",
        "b12x.kernels.stream_k",
        "b12x.kernels.hadamard",
        "b12x.kernels.moe_gemm",
        "b12x.kernels.moe_pair_gemm",
        "b12x.kernels.moe_boundary",
        "b12x.kernels.moe_pack",
    }


def test_pair_record_follows_its_own_call_not_its_parents():
    grouped = launch.GroupedGemmLaunch.parameters()
    paired = launch.PairGemmLaunch.parameters()
    assert paired.index("modes") == 7 and "modes" not in grouped
    assert paired[:7] == grouped[:7] and paired[8:] == grouped[7:]
    record = build(launch.PairGemmLaunch)
    assert record.args()[7] == "<modes>" and record.args()[8] == "<lut_addr>"


@pytest.mark.parametrize("record", launch.RECORDS, ids=lambda r: r.__name__)
def test_missing_unknown_or_positional_fields_are_refused_by_name(record):
    names = [f.name for f in dataclasses.fields(record)]
    values = {name: 0 for name in names}
    missing = dict(values)
    del missing[names[-1]]
    with pytest.raises(TypeError, match=names[-1]):
        record(**missing)
    with pytest.raises(TypeError, match="lut_addr_fc2"):
        record(**values, lut_addr_fc2=0)
    with pytest.raises(TypeError, match="positional"):
        record(*values.values())
    built = record(**values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, names[0], 1)


GROUPED = (
    "a", "payload", "out", "block_expert_ids", "route_count", "route_rows", "descriptors",
    "lut_addr", "tier", "expert_base", "out_col_word",
)  # fmt: skip


def plant_call(monkeypatch, kernel, params):
    """Give ``kernel`` a ``__call__(self, *params, stream)``, as if its source had changed, and
    forget what the records learned of the old one."""
    source = f"def __call__(self, {', '.join(params)}, stream):\n    pass\n"
    namespace = {}
    exec(source, namespace)
    monkeypatch.setattr(kernel, "__call__", namespace["__call__"])
    monkeypatch.setattr(launch, "_PARAMETERS", {})


def test_a_parameter_added_to_the_kernel_stops_every_launch_naming_it(monkeypatch):
    from b12x.kernels.moe_gemm import MoeGroupedGemmKernel

    grown = (*GROUPED[:8], "lut_addr_fc2", *GROUPED[8:])  # the seed bug's new slot
    plant_call(monkeypatch, MoeGroupedGemmKernel, grown)
    with pytest.raises(launch.LaunchRecordError, match="lut_addr_fc2") as info:
        build(launch.GroupedGemmLaunch)
    assert "GroupedGemmLaunch" in str(info.value) and "MoeGroupedGemmKernel" in str(info.value)
    with pytest.raises(launch.LaunchRecordError, match="lut_addr_fc2"):
        launch.check_records()


def test_a_parameter_removed_from_the_kernel_is_named_too(monkeypatch):
    from b12x.kernels.moe_gemm import MoeGroupedGemmKernel

    plant_call(monkeypatch, MoeGroupedGemmKernel, [p for p in GROUPED if p != "tier"])
    with pytest.raises(launch.LaunchRecordError, match="'tier'"):
        build(launch.GroupedGemmLaunch)


def test_a_reordered_kernel_signature_reorders_the_launch(monkeypatch, moe_recorder):
    """Nothing at the call site changes, yet the compiled kernel gets the new order: a
    positional call could only have shifted."""
    from b12x.kernels.moe_gemm import MoeGroupedGemmKernel

    swapped = list(GROUPED)
    swapped[8], swapped[9] = swapped[9], swapped[8]  # tier <-> expert_base
    plant_call(monkeypatch, MoeGroupedGemmKernel, swapped)
    spec = MoeGemmSpec("mcg", 4, False)
    ctx = gemm_context(experts=2)
    stack = torch.zeros(2, 8, 8, 64, dtype=torch.int16)
    a, out = torch.zeros(4, 128, dtype=torch.float16), torch.zeros(4, 128, dtype=torch.float16)
    run_mod.launch_grouped_gemm(
        spec=spec, codebook="mcg", ctx=ctx, tier=1, a=a, payload=stack,
        num_payload_experts=2, out=out, expert_base=7, out_col=0,
    )  # fmt: skip
    (call,) = moe_recorder.calls
    assert call[8:] == (7, 1, 0)  # expert_base, tier, out_col_word


def test_a_record_whose_fields_drift_from_its_kernel_fails_its_check():
    @dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
    class StaleDecode(launch.LaunchRecord):
        entry = "b12x.kernels.trellis_decode.TrellisDecodeKernel"
        payload: object
        out: object
        lut: object  # the kernel calls it lut_addr

    with pytest.raises(launch.LaunchRecordError, match="lut_addr.*lut"):
        StaleDecode(payload=0, out=0, lut=0)


@pytest.mark.parametrize(
    ("signature", "message"),
    [
        ("self, a, *rest, stream", "variadic positional"),
        ("self, a, *, b, stream", "keyword-only"),
        ("self, a, stream, b", "'stream' must be the last"),
        ("a, b, stream", "first parameter is self"),
    ],
)
def test_entries_that_cannot_be_called_positionally_are_refused(signature, message):
    namespace = {}
    exec(f"class Kernel:\n    def __call__({signature}):\n        pass\n", namespace)
    with pytest.raises(launch.LaunchRecordError, match=message):
        launch.entry_parameters(namespace["Kernel"])


def test_importing_the_records_loads_no_kernel():
    code = (
        "import sys, b12x.launch.records, b12x.launch.host; "
        "print(sorted(m for m in sys.modules if m == 'cutlass' or m.startswith('b12x.kernels.')"
        " and m not in ('b12x.launch.records', 'b12x.launch.host', 'b12x.launch.specs')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
