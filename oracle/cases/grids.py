"""Shape buckets and case generation from the variant registry.

Layout:
* Buckets are data: :data:`M_BUCKETS` straddles every M boundary a dispatch or tile table may
  draw; :data:`KN_BUCKETS` are (K, N) pairs (multiples of 128, residues 128 mod 256 and 256 mod
  512, GLM-like shapes, one heavy 8192×28672); :data:`MOE_BUCKETS` (hidden, intermediate)
  crossed with :data:`MOE_EXPERTS` and :data:`MOE_TOP_K`. ``Case.heavy`` follows
  :func:`is_heavy` (the weights one case generates reach :data:`HEAVY_WEIGHTS`).
* A :class:`Case` is one grid point (for MoE ``k`` = H, ``n`` = I; pairs use a 256 rate axis);
  :func:`shape_illegal_reason` points are not generated; decode cases keep the M axis (M one-hot
  rows). :func:`cases` is a deterministic *cross* design per variant: every M bucket at the base
  shapes, every (K, N) / MoE bucket at the boundary Ms :data:`CROSS_M`.
* Tiers: ``"cpu"`` keeps cases a CPU reference runs quickly; ``"gpu"`` keeps all, heavy flagged.
  ``Case.seed`` is a stable CRC-32 of the case's identity; ``case_id`` is filename-safe and
  :func:`parse_case_id` inverts it.

Filters (:func:`parse_filter`): ``clause ("," clause)*``, ``clause := field op value``, all
clauses ANDed (``"codebook=mcg,bits=6,m<=128,pair_kind=none"``); fields of the variant or the
case, ``name`` / ``id``; ops ``= == != < <= > >= ~``; ``|`` alternatives with ``=`` / ``!=``.
Refusals are one-line :class:`SelectionError` s naming the clause: unknown fields, values
outside the registry's vocabulary, numbers no variant or grid point has, jointly unsatisfiable
clauses; :func:`select_cases` also refuses an empty selection, an alternative that selects
nothing, ``--case`` with ``--filter`` and a bad ``max_cases``. A ``--case`` id must be a
generated grid point with the grid's seed (:func:`resolve_case_id`), so a run, a saved case and
a replay always name the same inputs. Stratified sampling: :mod:`oracle.cases.sampling`. The grammar
and refusals in full: docs/notes/oracle.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from oracle.cases.case import Case, SelectionError, check_count
from oracle.cases.sampling import stratified_sample
from oracle.cases.variants import OPS, REGISTRY, Variant, all_variants

__all__ = [
    "CROSS_M",
    "KN_BUCKETS",
    "M_BUCKETS",
    "MOE_BUCKETS",
    "MOE_EXPERTS",
    "MOE_TOP_K",
    "Case",
    "CaseFilter",
    "FILTER_KEYS",
    "SelectionError",
    "ShapeBucket",
    "cases",
    "filter_vocabulary",
    "case_weights",
    "is_heavy",
    "needs_whole_gpu",
    "parse_case_id",
    "parse_filter",
    "resolve_case_id",
    "select_cases",
    "shape_illegal_reason",
]


M_BUCKETS: tuple[int, ...] = (1, 2, 8, 9, 15, 16, 17, 63, 64, 127, 128, 129, 256, 1024, 4096)
CROSS_M: tuple[int, ...] = (1, 17, 129)  # Ms at which every (K, N) / MoE bucket is visited


@dataclasses.dataclass(frozen=True)
class ShapeBucket:
    """A (K, N) pair, or (hidden, intermediate) for MoE, with why it is in the grid."""

    k: int
    n: int
    note: str
    heavy: bool = False


KN_BUCKETS: tuple[ShapeBucket, ...] = (
    ShapeBucket(128, 128, "smallest legal (one H128 block each way)"),
    ShapeBucket(256, 256, "one pair on either axis; 0 mod 256"),
    ShapeBucket(384, 128, "K = 128 mod 256"),
    ShapeBucket(128, 384, "N = 128 mod 256"),
    ShapeBucket(768, 640, "K = 256 mod 512, N = 128 mod 512"),
    ShapeBucket(640, 768, "K = 128 mod 512, N = 256 mod 512"),
    ShapeBucket(1152, 1280, "both above 1024 with residues 128/256 mod 512"),
    ShapeBucket(2048, 4096, "GLM-like projection"),
    ShapeBucket(6144, 1024, "GLM-like projection"),
    ShapeBucket(512, 6144, "GLM-like projection"),
    ShapeBucket(8192, 28672, "large FFN projection", heavy=True),
)
#: Where every M is visited: N = 128 (sm_90's mma.sync wide mainloop at 33 <= M <= 128) and
#: N = 768 (a 256 multiple: its wgmma tensor-core row there; b12x.ops.dense.mainloop).
BASE_KN: tuple[ShapeBucket, ...] = (KN_BUCKETS[0], KN_BUCKETS[5])

MOE_BUCKETS: tuple[ShapeBucket, ...] = (
    ShapeBucket(128, 128, "smallest hidden and intermediate"),
    ShapeBucket(256, 256, "one pair of intermediate channels"),
    ShapeBucket(384, 640, "H = 128 mod 256, I = 128 mod 512"),
    ShapeBucket(512, 768, "H = 0 mod 512 (coupled-capable), I = 256 mod 512"),
    ShapeBucket(2048, 1024, "GLM-like expert"),
    ShapeBucket(7168, 2048, "large expert", heavy=True),
)
BASE_MOE: tuple[ShapeBucket, ...] = (MOE_BUCKETS[1], MOE_BUCKETS[3])  # H = 512 for coupled
MOE_EXPERTS: tuple[int, ...] = (8, 64, 256)
MOE_TOP_K: tuple[int, ...] = (1, 2, 8)
PAIR_EXTENT = 256  # a pair is exactly 256 channels on its rate axis (spec §4.2, §4.4)

#: A case is heavy when the weights it generates, moves and decodes reach this count: one dense
#: 8192 x 28672 matrix (2^27.8), or a MoE stack of experts x 3·H·I (gate, up, down). The rule
#: counts the whole stack because that is what one case costs: 256 experts of 2048 x 1024 are
#: 1.6G weights (12 x the dense heavy shape), while one such expert is small
#: (docs/evidence/oracle-sharding.md).
HEAVY_WEIGHTS = 1 << 27
#: One MoE expert this large (H·I; FC1 is twice that) needs a GPU to itself: such a case runs in
#: the serial phase of a sharded run (:func:`needs_whole_gpu`), as does a heavy dense shape.
WHOLE_GPU_EXPERT_KN = 1 << 23
CPU_MAX_M = 256
CPU_MAX_KN = 1 << 22
CPU_MAX_EXPERTS = 64


_CASE_ID = re.compile(
    r"^(?P<variant>[A-Za-z0-9_-]+?)_m(?P<m>\d+)_k(?P<k>\d+)_n(?P<n>\d+)"
    r"(?:_e(?P<e>\d+)_t(?P<t>\d+))?_s(?P<s>\d+)$"
)


def parse_case_id(case_id: str) -> Case:
    """Inverse of :attr:`Case.case_id` (``heavy`` is restored from the bucket tables)."""
    if not isinstance(case_id, str):
        raise TypeError(f"parse_case_id: case_id must be a str, got {type(case_id).__name__}")
    match = _CASE_ID.match(case_id)
    if match is None:
        raise SelectionError(
            f"parse_case_id: cannot parse case_id {case_id!r}: expected "
            "<variant>_m<M>_k<K>_n<N>[_e<experts>_t<top_k>]_s<seed>, e.g. "
            "dense-mcg-k6-fp16_m17_k128_n384_s7 (list ids with `python -m oracle grid`)"
        )
    try:
        variant = Variant.from_name(match["variant"].replace("-", "/"))
    except ValueError as exc:
        raise SelectionError(f"parse_case_id: case_id {case_id!r}: {exc}") from None
    k, n = int(match["k"]), int(match["n"])
    experts = int(match["e"]) if match["e"] else None
    top_k = int(match["t"]) if match["t"] else None
    heavy = is_heavy(variant.op, k, n, experts)
    return Case(variant, int(match["m"]), k, n, experts, top_k, int(match["s"]), heavy)


def case_weights(op: str, k: int, n: int, experts: int | None = None) -> int:
    """The weights one case generates, moves and decodes: ``K·N`` (dense, decode), or
    ``experts · 3·H·I`` for MoE (gate and up ``[H, I]``, down ``[I, H]`` per expert)."""
    if op != "moe":
        return k * n
    if experts is None:
        raise ValueError("case_weights: a MoE case needs its expert count")
    return experts * 3 * k * n


def is_heavy(op: str, k: int, n: int, experts: int | None = None) -> bool:
    """The heavy rule: :func:`case_weights` reaches :data:`HEAVY_WEIGHTS` (buckets flagged
    ``heavy`` satisfy it at every expert count of :data:`MOE_EXPERTS`)."""
    return case_weights(op, k, n, experts) >= HEAVY_WEIGHTS


def needs_whole_gpu(case: Case) -> bool:
    """A case whose single weight matrix is large (dense/decode ``K·N`` >= :data:`HEAVY_WEIGHTS`,
    MoE ``H·I`` >= :data:`WHOLE_GPU_EXPERT_KN` per expert): memory-heavy, so a sharded run puts
    it in the serial phase instead of next to another worker on the same GPU. A MoE case heavy
    only by its expert count is not (its experts are decoded one at a time)."""
    if not isinstance(case, Case):
        raise TypeError(f"needs_whole_gpu: expected a Case, got {type(case).__name__}")
    limit = WHOLE_GPU_EXPERT_KN if case.variant.op == "moe" else HEAVY_WEIGHTS
    return case.k * case.n >= limit


def shape_illegal_reason(variant: Variant, k: int, n: int) -> str | None:
    """Why (k, n) cannot carry ``variant``, or None. EXL3's blockwise H128 needs K and N to be
    multiples of 128 (spec §1.1); a pair is exactly 256 channels on its rate axis (spec §4.4);
    coupled Hadamard needs H % 512 == 0 (spec §3.5)."""
    if k % 128 or n % 128:
        return f"K={k} and N={n} must be multiples of 128 (blockwise H128, spec §1.1)"
    if variant.pair_kind is not None:
        rate = n if variant.op == "moe" or variant.rate_axis == "n" else k
        if rate != PAIR_EXTENT:
            return f"a pair spans exactly {PAIR_EXTENT} channels on its rate axis, not {rate}"
    if variant.rotation == "coupled" and k % 512:
        return f"coupled Hadamard needs hidden % 512 == 0 (spec §3.5), got {k}"
    return None


def _stable_seed(identity: str, base_seed: int) -> int:
    return zlib.crc32(f"{base_seed}:{identity}".encode()) & 0x7FFFFFFF


def _shape_for(variant: Variant, bucket: ShapeBucket) -> tuple[int, int]:
    """Apply the pair extent: a dense pair's rate axis is 256; MoE pairs use I = 256."""
    k, n = bucket.k, bucket.n
    if variant.pair_kind is not None:
        if variant.op == "moe" or variant.rate_axis == "n":
            n = PAIR_EXTENT
        else:
            k = PAIR_EXTENT
    return k, n


