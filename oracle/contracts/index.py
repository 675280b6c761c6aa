"""A static index of one Python package: modules, imports, functions, classes, attribute types.

Layout
------
* :func:`build_index` parses every ``.py`` file under a package root with :mod:`ast` (the package
  is never imported) and returns a :class:`PackageIndex`.
* :class:`ModuleInfo` holds a module's dotted name, its path, its parsed tree, its top-level
  functions and classes, and its import table (local name → dotted target, relative imports
  resolved against the module's package).
* :class:`FunctionInfo` is one ``def`` (module function or method): qualname, signature, the
  decorators' last attribute names, whether it is a static/class method, and its class.
* :class:`ClassInfo` is one class: its methods, its package-internal bases (resolved through
  imports), its dataclass-ness, and ``attr_types``: ``self.attr`` → class qualname, inferred from
  ``self.attr = ClassName(...)`` anywhere in the class, ``self.attr = param`` with
  ``param: ClassName``, and annotated class-level attributes.
* :meth:`PackageIndex.lookup` resolves a dotted name (``pkg.mod.Class.method``, re-exports via
  ``from .x import y`` included) to a module, class or function of the package.

Invariants
----------
* Qualnames are ``<module>.<Class>.<method>`` / ``<module>.<function>``, where ``<module>`` is
  the dotted module name starting with the root directory's name (``b12x.kernels.dense``).
* Only what is defined inside the package is indexed; anything else resolves to ``None`` and is
  simply not checked. An attribute whose inferred types disagree is dropped (no guessing).
* Decorators are matched by their last attribute name (``@cute.jit`` → ``jit``,
  ``@abi.shared_body`` → ``shared_body``, ``@cute.jit(...)`` → ``jit``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .binding import KEYWORD_ONLY, POSITIONAL_OR_KEYWORD, Param, Signature, signature_of

SKIP_DIRS = {"__pycache__", ".git", ".hypothesis", ".pytest_cache", ".ruff_cache"}


def decorator_name(node: ast.expr) -> str:
    """The last attribute name of a decorator expression (``@a.b.c(...)`` → ``c``)."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` → ``"a.b.c"``; anything that is not a pure name/attribute chain → ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def annotation_name(node: ast.expr | None) -> str | None:
    """The dotted class name an annotation names: ``X``, ``m.X``, ``"X"``, ``X | None``,
    ``Optional[X]``; anything else → ``None``."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [n for n in (node.left, node.right) if not _is_none(n)]
        return annotation_name(sides[0]) if len(sides) == 1 else None
    if isinstance(node, ast.Subscript) and dotted_name(node.value) in (
        "Optional",
        "typing.Optional",
    ):
        return annotation_name(node.slice)
    return dotted_name(node)


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


@dataclass
class FunctionInfo:
    qualname: str
    name: str
    module: str
    path: Path
    node: ast.FunctionDef | ast.AsyncFunctionDef | None
    signature: Signature
    decorators: frozenset[str]
    class_qualname: str | None = None
    lineno: int = 0

    @property
    def is_staticmethod(self) -> bool:
        return "staticmethod" in self.decorators

    @property
    def is_classmethod(self) -> bool:
        return "classmethod" in self.decorators or self.name in ("__new__", "__init_subclass__")

    @property
    def is_property(self) -> bool:
        return bool(
            self.decorators & {"property", "setter", "getter", "deleter", "cached_property"}
        )


@dataclass
class ClassInfo:
    qualname: str
    name: str
    module: str
    path: Path
    node: ast.ClassDef
    base_exprs: list[str]
    methods: dict[str, FunctionInfo] = field(default_factory=dict)
    attr_types: dict[str, str | None] = field(default_factory=dict)
    decorators: frozenset[str] = frozenset()
    has_metaclass: bool = False

    @property
    def is_dataclass(self) -> bool:
        return "dataclass" in self.decorators


@dataclass
class ModuleInfo:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    imports: dict[str, str] = field(default_factory=dict)
    functions: dict[str, FunctionInfo] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


def _module_name(root: Path, path: Path) -> tuple[str, bool]:
    rel = path.relative_to(root).with_suffix("")
    parts = [root.name, *rel.parts]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _resolve_relative(module: ModuleInfo, level: int, target: str | None) -> str:
    base = module.package.split(".")
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _collect_imports(module: ModuleInfo) -> None:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    module.imports[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    module.imports.setdefault(head, head)
        elif isinstance(node, ast.ImportFrom):
            source = (
                _resolve_relative(module, node.level, node.module) if node.level else node.module
            )
            if source is None:
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                module.imports[alias.asname or alias.name] = f"{source}.{alias.name}"


def _function_info(
    node: ast.FunctionDef | ast.AsyncFunctionDef, module: ModuleInfo, prefix: str, cls: str | None
) -> FunctionInfo:
    return FunctionInfo(
        qualname=f"{prefix}.{node.name}",
        name=node.name,
        module=module.name,
        path=module.path,
        node=node,
        signature=signature_of(node),
        decorators=frozenset(decorator_name(d) for d in node.decorator_list),
        class_qualname=cls,
        lineno=node.lineno,
    )


class PackageIndex:
    """Everything :func:`build_index` found under one package root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, ModuleInfo] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.functions: dict[str, FunctionInfo] = {}
        self.parse_errors: list[tuple[Path, str]] = []
        self._mro_cache: dict[str, list[ClassInfo]] = {}

    # -- symbol lookup ------------------------------------------------------------------------
    def lookup(self, dotted: str, _depth: int = 0) -> ModuleInfo | ClassInfo | FunctionInfo | None:
        """Resolve a dotted name to a package module, class or function (through re-exports)."""
        if _depth > 16 or not dotted:
            return None
        if dotted in self.modules:
            return self.modules[dotted]
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = self.modules.get(".".join(parts[:cut]))
            if module is None:
                continue
            obj = self._module_attr(module, parts[cut], _depth)
            for attr in parts[cut + 1 :]:
                obj = self._member(obj, attr, _depth)
            return obj
        return None

    def _module_attr(self, module: ModuleInfo, name: str, depth: int):
        if name in module.functions:
            return module.functions[name]
        if name in module.classes:
            return module.classes[name]
        if name in module.imports:
            return self.lookup(module.imports[name], depth + 1)
        return self.modules.get(f"{module.name}.{name}")

    def _member(self, obj, attr: str, depth: int):
        if isinstance(obj, ModuleInfo):
            return self._module_attr(obj, attr, depth)
        if isinstance(obj, ClassInfo):
            method = self.find_method(obj, attr)
            if method is not None:
                return method
            return self.classes.get(f"{obj.qualname}.{attr}")
        return None

    def resolve_in_module(self, module: ModuleInfo, dotted: str):
        """Resolve a dotted expression as written at module scope of ``module``."""
        head, _, rest = dotted.partition(".")
        if head in module.functions or head in module.classes:
            obj = module.functions.get(head) or module.classes.get(head)
        elif head in module.imports:
            obj = self.lookup(module.imports[head])
        else:
            return None
        for attr in rest.split(".") if rest else []:
            obj = self._member(obj, attr, 0)
        return obj

    # -- classes ------------------------------------------------------------------------------
    def bases(self, cls: ClassInfo) -> tuple[list[ClassInfo], bool]:
        """Package-internal direct bases, and whether every base resolved inside the package."""
        module = self.modules[cls.module]
        found: list[ClassInfo] = []
        complete = True
        for expr in cls.base_exprs:
            if expr in ("object", "Generic") or expr.startswith("typing."):
                continue
            obj = self.resolve_in_module(module, expr)
            if isinstance(obj, ClassInfo):
                found.append(obj)
            else:
                complete = False
        return found, complete

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        """Package-internal linearisation (depth-first, left to right, first occurrence kept)."""
        if cls.qualname in self._mro_cache:
            return self._mro_cache[cls.qualname]
        order: list[ClassInfo] = []
        stack = [cls]
        seen: set[str] = set()
        while stack:
            current = stack.pop(0)
            if current.qualname in seen:
                continue
            seen.add(current.qualname)
            order.append(current)
            stack = self.bases(current)[0] + stack
        self._mro_cache[cls.qualname] = order
        return order

    def mro_complete(self, cls: ClassInfo) -> bool:
        return all(self.bases(c)[1] and not c.has_metaclass for c in self.mro(cls))

    def find_method(self, cls: ClassInfo, name: str, *, after: str | None = None):
        classes = self.mro(cls)
        if after is not None:
            names = [c.qualname for c in classes]
            classes = classes[names.index(after) + 1 :] if after in names else []
        for c in classes:
            if name in c.methods:
                return c.methods[name]
        return None

    def attr_type(self, cls: ClassInfo, attr: str) -> ClassInfo | None:
        """The class of ``instance.attr``: assigned attribute types, else a property's return
        annotation."""
        for c in self.mro(cls):
            if attr in c.attr_types:
                qual = c.attr_types[attr]
                return self.classes.get(qual) if qual else None
        prop = self.find_method(cls, attr)
        if prop is not None and prop.is_property and prop.node is not None:
            name = annotation_name(prop.node.returns)
            obj = self.resolve_in_module(self.modules[prop.module], name) if name else None
            return obj if isinstance(obj, ClassInfo) else None
        return None

    def constructor(self, cls: ClassInfo) -> FunctionInfo | None:
        """The ``__init__`` a call ``Cls(...)`` binds to (synthesised for plain dataclasses)."""
        init = self.find_method(cls, "__init__")
        if init is not None:
            return init
        if self.find_method(cls, "__new__") is not None or not self.mro_complete(cls):
            return None
        if any(c.is_dataclass for c in self.mro(cls)):
            return self._dataclass_init(cls)
        return FunctionInfo(
            qualname=f"{cls.qualname}.__init__",
            name="__init__",
            module=cls.module,
            path=cls.path,
            node=None,
            signature=Signature((Param("self", POSITIONAL_OR_KEYWORD),)),
            decorators=frozenset(),
            class_qualname=cls.qualname,
            lineno=cls.node.lineno,
        )

    def _dataclass_init(self, cls: ClassInfo) -> FunctionInfo | None:
        fields: dict[str, Param] = {}
        for c in reversed(self.mro(cls)):
            if not c.is_dataclass:
                continue
            dec = next(d for d in c.node.decorator_list if decorator_name(d) == "dataclass")
            kw_only = isinstance(dec, ast.Call) and any(
                k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in dec.keywords
            )
            for stmt in c.node.body:
                if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                    continue
                annotation = ast.unparse(stmt.annotation)
                if "ClassVar" in annotation:
                    continue
                if annotation.endswith("KW_ONLY"):
                    kw_only = True
                    continue
                default, has_default, init, field_kw_only = _field_default(stmt.value)
                if not init:
                    continue
                kind = KEYWORD_ONLY if kw_only or field_kw_only else POSITIONAL_OR_KEYWORD
                fields[stmt.target.id] = Param(
                    stmt.target.id, kind, default, annotation, has_default
                )
        params = [Param("self", POSITIONAL_OR_KEYWORD)]
        params += [p for p in fields.values() if p.kind == POSITIONAL_OR_KEYWORD]
        params += [p for p in fields.values() if p.kind == KEYWORD_ONLY]
        return FunctionInfo(
            qualname=f"{cls.qualname}.__init__",
            name="__init__",
            module=cls.module,
            path=cls.path,
            node=None,
            signature=Signature(tuple(params)),
            decorators=frozenset({"dataclass"}),
            class_qualname=cls.qualname,
            lineno=cls.node.lineno,
        )


