"""CPU tier: the kernels compile for sm_80 / sm_90 / sm_120 with fake tensors, use mma.sync
m16n8k16 where they should, and ptxas reports zero spills; host-side validation rejects bad
input before any launch (these checks need no GPU: validation runs first).

CI compiles a representative subset on sm_90 (every kernel kind, every decoder family, both
compute dtypes, 2- and 3-word lane geometries, split and direct epilogues) and its two heaviest
specs on sm_80 and sm_120; the exhaustive sweep
over :func:`b12x.support.kernel_specializations` is marked ``slow``: one item per (spec, arch),
named by :func:`_spec_id`, so xdist spreads it and a failure names its specialisation.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch

import b12x.ops.dense.custom_op  # noqa: F401 - registers torch.ops.b12x.trellis_dense_linear
from b12x import support
from b12x.formats import FORMATS
from b12x.kernels.geometry import GemmGeometry
from b12x.launch import host
from b12x.launch.specs import KernelSpec, gemm_spec
from oracle.pytest_plugin import slow_sweep


@functools.cache
def _report(spec: KernelSpec, arch: str) -> support.CompileReport:
    return support.compile_specialization(spec, arch)


def _check_report(spec: KernelSpec, arch: str, report: support.CompileReport) -> None:
    assert re.search(rf"\.target {arch}\b", report.ptx), f"{spec} was not compiled for {arch}"
    mma = report.ptx.count("mma.sync.aligned.m16n8k16")
    if spec.uses_mma:
        # Two MMAs (n-blocks) per M16 block and N16 tile in the mainloop body.
        assert mma >= 2 * spec.m_tiles * spec.n_tiles, (spec, mma)
        kind = "bf16" if spec.bf16 else "f16"
        assert f"m16n8k16.row.col.f32.{kind}.{kind}.f32" in report.ptx
    else:
        assert mma == 0
    assert report.spill_bytes == 0, f"{spec} spills on {arch}: {report.spill_bytes} bytes"
    assert report.registers is not None and 0 < report.registers <= 255


def _representative_points() -> list:
    """Every representative spec on sm_90, the largest GEMM tile (MCG K6 4x2 bf16 with partials)
    and the heaviest decoder (sqg_fp16 K6) on sm_80 and sm_120: where ptxas of another arch
    would spill first. Every spec on every arch is the slow sweep's."""
    specs = support.representative_specializations()
    heavy = [s for s in specs if (s.kind, s.codebook, s.bits) in
             (("gemm", "mcg", 6), ("decode", "sqg_fp16", 6))]  # fmt: skip
    assert len(heavy) == 2, "the representative set lost a cross-arch spec"
    points = [(spec, "sm_90") for spec in specs]
    return points + [(spec, arch) for arch in ("sm_80", "sm_120") for spec in heavy]


@pytest.mark.deep
@pytest.mark.parametrize(
    ("spec", "arch"), _representative_points(),
    ids=lambda p: p if isinstance(p, str) else _spec_id(p),
)  # fmt: skip
def test_representative_specializations_compile(spec, arch):
    _check_report(spec, arch, _report(spec, arch))


_DEFAULT_GEOMETRY = GemmGeometry()


def _field_token(name: str, value: object) -> str:
    if isinstance(value, bool):
        return name if value else f"no_{name}"
    return f"{name}{value}"


def _spec_id(spec: KernelSpec) -> str:
    """A readable test id naming every field that tells ``spec`` apart, e.g.
    ``gemm-mcg-K4-bf16-m1n4w4-partials``, ``decode-sqg_fp16-K5-out_bf16``, ``reduce-f16``:
    kind, codebook and rate, the dtype flags set (``f16`` when none is), the geometry's tiles and
    warps plus each other field off its default (``smem_stages2``, ``wgmma``), and ``partials``
    for split-K partials."""
    parts = [spec.kind]
    if spec.fmt is not None:
        parts += [spec.codebook, f"K{spec.bits}"]
    flags = [name for name in ("bf16", "in_bf16", "out_bf16") if getattr(spec, name)]
    parts += flags or ["f16"]
    g = spec.geometry
    if g is not None:
        extra = "".join(
            f"-{_field_token(f.name, value)}"
            for f in dataclasses.fields(g)
            if f.name not in ("m_tiles", "n_tiles", "warps")
            and (value := getattr(g, f.name)) != getattr(_DEFAULT_GEOMETRY, f.name)
        )
        parts.append(f"m{g.m_tiles}n{g.n_tiles}w{g.warps}{extra}")
    if spec.write_partials:
        parts.append("partials")
    return "-".join(parts)


