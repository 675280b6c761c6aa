"""Shape buckets and case generation from the variant registry.

Layout
------
* Buckets are data. :data:`M_BUCKETS` straddles every M boundary a dispatch or tile table may
  draw (1, 8|9, 16|17, 127|128|129, …). :data:`KN_BUCKETS` are (K, N) pairs, multiples of 128,
  with residues 128 mod 256 and 256 mod 512 on both axes, GLM-like projection shapes, and one
  heavy 8192×28672 shape. :data:`MOE_BUCKETS` are (hidden, intermediate) residues, crossed with
  :data:`MOE_EXPERTS` and :data:`MOE_TOP_K`. ``Case.heavy`` follows :func:`is_heavy` (a size
  rule), which holds exactly for the buckets flagged heavy; a pair's 256 extent is never heavy.
* A :class:`Case` is one grid point. For ``op == "moe"``: ``k`` is the hidden size H (FC1
  reduction) and ``n`` the intermediate size I; ``experts``/``top_k`` are set. For pairs the
  rate axis is exactly 256 (one pair, spec §4.4) and MoE pairs use I = 256 (spec §4.2).
  Points that :func:`shape_illegal_reason` rejects (e.g. coupled MoE with H % 512 != 0) are not
  generated. Decode cases keep the M axis: their activations are M one-hot rows (row i selects
  k = i mod K), so M still crosses every dispatch boundary while the output stays exact.
* :func:`cases` uses a *cross* design per variant, not the full product: every M bucket at the
  base shapes, and every (K, N) / MoE bucket at the boundary Ms :data:`CROSS_M`. Order is
  deterministic (registry order, then buckets in declaration order).
* Tiers: ``"cpu"`` keeps cases a CPU reference can run quickly (no heavy shapes, M ≤ 256,
  K·N ≤ 2^22, experts ≤ 64); ``"gpu"`` keeps everything, heavy cases flagged ``heavy=True``.
* ``Case.seed`` is a stable CRC-32 of the case's identity (plus an optional base seed), so a
  case id alone reproduces its inputs. ``case_id`` is filename-safe (``[A-Za-z0-9_.-]``) and
  :func:`parse_case_id` inverts it.

Filter grammar (:func:`parse_filter`)
-------------------------------------
``clause ("," clause)*`` where ``clause := field op value``:

* ``field``: a Variant field (``op codebook bits pair_kind rate_axis tier_layout rotation
  compute_dtype``; ``dtype`` is an alias of ``compute_dtype``), a Case field (``m k n experts
  top_k seed heavy``), or ``name`` / ``id`` (the variant name / case id).
* ``op``: ``=`` or ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` (numeric fields only), ``~``
  (substring, string fields only).
* ``value``: an int, a word, ``none`` (matches None), ``true``/``false`` for ``heavy``; with ``=``
  and ``!=``, alternatives separated by ``|`` (``codebook=mcg|sqg_e4m3``).

All clauses must hold (AND). Example: ``"codebook=mcg,bits=6,m<=128,pair_kind=none"``.
An unknown field or a malformed clause raises ValueError naming it.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from oracle.variants import OPS, Variant, all_variants

__all__ = [
    "CROSS_M",
    "KN_BUCKETS",
    "M_BUCKETS",
    "MOE_BUCKETS",
    "MOE_EXPERTS",
    "MOE_TOP_K",
    "Case",
    "CaseFilter",
    "ShapeBucket",
    "cases",
    "is_heavy",
    "parse_case_id",
    "parse_filter",
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
BASE_KN: tuple[ShapeBucket, ...] = (KN_BUCKETS[0], KN_BUCKETS[4])  # where every M is visited

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

HEAVY_DENSE_KN = 1 << 27  # 8192 x 28672 = 2^27.8 elements
HEAVY_MOE_KN = 1 << 23  # 7168 x 2048 = 2^23.8 per expert (and FC1 is 2x that)
CPU_MAX_M = 256
CPU_MAX_KN = 1 << 22
CPU_MAX_EXPERTS = 64


@dataclasses.dataclass(frozen=True)
class Case:
    """One grid point. ``experts``/``top_k`` are None except for MoE."""

    variant: Variant
    m: int
    k: int
    n: int
    experts: int | None = None
    top_k: int | None = None
    seed: int = 0
    heavy: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.variant, Variant):
            raise TypeError(f"Case: variant must be a Variant, got {type(self.variant).__name__}")
        for arg in ("m", "k", "n", "seed"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Case: {arg} must be a non-negative int, got {value!r}")
        if (self.variant.op == "moe") != (self.experts is not None and self.top_k is not None):
            raise ValueError("Case: experts and top_k are required for moe and only for moe")
        if self.experts is not None and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"Case: top_k must be in 1..experts, got {self.top_k}")

    @property
    def case_id(self) -> str:
        parts = [self.variant.name.replace("/", "-"), f"m{self.m}", f"k{self.k}", f"n{self.n}"]
        if self.experts is not None:
            parts += [f"e{self.experts}", f"t{self.top_k}"]
        parts.append(f"s{self.seed}")
        return "_".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (variant fields flattened under ``variant``)."""
        out = dataclasses.asdict(self)
        out["variant"] = {"name": self.variant.name, **dataclasses.asdict(self.variant)}
        out["case_id"] = self.case_id
        return out


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
        raise ValueError(f"parse_case_id: cannot parse case_id {case_id!r}")
    variant = Variant.from_name(match["variant"].replace("-", "/"))
    k, n = int(match["k"]), int(match["n"])
    experts = int(match["e"]) if match["e"] else None
    top_k = int(match["t"]) if match["t"] else None
    heavy = is_heavy(variant.op, k, n)
    return Case(variant, int(match["m"]), k, n, experts, top_k, int(match["s"]), heavy)


