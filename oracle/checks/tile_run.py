"""``python -m oracle run --tile KxNxT``: the checks of one tile, strict.

Layout
------
* :func:`tile_qualification` pins the tile on every declared problem and simulated device
  (:func:`oracle.checks.dispatch_tiles.qualify_tile`) and makes the result strict: a tile no
  registry recognises, that is no declared entry or that qualifies nowhere fails.
* :func:`tile_specializations` asks each tile registry's ``specializations(tile)`` hook
  (:data:`SPECIALIZATIONS_HOOK`) for the kernel specialisations a launch with the tile compiles,
  narrowed to a codebook / bits; :func:`representative_tile_subset` is what is compiled when
  neither is given.
* :func:`tile_checks` runs the three steps — qualify, compile on CPU for every arch (each row
  with registers, spills and MMA: :func:`compile_line`), and on a GPU the grid cases pinned to
  the tile — and :func:`oracle.checks.gpu.skipped` stands for the GPU families where no GPU
  runs.

Invariants
----------
Nothing about a tile passes without compiling: no specialisation, a skipped compile, a crash or
no qualifying grid case is a ``fail``.
"""

from __future__ import annotations

from typing import Any

from oracle import checks
from oracle.checks import compile as compile_checks
from oracle.checks import gpu
from oracle.checks.dispatch_tiles import declared, parse_tile, qualify_tile
from oracle.report.report import CheckResult


def tile_registries() -> tuple[list[Any], str]:
    registries, why = declared("tile_registries")
    return (registries or []), why


def tile_qualification(text: str, registries: list[Any] | None = None) -> list[Any]:
    """``tile.*`` results of pinning ``text`` on every declared problem and simulated device
    (:func:`oracle.checks.dispatch_tiles.qualify_tile`), made strict: a tile that no registry
    recognises, that is not a declared entry, or that qualifies at no (problem, device) point
    is a ``fail``, never a pass or a skip."""
    if registries is None:
        registries, why = tile_registries()
        if not registries:
            return [CheckResult(f"tile.{text}", "cpu", "fail", f"no tile registry: {why}")]
    out = []
    recognised = False
    for result in qualify_tile(text, registries):
        if result.status == "skip":  # "not a tile of this registry"
            continue
        recognised = True
        accepted = result.metrics.get("accepted")
        if result.status == "pass" and not accepted:
            rejected = result.metrics.get("rejected") or []
            first = f"; e.g. {rejected[0]}" if rejected else ""
            result = CheckResult(
                result.name,
                "cpu",
                "fail",
                f"qualifies for no (problem, device) point{first}",
                result.metrics,
            )
        out.append(result)
    if not recognised:
        names = ", ".join(getattr(r, "name", "?") for r in registries)
        out.append(
            CheckResult(f"tile.{text}", "cpu", "fail", f"no tile registry ({names}) reads it")
        )
    return out


#: The hook a tile registry declares so that ``run --tile`` can compile what a tile runs.
SPECIALIZATIONS_HOOK = "specializations"


def tile_specializations(
    text: str,
    *,
    codebook: str | None = None,
    bits: int | None = None,
    registries: list[Any] | None = None,
) -> tuple[list[Any], str]:
    """``(specs, "")`` the registries map tile ``text`` to, narrowed to ``codebook``/``bits``
    (specs without a codebook — reductions, rotations — are kept), or ``([], reason)``.

    Hook (optional on each registry): ``registry.specializations(tile) -> Iterable[spec]``, every
    kernel specialisation (``b12x.launch.specs.KernelSpec``) a launch with ``tile`` compiles."""
    spec = parse_tile(text)
    if registries is None:
        registries, why = tile_registries()
        if not registries:
            return [], f"no tile registry: {why}"
    found: list[Any] = []
    hooks = []
    for registry in registries:
        hook = getattr(registry, SPECIALIZATIONS_HOOK, None)
        if not callable(hook):
            continue
        hooks.append(registry.name)
        try:
            tile = registry.deserialize(spec)
        except Exception:  # noqa: BLE001 - not this registry's tile
            continue
        if tile in registry.entries:
            found.extend(hook(tile))
    if not hooks:
        names = ", ".join(getattr(r, "name", "?") for r in registries)
        return [], (
            f"maps to no specialisation: no tile registry ({names}) declares "
            f"{SPECIALIZATIONS_HOOK}(tile) -> Iterable[KernelSpec]"
        )
    if not found:
        return [], f"maps to no specialisation in {', '.join(hooks)}"
    narrowed = [
        s
        for s in found
        if (codebook is None or getattr(s, "codebook", None) in (None, codebook))
        and (bits is None or getattr(s, "bits", None) in (None, bits))
    ]
    if not any(getattr(s, "codebook", None) is not None for s in narrowed) and (
        codebook is not None or bits is not None
    ):
        offered: dict[str, set[int]] = {}
        for s in found:
            if getattr(s, "codebook", None) is not None:
                offered.setdefault(s.codebook, set()).add(s.bits)
        listing = "; ".join(
            f"{name} bits {','.join(map(str, sorted(b)))}" for name, b in sorted(offered.items())
        )
        return [], (
            f"has no specialisation for codebook={codebook} bits={bits} "
            f"(it has: {listing or 'none'})"
        )
    return list(dict.fromkeys(narrowed)), ""