def _points(variant: Variant) -> Iterator[tuple[int, ShapeBucket, int | None, int | None]]:
    if variant.op == "moe":
        for base in BASE_MOE:
            for m in M_BUCKETS:
                yield m, base, 8, 2
        for bucket in MOE_BUCKETS:
            for experts in MOE_EXPERTS:
                for top_k in MOE_TOP_K:
                    if top_k <= experts:
                        for m in CROSS_M:
                            yield m, bucket, experts, top_k
        return
    for bucket in BASE_KN:
        for m in M_BUCKETS:
            yield m, bucket, None, None
    for bucket in KN_BUCKETS:
        for m in CROSS_M:
            yield m, bucket, None, None


def _variant_cases(variant: Variant, base_seed: int) -> Iterator[Case]:
    seen: set[tuple[Any, ...]] = set()
    for m, bucket, experts, top_k in _points(variant):
        k, n = _shape_for(variant, bucket)
        key = (m, k, n, experts, top_k)
        if key in seen or shape_illegal_reason(variant, k, n) is not None:
            continue
        seen.add(key)
        identity = f"{variant.name}|{m}|{k}|{n}|{experts}|{top_k}"
        seed = _stable_seed(identity, base_seed)
        heavy = is_heavy(variant.op, k, n, experts)
        yield Case(variant, m, k, n, experts, top_k, seed, heavy=heavy)


