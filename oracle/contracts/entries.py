"""Calls into marked kernel entries and shared bodies: how many the checker binds by name.

A *marked entry* is a package function decorated ``@abi_entry`` or ``@shared_body``
(:data:`MARKERS`). An *entry call* is a call that is ``direct`` (its callee resolves,
:mod:`.resolve`, to a marked entry), ``record`` (it passes a launch record, ``f(*Rec(...).args())``
or ``f(*rec.args())``) or ``launch`` (an unresolvable call of a *compiled kernel*: the result of
a compile provider, :data:`COMPILE_SEEDS`, :data:`COMPILE_EXTERNALS` and every function returning
a provider's result, to a fixed point). It is *resolved* when bound, every argument matched, to
the entry's signature: a ``direct`` call without unpacking (:func:`~.binding.bind_call`), a
``record`` call whose record class is bound to a marked entry; a ``launch`` never is.

Launch records: a class with a class attribute ``entry`` (:data:`RECORD_ATTR`; a dotted
qualname string or a reference) names its kernel entry, which must be marked. Its keyword
construction is bound to the entry's signature (``unknown-keyword``, ``duplicate-binding``,
``arity`` except :data:`ENV_SUPPLIED` and defaulted parameters, ``shared-body-default``, the
pinned slots), and the fields the class writes out must be exactly the entry's launch
parameters (:func:`launch_parameters`), so a kernel signature that changed under its record is
caught without a GPU. The rules in full: docs/notes/oracle.md.

Invariants:
* Standard library only; works on :mod:`.resolve`'s call sites and :mod:`.index` alone.
* Every entry call is counted exactly once (``record`` before ``direct`` before ``launch``).
* An empty denominator reads as 100 % (nothing to bind, nothing unbound).
"""

from __future__ import annotations

import ast
import contextlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .binding import VAR_KEYWORD, VAR_POSITIONAL, bind_call
from .index import ClassInfo, FunctionInfo, PackageIndex, dotted_name
from .resolve import CallSite
from .rules import SHARED_BODY, Violation, bind_site
from .slots import PinnedSlot, check_pinned_slots

MARKERS = frozenset({"abi_entry", SHARED_BODY})
RECORD_ATTR = "entry"
COMPILE_SEEDS = frozenset({"compiled_kernel", "get_or_compile"})
COMPILE_EXTERNALS = frozenset({"cutlass.cute.compile"})
ENV_SUPPLIED = frozenset({"stream"})
RECORD_RULE = "launch-record"


@dataclass(frozen=True)
class EntryCall:
    """One call into a marked entry (``kind``: ``direct``, ``record`` or ``launch``)."""

    path: str
    line: int
    caller: str
    callee: str
    kind: str
    resolved: bool
    reason: str = ""

    def format(self, relative_to: Path | None = None) -> str:
        path = self.path
        if relative_to is not None:
            with contextlib.suppress(ValueError):
                path = str(Path(self.path).resolve().relative_to(relative_to.resolve()))
        return f"{path}:{self.line}: [entry-call] {self.caller} -> {self.callee}: {self.reason}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class EntryCalls:
    """Every entry call of a package; ``resolved`` / ``total`` is the metric."""

    calls: list[EntryCall] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.calls)

    @property
    def resolved(self) -> int:
        return sum(c.resolved for c in self.calls)

    @property
    def unresolved(self) -> list[EntryCall]:
        return [c for c in self.calls if not c.resolved]

    @property
    def percent(self) -> float:
        return 100.0 if not self.total else 100.0 * self.resolved / self.total

    def below(self, minimum: float) -> bool:
        """Whether resolved/total*100 < ``minimum`` (exact: no rounding at the boundary)."""
        return self.total > 0 and self.resolved * 100 < minimum * self.total

    def to_json(self) -> dict:
        return {
            "resolved": self.resolved,
            "total": self.total,
            "unresolved": [c.to_json() for c in self.unresolved],
        }


