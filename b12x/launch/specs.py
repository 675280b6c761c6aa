"""Compile specifications of every kernel in :mod:`b12x.kernels`, and how one spec compiles.

Layout
------
* :class:`KernelSpec` is a frozen dataclass holding *every* codegen input of one kernel
  specialisation (kind, the codebook's :class:`~b12x.formats.DecodeFormat` object, bits, dtype
  flags, tile shape, unroll, register stages ``depth``, shared-memory ring stages
  ``smem_stages``). With the target arch,
  the DSL version, the ABI version and the kernel source hash it makes the structural
  :class:`~b12x.runtime.compile_cache.CompileKey`: two specs that compile differently are never
  equal.
* :func:`build_kernel` maps a spec to its kernel object and the fake (symbolic-shape) arguments
  that :func:`cute.compile` needs; :func:`compile_spec` compiles it with ``--enable-tvm-ffi`` at
  the first spill-free optimisation level. The same builder serves CPU compile checks
  (:mod:`b12x.support`) and GPU launches.
  :meth:`KernelSpec.compile_for` is that compile as the spec's own builder: the runtime cache
  calls it for a ``KernelSpec`` (this module imports the runtime cache, never the reverse).
* This module keeps no cache. Launches resolve kernels through
  :func:`b12x.runtime.compile_cache.compiled_kernel` (structural key, one process cache, the
  freeze switch and capture detection); :func:`compiled` and :func:`freeze` are aliases of it
  kept for existing callers.

Invariants
----------
* Fake tensors are int32/fp32 views with symbolic dims and 16-byte alignment; callers pass torch
  tensors viewed the same way (fp16/bf16 pairs as int32, the int16 payload as int32).
* The tvm-ffi path launches on torch's current stream.
* Importing this module loads only the standard library (cutlass and the runtime load lazily).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from b12x.formats import DecodeFormat

__all__ = [
    "KernelSpec",
    "CompileRemarks",
    "CompileResult",
    "build_kernel",
    "compile_with_remarks",
    "compile_spec",
    "compiled",
    "freeze",
    "compile_options",
    "KINDS",
    "OPT_LEVELS",
]

KINDS = ("decode", "gemm", "reduce", "rotate_in", "rotate_out")


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

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")
        if isinstance(self.fmt, str):
            from b12x.formats import resolve_format

            object.__setattr__(self, "fmt", resolve_format(self.fmt))
        if self.kind in ("decode", "gemm") and (self.fmt is None or self.bits is None):
            raise ValueError(f"codebook/bits: a {self.kind} spec needs both")

    @property
    def codebook(self) -> str | None:
        """The codebook's name (for messages and reports; code uses :attr:`fmt`)."""
        return None if self.fmt is None else self.fmt.name

    @property
    def uses_mma(self) -> bool:
        return self.kind == "gemm"

    def compile_for(self, arch: str):
        """The compiled callable of this spec for ``arch``: :func:`compile_spec`'s ``fn``.

        :func:`b12x.runtime.compile_cache.compiled_kernel` calls it on a miss for a spec that
        brings no builder of its own, so the runtime cache never imports this module.
        """
        return compile_spec(self, arch).fn


#: Optimisation levels tried in order. ptxas occasionally settles at ~80 registers and spills a
#: few bytes at one level but not at another (e.g. mul1 K5 on sm_80 at 3, mcg K8 on sm_90 at 2);
#: :func:`compile_spec` takes the first level whose ptxas report shows zero spill bytes.
OPT_LEVELS = (2, 3, 1)

_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_options(arch: str, *, ptx: bool = False, remarks: bool = False, opt_level: int = 2):
    """The ``cute.compile`` options string: arch first, tvm-ffi, optimisation level, optional
    ``--keep-ptx`` and ptxas remarks, and last ``--dump-dir`` = the process's private
    :func:`b12x.runtime.compile_cache.dump_dir`, so a kept PTX/CUBIN file (this ``ptx=True`` or a
    ``CUTE_DSL_KEEP`` from the environment) never lands in the working directory. A caller's own
    later ``--dump-dir`` wins; with ``CUTE_DSL_DUMP_DIR`` set none is added (the DSL uses it)."""
    opts = [f"--gpu-arch {arch}", "--enable-tvm-ffi", f"--opt-level {opt_level}"]
    if ptx:
        opts.append("--keep-ptx")
    if remarks:
        opts.append("remarks{ptx}")
    from b12x.runtime.compile_cache import dump_dir

    dump = dump_dir()
    if dump is not None:
        opts.append(f"--dump-dir={shlex.quote(str(dump))}")
    return " ".join(opts)


