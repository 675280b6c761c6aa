"""The variant registry (docs/architecture.md): everything that changes decoding, declared once.

Layout:
* :class:`Variant` is a frozen dataclass with eight axes (``codebook``, ``bits``, ``pair_kind``,
  ``rate_axis``, ``tier_layout``, ``rotation``, ``compute_dtype``, ``op``); a value outside an
  axis' vocabulary raises, an *illegal* combination is a property (``legal``,
  ``illegal_reason``; :func:`illegal_variants` enumerates them with their reasons).
* Legality is data: :data:`CODEBOOK_BITS` (spec §1.1/§2, the reference table), :data:`PAIR_KINDS`
  (spec §4.3 record rates, storage order), plus the structural rules in :func:`_illegal_reason`.
* :data:`REGISTRY` (:func:`all_variants`) is *generated* from those tables (legal (codebook,
  bits) × op × rotation × dtype, legal pair kinds × rate axis, the K3/K4 MCG tiers).
* Tolerance overrides per variant: :data:`TOLERANCE_OVERRIDES`, each with a mandatory reason.
* Kernel coverage comes from b12x's typed contract (``b12x.support.OPS`` via
  :mod:`oracle.cases.declared`, imported directly): ``kernel_coverage`` is
  ``"b12x:<op>[<dispatch paths>]"`` when some op declares the variant, else ``no_coverage_reason``
  says why (coupled Hadamard: out of scope).
* MoE in bf16 compute is registered (b12x ships a bf16 arm) and judged against the bf16-rounded
  faithful reference (why: docs/notes/oracle.md).

Invariants:
* ``Variant.name`` is a stable id, ``"<op>/<codebook>/k<bits>[/<pair>][/tiers_<layout>]
  [/rot_<rotation>]/<dtype>"``; the rotation part is omitted when it is the op's default
  (decode: none; dense, moe: full). ``Variant.from_name(v.name) == v`` for every variant, and no
  name contains ``-`` (case ids use ``-`` in place of ``/``).
* Paired variants carry ``bits = 3`` (every pair layout compiles on that base, spec §4.2, §4.4);
  the record rates come from ``pair_kind``.
* Dense/decode pairs need a ``rate_axis`` ("k" or "n"); MoE pairs are phase-bound (spec §4.2),
  ``rate_axis = None``. ``rotation``: "none" = raw ``x @ W``; "full" = EXL3 H128 (§3.2, §3.4);
  "coupled" = coupled Hadamard (§3.5), registered without coverage.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from b12x import support
from oracle.cases import declared
from oracle.judge.tolerance import Tolerance, default_tolerance
from reference import pairs, trellis
from reference.codebooks import state_values

__all__ = [
    "CODEBOOK_BITS",
    "EXECUTION_OPS",
    "OPS",
    "PAIR_KINDS",
    "REGISTRY",
    "TOLERANCE_OVERRIDES",
    "ToleranceOverride",
    "Variant",
    "all_variants",
    "candidate_variants",
    "clear_declarations",
    "declarations",
    "illegal_variants",
    "registry_variant",
    "unmapped",
    "variant_by_name",
]

# --- vocabularies and legality tables (data) -------------------------------------------------

#: Legal trellis bitrates per codebook in the reference (docs/architecture.md, spec §1.1, §2).
CODEBOOK_BITS: Mapping[str, tuple[int, ...]] = {
    "3inst": (1, 2, 3, 4, 5, 6, 7, 8),
    "mcg": (1, 2, 3, 4, 5, 6, 7, 8),
    "mul1": (1, 2, 3, 4, 5, 6, 7, 8),
    "sqg_e4m3": (2, 3, 4),
    "sqg_fp16": (5, 6),
}

#: Pair kind -> (b_lo, b_hi): record 0 / record 1 rates in storage order (spec §4.3).
PAIR_KINDS: Mapping[str, tuple[int, int]] = {
    "P22": (2, 2),
    "P33": (3, 3),
    "P24": (2, 4),
    "P43": (4, 3),
    "P44": (4, 4),
}

#: Mixed-tier layouts -> (tier0 bits, tier1 bits) (spec §4.1, ``compile_mixed_trellis`` defaults).
TIER_LAYOUTS: Mapping[str, tuple[int, int]] = {"k3k4": (3, 4)}

OPS = ("decode", "dense", "moe")
ROTATIONS = ("full", "none", "coupled")
COMPUTE_DTYPES = ("fp16", "bf16")
RATE_AXES = ("k", "n")
PAIR_BASE_BITS = 3  # every pair layout compiles on the trellis_bits = 3 specialization (§4.2)
DEFAULT_ROTATION = {"decode": "none", "dense": "full", "moe": "full"}
VARIANT_FIELDS = (
    "codebook",
    "bits",
    "pair_kind",
    "rate_axis",
    "tier_layout",
    "rotation",
    "compute_dtype",
    "op",
)
MIN_MMA_ARCH = 80  # mma.sync m16n8k16 with fp16/bf16 operands needs sm_80 or newer

COUPLED_NO_COVERAGE = (
    "coupled Hadamard (spec §3.5) is out of scope: the reference models only the intermediate "
    "boundary (spec §7 q13, no full H512 chain) and no b12x kernel implements it here"
)


@dataclasses.dataclass(frozen=True)
class ToleranceOverride:
    """A per-variant tolerance change, as data. ``match`` maps Variant field names to a value or a
    tuple of accepted values; the first matching override (in table order) wins."""

    match: Mapping[str, Any]
    changes: Mapping[str, Any]
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("ToleranceOverride: reason must be a non-empty string")
        unknown = set(self.match) - set(VARIANT_FIELDS)
        if unknown:
            raise ValueError(f"ToleranceOverride: match names unknown fields {sorted(unknown)}")

    def applies_to(self, variant: Variant) -> bool:
        for field, wanted in self.match.items():
            got = getattr(variant, field)
            accepted = wanted if isinstance(wanted, tuple) else (wanted,)
            if got not in accepted:
                return False
        return True


TOLERANCE_OVERRIDES: tuple[ToleranceOverride, ...] = (
    ToleranceOverride(
        match={"op": "decode"},
        changes={"exact": True, "alpha": 1.0, "floor": 0.0, "min_row_cosine": 1.0},
        reason="decode is exact: a GEMM with identity activations returns the decoded weights, "
        "compared with torch.equal (docs/oracle_contract.md §2)",
    ),
)


# --- the dataclass -------------------------------------------------------------------------


def _check_choice(arg: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise ValueError(f"Variant: {arg} must be one of {choices}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One decoding variant. Vocabulary errors raise; illegal combinations are a property."""

    codebook: str
    bits: int
    pair_kind: str | None = None
    rate_axis: str | None = None
    tier_layout: str | None = None
    rotation: str = "full"
    compute_dtype: str = "fp16"
    op: str = "dense"

    def __post_init__(self) -> None:
        _check_choice("codebook", self.codebook, tuple(CODEBOOK_BITS))
        if isinstance(self.bits, bool) or not isinstance(self.bits, int):
            raise TypeError(f"Variant: bits must be an int, got {type(self.bits).__name__}")
        _check_choice("pair_kind", self.pair_kind, (None, *PAIR_KINDS))
        _check_choice("rate_axis", self.rate_axis, (None, *RATE_AXES))
        _check_choice("tier_layout", self.tier_layout, (None, *TIER_LAYOUTS))
        _check_choice("rotation", self.rotation, ROTATIONS)
        _check_choice("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        _check_choice("op", self.op, OPS)

    # -- identity -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        parts = [self.op, self.codebook, f"k{self.bits}"]
        if self.pair_kind is not None:
            parts.append(self.pair_kind + (self.rate_axis or ""))
        if self.tier_layout is not None:
            parts.append(f"tiers_{self.tier_layout}")
        if self.rotation != DEFAULT_ROTATION[self.op]:
            parts.append(f"rot_{self.rotation}")
        parts.append(self.compute_dtype)
        return "/".join(parts)

    @classmethod
    def from_name(cls, name: str) -> Variant:
        """Inverse of :attr:`name`. Raises ValueError naming ``name`` when it does not parse."""
        if not isinstance(name, str):
            raise TypeError(f"Variant.from_name: name must be a str, got {type(name).__name__}")
        parts = name.split("/")
        if len(parts) < 4 or not parts[2].startswith("k") or not parts[2][1:].isdigit():
            raise ValueError(f"Variant.from_name: cannot parse name {name!r}")
        op, codebook, bits, *extras, dtype = parts
        if op not in OPS:
            raise ValueError(f"Variant.from_name: unknown op {op!r} in name {name!r}")
        fields: dict[str, Any] = {"rotation": DEFAULT_ROTATION[op]}
        for extra in extras:
            if extra.startswith("tiers_"):
                fields["tier_layout"] = extra[len("tiers_") :]
            elif extra.startswith("rot_"):
                fields["rotation"] = extra[len("rot_") :]
            elif extra[:3] in PAIR_KINDS:
                fields["pair_kind"] = extra[:3]
                fields["rate_axis"] = extra[3:] or None
            else:
                raise ValueError(f"Variant.from_name: unknown part {extra!r} in name {name!r}")
        return cls(codebook=codebook, bits=int(bits[1:]), compute_dtype=dtype, op=op, **fields)

    # -- legality ---------------------------------------------------------------------------

    @property
    def illegal_reason(self) -> str | None:
        """Why this combination is illegal, or None when it is legal."""
        return _illegal_reason(self)

    @property
    def legal(self) -> bool:
        return self.illegal_reason is None

    @property
    def record_bits(self) -> tuple[int, int] | None:
        """(b_lo, b_hi) of a paired variant, (tier0, tier1) bits of a tiered one, else None."""
        if self.pair_kind is not None:
            return PAIR_KINDS[self.pair_kind]
        if self.tier_layout is not None:
            return TIER_LAYOUTS[self.tier_layout]
        return None

    # -- reference ----------------------------------------------------------------------------

    @property
    def decoder_kind(self) -> str:
        """Which reference entry decodes this variant's payload."""
        return "pairs.decode_pair" if self.pair_kind is not None else "trellis.decode"

    def reference_decoder(self) -> Callable[..., Any]:
        """The reference callable that decodes this variant's payload (imported lazily).

        * unpaired and tiered: ``reference.trellis.decode(trellis, codebook=...)`` (a tier is an
          ordinary trellis stack at its own rate, spec §4.1; the rate comes from the payload);
        * paired: ``reference.pairs.decode_pair(payload, orth=..., kind=..., codebook=...,
          rate_axis=...)``; a MoE pair leaves ``rate_axis`` to the caller (phase-bound).
        """
        self._require_legal("reference_decoder")
        if self.pair_kind is None:
            return functools.partial(trellis.decode, codebook=self.codebook)

        keywords: dict[str, Any] = {"kind": self.pair_kind, "codebook": self.codebook}
        if self.rate_axis is not None:
            keywords["rate_axis"] = self.rate_axis
        return functools.partial(pairs.decode_pair, **keywords)

    def reference_state_values(self) -> Any:
        """``reference.codebooks.state_values`` for every rate this variant decodes at:
        one fp16[65536] tensor, or a (lo, hi) tuple for pairs and tiers."""
        self._require_legal("reference_state_values")

        rates = self.record_bits
        if rates is None:
            return state_values(self.codebook, self.bits)
        return tuple(state_values(self.codebook, b) for b in rates)

    # -- tolerance ------------------------------------------------------------------------------

    @property
    def tolerance(self) -> Tolerance:
        """Per-dtype default with the first matching :data:`TOLERANCE_OVERRIDES` entry applied."""
        base = default_tolerance(self.compute_dtype)
        for override in TOLERANCE_OVERRIDES:
            if override.applies_to(self):
                return base.override(reason=override.reason, **override.changes)
        return base

    # -- coverage and support ---------------------------------------------------------------------

    @property
    def kernel_coverage(self) -> str | None:
        return _coverage(self)[0]

    @property
    def no_coverage_reason(self) -> str | None:
        return _coverage(self)[1]

    def kernel_specializations(self) -> tuple[Any, ...]:
        """The b12x compile specs that implement this variant (``b12x.support.
        kernel_specializations()``, matched on codebook, bits, bf16 and kind: "decode" kernels
        for fp16 decode variants, "gemm" kernels for dense and decode; pair/tier/rotation
        attributes must match when a spec has them). Empty without coverage."""
        if self.kernel_coverage is None:
            return ()
        getter = getattr(support, "kernel_specializations", None)
        return tuple(spec for spec in (getter() if getter else ()) if _spec_matches(spec, self))

    def supported(self, arch: Any, dtype: Any) -> tuple[bool, str]:
        """Can this variant run as a kernel on ``arch`` (``"sm_90"``, ``90``, ``(9, 0)``) with
        operands of ``dtype`` (``"fp16"``/``"bf16"`` or a torch dtype)? Returns (ok, reason)."""
        arch_number = _arch_number(arch)
        dtype_name = _dtype_name(dtype)
        if not self.legal:
            return False, f"illegal variant: {self.illegal_reason}"
        if dtype_name != self.compute_dtype:
            return False, f"{self.name} computes in {self.compute_dtype}, not {dtype_name}"
        if arch_number < MIN_MMA_ARCH:
            return False, f"sm_{arch_number} lacks mma.sync m16n8k16 (needs sm_{MIN_MMA_ARCH}+)"
        coverage, reason = _coverage(self)
        if coverage is None:
            return False, reason or "no kernel coverage"
        return True, f"covered by {coverage} on sm_{arch_number}"

    def _require_legal(self, what: str) -> None:
        if not self.legal:
            raise ValueError(f"{what}: variant {self.name} is illegal: {self.illegal_reason}")


# --- legality rules --------------------------------------------------------------------------


def _illegal_reason(v: Variant) -> str | None:
    legal_bits = CODEBOOK_BITS[v.codebook]
    if v.pair_kind is not None and v.tier_layout is not None:
        return "a variant is either paired (QSRT records) or tiered (whole experts), not both"
    if v.pair_kind is not None:
        return _pair_illegal_reason(v, legal_bits)
    if v.rate_axis is not None:
        return f"rate_axis {v.rate_axis!r} needs a pair_kind (unpaired payloads have no records)"
    if v.tier_layout is not None:
        return _tier_illegal_reason(v)
    if v.bits not in legal_bits:
        return f"codebook {v.codebook} allows bits {legal_bits}, not {v.bits}"
    return _rotation_illegal_reason(v)


def _pair_illegal_reason(v: Variant, legal_bits: tuple[int, ...]) -> str | None:
    lo, hi = PAIR_KINDS[v.pair_kind]
    if lo not in legal_bits or hi not in legal_bits:
        return (
            f"pair {v.pair_kind} records ({lo}, {hi}) are not both legal for codebook "
            f"{v.codebook} (bits {legal_bits})"
        )
    if v.bits != PAIR_BASE_BITS:
        return f"paired variants compile on the trellis_bits = {PAIR_BASE_BITS} base (spec §4.2)"
    if v.op == "moe" and v.rate_axis is not None:
        return "MoE pairs are phase-bound (FC1 on N, FC2 on K, spec §4.2): rate_axis must be None"
    if v.op != "moe" and v.rate_axis is None:
        return f"{v.op} pairs need a rate_axis ('k' or 'n', spec §4.4)"
    if v.rotation == "coupled":
        return "per-expert-pair extents must be uncoupled (spec §4.3)"
    return _rotation_illegal_reason(v)


def _tier_illegal_reason(v: Variant) -> str | None:
    if v.op != "moe":
        return "mixed tiers are whole MoE experts at one rate (spec §4.1): op must be moe"
    if v.codebook != "mcg":
        return "mixed K3/K4 tiers are MCG (PR #137 pins trellis_codebook='mcg', spec §4.1)"
    tier0, _ = TIER_LAYOUTS[v.tier_layout]
    if v.bits != tier0:
        return f"a tiered variant carries the driver's tier0 bits ({tier0}), not {v.bits}"
    if v.rotation != "full":
        return "mixed tiers require full_rotation (spec §4.1)"
    return None


def _rotation_illegal_reason(v: Variant) -> str | None:
    if v.op == "decode" and v.rotation != "none":
        return "decode checks read raw decoded weights (identity activations): rotation 'none'"
    if v.op == "dense" and v.rotation == "coupled":
        return "coupled Hadamard is a MoE reparameterisation (spec §3.5), not a dense rotation"
    if v.op == "moe" and v.rotation == "none":
        return "trellis MoE always rotates (full or coupled, spec §3.4/§3.5)"
    if v.op == "moe" and v.rotation == "coupled" and v.compute_dtype != "fp16":
        return "coupled Hadamard MoE is modelled with fp16 operands only (spec §3.5)"
    return None


# --- what b12x declares, in registry terms (b12x.support.OPS via oracle.cases.declared) -------

_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}