def _field_default(value: ast.expr | None) -> tuple[str | None, bool, bool, bool]:
    """(default source, has default, is an ``__init__`` parameter, keyword-only) of a field."""
    if value is None:
        return None, False, True, False
    if not (isinstance(value, ast.Call) and decorator_name(value.func) == "field"):
        return ast.unparse(value), True, True, False
    flags = {
        k.arg: bool(k.value.value)
        for k in value.keywords
        if k.arg in ("init", "kw_only") and isinstance(k.value, ast.Constant)
    }
    init, kw_only = flags.get("init", True), flags.get("kw_only", False)
    for k in value.keywords:
        if k.arg == "default":
            return ast.unparse(k.value), True, init, kw_only
        if k.arg == "default_factory":
            return f"{ast.unparse(k.value)}()", True, init, kw_only
    return None, False, init, kw_only


def _class_methods(node: ast.ClassDef, module: ModuleInfo, cls: ClassInfo) -> None:
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            info = _function_info(stmt, module, cls.qualname, cls.qualname)
            if info.name in cls.methods and info.is_property:
                continue  # a property setter must not replace the getter's entry
            cls.methods[stmt.name] = info


def _record_attr(cls: ClassInfo, attr: str, qualname: str | None) -> None:
    if attr in cls.attr_types and cls.attr_types[attr] != qualname:
        cls.attr_types[attr] = None  # conflicting evidence: do not guess
    else:
        cls.attr_types[attr] = qualname


