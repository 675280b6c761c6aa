"""Shard the oracle's GPU grid across the GPUs of one host and merge the partial reports (issue 7).

*Plan* (pure and deterministic; CUDA only to read the limits of the ``device`` a shard plans on):

* :func:`kernel_group` maps a case to the kernel specialisation it compiles first: given the
  ``device``, a dense case is keyed by what its plan launches there
  (:func:`oracle.run.runners.dense.planned_product_spec`); without one, by the device-free estimate
  (GEMM per codebook/K/dtype/tile), which is wrong on sm_90 (docs/evidence/oracle-sharding.md).
  The M of a case enters the key only through what it plans.
* :func:`estimate_cost` is a relative cost model (units of roughly 50 ms of one H200):
  :data:`CASE_OVERHEAD` per case plus terms in K·N and M·K·N; a group adds :data:`COMPILE_COST`.
* :func:`plan_shards` puts memory-heavy cases (:func:`oracle.cases.grids.needs_whole_gpu`) in the
  serial phase, then assigns whole groups to ``count`` shards longest-processing-time first
  (deterministic ties); a group is never split, and ``max load <= total / count + largest group``.

*Selection* (:func:`select_cases`) mirrors the single-GPU ``run`` exactly; parent and every shard
compute it independently and agree. *Shard run* (:func:`run_shard`, ``python -m oracle run
--shard I/N|serial``) runs one slice's cases, grouped, plus the graph protocol in a parallel
slice; ``environment["shard"]`` is its *manifest* (label, index, count, phase, cases, executed,
the grid's total, serial count and fingerprint, ``cuda_visible_devices``). *Launch*
(:func:`launch_shards`, :func:`run_multi_gpu`; ``run --gpus N|all``): one subprocess per GPU
pinned by ``CUDA_VISIBLE_DEVICES``, then the serial slice on the first GPU; logs next to the
parts; a failed launch kills the shards started. *Merge* (:func:`merge_reports`): one
:class:`~oracle.report.report.Report`; any inconsistency between the parts (missing, duplicate or
foreign shards, cases assigned or reported twice, uncovered grid) is a ``ValueError``; a crashed
shard is one ``fail`` line; summaries are recomputed. In full: docs/notes/oracle.md.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from b12x.ops.dense.dispatch import DECODE_MATMUL_MIN_M
from b12x.ops.dense.tiles import choose_tiles
from oracle.cases.grids import needs_whole_gpu, parse_case_id
from oracle.report.report import CheckResult, Report
from oracle.run import grid as gpu_grid
from oracle.run.runners.dense import planned_product_spec

__all__ = [
    "CASE_OVERHEAD",
    "COMPILE_COST",
    "SERIAL",
    "Selection",
    "ShardPlan",
    "ShardRun",
    "ShardSpec",
    "case_id_of_check",
    "estimate_cost",
    "grid_summary",
    "kernel_group",
    "launch_shards",
    "merge_reports",
    "parse_shard",
    "passthrough_args",
    "plan_shards",
    "run_multi_gpu",
    "run_shard",
    "select_cases",
    "shard_plan",
    "visible_gpus",
]

COMPILE_COST = 40.0  # one cute.compile of a specialisation, ~2 s
CASE_OVERHEAD = 1.0  # launches, synchronisation and small copies of one case
_KN_UNIT = float(1 << 20)  # Mi weights
_MKN_UNIT = float(1 << 30)


# --- shard specs -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """Slice ``index`` of ``count`` (parallel phase, 0-based) or the serial phase (both None)."""

    index: int | None
    count: int | None

    def __post_init__(self) -> None:
        if (self.index is None) != (self.count is None):
            raise ValueError("ShardSpec: index and count are both set (parallel) or both None")
        if self.count is not None:
            for name in ("index", "count"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"ShardSpec: {name} must be an int, got {value!r}")
            if self.count < 1 or not 0 <= self.index < self.count:
                raise ValueError(
                    f"ShardSpec: need 0 <= index < count, got {self.index}/{self.count}"
                )

    @property
    def phase(self) -> str:
        return "serial" if self.index is None else "parallel"

    @property
    def label(self) -> str:
        return "serial" if self.index is None else f"{self.index}/{self.count}"

    @property
    def file_tag(self) -> str:
        return "serial" if self.index is None else str(self.index)


SERIAL = ShardSpec(None, None)


def parse_shard(text: str) -> ShardSpec:
    """``"I/N"`` (slice I of N, 0-based) or ``"serial"`` (the memory-heavy phase)."""
    if not isinstance(text, str):
        raise TypeError(
            f"shard: expected a string like '0/4' or 'serial', got {type(text).__name__}"
        )
    cleaned = text.strip()
    if cleaned == "serial":
        return SERIAL
    index, sep, count = cleaned.partition("/")
    if not sep or not index.isdigit() or not count.isdigit():
        raise ValueError(f"shard: expected 'I/N' (0 <= I < N) or 'serial', got {text!r}")
    i, n = int(index), int(count)
    if n < 1 or i >= n:
        raise ValueError(f"shard: expected 0 <= I < N and N >= 1, got {text!r}")
    return ShardSpec(i, n)


# --- plan --------------------------------------------------------------------------------------


def kernel_group(case: Any, device: Any = None) -> str:
    """The kernel specialisation ``case`` compiles first (module docstring): planned on
    ``device`` (a CUDA device or index, or a simulated part) when one is given."""
    v = case.variant
    if v.op == "decode":
        return f"decode/{v.codebook}/k{v.bits}"
    if v.op == "dense" and v.pair_kind is None and v.tier_layout is None:
        if device is not None:
            spec = planned_product_spec(case, device)
            if spec is not None:  # its repr names every field, the format by name
                return f"decode/{v.codebook}/k{v.bits}" if spec.kind == "decode" else repr(spec)

        if v.rotation == "full" and case.m >= DECODE_MATMUL_MIN_M:  # decode Wq, then a dense GEMM
            return f"decode/{v.codebook}/k{v.bits}"
        m_tiles, n_tiles = choose_tiles(case.m, case.n)
        return f"gemm/{v.codebook}/k{v.bits}/{v.compute_dtype}/{m_tiles}x{n_tiles}"
    return f"variant/{v.name}"


def estimate_cost(case: Any) -> float:
    """Relative cost of one case (module docstring); MoE scales with the expert count."""
    kn = case.k * case.n / _KN_UNIT
    mkn = case.m * case.k * case.n / _MKN_UNIT
    return CASE_OVERHEAD + (case.experts or 1) * (kn + mkn)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """``shards[i]`` are the cases of slice i (group by group); ``serial`` the memory-heavy ones;
    ``loads[i]`` the estimated cost of slice i; ``groups`` maps a group key to its slice."""

    count: int
    shards: tuple[tuple[Any, ...], ...]
    serial: tuple[Any, ...]
    loads: tuple[float, ...]
    groups: Mapping[str, int]

    def cases_for(self, spec: ShardSpec) -> tuple[Any, ...]:
        if not isinstance(spec, ShardSpec):
            raise TypeError(f"spec: expected a ShardSpec, got {type(spec).__name__}")
        if spec.index is None:
            return self.serial
        if spec.count != self.count:
            raise ValueError(f"spec: slice {spec.label} does not belong to a plan of {self.count}")
        return self.shards[spec.index]


def plan_shards(
    cases: Iterable[Any],
    count: int,
    *,
    device: Any = None,
    group_key: Callable[[Any], str] | None = None,
    cost: Callable[[Any], float] = estimate_cost,
) -> ShardPlan:
    """Deterministic split of ``cases`` over ``count`` slices plus the serial phase; groups by
    ``group_key`` (default :func:`kernel_group` planned on ``device``)."""
    if group_key is None:
        group_key = functools.partial(kernel_group, device=device)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: expected a positive int, got {count!r}")
    if not callable(group_key) or not callable(cost):
        raise TypeError("group_key and cost must be callables taking a Case")
    ordered = list(cases)
    ids = Counter(case.case_id for case in ordered)
    twice = sorted(cid for cid, n in ids.items() if n > 1)
    if twice:
        raise ValueError(f"cases: duplicate case ids {twice[:5]}")

    alone = {case.case_id for case in ordered if needs_whole_gpu(case)}
    serial = tuple(case for case in ordered if case.case_id in alone)
    groups: dict[str, list[Any]] = {}
    group_cost: dict[str, float] = {}
    for case in ordered:
        if case.case_id in alone:
            continue
        key = group_key(case)
        if not isinstance(key, str) or not key:
            raise ValueError(f"group_key: expected a non-empty str for {case.case_id}, got {key!r}")
        value = cost(case)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (math.isfinite(value) and value >= 0)
        ):
            raise ValueError(f"cost: expected a finite cost >= 0 for {case.case_id}, got {value!r}")
        groups.setdefault(key, []).append(case)
        group_cost[key] = group_cost.get(key, COMPILE_COST) + float(value)
    loads = [0.0] * count
    members: list[list[str]] = [[] for _ in range(count)]
    placed: dict[str, int] = {}
    for key in sorted(groups, key=lambda g: (-group_cost[g], g)):
        target = min(range(count), key=lambda i: (loads[i], i))
        loads[target] += group_cost[key]
        members[target].append(key)
        placed[key] = target
    shards = tuple(tuple(c for key in members[i] for c in groups[key]) for i in range(count))
    return ShardPlan(count, shards, serial, tuple(loads), placed)


# --- selection (identical in the parent and in every shard) ------------------------------------


@dataclasses.dataclass(frozen=True)
class Selection:
    """Cases with a GPU runner, and the skip lines for what the selection leaves out."""

    runnable: tuple[Any, ...]
    notes: tuple[CheckResult, ...]


def select_cases(
    *,
    filter: str | None = None,  # noqa: A002 - the CLI's name
    case: str | None = None,
    max_cases: int | None = None,
    heavy: bool = False,
) -> Selection:
    """The single-GPU ``run`` selection (module docstring): ``oracle.run.grid.select_grid``."""
    if case and filter:
        raise ValueError("select_cases: use case or filter, not both")
    runnable, notes = gpu_grid.select_grid(
        case=case, filter=filter, max_cases=max_cases, heavy=heavy
    )
    return Selection(tuple(runnable), tuple(notes))


def grid_summary(case_ids: Iterable[str], serial: int) -> dict[str, Any]:
    """``{"total", "serial", "fingerprint"}`` of a selection (fingerprint over sorted ids)."""
    ids = sorted(case_ids)
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()
    return {"total": len(ids), "serial": int(serial), "fingerprint": digest}


# --- one shard ---------------------------------------------------------------------------------


def _guarded(name: str, fn: Callable[[], Any]) -> list[CheckResult]:
    try:
        got = fn()
    except Exception as exc:  # noqa: BLE001 - a crash is this check's failure, not the shard's
        return [CheckResult(name, "gpu", "fail", f"raised {type(exc).__name__}: {exc}")]
    return list(got) if isinstance(got, list) else [got]


def shard_plan(runnable: Sequence[Any], spec: ShardSpec, *, cuda: bool) -> ShardPlan:
    """The plan a shard computes (every shard of a host computes the same one): with ``cuda``,
    the cases are grouped by what they plan on this process's GPU (:func:`kernel_group`)."""
    device = None
    if cuda:
        device = torch.cuda.current_device()
    return plan_shards(runnable, spec.count or 1, device=device)