def registry_variant(record: Any) -> tuple[Variant | None, str]:
    """``(variant, "")`` for a declaration, or ``(None, why)`` when it names no legal registry
    variant."""
    dtype = _DTYPES.get(str(record.compute_dtype))
    if dtype is None:
        return None, f"compute dtype {record.compute_dtype} is not fp16/bf16"
    tier = None
    if record.tier_bits is not None:
        tier = next((k for k, v in TIER_LAYOUTS.items() if v == tuple(record.tier_bits)), None)
        if tier is None:
            return None, f"tier bits {record.tier_bits} name no registry tier layout"
    try:
        variant = Variant(
            record.codebook,
            record.bits,
            pair_kind=record.pair_kind,
            rate_axis=None,
            tier_layout=tier,
            rotation=record.rotation,
            compute_dtype=dtype,
            op=record.op,
        )
    except (TypeError, ValueError) as exc:
        return None, f"outside the registry vocabulary: {exc}"
    if not variant.legal:
        return None, f"{variant.name} is illegal in the registry: {variant.illegal_reason}"
    return variant, ""


#: Contract ops that are not grid ops but executions of another op's cases: ``moe_gemm`` (the
#: grouped GEMM alone) is judged through decode cases (one-hot rows,
#: ``decode_through_grouped_gemm``).
EXECUTION_OPS = {"moe_gemm": "decode"}