def _infer_attr_types(index: PackageIndex, module: ModuleInfo, cls: ClassInfo) -> None:
    def class_of(expr: ast.expr | None) -> str | None:
        name = annotation_name(expr)
        obj = index.resolve_in_module(module, name) if name else None
        return obj.qualname if isinstance(obj, ClassInfo) else None

    for stmt in cls.node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            qual = class_of(stmt.annotation)
            if qual:
                _record_attr(cls, stmt.target.id, qual)
    for method in cls.methods.values():
        if method.node is None or not method.node.args.args:
            continue
        self_name = method.node.args.args[0].arg
        annotated = {
            a.arg: class_of(a.annotation)
            for a in [*method.node.args.args, *method.node.args.kwonlyargs]
            if a.annotation is not None
        }
        for node in ast.walk(method.node):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
                qual = class_of(node.annotation)
                if _is_self_attr(node.target, self_name) and qual:
                    _record_attr(cls, node.target.attr, qual)
                    continue
            for target in targets:
                if not _is_self_attr(target, self_name):
                    continue
                qual = None
                if isinstance(value, ast.Call):
                    qual = class_of(value.func)
                elif isinstance(value, ast.Name):
                    qual = annotated.get(value.id)
                if qual:
                    _record_attr(cls, target.attr, qual)


