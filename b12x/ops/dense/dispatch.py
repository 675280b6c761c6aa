"""The declarative dispatch table of the dense trellis linear (docs/architecture.md; R2).

Layout: a *case* is a plain mapping: ``capability`` ``(major, minor)``, ``m``, ``bits``,
``codebook``, ``pair_kind`` (``None`` = unpaired), ``compute_dtype`` (``"float16"`` /
``"bfloat16"``; a ``torch.dtype`` too), ``external_rotation`` (an external H128 callback) and
``explicit_tile`` (a pinned tile spec, or ``None``); missing optional fields take defaults and
:data:`SCHEMA` validates every field (:func:`normalize_case`). :data:`ROWS` are the paths in
priority order, each a :class:`~b12x.ops.tables.Row` whose predicate is the conjunction of its
named conditions (the first failed one is its rejection reason; machinery in
:mod:`b12x.ops.tables`, the data here):

1. ``k6_mcg_small_m`` — the K6/MCG small-M cooperative row (spec §5.5, PR #136 gate):
   capability (12, 0), M ≤ 128, K6, MCG, unpaired, fp16, no external H128, no explicit tile.
2. ``decode_matmul`` — decode Wq once into a caller buffer, then one cuBLAS GEMM: M ≥
   :func:`decode_matmul_min_m` (:data:`DECODE_MATMUL_MIN_M`; on sm_90
   :data:`HOPPER_DECODE_MATMUL_MIN_M` unless the decoder spills in the tensor-core mainloops),
   sm_80+, unpaired, no explicit tile (disjoint from the K6 row's M range).
3. ``generic`` — rotation, trellis GEMM with split-K, rotation: any sm_80+ part, unpaired.

Nothing matches a paired case or a pre-sm_80 part: :func:`explain` raises ``ValueError`` with
every row's reason (fail closed). :func:`explain` returns an Explanation ``(path, reasons)``,
``"<row>: <failed condition>"`` per rejected row and ``"<row>: selected"``. :data:`BOUNDARIES`
declares both sides of every boundary as data for the oracle; :data:`TABLE` bundles name, paths,
boundaries and ``explain`` in the shape :mod:`oracle.judge.dispatch` checks, reading :data:`ROWS` at
every call. The thresholds: docs/evidence/dense-decode-matmul-threshold.md; what bounds the
decode_matmul row: docs/evidence/dense-decode-matmul-bounds.md.

Invariants: ``explain`` is a pure function of the case (reads, never mutates); every gate
constant lives in one :class:`Condition` of one row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from b12x.formats import resolve_format
from b12x.kernels.shared_layout import WGMMA_CAPABILITY
from b12x.ops import tables
from b12x.ops.dense import tiles as dense_tiles
from b12x.ops.tables import Boundary, Condition, DecisionTable, Explanation, Row
from b12x.runtime.validate import check_bool, check_codebook_bits, check_positive_int

__all__ = [
    "BOUNDARIES",
    "DEFAULT_CASE",
    "K6_CAPABILITIES",
    "K6_MAX_M",
    "DECODE_MATMUL_MIN_M",
    "HOPPER_DECODE_MATMUL_MIN_M",
    "decode_matmul_min_m",
    "check_capability",
    "MIN_CAPABILITY",
    "PATH_NAMES",
    "ROWS",
    "SCHEMA",
    "TABLE",
    "Boundary",
    "Condition",
    "Explanation",
    "Row",
    "explain",
    "normalize_case",
]

K6_CAPABILITIES = frozenset({(12, 0)})  # the SM120 gate of PR #136 (c5425904); SM121 falls through
K6_MAX_M = 128
#: Smallest M for which decode-then-cuBLAS beats the fused trellis GEMM; the one threshold of
#: the decode_matmul row (the oracle's sharding imports it from here).
#: Chosen by measurement: docs/evidence/dense-decode-matmul-threshold.md
DECODE_MATMUL_MIN_M = 129
#: On sm_90 the generic GEMM's swap-AB mainloop (:mod:`b12x.kernels.wgmma_swap`) beats decode +
#: cuBLAS up to one 256-token tile, so decode_matmul starts after it.
#: Chosen by measurement: docs/evidence/dense-decode-matmul-threshold.md
HOPPER_DECODE_MATMUL_MIN_M = 257


def decode_matmul_min_m(capability: tuple[int, int], wide_tile_cap: int) -> int:
    """The decode_matmul row's threshold on a device of ``capability`` for a decoder with tile
    hint ``wide_tile_cap`` (:attr:`b12x.formats.DecodeFormat.wide_tile_cap`):
    :data:`HOPPER_DECODE_MATMUL_MIN_M` on the ``wgmma`` part (sm_90) where the decoder runs its
    tensor-core mainloops (:func:`b12x.ops.dense.tiles.tensor_core_takes_decoder`; D3L spills in
    them, so its M 129..256 would fall to the mma.sync shared decode, which decode + cuBLAS
    beats), :data:`DECODE_MATMUL_MIN_M` otherwise."""
    if capability == WGMMA_CAPABILITY and dense_tiles.tensor_core_takes_decoder(wide_tile_cap):
        return HOPPER_DECODE_MATMUL_MIN_M
    return DECODE_MATMUL_MIN_M


def _case_min_m(c: Mapping[str, Any]) -> int:
    """:func:`decode_matmul_min_m` of a dispatch case (its capability and codebook)."""
    return decode_matmul_min_m(c["capability"], resolve_format(c["codebook"]).wide_tile_cap)


MIN_CAPABILITY = (8, 0)  # mma.sync m16n8k16 with fp16/bf16 operands

COMPUTE_DTYPE_NAMES = ("float16", "bfloat16")


def _dtype_name(name: str, value: Any) -> str:
    if isinstance(value, torch.dtype):
        text = str(value).removeprefix("torch.")
    elif isinstance(value, str):
        text = value
    else:
        raise TypeError(
            f"{name}: expected one of {COMPUTE_DTYPE_NAMES} or a torch.dtype, got "
            f"{type(value).__name__}"
        )
    if text not in COMPUTE_DTYPE_NAMES:
        raise ValueError(f"{name}: expected one of {COMPUTE_DTYPE_NAMES}, got {value!r}")
    return text


def check_capability(name: str, cap: Any) -> tuple[int, int]:
    if (
        not isinstance(cap, tuple | list)
        or len(cap) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cap)
    ):
        raise ValueError(f"{name}: expected (major, minor) as two ints >= 0, got {cap!r}")
    return (cap[0], cap[1])


def _as_given(name: str, value: Any) -> Any:
    return value


def _codebook_bits(case: dict[str, Any]) -> None:
    """The (codebook, bits) pair is legal only together: a kernel pair of :mod:`b12x.formats`."""
    case["codebook"], case["bits"] = check_codebook_bits(case["codebook"], case["bits"])


def _pair_kind(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name}: expected None or a pair kind name, got {type(value).__name__}")
    return value


def _explicit_tile(name: str, value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    try:
        tile = dense_tiles.deserialize(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None
    return tuple(dense_tiles.serialize(tile))


SCHEMA = tables.Schema(
    "dense",
    (
        tables.Field("capability", check_capability, (12, 0), "(major, minor) of the device"),
        tables.Field("m", check_positive_int, 1),
        tables.Field("bits", _as_given, 6),
        tables.Field("codebook", _as_given, "mcg", joint=_codebook_bits),
        tables.Field("pair_kind", _pair_kind, None, "None = unpaired"),
        tables.Field("compute_dtype", _dtype_name, "float16", "a name, or the torch.dtype"),
        tables.Field("external_rotation", check_bool, False, "an external H128 callback is given"),
        tables.Field("explicit_tile", _explicit_tile, None, "a pinned tile spec (kept as a tuple)"),
    ),
    unknown=tables.UNKNOWN_SORTED,
)
DEFAULT_CASE: Mapping[str, Any] = SCHEMA.defaults()


def normalize_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh dict with every field present, validated, and ``compute_dtype`` as a plain name.

    Every field is checked against its domain (raising ``TypeError``/``ValueError`` naming it):
    ``capability`` two ints ≥ 0 (no floats), ``m`` a positive int, ``codebook``/``bits`` a legal
    kernel pair of :mod:`b12x.formats`, ``pair_kind`` ``None`` or a kind name, ``compute_dtype``
    float16/bfloat16, ``external_rotation`` a real bool, ``explicit_tile`` ``None`` or three
    positive ints (kept as a tuple). ``bool`` never passes for an int."""
    return SCHEMA.normalize(case)