def is_heavy(op: str, k: int, n: int) -> bool:
    """The heavy rule (buckets flagged ``heavy`` satisfy it): one weight matrix of at least
    :data:`HEAVY_DENSE_KN` elements (dense/decode) or :data:`HEAVY_MOE_KN` per expert (MoE)."""
    return k * n >= (HEAVY_MOE_KN if op == "moe" else HEAVY_DENSE_KN)


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
        yield Case(variant, m, k, n, experts, top_k, seed, heavy=is_heavy(variant.op, k, n))


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
    """Grid cases for ``op`` (or every op), filtered, for ``tier`` ("cpu" or "gpu")."""
    if op is not None and op not in OPS:
        raise ValueError(f"cases: op must be one of {OPS} or None, got {op!r}")
    if tier not in ("cpu", "gpu"):
        raise ValueError(f"cases: tier must be 'cpu' or 'gpu', got {tier!r}")
    if max_cases is not None and (
        isinstance(max_cases, bool) or not isinstance(max_cases, int) or max_cases < 0
    ):
        raise ValueError(f"cases: max_cases must be a non-negative int or None, got {max_cases!r}")
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
            if max_cases is not None and len(out) >= max_cases:
                return out
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
_CLAUSE = re.compile(r"^\s*([A-Za-z_]+)\s*(==|!=|<=|>=|=|<|>|~)\s*(.*?)\s*$")


def _field_value(case: Case, field: str) -> Any:
    if field in _VARIANT_FIELDS:
        return getattr(case.variant, field)
    if field == "name":
        return case.variant.name
    if field == "case_id":
        return case.case_id
    return getattr(case, field)


def _parse_value(field: str, text: str) -> Any:
    low = text.lower()
    if low == "none":
        return None
    if field == "heavy":
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ValueError(f"parse_filter: heavy takes true/false, got {text!r}")
    if field in _NUMERIC:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"parse_filter: {field} needs an integer, got {text!r}") from None
    return text


@dataclasses.dataclass(frozen=True)
class Clause:
    field: str
    op: str
    values: tuple[Any, ...]

    def __call__(self, case: Case) -> bool:
        got = _field_value(case, self.field)
        if self.op == "=":
            return got in self.values
        if self.op == "!=":
            return got not in self.values
        if self.op == "~":
            return got is not None and self.values[0] in got
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


def parse_filter(text: str) -> CaseFilter:
    """Parse a filter string (grammar in the module docstring); empty text matches everything."""
    if not isinstance(text, str):
        raise TypeError(f"parse_filter: text must be a str, got {type(text).__name__}")
    clauses = []
    for raw in (part for part in text.split(",") if part.strip()):
        match = _CLAUSE.match(raw)
        if match is None:
            raise ValueError(f"parse_filter: malformed clause {raw.strip()!r} in {text!r}")
        name, op, value_text = match.groups()
        field = _ALIASES.get(name, name)
        if field not in (*_VARIANT_FIELDS, *_CASE_FIELDS, "name", "case_id"):
            raise ValueError(f"parse_filter: unknown field {name!r} in {text!r}")
        op = "=" if op == "==" else op
        if not value_text:
            raise ValueError(f"parse_filter: clause {raw.strip()!r} has no value")
        if op in ("<", "<=", ">", ">=") and field not in _NUMERIC:
            raise ValueError(f"parse_filter: {op} needs a numeric field, not {name!r}")
        if op == "~":
            if field in _NUMERIC or field == "heavy":
                raise ValueError(f"parse_filter: ~ needs a string field, not {name!r}")
            values: tuple[Any, ...] = (value_text,)
        elif op in ("=", "!="):
            values = tuple(_parse_value(field, v.strip()) for v in value_text.split("|"))
        else:
            values = (_parse_value(field, value_text),)
        clauses.append(Clause(field, op, values))
    return CaseFilter(text, tuple(clauses))
