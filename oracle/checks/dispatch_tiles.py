"""Dispatch and tile checks (§5.4–§5.5; R2, R3, R15) against the tables b12x declares.

The tables come from b12x's typed contract (``b12x.support.OPS``, :mod:`oracle.cases.declared`):
every op's ``dispatch`` tuple (objects satisfying :mod:`oracle.judge.dispatch`'s protocol: every
host decision made from a problem — dense path, split-K, the MoE route block, K split, wave-balanced
FC2 tile, pair geometry — with both sides of every threshold as ``boundaries``) and its ``tiles``
registry (:mod:`oracle.judge.tiles`' protocol), each checked once even when several ops share it.
The grid for reachability is ``table.grid()`` (or a ``grid`` sequence) when the table declares one,
plus both sides of every boundary. Tile registries are checked on every
:data:`oracle.judge.tiles.DEVICES` part over ``registry.problems``; the module of the registry's
predicate function (attribute ``predicate``, else a module-level ``qualify`` beside the registry's
class) is scanned for floor constants duplicated outside it
(:func:`oracle.judge.tiles.find_duplicated_floors`).

Results are named ``dispatch.<table>.<check>`` and ``tiles.<registry>.<check>``. An op that
declares no table is not a skip: the contract says so explicitly with an empty tuple.
:func:`qualify_tile` serves ``python -m oracle run --tile``: it pins one tile on every problem
and simulated device and reports where the single predicate accepts or rejects it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from typing import Any

from oracle.cases.declared import declared
from oracle.judge.dispatch import Outcome
from oracle.judge.dispatch import check_table as check_dispatch_table
from oracle.judge.tiles import DEVICES, check_registry, find_duplicated_floors
from oracle.judge.tiles import parse_tile as parse_shape
from oracle.report.report import CheckResult

__all__ = ["declared", "qualify_tile", "run"]


def _to_result(prefix: str, outcome: Outcome) -> CheckResult:
    check = outcome.check.split(".", 1)[-1]
    status = "pass" if outcome.passed else "fail"
    return CheckResult(f"{prefix}.{check}", "cpu", status, outcome.reason, dict(outcome.metrics))


def _grid_of(table: Any) -> list[dict]:
    grid = getattr(table, "grid", ())
    if callable(grid):
        grid = grid()
    return [dict(c) for c in grid]


def _dispatch_results() -> list[CheckResult]:
    tables, why = declared("dispatch_tables")
    if tables is None:
        return [CheckResult("dispatch", "cpu", "skip", why)]
    out = []
    for table in tables:
        prefix = f"dispatch.{table.name}"
        out += [_to_result(prefix, o) for o in check_dispatch_table(table, _grid_of(table))]
    return out


def _floor_result(prefix: str, registry: Any) -> CheckResult:
    predicate = getattr(registry, "predicate", None)
    if predicate is None:  # a module-level `qualify` next to the registry's class is the predicate
        module = inspect.getmodule(type(registry))
        candidate = getattr(module, "qualify", None)
        if inspect.isfunction(candidate) and inspect.getmodule(candidate) is module:
            predicate = candidate
    if predicate is None:
        return CheckResult(
            f"{prefix}.single_predicate",
            "cpu",
            "skip",
            "registry names no `predicate` function to scan around",
        )
    source = inspect.getsource(inspect.getmodule(predicate))
    found = find_duplicated_floors(source, predicate.__name__)
    if found:
        return CheckResult(
            f"{prefix}.single_predicate",
            "cpu",
            "fail",
            "floor constants outside the predicate: " + "; ".join(found[:5]),
        )
    return CheckResult(f"{prefix}.single_predicate", "cpu", "pass", "")


def _tile_results() -> list[CheckResult]:
    registries, why = declared("tile_registries")
    if registries is None:
        return [CheckResult("tiles", "cpu", "skip", why)]
    out = []
    for registry in registries:
        prefix = f"tiles.{registry.name}"
        out += [_to_result(prefix, o) for o in check_registry(registry)]
        out.append(_floor_result(prefix, registry))
    return out


def run(ctx=None) -> list[CheckResult]:
    return _dispatch_results() + _tile_results()


def parse_tile(text: str) -> tuple[int, ...]:
    """A tile as ``run --tile`` takes it: an entry name (``"wave_fc2"``) → its serialised shape,
    resolved by the declared registry's own parser (``parse``); a shape (``"32x512x256"``) as
    :func:`oracle.judge.tiles.parse_tile` reads it."""
    if isinstance(text, str) and re.fullmatch(r"\s*[A-Za-z_]\w*\s*", text):
        return _named(text.strip())
    try:
        return parse_shape(text)
    except ValueError:
        raise ValueError(
            f"--tile: expected a tile name or integers joined by 'x', e.g. 32x512x256, got {text!r}"
        ) from None


def _named(name: str) -> tuple[int, ...]:
    """The shape of the registry entry called ``name`` (``ValueError`` naming the known ones)."""
    registries, why = declared("tile_registries")
    reasons = []
    for registry in registries or ():
        parse = getattr(registry, "parse", None)
        if not callable(parse):
            continue
        try:
            return tuple(registry.serialize(parse(name)))
        except ValueError as exc:
            reasons.append(str(exc).removeprefix("tile: "))
    raise ValueError(f"--tile: {'; '.join(reasons) or why or f'no registry names {name!r}'}")


def qualify_tile(text: str, registries: Iterable[Any] | None = None) -> list[CheckResult]:
    """Pin tile ``text`` on every declared problem and simulated device (``run --tile``)."""
    spec = parse_tile(text)
    if registries is None:
        registries, why = declared("tile_registries")
        if registries is None:
            return [CheckResult(f"tile.{text}", "cpu", "skip", why)]
    out = []
    for registry in registries:
        try:
            tile = registry.deserialize(spec)
        except Exception as exc:  # noqa: BLE001
            out.append(
                CheckResult(
                    f"tile.{registry.name}.{text}",
                    "cpu",
                    "skip",
                    f"not a tile of this registry: {exc}",
                )
            )
            continue
        if tile not in registry.entries:
            out.append(
                CheckResult(
                    f"tile.{registry.name}.{text}",
                    "cpu",
                    "fail",
                    f"{tile!r} is not a declared entry",
                )
            )
            continue
        accepted, rejected, disagree = [], [], []
        for problem in registry.problems:
            for device in DEVICES:
                ok, reason = registry.qualify(tile, problem, device)
                try:
                    registry.pin(spec, problem, device)
                    pinned = True
                except ValueError:
                    pinned = False
                where = f"{problem!r}@{device.name}"
                (accepted if ok else rejected).append(where if ok else f"{where}: {reason}")
                if pinned != ok:
                    disagree.append(where)
        status = "fail" if disagree else "pass"
        reason = (
            f"pin and qualify disagree at {disagree[:3]}"
            if disagree
            else (
                f"qualified at {len(accepted)}, rejected at {len(rejected)} "
                "(problem, device) points"
            )
        )
        out.append(
            CheckResult(
                f"tile.{registry.name}.{text}",
                "cpu",
                status,
                reason,
                {"accepted": len(accepted), "rejected": rejected[:10]},
            )
        )
    return out