_cond = Condition

_UNPAIRED = _cond(
    "unpaired",
    lambda c: c["pair_kind"] is None,
    lambda c: f"pair_kind={c['pair_kind']!r} is paired",
)
_NO_PIN = _cond(
    "no_explicit_tile",
    lambda c: c["explicit_tile"] is None,
    lambda c: f"explicit_tile={c['explicit_tile']!r} pins the generic GEMM",
)
_SM80 = _cond(
    "capability>=8.0",
    lambda c: c["capability"] >= MIN_CAPABILITY,
    lambda c: f"capability={c['capability']} < {MIN_CAPABILITY}",
)

K6_ROW = Row(
    "k6_mcg_small_m",
    "cooperative K6/MCG small-M: owns both H128s, caller buffers only, no generic scratch",
    SCHEMA,
    (
        _cond(
            "capability",
            lambda c: c["capability"] in K6_CAPABILITIES,
            lambda c: f"capability={c['capability']} not in {sorted(K6_CAPABILITIES)}",
        ),
        _cond("m<=128", lambda c: c["m"] <= K6_MAX_M, lambda c: f"m={c['m']} > {K6_MAX_M}"),
        _cond("bits==6", lambda c: c["bits"] == 6, lambda c: f"bits={c['bits']} != 6"),
        _cond(
            "codebook_has_k6_kernel",
            lambda c: resolve_format(c["codebook"]).k6_cooperative,
            lambda c: f"codebook={c['codebook']!r} has no cooperative K6 kernel",
        ),
        _UNPAIRED,
        _cond(
            "fp16_compute",
            lambda c: c["compute_dtype"] == "float16",
            lambda c: f"compute_dtype={c['compute_dtype']} != float16",
        ),
        _cond(
            "no_external_h128",
            lambda c: not c["external_rotation"],
            lambda c: "an external H128 callback is given (the kernel owns both rotations)",
        ),
        _NO_PIN,
    ),
)

