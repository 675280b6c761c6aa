"""Check results, the JSON report, the rich table and the PNG plots.

JSON schema ``oracle.report/2`` (exactly these top-level keys; fields, meaning and version
history in ``docs/json_schemas.md``)::

    {"schema": "oracle.report/2",
     "checks": [{"name": str, "tier": "cpu"|"gpu", "status": "pass"|"fail"|"skip",
                 "reason": str, "metrics": {...}}, ...],
     "summary": {"total": int, "pass": int, "fail": int, "skip": int, "ok": bool,
                 "by_tier": {"cpu": {"pass", "fail", "skip"}, "gpu": {...}}},
     "environment": {"python", "torch", "numpy", "cutlass", "device", "git_sha", "platform"}}

Non-finite metric values are written as ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON) and read
back as floats by :meth:`Report.from_json`.

Reading is strict (:class:`ReportFileError`, a ``ValueError`` with a one-line message): an
unreadable or non-JSON file, a schema other than :data:`READABLE_SCHEMAS` (a report without a
``schema`` key is the pre-versioning layout ``oracle.report/1``), unknown or missing keys, wrong
types, a check :class:`CheckResult` refuses, and a ``summary`` that disagrees with the checks
(a report whose summary says ``ok`` while a check failed is corrupt, never green).

Plots (matplotlib, the Agg canvas, no pyplot global state):
* :func:`plot_error_vs_shape` groups checks whose ``metrics`` carry ``variant`` (a variant name)
  and ``m``/``k``/``n`` (falling back to parsing the check name as a case id) and writes one PNG
  per variant: rel-L2 and faithful rel-L2 against M and against K·N, log scales.
* :func:`plot_tile_error_map` writes the per-tile error map of one output (see
  :func:`oracle.judge.metrics.tile_errors`) to localise drift.

A skipped check must carry a reason (the registry rule: no silent skip).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from oracle.arguments import read_json
from oracle.report.results import device_name, git_sha, jsonable, versions

__all__ = [
    "KNOWN_SCHEMAS",
    "READABLE_SCHEMAS",
    "REPORT_SCHEMA",
    "STATUSES",
    "TIERS",
    "CheckResult",
    "Report",
    "ReportFileError",
    "plot_error_vs_shape",
    "plot_points",
    "plot_tile_error_map",
]

TIERS = ("cpu", "gpu")
STATUSES = ("pass", "fail", "skip")
KEY_METRICS = ("rel_l2", "faithful_rel_l2", "ratio", "worst_row_cosine", "sqnr_db")
_STATUS_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}

#: What :meth:`Report.to_dict` writes (docs/json_schemas.md).
REPORT_SCHEMA = "oracle.report/2"
#: What :meth:`Report.from_dict` reads (``/1``: the same layout without the ``schema`` key).
READABLE_SCHEMAS = ("oracle.report/1", REPORT_SCHEMA)
#: Every schema family the oracle writes, with the command that reads it (docs/json_schemas.md).
KNOWN_SCHEMAS = {
    "oracle.report": "python -m oracle report FILE",
    "oracle.coverage": "the coverage job (reserved name)",
    "oracle.contracts": "python -m oracle contracts (its --json output)",
    "oracle.mutate": "python -m oracle mutate --from-json FILE",
    "oracle.case": "python -m oracle replay FILE",
}
_CHECK_KEYS = ("name", "tier", "status", "reason", "metrics")
_TOP_KEYS = {"schema", "checks", "summary", "environment"}


class ReportFileError(ValueError):
    """A file that is not a readable oracle report; the message is one line."""


@dataclasses.dataclass
class CheckResult:
    """One check outcome. ``metrics`` is a plain dict (a Metrics/Verdict may be passed; it is
    converted with ``to_dict``)."""

    name: str
    tier: str
    status: str
    reason: str = ""
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"CheckResult: name must be a non-empty string, got {self.name!r}")
        if self.tier not in TIERS:
            raise ValueError(f"CheckResult: tier must be one of {TIERS}, got {self.tier!r}")
        if self.status not in STATUSES:
            raise ValueError(f"CheckResult: status must be one of {STATUSES}, got {self.status!r}")
        if not isinstance(self.reason, str):
            raise TypeError(f"CheckResult: reason must be a str, got {type(self.reason).__name__}")
        if self.status == "skip" and not self.reason.strip():
            raise ValueError(f"CheckResult: skipped check {self.name!r} needs a reason")
        if hasattr(self.metrics, "to_dict"):
            self.metrics = self.metrics.to_dict()
        if not isinstance(self.metrics, Mapping):
            raise TypeError(
                f"CheckResult: metrics must be a mapping, got {type(self.metrics).__name__}"
            )
        self.metrics = dict(self.metrics)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tier": self.tier,
            "status": self.status,
            "reason": self.reason,
            "metrics": jsonable(self.metrics),
        }


def _decode_floats(value: Any) -> Any:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _decode_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_floats(v) for v in value]
    return value


class Report:
    """An ordered collection of :class:`CheckResult`, serialisable to the JSON schema above."""

    def __init__(
        self, checks: Iterable[CheckResult] = (), environment: dict[str, Any] | None = None
    ):
        self.checks: list[CheckResult] = []
        self._environment = environment
        self.extend(checks)

    def add(self, result: CheckResult | None = None, /, **fields: Any) -> CheckResult:
        """Add a CheckResult, or build one from keyword fields (name, tier, status, ...)."""
        if result is None:
            result = CheckResult(**fields)
        elif fields:
            raise TypeError("Report.add: pass a CheckResult or keyword fields, not both")
        if not isinstance(result, CheckResult):
            raise TypeError(f"Report.add: expected a CheckResult, got {type(result).__name__}")
        self.checks.append(result)
        return result

    def extend(self, results: Iterable[CheckResult]) -> None:
        for result in results:
            self.add(result)

    def summary(self) -> dict[str, Any]:
        by_tier = {tier: dict.fromkeys(STATUSES, 0) for tier in TIERS}
        for check in self.checks:
            by_tier[check.tier][check.status] += 1
        totals = {status: sum(by_tier[t][status] for t in TIERS) for status in STATUSES}
        return {"total": len(self.checks), **totals, "ok": totals["fail"] == 0, "by_tier": by_tier}

    @property
    def failed(self) -> bool:
        return any(check.status == "fail" for check in self.checks)

    def exit_code(self) -> int:
        """1 when any check failed, else 0 (skips do not fail)."""
        return 1 if self.failed else 0

    def environment(self) -> dict[str, Any]:
        if self._environment is None:
            self._environment = {
                **versions(),
                "device": device_name(),
                "git_sha": git_sha(),
                "platform": platform.platform(),
            }
        return dict(self._environment)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "checks": [check.to_dict() for check in self.checks],
            "summary": self.summary(),
            "environment": jsonable(self.environment()),
        }

    def to_json(self, path: str | Path) -> Path:
        out = Path(path)
        if out.parent != Path():
            out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "report") -> Report:
        """Validate and load a report dict (rules in the module docstring); raises
        :class:`ReportFileError` naming ``source`` and the first defect."""
        if not isinstance(data, Mapping):
            raise ReportFileError(f"{source}: expected a JSON object, got {type(data).__name__}")
        schema = data.get("schema", READABLE_SCHEMAS[0])
        if schema not in READABLE_SCHEMAS:
            family = str(schema).split("/")[0]
            if family in KNOWN_SCHEMAS and family != "oracle.report":
                hint = f"it is read by {KNOWN_SCHEMAS[family]}"
            else:
                hint = f"this oracle reads {', '.join(READABLE_SCHEMAS)}"
            raise ReportFileError(f"{source}: unknown report schema {schema!r}; {hint}")
        unknown = sorted(set(data) - _TOP_KEYS)
        if unknown:
            raise ReportFileError(
                f"{source}: unknown top-level keys {unknown}; known: {sorted(_TOP_KEYS)}"
            )
        raw_checks = data.get("checks")
        if not isinstance(raw_checks, list):
            raise ReportFileError(f"{source}: 'checks' must be a list, got {raw_checks!r:.60}")
        checks = [_check_from_dict(raw, i, source) for i, raw in enumerate(raw_checks)]
        environment = data.get("environment")
        if environment is not None and not isinstance(environment, Mapping):
            raise ReportFileError(f"{source}: 'environment' must be an object")
        report = cls(checks, environment=dict(environment) if environment is not None else None)
        summary = data.get("summary")
        if summary is not None:
            if not isinstance(summary, Mapping):
                raise ReportFileError(f"{source}: 'summary' must be an object")
            actual = report.summary()
            for key in ("total", "pass", "fail", "skip", "ok"):
                if key in summary and summary[key] != actual[key]:
                    raise ReportFileError(
                        f"{source}: summary.{key} = {summary[key]!r} disagrees with the checks "
                        f"({actual[key]!r}): the file is corrupt"
                    )
        return report

    @classmethod
    def from_json(cls, path: str | Path) -> Report:
        """Read a report file; :class:`ReportFileError` (one line) for anything unreadable."""
        try:
            data = read_json(str(path))
        except ValueError as exc:
            raise ReportFileError(str(exc)) from None
        return cls.from_dict(data, source=str(path))

    def print_table(
        self, console: Any = None, *, max_reason: int = 80, show_passing: bool = True
    ) -> None:
        """Print a rich table (name, tier, coloured status, reason, key metrics) and the summary.
        ``show_passing=False`` lists only failures and skips (the summary still counts all)."""
        # lazy: rich stays off `contracts` (standard library alone)
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        table = Table(title="oracle checks", show_lines=False)
        for column in ("name", "tier", "status", "reason", "metrics"):
            table.add_column(column, overflow="fold")
        for check in self.checks:
            if not show_passing and check.status == "pass":
                continue
            reason = (
                check.reason
                if len(check.reason) <= max_reason
                else check.reason[: max_reason - 1] + "…"
            )
            style = _STATUS_STYLE[check.status]
            table.add_row(
                check.name,
                check.tier,
                f"[{style}]{check.status}[/]",
                reason,
                _format_metrics(check.metrics),
            )
        console.print(table)
        s = self.summary()
        colour = "green" if s["ok"] else "bold red"
        console.print(
            f"[{colour}]{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped[/] "
            f"(cpu {s['by_tier']['cpu']}, gpu {s['by_tier']['gpu']})"
        )


def _check_from_dict(raw: Any, i: int, source: str) -> CheckResult:
    where = f"{source}: checks[{i}]"
    if not isinstance(raw, Mapping):
        raise ReportFileError(f"{where} must be an object, got {type(raw).__name__}")
    missing = [k for k in ("name", "tier", "status") if k not in raw]
    if missing:
        raise ReportFileError(f"{where} lacks {missing}")
    unknown = sorted(set(raw) - set(_CHECK_KEYS))
    if unknown:
        raise ReportFileError(f"{where}: unknown keys {unknown}; known: {list(_CHECK_KEYS)}")
    try:
        return CheckResult(
            name=raw["name"],
            tier=raw["tier"],
            status=raw["status"],
            reason=raw.get("reason", ""),
            metrics=_decode_floats(raw.get("metrics", {})),
        )
    except (TypeError, ValueError) as exc:
        raise ReportFileError(f"{where}: {exc}") from None


def _format_metrics(metrics: Mapping[str, Any]) -> str:
    parts = []
    for key in KEY_METRICS:
        value = metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            parts.append(f"{key}={value:.3g}")
    return " ".join(parts)


# --- plots -------------------------------------------------------------------------------------


def plot_points(report: Report) -> dict[str, list[dict[str, float]]]:
    """variant name -> the points :func:`plot_error_vs_shape` draws (empty: nothing plottable:
    no check carries a numeric ``rel_l2`` and a variant and shape, in metrics or a case id)."""
    from oracle.cases.grids import parse_case_id  # lazy: reports load without torch

    points: dict[str, list[dict[str, float]]] = defaultdict(list)
    for check in report.checks:
        metrics = check.metrics
        rel = metrics.get("rel_l2")
        if not isinstance(rel, int | float) or isinstance(rel, bool):
            continue
        variant, m, k, n = (metrics.get(key) for key in ("variant", "m", "k", "n"))
        if None in (variant, m, k, n):
            try:
                case = parse_case_id(check.name.split(":")[-1])
            except ValueError:
                continue
            variant, m, k, n = case.variant.name, case.m, case.k, case.n
        faithful = metrics.get("faithful_rel_l2")
        points[str(variant)].append(
            {"m": m, "kn": k * n, "rel": rel, "faithful": faithful, "status": check.status}
        )
    return points


def _positive(value: Any) -> float:
    """Log axes cannot show 0 or non-finite values: map them to NaN (not drawn)."""
    if isinstance(value, int | float) and math.isfinite(value) and value > 0:
        return float(value)
    return math.nan


def plot_error_vs_shape(report_or_json: Report | str | Path, out_dir: str | Path) -> list[Path]:
    """One PNG per variant: rel-L2 (and faithful rel-L2) vs M and vs K·N. Returns the paths."""
    from matplotlib.figure import Figure  # lazy: matplotlib is optional (dev extra)

    report = (
        report_or_json if isinstance(report_or_json, Report) else Report.from_json(report_or_json)
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for variant, pts in sorted(plot_points(report).items()):
        fig = Figure(figsize=(10, 4), layout="constrained")
        for ax, x_key, x_label in zip(fig.subplots(1, 2), ("m", "kn"), ("M", "K·N"), strict=True):
            xs = [p[x_key] for p in pts]
            ax.scatter(
                xs,
                [_positive(p["rel"]) for p in pts],
                marker="o",
                label="kernel rel-L2",
                c=["tab:red" if p["status"] == "fail" else "tab:blue" for p in pts],
            )
            ax.scatter(
                xs,
                [_positive(p["faithful"]) for p in pts],
                marker="x",
                color="tab:gray",
                label="faithful rel-L2",
            )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(x_label)
            ax.set_ylabel("rel-L2 vs exact")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(loc="best", fontsize="small")
        fig.suptitle(variant)
        path = out / (variant.replace("/", "-") + ".png")
        fig.savefig(path, dpi=80)
        written.append(path)
    return written


def plot_tile_error_map(y: Any, ref: Any, out_png: str | Path, tile: int = 16) -> Path:
    """Heat map of :func:`oracle.judge.metrics.tile_errors` (log10 scale) written to ``out_png``."""
    # lazy: reports load without torch; matplotlib is optional (dev extra)
    import torch
    from matplotlib.figure import Figure

    from oracle.judge.metrics import tile_errors  # lazy: reports load without torch

    errors = tile_errors(y, ref, tile=tile)
    finite = errors[torch.isfinite(errors) & (errors > 0)]
    smallest = float(finite.min()) if finite.numel() else 1e-12
    shown = torch.log10(errors.clamp_min(smallest * 0.5)).numpy()
    fig = Figure(figsize=(6, 5), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="magma")
    fig.colorbar(image, ax=ax, label="log10(tile RMS error / RMS(ref))")
    ax.set_xlabel(f"column tile (×{tile})")
    ax.set_ylabel(f"row tile (×{tile})")
    ax.set_title(f"per-tile error, worst {float(errors.max()):.3g}")
    path = Path(out_png)
    if path.parent != Path():
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    return path
