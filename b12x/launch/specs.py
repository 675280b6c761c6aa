"""The dense kernels' spec, their builder, and how one such spec compiles.

Layout
------
* :class:`KernelSpec` is a frozen dataclass holding *every* codegen input of one dense kernel
  specialisation (kind, the codebook's :class:`~b12x.formats.DecodeFormat` object, bits, dtype
  flags, tile shape, unroll, register stages ``depth``, shared-memory ring stages
  ``smem_stages``). Its ``kind`` is one of :data:`KERNEL_SPEC_KINDS`, each a kind of the
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

__all__ = [
    "KERNEL_SPEC_KINDS",
    "KernelSpec",
    "build_kernel",
    "compile_spec",
]

#: The values of :attr:`KernelSpec.kind`: the registry's kinds whose spec is a ``KernelSpec``
#: (``tests/b12x/test_kinds.py`` keeps the two equal).
KERNEL_SPEC_KINDS = ("decode", "gemm", "gemm_stream_k", "reduce", "rotate_in", "rotate_out")

#: The kinds that run a trellis GEMM (``gemm_stream_k``: a ``wgmma`` mainloop on a stream-K
#: schedule, :mod:`b12x.kernels.stream_k`).
_GEMM_KINDS = ("gemm", "gemm_stream_k")


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
    m_tiles: int = 1
    n_tiles: int = 1
    warps: int = 4
    write_partials: bool = False
    unroll: int = 1
    depth: int = 1
    #: gemm only: 0 = register stages (``depth``), 2..4 = slots of the cp.async shared-memory
    #: ring (``depth`` is then unused); see :mod:`b12x.kernels.dense_gemm`.
    smem_stages: int = 0
    #: gemm only: 0 = each warp decodes the weights it multiplies; >= 1 = the shared-decode
    #: mainloop (the CTA copies each K16 row into ``smem_stages`` cp.async slots, decodes it
    #: once into shared memory, then its warps multiply as an ``m_warps x (warps / m_warps)``
    #: grid), ``shared_rows`` K16 rows per slot.
    m_warps: int = 0
    shared_rows: int = 2
    #: gemm only: the shared decode's consumer is Hopper ``wgmma`` (sm_90a; ``m_warps ==
    #: warps``, :mod:`b12x.kernels.wgmma_decode`) instead of per-warp ``mma.sync``.
    wgmma: bool = False
    #: gemm only (with ``wgmma``): the swap-AB mainloop, weights decoded into ``wgmma``'s
    #: register A operand, ``16·m_tiles`` tokens per CTA as its B (:mod:`b12x.kernels.wgmma_swap`).
    swap_ab: bool = False
    #: gemm only (with ``swap_ab``): CTAs along N sharing each token tile by TMA multicast
    #: (1, 2 or 4; :mod:`b12x.kernels.wgmma_swap`, "Token sharing").
    cluster: int = 1

    def __post_init__(self):
        if self.kind not in KERNEL_SPEC_KINDS:
            raise ValueError(f"kind: expected one of {KERNEL_SPEC_KINDS}, got {self.kind!r}")
        from b12x.kernels.shared_layout import check_dense_mainloop  # pure Python, no cutlass

        if self.swap_ab is not False and self.kind not in _GEMM_KINDS:
            raise ValueError(f"swap_ab: only a gemm spec has the swap-AB mainloop, not {self.kind}")
        check_dense_mainloop(
            swap_ab=self.swap_ab, wgmma=self.wgmma, bits=self.bits, m_tiles=self.m_tiles,
            n_tiles=self.n_tiles, warps=self.warps, m_warps=self.m_warps, rows=self.shared_rows,
            stages=self.smem_stages, cluster=self.cluster,
        )  # fmt: skip
        if self.wgmma and self.kind not in _GEMM_KINDS:
            raise ValueError(f"wgmma: only a gemm spec has the wgmma mainloop, not {self.kind}")
        if self.kind == "gemm_stream_k" and (not self.wgmma or self.write_partials):
            raise ValueError(
                "kind: gemm_stream_k runs a wgmma mainloop only (wgmma, no write_partials)"
            )
        if isinstance(self.fmt, str):
            from b12x.formats import resolve_format

            object.__setattr__(self, "fmt", resolve_format(self.fmt))
        if self.kind in ("decode", *_GEMM_KINDS) and (self.fmt is None or self.bits is None):
            raise ValueError(f"codebook/bits: a {self.kind} spec needs both")

    @property
    def codebook(self) -> str | None:
        """The codebook's name (for messages and reports; code uses :attr:`fmt`)."""
        return None if self.fmt is None else self.fmt.name

    @property
    def uses_mma(self) -> bool:
        return self.kind in _GEMM_KINDS


def compile_spec(spec: KernelSpec, arch: str, *, ptx: bool = False) -> CompileResult:
    """Compile ``spec`` for ``arch`` (fake tensors) at its spill-free level
    (:func:`compile_spill_free` of :func:`build_kernel`); a ``wgmma`` spec for the
    arch-specific target (:func:`target_arch`)."""
    return compile_spill_free(lambda: build_kernel(spec), target_arch(spec, arch), ptx=ptx)


def target_arch(spec: KernelSpec, arch: str) -> str:
    """The compile target of ``spec`` on a device of ``arch``: ``sm_90a`` for a ``wgmma`` spec on
    sm_90 (the warpgroup MMA exists only in the arch-specific target), else ``arch``. A
    ``wgmma`` spec for any other arch raises ``ValueError`` before a compile is attempted."""
    if not getattr(spec, "wgmma", False):
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
            fmt, spec.bits, warps_per_cta=spec.warps, out_bf16=spec.out_bf16
        )
        return kernel, (payload, out, Int64(0), stream)
    if spec.kind in _GEMM_KINDS:
        from b12x.kernels.dense_gemm import DenseTrellisGemmKernel
        from b12x.kernels.stream_k import DenseStreamKGemmKernel

        fmt = spec.fmt
        m = cute.sym_int()
        a = fake(Int32, (m, cute.sym_int(divisibility=8)))
        n_group = 16 * spec.n_tiles * spec.warps
        payload = fake(
            Int32, (cute.sym_int(), cute.sym_int(divisibility=n_group // 16), 8 * spec.bits)
        )
        if spec.write_partials:
            out = fake(Float32, (cute.sym_int(), m, cute.sym_int(divisibility=n_group)))
        else:
            out = fake(Int32, (m, cute.sym_int(divisibility=n_group // 2)))
        geometry = dict(
            bf16=spec.bf16, m_tiles=spec.m_tiles, n_tiles=spec.n_tiles, warps=spec.warps,
            unroll=spec.unroll, depth=spec.depth, smem_stages=spec.smem_stages,
            m_warps=spec.m_warps, shared_rows=spec.shared_rows, wgmma=spec.wgmma,
            swap_ab=spec.swap_ab, cluster=spec.cluster,
        )  # fmt: skip
        if spec.kind == "gemm_stream_k":
            kernel = DenseStreamKGemmKernel(fmt, spec.bits, **geometry)
            partials = fake(Float32, (cute.sym_int(), kernel.acc_count * kernel.threads))
            flags = fake(Int32, (cute.sym_int(),))
            return kernel, (a, payload, out, partials, flags, Int64(0), Int32(1), stream)
        kernel = DenseTrellisGemmKernel(
            fmt, spec.bits, write_partials=spec.write_partials, **geometry
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
    return cls(in_bf16=spec.in_bf16, out_bf16=spec.out_bf16, warps=spec.warps), (
        x,
        scale,
        out,
        stream,
    )
