"""QSRT fixed-payload pairs: two 128-channel records at their own bit rates (spec §4.2-4.4).

Vocabulary. A *pair* covers 256 channels of its *rate axis*: record 0 ("low", ``b_lo`` bits) takes
channels ``[0, 128)`` and record 1 ("high", ``b_hi`` bits) channels ``[128, 256)``. "low" and "high"
mean storage order (P43 is K4 then K3, 7 bits per coefficient pair). :data:`PAIR_KINDS` maps each
kind to ``(b_lo, b_hi)``. A record is an ordinary trellis tensor of 8 x (orth/16) tiles (``orth``,
the other GEMM axis, a multiple of 128); the payload is one 1-D int16 tensor
(:func:`pair_payload_length`).

Rate axis ``"k"`` (FC2 style; records on the reduction axis, K = 256, N = orth)::

    payload = [record 0: int16[8 K16 rows, N/16 tiles, 16*b_lo]]
            ‖ [record 1: int16[8 K16 rows, N/16 tiles, 16*b_hi]]

  K16 rows 0..7 decode from record 0 at ``b_lo``, rows 8..15 from record 1 at ``b_hi`` (on the
  **absolute** K16 index); the prepared layout is the reference layout.

Rate axis ``"n"`` (FC1 style; records on the output axis, K = orth, N = 256)::

    reference order: [record 0: int16[K/16, 8 N16 tiles, 16*b_lo]]
                   ‖ [record 1: int16[K/16, 8 N16 tiles, 16*b_hi]]
    prepared order:  for each K16 row kt: [record 0 row kt: 8*16*b_lo ‖ record 1 row kt: 8*16*b_hi]

  N16 tiles 0..7 are record 0, 8..15 record 1; :func:`interleave_n_axis` makes the prepared order
  (once, at load time) and :func:`deinterleave_n_axis` undoes it.

Several pairs along one rate axis (MoE): ``kind`` is a sequence of P kinds in channel order
(:func:`pair_payload_length`). :class:`PairedLinear` is a layer :mod:`reference.linear` accepts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from reference import _checks
from reference.codebooks import validate_codebook_bits
from reference.linear import forward, reconstruct_decoded, validate_scales
from reference.trellis import decode

PAIR_KINDS: dict[str, tuple[int, int]] = {
    "P22": (2, 2),
    "P33": (3, 3),
    "P24": (2, 4),
    "P43": (4, 3),
    "P44": (4, 4),
}
"""Pair kind -> (b_lo, b_hi): record 0 / record 1 bit rates in storage order."""

FIXED_PAYLOAD_KINDS = ("P22", "P33", "P24", "P44")
"""Kinds whose two records have a constant total rate in the QSRT sense (P43 is 7 bits)."""

RATE_AXES = ("k", "n")
LAYOUTS = ("reference", "prepared")
PAIR_CHANNELS = 256
RECORD_CHANNELS = 128
RECORD_TILES = RECORD_CHANNELS // 16
ORTH_MULTIPLE = 128


def _normalize_kinds(kind: object) -> tuple[str, ...]:
    """``"P24"`` -> ``("P24",)``; a sequence of kinds is kept in order; unknown kinds raise."""
    kinds = (kind,) if isinstance(kind, str) else kind
    if not isinstance(kinds, Sequence) or isinstance(kinds, bytes) or len(kinds) == 0:
        raise TypeError(f"kind: expected a pair kind name or a non-empty sequence, got {kind!r}")
    for item in kinds:
        if not isinstance(item, str) or item not in PAIR_KINDS:
            raise ValueError(f"kind: expected one of {sorted(PAIR_KINDS)}, got {item!r}")
    return tuple(kinds)


def pair_rates(kind: str) -> tuple[int, int]:
    """``(b_lo, b_hi)`` of one pair kind."""
    if not isinstance(kind, str):
        raise TypeError(f"kind: expected a pair kind name, got {kind!r}")
    return PAIR_KINDS[_normalize_kinds(kind)[0]]


def _check_orth(orth: object) -> int:
    return _checks.check_multiple(orth, ORTH_MULTIPLE, "orth")


def _check_rate_axis(rate_axis: object) -> str:
    if rate_axis not in RATE_AXES:
        raise ValueError(f"rate_axis: expected 'k' or 'n', got {rate_axis!r}")
    return rate_axis


def _check_layout(layout: object) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'reference' or 'prepared', got {layout!r}")
    return layout


def _check_codebook(codebook: object, kinds: tuple[str, ...]) -> str:
    if not isinstance(codebook, str):
        raise TypeError(f"codebook: expected a str, got {type(codebook).__name__}")
    for bits in sorted({b for kind in kinds for b in PAIR_KINDS[kind]}):
        validate_codebook_bits(codebook, bits)
    return codebook


def record_length(bits: int, orth: int) -> int:
    """int16 words of one record: ``(orth/16) * 8 tiles * 16*bits``. ``bits`` is a bit rate
    1..8 (a record pair's summed rate stays within it), ``orth`` a positive multiple of 128."""
    bits = _checks.check_bits(bits)
    orth = _check_orth(orth)
    return (orth // 16) * RECORD_TILES * 16 * bits


def pair_payload_length(kind: str | Sequence[str], orth: int) -> int:
    """``(orth/16) * 8 * 16 * (b_lo + b_hi)`` int16 words, summed over the pairs of ``kind``.

    Several pairs along one rate axis (MoE: FC1's N axis holds ``I = 256*P`` channels per
    projection; FC2's K axis may span several pairs on one rank). Pass ``kind`` as a sequence of P
    kinds, one per pair, in channel order; pair ``p`` covers rate-axis channels ``[256p,
    256p+256)``. The concatenation order chosen here is:

    * reference order: pair-major, each pair's own reference payload in turn, ``pair 0 (record 0 ‖
      record 1) ‖ pair 1 (record 0 ‖ record 1) ‖ ...``, for both axes;
    * N-axis prepared order: K16-row-major, then pair, then record: per K16 row ``kt``, ``[pair 0:
      low ‖ high] ‖ [pair 1: low ‖ high] ‖ ...``, so a CTA with ``tile_n = 256`` finds pair ``p``'s
      row ``kt`` as one contiguous span (§4.2's ``64*(b_lo+b_hi)`` u32 per pair and K16 row).
    """
    kinds = _normalize_kinds(kind)
    orth = _check_orth(orth)
    return sum(record_length(b_lo + b_hi, orth) for b_lo, b_hi in map(PAIR_KINDS.get, kinds))


def _check_payload(payload: object, kinds: tuple[str, ...], orth: int) -> torch.Tensor:
    payload = _checks.check_dtype(payload, torch.int16, "payload")
    expected = pair_payload_length(kinds, orth)
    if payload.dim() != 1 or payload.numel() != expected:
        raise ValueError(
            f"payload: expected a 1-D int16 tensor of {expected} words for kind {kinds} and "
            f"orth {orth}, got shape {tuple(payload.shape)}"
        )
    return payload


def _record_shape(bits: int, rate_axis: str, orth: int) -> tuple[int, int, int]:
    if rate_axis == "k":
        return (RECORD_TILES, orth // 16, 16 * bits)
    return (orth // 16, RECORD_TILES, 16 * bits)


def split_records(
    payload: torch.Tensor, kind: str | Sequence[str], rate_axis: str, orth: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Views of each pair's (record 0, record 1) trellis tensors in a reference-order payload.

    Shapes: ``[8, orth/16, 16*b]`` for rate axis ``"k"``, ``[orth/16, 8, 16*b]`` for ``"n"``.
    """
    kinds = _normalize_kinds(kind)
    rate_axis = _check_rate_axis(rate_axis)
    orth = _check_orth(orth)
    payload = _check_payload(payload, kinds, orth)
    pairs, offset = [], 0
    for kind_name in kinds:
        records = []
        for bits in PAIR_KINDS[kind_name]:
            length = record_length(bits, orth)
            chunk = payload[offset : offset + length]
            records.append(chunk.view(_record_shape(bits, rate_axis, orth)))
            offset += length
        pairs.append((records[0], records[1]))
    return pairs


def _row_widths(kinds: tuple[str, ...]) -> list[int]:
    """Words per K16 row of each record, in prepared order (pair, then low/high)."""
    return [RECORD_TILES * 16 * bits for kind in kinds for bits in PAIR_KINDS[kind]]


def interleave_n_axis(payload: torch.Tensor, kind: str | Sequence[str], k: int) -> torch.Tensor:
    """Reference-order N-axis payload -> prepared K16-row-major ``[kt][pair][low ‖ high]``."""
    kinds = _normalize_kinds(kind)
    records = [rec for pair in split_records(payload, kinds, "n", k) for rec in pair]
    rows = [rec.reshape(k // 16, -1) for rec in records]
    return torch.cat(rows, dim=1).reshape(-1)


def deinterleave_n_axis(payload: torch.Tensor, kind: str | Sequence[str], k: int) -> torch.Tensor:
    """Inverse of :func:`interleave_n_axis`: prepared order -> reference order."""
    kinds = _normalize_kinds(kind)
    k = _check_orth(k)
    payload = _check_payload(payload, kinds, k)
    columns = payload.view(k // 16, -1).split(_row_widths(kinds), dim=1)
    return torch.cat([column.reshape(-1) for column in columns])


def to_prepared(
    payload: torch.Tensor, kind: str | Sequence[str], rate_axis: str, orth: int
) -> torch.Tensor:
    """The layout b12x's preparer produces: N-axis interleaved, K-axis unchanged (zero-copy)."""
    if _check_rate_axis(rate_axis) == "n":
        return interleave_n_axis(payload, kind, orth)
    _check_payload(payload, _normalize_kinds(kind), _check_orth(orth))
    return payload


def decode_pair(
    payload: torch.Tensor,
    kind: str | Sequence[str],
    rate_axis: str,
    orth: int,
    codebook: str,
    *,
    layout: str = "reference",
) -> torch.Tensor:
    """Decode a pair payload to float16 ``[K, N]``.

    K = 256*P, N = orth for rate axis ``"k"``; K = orth, N = 256*P for ``"n"`` (P pairs).
    Each record decodes at its own rate; ``codebook`` must be legal at every rate used.
    """
    kinds = _normalize_kinds(kind)
    rate_axis = _check_rate_axis(rate_axis)
    orth = _check_orth(orth)
    layout = _check_layout(layout)
    _check_payload(payload, kinds, orth)
    codebook = _check_codebook(codebook, kinds)
    if layout == "prepared" and rate_axis == "n":
        payload = deinterleave_n_axis(payload, kinds, orth)
    blocks = [
        decode(record, codebook)
        for pair in split_records(payload, kinds, rate_axis, orth)
        for record in pair
    ]
    return torch.cat(blocks, dim=0 if rate_axis == "k" else 1)


def make_pair_payload(record0: torch.Tensor, record1: torch.Tensor, rate_axis: str) -> torch.Tensor:
    """One pair's reference-order payload from its two record trellis tensors.

    ``record0``/``record1`` are int16 ``[8, orth/16, 16*b]`` (rate axis ``"k"``) or
    ``[orth/16, 8, 16*b]`` (``"n"``), e.g. from :func:`reference.trellis.pack`.
    """
    rate_axis = _check_rate_axis(rate_axis)
    for name, record in (("record0", record0), ("record1", record1)):
        _checks.check_dtype(record, torch.int16, name)
        if record.dim() != 3 or record.shape[-1] % 16 or record.shape[-1] == 0:
            raise ValueError(f"{name}: expected shape [.., .., 16*bits], got {tuple(record.shape)}")
        record_axis = 0 if rate_axis == "k" else 1
        if record.shape[record_axis] != RECORD_TILES:
            raise ValueError(
                f"{name}: expected {RECORD_TILES} tiles on the rate axis (dimension "
                f"{record_axis}), got shape {tuple(record.shape)}"
            )
    orth_axis = 1 if rate_axis == "k" else 0
    if record0.shape[orth_axis] != record1.shape[orth_axis]:
        raise ValueError(
            f"record1: orthogonal tile count {record1.shape[orth_axis]} differs from record0's "
            f"{record0.shape[orth_axis]}"
        )
    _check_orth(record0.shape[orth_axis] * 16)
    return torch.cat([record0.reshape(-1), record1.reshape(-1)])


def random_pair_payload(
    kind: str | Sequence[str],
    rate_axis: str,
    orth: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Uniformly random reference-order payload (every bit string is a valid tile, §1.3)."""
    _check_rate_axis(rate_axis)
    length = pair_payload_length(kind, orth)
    return torch.randint(-(1 << 15), 1 << 15, (length,), generator=generator, dtype=torch.int16)


@dataclasses.dataclass(frozen=True, eq=False)
class PairedLinear:
    """A linear layer whose weight is a pair payload; usable with :mod:`reference.linear`.

    ``kind`` is one kind or a sequence (one per pair). The orthogonal axis is taken from the
    scales: ``orth = len(svh)`` for rate axis ``"k"`` and ``len(suh)`` for ``"n"``; the rate-axis
    scale must have ``256 * pairs`` entries. ``layout`` names the payload's order.
    """

    payload: torch.Tensor
    kind: str | tuple[str, ...]
    rate_axis: str
    suh: torch.Tensor
    svh: torch.Tensor
    codebook: str
    bias: torch.Tensor | None = None
    layout: str = "reference"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def kinds(self) -> tuple[str, ...]:
        return _normalize_kinds(self.kind)

    @property
    def orth(self) -> int:
        scale = self.svh if self.rate_axis == "k" else self.suh
        return scale.shape[0]

    @property
    def k(self) -> int:
        return PAIR_CHANNELS * len(self.kinds) if self.rate_axis == "k" else self.orth

    @property
    def n(self) -> int:
        return self.orth if self.rate_axis == "k" else PAIR_CHANNELS * len(self.kinds)

    def validate(self) -> None:
        kinds = self.kinds
        _check_rate_axis(self.rate_axis)
        _check_layout(self.layout)
        for name in ("suh", "svh"):
            value = _checks.check_dtype(getattr(self, name), torch.float16, name)
            if value.dim() != 1:
                raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(value.shape)}")
        orth_name = "svh" if self.rate_axis == "k" else "suh"
        if self.orth == 0 or self.orth % ORTH_MULTIPLE:
            raise ValueError(
                f"{orth_name}: length {self.orth} (the orthogonal axis) is not a positive "
                f"multiple of {ORTH_MULTIPLE}"
            )
        _check_payload(self.payload, kinds, self.orth)
        _check_codebook(self.codebook, kinds)
        validate_scales(self.suh, self.svh, self.bias, self.k, self.n)

    def decode(self) -> torch.Tensor:
        """The decoded weight, float16 ``[K, N]``."""
        return decode_pair(
            self.payload, self.kinds, self.rate_axis, self.orth, self.codebook, layout=self.layout
        )

    def reconstruct(self) -> torch.Tensor:
        """``diag(suh) . Hk . Wq . Hn . diag(svh)`` in float64."""
        return reconstruct_decoded(self.decode(), self.suh, self.svh)


def pair_forward(
    x: torch.Tensor,
    payload: torch.Tensor,
    kind: str | Sequence[str],
    rate_axis: str,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str,
    precision: str = "exact",
    *,
    bias: torch.Tensor | None = None,
    layout: str = "reference",
    compute_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """:func:`reference.linear.forward` of the :class:`PairedLinear` built from the arguments."""
    kind = kind if isinstance(kind, str) else tuple(kind)
    layer = PairedLinear(payload, kind, rate_axis, suh, svh, codebook, bias, layout)
    return forward(x, layer, precision, compute_dtype=compute_dtype)