def run_shard(ctx: Any, spec: ShardSpec, *, selection: Selection | None = None) -> Report:
    """Run slice ``spec`` of the selection of ``ctx`` (a CheckContext) in this process."""
    if not isinstance(spec, ShardSpec):
        raise TypeError(f"spec: expected a ShardSpec, got {type(spec).__name__}")
    if selection is None:
        selection = select_cases(
            filter=ctx.filter, case=ctx.case, max_cases=ctx.max_cases, heavy=ctx.heavy
        )
    executed = bool(ctx.cuda) and ctx.tier == "gpu"
    plan = shard_plan(selection.runnable, spec, cuda=bool(ctx.cuda))
    mine = plan.cases_for(spec)
    checks: list[CheckResult] = list(selection.notes) if spec.index == 0 else []
    if not executed:
        why = "no CUDA device" if not ctx.cuda else "tier cpu selected (--tier)"
        reason = f"{len(mine)} case(s) of shard {spec.label} not run: {why}"
        checks.append(CheckResult("gpu.shard", "gpu", "skip", reason))
    else:
        advance = ctx.advance(f"shard {spec.label}", len(mine))
        for case in mine:
            name = f"gpu.{case.variant.op}.{case.case_id}"
            checks += _guarded(name, lambda case=case: gpu_grid.case_results(case, ctx))
            advance()
        if spec.phase == "parallel" and spec.index == 0:
            checks += _guarded("gpu.graph", lambda: gpu_grid.graph_results(ctx))
    manifest = {
        "label": spec.label,
        "index": spec.index,
        "count": spec.count,
        "phase": spec.phase,
        "cases": [case.case_id for case in mine],
        "executed": executed,
        "grid": grid_summary((c.case_id for c in selection.runnable), len(plan.serial)),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    return Report(checks, environment={**Report().environment(), "shard": manifest})


# --- merge -------------------------------------------------------------------------------------

_MANIFEST_KEYS = ("label", "index", "count", "phase", "cases", "executed", "grid")


def case_id_of_check(name: str) -> str | None:
    """The case id of a per-case check (``gpu.<op>.<case id>[.<execution>]``), else None."""
    parts = name.split(".", 2)
    if len(parts) != 3 or parts[0] != "gpu":
        return None
    try:
        return parse_case_id(parts[2].split(".", 1)[0]).case_id
    except ValueError:
        return None


def _manifest(report: Report, where: str) -> dict[str, Any]:
    shard = report.environment().get("shard")
    if not isinstance(shard, Mapping):
        raise ValueError(f"parts: {where} has no shard manifest (environment['shard'])")
    missing = [k for k in _MANIFEST_KEYS if k not in shard]
    if missing:
        raise ValueError(f"parts: {where} manifest lacks {missing}")
    try:
        spec = parse_shard(shard["label"])
    except (TypeError, ValueError):
        raise ValueError(f"parts: {where} has a bad shard label {shard['label']!r}") from None
    if (spec.index, spec.count, spec.phase) != (shard["index"], shard["count"], shard["phase"]):
        raise ValueError(f"parts: {where} manifest disagrees with its label {spec.label}")
    return dict(shard)


def _load(part: Report | str | Path) -> tuple[Report, str]:
    if isinstance(part, Report):
        return part, "report"
    if isinstance(part, str | Path):
        return Report.from_json(part), str(part)
    raise TypeError(f"parts: expected Reports or JSON paths, got {type(part).__name__}")


def _label_order(label: str) -> tuple[int, int]:
    return (1, 0) if label == "serial" else (0, int(label.partition("/")[0]))


def merge_reports(
    parts: Sequence[Report | str | Path],
    *,
    crashed: Mapping[str, str] | None = None,
    expected_count: int | None = None,
) -> Report:
    """Merge shard reports into one (module docstring); ``crashed`` maps a shard label to why
    it produced no report; ``expected_count`` pins N when known."""
    crashed = dict(crashed or {})
    loaded = [_load(p) for p in parts]
    if not loaded and not crashed:
        raise ValueError("parts: nothing to merge")
    entries = []
    for report, where in loaded:
        manifest = _manifest(report, where)
        entries.append((manifest["label"], report, manifest))
    labels = Counter(label for label, _, _ in entries) + Counter(crashed.keys())
    twice = sorted(label for label, n in labels.items() if n > 1)
    if twice:
        raise ValueError(f"parts: duplicate shard(s) {twice}")
    grids = {tuple(sorted(m["grid"].items())) for _, _, m in entries}
    if len(grids) > 1:
        raise ValueError("parts: the shards planned different grids (filter or code differ)")
    counts = {m["count"] for _, _, m in entries if m["phase"] == "parallel"}
    counts |= {int(label.partition("/")[2]) for label in crashed if label != "serial"}
    if expected_count is not None:
        counts.add(expected_count)
    if len(counts) > 1:
        raise ValueError(f"parts: shards disagree on the shard count: {sorted(counts)}")
    count = counts.pop() if counts else 0
    grid = dict(entries[0][2]["grid"]) if entries else None
    expected = {f"{i}/{count}" for i in range(count)}
    if grid is not None and grid["serial"] > 0:
        expected.add("serial")
    present = set(labels)
    if present - expected and grid is not None:
        raise ValueError(f"parts: unexpected shard(s) {sorted(present - expected)}")
    if expected - present:
        raise ValueError(f"parts: missing shard(s) {sorted(expected - present, key=_label_order)}")

    owner: dict[str, str] = {}
    for label, _, manifest in entries:
        for cid in manifest["cases"]:
            if cid in owner:
                raise ValueError(f"parts: case {cid} assigned to shards {owner[cid]} and {label}")
            owner[cid] = label
    if grid is not None and not crashed and grid_summary(owner, grid["serial"]) != grid:
        missing = grid["total"] - len(owner)
        raise ValueError(f"parts: shard assignments do not cover the grid ({missing} missing)")

    reported: dict[str, str] = {}  # check name (one execution of a case) -> shard
    seen: set[str] = set()  # case ids with at least one result
    names: Counter[str] = Counter()  # how many shards report a non-case check of this name
    for label, report, _ in entries:
        own: set[str] = set()
        for check in report.checks:
            cid = case_id_of_check(check.name)
            if cid is None:
                own.add(check.name)
                continue
            if check.name in reported:
                raise ValueError(
                    f"parts: duplicate result {check.name} ({reported[check.name]}, {label})"
                )
            if owner.get(cid) != label:
                raise ValueError(f"parts: shard {label} reported case {cid} it was not assigned")
            reported[check.name] = label
            seen.add(cid)
        names.update(own)
    for label, _, manifest in entries:
        lost = [cid for cid in manifest["cases"] if cid not in seen]
        if manifest["executed"] and lost:
            raise ValueError(f"parts: shard {label} has no result for case(s) {lost[:5]}")

    merged: list[CheckResult] = []
    rows = [(label, report) for label, report, _ in entries] + [(c, None) for c in crashed]
    for label, report in sorted(rows, key=lambda row: _label_order(row[0])):
        if report is None:
            merged.append(CheckResult(f"oracle.shard.{label}", "gpu", "fail", crashed[label]))
            continue
        for check in report.checks:
            if case_id_of_check(check.name) is None and names[check.name] > 1:
                check = dataclasses.replace(check, name=f"{check.name}@{label}")
            merged.append(check)
    return Report(merged, environment=_merged_environment(entries, count, grid, crashed))


def _merged_environment(entries: list, count: int, grid: Any, crashed: Mapping) -> dict:
    envs = [report.environment() for _, report, _ in entries]
    shas = {env.get("git_sha") for env in envs}
    if len(shas) > 1:
        raise ValueError(f"parts: shards ran different checkouts {sorted(map(str, shas))}")
    base = {k: v for k, v in (envs[0] if envs else {}).items() if k != "shard"}
    devices = [
        {
            "shard": label,
            "cuda_visible_devices": manifest.get("cuda_visible_devices"),
            "device": env.get("device"),
        }
        for (label, _, manifest), env in zip(entries, envs, strict=True)
    ]
    devices.sort(key=lambda d: _label_order(d["shard"]))
    base["device"] = "; ".join(f"{d['shard']}: {d['device']}" for d in devices) or "none"
    base["devices"] = devices
    base["shards"] = {"count": count, "grid": grid, "crashed": sorted(crashed)}
    return base


# --- launching ---------------------------------------------------------------------------------


def visible_gpus(request: str, *, environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids to pin shards to: ``"all"`` or a count, taken from ``CUDA_VISIBLE_DEVICES``
    when set, else from the driver's /proc listing (never through CUDA)."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [g.strip() for g in visible.split(",") if g.strip()]
    else:
        try:
            ids = [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
        except OSError:
            ids = []
    if not isinstance(request, str):
        raise TypeError(f"gpus: expected 'all' or a count, got {type(request).__name__}")
    if request.strip() == "all":
        want = len(ids)
    elif request.strip().isdigit() and int(request) >= 1:
        want = int(request)
    else:
        raise ValueError(f"gpus: expected 'all' or a positive count, got {request!r}")
    if not ids:
        raise ValueError("gpus: no CUDA device is visible on this host")
    if want > len(ids):
        raise ValueError(f"gpus: asked for {want} GPU(s), {len(ids)} visible ({','.join(ids)})")
    return ids[:want]


def passthrough_args(args: Any) -> list[str]:
    """The ``run`` options every shard must share with the parent (same selection, same dirs)."""
    out = ["--tier", getattr(args, "tier", "auto") or "auto"]
    for flag, attr in (("--filter", "filter"), ("--case", "case"), ("--max-cases", "max_cases")):
        value = getattr(args, attr, None)
        if value is not None:
            out += [flag, str(value)]
    if getattr(args, "heavy", False):
        out.append("--heavy")
    out += ["--results", str(getattr(args, "results", "results"))]
    return out


def shard_command(spec: ShardSpec, json_path: Path, passthrough: Sequence[str] = ()) -> list[str]:
    """``python -m oracle run --shard <label> --json <part> -q <passthrough...>``."""
    base = [sys.executable, "-m", "oracle", "run", "--shard", spec.label]
    return [*base, "--json", str(json_path), "-q", *passthrough]


@dataclasses.dataclass
class ShardRun:
    """One finished shard process."""

    spec: ShardSpec
    gpu: str
    command: tuple[str, ...]
    returncode: int | None
    json_path: Path
    log_path: Path
    wall_s: float

    @property
    def ok(self) -> bool:
        """It exited normally (0: all passed, 1: some check failed) and wrote its report."""
        return self.returncode in (0, 1) and self.json_path.is_file()

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def launch_shards(
    jobs: Sequence[tuple[ShardSpec, str]],
    out_dir: str | Path,
    *,
    command: Callable[[ShardSpec, Path, Sequence[str]], list[str]] = shard_command,
    passthrough: Sequence[str] = (),
    timeout: float | None = None,
) -> list[ShardRun]:
    """Start one process per ``(spec, gpu)`` at once, pinned with ``CUDA_VISIBLE_DEVICES=gpu``
    and ``OMP_NUM_THREADS`` = cores / processes (unless set), and wait for all (a process past
    ``timeout`` seconds is killed: returncode None)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for spec, gpu in jobs:
        if not isinstance(spec, ShardSpec) or not isinstance(gpu, str) or not gpu:
            raise TypeError("jobs: expected (ShardSpec, gpu id string) pairs")
    # The judges' metrics run on CPU copies (oracle.judge.metrics): shards started together share
    # the host's cores instead of each taking all of them (torch's default), unless the caller
    # chose.
    threads = os.environ.get("OMP_NUM_THREADS") or str(
        max(1, (os.cpu_count() or 1) // max(1, len(jobs)))
    )
    started = []
    try:
        for spec, gpu in jobs:
            json_path = out / f"part_{spec.file_tag}.json"
            log_path = out / f"part_{spec.file_tag}.log"
            json_path.unlink(missing_ok=True)  # a stale part must never pass for this run's
            argv = list(command(spec, json_path, passthrough))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "B12X_SHARD": spec.label}
            env["OMP_NUM_THREADS"] = threads
            log = log_path.open("w")
            try:
                proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            except BaseException:
                log.close()
                raise
            started.append((spec, gpu, argv, proc, log, json_path, log_path, time.monotonic()))
    except BaseException:  # never leave shards running behind a failed launch
        for _, _, _, proc, log, *_ in started:
            proc.kill()
            proc.wait()
            log.close()
        raise
    deadline = None if timeout is None else time.monotonic() + timeout
    runs = []
    for spec, gpu, argv, proc, log, json_path, log_path, t0 in started:
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            code: int | None = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        finally:
            log.close()
        wall = time.monotonic() - t0
        runs.append(ShardRun(spec, gpu, tuple(argv), code, json_path, log_path, wall))
    return runs


def _crash_reason(run: ShardRun) -> str:
    how = "timed out" if run.returncode is None else f"exited {run.returncode}"
    tail = " | ".join(run.log_tail(600).strip().splitlines()[-4:])
    return (
        f"shard {run.spec.label} on GPU {run.gpu} {how} without a report ({run.log_path}): {tail}"
    )


def run_multi_gpu(
    gpus: Sequence[str],
    out_dir: str | Path,
    *,
    serial: bool,
    passthrough: Sequence[str] = (),
    command: Callable[[ShardSpec, Path, Sequence[str]], list[str]] = shard_command,
    timeout: float | None = None,
) -> tuple[Report, list[ShardRun]]:
    """Parallel phase on every GPU of ``gpus``, then (if ``serial``) the heavy phase on the
    first; returns the merged report and the runs."""
    if not gpus:
        raise ValueError("gpus: need at least one GPU id")
    count = len(gpus)
    jobs = [(ShardSpec(i, count), str(gpu)) for i, gpu in enumerate(gpus)]
    kw = {"command": command, "passthrough": passthrough, "timeout": timeout}
    runs = launch_shards(jobs, out_dir, **kw)
    if serial:
        runs += launch_shards([(SERIAL, str(gpus[0]))], out_dir, **kw)
    crashed = {run.spec.label: _crash_reason(run) for run in runs if not run.ok}
    parts = [run.json_path for run in runs if run.ok]
    return merge_reports(parts, crashed=crashed, expected_count=count), runs


def run_multi_gpu_cli(args: Any) -> Report:
    """``python -m oracle run --gpus N|all``: plan here (no CUDA), spawn, merge."""
    try:
        gpus = visible_gpus(args.gpus)
        selection = select_cases(
            filter=args.filter,
            case=args.case,
            max_cases=args.max_cases,
            heavy=getattr(args, "heavy", False),
        )
    except ValueError as exc:
        raise ValueError(f"--gpus: {exc}") from None
    plan = plan_shards(selection.runnable, len(gpus))
    print(
        f"sharding {len(selection.runnable)} case(s) over GPU(s) {','.join(gpus)}: "
        f"{[len(s) for s in plan.shards]} per shard, {len(plan.serial)} heavy in the serial phase"
    )
    out_dir = Path(args.results) / "shards"
    report, runs = run_multi_gpu(
        gpus, out_dir, serial=bool(plan.serial), passthrough=passthrough_args(args)
    )
    for run in runs:
        print(f"shard {run.spec.label} on GPU {run.gpu}: exit {run.returncode}, {run.wall_s:.1f} s")
    grid = grid_summary((c.case_id for c in selection.runnable), len(plan.serial))
    merged_grid = report.environment()["shards"]["grid"]
    if merged_grid is not None and merged_grid != grid:
        raise SystemExit("python -m oracle run: --gpus: the shards planned another grid than here")
    return report
