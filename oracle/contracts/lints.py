"""Static lints over b12x source that the mutation gate showed were missing (R9, R11).

:func:`lint_source` runs every rule over one module's text, :func:`lint_package` over every
``*.py`` under a package root (default: the installed ``b12x``, found without importing it); a
finding is a :class:`LintFinding`. ``python -m oracle.contracts.lints [ROOT]`` exits 1 on any.

Rules:
* ``int32-index-product`` (R9): an ``Int32(...)`` operand times a non-literal, or ``Int32(...)``
  around a product of non-literals, wraps past 2^31 (b12x ``d1d6b7e6``); form index × stride in
  ``Int64``. ``Uint32`` is exempt (hashes are modulo 2^32, shared-memory addresses 32-bit).
* ``widened-after-product`` (R9): ``Int64(a * b)`` with a runtime operand (not a literal, an
  UPPER_CASE constant or the kernel's ``self.…`` configuration) wrapped before it was widened;
  widen an operand: ``Int64(i) * stride``.
* ``bad-exemption``: ``# lint-ok RULE: why`` (on the line, or alone above it) exempts one finding
  whose bound the code cannot show (e.g. a plan-time check); one with no reason, or exempting
  nothing, is a finding.
* ``codebook-default`` (R11): a ``codebook``, ``*_codebook``, ``bits`` or ``fmt`` parameter with a
  default other than ``None``: an omitting call binds silently and a flipped default flips every
  caller (the seed's ``trellis_codebook="sqg_xor_cheb_t12"``).

Invariants: standard library only; source is parsed, never imported; a file that does not parse
is a ``parse-error`` finding, never a pass.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RULES", "LintFinding", "default_root", "lint_package", "lint_source", "main"]

RULES = (
    "int32-index-product",
    "widened-after-product",
    "codebook-default",
    "bad-exemption",
    "parse-error",
)
_NARROW = frozenset({"Int32"})
_WIDE = frozenset({"Int64"})
_EXPLICIT_PARAMS = frozenset({"codebook", "bits", "fmt"})


@dataclasses.dataclass(frozen=True)
class LintFinding:
    rule: str
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


def _call_of(node: ast.AST, names: frozenset[str]) -> bool:
    if not isinstance(node, ast.Call) or len(node.args) != 1:
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name in names


def _narrow_call(node: ast.AST) -> bool:
    return _call_of(node, _NARROW)


def _compile_time(node: ast.AST) -> bool:
    """A value fixed when the kernel is traced: a literal, a module constant (``UPPER_CASE``),
    the kernel object's configuration (``self.…``, also indexed), or arithmetic of those."""
    if _literal(node):
        return True
    if isinstance(node, ast.Name):
        return node.id.isupper()
    if isinstance(node, ast.Attribute):
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and root.id == "self"
    if isinstance(node, ast.Subscript):  # ``self.rates[0]``: configuration, indexed
        return _compile_time(node.value) and _compile_time(node.slice)
    if isinstance(node, ast.BinOp):
        return _compile_time(node.left) and _compile_time(node.right)
    return False


def _runtime_products(node: ast.AST) -> list[ast.BinOp]:
    """Products inside ``node`` (not inside a nested call) with a runtime operand."""
    if isinstance(node, ast.Call):
        return []
    found = []
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Mult) and not _compile_time(node):
            found.append(node)
        found += _runtime_products(node.left) + _runtime_products(node.right)
    return found


def _widened_after_product(tree: ast.AST, path: str) -> list[LintFinding]:
    """``Int64(a * b)`` with a runtime operand: the product is formed in the operands' 32 bits
    and wraps past 2^31 before it is widened (an offset into a buffer over 2 GiB)."""
    found = []
    for node in ast.walk(tree):
        if _call_of(node, _WIDE) and _runtime_products(node.args[0]):
            found.append(
                LintFinding(
                    "widened-after-product",
                    path,
                    node.lineno,
                    f"`{ast.unparse(node)}` multiplies runtime sizes in 32 bits, then widens; "
                    "widen an operand first (Int64(i) * stride)",
                )
            )
    return found


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float)


def _is_product(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and not _literal(node.left)
        and not _literal(node.right)
    )


