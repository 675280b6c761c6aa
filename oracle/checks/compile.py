"""Kernel compile checks (README.md): every b12x specialization compiles for sm_80/sm_90/sm_120.

Through ``b12x.support`` (imported lazily): ``compile_specialization(spec, arch)`` returns PTX
text, register count and spill bytes. Per specialization (one result, all arches):

* it compiles for each of :data:`ARCHES` on the CPU (no GPU needed);
* GEMM kernels (``spec.uses_mma``: dense ``gemm`` and the grouped ``MoeGemmSpec``; else
  ``spec.kind == "gemm"``) contain ``mma.sync.aligned.m16n8k16`` in their PTX
  (the warp-level tensor-core path of §1.5);
* spill bytes are zero (an unparsed spill report is a failure: unknown is not zero).

The default job compiles ``representative_specializations()`` when b12x declares it (every kernel
kind, codebook family, dtype and window geometry), else every ``kernel_specializations()``;
``all_specs=True`` forces the full list. A wall-clock budget (``budget_s``, 0 = none) bounds
the job: what it could not reach is one ``skip`` saying how many were left and how to run them.

Compile summaries are cached in ``<results>/.compile_cache.json`` keyed by a SHA-256 of every
b12x source file plus the DSL version (:func:`source_fingerprint`), the spec's repr and the
arch, so an unchanged tree is not recompiled; any source change recompiles everything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import re
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from oracle.checks.interrupts import deferred_sigint
from oracle.report.report import CheckResult

__all__ = ["ARCHES", "MMA", "run", "spec_name"]

ARCHES = ("sm_80", "sm_90", "sm_120")
MMA = "mma.sync.aligned.m16n8k16"
#: The default job's compile budget. Chosen by measurement: docs/evidence/oracle-compile-budget.md
DEFAULT_BUDGET_S = 150.0
CACHE_NAME = ".compile_cache.json"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def source_fingerprint(support: Any) -> str:
    """SHA-256 over every b12x source file and the DSL version: the compile cache's key prefix."""
    root = Path(support.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    try:
        digest.update(version("nvidia-cutlass-dsl").encode())
    except Exception:  # noqa: BLE001 - an unknown version only weakens reuse, never correctness
        digest.update(b"unknown-dsl")
    return digest.hexdigest()


class _Cache:
    """Per-(spec, arch) compile summaries under the results dir, keyed by the source fingerprint.

    Only the summary (PTX has the MMA, registers, spill bytes, error) is kept; any change to a b12x
    source file or the DSL version changes the prefix and recompiles everything."""

    def __init__(self, path: Path | None, prefix: str):
        self.path, self.prefix = path, prefix
        self.data: dict[str, Any] = {}
        if path is not None and path.is_file():
            try:
                self.data = json.loads(path.read_text())
            except ValueError:
                self.data = {}

    def key(self, spec: Any, arch: str) -> str:
        return f"{self.prefix}|{spec!r}|{arch}"

    def save(self) -> None:
        if self.path is not None:
            live = {k: v for k, v in self.data.items() if k.startswith(self.prefix)}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(live, indent=1, sort_keys=True))


def spec_name(spec: Any) -> str:
    """``compile.<kind>[.<field>=<value>...]`` from the spec's non-default fields."""
    if dataclasses.is_dataclass(spec):
        parts = [str(getattr(spec, "kind", type(spec).__name__))]
        for f in dataclasses.fields(spec):
            value = getattr(spec, f.name)
            if f.name != "kind" and value != f.default and value is not None:
                parts.append(f"{f.name}={value}")
        return "compile." + ".".join(parts)
    return f"compile.{spec}"


def _field(report: Any, name: str) -> Any:
    return report.get(name) if isinstance(report, dict) else getattr(report, name, None)


