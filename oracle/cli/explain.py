"""``python -m oracle explain``: the plan b12x would make for one problem, without a GPU.

What it shows:
* ``--op dense`` (default): :func:`b12x.ops.dense.plan.plan_dense` on a *simulated* part
  (``--arch`` / ``--device``): the path and **every** row of the dispatch, mainloop and split-K
  tables (taken, rejected with the first failed condition, or not reached), the tile, the kernel
  geometry, the split and the plan's buffer specs (nothing is allocated).
* ``--op moe``: :func:`b12x.ops.moe.plan.plan_moe` on the same part: every recorded
  :class:`~b12x.ops.moe.plan.Decision` with its table's reasons, the grouped-GEMM
  specialisations and the buffer specs. In full: docs/notes/oracle.md.

The pure functions :func:`explain_dense` and :func:`explain_moe` return frozen data objects
(:class:`DenseExplanation`, :class:`MoeExplanation`) that the CLI prints and ``--json`` writes
(``{"schema": "oracle.explain/1", ...}``, docs/json_schemas.md). They raise :class:`PlanRefused` (a
``ValueError``) carrying the plan validator's own message for an invalid problem (``bits`` 9, ``K``
not a multiple of 128, an unknown codebook, ...); :func:`main` turns those, and every bad argument,
into ONE refusal line on stderr and exit 2 (:func:`oracle.cli.refuse`, which raises
:class:`oracle.cli.Refused`).

Rotation ``none`` plans with an external H128 (``external_rotation=True``), as the raw-GEMM
runner does (:func:`oracle.run.runners.dense.identity_h128`); ``full`` is the EXL3 linear.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import torch

from b12x.ops.dense import dispatch, mainloop, split_k, tiles
from b12x.ops.dense.plan import plan_dense
from oracle.arguments import nonempty, output_problem
from oracle.cli import refuse, write_json_or_refuse
from oracle.judge.tiles import DEVICES

__all__ = [
    "ARCHES",
    "SCHEMA",
    "BufferRow",
    "DecisionRow",
    "DenseExplanation",
    "MoeExplanation",
    "PlanRefused",
    "TableRow",
    "build_parser",
    "explain_dense",
    "explain_moe",
    "main",
    "simulated_device",
]

SCHEMA = "oracle.explain/1"
PROG = "python -m oracle explain"
#: ``--arch`` → compute capability; the part is the first of :data:`oracle.judge.tiles.DEVICES`
#: with it.
ARCHES: Mapping[str, tuple[int, int]] = {"sm_80": (8, 0), "sm_90": (9, 0), "sm_120": (12, 0)}
DTYPES = ("fp16", "bf16")
ROTATIONS = ("full", "none")
W13_LAYOUTS = ("packed", "proj")


class PlanRefused(ValueError):
    """An argument or problem the plan refuses; the message is one line naming the argument
    (for a problem the planner rejects: ``"plan_dense: <the validator's message>"``)."""


# --- data ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TableRow:
    """One row of a declarative table as this case meets it.

    ``status``: ``"taken"`` (the first row whose conditions all hold), ``"rejected"`` (a row above
    it; ``reason`` is its first failed condition) or ``"not reached"`` (a row below it; ``reason``
    says whether it would also match or which condition it would fail)."""

    index: int
    row: str
    status: str
    reason: str
    description: str = ""


@dataclasses.dataclass(frozen=True)
class BufferRow:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    zeroed: bool
    nbytes: int


@dataclasses.dataclass(frozen=True)
class DecisionRow:
    """One :class:`b12x.ops.moe.plan.Decision` plus the table's reasons for its case."""

    role: str
    table: str
    case: dict[str, Any]
    path: str
    value: Any
    reasons: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class DenseExplanation:
    problem: dict[str, Any]
    device: dict[str, Any]
    path: str
    rows: tuple[TableRow, ...]
    tile: str | None
    geometry: dict[str, int]
    split_row: str
    split_requested: int
    split_k: int
    split_rows: tuple[TableRow, ...]
    buffers: tuple[BufferRow, ...]
    kernels: tuple[str, ...]
    mainloop_row: str = ""
    mainloop_rows: tuple[TableRow, ...] = ()
    op: str = "dense"
    #: The tile's registry name (``b12x.ops.dense.tiles``), ``None`` without a tile.
    tile_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **_plain(dataclasses.asdict(self))}