@dataclass(frozen=True)
class CompileResult:
    fn: object
    log: str
    registers: int | None
    spill_bytes: int | None
    opt_level: int


@dataclass(frozen=True)
class CompileRemarks:
    """One ``cute.compile`` of a built kernel with ptxas remarks: the compiled callable, the PTX
    (when asked), the registers and the spill bytes (stores + loads) of every reported function,
    and the compiler's log."""

    fn: object
    ptx: str
    registers: tuple[int, ...]
    spills: tuple[int, ...]
    log: str


def compile_with_remarks(
    kernel, args, arch: str, *, ptx: bool = True, opt_level: int = 2
) -> CompileRemarks:
    """Compile ``kernel`` with its fake argument tuple ``args`` (what every ``build_*`` of the
    kernel modules returns) for ``arch`` on any machine, capturing the ptxas remarks."""
    import cutlass.cute as cute

    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        opts = compile_options(arch, ptx=ptx, remarks=True, opt_level=opt_level)
        fn = cute.compile(kernel, *args, options=opts)
    text = log.getvalue()
    return CompileRemarks(
        fn=fn,
        ptx=(fn.artifacts.PTX or "") if ptx else "",
        registers=tuple(int(x) for x in _REGS.findall(text)),
        spills=tuple(int(a) + int(b) for a, b in _SPILL.findall(text)),
        log=text,
    )


def compile_spec(spec: KernelSpec, arch: str, *, ptx: bool = False) -> CompileResult:
    """Compile ``spec`` for ``arch`` (fake tensors), preferring a spill-free optimisation level.

    Deterministic: the same compiler gives the same level. If every level spills, the first
    level's result is returned and its spill bytes are reported.
    """
    results = []
    for level in OPT_LEVELS:
        remarks = compile_with_remarks(*build_kernel(spec), arch, ptx=ptx, opt_level=level)
        result = CompileResult(
            fn=remarks.fn,
            log=remarks.log,
            registers=max(remarks.registers) if remarks.registers else None,
            spill_bytes=sum(remarks.spills) if remarks.spills else None,
            opt_level=level,
        )
        if result.spill_bytes == 0:
            return result
        results.append(result)
    return results[0]


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
        kernel = TrellisDecodeKernel(fmt, spec.bits, warps_per_cta=spec.warps)
        return kernel, (payload, out, Int64(0), stream)
    if spec.kind == "gemm":
        from b12x.kernels.dense_gemm import DenseTrellisGemmKernel

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
        kernel = DenseTrellisGemmKernel(
            fmt,
            spec.bits,
            bf16=spec.bf16,
            m_tiles=spec.m_tiles,
            n_tiles=spec.n_tiles,
            warps=spec.warps,
            write_partials=spec.write_partials,
            unroll=spec.unroll,
            depth=spec.depth,
            smem_stages=spec.smem_stages,
        )
        return kernel, (a, payload, out, Int64(0), Int32(1), Int32(1), stream)
    if spec.kind == "reduce":
        from b12x.kernels.dense_gemm import SplitKReduceKernel

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


def freeze(frozen: bool = True) -> None:
    """Alias of :func:`b12x.runtime.compile_cache.freeze` (``False``: ``unfreeze``).

    There is no second switch here: kernels resolve only through the runtime cache.
    """
    from b12x.runtime import compile_cache

    if frozen:
        compile_cache.freeze()
    else:
        compile_cache.unfreeze()


def compiled(spec: KernelSpec, arch: str):
    """Alias of :func:`b12x.runtime.compile_cache.compiled_kernel` (one cache per process)."""
    from b12x.runtime import compile_cache

    return compile_cache.compiled_kernel(spec, arch)