def _fits_cpu(case: Case) -> bool:
    if case.heavy or case.m > CPU_MAX_M or case.k * case.n > CPU_MAX_KN:
        return False
    return case.experts is None or case.experts <= CPU_MAX_EXPERTS


def cases(
    op: str | None = None,
    filter: str | Callable[[Case], bool] | None = None,  # noqa: A002 - the documented name
    tier: str = "cpu",
    max_cases: int | None = None,
    *,
    base_seed: int = 0,
    variants: tuple[Variant, ...] | None = None,
) -> list[Case]:
    """Grid cases for ``op`` (or every op), filtered, for ``tier`` ("cpu" or "gpu").

    ``max_cases`` takes a :func:`oracle.cases.sampling.stratified_sample` (seeded with
    ``base_seed``) of the filtered cases, never a prefix: every variant, (op, M) and compute
    dtype stays represented when ``max_cases`` allows it."""
    if op is not None and op not in OPS:
        raise ValueError(f"cases: op must be one of {OPS} or None, got {op!r}")
    if tier not in ("cpu", "gpu"):
        raise ValueError(f"cases: tier must be 'cpu' or 'gpu', got {tier!r}")
    if max_cases is not None:
        check_count(max_cases, "cases: max_cases", allow_zero=True)
    if isinstance(base_seed, bool) or not isinstance(base_seed, int) or base_seed < 0:
        raise ValueError(f"cases: base_seed must be a non-negative int, got {base_seed!r}")
    if variants is not None and (
        not isinstance(variants, tuple | list) or not all(isinstance(v, Variant) for v in variants)
    ):
        raise TypeError("cases: variants must be a tuple of Variant (or None for the registry)")
    predicate = parse_filter(filter) if isinstance(filter, str) else filter
    if predicate is not None and not callable(predicate):
        raise TypeError(
            f"cases: filter must be a string or a callable, got {type(filter).__name__}"
        )
    pool = (
        all_variants(op) if variants is None else tuple(v for v in variants if op in (None, v.op))
    )
    out: list[Case] = []
    for variant in pool:
        for case in _variant_cases(variant, base_seed):
            if tier == "cpu" and not _fits_cpu(case):
                continue
            if predicate is not None and not predicate(case):
                continue
            out.append(case)
    if max_cases is not None:
        return stratified_sample(out, max_cases, seed=base_seed)
    return out