def _int32_products(tree: ast.AST, path: str) -> list[LintFinding]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for narrow, other in ((node.left, node.right), (node.right, node.left)):
                if _narrow_call(narrow) and not _literal(other):
                    found.append(
                        LintFinding(
                            "int32-index-product",
                            path,
                            node.lineno,
                            f"`{ast.unparse(node)}` multiplies a 32-bit value by a non-literal; "
                            "form index x stride products in Int64",
                        )
                    )
                    break
        elif _narrow_call(node) and any(_is_product(n) for n in ast.walk(node.args[0])):
            found.append(
                LintFinding(
                    "int32-index-product",
                    path,
                    node.lineno,
                    f"`{ast.unparse(node)}` narrows a product to 32 bits; widen before multiplying",
                )
            )
    return found


def _explicit_param(name: str) -> bool:
    return name in _EXPLICIT_PARAMS or name.endswith("_codebook")


def _codebook_defaults(tree: ast.AST, path: str) -> list[LintFinding]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        positional = args.posonlyargs + args.args
        with_defaults = positional[len(positional) - len(args.defaults) :]
        pairs = list(zip(with_defaults, args.defaults, strict=True))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d]
        for arg, default in pairs:
            is_none = isinstance(default, ast.Constant) and default.value is None
            if _explicit_param(arg.arg) and not is_none:
                found.append(
                    LintFinding(
                        "codebook-default",
                        path,
                        arg.lineno,
                        f"{node.name}() gives `{arg.arg}` the default {ast.unparse(default)}; "
                        "codebook and rate must be passed explicitly",
                    )
                )
    return found


def lint_source(text: str, path: str = "<string>") -> list[LintFinding]:
    """Every rule over one module's source text."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        return [LintFinding("parse-error", path, exc.lineno or 0, f"does not parse: {exc.msg}")]
    found = (
        _int32_products(tree, path)
        + _widened_after_product(tree, path)
        + _codebook_defaults(tree, path)
    )
    return sorted(_apply_exemptions(text, path, found), key=lambda f: (f.path, f.line, f.rule))


_EXEMPTION = re.compile(r"#\s*lint-ok\s+(?P<rule>[a-z0-9-]+)\s*(?::\s*(?P<why>.*?))?\s*$")


def _apply_exemptions(text: str, path: str, found: list[LintFinding]) -> list[LintFinding]:
    """Drop the findings a ``# lint-ok RULE: why`` comment exempts: on the finding's line, or
    alone on the line above it. An exemption must give its reason and must exempt a finding of
    its rule; otherwise it is a finding itself (an exemption outlives the code it excused)."""
    exemptions = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = _EXEMPTION.search(line)
        if match:
            alone = line.lstrip().startswith("#")
            exemptions[number] = (match["rule"], match["why"] or "", alone)
    kept, used = [], set()
    for f in found:
        for number in (f.line, f.line - 1):
            rule, why, alone = exemptions.get(number, (None, "", False))
            if rule == f.rule and why and (number == f.line or alone):
                used.add(number)
                break
        else:
            kept.append(f)
    for number, (rule, why, _) in exemptions.items():
        if not why:
            problem = "gives no reason: write `# lint-ok RULE: why it cannot happen`"
        elif number not in used:
            problem = f"exempts no {rule} finding on this line or the next"
        else:
            continue
        kept.append(LintFinding("bad-exemption", path, number, f"`lint-ok {rule}` {problem}"))
    return kept


def default_root() -> Path:
    """The ``b12x`` package directory that would be imported (found without importing it)."""
    spec = importlib.util.find_spec("b12x")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("root: cannot locate the b12x package")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def lint_package(root: str | Path | None = None) -> list[LintFinding]:
    """Every rule over every module under ``root`` (default: :func:`default_root`)."""
    if root is not None and not isinstance(root, str | Path):
        raise TypeError(f"root: expected str or Path, got {type(root).__name__}")
    base = default_root() if root is None else Path(root)
    if not base.is_dir():
        raise ValueError(f"root: {base} is not a directory")
    found: list[LintFinding] = []
    for path in sorted(base.rglob("*.py")):
        found += lint_source(path.read_text(encoding="utf-8"), str(path))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1:
        print("usage: python -m oracle.contracts.lints [ROOT]", file=sys.stderr)
        return 2
    findings = lint_package(args[0] if args else None)
    for finding in findings:
        print(finding)
    print(f"{len(findings)} lint finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
