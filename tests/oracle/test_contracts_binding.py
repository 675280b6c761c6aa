"""The static binder against Python's own binder, and call resolution through every route.

The independent expectation for binding is ``inspect.signature(f).bind`` on the very function
compiled from the same source: for every signature shape below and every combination of
positional count and keyword subset, the static binder must report an error exactly when Python
raises ``TypeError``, and otherwise bind the same values to the same parameters. Resolution tests
plant one wrong keyword behind each way a call can reach a package function and require the
checker to report exactly that call (and nothing on the corrected twin). Standard library only.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from pathlib import Path

import pytest

from oracle.contracts import bind_call, check_package, signature_of

SIGNATURES = [
    "def f(a, b, c=3): return locals()",
    "def f(a, /, b, *, c, d=4): return locals()",
    "def f(a, b=2, /, c=3, *args, d, **kw): return locals()",
    "def f(*args, **kw): return locals()",
    "def f(a, *args, b=2): return locals()",
    "def f(a, /, **kw): return locals()",
    "def f(): return locals()",
    "def f(a, b, /): return locals()",
    "def f(*, a, b=2): return locals()",
]
KEYWORD_POOL = ["a", "b", "c", "d", "args", "z"]


def _compile(source: str):
    namespace: dict = {}
    exec(compile(source, "<sig>", "exec", dont_inherit=True), namespace)
    return namespace["f"], ast.parse(source).body[0]


def _call_source(n_positional: int, keywords: tuple[str, ...]) -> str:
    args = [str(10 + i) for i in range(n_positional)]
    args += [f"{k}={100 + i}" for i, k in enumerate(keywords)]
    return f"f({', '.join(args)})"


def _python_binding(fn, n_positional, keywords):
    """What CPython binds: the callee returns ``locals()`` (defaults included), or None."""
    positional = [10 + i for i in range(n_positional)]
    named = {k: 100 + i for i, k in enumerate(keywords)}
    try:
        actual = fn(*positional, **named)
    except TypeError:
        actual = None
    try:
        via_inspect = dict(inspect.signature(fn).bind(*positional, **named).arguments)
    except TypeError:
        via_inspect = None
    return actual, via_inspect


def _static_values(binding) -> dict:
    values = {name: ast.literal_eval(expr) for name, expr in binding.bound.items()}
    for p in binding.signature.params:
        if p.kind == "var_positional" and binding.extra_positional:
            values[p.name] = tuple(ast.literal_eval(e) for e in binding.extra_positional)
        if p.kind == "var_keyword" and binding.extra_keywords:
            values[p.name] = {k: ast.literal_eval(e) for k, e in binding.extra_keywords.items()}
    return values


@pytest.mark.parametrize("source", SIGNATURES)
def test_binding_matches_inspect_bind(source):
    fn, node = _compile(source)
    signature = signature_of(node)
    compared = errors = inspect_disagrees = 0
    for n_positional in range(5):
        for size in range(4):
            for keywords in itertools.combinations(KEYWORD_POOL, size):
                call = ast.parse(_call_source(n_positional, keywords), mode="eval").body
                binding = bind_call(signature, call)
                actual, via_inspect = _python_binding(fn, n_positional, keywords)
                context = f"{source} :: {ast.unparse(call)}"
                if actual is None:
                    assert binding.errors, f"Python raises TypeError, binder accepts: {context}"
                    assert via_inspect is None, context
                    errors += 1
                    continue
                assert binding.errors == [], context
                values = _static_values(binding)
                for param in binding.defaulted:
                    values[param.name] = ast.literal_eval(param.default)
                for param in signature.params:  # empty *args / **kw
                    values.setdefault(
                        param.name, {"var_positional": (), "var_keyword": {}}.get(param.kind)
                    )
                assert values == actual, context
                if via_inspect is not None:  # inspect omits defaults and empty varargs
                    assert {k: values[k] for k in via_inspect} == via_inspect, context
                else:
                    inspect_disagrees += 1
                compared += 1
    assert compared > 0 and errors > 0 or "*args, **kw" in source
    # inspect.Signature.bind rejects a positional-only name given as keyword even when **kw
    # would take it; CPython accepts it (binds it into **kw). Only that signature may disagree.
    assert inspect_disagrees == 0 or source.startswith("def f(a, b=2, /")


@pytest.mark.parametrize("source", SIGNATURES)
def test_signature_render_matches_inspect(source):
    fn, node = _compile(source)
    assert signature_of(node).render() == str(inspect.signature(fn))


def test_annotated_signature_render_matches_inspect():
    source = "def f(a: int, /, b: str = 'x', *rest: int, c: float = 1.5, **kw: bool): pass"
    fn, node = _compile(source)
    assert signature_of(node).render() == str(inspect.signature(fn))


def test_bound_method_skips_self_like_python():
    source = "class C:\n    def m(self, a, b=2, *, c):\n        pass\n"
    namespace: dict = {}
    exec(source, namespace)
    method = namespace["C"]().m
    node = ast.parse(source).body[0].body[0]
    signature = signature_of(node)
    for call_src, kwargs in [("f(1, c=3)", {"c": 3}), ("f(1, 2, 3)", {}), ("f(c=1)", {"c": 1})]:
        call = ast.parse(call_src, mode="eval").body
        positional = [ast.literal_eval(a) for a in call.args]
        try:
            expected = dict(inspect.signature(method).bind(*positional, **kwargs).arguments)
        except TypeError:
            expected = None
        binding = bind_call(signature, call, skip_first=True)
        if expected is None:
            assert binding.errors, call_src
        else:
            assert binding.errors == [] and _static_values(binding) == expected, call_src


def test_rule_ids_of_binding_errors():
    _, node = _compile("def f(a, /, b, *, c=1): pass")
    sig = signature_of(node)

    def rules(src):
        return [
            (e.rule, e.parameter) for e in bind_call(sig, ast.parse(src, mode="eval").body).errors
        ]

    assert rules("f(1, 2, 3)") == [("arity", None)]
    assert rules("f(1)") == [("arity", "b")]
    assert rules("f(1, 2, d=3)") == [("unknown-keyword", "d")]
    assert rules("f(1, 2, a=3)") == [("unknown-keyword", "a")]  # positional-only as keyword
    assert rules("f(1, 2, b=3)") == [("duplicate-binding", "b")]
    assert rules("f(1, b=2, b=3)") == [("duplicate-binding", "b")]


def test_unpacking_is_not_bound_statically():
    _, node = _compile("def f(a, b, c): pass")
    binding = bind_call(signature_of(node), ast.parse("f(1, *rest)", mode="eval").body)
    assert binding.unpacked and binding.errors == [] and set(binding.bound) == {"a"}
    binding = bind_call(signature_of(node), ast.parse("f(1, **kw)", mode="eval").body)
    assert binding.unpacked and binding.errors == []


def test_bind_call_rejects_wrong_types():
    with pytest.raises(TypeError, match="signature"):
        bind_call("def f(): pass", ast.parse("f()", mode="eval").body)
    _, node = _compile("def f(): pass")
    with pytest.raises(TypeError, match="call"):
        bind_call(signature_of(node), ast.parse("f", mode="eval").body)


# --- resolution: every route to a package function ------------------------------------------

_BASE = {
    "__init__.py": "from .lib import helper\n",
    "lib.py": """
        import dataclasses
        from .abi import shared_body


        def helper(x, *, scale=1):
            return x


        class Other:
            def __init__(self, size):
                self.size = size

            def m(self, x):
                return x

            def __call__(self, x):
                return x

            @staticmethod
            def static_m(x):
                return x

            @classmethod
            def make(cls, size):
                return cls(size)


        class Base:
            def run(self, x):
                return x


        @dataclasses.dataclass(frozen=True)
        class Bundle:
            tile_n: int
            tile_k: int = 32
        """,
    "abi.py": "def shared_body(fn):\n    return fn\n",
    "sub/__init__.py": "",
}

# Each route: (module source with {BAD} where the call's extra keyword goes, callee suffix).
ROUTES = {
    "same-module function": (
        "def helper2(x):\n    return x\n\ndef g():\n    helper2(1{BAD})\n",
        "helper2",
    ),
    "from-import": ("from .lib import helper\n\ndef g():\n    helper(1{BAD})\n", "lib.helper"),
    "import-as": ("import pkg.lib as L\n\ndef g():\n    L.helper(1{BAD})\n", "lib.helper"),
    "from-package-import-module": (
        "from . import lib\n\ndef g():\n    lib.helper(1{BAD})\n",
        "lib.helper",
    ),
    "re-export": ("from pkg import helper\n\ndef g():\n    helper(1{BAD})\n", "lib.helper"),
    "constructor": ("from .lib import Other\n\ndef g():\n    Other(3{BAD})\n", "Other.__init__"),
    "self-method": (
        "class K:\n    def a(self, x):\n        return x\n\n"
        "    def b(self):\n        self.a(1{BAD})\n",
        "K.a",
    ),
    "self-attr-method": (
        "from .lib import Other\n\nclass K:\n    def __init__(self):\n"
        "        self.o = Other(1)\n\n    def b(self):\n        self.o.m(1{BAD})\n",
        "Other.m",
    ),
    "typed-param-attr": (
        "from .lib import Other\n\nclass K:\n    def __init__(self, o: Other):\n"
        "        self.o = o\n\n    def b(self):\n        self.o.m(1{BAD})\n",
        "Other.m",
    ),
    "local-instance": (
        "from .lib import Other\n\ndef g():\n    v = Other(1)\n    v.m(1{BAD})\n",
        "Other.m",
    ),
    "annotated-param": ("from .lib import Other\n\ndef g(v: Other):\n    v.m(1{BAD})\n", "Other.m"),
    "call-instance": (
        "from .lib import Other\n\ndef g():\n    v = Other(1)\n    v(1{BAD})\n",
        "Other.__call__",
    ),
    "staticmethod": (
        "from .lib import Other\n\ndef g():\n    Other.static_m(1{BAD})\n",
        "Other.static_m",
    ),
    "classmethod-via-class": (
        "from .lib import Other\n\ndef g():\n    Other.make(1{BAD})\n",
        "Other.make",
    ),
    "cls-in-classmethod": (
        "class K:\n    def __init__(self, n):\n        self.n = n\n\n"
        "    @classmethod\n    def make(cls):\n        return cls(1{BAD})\n",
        "K.__init__",
    ),
    "super": (
        "from .lib import Base\n\nclass K(Base):\n    def run(self, x):\n"
        "        return super().run(x{BAD})\n",
        "Base.run",
    ),
    "inherited": (
        "from .lib import Base\n\nclass K(Base):\n    def go(self):\n        self.run(1{BAD})\n",
        "Base.run",
    ),
    "partial": (
        "import functools\nfrom .lib import helper\n\ndef g():\n"
        "    return functools.partial(helper{BAD})\n",
        "lib.helper",
    ),
    "from-functools-partial": (
        "from functools import partial\nfrom . import lib\n\ndef g():\n"
        "    return partial(lib.helper{BAD})\n",
        "lib.helper",
    ),
    "dataclass-constructor": (
        "from .lib import Bundle\n\ndef g():\n    Bundle(16{BAD})\n",
        "Bundle.__init__",
    ),
    "nested-def": (
        "def g():\n    def emit(a, b):\n        return a\n\n    emit(1, 2{BAD})\n",
        "g.emit",
    ),
    "nested-def-in-branch": (
        "def g(flag):\n    if flag:\n        def emit(a):\n            return a\n"
        "    else:\n        def emit(a):\n            return -a\n    emit(1{BAD})\n",
        "g.emit",
    ),
    "return-annotation": (
        "from .lib import Other\n\ndef make() -> Other:\n    return Other(1)\n"
        "\ndef g():\n    v = make()\n    v.m(1{BAD})\n",
        "Other.m",
    ),
    "optional-annotation": (
        "from .lib import Other\n\ndef g(v: 'Other | None'):\n    v.m(1{BAD})\n",
        "Other.m",
    ),
    "module-global-instance": (
        "from .lib import Other\n\n_OTHER = Other(1)\n\ndef g():\n    _OTHER.m(1{BAD})\n",
        "Other.m",
    ),
    "relative-level-2": (
        "from ..lib import helper\n\ndef g():\n    helper(1{BAD})\n",
        "lib.helper",
    ),
}


def _write_package(tmp_path: Path, route_source: str, route: str) -> Path:
    root = tmp_path / "pkg"
    for name, text in _BASE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text), encoding="utf-8")
    target = root / ("sub/user.py" if route == "relative-level-2" else "user.py")
    target.write_text(route_source, encoding="utf-8")
    return root


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_resolution_route_is_checked(tmp_path, route):
    template, callee = ROUTES[route]
    good = check_package(_write_package(tmp_path / "good", template.replace("{BAD}", ""), route))
    assert good.violations == [], [v.format() for v in good.violations]
    bad = check_package(
        _write_package(tmp_path / "bad", template.replace("{BAD}", ", bogus=7"), route)
    )
    assert [(v.rule, v.parameter, v.expression) for v in bad.violations] == [
        ("unknown-keyword", "bogus", "7")
    ]
    assert bad.violations[0].callee.endswith(callee)
    assert bad.violations[0].path.endswith("user.py")


def test_shadowed_local_name_is_not_resolved(tmp_path):
    source = "from .lib import helper\n\ndef g(helper):\n    helper(1, 2, 3)\n"
    report = check_package(_write_package(tmp_path, source, "shadow"))
    assert report.violations == []


def test_unpacking_is_info_for_plain_and_violation_for_shared_body(tmp_path):
    source = (
        "from .abi import shared_body\nfrom .lib import helper\n\n@shared_body\n"
        "def body(*, x, y):\n    return x\n\ndef g(args, kw):\n    helper(*args)\n"
        "    body(**kw)\n"
    )
    report = check_package(_write_package(tmp_path, source, "unpack"))
    assert [(v.rule, v.callee.rsplit(".", 1)[-1]) for v in report.infos] == [
        ("unverifiable", "helper")
    ]
    assert [(v.rule, v.expression) for v in report.violations] == [
        ("shared-body-unpacking", "**kw")
    ]


def test_shifted_argument_into_var_positional(tmp_path):
    source = "def f(a, *rest, scale=1):\n    return a\n\ndef g(a, scale):\n    f(a, scale)\n"
    report = check_package(_write_package(tmp_path, source, "star"))
    assert [(v.rule, v.parameter, v.expression) for v in report.violations] == [
        ("shifted-argument", "*rest", "scale")
    ]


DATACLASS_SOURCE = """
import dataclasses
from dataclasses import KW_ONLY, field
from typing import ClassVar


