"""CPU tier: the kernels compile for sm_80 / sm_90 / sm_120 with fake tensors, use mma.sync
m16n8k16 where they should, and ptxas reports zero spills; host-side validation rejects bad
input before any launch (these checks need no GPU: validation runs first).

CI compiles a representative subset per arch (every kernel kind, every decoder family, both
compute dtypes, 2- and 3-word lane geometries, split and direct epilogues); the exhaustive sweep
over :func:`b12x.support.kernel_specializations` is marked ``slow``.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

from b12x import support
from b12x.dense_linear import trellis_linear
from b12x.formats import FORMATS
from b12x.kernels import host
from b12x.kernels.specs import KernelSpec


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


@pytest.mark.parametrize("arch", support.ARCHES)
@pytest.mark.parametrize(
    "spec", support.representative_specializations(), ids=lambda s: f"{s.kind}-{s.codebook}"
)
def test_representative_specializations_compile(spec, arch):
    _check_report(spec, arch, _report(spec, arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", support.ARCHES)
def test_every_specialization_compiles(arch, request):
    # ~350 compiles per arch (minutes): opt-in with `-m slow`, never part of the default run.
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("exhaustive compile sweep runs only when selected with -m slow")
    for spec in support.kernel_specializations():
        _check_report(spec, arch, _report(spec, arch))


def test_decoder_families_emit_their_instructions():
    ptx = {
        name: _report(
            KernelSpec("gemm", name, fmt.legal_bits[0], m_tiles=1, n_tiles=2), "sm_90"
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
        KernelSpec("gemm", "mcg")


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


def test_trellis_linear_rejects_bad_inputs():
    payload, suh, svh = _layer()
    x = torch.zeros(2, 256, dtype=torch.float16)
    with pytest.raises(TypeError, match="x: expected dtype"):
        trellis_linear(x.float(), payload, suh, svh, codebook="mcg")
    with pytest.raises(TypeError, match="trellis"):
        trellis_linear(x, payload.to(torch.int32), suh, svh, codebook="mcg")
    with pytest.raises(ValueError, match="bits"):
        trellis_linear(x, payload, suh, svh, codebook="sqg_fp16")
    with pytest.raises(ValueError, match="codebook"):
        trellis_linear(x, payload, suh, svh, codebook="exl2")
    with pytest.raises(ValueError, match="x: expected 256 features"):
        trellis_linear(x[:, :128].contiguous(), payload, suh, svh, codebook="mcg")
    with pytest.raises(ValueError, match="suh"):
        trellis_linear(x, payload, suh[:128].contiguous(), svh, codebook="mcg")
    with pytest.raises(ValueError, match="x: must be contiguous"):
        trellis_linear(
            torch.zeros(256, 2, dtype=torch.float16).t(), payload, suh, svh, codebook="mcg"
        )
    with pytest.raises(ValueError, match="16-byte aligned"):
        trellis_linear(
            torch.zeros(2 * 256 + 1, dtype=torch.float16)[1:].view(2, 256),
            payload,
            suh,
            svh,
            codebook="mcg",
        )
    with pytest.raises(TypeError, match="compute_dtype"):
        trellis_linear(x, payload, suh, svh, codebook="mcg", compute_dtype=torch.float32)
    with pytest.raises(ValueError, match="multiples of 128"):
        p2, s2, v2 = _layer(k=64, n=128)
        trellis_linear(torch.zeros(2, 64, dtype=torch.float16), p2, s2, v2, codebook="mcg")
    with pytest.raises(ValueError, match="x: expected a CUDA tensor"):
        trellis_linear(x, payload, suh, svh, codebook="mcg")
    with pytest.raises(ValueError, match="path"):
        trellis_linear(x, payload, suh, svh, codebook="mcg", path="fast")


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