@functools.cache
def _index() -> tuple[Mapping[Variant, tuple[Any, ...]], tuple[tuple[Any, str], ...]]:
    mapped: dict[Variant, list[Any]] = {}
    orphans: list[tuple[Any, str]] = []
    for contract in declared.ops():
        if contract.name in EXECUTION_OPS:
            continue
        for record in contract.variants:
            variant, why = registry_variant(record)
            if variant is None:
                orphans.append((record, f"{contract.name}: {why}"))
            else:
                mapped.setdefault(variant, []).append(record)
    return {v: tuple(d) for v, d in mapped.items()}, tuple(orphans)


def declarations() -> Mapping[Variant, tuple[Any, ...]]:
    """Registry variant -> the DeclaredVariant records b12x gives for it."""
    return _index()[0]


def unmapped() -> tuple[tuple[Any, str], ...]:
    """Declarations that map onto no legal registry variant, with the reason."""
    return _index()[1]


def clear_declarations() -> None:
    """Forget the cached contract (after a test swaps ``b12x.support``)."""
    _index.cache_clear()


# --- coverage ----------------------------------------------------------------------------------


def _coverage(v: Variant) -> tuple[str | None, str | None]:
    """``(path, None)`` when b12x's typed contract declares ``v`` (:mod:`oracle.cases.declared`),
    else ``(None, reason)``."""
    if not v.legal:
        return None, f"illegal variant: {v.illegal_reason}"
    if v.rotation == "coupled":
        return None, COUPLED_NO_COVERAGE
    found = declarations().get(v)
    if not found:
        return None, f"b12x.support does not declare {v.name}"
    paths = sorted({p for d in found for p in d.paths})
    return f"b12x:{v.op}" + (f"[{','.join(paths)}]" if paths else ""), None