def format_percent(value: float) -> str:
    """``78.57`` → ``"78.6"``, ``100.0`` → ``"100"``; short of 100 never reads ``"100"``."""
    text = f"{value:.1f}".rstrip("0").rstrip(".")
    return "99.9" if text == "100" and value < 100 else text


def is_marked(fn: FunctionInfo | None) -> bool:
    return fn is not None and bool(fn.decorators & MARKERS)


def _last_name(producer: str) -> str:
    return producer.rpartition(".")[2]


def is_compile_seed(producer: str) -> bool:
    """A compile lookup by name: :data:`COMPILE_EXTERNALS`, or a last name in
    :data:`COMPILE_SEEDS` (package function, import, or ``?.get_or_compile`` of any object)."""
    return producer in COMPILE_EXTERNALS or _last_name(producer) in COMPILE_SEEDS


def compile_providers(returns: dict[str, set[str]]) -> set[str]:
    """Producers whose result is a compiled kernel: the seeds, then (to a fixed point) every
    function that returns a provider's result. ``returns`` is function → producers of its
    ``return`` values (:func:`~.resolve.collect_call_sites`). A seed that no function returns
    is still a provider: :func:`classify` asks :func:`is_compile_seed` too."""
    providers = {name for produced in returns.values() for name in produced}
    providers = {name for name in providers | set(returns) if is_compile_seed(name)}
    changed = True
    while changed:
        changed = False
        for fn, produced in returns.items():
            if fn not in providers and produced & providers:
                providers.add(fn)
                changed = True
    return providers


def _kernel_value(cls: ClassInfo) -> ast.expr | None:
    for stmt in cls.node.body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        if any(isinstance(t, ast.Name) and t.id == RECORD_ATTR for t in targets):
            return stmt.value
    return None


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def record_kernel(index: PackageIndex, cls: ClassInfo) -> tuple[bool, str, FunctionInfo | None]:
    """(is a record, how ``entry`` is written, the entry it names or ``None``) for ``cls``."""
    for owner in index.mro(cls):
        value = _kernel_value(owner)
        if value is None:
            continue
        if _is_none(value):
            return False, "", None  # `entry = None`: an abstract base, not a record
        module = index.modules[owner.module]
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            written, target = repr(value.value), index.lookup(value.value)
        else:
            name = dotted_name(value)
            written = ast.unparse(value)
            target = index.resolve_in_module(module, name) if name else None
        if isinstance(target, ClassInfo):
            target = index.find_method(target, "__call__")
        return True, written, target if isinstance(target, FunctionInfo) else None
    return False, "", None


def record_classes(index: PackageIndex) -> dict[str, FunctionInfo | None]:
    """Every launch-record class of the package (qualname) → the entry it names (or None)."""
    found = {}
    for qualname, cls in index.classes.items():
        is_record, _, target = record_kernel(index, cls)
        if is_record:
            found[qualname] = target
    return found


def record_fields(index: PackageIndex, cls: ClassInfo) -> list[str]:
    """The fields a record class writes out: annotated class attributes of it and its package
    bases, ``ClassVar`` (``entry`` among them) and ``KW_ONLY`` markers excluded."""
    fields: list[str] = []
    for owner in reversed(index.mro(cls)):
        for stmt in owner.node.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            annotation = ast.unparse(stmt.annotation)
            name = stmt.target.id
            if "ClassVar" in annotation or annotation.endswith("KW_ONLY") or name == RECORD_ATTR:
                continue
            if name not in fields:
                fields.append(name)
    return fields


def launch_parameters(entry: FunctionInfo) -> list[str]:
    """The parameters a launch record of ``entry`` carries: ``self`` and :data:`ENV_SUPPLIED`
    dropped, variadic ones too, in the entry's order."""
    params = entry.signature.without_first() if _skip_first(entry) else entry.signature
    variadic = (VAR_POSITIONAL, VAR_KEYWORD)
    return [p.name for p in params.params if p.kind not in variadic and p.name not in ENV_SUPPLIED]