DECODE_MATMUL_ROW = Row(
    "decode_matmul",
    "M >= 129: decode Wq once into a caller buffer, then one dense (cuBLAS) GEMM",
    SCHEMA,
    (
        _SM80,
        _cond(
            "m>=decode_matmul_min_m",
            lambda c: c["m"] >= _case_min_m(c),
            lambda c: f"m={c['m']} < {_case_min_m(c)}",
        ),
        _UNPAIRED,
        _NO_PIN,
    ),
)

GENERIC_ROW = Row(
    "generic",
    "input rotation, trellis GEMM (split-K over c_tmp), output rotation",
    SCHEMA,
    (_SM80, _UNPAIRED),
)

ROWS: tuple[Row, ...] = (K6_ROW, DECODE_MATMUL_ROW, GENERIC_ROW)
PATH_NAMES = tuple(r.name for r in ROWS)


def explain(case: Mapping[str, Any]) -> Explanation:
    """The chosen path and one reason per row considered (module docstring)."""
    return TABLE.explain(case)


def _k6(**changes: Any) -> dict:
    """A K6 case at M = 32: every K6 gate alone falls back to ``generic`` (M < 129)."""
    return {**DEFAULT_CASE, "m": 32, **changes}


BOUNDARIES: tuple[Boundary, ...] = (
    Boundary("k6_small_m_M", _k6(), "m", 128, 129, "k6_mcg_small_m", "decode_matmul"),
    # at M = 128 the K6 gates decide K6 vs generic (decode_matmul starts at 129)
    Boundary("k6_largest_m_bits", _k6(m=128), "bits", 6, 5, "k6_mcg_small_m", "generic"),
    Boundary("k6_bits", _k6(), "bits", 6, 5, "k6_mcg_small_m", "generic"),
    Boundary("k6_codebook", _k6(), "codebook", "mcg", "sqg_fp16", "k6_mcg_small_m", "generic"),
    Boundary("k6_codebook_3inst", _k6(), "codebook", "mcg", "3inst", "k6_mcg_small_m", "generic"),
    Boundary(
        "k6_compute_dtype",
        _k6(),
        "compute_dtype",
        "float16",
        "bfloat16",
        "k6_mcg_small_m",
        "generic",
    ),
    # the compute dtype decides K6 vs generic at the K6 row's largest M too
    Boundary(
        "k6_compute_dtype_at_largest_m",
        _k6(m=128),
        "compute_dtype",
        "float16",
        "bfloat16",
        "k6_mcg_small_m",
        "generic",
    ),
    Boundary(
        "k6_external_h128", _k6(), "external_rotation", False, True, "k6_mcg_small_m", "generic"
    ),
    Boundary("k6_cap_sm121", _k6(), "capability", (12, 0), (12, 1), "k6_mcg_small_m", "generic"),
    Boundary("k6_cap_sm90", _k6(), "capability", (12, 0), (9, 0), "k6_mcg_small_m", "generic"),
    Boundary("k6_cap_sm80", _k6(), "capability", (12, 0), (8, 0), "k6_mcg_small_m", "generic"),
    Boundary(
        "k6_explicit_tile",
        _k6(),
        "explicit_tile",
        None,
        (64, 256, 256),
        "k6_mcg_small_m",
        "generic",
    ),
    # literal sides (not the constant): moving the threshold must fail here, not move along
    Boundary(
        "decode_matmul_min_M",
        _k6(capability=(8, 0), bits=4),
        "m",
        128,
        129,
        "generic",
        "decode_matmul",
    ),
    Boundary(
        "decode_matmul_min_M_sm90",
        _k6(capability=(9, 0), bits=4),
        "m",
        256,
        257,
        "generic",
        "decode_matmul",
    ),
    # D3L spills in the sm_90 tensor-core mainloops (b12x.ops.dense.tiles), so sm_90 keeps 129
    Boundary(
        "decode_matmul_min_M_sm90_d3l",
        _k6(capability=(9, 0), codebook="sqg_fp16", bits=6),
        "m",
        128,
        129,
        "generic",
        "decode_matmul",
    ),
    Boundary("decode_matmul_min_M_sm120", _k6(bits=5), "m", 128, 129, "generic", "decode_matmul"),
    Boundary(
        "decode_matmul_explicit_tile",
        _k6(m=2048),
        "explicit_tile",
        None,
        (64, 256, 256),
        "decode_matmul",
        "generic",
    ),
)


TABLE = DecisionTable(
    "dense",
    "the dense linear's path: K6/MCG small-M, decode then GEMM, or the generic trellis GEMM",
    SCHEMA,
    ROWS,
    BOUNDARIES,
    refusal="no dense path supports it",
    current_rows=lambda: ROWS,  # explain reads ROWS at every call (a test may replace it)
)
