"""Error metrics between a kernel output and its references, always in float64.

:func:`compute_metrics` computes on the device of ``y`` (the references are copied there), so a
GPU job's judges do not copy every output to the host; the helpers that return tensors
(:func:`row_cosines`, :func:`row_block_rel_l2`, :func:`tile_errors`) return CPU tensors.

Layout:
* Tensors are viewed as a matrix of *rows*: the last dimension is the row, leading dimensions are
  flattened into the row index.
* ``‖ref‖`` in ``max_abs_rel`` is the **RMS** of the reference, so the number reads as "worst
  element error in units of a typical reference element".
* :func:`compute_metrics` returns a :class:`Metrics` for every case, pass or fail: ``rel_l2``,
  ``max_abs_rel``, ``sqnr_db``, ``worst_row_cosine`` / ``worst_row``, ``faithful_rel_l2``,
  ``ratio`` (the "α actually used"), ``nan_count``, ``inf_count``, and the bounds the judges of
  :mod:`oracle.judge.tolerance` applied (``coarse_*``, ``envelope_*``, ``bias_*``; ``None``
  where a gate did not run), so drift is visible before it fails. Each field's definition:
  docs/notes/oracle.md (and docs/oracle_contract.md).
* Relative errors against a zero reference are 0 when the other side is zero too, else inf.
* :func:`row_block_rel_l2` (rel-L2 per block of rows, the unit the tolerance gates on) and
  :func:`tile_errors` (RMS error per tile / RMS of the whole reference: the per-tile error map).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = [
    "BOUND_FIELDS",
    "Metrics",
    "as_rows",
    "compute_metrics",
    "rel_l2",
    "row_block_rel_l2",
    "row_cosines",
    "tile_errors",
]


def _to_f64(t: Any, arg: str, device: Any = "cpu") -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"metrics: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_complex():
        raise TypeError(f"metrics: {arg} must be real, got {t.dtype}")
    return t.detach().to(device=device, dtype=torch.float64)


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """View as [rows, cols]: last dim is the row, leading dims are flattened."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1])


def _check_same_shape(a: torch.Tensor, b: torch.Tensor, names: tuple[str, str]) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"metrics: {names[0]} shape {tuple(a.shape)} != {names[1]} shape {tuple(b.shape)}"
        )


def _safe_ratio(num: float, den: float) -> float:
    if math.isnan(num) or math.isnan(den):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def rel_l2(y: torch.Tensor, ref: torch.Tensor) -> float:
    """‖y − ref‖₂ / ‖ref‖₂ in float64 (on the device of ``y``)."""
    device = y.device if isinstance(y, torch.Tensor) else "cpu"
    y64, r64 = _to_f64(y, "y", device), _to_f64(ref, "ref", device)
    _check_same_shape(y64, r64, ("y", "ref"))
    return _safe_ratio(
        float(torch.linalg.vector_norm(y64 - r64)), float(torch.linalg.vector_norm(r64))
    )


def row_cosines(y: torch.Tensor, ref: torch.Tensor, *, device: Any = "cpu") -> torch.Tensor:
    """Cosine per row (float64, on ``device``); zero/zero rows give 1, zero/non-zero rows 0."""
    y64, r64 = as_rows(_to_f64(y, "y", device)), as_rows(_to_f64(ref, "ref", device))
    _check_same_shape(y64, r64, ("y", "ref"))
    ny = torch.linalg.vector_norm(y64, dim=1)
    nr = torch.linalg.vector_norm(r64, dim=1)
    dot = (y64 * r64).sum(dim=1)
    both_zero = (ny == 0) & (nr == 0)
    one_zero = (ny == 0) ^ (nr == 0)
    denom = torch.where((ny == 0) | (nr == 0), torch.ones_like(ny), ny * nr)
    cos = dot / denom
    cos = torch.where(both_zero, torch.ones_like(cos), cos)
    return torch.where(one_zero, torch.zeros_like(cos), cos)


def row_block_rel_l2(y: torch.Tensor, ref: torch.Tensor, row_block: int = 16) -> torch.Tensor:
    """rel-L2 of each block of ``row_block`` consecutive rows (last block may be short)."""
    if isinstance(row_block, bool) or not isinstance(row_block, int) or row_block < 1:
        raise ValueError(f"row_block_rel_l2: row_block must be a positive int, got {row_block!r}")
    device = y.device if isinstance(y, torch.Tensor) else "cpu"  # reduced there, returned on CPU
    y64, r64 = as_rows(_to_f64(y, "y", device)), as_rows(_to_f64(ref, "ref", device))
    _check_same_shape(y64, r64, ("y", "ref"))
    rows = y64.shape[0]
    pad = (-rows) % row_block
    err = ((y64 - r64) ** 2).sum(dim=1)
    energy = (r64**2).sum(dim=1)
    if pad:
        err = torch.cat([err, err.new_zeros(pad)])
        energy = torch.cat([energy, energy.new_zeros(pad)])
    err_b = err.reshape(-1, row_block).sum(dim=1).sqrt()
    energy_b = energy.reshape(-1, row_block).sum(dim=1).sqrt()
    out = torch.where(energy_b == 0, torch.zeros_like(err_b), err_b / energy_b.clamp_min(1e-300))
    out = torch.where((energy_b == 0) & (err_b != 0), torch.full_like(err_b, math.inf), out)
    return out.cpu()


