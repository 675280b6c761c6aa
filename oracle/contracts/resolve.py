"""Find every call site in a package and resolve it, statically, to a function of the package.

Layout:
* :func:`iter_call_sites` walks every module of a :class:`~.index.PackageIndex` (module level, class
  bodies, functions, methods, nested functions) and yields a :class:`CallSite` for every
  ``ast.Call`` it sees, resolved or not.
* A :class:`Scope` carries what is known where a call is written: the module, the enclosing class
  and the name of ``self``/``cls``, local variables with a known class (``v = ClassName(...)``, ``p:
  ClassName``), and nested ``def``s.
* :func:`collect_call_sites` returns the same sites as a list together with, per function qualname,
  the *producers* of what it returns (see below): :mod:`.entries` derives from them which functions
  hand out compiled kernels.
* Resolution rules (module, imported and nested functions, constructors, ``__call__``, methods
  through ``self`` / ``cls`` / ``super()`` / typed locals and attributes, ``functools.partial``;
  anything else unresolved, not checked) and the ``producers`` / ``record`` facts kept for
  :mod:`.entries`: docs/notes/oracle.md.

Invariants:
* ``skip_first`` on a resolved call site is true exactly when Python supplies the first
  parameter implicitly (bound method, classmethod, constructor), never for staticmethods or
  unbound ``Class.method(obj, ...)`` calls.
* A local name that is assigned but whose class is unknown shadows module-level names: it is
  never resolved to a module function of the same name.
* Ambiguity is never guessed away: a nested ``def`` defined twice with different signatures (or
  also bound by assignment), or an attribute/local assigned instances of different classes, is
  left unresolved.
* Types are flow-insensitive per scope (every assignment in a function counts everywhere in it);
  module-level ``NAME = ClassName(...)`` types are visible in the module's functions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .binding import signature_of
from .index import (
    ClassInfo,
    FunctionInfo,
    ModuleInfo,
    PackageIndex,
    annotation_name,
    decorator_name,
    dotted_name,
)

INSTANCE = "instance"
CLASS = "class"


@dataclass(frozen=True)
class CallSite:
    """One call as written, and the package function it resolves to (``callee`` may be None)."""

    call: ast.Call
    caller: str
    path: Path
    callee: FunctionInfo | None = None
    skip_first: bool = False
    partial: bool = False
    producers: frozenset[str] = frozenset()
    record: RecordArg | None = None


@dataclass(frozen=True)
class RecordArg:
    """A launch-record argument ``*X.args()`` of a call (see :mod:`.entries`).

    ``constructions`` are the calls ``X`` may come from, each with the class it constructs (or
    ``None``): the inline ``Rec(...)``, or every value assigned to the local ``X`` in the scope;
    empty when one of them is not a call (a parameter, a loop target, ``X = other``) or ``X`` is
    neither. ``sole``: ``*X.args()`` is the call's only argument (no other positional, no keyword).
    """

    expression: str
    constructions: tuple[tuple[ast.Call, ClassInfo | None], ...]
    sole: bool


@dataclass
class Scope:
    module: ModuleInfo
    caller: str
    cls: ClassInfo | None = None
    self_name: str | None = None
    self_kind: str = INSTANCE
    local_types: dict[str, tuple[str, ClassInfo] | None] = field(default_factory=dict)
    local_names: set[str] = field(default_factory=set)
    local_funcs: dict[str, FunctionInfo | None] = field(default_factory=dict)
    module_types: dict[str, tuple[str, ClassInfo]] = field(default_factory=dict)
    #: every value assigned to a local name (``None`` for a binding whose value is not an
    #: expression: parameter, loop target, unpacking, ``with ... as``, augmented assignment)
    local_values: dict[str, list[ast.expr | None]] = field(default_factory=dict)

    def child(self, caller: str) -> Scope:
        return Scope(
            self.module,
            caller,
            self.cls,
            self.self_name,
            self.self_kind,
            dict(self.local_types),
            set(self.local_names),
            dict(self.local_funcs),
            self.module_types,
            {name: list(values) for name, values in self.local_values.items()},
        )


class Resolver:
    """Resolves callee and value expressions within one :class:`Scope`."""

    def __init__(self, index: PackageIndex) -> None:
        self.index = index

    # -- values -------------------------------------------------------------------------------
    def type_of(self, expr: ast.expr, scope: Scope) -> tuple[str, ClassInfo] | None:
        if isinstance(expr, ast.Name):
            if expr.id in scope.local_types:
                return scope.local_types[expr.id]
            if expr.id == scope.self_name and scope.cls is not None:
                return scope.self_kind, scope.cls
            if expr.id in scope.local_names:
                return None
            if expr.id in scope.module_types:
                return scope.module_types[expr.id]
            obj = self.index.resolve_in_module(scope.module, expr.id)
            return (CLASS, obj) if isinstance(obj, ClassInfo) else None
        if isinstance(expr, ast.Attribute):
            base = self.type_of(expr.value, scope)
            if base is not None:
                kind, cls = base
                if kind == INSTANCE:
                    attr_cls = self.index.attr_type(cls, expr.attr)
                    return (INSTANCE, attr_cls) if attr_cls is not None else None
                nested = self.index.classes.get(f"{cls.qualname}.{expr.attr}")
                return (CLASS, nested) if nested is not None else None
            obj = self._module_level(expr, scope)
            return (CLASS, obj) if isinstance(obj, ClassInfo) else None
        if isinstance(expr, ast.Call):
            target = self.type_of(expr.func, scope)
            if target is not None and target[0] == CLASS:
                return INSTANCE, target[1]
            if target is None:
                callee = self.callee(expr.func, scope)
                if callee is not None and callee[0].node is not None:
                    module = self.index.modules.get(callee[0].module)
                    cls = self.annotation_class(callee[0].node.returns, module)
                    return (INSTANCE, cls) if cls is not None else None
        return None

    def annotation_class(self, annotation: ast.expr | None, module: ModuleInfo | None):
        """The package class an annotation names, resolved at module scope, or ``None``."""
        name = annotation_name(annotation)
        if name is None or module is None:
            return None
        obj = self.index.resolve_in_module(module, name)
        return obj if isinstance(obj, ClassInfo) else None

    def _module_level(self, expr: ast.expr, scope: Scope):
        name = dotted_name(expr)
        if name is None:
            return None
        head = name.split(".")[0]
        if head in scope.local_names or head in scope.local_types or head == scope.self_name:
            return None
        return self.index.resolve_in_module(scope.module, name)

    def external_name(self, expr: ast.expr, scope: Scope) -> str | None:
        """The fully qualified dotted name of an imported (possibly external) object."""
        name = dotted_name(expr)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head in scope.local_names or head not in scope.module.imports:
            return None
        target = scope.module.imports[head]
        return f"{target}.{rest}" if rest else target

    # -- callees ------------------------------------------------------------------------------
    def callee(self, func: ast.expr, scope: Scope) -> tuple[FunctionInfo, bool] | None:
        """(function, skip_first) for a callee expression, or ``None`` when not in the package."""
        if isinstance(func, ast.Name) and func.id in scope.local_funcs:
            local = scope.local_funcs[func.id]
            return (local, False) if local is not None else None
        if isinstance(func, ast.Attribute) and _is_super_call(func.value):
            return self._super_method(func.attr, scope)
        if isinstance(func, ast.Attribute):
            base = self.type_of(func.value, scope)
            if base is not None:
                return self._member_call(base, func.attr)
        typed = self.type_of(func, scope)
        if typed is not None:
            kind, cls = typed
            if kind == CLASS:
                init = self.index.constructor(cls)
                return (init, True) if init is not None else None
            method = self.index.find_method(cls, "__call__")
            return (method, True) if method is not None else None
        obj = self._module_level(func, scope)
        if isinstance(obj, FunctionInfo) and obj.class_qualname is None:
            return obj, False
        return None

    def _member_call(self, base: tuple[str, ClassInfo], attr: str):
        kind, cls = base
        method = self.index.find_method(cls, attr)
        if method is None:
            nested = self.index.classes.get(f"{cls.qualname}.{attr}")
            init = self.index.constructor(nested) if nested is not None else None
            return (init, True) if init is not None else None
        if method.is_property:
            return None
        if method.is_staticmethod:
            return method, False
        if method.is_classmethod:
            return method, True
        return method, kind == INSTANCE

    def _super_method(self, attr: str, scope: Scope):
        if scope.cls is None:
            return None
        method = self.index.find_method(scope.cls, attr, after=scope.cls.qualname)
        if method is None or method.is_property:
            return None
        return method, not method.is_staticmethod

    def producers(self, expr: ast.expr, scope: Scope, _depth: int = 0) -> frozenset[str]:
        """Names of the callables whose result ``expr`` may be: ``g(...)`` → ``g``'s qualname
        (package) or dotted name (imported) or ``?.attr`` (method of an unknown object); a local
        name → the producers of every value assigned to it. Unknown parts add nothing."""
        if _depth > 4:
            return frozenset()
        if isinstance(expr, ast.Call):
            target = self.callee(expr.func, scope)
            if target is not None:
                return frozenset({target[0].qualname})
            name = self.external_name(expr.func, scope)
            if name is not None:
                return frozenset({name})
            if isinstance(expr.func, ast.Attribute):
                return frozenset({f"?.{expr.func.attr}"})
            return frozenset()
        if isinstance(expr, ast.Name) and expr.id in scope.local_values:
            found: set[str] = set()
            for value in scope.local_values[expr.id]:
                if value is not None:
                    found |= self.producers(value, scope, _depth + 1)
            return frozenset(found)
        return frozenset()

    def record_arg(self, call: ast.Call, scope: Scope) -> RecordArg | None:
        """The launch-record argument ``*X.args()`` of ``call``, if it has one."""
        for arg in call.args:
            if not isinstance(arg, ast.Starred):
                continue
            inner = arg.value
            if not (
                isinstance(inner, ast.Call)
                and not inner.args
                and not inner.keywords
                and isinstance(inner.func, ast.Attribute)
                and inner.func.attr == "args"
            ):
                continue
            holder = inner.func.value
            values: list[ast.expr | None] = [holder] if isinstance(holder, ast.Call) else []
            if isinstance(holder, ast.Name):
                values = scope.local_values.get(holder.id, [])
            constructions = []
            if values and all(isinstance(v, ast.Call) for v in values):
                for value in values:
                    typed = self.type_of(value, scope)
                    cls = typed[1] if typed is not None and typed[0] == INSTANCE else None
                    constructions.append((value, cls))
            sole = len(call.args) == 1 and not call.keywords
            return RecordArg(ast.unparse(holder), tuple(constructions), sole)
        return None

    def is_partial(self, func: ast.expr, scope: Scope) -> bool:
        return self.external_name(func, scope) == "functools.partial" or (
            dotted_name(func) == "functools.partial" and "functools" not in scope.local_names
        )


def _is_super_call(expr: ast.expr) -> bool:
    return (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id == "super"
        and len(expr.args) in (0, 2)
    )


def _own_nodes(body: list[ast.AST]) -> Iterator[ast.AST]:
    """Every node of ``body`` that belongs to this scope (nested def/class bodies excluded)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = [*node.decorator_list, *node.args.defaults]
            inner += [d for d in node.args.kw_defaults if d is not None]
            stack.extend(reversed(inner))
        elif isinstance(node, ast.ClassDef):
            stack.extend(reversed([*node.decorator_list, *node.bases]))
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _note_value(scope: Scope, name: str, value: ast.expr | None) -> None:
    scope.local_values.setdefault(name, []).append(value)