# ~650 specs per arch (1.5 CPU hours in all): opt-in with `-m slow`, never part of the default run
# (there one skipped placeholder per arch); one item per (spec, arch) under `-m slow`, so xdist
# and `--slow-slice` spread the sweep.
@pytest.mark.slow
@pytest.mark.parametrize("arch", support.ARCHES)
@slow_sweep(
    "spec",
    support.kernel_specializations,
    _spec_id,
    reason="exhaustive compile sweep runs only when selected with -m slow",
)
def test_every_specialization_compiles(spec, arch):
    _check_report(spec, arch, _report(spec, arch))


@pytest.mark.deep
def test_decoder_families_emit_their_instructions():
    ptx = {
        name: _report(
            gemm_spec(name, fmt.legal_bits[0], GemmGeometry(m_tiles=1, n_tiles=2)), "sm_90"
        ).ptx
        for name, fmt in FORMATS.items()
    }
    assert "lop3.b32" in ptx["mcg"] and "0x6a" in ptx["mcg"]
    # The pair's half sums: one fma.rn.f16x2 per hash, one add.rn.f16x2 to merge (ptx.py).
    assert "fma.rn.f16x2" in ptx["mcg"] and "add.rn.f16x2" in ptx["mcg"]
    assert "dp4a.u32.u32" in ptx["mul1"] and "fma.rn.f16x2" in ptx["mul1"]
    assert "ld.global.nc.u8" in ptx["sqg_e4m3"]
    assert "ld.global.nc.u32" in ptx["sqg_fp16"] and "bfind.u32" in ptx["sqg_fp16"]
    # MCG's multiplier appears (as a signed 32-bit immediate), 3INST's addend only in 3inst.
    assert str(0xCBAC1FED - 2**32) in ptx["mcg"]
    assert "64248484" in ptx["3inst"] and "64248484" not in ptx["mcg"]


def test_supported_variants_cover_the_registry():
    variants = support.supported_variants()
    seen = {(v["op"], v["codebook"], v["bits"], v["compute_dtype"]) for v in variants}
    for name, fmt in FORMATS.items():
        for bits in fmt.legal_bits:
            assert ("decode", name, bits, "float16") in seen
            for dtype in ("float16", "bfloat16"):
                assert ("dense_linear", name, bits, dtype) in seen
    assert ("dense_linear", "sqg_e4m3", 5, "float16") not in seen
    specs = set(support.kernel_specializations())
    for v in variants:
        if v["op"] == "dense_linear":
            bf16 = v["compute_dtype"] == "bfloat16"
            assert any(
                s.kind == "gemm"
                and s.codebook == v["codebook"]
                and s.bits == v["bits"]
                and s.bf16 == bf16
                for s in specs
            ), v


def test_kernel_spec_rejects_incomplete_specs():
    with pytest.raises(ValueError, match="kind"):
        KernelSpec("conv")
    with pytest.raises(ValueError, match="codebook"):
        KernelSpec("gemm", "mcg", geometry=GemmGeometry())
    with pytest.raises(ValueError, match="geometry"):
        KernelSpec("gemm", "mcg", 4)


def test_compile_specialization_rejects_bad_arguments():
    with pytest.raises(TypeError, match="spec"):
        support.compile_specialization("gemm", "sm_90")
    with pytest.raises(ValueError, match="arch"):
        support.compile_specialization(KernelSpec("reduce"), "hopper")


# --- host validation (runs before any launch, so CPU tensors reach every check) -------------


