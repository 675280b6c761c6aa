"""The declarative dispatch table of the dense trellis linear (docs/architecture.md; R2).

Layout
------
* A *case* is a plain mapping: ``capability`` ``(major, minor)``, ``m``, ``bits``, ``codebook``,
  ``pair_kind`` (``None`` = unpaired), ``compute_dtype`` (``"float16"``/``"bfloat16"``; a
  ``torch.dtype`` is accepted too), ``external_rotation`` (an external H128 callback is given) and
  ``explicit_tile`` (a pinned tile spec, or ``None``). Missing optional fields take those defaults.
  :data:`SCHEMA` validates every field (:func:`normalize_case`).
* :data:`ROWS` are the paths, in priority order; each row is a :class:`~b12x.ops.tables.Row`
  with a name, a docstring-like ``description`` and a list of named
  :class:`~b12x.ops.tables.Condition` s. A row's predicate is the conjunction of its conditions,
  and the first failed condition is the row's rejection reason. The machinery (fields,
  conditions, rows, the table) is :mod:`b12x.ops.tables`; this module holds the table's data.
  1. ``k6_mcg_small_m`` — the K6/MCG small-M cooperative row (spec §5.5, PR #136 gate):
     capability (12, 0) only, M ≤ 128, K6, MCG, unpaired, fp16 compute, no external H128 and no
     explicit tile (an explicit launch configuration bypasses the shortcut, c8d5f33b).
  2. ``decode_matmul`` — decode Wq once into a caller buffer, then one dense (cuBLAS) GEMM:
     M ≥ :data:`DECODE_MATMUL_MIN_M` (129; on sm_90 M ≥ :data:`HOPPER_DECODE_MATMUL_MIN_M`,
     257, for a decoder that runs the tensor-core mainloops: D3L, which spills in them, keeps
     129, :func:`decode_matmul_min_m`), sm_80+, unpaired, no explicit tile. (Its M range and
     the K6 row's, M ≤ 128, are disjoint.)
  3. ``generic`` — rotation, trellis GEMM with split-K, rotation: any sm_80+ part, unpaired.
  Nothing matches a paired case or a pre-sm_80 part: :func:`explain` raises ``ValueError`` with
  every row's reason (fail closed).
* :func:`explain` returns an :class:`~b12x.ops.tables.Explanation` ``(path, reasons)`` (its
  ``value`` is None: the path is the answer): one reason per row considered,
  ``"<row>: <failed condition>"`` for each rejected row and ``"<row>: selected"``.
* :data:`BOUNDARIES` declares both sides of every boundary as data for the oracle (M 128/129,
  K6 vs K5, mcg vs sqg_fp16, fp16 vs bf16, external H128, capability (12,0) vs (12,1)/(9,0)/(8,0),
  explicit pin, M 128/129 for decode_matmul off the K6 row, on sm_90 256/257, and 128/129 for
  sqg_fp16 there). :data:`TABLE`
  (a :class:`~b12x.ops.tables.DecisionTable`) bundles ``name``, ``paths``, ``boundaries`` and
  ``explain`` in the shape :mod:`oracle.dispatch` checks (its ``Boundary`` has the same fields);
  it reads :data:`ROWS` at every call.

Evidence for the decode_matmul threshold
----------------------------------------
sm_90, H100 80GB, 2026-12-06 (``benchmarks/dense_shared_decode_sweep.py --geometries
0x1x8x8s,0x2x8x8s``, 8192 x 28672 MCG K4 bf16, GEMM alone against the whole linear of decode +
cuBLAS, us): the swap-AB mainloop (one 256-token tile decodes the weight once) takes M = 128 in
161.0 (tensor_core row 192.9) and M = 256 in 327.8 (decode + cuBLAS 415.4), but M = 1024 in
1385.7 (four token tiles decode the weight four times; decode + cuBLAS 875.9) and M = 4096 in
5111.1 (3219.6). Two tiles at M = 512 would cost about twice M = 256's 328 us, above decode +
cuBLAS (209 us decode + about 330 us cuBLAS), so on sm_90 decode_matmul starts at M = 257.
Caveat: a Hopper layer whose N is not a multiple of 256 has no swap-AB row
(:mod:`b12x.ops.dense.mainloop`) and runs the slower mma.sync shared decode at 129..256.

H200 run 2026-12-03 (``benchmarks/dense_shared_decode_sweep.py``, table in
:mod:`b12x.ops.dense.mainloop`): the generic GEMM's **shared-decode** mainloop beats decode +
cuBLAS for one 128-row M tile (M = 64: 207 vs 316 us whole linear; M = 128: 300 vs 407) and
loses from two (M = 256: 588 vs 402), so the threshold moved from 64 to 129, where the second M
tile starts. The evidence for the old threshold (64, the per-warp decode only) follows.

H200 run 2026-12-02, ``benchmarks/dense_trellis.py``, K × N = 8192 × 28672, MCG: the fused trellis
GEMM is about 1.0× the cuBLAS time at M ≤ 16 and wins there; decode-then-cuBLAS is 2.0–2.8×
faster than the fused GEMM at M = 64..256, 1.3–1.4× at M = 1024 and 1.1× at M = 4096. The
crossover therefore lies in 16 < M ≤ 64; :data:`DECODE_MATMUL_MIN_M` = 64 is the smallest
measured M at which decode+cuBLAS wins (the benchmark's default M list now includes 32 and 48 to
narrow it down). The previous threshold (M > 1024, exllamav3's large-M route) left a 2–2.8×
slowdown on the table for 64 ≤ M ≤ 1024.

What bounds decode_matmul (the issue table's M = 1024 and 4096 rows)
---------------------------------------------------------------------
Over the cuBLAS anchor (bf16 ``x @ W^T`` on an already dequantised weight) the row adds three
HBM passes, counted in bytes (8192 x 28672, K4, bf16 x, fp16 compute): the decode reads the
117.4 MB payload and writes the 469.8 MB weight (587.2 MB); the input rotation reads and writes
``x`` (2·M·K·2 B: 33.6 MB at M = 1024, 134.2 MB at 4096); the output rotation reads and writes
``y`` (2·M·N·2 B: 117.4 MB, 469.8 MB). At the 3.01 TB/s HBM copy rate measured with the table
(H100 80GB, 2026-12-06, ``benchmarks/dense_trellis.py``) that is 245 us at M = 1024 and 396 us
at M = 4096, against measured overheads of 350 us (960.9 - 610.8) and 463 us (3098.3 -
2635.6): the extra passes explain 70 % and 86 % of the gap. The launches measured (H100 80GB,
2026-12-07, ``python benchmarks/profile_launches.py --m 1024,4096 --bits 4 --only dense
--anchor``, device time under the profiler, us): decode 210.1 / 209.5 (2.80 TB/s of the 587.2
MB), input rotation 12.4 / 46.8, output rotation 36.1 / 153.5, and the GEMM 621.8 / 2498.6
against the anchor's 594.2 / 2364.6: the rest of the gap is cuBLAS's kernel for this GEMM (fp16,
the decoded weight ``[K, N]``: ``nvjet_sm90_hsh_*_NNT``) running 5 % slower than the anchor's
(bf16, ``W[N, K]^T``: ``nvjet_sm90_tst_*_TNT``) (at M = 4096: 210 + 200 + 134 of the 544 us
over the anchor). Whether the dtype or the layout costs it is open: two unpaired probes on an
H100 80GB, 2026-12-07, disagree (at M = 1024, us, fp16 with the weight ``[K, N]`` / with
``W[N, K]^T``, then bf16 the same: an ad-hoc ``torch.mm`` loop 620.9 / 618.5 / 596.3 / 598.5, the
graphed ``benchmarks/cublas_gemm_forms.py`` 623.3 / 674.0 / 600.6 / 680.2), and under this load
the SM clock drifts by more than the 5 % in question (:mod:`bench_timing`'s
``paired_median_us``), so that benchmark now times each form in alternation with the anchor's;
no dtype or layout change was made. Overlapping the decode with the GEMM does not pay either
(``python benchmarks/decode_gemm_overlap.py``, same day, each variant timed in alternation with
the sequence): the weight in 2 / 4 / 7 column chunks, decoded on a second stream while cuBLAS
multiplies the previous chunk, took 1.066 / 1.072 / 1.014 of the sequence at M = 1024 and 1.005
/ 1.002 / 1.004 at M = 4096: cuBLAS's kernels leave the decode no room. The fused alternative
on sm_90 (the swap-AB mainloop) decodes the weight once per 256-token tile, four times at M =
1024, and was slower there (1385.7 against 875.9 us, :mod:`b12x.ops.dense.mainloop`).

Invariants
----------
* ``explain`` is a pure function of the case: it reads, never mutates, and gives the same answer
  for equal cases.
* Every gate constant lives in one :class:`Condition` of one row.
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
#: Smallest M for which decode-then-cuBLAS beats the fused trellis GEMM (module docstring); the one
#: threshold of the decode_matmul row (the oracle's sharding imports it from here).
DECODE_MATMUL_MIN_M = 129
#: On sm_90 the generic GEMM's swap-AB mainloop (:mod:`b12x.kernels.wgmma_swap`) beats decode +
#: cuBLAS up to one 256-token tile, so decode_matmul starts after it (module docstring).
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