def check_record_definitions(index: PackageIndex) -> list[Violation]:
    """``launch-record`` violations of the record classes themselves: an ``entry`` of the class's
    own that names nothing, and fields written out (a dataclass) that are not exactly the
    entry's launch parameters (:func:`launch_parameters`)."""
    found = []

    def violation(cls: ClassInfo, expression: str, message: str) -> Violation:
        return Violation(
            RECORD_RULE,
            str(cls.path),
            cls.node.lineno,
            "<definition>",
            cls.qualname,
            RECORD_ATTR,
            expression,
            message,
        )

    for cls in index.classes.values():
        is_record, written, target = record_kernel(index, cls)
        if not is_record:
            continue
        own = _kernel_value(cls) is not None
        if target is None:
            if own:
                found.append(
                    violation(
                        cls,
                        written,
                        f"{RECORD_ATTR} = {written} names no function or class of the package; "
                        "a launch record must name its kernel entry",
                    )
                )
            continue
        fields = record_fields(index, cls)
        if not fields:
            continue  # fields made at run time: nothing written to compare
        expected = launch_parameters(target)
        extra = [f for f in fields if f not in expected]
        missing = [p for p in expected if p not in fields]
        if extra or missing:
            parts = [f"fields not in the entry: {', '.join(extra)}"] if extra else []
            parts += [f"entry parameters without a field: {', '.join(missing)}"] if missing else []
            found.append(
                violation(
                    cls,
                    written,
                    f"launch record for {target.qualname}: {'; '.join(parts)}",
                )
            )
    return found


def _skip_first(entry: FunctionInfo) -> bool:
    return entry.class_qualname is not None and not entry.is_staticmethod


def _violation_at(site: CallSite, line: int, callee: str, rule, parameter, expression, message):
    return Violation(
        rule, str(site.path), line, site.caller, callee, parameter, expression, message
    )


def constructor_in_source(index: PackageIndex, cls: ClassInfo) -> bool:
    """Whether ``cls(...)`` binds to a constructor the source spells out (a written
    ``__init__`` or dataclass fields), which the ordinary call rules check."""
    init = index.constructor(cls)
    return init is not None and (init.node is not None or "dataclass" in init.decorators)


def _bind_record(
    site: CallSite,
    construction: ast.Call,
    cls: ClassInfo,
    entry: FunctionInfo,
    slots: list[PinnedSlot],
    *,
    checked_elsewhere: bool,
) -> tuple[list[Violation], list[str]]:
    """Violations of one record construction against ``entry`` (reported at the construction's
    line), and why it does not bind. ``checked_elsewhere``: the ordinary rules already report
    the construction's binding errors against the record's own constructor (whose fields
    :func:`check_record_definitions` holds equal to the entry's), so they only unbind here."""
    name = cls.name
    unbound: set[str] = set()
    found: list[Violation] = []
    why: list[str] = []

    def add(rule, parameter, expression, message):
        found.append(
            _violation_at(
                site,
                construction.lineno,
                entry.qualname,
                rule,
                parameter,
                expression,
                f"launch record {name}: {message}",
            )
        )

    for index, arg in enumerate(construction.args):
        add(
            RECORD_RULE,
            None,
            ast.unparse(arg),
            f"field {index + 1} is positional; a launch record binds every field by keyword",
        )
    keywords_only = ast.Call(construction.func, [], construction.keywords)
    ast.copy_location(keywords_only, construction)
    binding = bind_call(entry.signature, keywords_only, skip_first=_skip_first(entry))
    if binding.unpacked:
        why.append(f"launch record {name} is built with **unpacking")
    for error in binding.errors:
        if error.rule == "arity" and (error.parameter in ENV_SUPPLIED or construction.args):
            continue  # the environment passes it / already reported as positional
        if checked_elsewhere:
            unbound.add(error.rule)
        else:
            add(error.rule, error.parameter, error.expression, error.message)
    if SHARED_BODY in entry.decorators and not binding.unpacked:
        for param in binding.defaulted:
            add(
                "shared-body-default",
                param.name,
                param.default,
                f"relies on the default {param.name}={param.default}",
            )
    record_site = CallSite(keywords_only, site.caller, site.path, entry, _skip_first(entry))
    for parameter, expression, message in check_pinned_slots(record_site, binding, slots):
        add("pinned-slot", parameter, expression, message)
    if found or unbound:
        rules = ", ".join(sorted({v.rule for v in found} | unbound))
        why.append(f"launch record {name} does not bind to {entry.qualname} ({rules})")
    return found, why


