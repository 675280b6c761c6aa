"""The dense kernels' spec, their builder, and how one such spec compiles.

Layout
------
* :class:`KernelSpec` is a frozen dataclass holding *every* codegen input of one dense kernel
  specialisation (kind, the codebook's :class:`~b12x.formats.DecodeFormat` object, bits, dtype
  flags and, for a GEMM, its :class:`~b12x.kernels.geometry.GemmGeometry` and whether it writes
  split-K partials; :func:`gemm_spec` picks the GEMM kind from the geometry's schedule). Its
  ``kind`` is one of :data:`KERNEL_SPEC_KINDS`, each a kind of the
  registry :mod:`b12x.launch.kinds`, which makes the structural
  :class:`~b12x.runtime.compile_cache.CompileKey` from it: two specs that compile differently
  are never equal.
* :func:`build_kernel` maps a spec to its kernel object and the fake (symbolic-shape) arguments
  that :func:`cute.compile` needs (the registry's builder of the five dense kinds); the same
  builder serves CPU compile checks (:mod:`b12x.support`) and GPU launches.
* :func:`compile_spec` compiles a spec at its first spill-free optimisation level
  (:func:`b12x.launch.toolchain.compile_spill_free` of :func:`build_kernel`), with the PTX when
  asked: the CPU compile checks' door (:mod:`b12x.support`).
* This module keeps no cache and resolves nothing: launches go through
  :func:`b12x.launch.kinds.compiled` (structural key, the one process cache, the freeze switch
  and capture detection).

Invariants
----------
* Fake tensors are int32/fp32 views with symbolic dims and 16-byte alignment; callers pass torch
  tensors viewed the same way (fp16/bf16 pairs as int32, the int16 payload as int32).
* The tvm-ffi path launches on torch's current stream.
* Importing this module loads only the standard library (cutlass and the runtime load lazily).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from b12x.launch.toolchain import CompileResult, compile_spill_free

if TYPE_CHECKING:
    from b12x.formats import DecodeFormat
    from b12x.kernels.geometry import GemmGeometry

__all__ = [
    "KERNEL_SPEC_KINDS",
    "KernelSpec",
    "build_kernel",
    "gemm_spec",
    "compile_spec",
]

#: The values of :attr:`KernelSpec.kind`: the registry's kinds whose spec is a ``KernelSpec``
#: (``tests/b12x/test_kinds.py`` keeps the two equal).
KERNEL_SPEC_KINDS = ("decode", "gemm", "gemm_stream_k", "reduce", "rotate_in", "rotate_out")

#: The kinds that run a trellis GEMM (``gemm_stream_k``: a ``wgmma`` mainloop on a stream-K
#: schedule, :mod:`b12x.kernels.stream_k`).
_GEMM_KINDS = ("gemm", "gemm_stream_k")
#: Warps per CTA of the decode and rotation kernels.
_ELEMENTWISE_WARPS = 4


@dataclass(frozen=True)
class KernelSpec:
    """Every codegen input of one kernel specialisation (the arch is added by the caller)."""

    kind: str
    #: The codebook's :class:`~b12x.formats.DecodeFormat` (decode/gemm). A name given here (the
    #: form external callers such as the oracle and benchmarks use) is resolved once, in
    #: ``__post_init__``; inside ``b12x`` callers pass the format object they already hold.
    fmt: DecodeFormat | None = None
    bits: int | None = None
    bf16: bool = False
    in_bf16: bool = False
    out_bf16: bool = False
    #: gemm kinds only (required there): the launch shape (:mod:`b12x.kernels.geometry`);
    #: ``gemm_stream_k`` exactly when its ``stream_k`` is set.
    geometry: GemmGeometry | None = None
    #: gemm only: write fp32 split-K partials ``[S, M, N]`` instead of the output.
    write_partials: bool = False

    def __post_init__(self):
        if self.kind not in KERNEL_SPEC_KINDS:
            raise ValueError(f"kind: expected one of {KERNEL_SPEC_KINDS}, got {self.kind!r}")
        from b12x.kernels.geometry import GemmGeometry  # pure Python, no cutlass

        if self.kind in _GEMM_KINDS:
            if not isinstance(self.geometry, GemmGeometry):
                raise ValueError(f"geometry: a {self.kind} spec needs a GemmGeometry")
            if type(self.geometry) is not GemmGeometry:  # a subclass's extra fields: not codegen
                object.__setattr__(self, "geometry", self.geometry.geometry())
            self.geometry.check(bits=self.bits)
            if self.geometry.stream_k != (self.kind == "gemm_stream_k"):
                raise ValueError(
                    "kind: a geometry with stream_k compiles as gemm_stream_k, and only it; got "
                    f"kind {self.kind} with stream_k={self.geometry.stream_k}"
                )
            if self.geometry.stream_k and self.write_partials:
                raise ValueError("write_partials: the stream-K schedule keeps its own partials")
        elif self.geometry is not None:
            raise ValueError(f"geometry: only a gemm spec has one, not {self.kind}")
        if isinstance(self.fmt, str):
            from b12x.formats import resolve_format

            object.__setattr__(self, "fmt", resolve_format(self.fmt))
        if self.kind in ("decode", *_GEMM_KINDS) and (self.fmt is None or self.bits is None):
            raise ValueError(f"codebook/bits: a {self.kind} spec needs both")

    @property
    def m_tiles(self) -> int | None:
        """The geometry's M16 blocks per warp (None without a geometry; for reports)."""
        return None if self.geometry is None else self.geometry.m_tiles

    @property
    def n_tiles(self) -> int | None:
        """The geometry's N16 tiles per warp (None without a geometry; for reports)."""
        return None if self.geometry is None else self.geometry.n_tiles

    @property
    def codebook(self) -> str | None:
        """The codebook's name (for messages and reports; code uses :attr:`fmt`)."""
        return None if self.fmt is None else self.fmt.name

    @property
    def uses_mma(self) -> bool:
        return self.kind in _GEMM_KINDS