def _spec_matches(spec: Any, v: Variant) -> bool:
    kind = getattr(spec, "kind", None)
    kinds = {"gemm"} | ({"decode"} if v.op == "decode" and v.compute_dtype == "fp16" else set())
    if kind not in kinds or v.op == "moe":
        return False
    if getattr(spec, "codebook", None) != v.codebook or getattr(spec, "bits", None) != v.bits:
        return False
    if kind == "gemm" and bool(getattr(spec, "bf16", False)) != (v.compute_dtype == "bf16"):
        return False
    return all(getattr(spec, f, None) == getattr(v, f) for f in ("pair_kind", "tier_layout"))


def _arch_number(arch: Any) -> int:
    if isinstance(arch, bool):
        raise TypeError("supported: arch must be 'sm_XX', an int or a (major, minor) tuple")
    if isinstance(arch, int):
        return arch
    if isinstance(arch, tuple) and len(arch) == 2 and all(isinstance(a, int) for a in arch):
        return arch[0] * 10 + arch[1]
    if isinstance(arch, str) and arch.startswith("sm_") and arch[3:].rstrip("af").isdigit():
        return int(arch[3:].rstrip("af"))
    raise ValueError(f"supported: cannot read arch {arch!r} (use 'sm_90', 90 or (9, 0))")


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        if dtype in COMPUTE_DTYPES:
            return dtype
        raise ValueError(f"supported: dtype must be one of {COMPUTE_DTYPES}, got {dtype!r}")

    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    if dtype in names:
        return names[dtype]
    raise TypeError(f"supported: dtype must be fp16/bf16 or torch.float16/bfloat16, got {dtype!r}")