def representative_tile_subset(specs: list[Any]) -> list[Any]:
    """The specs a ``--tile`` run compiles without ``--codebook``/``--bits``: for each codebook its
    highest bits, the largest ``m_tiles`` paired with each ``n_tiles`` there, every other field
    (both dtypes, partials on and off, ...) as given; specs without a codebook (the split-K
    reduce) are all kept. Order is kept."""

    def attr(spec: Any, name: str) -> Any:
        return getattr(spec, name, None)

    top_bits: dict[Any, Any] = {}
    for s in specs:
        cb = attr(s, "codebook")
        if cb is not None and attr(s, "bits") is not None:
            top_bits[cb] = max(top_bits.get(cb, attr(s, "bits")), attr(s, "bits"))
    kept = [s for s in specs if attr(s, "codebook") is None or attr(s, "bits") == top_bits.get(
        attr(s, "codebook"))]  # fmt: skip
    top_m: dict[Any, int] = {}
    for s in kept:
        key = (attr(s, "codebook"), attr(s, "n_tiles"))
        if attr(s, "m_tiles") is not None:
            top_m[key] = max(top_m.get(key, 0), attr(s, "m_tiles"))
    return [
        s
        for s in kept
        if attr(s, "m_tiles") is None
        or attr(s, "m_tiles") == top_m[(attr(s, "codebook"), attr(s, "n_tiles"))]
    ]


def compile_line(metrics: dict[str, Any]) -> str:
    parts = []
    for arch, summary in metrics.items():
        if not isinstance(summary, dict) or "error" in summary:
            continue
        mma = "mma" if summary.get("has_mma") else "no mma"
        parts.append(
            f"{arch}: {summary.get('registers')} regs, {summary.get('spill_bytes')} B spill, {mma}"
        )
    return "; ".join(parts)


def tile_checks(
    ctx: Any, *, text: str, tile: tuple[int, int, int], codebook: str | None, bits: int | None
) -> list[Any]:
    """qualify (strict) → compile its specialisations on CPU (strict) → on a GPU, the grid
    cases pinned to the tile (:func:`oracle.run.grid.select_grid` ``tile=``: none is a fail)."""
    label = "x".join(map(str, tile))
    try:
        out = tile_qualification(text)
        specs, why = tile_specializations(text, codebook=codebook, bits=bits)
        total = len(specs)
        subset = bool(specs) and codebook is None and bits is None
        if subset:
            specs = representative_tile_subset(specs)
        compiled = compile_checks.run(ctx, specs=specs, budget_s=0) if specs else []
    except Exception as exc:  # noqa: BLE001 - a crash is the tile's failure, shown in the report
        why = f"crashed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return [
            CheckResult(f"tile.{label}", "cpu", "fail", why),
            *gpu.skipped(ctx, f".tile_{label}"),
        ]
    if not specs:
        out.append(CheckResult(f"compile.tile_{label}", "cpu", "fail", f"tile {label} {why}"))
    else:
        rows = []
        for result in compiled:
            if result.status == "skip":
                result = CheckResult(
                    result.name, "cpu", "fail", f"not compiled: {result.reason}", result.metrics
                )
            elif result.status == "pass":
                result = CheckResult(
                    result.name, "cpu", "pass", compile_line(result.metrics), result.metrics
                )
            rows.append(result)
        failed = sum(r.status != "pass" for r in rows)
        arches = len(compile_checks.ARCHES)
        if subset:
            scope = (
                f"representative subset, {len(specs)} of {total} (each codebook's highest bits, "
                "both dtypes, the largest m_tiles, partials on and off, the reduce): pass "
                "--codebook/--bits for others"
            )
        else:
            narrowed = ", ".join(
                f"{k}={v}" for k, v in (("codebook", codebook), ("bits", bits)) if v
            )
            scope = f"all {len(specs)} for {narrowed}"
        summary = (
            f"tile {label}: {len(specs) - failed} of {len(specs)} specialisation(s) compile for "
            f"{arches} arches, spill-free, MMA in every GEMM ({scope})"
        )
        # the first row of the tile's compile block: what was (and was not) compiled
        out.append(CheckResult(f"compile.tile_{label}", "cpu", "fail" if failed else "pass",
                               summary, {"compiled": len(specs), "declared": total}))  # fmt: skip
        out += rows
    if not (ctx.cuda and ctx.tier == "gpu"):
        return out + gpu.skipped(ctx, f".tile_{label}")
    return out + checks.run_family("gpu", ctx)