@dataclasses.dataclass(frozen=True)
class MoeExplanation:
    problem: dict[str, Any]
    device: dict[str, Any]
    decisions: tuple[DecisionRow, ...]
    kernels: tuple[str, ...]
    buffers: tuple[BufferRow, ...]
    op: str = "moe"

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **_plain(dataclasses.asdict(self))}


def _plain(value: Any) -> Any:
    """JSON-ready: NamedTuples and dataclasses as objects, tuples as lists, dtypes as names."""
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value).removeprefix("torch.")


def _show(value: Any) -> str:
    """A compact text form of a table value (dataclass / NamedTuple fields inline)."""
    plain = _plain(value)
    if isinstance(plain, dict):
        return "(" + ", ".join(f"{k}={v}" for k, v in plain.items()) + ")"
    return str(plain)


def _show_spec(spec: Any) -> str:
    """A kernel specialisation: its class and the fields that differ from their defaults."""
    parts = []
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.default is dataclasses.MISSING or value != f.default:
            nested = dataclasses.is_dataclass(value) and f.name == "geometry"
            parts.append(f"{f.name}={_show_spec(value) if nested else _plain(value)}")
    return f"{type(spec).__name__}(" + ", ".join(parts) + ")"


# --- helpers ------------------------------------------------------------------------------------


def simulated_device(arch: str | None = None, name: str | None = None) -> Any:
    """The simulated part of :data:`oracle.judge.tiles.DEVICES` named ``name``, else the first one
    of ``arch``'s capability (default ``sm_90``). An unknown name or arch raises
    :class:`PlanRefused` listing the accepted ones."""
    if name is not None:
        for device in DEVICES:
            if device.name == name:
                return device
        known = ", ".join(d.name for d in DEVICES)
        raise PlanRefused(f"--device: unknown simulated part {name!r}; known: {known}")
    arch = arch or "sm_90"
    if arch not in ARCHES:
        raise PlanRefused(f"--arch: unknown arch {arch!r}; known: {', '.join(ARCHES)}")
    for device in DEVICES:
        if tuple(device.capability) == ARCHES[arch]:
            return device
    raise ValueError(f"--arch: no simulated part of capability {ARCHES[arch]}")  # unreachable


def _dtype(text: str, flag: str) -> Any:
    table = {"fp16": torch.float16, "bf16": torch.bfloat16}
    if text not in table:
        raise PlanRefused(f"{flag}: unknown dtype {text!r}; known: {', '.join(table)}")
    return table[text]


def _device_dict(device: Any) -> dict[str, Any]:
    return {
        "name": device.name,
        "capability": list(device.capability),
        "sm_count": device.sm_count,
        "max_shared_mem": device.max_shared_mem,
        "simulated": True,
    }


def _buffer_rows(specs: Sequence[Any]) -> tuple[BufferRow, ...]:
    return tuple(
        BufferRow(
            s.name,
            tuple(s.shape),
            str(s.dtype).removeprefix("torch."),
            s.role,
            bool(s.zeroed),
            int(s.nbytes),
        )
        for s in specs
    )


def _table_rows(paths: Sequence[Any], norm: Mapping[str, Any]) -> tuple[TableRow, ...]:
    """Every row of a table for the normalised case ``norm`` (see :class:`TableRow`)."""
    rows, taken = [], False
    for i, row in enumerate(paths, 1):
        failed = row.failed(norm)
        why = "matches" if failed is None else failed.describe(norm)
        if taken:
            status = "not reached"
            reason = "would also match" if failed is None else f"would fail: {why}"
        elif failed is None:
            status, reason, taken = "taken", "all conditions hold", True
        else:
            status, reason = "rejected", why
        rows.append(TableRow(i, row.name, status, reason, getattr(row, "description", "")))
    return tuple(rows)


# --- dense --------------------------------------------------------------------------------------


