"""Split-K of the dense trellis GEMM as a declarative table (docs/architecture.md; R2, R15).

The rule the host launcher once computed inline (``choose_split_k``) is data here, in the protocol
of :data:`b12x.ops.dense.dispatch.TABLE`, so the oracle can check both sides of every threshold;
the machinery is :mod:`b12x.ops.tables`, this module holds the rule's data.

Layout:
* A *case*: ``path`` (the dense dispatch row), ``requested`` (an explicit ``split_k`` or None),
  ``planned`` (the mainloop table's split, or None), ``m``, ``k``, ``n``, the kernel geometry
  ``m_tiles`` (M16 blocks per CTA), ``n_tiles``, ``warps`` and the device's ``sm_count``;
  :data:`SCHEMA` validates every field, :data:`DEFAULT_CASE` fills the missing ones.
* Derived: ``ctas`` (CTAs of one K slice), ``depth`` (CTAs per SM aimed for:
  :data:`SMALL_M_DEPTH` at M ≤ 8, :data:`MID_M_DEPTH` at M ≤ 16, else :data:`DEPTH`),
  ``wanted = max(1, ceil(depth · sm_count / ctas))``, ``k_cap = (K/16) // MIN_ROWS_PER_SPLIT``.
* :data:`ROWS` in priority order: ``off_generic_path`` (1), ``explicit`` (the request),
  ``mainloop`` (``planned``, capped at ``k_cap``), ``short_k`` (1), ``deep_grid`` (1),
  ``max_splits`` (:data:`MAX_SPLITS`), ``k_capped`` (``k_cap``), ``fill_small_m`` /
  ``fill_mid_m`` / ``fill`` (``wanted``): rows 3–8 equal ``max(1, min(wanted, k_cap, 64))``.
  The depths were chosen by measurement: docs/evidence/dense-split-k-depth.md.
* :func:`explain` returns a :class:`SplitExplanation` ``(path, reasons, value)``, ``value`` the
  *requested* split; the plan then applies the launcher's arithmetic (a consequence, not a
  decision). :data:`BOUNDARIES` put both sides of every threshold as literal data;
  :data:`TABLE` bundles it all for :mod:`oracle.judge.dispatch`. Each row's conditions in full:
  docs/notes/b12x.md.

Invariants: ``explain`` is a pure function of the case, every field validated before any row
runs; every constant of the rule lives here (:func:`split_k` is the keyword form for callers of
``trellis_matmul``: the launcher takes the split it is given and decides nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from b12x.ops import tables
from b12x.ops.dense.dispatch import PATH_NAMES
from b12x.ops.tables import Boundary, Condition, DecisionTable, Explanation, Row
from b12x.runtime.validate import check_choice, check_positive_int

__all__ = [
    "BOUNDARIES",
    "DEFAULT_CASE",
    "DEPTH",
    "MAX_SPLITS",
    "MIN_ROWS_PER_SPLIT",
    "ROWS",
    "SCHEMA",
    "GEMV_M_MAX",
    "MID_M_DEPTH",
    "SMALL_M_DEPTH",
    "SMALL_M_MAX",
    "TABLE",
    "SplitExplanation",
    "explain",
    "normalize_case",
    "split_k",
]

SMALL_M_MAX = 16  # M <= 16: one M16 block, the grid is thin -> deeper
GEMV_M_MAX = 8  # M <= 8: the fp32 partials are few bytes -> deepest
#: Chosen by measurement (with MID_M_DEPTH): docs/evidence/dense-split-k-depth.md
SMALL_M_DEPTH = 12  # CTAs per SM aimed for at M <= 8
MID_M_DEPTH = 6  # CTAs per SM aimed for at 8 < M <= 16: half the partials' bytes
DEPTH = 4  # CTAs per SM aimed for above
MIN_ROWS_PER_SPLIT = 16  # K16 rows a slice keeps at least
MAX_SPLITS = 64


def _path(name: str, value: Any) -> str:
    return check_choice(name, value, PATH_NAMES)


SCHEMA = tables.Schema(
    "dense_split_k",
    (
        tables.Field("path", _path, "generic", "the dense dispatch row the plan took"),
        tables.Field("requested", tables.optional(check_positive_int), None, "an explicit split_k"),
        tables.Field(
            "planned",
            tables.optional(check_positive_int),
            None,
            "the split the mainloop table measured its shared geometry at",
        ),
        tables.Field("m", check_positive_int, 16),
        tables.Field("k", check_positive_int, 8192),
        tables.Field("n", check_positive_int, 28672),
        tables.Field("m_tiles", check_positive_int, 1, "M16 blocks per CTA"),
        tables.Field("n_tiles", check_positive_int, 4, "N16 tiles per warp"),
        tables.Field("warps", check_positive_int, 4, "warps per CTA"),
        tables.Field("sm_count", check_positive_int, 132, "the device's SMs"),
    ),
    unknown=tables.UNKNOWN_SORTED,
)
DEFAULT_CASE: Mapping[str, Any] = SCHEMA.defaults()


def normalize_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh dict with every field present and validated (module docstring)."""
    return SCHEMA.normalize(case)