# --- filter grammar --------------------------------------------------------------------------

_VARIANT_FIELDS = (
    "op",
    "codebook",
    "bits",
    "pair_kind",
    "rate_axis",
    "tier_layout",
    "rotation",
    "compute_dtype",
)
_CASE_FIELDS = ("m", "k", "n", "experts", "top_k", "seed", "heavy")
_ALIASES = {"dtype": "compute_dtype", "id": "case_id", "name": "name"}
_NUMERIC = {"bits", "m", "k", "n", "experts", "top_k", "seed"}
_CATEGORICAL = ("op", "codebook", "pair_kind", "rate_axis", "tier_layout", "rotation")
_CATEGORICAL += ("compute_dtype",)
_NULLABLE = {"pair_kind", "rate_axis", "tier_layout", "experts", "top_k"}
_CLAUSE = re.compile(r"^\s*([A-Za-z_]+)\s*(==|!=|<=|>=|=|<|>|~)\s*(.*?)\s*$")
_INTEGER = re.compile(r"^[+-]?\d+$")
_HEAVY_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

#: Every key a filter clause may name (``dtype`` is an alias of ``compute_dtype``, ``id`` the
#: case id, ``name`` the variant name).
FILTER_KEYS: tuple[str, ...] = (*_VARIANT_FIELDS, "dtype", *_CASE_FIELDS, "name", "id")


