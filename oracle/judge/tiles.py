"""Generic checks over a declared tile registry (§5.4; regressions R3, R15).

The protocol a tile registry must satisfy:
Any object with these members (b12x declares its own; this module never imports b12x):

* ``name: str`` and ``entries: Sequence[tile]`` — every tile the registry knows. Tiles are
  hashable values compared with ``==`` (e.g. a frozen dataclass ``(tile_k, tile_n, threads)``).
* ``qualify(tile, problem, device) -> (ok: bool, reason: str)`` — the ONE qualification predicate
  (divisibility, floors, shared-memory footprint, phase restrictions). ``device`` is a
  :class:`SimulatedDevice` (or anything with ``sm_count``, ``max_shared_mem``, ``capability``).
* ``auto_select(problem, device) -> tile`` — must pick among tiles that ``qualify`` accepts.
* ``serialize(tile) -> spec`` / ``deserialize(spec) -> tile`` — the custom-op boundary: ``spec``
  is made only of ``int``/``str``/``bool``/``float`` and tuples/lists of them, like a Torch
  custom-op schema would carry (``force_tile_config``).
* ``pin(spec, problem, device) -> tile`` — the explicit pin; it must go through ``qualify`` and
  raise ``ValueError`` carrying the predicate's reason when it rejects.
* optional ``key(tile, problem, device)`` (the compile-cache identity; default the tile) and
  ``problems`` (the grid to check; problems are opaque here, handed back untouched).

The generic checks (each returns an :class:`oracle.judge.dispatch.Outcome`):
* :func:`check_round_trip` (auto-selected tiles survive qualify → serialise → pin → key
  unchanged: the GB10 bug, R3), :func:`check_pin_matches_qualify` and the static
  :func:`find_duplicated_floors`; in full: docs/notes/oracle.md.

:data:`DEVICES` are the simulated parts: 188-SM RTX PRO 6000 (12,0) and 48-SM GB10 (12,1) with
101,376 B, 132-SM H200 (9,0), 108-SM A100 (8,0), and simulated 120-SM (12,0, 227 KB) and 80-SM
(12,1, 101,376 B) parts. Shared memory is the opt-in per-block maximum in bytes.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from oracle.judge.dispatch import MAX_LISTED, Outcome

__all__ = [
    "DEVICES",
    "SimulatedDevice",
    "TileRegistry",
    "check_pin_matches_qualify",
    "check_registry",
    "check_round_trip",
    "find_duplicated_floors",
    "parse_tile",
    "validate_registry",
]

SMEM_227_KB = 227 * 1024  # 232,448 B: sm_90 / sm_120 opt-in maximum per block


@dataclasses.dataclass(frozen=True)
class SimulatedDevice:
    """The device facts a tile predicate may read."""

    name: str
    sm_count: int
    max_shared_mem: int
    capability: tuple[int, int]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("SimulatedDevice: name must be a non-empty string")
        for arg in ("sm_count", "max_shared_mem"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SimulatedDevice {self.name}: {arg} must be a positive int")
        cap = self.capability
        if not (isinstance(cap, tuple) and len(cap) == 2 and all(isinstance(c, int) for c in cap)):
            raise ValueError(f"SimulatedDevice {self.name}: capability must be (major, minor)")


DEVICES: tuple[SimulatedDevice, ...] = (
    SimulatedDevice("rtx_pro_6000", 188, SMEM_227_KB, (12, 0)),
    SimulatedDevice("gb10", 48, 101_376, (12, 1)),
    SimulatedDevice("h200", 132, SMEM_227_KB, (9, 0)),
    SimulatedDevice("a100", 108, 166_912, (8, 0)),
    SimulatedDevice("sim_120sm", 120, SMEM_227_KB, (12, 0)),
    SimulatedDevice("sim_80sm", 80, 101_376, (12, 1)),
)


@runtime_checkable
class TileRegistry(Protocol):
    name: str
    entries: Sequence[Any]

    def qualify(self, tile: Any, problem: Any, device: Any) -> tuple[bool, str]: ...

    def auto_select(self, problem: Any, device: Any) -> Any: ...

    def pin(self, spec: Any, problem: Any, device: Any) -> Any: ...

    def serialize(self, tile: Any) -> Any: ...

    def deserialize(self, spec: Any) -> Any: ...


def validate_registry(registry: Any) -> None:
    """Raise ``TypeError`` naming the first missing member before any check runs."""
    for attr in ("name", "entries", "qualify", "auto_select", "pin", "serialize", "deserialize"):
        if not hasattr(registry, attr):
            raise TypeError(f"tile registry: missing attribute `{attr}` (see oracle.judge.tiles)")
    for attr in ("qualify", "auto_select", "pin", "serialize", "deserialize"):
        if not callable(getattr(registry, attr)):
            raise TypeError(f"tile registry {registry.name}: `{attr}` must be callable")


def _outcome(check: str, failures: list[str], **metrics: Any) -> Outcome:
    listed = failures[:MAX_LISTED]
    if len(failures) > MAX_LISTED:
        listed.append(f"... and {len(failures) - MAX_LISTED} more")
    return Outcome(check, tuple(listed), {"failures": len(failures), **metrics})


def _is_plain(spec: Any) -> bool:
    if isinstance(spec, bool | int | float | str):
        return True
    if isinstance(spec, tuple | list):
        return all(_is_plain(s) for s in spec)
    return False


def _key(registry: Any, tile: Any, problem: Any, device: Any) -> Any:
    key_fn = getattr(registry, "key", None)
    return key_fn(tile, problem, device) if callable(key_fn) else tile


def _qualify(registry: Any, tile: Any, problem: Any, device: Any) -> tuple[bool, str]:
    result = registry.qualify(tile, problem, device)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool)):
        raise TypeError(f"{registry.name}.qualify must return (bool, reason), got {result!r}")
    return result


def _round_trip_one(registry: Any, problem: Any, device: Any) -> tuple[Any, str | None]:
    """Return ``(auto tile, failure or None)`` for one (problem, device)."""
    where = f"{problem!r} on {device.name}"
    try:
        tile = registry.auto_select(problem, device)
    except Exception as exc:  # noqa: BLE001 - reported
        return None, f"auto_select raised {type(exc).__name__} for {where}: {exc}"
    if tile not in registry.entries:
        return tile, f"auto_select returned undeclared tile {tile!r} for {where}"
    ok, reason = _qualify(registry, tile, problem, device)
    if not ok:
        return tile, f"auto-selected {tile!r} is rejected by qualify for {where}: {reason}"
    spec = registry.serialize(tile)
    if not _is_plain(spec):
        return tile, f"serialize({tile!r}) = {spec!r} is not plain ints/strings (custom-op schema)"
    back = registry.deserialize(spec)
    if back != tile:
        return tile, f"serialize/deserialize changed {tile!r} into {back!r}"
    try:
        pinned = registry.pin(spec, problem, device)
    except Exception as exc:  # noqa: BLE001
        return tile, f"pin rejects the auto-selected {tile!r} for {where}: {exc}"
    if pinned != tile:
        return tile, f"pin({spec!r}) gave {pinned!r}, auto-selection gave {tile!r} for {where}"
    if _key(registry, pinned, problem, device) != _key(registry, tile, problem, device):
        return tile, f"cache key differs between auto {tile!r} and pin for {where}"
    return tile, None


def check_round_trip(
    registry: Any, problems: Iterable[Any], devices: Sequence[SimulatedDevice] = DEVICES
) -> Outcome:
    """auto_select → qualify → serialize → deserialize → pin, same tile and key (docstring)."""
    validate_registry(registry)
    failures: list[str] = []
    selected: dict[str, int] = {}
    combos = 0
    for problem in problems:
        for device in devices:
            combos += 1
            tile, failure = _round_trip_one(registry, problem, device)
            if failure:
                failures.append(failure)
            elif tile is not None:
                selected[repr(tile)] = selected.get(repr(tile), 0) + 1
    never = [repr(t) for t in registry.entries if repr(t) not in selected]
    return _outcome("tiles.round_trip", failures, combos=combos, selected=selected, never=never)


def check_pin_matches_qualify(
    registry: Any, problems: Iterable[Any], devices: Sequence[SimulatedDevice] = DEVICES
) -> Outcome:
    """For every entry, ``pin`` accepts exactly when ``qualify`` does."""
    validate_registry(registry)
    failures: list[str] = []
    combos = 0
    for problem in problems:
        for device in devices:
            for tile in registry.entries:
                combos += 1
                ok, reason = _qualify(registry, tile, problem, device)
                spec = registry.serialize(tile)
                try:
                    registry.pin(spec, problem, device)
                    pin_error = None
                except ValueError as exc:
                    pin_error = str(exc)
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"pin raised {type(exc).__name__} (not ValueError): {exc}")
                    continue
                where = f"{tile!r} for {problem!r} on {device.name}"
                if ok and pin_error is not None:
                    failures.append(f"pin rejects {where} that qualify accepts: {pin_error}")
                elif not ok and pin_error is None:
                    failures.append(f"pin accepts {where} that qualify rejects ({reason})")
    return _outcome("tiles.pin_matches_qualify", failures, combos=combos)


DEFAULT_TILE_FIELDS = ("tile_k", "tile_n", "tile_m", "cta_threads", "threads")


def _field_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def find_duplicated_floors(
    source: str, predicate_name: str, fields: Sequence[str] = DEFAULT_TILE_FIELDS
) -> list[str]:
    """Ordering comparisons of a tile field against an int literal outside ``predicate_name``.

    Returns ``"line N: <expr> in <function>"`` for each; an empty list means the floors live in
    the one predicate only. Equality tests (``tile_k == 32``, naming an entry) are not floors."""
    if not isinstance(source, str):
        raise TypeError(f"find_duplicated_floors: source must be str, got {type(source).__name__}")
    if not isinstance(predicate_name, str) or not predicate_name:
        raise ValueError("find_duplicated_floors: predicate_name must be a non-empty string")
    tree = ast.parse(source)
    found: list[str] = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if function != predicate_name and isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            ordering = any(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in node.ops)
            has_field = any(_field_name(o) in fields for o in operands)
            has_int = any(isinstance(o, ast.Constant) and type(o.value) is int for o in operands)
            if ordering and has_field and has_int:
                found.append(f"line {node.lineno}: {ast.unparse(node)} in {function or '<module>'}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def check_registry(
    registry: Any,
    problems: Iterable[Any] | None = None,
    devices: Sequence[SimulatedDevice] = DEVICES,
) -> list[Outcome]:
    """Both dynamic checks; ``problems`` defaults to ``registry.problems``."""
    validate_registry(registry)
    if problems is None:
        problems = getattr(registry, "problems", None)
        if problems is None:
            raise ValueError(f"tile registry {registry.name}: no problems given and none declared")
    problems = list(problems)
    return [
        check_round_trip(registry, problems, devices),
        check_pin_matches_qualify(registry, problems, devices),
    ]


def parse_tile(text: str) -> tuple[int, ...]:
    """``"32x512x256"`` (or ``"32,512,256"``) → ``(32, 512, 256)``."""
    if not isinstance(text, str) or not re.fullmatch(r"\s*\d+(\s*[x,]\s*\d+)*\s*", text):
        raise ValueError(f"--tile: expected integers joined by 'x', e.g. 32x512x256, got {text!r}")
    return tuple(int(v) for v in re.split(r"\s*[x,]\s*", text.strip()))
