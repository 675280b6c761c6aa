"""``python -m oracle drift CASE_ID_OR_FILE``: where a dense case's output error comes from (CPU).

Input: a grid case id (inputs regenerated from the id; no kernel output, so only *faithful vs
exact* is shown) or a saved failing case (:func:`oracle.report.results.load_case`; its inputs
must equal the ones its id generates, else it is refused as ``replay`` refuses it; its kernel
output ``y`` is compared too). Only unpaired ``dense`` cases (rotation ``full`` or ``none``),
and the saved failures of an adapted kernel (``run --kernel``: its GEMM, as rotation ``none``,
docs/adapters.md); decode and MoE cases are refused with a pointer to ``python -m oracle replay``.

References (float64, :mod:`reference.linear`): *exact* and *faithful* (the case's compute dtype);
for rotation ``none`` the raw GEMM. For each pair (faithful vs exact, kernel vs exact, kernel vs
faithful): ``max_abs``, ``mean_abs``, ``rel_l2``, ``max_abs_rel``.

The error map (with a saved kernel output): the residual ``R = y_kernel − y_faithful`` is
attributed to the decoded weight ``Wq``, assuming the kernel computed ``A @ (Wq + dW)``:
1. GEMM space: ``R_g = H128_N(R / svh)`` for ``full``, ``R`` for ``none``;
2. per K16 slice, the share of ``‖R_g‖²`` that ``A[:, s]`` explains at best (a wrong weight in
   slice ``s`` makes it explain nearly all), ranked, then by weight-space energy;
3. in weight space, ``dW = pinv(A) @ R_g``: its largest entries, its largest 16×16 tiles, and the
   worst output columns.
Limits: with ``M < K``, ``dW`` is the minimum-norm error (a wrong weight smears over its column);
with ``M ≤ 16`` the slices cannot discriminate (``slices_discriminate`` says so); errors of the
rotations, ``svh`` or the output rounding spread over whole blocks; read the map only when
``kernel vs faithful`` is well above ``faithful vs exact``. In full: docs/notes/oracle.md.

:func:`drift` is the pure function (a :class:`DriftReport`, or :class:`DriftRefused`, a one-line
``ValueError``); :func:`main` prints it, writes ``--json`` (``oracle.drift/1``,
docs/json_schemas.md) and turns every refusal into ONE stderr line with exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any, NoReturn

import torch

from oracle.arguments import nonempty, output_problem, positive_int
from oracle.cases.grids import SelectionError, resolve_case_id
from oracle.cli import refuse, write_json_or_refuse
from oracle.report.results import CaseFileError, jsonable, load_case, same_bits
from oracle.run.adapter import reference_weight, saved_adapter_case
from oracle.run.replay import check_grid_case
from oracle.run.runners import inputs as case_inputs
from reference.hadamard import apply_blockwise
from reference.linear import (
    faithful_gemm,
    faithful_gemm_compute,
    faithful_input_rotation,
    forward_decoded,
)
from reference.trellis import decode

__all__ = [
    "SCHEMA",
    "ColumnScore",
    "DriftRefused",
    "DriftReport",
    "ErrorMap",
    "ErrorStats",
    "SliceScore",
    "TileScore",
    "WeightEntry",
    "build_parser",
    "drift",
    "error_map",
    "error_stats",
    "main",
]

SCHEMA = "oracle.drift/1"
PROG = "python -m oracle drift"
NOT_AVAILABLE = "not available (no saved output)"
COMPARISONS = ("faithful_vs_exact", "kernel_vs_exact", "kernel_vs_faithful")
_COLUMN_BLOCK_ELEMENTS = 1 << 22  # dW is built N-block by N-block: at most this many per block


class DriftRefused(ValueError):
    """An input drift cannot diagnose (op, pairs, a file that disagrees with its id)."""


# --- data ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ErrorStats:
    """``a`` against the reference ``b`` (module docstring)."""

    max_abs: float
    mean_abs: float
    rel_l2: float
    max_abs_rel: float


@dataclasses.dataclass(frozen=True)
class SliceScore:
    slice: int
    k_start: int
    k_stop: int  # exclusive
    explained: float  # share of ‖R_g‖² this slice alone explains (least squares)
    weight_norm: float  # ‖dW[k_start:k_stop, :]‖


@dataclasses.dataclass(frozen=True)
class WeightEntry:
    k: int
    n: int
    estimate: float  # dW[k, n]
    decoded: float  # Wq[k, n]


@dataclasses.dataclass(frozen=True)
class TileScore:
    kt: int
    nt: int
    norm: float  # ‖dW[16kt:16kt+16, 16nt:16nt+16]‖


@dataclasses.dataclass(frozen=True)
class ColumnScore:
    n: int
    norm: float  # ‖R_g[:, n]‖


@dataclasses.dataclass(frozen=True)
class ErrorMap:
    """The kernel − faithful residual attributed to the decoded weight (module docstring)."""

    residual_norm: float  # ‖R_g‖ (GEMM space)
    rank: int  # rank of the A operand
    least_squares: str  # "unique" (rank K) or "minimum-norm"
    slices_discriminate: bool
    slices: tuple[SliceScore, ...]
    entries: tuple[WeightEntry, ...]
    tiles: tuple[TileScore, ...]
    columns: tuple[ColumnScore, ...]


@dataclasses.dataclass(frozen=True)
class DriftReport:
    case_id: str
    variant: str
    m: int
    k: int
    n: int
    rotation: str
    compute_dtype: str
    source: str  # "case id" or "saved case"
    path: str | None
    execution: str | None
    note: str | None
    top: int
    comparisons: dict[str, ErrorStats | None]
    error_map: ErrorMap | None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **jsonable(dataclasses.asdict(self))}


# --- numbers ------------------------------------------------------------------------------------


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def error_stats(a: torch.Tensor, b: torch.Tensor) -> ErrorStats:
    """max / mean absolute error, rel-L2 and max-abs over RMS(b), all in float64."""
    a64, b64 = _f64(a), _f64(b)
    diff = (a64 - b64).abs()
    ref_norm = float(torch.linalg.vector_norm(b64))
    err_norm = float(torch.linalg.vector_norm(a64 - b64))
    rms = ref_norm / math.sqrt(max(b64.numel(), 1))

    def ratio(num: float, den: float) -> float:
        if den == 0.0:
            return 0.0 if num == 0.0 else math.inf
        return num / den

    max_abs = float(diff.max()) if diff.numel() else 0.0
    mean_abs = float(diff.mean()) if diff.numel() else 0.0
    return ErrorStats(max_abs, mean_abs, ratio(err_norm, ref_norm), ratio(max_abs, rms))


def _rank_tol(s: torch.Tensor, rows: int, cols: int) -> float:
    if s.numel() == 0:
        return math.inf
    return float(s.max()) * max(rows, cols) * torch.finfo(torch.float64).eps


def error_map(
    residual: torch.Tensor, operand: torch.Tensor, weight: torch.Tensor, *, top: int = 5
) -> ErrorMap:
    """Attribute a GEMM-space residual ``R_g [M, N]`` of ``operand @ weight`` (``operand``
    ``A [M, K]``, ``weight`` the decoded ``Wq [K, N]``) to K16 slices and to weight entries and
    16×16 tiles (module docstring, steps 2-3). Pure; float64; built N-block by N-block."""
    r_g, a = _f64(residual), _f64(operand)
    m, k = a.shape
    n = r_g.shape[1]
    if r_g.shape[0] != m or tuple(weight.shape) != (k, n) or k % 16 or n % 16:
        raise ValueError(
            f"error_map: residual {tuple(r_g.shape)}, operand {tuple(a.shape)} and weight "
            f"{tuple(weight.shape)} do not form [M, N] = [M, K] @ [K, N] with K, N % 16 == 0"
        )
    slices = k // 16
    u, s, _ = torch.linalg.svd(a, full_matrices=False)
    rank = int((s > _rank_tol(s, m, k)).sum())
    pinv = torch.linalg.pinv(a)  # [K, M]: minimum-norm least squares
    # orthonormal bases of each slice's column space: [S, M, r]; rank-deficient parts masked out
    us, ss, _ = torch.linalg.svd(a.reshape(m, slices, 16).permute(1, 0, 2), full_matrices=False)
    keep = ss > torch.tensor([_rank_tol(x, m, 16) for x in ss]).unsqueeze(1)
    us = us * keep.unsqueeze(1)
    slice_ranks = keep.sum(dim=1)
    explained = torch.zeros(slices, dtype=torch.float64)
    slice_energy = torch.zeros(slices, dtype=torch.float64)
    tile_norms = torch.zeros(slices, n // 16, dtype=torch.float64)
    best_vals = torch.empty(0, dtype=torch.float64)
    best_idx = torch.empty(0, dtype=torch.int64)
    block = max(16, (_COLUMN_BLOCK_ELEMENTS // max(k, 1)) // 16 * 16)
    for start in range(0, n, block):
        stop = min(n, start + block)
        r_blk = r_g[:, start:stop]
        dw = pinv @ r_blk  # [K, nb]
        nb = stop - start
        tiles = dw.reshape(slices, 16, nb // 16, 16).pow(2).sum(dim=(1, 3))
        tile_norms[:, start // 16 : stop // 16] = tiles.sqrt()
        slice_energy += tiles.sum(dim=1)
        explained += torch.einsum("smr,mn->srn", us, r_blk).pow(2).sum(dim=(1, 2))
        flat = dw.abs().flatten()
        count = min(top, flat.numel())
        vals, idx = flat.topk(count)
        rows, cols = idx // nb, idx % nb + start
        best_vals = torch.cat([best_vals, vals])
        best_idx = torch.cat([best_idx, rows * n + cols])
        keep_best = best_vals.topk(min(top, best_vals.numel())).indices
        best_vals, best_idx = best_vals[keep_best], best_idx[keep_best]
    total = float(r_g.pow(2).sum())
    shares = explained / total if total > 0 else torch.zeros_like(explained)
    weight_norms = slice_energy.sqrt()
    order = sorted(
        range(slices), key=lambda i: (-round(float(shares[i]), 9), -float(weight_norms[i]), i)
    )
    w = weight.detach().to("cpu")
    entries = []
    for flat_index in best_idx.tolist():
        kk, nn = divmod(int(flat_index), n)
        estimate = float(pinv[kk] @ r_g[:, nn])
        if estimate != 0.0:
            entries.append(WeightEntry(kk, nn, estimate, float(w[kk, nn])))
    entries.sort(key=lambda e: (-abs(e.estimate), e.k, e.n))
    tile_flat = tile_norms.flatten()
    tile_top = tile_flat.topk(min(top, tile_flat.numel())).indices.tolist()
    tile_top = [i for i in tile_top if tile_flat[i] > 0]
    tiles_out = [TileScore(i // (n // 16), i % (n // 16), float(tile_flat[i])) for i in tile_top]
    col_norms = r_g.pow(2).sum(dim=0).sqrt()
    col_top = [c for c in col_norms.topk(min(top, n)).indices.tolist() if col_norms[c] > 0]
    return ErrorMap(
        residual_norm=math.sqrt(total),
        rank=rank,
        least_squares="unique" if rank == k else "minimum-norm",
        slices_discriminate=bool((slice_ranks < rank).any()),
        slices=tuple(
            SliceScore(i, 16 * i, 16 * i + 16, float(shares[i]), float(weight_norms[i]))
            for i in order[:top]
        ),
        entries=tuple(entries[:top]),
        tiles=tuple(tiles_out),
        columns=tuple(ColumnScore(int(c), float(col_norms[c])) for c in col_top),
    )


# --- the case -----------------------------------------------------------------------------------


def _load(source: str) -> tuple[Any, Any]:
    """``(case, loaded file or None)`` for a case id or a saved case path."""
    if not isinstance(source, str) or not source.strip():
        raise DriftRefused(
            f"CASE_ID_OR_FILE: expected a grid case id (see `python -m oracle grid`) or a saved "
            f"case file (.json/.safetensors), got {source!r}"
        )
    path = Path(source)
    if (
        path.suffix in (".json", ".safetensors")
        or path.exists()
        or path.with_name(path.name + ".json").exists()
    ):
        try:
            loaded = load_case(path)
            if loaded.meta.get("kind") == "adapter":
                return saved_adapter_case(loaded), loaded
            return check_grid_case(loaded), loaded
        except CaseFileError as exc:
            raise DriftRefused(f"CASE_ID_OR_FILE: {exc}") from None
    try:
        return resolve_case_id(source.strip()), None
    except SelectionError as exc:
        raise DriftRefused(
            f"CASE_ID_OR_FILE: {source!r} is no saved case file and not a grid case id: {exc}"
        ) from None


def _check_supported(case: Any) -> None:
    v = case.variant
    if v.op == "moe":
        raise DriftRefused(
            f"CASE_ID_OR_FILE: drift supports dense cases; {case.case_id} is a MoE case: use "
            "`python -m oracle replay` (ops accepted: dense)"
        )
    if v.op != "dense":
        raise DriftRefused(
            f"CASE_ID_OR_FILE: drift supports dense cases; {case.case_id} is a {v.op} case, "
            "judged bit for bit: use `python -m oracle replay` (ops accepted: dense)"
        )
    if v.pair_kind is not None:
        raise DriftRefused(
            f"CASE_ID_OR_FILE: drift supports unpaired dense cases; {v.name} is paired "
            f"({v.pair_kind}) (pair kinds accepted: none)"
        )
    if v.rotation not in ("full", "none"):
        raise DriftRefused(
            f"CASE_ID_OR_FILE: drift supports rotation full or none, {v.name} has {v.rotation}"
        )


def _inputs(case: Any, loaded: Any) -> dict[str, torch.Tensor]:
    """The runner's seeded inputs of ``case``; a saved file's inputs must equal them."""
    regenerated = case_inputs.dense_inputs(case, "cpu")
    if loaded is None:
        return regenerated
    for name, want in regenerated.items():
        got = loaded.tensors.get(name)
        if got is None:
            continue
        if not same_bits(got, want):
            raise DriftRefused(
                f"CASE_ID_OR_FILE: {loaded.path}: saved `{name}` differs from the input case "
                f"{case.case_id} generates: the file does not belong to its case id"
            )
    return regenerated


def _references(case: Any, tensors: dict[str, torch.Tensor]):
    """``(exact f64, faithful, Wq, A operand f64, to_gemm_space)`` of a dense case."""
    cd = case_inputs.compute_dtype(case)
    x, suh, svh = tensors["x"], tensors["suh"], tensors["svh"]
    weight = decode(tensors["trellis"], case.variant.codebook)
    if case.variant.rotation == "full":
        exact = forward_decoded(x, weight, suh, svh, precision="exact")
        faithful = forward_decoded(x, weight, suh, svh, precision="faithful", compute_dtype=cd)
        operand = faithful_input_rotation(x, suh).to(cd)
        svh64 = svh.to(torch.float64)

        def to_gemm(r: torch.Tensor) -> torch.Tensor:
            return apply_blockwise(r / svh64, dim=-1)

    else:
        exact = x.to(torch.float64) @ weight.to(torch.float64)
        faithful = faithful_gemm(x.to(torch.float16), weight, cd).to(x.dtype)
        operand = x.to(torch.float16).to(cd)

        def to_gemm(r: torch.Tensor) -> torch.Tensor:
            return r

    return exact, faithful, weight, _f64(operand), to_gemm


def drift(source: str, *, top: int = 5) -> DriftReport:
    """The drift report of a grid case id or a saved case file (module docstring)."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise DriftRefused(f"--top: expected a positive integer, got {top!r}")
    case, loaded = _load(source)
    if isinstance(case, tuple):  # a case saved by an adapted kernel (run --kernel)
        return _adapter_drift(*case, loaded, top=top)
    _check_supported(case)
    tensors = _inputs(case, loaded)
    exact, faithful, weight, operand, to_gemm = _references(case, tensors)
    comparisons: dict[str, ErrorStats | None] = {
        "faithful_vs_exact": error_stats(faithful, exact),
        "kernel_vs_exact": None,
        "kernel_vs_faithful": None,
    }
    emap = None
    meta: dict[str, Any] = {} if loaded is None else loaded.meta
    if loaded is not None:
        y = loaded.tensors["y"]
        comparisons["kernel_vs_exact"] = error_stats(y, exact)
        comparisons["kernel_vs_faithful"] = error_stats(y, faithful)
        residual = to_gemm(_f64(y) - _f64(faithful))
        emap = error_map(residual, operand, weight, top=top)
    v = case.variant
    return DriftReport(
        case_id=case.case_id,
        variant=v.name,
        m=case.m,
        k=case.k,
        n=case.n,
        rotation=v.rotation,
        compute_dtype=v.compute_dtype,
        source="case id" if loaded is None else "saved case",
        path=None if loaded is None else str(loaded.path),
        execution=meta.get("execution") if isinstance(meta.get("execution"), str) else None,
        note=meta.get("note") if isinstance(meta.get("note"), str) else None,
        top=top,
        comparisons=comparisons,
        error_map=emap,
    )