def _show(value: Any) -> str:
    return (
        "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _listing(values: Iterable[Any], limit: int = 24) -> str:
    shown = [_show(v) for v in values]
    more = f", … ({len(shown) - limit} more)" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


def _field_value(case: Any, field: str) -> Any:
    """A field of a Case, or of a Variant (variant fields and ``name`` only)."""
    variant = case if isinstance(case, Variant) else case.variant
    if field in _VARIANT_FIELDS:
        return getattr(variant, field)
    if field == "name":
        return variant.name
    if field == "case_id":
        return case.case_id
    return getattr(case, field)


def _ordered(values: Iterable[Any]) -> tuple[Any, ...]:
    """Distinct values, None first, then numbers ascending or strings in first-seen order."""
    distinct = list(dict.fromkeys(values))
    rest = [v for v in distinct if v is not None]
    if all(isinstance(v, int) for v in rest):
        rest.sort()
    return ((None,) if None in distinct else ()) + tuple(rest)


@functools.cache
def filter_vocabulary() -> dict[str, tuple[Any, ...]]:
    """The values each variant field takes in the registry (None shown as ``none`` in messages),
    and ``heavy``; categorical clauses must use these values, spelled exactly."""
    vocab = {f: _ordered(getattr(v, f) for v in REGISTRY) for f in _VARIANT_FIELDS}
    vocab["heavy"] = (False, True)
    return vocab


@functools.cache
def _grid_domain(tier: str = "gpu") -> dict[str, tuple[Any, ...]]:
    """The values the case fields take in the generated grid of ``tier``."""
    pool = cases(tier=tier)
    return {f: _ordered(getattr(c, f) for c in pool) for f in ("m", "k", "n", "experts", "top_k")}


@functools.cache
def _variant_names() -> tuple[str, ...]:
    return tuple(v.name for v in REGISTRY)


def _parse_value(field: str, text: str, clause: str) -> Any:
    if text == "none" and field in _CATEGORICAL and "none" in filter_vocabulary()[field]:
        return text  # a real value of the field (rotation=none), not the absent marker
    if text == "none":
        if field in _NULLABLE:
            return None
        raise SelectionError(
            f"parse_filter: {clause!r}: {field} is never none"
            + (
                f"; known values: {_listing(filter_vocabulary()[field])}"
                if field in _CATEGORICAL
                else ""
            )
        )
    if field == "heavy":
        if text in _HEAVY_WORDS:
            return _HEAVY_WORDS[text]
        raise SelectionError(f"parse_filter: {clause!r}: heavy takes true/false, got {text!r}")
    if field in _NUMERIC:
        if not _INTEGER.match(text):
            raise SelectionError(
                f"parse_filter: {clause!r}: {field} needs an integer, got {text!r}"
            )
        return int(text)
    if field in _CATEGORICAL:
        known = filter_vocabulary()[field]
        if text not in known:
            hint = [v for v in known if isinstance(v, str) and v.lower() == text.lower()]
            did = f" (did you mean {hint[0]!r}? values are case-sensitive)" if hint else ""
            raise SelectionError(
                f"parse_filter: {clause!r}: unknown {field} {text!r}{did}; "
                f"known values: {_listing(known)}"
            )
    return text


def _check_in_domain(field: str, values: tuple[Any, ...], clause: str) -> None:
    """``=``/``!=`` values of numeric, ``name`` and ``id`` fields must exist in the registry or
    the GPU grid (``seed`` is free)."""
    if field == "bits":
        known = filter_vocabulary()["bits"]
        where = "no registered variant has"
    elif field in ("m", "k", "n", "experts", "top_k"):
        known = _grid_domain("gpu")[field]
        where = "no grid case has"
    elif field == "name":
        for value in values:
            if value not in _variant_names():
                close = difflib.get_close_matches(str(value), _variant_names(), n=3)
                hint = f"; close: {', '.join(close)}" if close else ""
                raise SelectionError(
                    f"parse_filter: {clause!r}: no registered variant is named {value!r}{hint} "
                    "(list them with `python -m oracle grid`)"
                )
        return
    elif field == "case_id":
        for value in values:
            resolve_case_id(value)
        return
    else:
        return
    for value in values:
        if value not in known:
            raise SelectionError(
                f"parse_filter: {clause!r}: {where} {field}={_show(value)}; "
                f"known values: {_listing(known)}"
            )


@dataclasses.dataclass(frozen=True)
class Clause:
    field: str
    op: str
    values: tuple[Any, ...]
    text: str = ""

    def __call__(self, case: Any) -> bool:
        """Does ``case`` (a Case, or a Variant for variant fields) satisfy this clause?"""
        got = _field_value(case, self.field)
        if self.op == "=":
            return got in self.values
        if self.op == "!=":
            return got not in self.values
        if self.op == "~":
            return got is not None and self.values[0] in str(got)
        if got is None:
            return False
        want = self.values[0]
        return {"<": got < want, "<=": got <= want, ">": got > want, ">=": got >= want}[self.op]


@dataclasses.dataclass(frozen=True)
class CaseFilter:
    """AND of clauses; callable on a Case. ``text`` is the source string."""

    text: str
    clauses: tuple[Clause, ...]

    def __call__(self, case: Case) -> bool:
        return all(clause(case) for clause in self.clauses)

    @property
    def variant_clauses(self) -> tuple[Clause, ...]:
        """The clauses a Variant alone decides (variant fields and ``name``)."""
        return tuple(c for c in self.clauses if c.field in (*_VARIANT_FIELDS, "name"))


def _diagnose(clauses: Sequence[Clause], population: Sequence[Any], what: str) -> str:
    """Why no member of ``population`` satisfies every clause: the last clause whose removal
    leaves a match, with the values its field takes under the other clauses."""
    for i in reversed(range(len(clauses))):
        others = [c for j, c in enumerate(clauses) if j != i]
        pool = [p for p in population if all(c(p) for c in others)]
        if pool:
            clause = clauses[i]
            values = _ordered(_field_value(p, clause.field) for p in pool)
            context = f" with {','.join(c.text for c in others)}" if others else ""
            return (
                f"no {what} has {clause.text}{context}; "
                f"there {clause.field} takes {_listing(values)}"
            )
    return f"no {what} satisfies {','.join(c.text for c in clauses)}"


def parse_filter(text: str) -> CaseFilter:
    """Parse and validate a filter string (grammar and rules in the module docstring); empty
    text matches everything. Raises :class:`SelectionError` (one line) on anything it refuses."""
    if not isinstance(text, str):
        raise TypeError(f"parse_filter: text must be a str, got {type(text).__name__}")
    clauses = []
    for raw in (part for part in text.split(",") if part.strip()):
        clause_text = raw.strip()
        match = _CLAUSE.match(raw)
        if match is None:
            raise SelectionError(
                f"parse_filter: malformed clause {clause_text!r} in {text!r}: expected "
                "<key><op><value> with op one of = == != < <= > >= ~ "
                f"(keys: {', '.join(FILTER_KEYS)})"
            )
        name, op, value_text = match.groups()
        field = _ALIASES.get(name, name)
        if field not in (*_VARIANT_FIELDS, *_CASE_FIELDS, "name", "case_id"):
            raise SelectionError(
                f"parse_filter: unknown field (key) {name!r} in {text!r}; "
                f"known keys: {', '.join(FILTER_KEYS)}"
            )
        op = "=" if op == "==" else op
        if not value_text:
            raise SelectionError(f"parse_filter: clause {clause_text!r} has no value")
        if op in ("<", "<=", ">", ">=") and field not in _NUMERIC:
            raise SelectionError(
                f"parse_filter: {op} needs a numeric field ({', '.join(sorted(_NUMERIC))}), "
                f"not {name!r}"
            )
        if op == "~":
            if field in _NUMERIC or field == "heavy":
                raise SelectionError(
                    f"parse_filter: ~ needs a string field (op, codebook, pair_kind, rate_axis, "
                    f"tier_layout, rotation, dtype, name, id), not {name!r}"
                )
            if field in _CATEGORICAL:
                known = [v for v in filter_vocabulary()[field] if v is not None]
                if not any(value_text in v for v in known):
                    raise SelectionError(
                        f"parse_filter: {clause_text!r}: no {field} contains {value_text!r}; "
                        f"known values: {_listing(known)}"
                    )
            values: tuple[Any, ...] = (value_text,)
        elif op in ("=", "!="):
            parts = [v.strip() for v in value_text.split("|")]
            if not all(parts):
                raise SelectionError(f"parse_filter: clause {clause_text!r} has an empty value")
            values = tuple(_parse_value(field, v, clause_text) for v in parts)
            _check_in_domain(field, values, clause_text)
        else:
            values = (_parse_value(field, value_text, clause_text),)
        clauses.append(Clause(field, op, values, clause_text))
    result = CaseFilter(text, tuple(clauses))
    variant_clauses = result.variant_clauses
    if variant_clauses and not any(all(c(v) for c in variant_clauses) for v in REGISTRY):
        why = _diagnose(variant_clauses, REGISTRY, "registered variant")
        raise SelectionError(f"parse_filter: {text!r} contradicts the registry: {why}")
    return result


# --- validated selections ------------------------------------------------------------------


def resolve_case_id(case_id: Any, *, tier: str = "gpu") -> Case:
    """The grid :class:`Case` a ``--case`` id names (rules in the module docstring); raises
    :class:`SelectionError` for an id that does not parse, names no registered variant, or is
    not a generated point (shape or seed) of the ``tier`` grid."""
    if not isinstance(case_id, str) or not case_id.strip():
        raise SelectionError(f"case id: expected a non-empty string, got {case_id!r}")
    if tier not in ("cpu", "gpu"):
        raise SelectionError(f"case id: tier must be 'cpu' or 'gpu', got {tier!r}")
    parsed = parse_case_id(case_id.strip())
    variant = parsed.variant
    if variant not in REGISTRY:
        why = variant.illegal_reason or "not registered"
        raise SelectionError(
            f"case id {case_id!r}: variant {variant.name} is not registered ({why})"
        )
    points = list(_variant_cases(variant, 0))
    shape = (parsed.m, parsed.k, parsed.n, parsed.experts, parsed.top_k)
    found = next((c for c in points if (c.m, c.k, c.n, c.experts, c.top_k) == shape), None)
    if found is None:
        ms = _ordered(c.m for c in points)
        shapes = _ordered(
            f"{c.k}x{c.n}" + (f"/e{c.experts}t{c.top_k}" if c.experts is not None else "")
            for c in points
        )
        raise SelectionError(
            f"case id {case_id!r} is not a grid point of {variant.name}: M takes "
            f"{_listing(ms)}; KxN[/experts,top_k] takes {_listing(shapes, 12)}"
        )
    if found.seed != parsed.seed:
        raise SelectionError(
            f"case id {case_id!r}: seed s{parsed.seed} is not the grid's seed for that point "
            f"(the grid case is {found.case_id})"
        )
    if tier == "cpu" and not _fits_cpu(found):
        raise SelectionError(
            f"case id {case_id!r} is not in the cpu tier (heavy, M > {CPU_MAX_M}, "
            f"K·N > 2^22 or experts > {CPU_MAX_EXPERTS}); use --tier gpu"
        )
    return found


def _refuse_empty_alternatives(text, predicate, selected, op, tier, scope) -> None:
    """Raise :class:`SelectionError` for the first value of a multi-valued ``=`` clause that no
    case of ``selected`` (the whole filter's selection) takes: with the other clauses it selects
    nothing. Checked on the selection itself; the grid is walked again only to explain."""
    for i, clause in enumerate(predicate.clauses):
        if clause.op != "=" or len(clause.values) < 2:
            continue
        taken = {_field_value(case, clause.field) for case in selected}
        for value in clause.values:
            if value in taken:
                continue
            key = re.split(r"[=!<>~]", clause.text, maxsplit=1)[0].strip()
            alone = dataclasses.replace(clause, values=(value,), text=f"{key}={_show(value)}")
            narrowed = (*predicate.clauses[:i], alone, *predicate.clauses[i + 1 :])
            why = _diagnose(narrowed, cases(op=op, tier=tier), scope)
            raise SelectionError(
                f"filter {text!r}: alternative {alone.text} of {clause.text} matches nothing: {why}"
            )


def select_cases(
    *,
    filter: str | None = None,  # noqa: A002 - the documented name
    case: str | None = None,
    op: str | None = None,
    tier: str = "gpu",
    max_cases: int | None = None,
) -> list[Case]:
    """The validated selection of ``--filter`` / ``--case`` (at most one) for ``tier``.

    Raises :class:`SelectionError` (one line) for everything :func:`parse_filter` and
    :func:`resolve_case_id` refuse, for an unknown op or tier, a ``max_cases`` that is not a
    positive int, and a selection that matches no case of the tier's grid (the message says
    which clause empties it). ``max_cases`` applies
    :func:`oracle.cases.sampling.stratified_sample`."""
    if case and filter:
        raise SelectionError("use --case or --filter, not both")
    if op is not None and op not in OPS:
        raise SelectionError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    if tier not in ("cpu", "gpu"):
        raise SelectionError(f"unknown tier {tier!r}; known: cpu, gpu")
    if max_cases is not None:
        check_count(max_cases, "--max-cases")
    if case:
        found = resolve_case_id(case, tier=tier)
        if op is not None and found.variant.op != op:
            raise SelectionError(f"case id {case!r} is a {found.variant.op} case, not {op}")
        return [found]
    predicate = parse_filter(filter) if filter else None
    selected = cases(op=op, filter=predicate, tier=tier)
    scope = f"{tier}-tier grid case" + (f" of op {op}" if op else "")
    if not selected:
        population = cases(op=op, tier=tier)
        why = _diagnose(predicate.clauses, population, scope) if predicate else f"no {scope}"
        raise SelectionError(f"filter {filter!r} matches nothing: {why}")
    if predicate is not None:
        _refuse_empty_alternatives(filter, predicate, selected, op, tier, scope)
    if max_cases is not None:
        selected = stratified_sample(selected, max_cases)
    return selected
