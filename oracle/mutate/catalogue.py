"""The mutant catalogue: data model, loading and validation, and applying one mutant to a tree.

Layout:
* ``catalogue.toml`` (next to this module) holds ``[[mutant]]`` tables. Fields:

  ``id`` (unique, ``[a-z0-9-]``), ``class`` (``R1``..``R16``), ``tier`` (``cpu`` | ``gpu``),
  ``description``, optional ``requires`` (repository paths that must exist, else the mutant is
  "not-applicable" with ``not_applicable_reason``), ``[mutant.kill]`` with ``pytest`` (node ids,
  run in the copy) and/or ``oracle`` (families of ``python -m oracle --only``), and one or more
  ``[[mutant.edit]]`` rewrites applied in order:

  - ``kind = "patch"``: ``file``, ``old``, ``new``; ``old`` must occur exactly once in the file
    (or, with ``all = true``, at least once: every occurrence is rewritten, e.g. a guard that
    several kernels of one module repeat);
  - ``kind = "ast"``: ``file``, ``op`` (one of :data:`AST_OPS`), ``callee`` (the called name or
    attribute), optional ``function`` (the enclosing ``def``) and ``drop`` (parameters to leave
    out). ``keyword-call-to-positional`` rewrites the one matching keyword call into a positional
    call (arguments in the order written), which a patch cannot express robustly.

* ``covers`` (optional): tags of :data:`ISSUE_CLASSES`, the regression list of issue 6 that the
  catalogue must cover (a completeness test checks every tag has a mutant with a rewrite).
* :func:`load_catalogue` parses and validates (``ValueError`` naming the mutant and field).
* :func:`apply_mutant` rewrites files under a root; a rewrite that matches zero or several times
  raises :class:`StaleMutant` (the catalogue has rotted: the gate fails).

Invariants:
* Applying a mutant only touches the files its edits name, and only under the given root.
* An edit never matches "approximately": exact text, or exactly one AST node.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

__all__ = [
    "AST_OPS",
    "ISSUE_CLASSES",
    "DEFAULT_CATALOGUE",
    "Edit",
    "KillCommand",
    "Mutant",
    "StaleMutant",
    "apply_edit",
    "apply_mutant",
    "load_catalogue",
]

DEFAULT_CATALOGUE = Path(__file__).resolve().parent / "catalogue.toml"
TIERS = ("cpu", "gpu")
AST_OPS = ("keyword-call-to-positional",)
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_CLASS = re.compile(r"^R([1-9]|1[0-6])$")

#: The regressions issue 6 names; every tag must be covered by a mutant with a rewrite.
ISSUE_CLASSES = {
    "stale-positional-call": "a stale positional call into a shared body (the seed bug)",
    "codebook-default-at-tier-call": "a codebook default flipped at a tier call",
    "k6-small-m-row-removed": "the K6 small-M dispatch row removed",
    "fc2-pin-tile-floor": "the tile floor re-imposed on the FC2 pin",
    "window-off-by-one": "an off-by-one in window extraction",
    "k-axis-low-high-swapped": "low/high record selection swapped on the K axis",
    "n-axis-interleave-skipped": "the N-axis interleave skipped",
    "tail-unwritten": "a tail lane left unwritten",
    "allocation-in-run": "an allocation inside run",
    "cache-key-field-dropped": "a field dropped from the compile-cache key",
    "index-stride-int32": "an index x stride product narrowed to 32 bits",
    "inactive-route-not-masked": "an inactive route not masked",
    "bf16-as-fp16": "bf16 silently computed as fp16",
    "planned-capacity-disagrees": "planned capacity disagreeing with the launch",
    "barrier-removed": "a barrier removed before scratch reuse",
}


class StaleMutant(Exception):
    """A rewrite (or kill command) of the catalogue no longer matches the project."""


@dataclasses.dataclass(frozen=True)
class Edit:
    file: str
    kind: str = "patch"
    old: str | None = None
    new: str | None = None
    op: str | None = None
    callee: str | None = None
    function: str | None = None
    drop: tuple[str, ...] = ()
    all: bool = False


@dataclasses.dataclass(frozen=True)
class KillCommand:
    pytest: tuple[str, ...] = ()
    oracle: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = list(self.pytest) + [f"oracle:{f}" for f in self.oracle]
        return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    klass: str
    tier: str
    description: str
    edits: tuple[Edit, ...]
    kill: KillCommand
    requires: tuple[str, ...] = ()
    not_applicable_reason: str = ""
    covers: tuple[str, ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.file for e in self.edits))


def _fail(where: str, message: str) -> ValueError:
    return ValueError(f"catalogue: {where}: {message}")


def _str(table: dict, key: str, where: str, *, required: bool = True) -> str | None:
    value = table.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(where, f"`{key}` must be a non-empty string, got {value!r}")
    return value


def _str_list(table: dict, key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"`{key}` must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _relative(path: str, where: str) -> str:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts:
        raise _fail(where, f"`file` must be a relative path inside the project, got {path!r}")
    return path


def _edit(table: Any, where: str) -> Edit:
    if not isinstance(table, dict):
        raise _fail(where, "an edit must be a table")
    known = {"file", "kind", "old", "new", "op", "callee", "function", "drop", "all"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise _fail(where, f"unknown edit field(s) {unknown}")
    file = _relative(_str(table, "file", where), where)
    kind = table.get("kind", "patch")
    if kind == "patch":
        old = table.get("old")
        new = table.get("new")
        if not isinstance(old, str) or not old:
            raise _fail(where, "`old` must be a non-empty string")
        if not isinstance(new, str) or new == old:
            raise _fail(where, "`new` must be a string different from `old`")
        every = table.get("all", False)
        if not isinstance(every, bool):
            raise _fail(where, f"`all` must be a boolean, got {every!r}")
        return Edit(file=file, kind=kind, old=old, new=new, all=every)
    if kind == "ast":
        op = _str(table, "op", where)
        if op not in AST_OPS:
            raise _fail(where, f"`op` must be one of {AST_OPS}, got {op!r}")
        return Edit(
            file=file,
            kind=kind,
            op=op,
            callee=_str(table, "callee", where),
            function=_str(table, "function", where, required=False),
            drop=_str_list(table, "drop", where),
        )
    raise _fail(where, f"`kind` must be 'patch' or 'ast', got {kind!r}")


def _mutant(table: Any, index: int) -> Mutant:
    if not isinstance(table, dict):
        raise _fail(f"mutant #{index}", "must be a table")
    where = f"mutant #{index}"
    mid = _str(table, "id", where)
    if not _ID.match(mid):
        raise _fail(where, f"`id` must match {_ID.pattern}, got {mid!r}")
    where = f"mutant {mid!r}"
    known = {
        "id",
        "class",
        "tier",
        "description",
        "edit",
        "kill",
        "requires",
        "not_applicable_reason",
        "covers",
    }
    unknown = sorted(set(table) - known)
    if unknown:
        raise _fail(where, f"unknown field(s) {unknown}")
    klass = _str(table, "class", where)
    if not _CLASS.match(klass):
        raise _fail(where, f"`class` must be R1..R16, got {klass!r}")
    tier = _str(table, "tier", where)
    if tier not in TIERS:
        raise _fail(where, f"`tier` must be one of {TIERS}, got {tier!r}")
    description = _str(table, "description", where)
    edits_raw = table.get("edit", [])
    requires_raw = table.get("requires", [])
    if not isinstance(edits_raw, list) or (not edits_raw and not requires_raw):
        raise _fail(where, "needs at least one [[mutant.edit]] (or `requires` with a reason)")
    edits = tuple(_edit(e, f"{where} edit #{i}") for i, e in enumerate(edits_raw))
    kill_raw = table.get("kill")
    if not isinstance(kill_raw, dict):
        raise _fail(where, "needs a [mutant.kill] table")
    unknown = sorted(set(kill_raw) - {"pytest", "oracle"})
    if unknown:
        raise _fail(where, f"unknown kill field(s) {unknown}")
    kill = KillCommand(
        pytest=_str_list(kill_raw, "pytest", f"{where} kill"),
        oracle=_str_list(kill_raw, "oracle", f"{where} kill"),
    )
    if not kill.pytest and not kill.oracle:
        raise _fail(where, "the kill command names no pytest node id and no oracle family")
    requires = tuple(_relative(p, where) for p in _str_list(table, "requires", where))
    reason = table.get("not_applicable_reason", "")
    if not isinstance(reason, str):
        raise _fail(where, "`not_applicable_reason` must be a string")
    if requires and not reason:
        raise _fail(where, "`requires` needs a `not_applicable_reason`")
    if not edits and not reason:
        raise _fail(where, "a mutant without a rewrite needs a `not_applicable_reason`")
    covers = _str_list(table, "covers", where)
    unknown = sorted(set(covers) - set(ISSUE_CLASSES))
    if unknown:
        raise _fail(where, f"unknown `covers` tag(s) {unknown}; known: {sorted(ISSUE_CLASSES)}")
    return Mutant(mid, klass, tier, description, edits, kill, requires, reason, covers)


def load_catalogue(path: str | Path | None = None) -> tuple[Mutant, ...]:
    """Parse and validate a catalogue (default: the packaged ``catalogue.toml``)."""
    if path is not None and not isinstance(path, str | Path):
        raise TypeError(f"path: expected str or Path, got {type(path).__name__}")
    source = DEFAULT_CATALOGUE if path is None else Path(path)
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"path: {source} is not valid TOML: {exc}") from exc
    raw = data.get("mutant")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"path: {source} declares no [[mutant]] tables")
    mutants = tuple(_mutant(t, i) for i, t in enumerate(raw))
    seen: set[str] = set()
    for m in mutants:
        if m.id in seen:
            raise _fail(f"mutant {m.id!r}", "duplicate id")
        seen.add(m.id)
    return mutants


# ------------------------------------------------------------------------------ applying


def _patch(text: str, edit: Edit) -> str:
    count = text.count(edit.old)
    if count != 1 and not (edit.all and count >= 1):
        first = edit.old.strip().splitlines()[0][:60]
        want = "at least 1" if edit.all else "1"
        raise StaleMutant(
            f"{edit.file}: patch text {first!r}... found {count} times (expected {want})"
        )
    return text.replace(edit.old, edit.new)


def _callee_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _matching_calls(tree: ast.AST, edit: Edit) -> list[ast.Call]:
    scopes: list[ast.AST] = [tree]
    if edit.function:
        scopes = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == edit.function
        ]
    calls = []
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and _callee_name(node) == edit.callee:
                calls.append(node)
    return list({id(c): c for c in calls}.values())


def _keyword_call_to_positional(text: str, edit: Edit) -> str:
    tree = ast.parse(text)
    calls = [c for c in _matching_calls(tree, edit) if c.keywords and not c.args]
    if len(calls) != 1:
        scope = f" in {edit.function}()" if edit.function else ""
        raise StaleMutant(
            f"{edit.file}: {len(calls)} keyword-only calls to {edit.callee}{scope} (expected 1)"
        )
    call = calls[0]
    names = [kw.arg for kw in call.keywords]
    missing = [d for d in edit.drop if d not in names]
    if missing or None in names:
        raise StaleMutant(f"{edit.file}: call to {edit.callee} lacks keyword(s) {missing}")
    args = [kw.value for kw in call.keywords if kw.arg not in edit.drop]
    positional = ast.Call(func=call.func, args=args, keywords=[])
    replacement = ast.unparse(positional).encode()
    data = text.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    begin = starts[call.lineno - 1] + call.col_offset
    end = starts[call.end_lineno - 1] + call.end_col_offset
    return (data[:begin] + replacement + data[end:]).decode()


def apply_edit(root: str | Path, edit: Edit) -> None:
    """Apply one edit under ``root``; :class:`StaleMutant` when it does not match exactly once."""
    path = Path(root) / edit.file
    if not path.is_file():
        raise StaleMutant(f"{edit.file}: file not found")
    text = path.read_text(encoding="utf-8")
    if edit.kind == "patch":
        new_text = _patch(text, edit)
    elif edit.op == "keyword-call-to-positional":
        new_text = _keyword_call_to_positional(text, edit)
    else:  # pragma: no cover - load_catalogue validates ops
        raise ValueError(f"edit: unknown op {edit.op!r}")
    path.write_text(new_text, encoding="utf-8")


def apply_mutant(mutant: Mutant, root: str | Path) -> None:
    """Apply every edit of ``mutant`` to the tree at ``root`` (a copy, never the working tree)."""
    if not isinstance(mutant, Mutant):
        raise TypeError(f"mutant: expected Mutant, got {type(mutant).__name__}")
    if not isinstance(root, str | Path) or not Path(root).is_dir():
        raise ValueError(f"root: expected an existing directory, got {root!r}")
    for edit in mutant.edits:
        apply_edit(root, edit)