def explain_dense(
    *,
    m: int,
    k: int,
    n: int,
    codebook: str,
    bits: int,
    arch: str | None = "sm_90",
    device: str | None = None,
    x_dtype: str = "fp16",
    compute_dtype: str | None = None,
    rotation: str = "full",
    tile: str | None = None,
) -> DenseExplanation:
    """The dense plan b12x makes for this problem on a simulated part (module docstring).
    ``compute_dtype`` defaults to ``x_dtype``. Raises :class:`PlanRefused` with the plan
    validator's message for an invalid problem or argument."""
    part = simulated_device(arch, device)
    if rotation not in ROTATIONS:
        known = ", ".join(ROTATIONS)
        raise PlanRefused(f"--rotation: unknown rotation {rotation!r}; known: {known}")
    xd = _dtype(x_dtype, "--x-dtype")
    cd = _dtype(compute_dtype or x_dtype, "--compute-dtype")
    external = rotation == "none"
    try:
        plan = plan_dense(
            m=m, k=k, n=n, bits=bits, codebook=codebook, x_dtype=xd, compute_dtype=cd,
            external_rotation=external, tile=tile, device=part,
        )  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise PlanRefused(f"plan_dense: {exc}") from None
    p = plan.problem
    # the case plan_dense hands the dispatch table (b12x/ops/dense/plan.py), rebuilt to show each
    # row
    case = dispatch.normalize_case(
        {
            "capability": tuple(plan.device.capability),
            "m": p.m,
            "bits": p.bits,
            "codebook": p.codebook,
            "pair_kind": None,
            "compute_dtype": cd,
            "external_rotation": external,
            "explicit_tile": None if tile is None else tuple(tiles.serialize(plan.tile)),
        }
    )
    rows = _table_rows(dispatch.TABLE.paths, case)
    loop_case = mainloop.TABLE.schema.normalize(
        {"path": plan.path, "m": p.m, "n": p.n, "bits": p.bits, "pinned": tile is not None}
    )
    loop = mainloop.TABLE.explain(loop_case)
    shared = loop.value
    g = plan.geometry
    if (0 if shared is None else shared.m_warps) != g.m_warps:  # the plan must agree too
        raise RuntimeError(f"mainloop table says {loop.path}, plan_dense has m_warps={g.m_warps}")
    split_case = split_k.normalize_case(
        {
            "path": plan.path,
            "requested": None,
            "planned": None if shared is None else shared.split_k,
            "m": p.m,
            "k": p.k,
            "n": p.n,
            "m_tiles": g.m_tiles * max(1, g.m_warps),  # M16 blocks per CTA
            "n_tiles": g.n_tiles,
            "warps": g.warps,
            "sm_count": plan.device.sm_count,
        }
    )
    split = split_k.TABLE.explain(split_case)
    taken = next(r.row for r in rows if r.status == "taken")
    if taken != plan.path:  # the table and the plan must agree; say so rather than hide it
        raise RuntimeError(f"dispatch table says {taken}, plan_dense chose {plan.path}")
    chosen = plan.tile
    return DenseExplanation(
        problem={
            "m": p.m, "k": p.k, "n": p.n, "codebook": p.codebook, "bits": p.bits,
            "x_dtype": x_dtype, "compute_dtype": compute_dtype or x_dtype, "rotation": rotation,
            "external_rotation": external,
        },
        device=_device_dict(part),
        path=plan.path,
        rows=rows,
        tile=None if chosen is None else chosen.shape,
        tile_name=None if chosen is None else chosen.name,
        geometry={
            "m_tiles": g.m_tiles, "n_tiles": g.n_tiles, "warps": g.warps, "m_warps": g.m_warps,
            "shared_rows": g.shared_rows, "smem_stages": g.smem_stages, "wgmma": int(g.wgmma),
            "swap_ab": int(g.swap_ab), "cluster": g.cluster, "stream_k": int(g.stream_k),
        },
        mainloop_row=loop.path,
        mainloop_rows=_table_rows(mainloop.TABLE.paths, loop_case),
        split_row=split.path,
        split_requested=split.split_k,
        split_k=plan.split_k,
        split_rows=_table_rows(split_k.TABLE.paths, split_case),
        buffers=_buffer_rows(plan.buffers),
        kernels=tuple(_show_spec(s) for s in plan.kernel_specs),
    )  # fmt: skip


# --- moe ----------------------------------------------------------------------------------------