def gemm_spec(
    fmt: DecodeFormat | str, bits: int, geometry: GemmGeometry, *, bf16: bool = False,
    write_partials: bool = False,
) -> KernelSpec:  # fmt: skip
    """The GEMM spec of ``geometry``: kind ``gemm_stream_k`` on the stream-K schedule, else
    ``gemm``."""
    kind = "gemm_stream_k" if geometry.stream_k else "gemm"
    return KernelSpec(kind, fmt, bits, bf16=bf16, geometry=geometry, write_partials=write_partials)


def compile_spec(spec: KernelSpec, arch: str, *, ptx: bool = False) -> CompileResult:
    """Compile ``spec`` for ``arch`` (fake tensors) at its spill-free level
    (:func:`compile_spill_free` of :func:`build_kernel`); a ``wgmma`` spec for the
    arch-specific target (:func:`target_arch`)."""
    return compile_spill_free(lambda: build_kernel(spec), target_arch(spec, arch), ptx=ptx)


def target_arch(spec: KernelSpec, arch: str) -> str:
    """The compile target of ``spec`` on a device of ``arch``: ``sm_90a`` for a ``wgmma`` spec on
    sm_90 (the warpgroup MMA exists only in the arch-specific target), else ``arch``. A
    ``wgmma`` spec for any other arch raises ``ValueError`` before a compile is attempted."""
    geometry = getattr(spec, "geometry", None)  # a dense spec's; a MoE spec has its own flag
    wgmma = getattr(spec, "wgmma", False) if geometry is None else geometry.wgmma
    if not wgmma:
        return arch
    if arch not in ("sm_90", "sm_90a"):
        raise ValueError(f"wgmma: the warpgroup MMA needs an sm_90 device, got {arch}")
    return "sm_90a"


def build_kernel(spec: KernelSpec):
    """(kernel object, fake argument tuple) for ``cute.compile``."""
    import cutlass.cute as cute
    from cutlass import Float32, Int16, Int32, Int64
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    def fake(dtype, shape):
        order = tuple(range(len(shape) - 1, -1, -1))
        return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=16)

    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    if spec.kind == "decode":
        from b12x.kernels.trellis_decode import TrellisDecodeKernel

        fmt = spec.fmt
        payload = fake(Int32, (cute.sym_int(), cute.sym_int(), 8 * spec.bits))
        out = fake(Int16, (cute.sym_int(divisibility=16), cute.sym_int(divisibility=16)))
        kernel = TrellisDecodeKernel(
            fmt, spec.bits, warps_per_cta=_ELEMENTWISE_WARPS, out_bf16=spec.out_bf16
        )
        return kernel, (payload, out, Int64(0), stream)
    if spec.kind in _GEMM_KINDS:
        from b12x.kernels.dense_gemm import DenseTrellisGemmKernel
        from b12x.kernels.stream_k import DenseStreamKGemmKernel

        fmt, geometry = spec.fmt, spec.geometry
        m = cute.sym_int()
        a = fake(Int32, (m, cute.sym_int(divisibility=8)))
        n_group = geometry.cta_n
        payload = fake(
            Int32, (cute.sym_int(), cute.sym_int(divisibility=n_group // 16), 8 * spec.bits)
        )
        if spec.write_partials:
            out = fake(Float32, (cute.sym_int(), m, cute.sym_int(divisibility=n_group)))
        else:
            out = fake(Int32, (m, cute.sym_int(divisibility=n_group // 2)))
        if spec.kind == "gemm_stream_k":
            kernel = DenseStreamKGemmKernel(fmt, spec.bits, geometry, bf16=spec.bf16)
            partials = fake(Float32, (cute.sym_int(), kernel.acc_count * kernel.threads))
            flags = fake(Int32, (cute.sym_int(),))
            return kernel, (a, payload, out, partials, flags, Int64(0), Int32(1), stream)
        kernel = DenseTrellisGemmKernel(
            fmt, spec.bits, geometry, bf16=spec.bf16, write_partials=spec.write_partials
        )
        return kernel, (a, payload, out, Int64(0), Int32(1), Int32(1), stream)
    if spec.kind == "reduce":
        from b12x.kernels.split_k_reduce import SplitKReduceKernel

        m = cute.sym_int()
        partials = fake(Float32, (cute.sym_int(), m, cute.sym_int(divisibility=2)))
        out = fake(Int32, (m, cute.sym_int()))
        return SplitKReduceKernel(bf16=spec.bf16), (partials, out, stream)
    from b12x.kernels.hadamard import InputRotationKernel, OutputRotationKernel

    cls = InputRotationKernel if spec.kind == "rotate_in" else OutputRotationKernel
    m = cute.sym_int()
    half = cute.sym_int(divisibility=64)
    x = fake(Int32, (m, half))
    scale = fake(Int32, (half,))
    out = fake(Int32, (m, half))
    return cls(in_bf16=spec.in_bf16, out_bf16=spec.out_bf16, warps=_ELEMENTWISE_WARPS), (
        x,
        scale,
        out,
        stream,
    )
