"""What the b12x trellis kernels support, and CPU compile reports for each specialisation.

Layout
------
* :func:`supported_variants` lists ``{"op", "codebook", "bits", "compute_dtype"}`` dicts: the
  decode kernel (fp16 output) and the dense trellis linear (fp16 and bf16 compute) for every
  legal (codebook, bits) of the kernel registry :mod:`b12x.formats`.
* :func:`kernel_specializations` lists every :class:`~b12x.kernels.specs.KernelSpec` the host
  wrappers can launch (decode, GEMM per tile shape and split mode, split-K reduce, rotations).
  :func:`representative_specializations` is a small subset that still touches every kernel kind,
  codebook family, both compute dtypes and both window geometries (2- and 3-word lanes).
* :func:`supported_moe_variants` (re-exported from :mod:`b12x.moe.support`) lists the fused
  MoE's variants (uniform, K3/K4 tiers, QSRT pairs); the oracle merges it into coverage.
* :func:`compile_specialization` compiles one spec for one arch on the CPU with fake tensors and
  returns a :class:`CompileReport` (PTX text, registers and spill bytes parsed from ptxas's
  ``remarks{ptx}`` report, which the DSL prints and we capture).

Invariants
----------
* Compiling needs no GPU: the arch comes from ``--gpu-arch``; nothing is launched.
* Imports of cutlass happen lazily inside the functions that compile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from b12x.formats import FORMATS
from b12x.kernels.specs import KernelSpec, compile_spec
from b12x.moe.support import supported_moe_variants  # the MoE kernels' own list (oracle reads it)

__all__ = [
    "CompileReport",
    "supported_variants",
    "kernel_specializations",
    "representative_specializations",
    "compile_specialization",
    "supported_moe_variants",
    "GEMM_TILES",
    "ARCHES",
]

ARCHES = ("sm_80", "sm_90", "sm_120")
#: (m_tiles, n_tiles) per warp used by :func:`b12x.kernels.host.choose_tiles`.
GEMM_TILES = ((1, 4), (2, 4), (1, 2), (2, 2), (4, 2))
COMPUTE_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class CompileReport:
    ptx: str
    registers: int | None
    spill_bytes: int | None
    log: str = ""


def supported_variants() -> list[dict]:
    out = []
    for name, fmt in FORMATS.items():
        for bits in fmt.legal_bits:
            out.append({"op": "decode", "codebook": name, "bits": bits, "compute_dtype": "float16"})
            for dtype in COMPUTE_DTYPES:
                out.append(
                    {"op": "dense_linear", "codebook": name, "bits": bits, "compute_dtype": dtype}
                )
    return out


def kernel_specializations() -> list[KernelSpec]:
    specs = []
    for name, fmt in FORMATS.items():
        for bits in fmt.legal_bits:
            specs.append(KernelSpec("decode", name, bits))
            for bf16 in (False, True):
                for m_tiles, n_tiles in GEMM_TILES:
                    for partials in (False, True):
                        specs.append(
                            KernelSpec(
                                "gemm",
                                name,
                                bits,
                                bf16=bf16,
                                m_tiles=m_tiles,
                                n_tiles=n_tiles,
                                write_partials=partials,
                            )
                        )
    for bf16 in (False, True):
        specs.append(KernelSpec("reduce", bf16=bf16))
    for kind in ("rotate_in", "rotate_out"):
        for in_bf16 in (False, True):
            for out_bf16 in (False, True):
                specs.append(KernelSpec(kind, in_bf16=in_bf16, out_bf16=out_bf16))
    return specs


def representative_specializations() -> list[KernelSpec]:
    """Every kernel kind and decoder family, both dtypes, 2- and 3-word lane geometries."""
    return [
        KernelSpec("decode", "sqg_e4m3", 3),
        KernelSpec("decode", "sqg_fp16", 6),
        KernelSpec("gemm", "mcg", 4, m_tiles=1, n_tiles=4),
        KernelSpec("gemm", "mcg", 6, bf16=True, m_tiles=4, n_tiles=2, write_partials=True),
        KernelSpec("gemm", "sqg_e4m3", 2, m_tiles=2, n_tiles=4, write_partials=True),
        KernelSpec("gemm", "sqg_fp16", 5, bf16=True, m_tiles=1, n_tiles=4),
        KernelSpec("gemm", "mul1", 8, m_tiles=1, n_tiles=4),
        KernelSpec("gemm", "3inst", 3, m_tiles=1, n_tiles=2, write_partials=True),
        KernelSpec("reduce", bf16=True),
        KernelSpec("rotate_in", in_bf16=True, out_bf16=True),
        KernelSpec("rotate_out", in_bf16=False, out_bf16=False),
    ]


def compile_specialization(spec: KernelSpec, arch: str) -> CompileReport:
    """Compile ``spec`` for ``arch`` on the CPU; report PTX, registers and spill bytes."""
    if not isinstance(spec, KernelSpec):
        raise TypeError(f"spec: expected KernelSpec, got {type(spec).__name__}")
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d+a?", arch):
        raise ValueError(f"arch: expected something like 'sm_90', got {arch!r}")
    result = compile_spec(spec, arch, ptx=True)
    return CompileReport(
        ptx=result.fn.artifacts.PTX or "",
        registers=result.registers,
        spill_bytes=result.spill_bytes,
        log=result.log,
    )