def explain_moe(
    *,
    m: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    codebook: str,
    bits: int,
    experts: int,
    pair: str | None = None,
    arch: str | None = "sm_90",
    device: str | None = None,
    x_dtype: str = "fp16",
    compute_dtype: str | None = None,
    w13_layout: str = "packed",
) -> MoeExplanation:
    """The MoE plan b12x makes on a simulated part: its decisions and buffers (module
    docstring). ``pair`` (a kind or ``"dynamic"``) pairs both phases. Raises
    :class:`PlanRefused` with the plan validator's message for an invalid problem."""
    # lazy: CUTLASS stays off `explain --op dense`
    from b12x.ops.moe.dispatch import TABLES_BY_NAME
    from b12x.ops.moe.plan import plan_moe

    part = simulated_device(arch, device)
    xd = _dtype(x_dtype, "--x-dtype")
    cd = _dtype(compute_dtype or x_dtype, "--compute-dtype")
    try:
        plan = plan_moe(
            m=m, top_k=top_k, hidden=hidden, intermediate=intermediate, codebook=codebook,
            bits=bits, num_experts=experts, w13_layout=w13_layout, x_dtype=xd,
            compute_dtype=cd, fc1_pair=pair, fc2_pair=pair, device=part,
        )  # fmt: skip
    except (ValueError, TypeError) as exc:
        note = " (--pair sets fc1_pair and fc2_pair)" if "_pair" in str(exc) else ""
        raise PlanRefused(f"plan_moe: {exc}{note}") from None
    decisions = []
    for d in plan.decisions:
        table = TABLES_BY_NAME.get(d.table)
        reasons = table.explain(dict(d.case)).reasons if table is not None else ()
        decisions.append(DecisionRow(d.role, d.table, dict(d.case), d.path, d.value, reasons))
    p = plan.problem
    return MoeExplanation(
        problem={
            "m": p.m, "top_k": p.top_k, "hidden": p.hidden, "intermediate": p.intermediate,
            "codebook": p.codebook, "bits": bits, "experts": experts, "pair": pair,
            "w13_layout": w13_layout, "x_dtype": x_dtype,
            "compute_dtype": compute_dtype or x_dtype,
        },
        device=_device_dict(part),
        decisions=tuple(decisions),
        kernels=tuple(_show_spec(s) for s in plan.kernel_specs),
        buffers=_buffer_rows(plan.buffers),
    )  # fmt: skip


# --- text ---------------------------------------------------------------------------------------


def _device_line(device: Mapping[str, Any]) -> str:
    major, minor = device["capability"]
    return (
        f"device: {device['name']} (simulated sm_{major}{minor}: capability ({major}, {minor}), "
        f"{device['sm_count']} SMs, {device['max_shared_mem']} B shared memory per block)"
    )


def _rows_text(rows: Sequence[TableRow]) -> list[str]:
    width = max(len(r.row) for r in rows)
    return [f"  {r.index}. {r.row:<{width}}  {r.status:<11}  {r.reason}" for r in rows]


def _buffers_text(buffers: Sequence[BufferRow]) -> list[str]:
    if not buffers:
        return ["  (none)"]
    width = max(len(b.name) for b in buffers)
    out = []
    for b in buffers:
        flags = f"{b.role}" + (", zeroed" if b.zeroed else "")
        shape = "[" + ", ".join(map(str, b.shape)) + "]"
        out.append(f"  {b.name:<{width}}  {shape:<20} {b.dtype:<9} {flags} ({b.nbytes} B)")
    return out


def format_dense(e: DenseExplanation) -> str:
    p = e.problem
    lines = [
        f"dense plan: M={p['m']} K={p['k']} N={p['n']} codebook={p['codebook']} bits={p['bits']} "
        f"x={p['x_dtype']} compute={p['compute_dtype']} rotation={p['rotation']}",
        _device_line(e.device),
        f"path: {e.path}",
        "dispatch rows (priority order):",
        *_rows_text(e.rows),
        "tile: "
        + (
            f"{e.tile_name} ({e.tile})"
            if e.tile
            else f"none (the {e.path} path launches no generic-GEMM tile)"
        )
        + (
            " (qualified; the shared decode's geometry below replaces its warps and N tiles)"
            if e.geometry.get("m_warps")
            else ""
        ),  # fmt: skip
        f"mainloop: row {e.mainloop_row} (m_warps=0: per-warp decode; >0: shared decode)",
        "mainloop rows (priority order):",
        *_rows_text(e.mainloop_rows),
        "kernel geometry: " + ", ".join(f"{k}={v}" for k, v in e.geometry.items()),
        f"split-K: row {e.split_row}, requested {e.split_requested}, launched {e.split_k}",
        "split-K rows (priority order):",
        *_rows_text(e.split_rows),
        "kernels: " + "; ".join(e.kernels),
        "buffers (specs only, nothing allocated):",
        *_buffers_text(e.buffers),
    ]
    return "\n".join(lines)


def format_moe(e: MoeExplanation) -> str:
    p = e.problem
    lines = [
        f"moe plan: M={p['m']} top_k={p['top_k']} hidden={p['hidden']} "
        f"intermediate={p['intermediate']} experts={p['experts']} codebook={p['codebook']} "
        f"bits={p['bits']} pair={p['pair']} w13={p['w13_layout']} x={p['x_dtype']} "
        f"compute={p['compute_dtype']}",
        _device_line(e.device),
        "decisions (in planning order):",
    ]
    for d in e.decisions:
        case = ", ".join(f"{k}={v}" for k, v in d.case.items())
        lines.append(f"  {d.role}: table {d.table} -> {d.path} = {_show(d.value)}")
        lines.append(f"      case: {case}")
        for reason in d.reasons:
            lines.append(f"      {reason}")
    lines.append("kernels: " + "; ".join(e.kernels))
    lines.append("buffers (specs only, nothing allocated):")
    lines.extend(_buffers_text(e.buffers))
    return "\n".join(lines)


