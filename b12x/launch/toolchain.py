"""The compile toolchain every kernel kind shares: options, ptxas remarks, the spill-free level.

Layout
------
* :func:`compile_options` — the ``cute.compile`` options string (arch first, tvm-ffi, the
  optimisation level, optional ``--keep-ptx`` / ptxas remarks, the private ``--dump-dir``).
* :func:`compile_with_remarks` — one compile of a built kernel with ptxas remarks:
  :class:`CompileRemarks` (callable, PTX, registers and spill bytes per function, log).
* :func:`compile_spill_free` — the first optimisation level of :data:`OPT_LEVELS` whose ptxas
  report shows no spill, for any builder: :class:`CompileResult`.

Invariants
----------
* A builder is anything returning ``(kernel object, fake argument tuple)``: the builders of
  :mod:`b12x.launch.kinds`. This module knows no spec, kernel or kind, keeps no cache and
  resolves nothing (:func:`b12x.launch.kinds.compiled` does).
* Importing it loads only the standard library (cutlass and the runtime load lazily). It is in
  every kind's hashed sources (through :mod:`b12x.launch.kinds`): options are codegen too.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "OPT_LEVELS",
    "CompileRemarks",
    "CompileResult",
    "compile_options",
    "compile_spill_free",
    "compile_with_remarks",
]

#: Optimisation levels tried in order. ptxas occasionally settles at ~80 registers and spills a
#: few bytes at one level but not at another (e.g. mul1 K5 on sm_80 at 3, mcg K8 on sm_90 at 2);
#: :func:`compile_spill_free` takes the first level whose ptxas report shows zero spill bytes.
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


def compile_spill_free(
    build: Callable[[], tuple], arch: str, *, ptx: bool = False
) -> CompileResult:
    """Compile what ``build()`` returns (kernel object, fake argument tuple) for ``arch`` at the
    first optimisation level of :data:`OPT_LEVELS` whose ptxas report shows no spill.

    ``build`` is called once per level tried (a traced kernel object is not reused).
    Deterministic: the same compiler gives the same level. If every level spills, the first
    level's result is returned and its spill bytes are reported.
    """
    results = []
    for level in OPT_LEVELS:
        remarks = compile_with_remarks(*build(), arch, ptx=ptx, opt_level=level)
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
