"""The call-site rules of the ABI contract checker, and the violation record they produce.

Layout:
* :class:`Violation` is one finding: rule id, file, line, caller, callee, parameter, argument
  expression (``ast.unparse``) and a message. ``severity`` is ``"error"`` for violations and
  ``"info"`` for things that cannot be verified statically.
* :func:`check_call_site` applies every call rule to one resolved :class:`~.resolve.CallSite`:

  ``arity`` / ``unknown-keyword`` / ``duplicate-binding``, ``shifted-argument`` (a bare-name
  positional binding to a *different* parameter: spec §5.3), ``shared-body-positional`` /
  ``-default`` / ``-unpacking``, ``pinned-slot`` (:mod:`.slots`), and the infos
  ``shared-body-signature`` and ``unverifiable``. Each rule: docs/notes/oracle.md.
  Launch records are bound by :mod:`.entries` (same rules plus ``launch-record``).

Invariants:
* Rules read only the AST and the index; every violation names a file and line of the caller.
* A partial binding (``functools.partial``) is checked for too many positionals, unknown and
  duplicate keywords, shifts and shared-body positionals, never for missing arguments or
  reliance on defaults (the final call supplies those).
"""

from __future__ import annotations

import ast
import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path

from .binding import KEYWORD_ONLY, VAR_KEYWORD, VAR_POSITIONAL, Binding, bind_call
from .index import FunctionInfo
from .resolve import CallSite
from .slots import PinnedSlot, check_pinned_slots

SHARED_BODY = "shared_body"

CALL_RULES = (
    "arity",
    "unknown-keyword",
    "duplicate-binding",
    "shifted-argument",
    "shared-body-positional",
    "shared-body-default",
    "shared-body-unpacking",
    "pinned-slot",
    "shared-body-signature",
    "launch-record",
)


@dataclass(frozen=True)
class Violation:
    """One finding of the checker (``severity`` "error" or "info")."""

    rule: str
    path: str
    line: int
    caller: str
    callee: str
    parameter: str | None
    expression: str | None
    message: str
    severity: str = "error"

    def format(self, relative_to: Path | None = None) -> str:
        path = self.path
        if relative_to is not None:
            with contextlib.suppress(ValueError):
                path = str(Path(self.path).resolve().relative_to(relative_to.resolve()))
        parameter = self.parameter if self.parameter is not None else "-"
        expression = self.expression if self.expression is not None else "-"
        return (
            f"{path}:{self.line}: [{self.rule}] {self.caller} -> {self.callee}: "
            f"{parameter} <- {expression} ({self.message})"
        )

    def to_json(self) -> dict:
        return asdict(self)


def _violation(site: CallSite, rule: str, parameter, expression, message, severity="error"):
    return Violation(
        rule=rule,
        path=str(site.path),
        line=site.call.lineno,
        caller=site.caller,
        callee=site.callee.qualname if site.callee is not None else "?",
        parameter=parameter,
        expression=expression,
        message=message,
        severity=severity,
    )


def bind_site(site: CallSite) -> Binding:
    """Bind a resolved call site to its callee's signature."""
    if site.callee is None:
        raise ValueError("site: call site has no resolved callee")
    return bind_call(
        site.callee.signature,
        site.call,
        skip_first=site.skip_first,
        partial=site.partial,
        extra_args=1 if site.partial else 0,
    )


def _shifted(site: CallSite, binding: Binding) -> list[Violation]:
    sig = binding.signature
    names = {p.name for p in sig.params if p.kind not in (VAR_POSITIONAL, VAR_KEYWORD)}
    positional_args = site.call.args[1:] if site.partial else site.call.args
    bound_to: dict[int, str] = {index: name for name, index in binding.positional.items()}
    var_positional = next((p.name for p in sig.params if p.kind == VAR_POSITIONAL), None)
    found = []
    for index, arg in enumerate(positional_args):
        if isinstance(arg, ast.Starred):
            break
        if not isinstance(arg, ast.Name) or arg.id not in names:
            continue
        target = bound_to.get(index)
        if target == arg.id:
            continue
        where = (
            f"parameter {target!r}"
            if target
            else (f"*{var_positional}" if var_positional else "no parameter (arity)")
        )
        position = sig.names().index(arg.id)
        found.append(
            _violation(
                site,
                "shifted-argument",
                target or (f"*{var_positional}" if var_positional else None),
                arg.id,
                f"`{arg.id}` is argument {index + 1} and binds to {where}, but the callee's "
                f"parameter {arg.id!r} is at position {position + 1}",
            )
        )
    return found