# --- generation ------------------------------------------------------------------------------


def _generate() -> Iterator[Variant]:
    for codebook, legal_bits in CODEBOOK_BITS.items():
        for bits, dtype in itertools.product(legal_bits, COMPUTE_DTYPES):
            yield Variant(codebook, bits, rotation="none", compute_dtype=dtype, op="decode")
            for rotation in ("full", "none"):
                yield Variant(codebook, bits, rotation=rotation, compute_dtype=dtype, op="dense")
        for bits in legal_bits:
            for dtype in COMPUTE_DTYPES:
                yield Variant(codebook, bits, rotation="full", compute_dtype=dtype, op="moe")
            yield Variant(codebook, bits, rotation="coupled", op="moe")
        for kind in PAIR_KINDS:
            for axis, dtype in itertools.product(RATE_AXES, COMPUTE_DTYPES):
                for op, rotation in (("decode", "none"), ("dense", "full")):
                    yield Variant(codebook, PAIR_BASE_BITS, kind, axis, None, rotation, dtype, op)
            for dtype in COMPUTE_DTYPES:
                yield Variant(codebook, PAIR_BASE_BITS, kind, None, None, "full", dtype, "moe")
    for layout, (tier0, _) in TIER_LAYOUTS.items():
        for dtype in COMPUTE_DTYPES:
            yield Variant("mcg", tier0, tier_layout=layout, compute_dtype=dtype, op="moe")


