"""Signatures read from source, and binding of an ``ast.Call`` to them exactly as Python binds.

Layout
------
* :class:`Param` / :class:`Signature` describe a ``def`` as written: every parameter with its
  kind (the five kinds of :mod:`inspect`), its default and annotation as source text.
  :func:`signature_of` builds one from a ``def``, ``async def`` or ``lambda`` node.
* :func:`bind_call` binds a call's positional arguments and keywords to a signature and returns a
  :class:`Binding`: which argument expression landed in which parameter, what went to
  ``*args``/``**kwargs``, which parameters fell back to their defaults, and every binding error
  (``arity``, ``unknown-keyword``, ``duplicate-binding``) Python itself would raise.

Invariants
----------
* Pure ``ast`` work: nothing is imported or evaluated, so the binding is the same whatever the
  module would do at import time.
* The binding follows CPython's rules: positional arguments fill positional-only then
  positional-or-keyword parameters in order, the rest go to ``*args`` or are an arity error;
  keywords never bind positional-only parameters (they go to ``**kwargs`` if it exists);
  a parameter bound twice is a duplicate binding; a required parameter left unbound is an arity
  error. ``skip_first`` drops the implicit ``self``/``cls`` of a bound call.
* A call with ``*x`` or ``**y`` unpacking cannot be bound statically: :attr:`Binding.unpacked`
  is set, the arguments before the first ``*x`` are still bound, and no arity or missing-argument
  error is reported (the caller decides whether that is acceptable).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

POSITIONAL_ONLY = "positional_only"
POSITIONAL_OR_KEYWORD = "positional_or_keyword"
VAR_POSITIONAL = "var_positional"
KEYWORD_ONLY = "keyword_only"
VAR_KEYWORD = "var_keyword"

PARAM_KINDS = (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY, VAR_KEYWORD)


@dataclass(frozen=True)
class Param:
    """One parameter as written: name, kind, default and annotation as source (or ``None``)."""

    name: str
    kind: str
    default: str | None = None
    annotation: str | None = None
    has_default: bool = False

    def render(self) -> str:
        text = {VAR_POSITIONAL: "*", VAR_KEYWORD: "**"}.get(self.kind, "") + self.name
        if self.annotation is not None:
            text += f": {self.annotation}"
        if self.has_default:
            text += f" = {self.default}" if self.annotation is not None else f"={self.default}"
        return text

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "default": self.default if self.has_default else None,
            "annotation": self.annotation,
        }


@dataclass(frozen=True)
class Signature:
    """The ordered parameters of one callable."""

    params: tuple[Param, ...]

    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def get(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name and p.kind not in (VAR_POSITIONAL, VAR_KEYWORD):
                return p
        return None

    def without_first(self) -> Signature:
        """The signature seen through a bound call (``self``/``cls`` already supplied)."""
        if self.params and self.params[0].kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD):
            return Signature(self.params[1:])
        return self

    def render(self) -> str:
        parts: list[str] = []
        seen_kwonly_marker = False
        for i, p in enumerate(self.params):
            if p.kind == KEYWORD_ONLY and not seen_kwonly_marker:
                if not any(q.kind == VAR_POSITIONAL for q in self.params[:i]):
                    parts.append("*")
                seen_kwonly_marker = True
            if p.kind == VAR_POSITIONAL:
                seen_kwonly_marker = True
            parts.append(p.render())
            nxt = self.params[i + 1] if i + 1 < len(self.params) else None
            if p.kind == POSITIONAL_ONLY and (nxt is None or nxt.kind != POSITIONAL_ONLY):
                parts.append("/")
        return "(" + ", ".join(parts) + ")"


def _unparse(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def signature_of(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> Signature:
    """Build the :class:`Signature` of a ``def`` or ``lambda`` node."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        raise TypeError(f"node: expected a function definition, got {type(node).__name__}")
    a = node.args
    positional = [(arg, POSITIONAL_ONLY) for arg in a.posonlyargs]
    positional += [(arg, POSITIONAL_OR_KEYWORD) for arg in a.args]
    first_default = len(positional) - len(a.defaults)
    params: list[Param] = []
    for i, (arg, kind) in enumerate(positional):
        default = a.defaults[i - first_default] if i >= first_default else None
        params.append(
            Param(arg.arg, kind, _unparse(default), _unparse(arg.annotation), default is not None)
        )
    if a.vararg is not None:
        params.append(Param(a.vararg.arg, VAR_POSITIONAL, None, _unparse(a.vararg.annotation)))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(
            Param(
                arg.arg,
                KEYWORD_ONLY,
                _unparse(default),
                _unparse(arg.annotation),
                default is not None,
            )
        )
    if a.kwarg is not None:
        params.append(Param(a.kwarg.arg, VAR_KEYWORD, None, _unparse(a.kwarg.annotation)))
    return Signature(tuple(params))