@dataclasses.dataclass
class Base:
    tile_n: int
    tile_k: int = 32
    tags: list = field(default_factory=list)


@dataclasses.dataclass
class Launch(Base):
    counter: ClassVar[int] = 0
    cache: dict = field(default_factory=dict, init=False)
    stream: int = field(default=0, kw_only=True)
    _: KW_ONLY
    codebook: str = "mcg"
    bits: int = 4
"""


def test_synthesised_dataclass_init_matches_python(tmp_path):
    namespace: dict = {}
    exec(compile(DATACLASS_SOURCE, "<dc>", "exec", dont_inherit=True), namespace)
    root = tmp_path / "dcpkg"
    root.mkdir()
    (root / "__init__.py").write_text("", encoding="utf-8")
    (root / "shapes.py").write_text(DATACLASS_SOURCE, encoding="utf-8")
    from oracle.contracts import build_index

    index = build_index(root)
    for name in ("Base", "Launch"):
        expected = [
            (p.name, p.kind.name.lower(), p.default is not inspect.Parameter.empty)
            for p in inspect.signature(namespace[name]).parameters.values()
        ]
        init = index.constructor(index.classes[f"dcpkg.shapes.{name}"])
        got = [(p.name, p.kind, p.has_default) for p in init.signature.without_first().params]
        assert got == expected, name


def test_property_return_annotation_types_attribute(tmp_path):
    source = (
        "from .lib import Other\n\nclass K:\n    @property\n    def other(self) -> Other:\n"
        "        return Other(1)\n\n    def b(self):\n        self.other.m(1, 2)\n"
    )
    report = check_package(_write_package(tmp_path, source, "prop"))
    assert [(v.rule, v.callee.rsplit(".", 2)[-2:]) for v in report.violations] == [
        ("arity", ["Other", "m"])
    ]


def test_shared_body_unbound_receiver_is_not_a_positional_slot(tmp_path):
    source = (
        "from .abi import shared_body\n\nclass D:\n    @shared_body\n"
        "    def body(self, *, x, y=None):\n        return x\n\n"
        "class E(D):\n    def run(self):\n        D.body(self, x=1, y=2)\n"
        "        D.body(self, 1, y=2)\n"
    )
    report = check_package(_write_package(tmp_path, source, "receiver"))
    assert [(v.rule, v.line, v.parameter, v.expression) for v in report.violations] == [
        ("arity", 11, None, "1"),  # too many positionals: `x` is keyword-only
        ("arity", 11, "x", None),  # so `x` is missing
        ("shared-body-positional", 11, None, "1"),
    ]


def test_ambiguous_nested_def_is_not_resolved(tmp_path):
    source = (
        "def g(flag):\n    if flag:\n        def emit(a):\n            return a\n"
        "    else:\n        def emit(a, b):\n            return b\n    emit(1, 2, 3)\n"
    )
    report = check_package(_write_package(tmp_path, source, "ambiguous"))
    assert report.violations == []  # either def may run: no guess, no false report


def test_shared_body_signature_infos(tmp_path):
    source = (
        "from .abi import shared_body\n\n@shared_body\ndef good(*, x, y):\n    return x\n\n"
        "@shared_body\ndef risky(x, *, y, hook=None):\n    return x\n"
    )
    report = check_package(_write_package(tmp_path, source, "sig"))
    assert report.violations == []
    infos = {(v.rule, v.callee.rsplit(".", 1)[-1], v.parameter) for v in report.infos}
    assert infos == {
        ("shared-body-signature", "risky", "x"),
        ("shared-body-signature", "risky", "hook"),
    }