def _assigned_names(target: ast.expr) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


class CallCollector:
    """Walks a package and yields resolved :class:`CallSite`s."""

    def __init__(self, index: PackageIndex) -> None:
        self.index = index
        self.resolver = Resolver(index)
        #: function qualname → producers of its ``return`` values (filled while walking)
        self.returns: dict[str, set[str]] = {}

    def iter_call_sites(self) -> Iterator[CallSite]:
        for module in self.index.modules.values():
            scope = Scope(module, f"{module.name}.<module>")
            self._prescan(module.tree.body, scope)
            scope.module_types = {k: v for k, v in scope.local_types.items() if v is not None}
            yield from self._walk(module.tree.body, scope)

    def _prescan(self, body: list[ast.AST], scope: Scope) -> None:
        for node in _own_nodes(body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                # module functions and methods resolve through the index; nested defs here
                if not scope.caller.endswith((".<module>", ".<class>")):
                    info = self._nested_info(node, scope)
                    previous = scope.local_funcs.get(node.name, info)
                    same = previous is not None and previous.signature == info.signature
                    scope.local_funcs[node.name] = info if same else None
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in _assigned_names(target):
                        scope.local_names.add(name)
                        if isinstance(node, ast.AugAssign) or not isinstance(target, ast.Name):
                            _note_value(scope, name, None)
                            continue
                        if node.value is not None:
                            _note_value(scope, name, node.value)
                        self._note_local_type(name, node, scope)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                for name in _assigned_names(node.target):
                    scope.local_names.add(name)
                    _note_value(scope, name, None)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        for name in _assigned_names(item.optional_vars):
                            scope.local_names.add(name)
                            _note_value(scope, name, None)
            elif isinstance(node, ast.NamedExpr):
                scope.local_names.add(node.target.id)
                _note_value(scope, node.target.id, node.value)
        for name in scope.local_names & set(scope.local_funcs):
            scope.local_funcs[name] = None  # also bound otherwise: which one is called is unknown

    def _note_local_type(self, name: str, node: ast.Assign | ast.AnnAssign, scope: Scope) -> None:
        typed = None
        if isinstance(node, ast.AnnAssign):
            cls = self.resolver.annotation_class(node.annotation, scope.module)
            typed = (INSTANCE, cls) if cls is not None else None
        if typed is None and node.value is not None and isinstance(node.value, ast.Call):
            typed = self.resolver.type_of(node.value, scope)
        if name in scope.local_types and scope.local_types[name] != typed:
            scope.local_types[name] = None
        else:
            scope.local_types[name] = typed

    def _nested_info(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: Scope):
        return FunctionInfo(
            qualname=f"{scope.caller}.{node.name}",
            name=node.name,
            module=scope.module.name,
            path=scope.module.path,
            node=node,
            signature=signature_of(node),
            decorators=frozenset(decorator_name(d) for d in node.decorator_list),
            lineno=node.lineno,
        )

    def _function_scope(self, fn: FunctionInfo | None, node, parent: Scope, caller: str) -> Scope:
        scope = parent.child(caller)
        if fn is not None and fn.class_qualname is not None:
            scope.cls = self.index.classes[fn.class_qualname]
            scope.self_name = None
            scope.local_types = {}
            scope.local_names = set()
            scope.local_funcs = {}
            scope.local_values = {}
            if not fn.is_staticmethod and (node.args.posonlyargs or node.args.args):
                scope.self_name = (node.args.posonlyargs or node.args.args)[0].arg
                scope.self_kind = CLASS if fn.is_classmethod else INSTANCE
        args = node.args
        all_args = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        all_args += [a for a in (args.vararg, args.kwarg) if a is not None]
        for arg in all_args:
            if arg.arg == scope.self_name:
                continue
            scope.local_names.add(arg.arg)
            scope.local_types.pop(arg.arg, None)
            scope.local_funcs.pop(arg.arg, None)
            scope.local_values[arg.arg] = [None]
            cls = self.resolver.annotation_class(arg.annotation, scope.module)
            if cls is not None:
                scope.local_types[arg.arg] = (INSTANCE, cls)
        self._prescan(node.body, scope)
        return scope

    def _walk(self, body, scope: Scope) -> Iterator[CallSite]:
        for node in _own_nodes(body):
            if isinstance(node, ast.Call):
                yield self._site(node, scope)
            elif isinstance(node, ast.Return) and node.value is not None:
                produced = self.resolver.producers(node.value, scope)
                self.returns.setdefault(scope.caller, set()).update(produced)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if scope.caller.endswith(".<module>"):
                    fn = scope.module.functions.get(node.name)
                    if fn is not None and fn.node is not node:
                        fn = None  # a def inside an `if` block, not the indexed one
                    caller = fn.qualname if fn is not None else f"{scope.module.name}.{node.name}"
                    fresh = Scope(scope.module, "", module_types=scope.module_types)
                    inner = self._function_scope(fn, node, fresh, caller)
                elif scope.cls is not None and scope.caller.endswith("<class>"):
                    fn = scope.cls.methods.get(node.name)
                    caller = fn.qualname if fn is not None else f"{scope.cls.qualname}.{node.name}"
                    inner = self._function_scope(fn, node, scope, caller)
                else:
                    inner = self._function_scope(None, node, scope, f"{scope.caller}.{node.name}")
                yield from self._walk(node.body, inner)
            elif isinstance(node, ast.ClassDef):
                qual = self._class_qualname(node, scope)
                cls = self.index.classes.get(qual) if qual else None
                inner = Scope(scope.module, f"{qual or node.name}.<class>", cls)
                inner.module_types = scope.module_types
                yield from self._walk(node.body, inner)

    def _class_qualname(self, node: ast.ClassDef, scope: Scope) -> str | None:
        if scope.caller.endswith(".<module>"):
            return f"{scope.module.name}.{node.name}"
        if scope.cls is not None and scope.caller.endswith(".<class>"):
            return f"{scope.cls.qualname}.{node.name}"
        return None

    def _site(self, call: ast.Call, scope: Scope) -> CallSite:
        path = scope.module.path
        if self.resolver.is_partial(call.func, scope) and call.args:
            if isinstance(call.args[0], ast.Starred):
                return CallSite(call, scope.caller, path)
            target = self.resolver.callee(call.args[0], scope)
            if target is not None:
                return CallSite(call, scope.caller, path, target[0], target[1], partial=True)
            return CallSite(call, scope.caller, path)
        record = self.resolver.record_arg(call, scope)
        target = self.resolver.callee(call.func, scope)
        if target is None:
            producers = frozenset()
            if isinstance(call.func, (ast.Call, ast.Name)):
                producers = self.resolver.producers(call.func, scope)
            return CallSite(call, scope.caller, path, producers=producers, record=record)
        return CallSite(call, scope.caller, path, target[0], target[1], record=record)


def iter_call_sites(index: PackageIndex) -> Iterator[CallSite]:
    """Every call site of the package, with its resolved callee where one was found."""
    return CallCollector(index).iter_call_sites()


def collect_call_sites(index: PackageIndex) -> tuple[list[CallSite], dict[str, set[str]]]:
    """Every call site (as :func:`iter_call_sites`), and per function qualname the producers
    of its ``return`` values."""
    collector = CallCollector(index)
    sites = list(collector.iter_call_sites())
    return sites, collector.returns