@dataclass(frozen=True)
class BindError:
    """One binding error: rule id, the parameter concerned (if any), the argument expression."""

    rule: str
    parameter: str | None
    expression: str | None
    message: str


@dataclass
class Binding:
    """The result of binding one call to one signature.

    ``bound`` maps parameter name → argument expression node; ``positional`` maps parameter name
    → the index of the positional argument that filled it; ``extra_positional`` and
    ``extra_keywords`` are what went to ``*args``/``**kwargs``; ``defaulted`` lists the
    parameters that fell back to their defaults.
    """

    signature: Signature
    bound: dict[str, ast.expr] = field(default_factory=dict)
    positional: dict[str, int] = field(default_factory=dict)
    extra_positional: list[ast.expr] = field(default_factory=list)
    extra_keywords: dict[str, ast.expr] = field(default_factory=dict)
    defaulted: list[Param] = field(default_factory=list)
    errors: list[BindError] = field(default_factory=list)
    unpacked: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors


def bind_call(
    signature: Signature,
    call: ast.Call,
    *,
    skip_first: bool = False,
    partial: bool = False,
    extra_args: int = 0,
) -> Binding:
    """Bind ``call``'s arguments to ``signature`` like CPython.

    ``skip_first`` drops the first parameter (``self``/``cls`` of a bound call); ``partial`` binds
    like ``functools.partial`` (missing parameters are not an error); ``extra_args`` skips that
    many leading arguments of ``call`` (``functools.partial(f, ...)`` passes ``f`` first).
    """
    if not isinstance(signature, Signature):
        raise TypeError(f"signature: expected Signature, got {type(signature).__name__}")
    if not isinstance(call, ast.Call):
        raise TypeError(f"call: expected ast.Call, got {type(call).__name__}")
    sig = signature.without_first() if skip_first else signature
    result = Binding(sig)
    params = sig.params
    positional_params = [p for p in params if p.kind in (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD)]
    var_positional = next((p for p in params if p.kind == VAR_POSITIONAL), None)
    var_keyword = next((p for p in params if p.kind == VAR_KEYWORD), None)
    by_keyword = {p.name: p for p in params if p.kind in (POSITIONAL_OR_KEYWORD, KEYWORD_ONLY)}
    positional_only_names = {p.name for p in params if p.kind == POSITIONAL_ONLY}

    for index, arg in enumerate(call.args[extra_args:]):
        if isinstance(arg, ast.Starred):
            result.unpacked = True
            break
        if index < len(positional_params):
            name = positional_params[index].name
            result.bound[name] = arg
            result.positional[name] = index
        elif var_positional is not None:
            result.extra_positional.append(arg)
        else:
            result.errors.append(
                BindError(
                    "arity",
                    None,
                    ast.unparse(arg),
                    f"too many positional arguments: takes at most {len(positional_params)}, "
                    f"argument {index + 1} has no parameter",
                )
            )

    for kw in call.keywords:
        if kw.arg is None:
            result.unpacked = True
            continue
        name, value = kw.arg, kw.value
        param = by_keyword.get(name)
        if param is None:
            if var_keyword is not None:
                if name in result.extra_keywords:
                    result.errors.append(
                        BindError(
                            "duplicate-binding",
                            name,
                            ast.unparse(value),
                            f"keyword {name!r} given twice",
                        )
                    )
                result.extra_keywords[name] = value
            elif name in positional_only_names:
                result.errors.append(
                    BindError(
                        "unknown-keyword",
                        name,
                        ast.unparse(value),
                        f"positional-only parameter {name!r} passed as keyword",
                    )
                )
            else:
                result.errors.append(
                    BindError(
                        "unknown-keyword",
                        name,
                        ast.unparse(value),
                        f"unexpected keyword argument {name!r}",
                    )
                )
            continue
        if name in result.bound:
            how = "positionally" if name in result.positional else "by keyword"
            result.errors.append(
                BindError(
                    "duplicate-binding",
                    name,
                    ast.unparse(value),
                    f"parameter {name!r} already bound {how} "
                    f"to `{ast.unparse(result.bound[name])}`",
                )
            )
            continue
        result.bound[name] = value

    for p in params:
        if p.kind in (VAR_POSITIONAL, VAR_KEYWORD) or p.name in result.bound:
            continue
        if p.has_default:
            result.defaulted.append(p)
        elif not partial and not result.unpacked:
            result.errors.append(
                BindError("arity", p.name, None, f"missing required argument {p.name!r}")
            )
    return result