def tile_errors(y: torch.Tensor, ref: torch.Tensor, tile: int = 16) -> torch.Tensor:
    """Error map: RMS(y − ref) over each ``tile × tile`` block of the row matrix, divided by the
    RMS of the whole reference. Shape ``[ceil(rows/tile), ceil(cols/tile)]``, float64."""
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
        raise ValueError(f"tile_errors: tile must be a positive int, got {tile!r}")
    y64, r64 = as_rows(_to_f64(y, "y")), as_rows(_to_f64(ref, "ref"))
    _check_same_shape(y64, r64, ("y", "ref"))
    rows, cols = r64.shape
    tr, tc = -(-rows // tile), -(-cols // tile)
    sq = torch.zeros(tr * tile, tc * tile, dtype=torch.float64)
    cnt = torch.zeros_like(sq)
    sq[:rows, :cols] = (y64 - r64) ** 2
    cnt[:rows, :cols] = 1.0
    sq_t = sq.reshape(tr, tile, tc, tile).sum(dim=(1, 3))
    cnt_t = cnt.reshape(tr, tile, tc, tile).sum(dim=(1, 3))
    rms_err = (sq_t / cnt_t).sqrt()
    ref_rms = float(r64.pow(2).mean().sqrt()) if r64.numel() else 0.0
    if ref_rms == 0.0:
        return torch.where(rms_err == 0, rms_err, torch.full_like(rms_err, math.inf))
    return rms_err / ref_rms


BOUND_FIELDS = (
    "coarse_bound",
    "coarse_ratio",
    "envelope_checked",
    "envelope_violations",
    "envelope_worst_ratio",
    "envelope_worst_excess_ulp",
    "bias_mean_ulp",
    "bias_bound_ulp",
)


@dataclasses.dataclass(frozen=True)
class Metrics:
    """Every number reported for a case (see the module docstring for definitions)."""

    rel_l2: float
    max_abs_rel: float
    sqnr_db: float
    worst_row_cosine: float
    worst_row: int
    faithful_rel_l2: float | None
    ratio: float | None
    nan_count: int
    inf_count: int
    numel: int
    shape: tuple[int, ...]
    coarse_bound: float | None = None
    coarse_ratio: float | None = None
    envelope_checked: int | None = None
    envelope_violations: int | None = None
    envelope_worst_ratio: float | None = None
    envelope_worst_excess_ulp: float | None = None
    bias_mean_ulp: float | None = None
    bias_bound_ulp: float | None = None

    def with_bounds(self, **bounds: Any) -> Metrics:
        """A copy with the applied bounds filled in (only the bound fields may change)."""
        allowed = set(BOUND_FIELDS)
        unknown = set(bounds) - allowed
        if unknown:
            raise ValueError(f"Metrics.with_bounds: unknown fields {sorted(unknown)}")
        return dataclasses.replace(self, **bounds)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (non-finite floats stay floats; report.py encodes them)."""
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        return out


def compute_metrics(
    y: torch.Tensor, exact: torch.Tensor, faithful: torch.Tensor | None = None
) -> Metrics:
    """All metrics of ``y`` against the exact reference (and the faithful one when given)."""
    device = y.device if isinstance(y, torch.Tensor) else "cpu"
    y64, e64 = _to_f64(y, "y", device), _to_f64(exact, "exact", device)
    _check_same_shape(y64, e64, ("y", "exact"))
    f64 = None
    if faithful is not None:
        f64 = _to_f64(faithful, "faithful", device)
        _check_same_shape(f64, e64, ("faithful", "exact"))
    nan_count = int(torch.isnan(y64).sum())
    inf_count = int(torch.isinf(y64).sum())
    diff = y64 - e64
    err_norm = float(torch.linalg.vector_norm(diff))
    ref_norm = float(torch.linalg.vector_norm(e64))
    numel = e64.numel()
    ref_rms = ref_norm / math.sqrt(numel) if numel else 0.0
    max_abs = float(diff.abs().max()) if numel else 0.0
    if nan_count:
        max_abs = math.nan
    err_energy, ref_energy = err_norm**2, ref_norm**2
    if math.isnan(err_energy):
        sqnr = math.nan
    elif err_energy == 0.0:
        sqnr = math.inf
    elif ref_energy == 0.0 or math.isinf(err_energy):
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(ref_energy / err_energy)
    cos = row_cosines(y64, e64, device=device)
    if cos.numel():
        cos_for_min = torch.where(torch.isnan(cos), torch.full_like(cos, -math.inf), cos)
        worst_row = int(torch.argmin(cos_for_min))
        worst_cos = float(cos[worst_row])
    else:
        worst_row, worst_cos = 0, 1.0
    rel = _safe_ratio(err_norm, ref_norm)
    faithful_rel = ratio = None
    if f64 is not None:
        faithful_rel = _safe_ratio(float(torch.linalg.vector_norm(f64 - e64)), ref_norm)
        ratio = _safe_ratio(rel, faithful_rel)
    return Metrics(
        rel_l2=rel,
        max_abs_rel=_safe_ratio(max_abs, ref_rms),
        sqnr_db=sqnr,
        worst_row_cosine=worst_cos,
        worst_row=worst_row,
        faithful_rel_l2=faithful_rel,
        ratio=ratio,
        nan_count=nan_count,
        inf_count=inf_count,
        numel=numel,
        shape=tuple(int(s) for s in e64.shape),
    )