# --- command line -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's hook: one line, exit 2
        refuse(PROG, f"{message} (see {PROG} --help)")


DENSE_ONLY = ("k", "n", "rotation", "tile")
MOE_ONLY = ("top_k", "hidden", "intermediate", "experts", "pair", "w13_layout")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", choices=("dense", "moe"), default="dense")
    parser.add_argument("--m", type=int, required=True, help="rows (tokens) planned for")
    parser.add_argument("--k", type=int, help="dense: in features (reduction)")
    parser.add_argument("--n", type=int, help="dense: out features")
    parser.add_argument("--codebook", required=True, help="3inst, mcg, mul1, sqg_e4m3, sqg_fp16")
    parser.add_argument("--bits", type=int, required=True, help="trellis bit rate")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--arch", choices=tuple(ARCHES), help="simulated arch (default sm_90)")
    where.add_argument("--device", help="a simulated part of oracle.judge.tiles.DEVICES by name")
    parser.add_argument("--x-dtype", choices=DTYPES, default="fp16")
    parser.add_argument("--compute-dtype", choices=DTYPES, help="default: the x dtype")
    parser.add_argument("--rotation", choices=ROTATIONS, help="dense: full (default) or none")
    parser.add_argument("--tile", help="dense: pin a tile registry entry (NAME or KxNxT)")
    parser.add_argument("--top-k", type=int, help="moe: routes per token")
    parser.add_argument("--hidden", type=int, help="moe: hidden size H")
    parser.add_argument("--intermediate", type=int, help="moe: intermediate size I")
    parser.add_argument("--experts", type=int, help="moe: number of experts")
    parser.add_argument("--pair", help="moe: QSRT pair kind (P22 P33 P24 P43 P44) or dynamic")
    parser.add_argument("--w13-layout", choices=W13_LAYOUTS, help="moe: packed (default) or proj")
    parser.add_argument(
        "--json", metavar="FILE", type=nonempty, help="write the explanation as JSON"
    )
    return parser


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_op_args(args: argparse.Namespace) -> None:
    own, other = (DENSE_ONLY, MOE_ONLY) if args.op == "dense" else (MOE_ONLY, DENSE_ONLY)
    stray = [_flag(d) for d in other if getattr(args, d) is not None]
    if stray:
        raise PlanRefused(
            f"{', '.join(stray)}: not an argument of --op {args.op} (it takes "
            f"{', '.join(_flag(d) for d in own)})"
        )
    required = ("k", "n") if args.op == "dense" else ("top_k", "hidden", "intermediate", "experts")
    missing = [_flag(d) for d in required if getattr(args, d) is None]
    if missing:
        raise PlanRefused(f"{', '.join(missing)}: required with --op {args.op}")


def explain_args(args: argparse.Namespace) -> DenseExplanation | MoeExplanation:
    """The explanation the parsed command line asks for (:class:`PlanRefused` on bad input)."""
    _check_op_args(args)
    common = dict(
        m=args.m, codebook=args.codebook, bits=args.bits, arch=args.arch, device=args.device,
        x_dtype=args.x_dtype, compute_dtype=args.compute_dtype,
    )  # fmt: skip
    if args.op == "dense":
        return explain_dense(
            k=args.k, n=args.n, rotation=args.rotation or "full", tile=args.tile, **common
        )
    return explain_moe(
        top_k=args.top_k, hidden=args.hidden, intermediate=args.intermediate,
        experts=args.experts, pair=args.pair, w13_layout=args.w13_layout or "packed", **common,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Print the plan (module docstring); a refusal is one stderr line and exit 2
    (:class:`oracle.cli.Refused`)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.json is not None and (problem := output_problem(args.json)):
        refuse(PROG, f"--json: {problem}")
    try:
        explanation = explain_args(args)
    except PlanRefused as exc:
        refuse(PROG, str(exc))
    text = format_dense(explanation) if args.op == "dense" else format_moe(explanation)
    print(text)
    if args.json:
        print(f"JSON: {write_json_or_refuse(PROG, args.json, explanation.to_dict())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