def _adapter_drift(adapter, case, tensors, loaded, *, top: int) -> DriftReport:
    """An adapted kernel's saved GEMM (rotation ``none``): ``y ≈ x @ (scale · W)``."""
    weight = reference_weight(adapter, case, tensors)
    x, y = tensors["x"], loaded.tensors["y"]
    exact = _f64(x) @ weight
    faithful = faithful_gemm_compute(x, weight, compute_dtype=case.compute_dtype)
    comparisons = {
        "faithful_vs_exact": error_stats(faithful, exact),
        "kernel_vs_exact": error_stats(y, exact),
        "kernel_vs_faithful": error_stats(y, faithful),
    }
    emap = error_map(_f64(y) - _f64(faithful), _f64(x), weight, top=top)
    return DriftReport(
        case_id=case.case_id, variant=f"{adapter.name}/{case.op}/{case.fmt}", m=case.m,
        k=case.k, n=case.n, rotation="none", compute_dtype=case.dtype,
        source="saved case", path=str(loaded.path), execution=loaded.meta.get("execution"),
        note=f"kernel {adapter.name} through its adapter", top=top, comparisons=comparisons,
        error_map=emap,
    )  # fmt: skip


# --- text ---------------------------------------------------------------------------------------


def _g(value: float) -> str:
    return f"{value:.4g}"