def _shared_body(site: CallSite, binding: Binding) -> list[Violation]:
    found = []
    positional_args = site.call.args[1:] if site.partial else site.call.args
    callee = site.callee
    # An unbound `Class.body(obj, ...)` passes the receiver positionally: not an ABI slot.
    explicit_receiver = (
        callee.class_qualname is not None and not callee.is_staticmethod and not site.skip_first
    )
    for index, arg in enumerate(positional_args):
        if isinstance(arg, ast.Starred) or (index == 0 and explicit_receiver):
            continue
        target = next((n for n, i in binding.positional.items() if i == index), None)
        found.append(
            _violation(
                site,
                "shared-body-positional",
                target,
                ast.unparse(arg),
                f"argument {index + 1} is positional; a shared body binds every parameter by "
                "keyword",
            )
        )
    if binding.unpacked:
        found.append(
            _violation(
                site,
                "shared-body-unpacking",
                None,
                ", ".join(ast.unparse(a) for a in positional_args if isinstance(a, ast.Starred))
                or ", ".join(
                    f"**{ast.unparse(k.value)}" for k in site.call.keywords if k.arg is None
                ),
                "argument unpacking into a shared body cannot be checked; pass every parameter "
                "by keyword",
            )
        )
    elif not site.partial:
        for param in binding.defaulted:
            found.append(
                _violation(
                    site,
                    "shared-body-default",
                    param.name,
                    param.default,
                    f"relies on the default {param.name}={param.default}; a shared body call "
                    "passes every parameter explicitly",
                )
            )
    return found


def check_call_site(site: CallSite, slots: list[PinnedSlot] = ()) -> list[Violation]:
    """All violations (and ``unverifiable`` infos) of one resolved call site."""
    if site.callee is None:
        return []
    binding = bind_site(site)
    found = [_violation(site, e.rule, e.parameter, e.expression, e.message) for e in binding.errors]
    found += _shifted(site, binding)
    is_shared = SHARED_BODY in site.callee.decorators
    if is_shared:
        found += _shared_body(site, binding)
    elif binding.unpacked:
        found.append(
            _violation(
                site,
                "unverifiable",
                None,
                ast.unparse(site.call),
                "argument unpacking: binding not checked statically",
                severity="info",
            )
        )
    for parameter, expression, message in check_pinned_slots(site, binding, slots):
        found.append(_violation(site, "pinned-slot", parameter, expression, message))
    return found


def check_shared_body_definition(fn: FunctionInfo) -> list[Violation]:
    """``shared-body-signature`` infos for one ``@shared_body`` definition."""
    if SHARED_BODY not in fn.decorators:
        return []
    params = fn.signature.params
    if fn.class_qualname is not None and not fn.is_staticmethod:
        params = params[1:]  # the receiver
    found = []
    for p in params:
        problem = None
        if p.kind != KEYWORD_ONLY:
            problem = f"parameter {p.name!r} is {p.kind.replace('_', '-')}, not keyword-only"
        elif p.has_default:
            problem = f"parameter {p.name!r} has a default; a stale call could bind it silently"
        if problem is not None:
            found.append(
                Violation(
                    "shared-body-signature",
                    str(fn.path),
                    fn.lineno,
                    "<definition>",
                    fn.qualname,
                    p.name,
                    p.default,
                    f"{problem} (shared bodies take keyword-only parameters without defaults)",
                    severity="info",
                )
            )
    return found