def _compile_summary(support: Any, spec: Any, arch: str) -> dict[str, Any]:
    try:
        report = support.compile_specialization(spec, arch)
    except Exception as exc:  # noqa: BLE001 - a compile error is this check's failure
        return {"error": f"compile raised {type(exc).__name__}: {_ANSI.sub('', str(exc))[:200]}"}
    ptx = _field(report, "ptx") or ""
    return {
        "has_mma": MMA in ptx,
        "registers": _field(report, "registers"),
        "spill_bytes": _field(report, "spill_bytes"),
        "ptx_chars": len(ptx),
    }


def _check_spec(support: Any, spec: Any, arches: tuple[str, ...], cache: _Cache) -> CheckResult:
    failures: list[str] = []
    metrics: dict[str, Any] = {}
    uses_mma = getattr(spec, "uses_mma", None)  # KernelSpec, MoeGemmSpec; else by kind
    is_gemm = uses_mma if isinstance(uses_mma, bool) else getattr(spec, "kind", "") == "gemm"
    for arch in arches:
        key = cache.key(spec, arch)
        summary = cache.data.get(key)
        if summary is None:
            summary = cache.data[key] = _compile_summary(support, spec, arch)
        metrics[arch] = summary
        if "error" in summary:
            failures.append(f"{arch}: {summary['error']}")
            continue
        spills = summary["spill_bytes"]
        if is_gemm and not summary["has_mma"]:
            failures.append(f"{arch}: GEMM PTX lacks {MMA}")
        if spills is None:
            failures.append(f"{arch}: no spill report parsed from ptxas")
        elif spills:
            failures.append(f"{arch}: {spills} spill bytes")
    status = "fail" if failures else "pass"
    return CheckResult(spec_name(spec), "cpu", status, "; ".join(failures), metrics)


def run(
    ctx=None,
    *,
    all_specs: bool = False,
    budget_s: float | None = None,
    arches: tuple[str, ...] = ARCHES,
    specs: list[Any] | None = None,
) -> list[CheckResult]:
    """Compile checks; ``specs`` overrides the list b12x declares (e.g. one tile's specs)."""
    try:
        support = importlib.import_module("b12x.support")
    except ImportError as exc:
        why = f"b12x.support is not importable yet ({exc})"
        return [CheckResult("compile", "cpu", "skip", why)]
    if not callable(getattr(support, "compile_specialization", None)):
        why = "b12x.support declares no compile_specialization() yet"
        return [CheckResult("compile", "cpu", "skip", why)]
    if specs is None:
        lister = getattr(support, "representative_specializations", None)
        if all_specs or getattr(ctx, "all_specs", False) or not callable(lister):
            lister = getattr(support, "kernel_specializations", None)
        if not callable(lister):
            why = "b12x.support declares no kernel_specializations() yet"
            return [CheckResult("compile", "cpu", "skip", why)]
        specs = list(lister())
    if not specs:
        why = "no kernel specializations declared for this selection"
        return [CheckResult("compile", "cpu", "skip", why)]
    if budget_s is None:
        budget_s = getattr(ctx, "compile_budget_s", DEFAULT_BUDGET_S)
    advance = ctx.advance("compile", len(specs)) if ctx is not None else (lambda: None)
    results_dir = getattr(ctx, "results_dir", None)
    cache_path = Path(results_dir) / CACHE_NAME if results_dir else None
    cache = _Cache(cache_path, source_fingerprint(support))
    start = time.monotonic()
    out = []
    try:
        with deferred_sigint() as interrupt:  # never unwind through the compiler's C++ frames
            for i, spec in enumerate(specs):
                interrupt.check()
                if budget_s > 0 and time.monotonic() - start > budget_s:
                    why = (
                        f"time budget {budget_s:.0f} s spent; {len(specs) - i} of {len(specs)} "
                        "specializations not compiled (python -m oracle run --compile-all "
                        "--compile-budget 0 compiles all)"
                    )
                    out.append(CheckResult("compile.budget", "cpu", "skip", why))
                    break
                out.append(_check_spec(support, spec, arches, cache))
                advance()
    finally:
        cache.save()  # what was compiled before an interrupt is kept
    return out