def format_report(r: DriftReport) -> str:
    lines = [
        f"drift: {r.case_id} ({r.variant}; M={r.m} K={r.k} N={r.n}, rotation {r.rotation}, "
        f"compute {r.compute_dtype})",
    ]
    if r.path is None:
        lines.append("source: grid case id (inputs regenerated from its seed; no kernel output)")
    else:
        extra = "".join(
            f"; {label} {value}"
            for label, value in (("execution", r.execution), ("note", r.note))
            if value
        )
        lines.append(f"source: saved case {r.path}{extra} (inputs equal the id's)")
    header = f"  {'':<20}{'max_abs':>12}{'mean_abs':>12}{'rel_l2':>12}{'max_abs_rel':>13}"
    lines += ["errors (a vs b, float64):", header]
    for name in COMPARISONS:
        stats = r.comparisons.get(name)
        label = name.replace("_vs_", " vs ")
        if stats is None:
            lines.append(f"  {label:<20}{NOT_AVAILABLE}")
        else:
            lines.append(
                f"  {label:<20}{_g(stats.max_abs):>12}{_g(stats.mean_abs):>12}"
                f"{_g(stats.rel_l2):>12}{_g(stats.max_abs_rel):>13}"
            )
    e = r.error_map
    if e is None:
        lines.append(f"error map (kernel - faithful): {NOT_AVAILABLE}")
        return "\n".join(lines)
    lines.append(
        f"error map of kernel - faithful in decoded-weight (Wq) coordinates: GEMM-space residual "
        f"norm {_g(e.residual_norm)}; A operand rank {e.rank} of K={r.k} ({e.least_squares} "
        "least squares)"
    )
    note = "" if e.slices_discriminate else " — M too small: every slice spans A, ranked by |dW|"
    lines.append(
        f"  per K16 slice (share of the residual it alone explains; |dW| of the slice){note}:"
    )
    for s in e.slices:
        rows = f"k {s.k_start}..{s.k_stop - 1}"
        lines.append(
            f"    slice {s.slice:<5} {rows:<14} explained {s.explained:.4f}  "
            f"|dW| {_g(s.weight_norm)}"
        )
    lines.append("  in weight space, largest |dW| entries (dW = pinv(A) @ R):")
    for w in e.entries:
        lines.append(
            f"    (k={w.k}, n={w.n})  dW {_g(w.estimate):>11}  decoded Wq {_g(w.decoded)}"
            f"  tile ({w.k // 16}, {w.n // 16})"
        )
    if not e.entries:
        lines.append("    none (zero residual)")
    lines.append("  per 16x16 weight tile, largest ||dW||:")
    for t in e.tiles:
        lines.append(
            f"    tile ({t.kt}, {t.nt})  k {16 * t.kt}..{16 * t.kt + 15}  "
            f"n {16 * t.nt}..{16 * t.nt + 15}  norm {_g(t.norm)}"
        )
    if not e.tiles:
        lines.append("    none (zero residual)")
    columns = ", ".join(f"n={c.n} ({_g(c.norm)})" for c in e.columns) or "none (zero residual)"
    lines.append(f"  worst output columns (GEMM space): {columns}")
    return "\n".join(lines)


# --- command line -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's hook: one line, exit 2
        refuse(PROG, f"{message} (see {PROG} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source",
        metavar="CASE_ID_OR_FILE",
        help="a grid case id (python -m oracle grid) or a saved case (.json/.safetensors)",
    )
    parser.add_argument("--json", metavar="FILE", type=nonempty, help="write the report as JSON")
    parser.add_argument(
        "--top", type=positive_int, default=5, metavar="N", help="rows per map (default 5)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Print the drift report (module docstring); a refusal is one stderr line and exit 2
    (:class:`oracle.cli.Refused`)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.json is not None and (problem := output_problem(args.json)):
        refuse(PROG, f"--json: {problem}")
    try:
        report = drift(args.source, top=args.top)
    except DriftRefused as exc:
        refuse(PROG, str(exc))
    print(format_report(report))
    if args.json:
        write_json_or_refuse(PROG, args.json, report.to_dict())
        print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