def _record_call(
    site: CallSite, index: PackageIndex, slots: list[PinnedSlot]
) -> tuple[EntryCall | None, list[Violation]]:
    record = site.record
    if record is None:
        return None, []
    kernels = []
    for construction, cls in record.constructions:
        named = record_kernel(index, cls) if cls is not None else (False, "", None)
        kernels.append((construction, cls, *named))
    if not any(is_rec for _, _, is_rec, _, _ in kernels):
        return None, []
    why: list[str] = []
    found: list[Violation] = []
    callees: list[str] = []
    for construction, cls, is_rec, written, entry in kernels:
        what = ast.unparse(construction.func)
        if not is_rec:
            why.append(f"{record.expression} may be {what}(...), not a launch record")
            continue
        callee = entry.qualname if entry is not None else f"{cls.qualname}.{RECORD_ATTR}"
        if callee not in callees:
            callees.append(callee)
        if entry is None:
            why.append(f"{cls.name}.{RECORD_ATTR} = {written} names nothing in the package")
            continue
        if not is_marked(entry):
            why.append(f"{cls.name}.{RECORD_ATTR} names {entry.qualname}, not marked @abi_entry")
        mismatch = site.callee is not None and site.callee is not entry
        if mismatch and is_marked(site.callee):
            why.append(f"the call resolves to {site.callee.qualname}, not to {cls.name}'s entry")
        violations, problems = _bind_record(
            site,
            construction,
            cls,
            entry,
            slots,
            checked_elsewhere=constructor_in_source(index, cls),
        )
        found += violations
        why += problems
    if not record.sole:
        why.append(f"arguments beside *{record.expression}.args()")
    call = EntryCall(
        str(site.path),
        site.call.lineno,
        site.caller,
        " | ".join(callees),
        "record",
        not why,
        "; ".join(dict.fromkeys(why)),
    )
    return call, found


def _direct_call(site: CallSite) -> EntryCall | None:
    if not is_marked(site.callee):
        return None
    binding = bind_site(site)
    why = []
    if binding.errors:
        why.append("does not bind: " + ", ".join(sorted({e.rule for e in binding.errors})))
    if binding.unpacked:
        why.append("argument unpacking hides the binding")
    return EntryCall(
        str(site.path),
        site.call.lineno,
        site.caller,
        site.callee.qualname,
        "direct",
        not why,
        "; ".join(why),
    )


def _launch(site: CallSite, providers: set[str]) -> EntryCall | None:
    if site.callee is not None:
        return None
    made_by = sorted(p for p in site.producers if p in providers or is_compile_seed(p))
    if not made_by:
        return None
    if site.record is not None:
        classes = sorted({c.name for _, c in site.record.constructions if c is not None})
        reason = (
            f"{site.record.expression} is {' or '.join(classes)}, without an {RECORD_ATTR} "
            "naming its kernel"
            if classes
            else f"what {site.record.expression} is built from is unknown here"
        )
    else:
        count = len(site.call.args) + len(site.call.keywords)
        reason = (
            f"launch of a compiled kernel with {count} argument(s); which kernel is unknown "
            "statically: pass a launch record, fn(*Rec(...).args())"
        )
    return EntryCall(
        str(site.path),
        site.call.lineno,
        site.caller,
        f"<compiled by {', '.join(made_by)}>",
        "launch",
        False,
        reason,
    )


def classify(
    site: CallSite, index: PackageIndex, providers: set[str], slots: list[PinnedSlot] = ()
) -> tuple[EntryCall | None, list[Violation]]:
    """The entry call ``site`` is (``None`` when it is none) and the record violations."""
    call, found = _record_call(site, index, list(slots))
    if call is not None:
        return call, found
    return _direct_call(site) or _launch(site, providers), []