#: Every legal variant, in generation order (codebook-major).
REGISTRY: tuple[Variant, ...] = tuple(v for v in _generate() if v.legal)


def all_variants(op: str | None = None) -> tuple[Variant, ...]:
    """The registry, optionally restricted to one op."""
    if op is None:
        return REGISTRY
    _check_choice("op", op, OPS)
    return tuple(v for v in REGISTRY if v.op == op)


@functools.cache
def _by_name() -> dict[str, Variant]:
    return {v.name: v for v in REGISTRY}


def variant_by_name(name: str) -> Variant:
    """The registered variant called ``name``; ValueError naming it when unregistered."""
    try:
        return _by_name()[name]
    except KeyError:
        raise ValueError(f"variant_by_name: no registered variant {name!r}") from None


def candidate_variants() -> Iterator[Variant]:
    """Every combination of vocabulary values with bits 1..8 (legal or not)."""
    for codebook, bits, pair, axis, tier, rotation, dtype, op in itertools.product(
        CODEBOOK_BITS,
        range(1, 9),
        (None, *PAIR_KINDS),
        (None, *RATE_AXES),
        (None, *TIER_LAYOUTS),
        ROTATIONS,
        COMPUTE_DTYPES,
        OPS,
    ):
        yield Variant(codebook, bits, pair, axis, tier, rotation, dtype, op)


def illegal_variants() -> Iterator[tuple[Variant, str]]:
    """(variant, reason) for every illegal candidate combination."""
    for v in candidate_variants():
        reason = v.illegal_reason
        if reason is not None:
            yield v, reason