def _layer(k=256, n=128, bits=4):
    return (
        torch.zeros(k // 16, n // 16, 16 * bits, dtype=torch.int16),
        torch.ones(k, dtype=torch.float16),
        torch.ones(n, dtype=torch.float16),
    )


def _linear(x, trellis, suh, svh, *, codebook, compute_dtype=None, split_k=0, tile=None):
    """The dense linear's front door (the custom op) on CPU tensors: validation runs first."""
    return torch.ops.b12x.trellis_dense_linear(
        x, trellis, suh, svh, codebook, None, tile, split_k, compute_dtype
    )


def test_dense_linear_rejects_bad_inputs():
    payload, suh, svh = _layer()
    x = torch.zeros(2, 256, dtype=torch.float16)
    with pytest.raises(TypeError, match="x: expected dtype"):
        _linear(x.float(), payload, suh, svh, codebook="mcg")
    with pytest.raises(TypeError, match="trellis"):
        _linear(x, payload.to(torch.int32), suh, svh, codebook="mcg")
    with pytest.raises(ValueError, match="bits"):
        _linear(x, payload, suh, svh, codebook="sqg_fp16")
    with pytest.raises(ValueError, match="codebook"):
        _linear(x, payload, suh, svh, codebook="exl2")
    with pytest.raises(ValueError, match="x: expected 256 features"):
        _linear(x[:, :128].contiguous(), payload, suh, svh, codebook="mcg")
    with pytest.raises(ValueError, match="suh"):
        _linear(x, payload, suh[:128].contiguous(), svh, codebook="mcg")
    with pytest.raises(ValueError, match="x: must be contiguous"):
        _linear(torch.zeros(256, 2, dtype=torch.float16).t(), payload, suh, svh, codebook="mcg")
    with pytest.raises(ValueError, match="16-byte aligned"):
        _linear(
            torch.zeros(2 * 256 + 1, dtype=torch.float16)[1:].view(2, 256),
            payload,
            suh,
            svh,
            codebook="mcg",
        )
    with pytest.raises(TypeError, match="compute_dtype"):
        _linear(x, payload, suh, svh, codebook="mcg", compute_dtype=torch.float32)
    with pytest.raises(ValueError, match="multiples of 128"):
        p2, s2, v2 = _layer(k=64, n=128)
        _linear(torch.zeros(2, 64, dtype=torch.float16), p2, s2, v2, codebook="mcg")
    with pytest.raises(ValueError, match="x: .*runs on CUDA tensors"):
        _linear(x, payload, suh, svh, codebook="mcg")
    with pytest.raises(ValueError, match="split_k"):
        _linear(x, payload, suh, svh, codebook="mcg", split_k=-1)
    with pytest.raises(ValueError, match="tile"):
        _linear(x, payload, suh, svh, codebook="mcg", tile=[64, 0, 128])


def test_host_wrappers_reject_bad_inputs():
    payload, _, _ = _layer()
    with pytest.raises(TypeError, match="trellis: expected dtype"):
        host.decode_weight(payload.float(), "mcg")
    with pytest.raises(ValueError, match="trellis: expected a CUDA tensor"):
        host.decode_weight(payload, "mcg")
    with pytest.raises(ValueError, match="bits"):
        host.decode_weight(torch.zeros(2, 2, 16 * 9, dtype=torch.int16), "mcg")
    with pytest.raises(TypeError, match="a: expected dtype"):
        host.trellis_matmul(torch.zeros(1, 256), payload, "mcg")


# --- the opt-in cp.async shared-memory ring of the dense GEMM (smem_stages) ------------------

RING_SPECS = [
    gemm_spec("mcg", bits, GemmGeometry(m_tiles=1, n_tiles=4, smem_stages=stages))
    for bits in (4, 6)
    for stages in (2, 3)
]


@pytest.mark.deep
@pytest.mark.parametrize("arch", support.ARCHES)
@pytest.mark.parametrize(
    "spec", RING_SPECS, ids=lambda s: f"K{s.bits}-stages{s.geometry.smem_stages}"
)
def test_smem_ring_mainloop_compiles_with_cp_async(spec, arch):
    report = _report(spec, arch)
    _check_report(spec, arch, report)
    ptx = report.ptx
    # Payload tiles stream through L2 only (.cg), A rows through L1 (.ca); one commit per
    # K16 row; the steady-state wait leaves stages - 2 groups in flight; the final drain
    # waits for all of them.
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" in ptx
    assert "cp.async.commit_group" in ptx
    # One wait per K16 row of the loop body (stages rows), plus the drain (a wait_group 0).
    stages = spec.geometry.smem_stages
    steady = ptx.count(f"cp.async.wait_group {stages - 2};")
    assert steady >= stages + (stages == 2), steady
    assert "cp.async.wait_group 0;" in ptx
    assert "bar.warp.sync" in ptx
    # Every ring word and A word comes from shared memory: MCG reads no table, so no global
    # load may remain in the kernel.
    assert "ld.shared.u32" in ptx
    assert "ld.global" not in ptx


def test_register_mainloop_has_no_cp_async():
    ptx = _report(gemm_spec("mcg", 4, GemmGeometry(m_tiles=1, n_tiles=4)), "sm_90").ptx
    assert "cp.async" not in ptx and "ld.shared" not in ptx
    assert "ld.global.nc.u32" in ptx


def test_smem_ring_partial_chunk_round_is_predicated():
    # K6 x 4 N16 tiles: 48 chunks of 16 B per warp and row, so the second copy round is issued
    # by lanes 0..15 only (a PTX predicate); K4 x 4 tiles is exactly one chunk per lane.
    ring = GemmGeometry(m_tiles=1, n_tiles=4, smem_stages=2)
    k6 = _report(gemm_spec("mcg", 6, ring), "sm_90")
    k4 = _report(gemm_spec("mcg", 4, ring), "sm_90")
    assert "@p cp.async.cg" in k6.ptx
    assert "@p cp.async.cg" not in k4.ptx


def test_ring_smem_bytes_budget():
    from b12x.kernels import shared_layout
    from b12x.kernels.dense_gemm import SMEM_LIMIT, SMEM_STAGES, ring_smem_bytes

    # one constant: the kernel's is the rule the spec and the launcher apply (check_dense_mainloop)
    assert SMEM_STAGES is shared_layout.SMEM_STAGES
    # Hand-computed: a slot is n_tiles·32·b payload bytes + m_tiles·512 A bytes, per warp.
    assert ring_smem_bytes(4, m_tiles=1, n_tiles=4, warps=4, stages=3) == 4 * 3 * (512 + 512)
    assert ring_smem_bytes(4, m_tiles=1, n_tiles=4, warps=4, stages=0) == 0
    largest = ring_smem_bytes(8, m_tiles=4, n_tiles=2, warps=4, stages=4)
    assert largest == 4 * 4 * (2 * 256 + 4 * 512) == 40960 <= SMEM_LIMIT
    for spec in support.kernel_specializations():
        if spec.kind == "gemm":
            g = spec.geometry
            need = ring_smem_bytes(
                spec.bits, m_tiles=g.m_tiles, n_tiles=g.n_tiles, warps=g.warps, stages=4
            )
            assert need <= SMEM_LIMIT, spec


def test_smem_stages_rejected_before_launch():
    from b12x.formats import resolve_format
    from b12x.kernels.dense_gemm import DenseTrellisGemmKernel

    fmt = resolve_format("mcg", 4)
    for bad in (1, 5, -1):
        with pytest.raises(ValueError, match="smem_stages"):
            DenseTrellisGemmKernel(
                fmt, 4, GemmGeometry(m_tiles=1, n_tiles=4, smem_stages=bad), bf16=False,
                write_partials=False,
            )  # fmt: skip
    with pytest.raises(ValueError, match="smem_stages"):
        DenseTrellisGemmKernel(
            fmt, 4, GemmGeometry(m_tiles=4, n_tiles=16, warps=8, smem_stages=4), bf16=False,
            write_partials=False,
        )  # fmt: skip
    payload, _, _ = _layer()
    a = torch.zeros(1, 256, dtype=torch.float16)
    for bad in (1, 5, True):
        with pytest.raises(ValueError, match="smem_stages"):
            host.trellis_matmul(a, payload, "mcg", smem_stages=bad)