def _is_self_attr(node: ast.expr, self_name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == self_name
    )


def _index_classes(module: ModuleInfo, body: list[ast.stmt], prefix: str, index: PackageIndex):
    for stmt in body:
        if isinstance(stmt, ast.ClassDef):
            qual = f"{prefix}.{stmt.name}"
            cls = ClassInfo(
                qualname=qual,
                name=stmt.name,
                module=module.name,
                path=module.path,
                node=stmt,
                base_exprs=[b for b in (dotted_name(x) for x in stmt.bases) if b is not None],
                decorators=frozenset(decorator_name(d) for d in stmt.decorator_list),
                has_metaclass=any(k.arg == "metaclass" for k in stmt.keywords),
            )
            if len(cls.base_exprs) != len(stmt.bases):
                cls.base_exprs.append("<unresolvable>")
            _class_methods(stmt, module, cls)
            index.classes[qual] = cls
            for method in cls.methods.values():
                index.functions[method.qualname] = method
            if prefix == module.name:
                module.classes[stmt.name] = cls
            _index_classes(module, stmt.body, qual, index)


def build_index(root: str | Path) -> PackageIndex:
    """Parse every ``.py`` file under the package directory ``root`` into a PackageIndex."""
    if not isinstance(root, (str, Path)):
        raise TypeError(f"root: expected str or Path, got {type(root).__name__}")
    root = Path(root).resolve()
    if not root.is_dir():
        raise ValueError(f"root: {root} is not a directory")
    index = PackageIndex(root)
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        name, is_package = _module_name(root, path)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError) as exc:
            index.parse_errors.append((path, str(exc)))
            continue
        module = ModuleInfo(name, path, tree, is_package)
        _collect_imports(module)
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                info = _function_info(stmt, module, name, None)
                module.functions[stmt.name] = info
                index.functions[info.qualname] = info
        _index_classes(module, tree.body, name, index)
        index.modules[name] = module
    for cls in index.classes.values():
        _infer_attr_types(index, index.modules[cls.module], cls)
    return index