def ctas(c: Mapping[str, Any]) -> int:
    """CTAs of one K slice: N groups times M blocks."""
    n_groups = c["n"] // (16 * c["n_tiles"] * c["warps"])
    m_blocks = -(-c["m"] // (16 * c["m_tiles"]))
    return n_groups * m_blocks


def depth(c: Mapping[str, Any]) -> int:
    if c["m"] <= GEMV_M_MAX:
        return SMALL_M_DEPTH
    return MID_M_DEPTH if c["m"] <= SMALL_M_MAX else DEPTH


def wanted(c: Mapping[str, Any]) -> int:
    """Slices that bring the grid to ``depth`` CTAs per SM (at least 1)."""
    return max(1, -(-depth(c) * c["sm_count"] // max(ctas(c), 1)))


def k_cap(c: Mapping[str, Any]) -> int:
    """Slices that keep at least :data:`MIN_ROWS_PER_SPLIT` K16 rows each."""
    return (c["k"] // 16) // MIN_ROWS_PER_SPLIT


class SplitExplanation(Explanation):
    """``(path, reasons, value)``; ``split_k`` is the requested split count (the row's value)."""

    @property
    def split_k(self) -> int:
        return self.value


def _row(name: str, description: str, conditions: tuple[Condition, ...], value) -> Row:
    return Row(name, description, SCHEMA, conditions, value)


_GENERIC = Condition(
    "path==generic",
    lambda c: c["path"] == "generic",
    lambda c: f"path={c['path']} does not split K",
)
_AUTO = Condition(
    "no_request",
    lambda c: c["requested"] is None,
    lambda c: f"split_k={c['requested']} was requested",
)

ROWS: tuple[Row, ...] = (
    _row(
        "off_generic_path",
        "K6 and decode_matmul launch no split-K GEMM",
        (
            Condition(
                "path!=generic",
                lambda c: c["path"] != "generic",
                lambda c: "path=generic splits K",
            ),
        ),
        lambda c: 1,
    ),
    _row(
        "explicit",
        "the caller's split_k",
        (
            _GENERIC,
            Condition(
                "requested",
                lambda c: c["requested"] is not None,
                lambda c: "no split_k was requested",
            ),
        ),
        lambda c: c["requested"],
    ),
    _row(
        "mainloop",
        "the shared-decode geometry's measured split (b12x.ops.dense.mainloop)",
        (
            _GENERIC,
            _AUTO,
            Condition(
                "planned",
                lambda c: c["planned"] is not None,
                lambda c: "the mainloop planned no split",
            ),
        ),
        lambda c: min(c["planned"], max(1, k_cap(c))),
    ),
    _row(
        "short_k",
        "fewer than two slices of 16 K16 rows",
        (
            _GENERIC,
            _AUTO,
            Condition("k_cap<2", lambda c: k_cap(c) < 2, lambda c: f"k_cap={k_cap(c)} >= 2"),
        ),
        lambda c: 1,
    ),
    _row(
        "deep_grid",
        "one slice already gives depth CTAs per SM",
        (
            _GENERIC,
            _AUTO,
            Condition("wanted==1", lambda c: wanted(c) == 1, lambda c: f"wanted={wanted(c)} > 1"),
        ),
        lambda c: 1,
    ),
    _row(
        "max_splits",
        "the hard cap of 64 slices",
        (
            _GENERIC,
            _AUTO,
            Condition(
                "wanted>64",
                lambda c: wanted(c) > MAX_SPLITS,
                lambda c: f"wanted={wanted(c)} <= {MAX_SPLITS}",
            ),
            Condition(
                "k_cap>=64",
                lambda c: k_cap(c) >= MAX_SPLITS,
                lambda c: f"k_cap={k_cap(c)} < {MAX_SPLITS}",
            ),
        ),
        lambda c: MAX_SPLITS,
    ),
    _row(
        "k_capped",
        "K allows fewer slices than wanted",
        (
            _GENERIC,
            _AUTO,
            Condition(
                "wanted>k_cap",
                lambda c: wanted(c) > k_cap(c),
                lambda c: f"wanted={wanted(c)} <= k_cap={k_cap(c)}",
            ),
        ),
        k_cap,
    ),
    _row(
        "fill_small_m",
        f"M <= {GEMV_M_MAX}: slices for {SMALL_M_DEPTH} CTAs per SM",
        (
            _GENERIC,
            _AUTO,
            Condition(
                "m<=8",
                lambda c: c["m"] <= GEMV_M_MAX,
                lambda c: f"m={c['m']} > {GEMV_M_MAX}",
            ),
        ),
        wanted,
    ),
    _row(
        "fill_mid_m",
        f"{GEMV_M_MAX} < M <= {SMALL_M_MAX}: slices for {MID_M_DEPTH} CTAs per SM",
        (
            _GENERIC,
            _AUTO,
            Condition(
                "8<m<=16",
                lambda c: GEMV_M_MAX < c["m"] <= SMALL_M_MAX,
                lambda c: f"m={c['m']} not in ({GEMV_M_MAX}, {SMALL_M_MAX}]",
            ),
        ),
        wanted,
    ),
    _row(
        "fill",
        f"M > {SMALL_M_MAX}: slices for {DEPTH} CTAs per SM",
        (
            _GENERIC,
            _AUTO,
            Condition(
                "m>16",
                lambda c: c["m"] > SMALL_M_MAX,
                lambda c: f"m={c['m']} <= {SMALL_M_MAX}",
            ),
        ),
        wanted,
    ),
)


def explain(case: Mapping[str, Any]) -> SplitExplanation:
    """The row that decides, one reason per row considered, and the requested split count."""
    return TABLE.explain(case)


def split_k(**case: Any) -> int:
    """The requested split count for ``case`` (keywords of a case)."""
    return explain(case).split_k


def _case(**changes: Any) -> dict:
    return {**DEFAULT_CASE, **changes}


# M = 1 on N = 4096: ctas = 16, wanted = ceil(12·SMs/16); K = 16384 keeps k_cap at 64.
_WIDE = {"m": 1, "n": 4096, "k": 16384}

BOUNDARIES: tuple[Boundary, ...] = (
    # M = 8: ctas = 112, wanted = ceil(12·132/112) = 15, k_cap = 32 -> fill_small_m
    Boundary("generic_path", _case(m=8), "path", "generic", "decode_matmul", "fill_small_m",
             "off_generic_path"),
    Boundary("generic_path_k6", _case(m=8), "path", "generic", "k6_mcg_small_m",
             "fill_small_m", "off_generic_path"),
    Boundary("explicit_request", _case(m=8), "requested", None, 4, "fill_small_m", "explicit"),
    Boundary("mainloop_split", _case(m=8), "planned", None, 4, "fill_small_m", "mainloop"),
    Boundary("explicit_over_mainloop", _case(planned=4), "requested", None, 2, "mainloop",
             "explicit"),
    # M 8 -> 9: depth 12 -> 6, 15 -> 8 slices
    Boundary("gemv_depth", _case(), "m", 8, 9, "fill_small_m", "fill_mid_m"),
    Boundary("short_k", _case(), "k", 384, 512, "short_k", "k_capped"),
    # M 16 -> 17 with one M16 block per warp: 224 CTAs, depth 4 -> wanted 3
    Boundary("small_m_depth", _case(), "m", 16, 17, "fill_mid_m", "fill"),
    # M = 17: 224 CTAs; 4·56 = 224 fills the grid, 4·57 needs a second slice
    Boundary("deep_grid", _case(m=17), "sm_count", 56, 57, "deep_grid", "fill"),
    # wanted = 15: k_cap 14 (K = 3584) binds, 15 (K = 3840) does not
    Boundary("k_cap", _case(m=8), "k", 3584, 3840, "k_capped", "fill_small_m"),
    # wanted = ceil(12·85/16) = 64 stays, ceil(12·86/16) = 65 hits the cap
    Boundary("max_splits", _case(**_WIDE), "sm_count", 85, 86, "fill_small_m", "max_splits"),
    Boundary("max_splits_k_cap", _case(**_WIDE), "k", 16128, 16384, "k_capped", "max_splits"),
)  # fmt: skip


TABLE = DecisionTable(
    "dense_split_k",
    "the requested split-K of the dense generic GEMM",
    SCHEMA,
    ROWS,
    BOUNDARIES,
    refusal="no split-K row matches",
    explanation=SplitExplanation,
    current_rows=lambda: ROWS,  # explain reads ROWS at every call (a test may replace it)
)
