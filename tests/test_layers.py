"""The layer rule (architecture.md), enforced by import-linter (contracts in pyproject.toml), and no
import circles anywhere in the repository.

``reference`` imports neither ``b12x`` nor ``oracle``; ``b12x`` imports neither ``reference`` nor
``oracle``. Inside ``b12x``: ``b12x.kernels`` (device code) imports none of ``b12x.launch``,
``b12x.ops``, ``b12x.runtime``, ``b12x.support``; ``b12x.runtime`` none of ``b12x.kernels``,
``b12x.launch``, ``b12x.ops`` (one declared exception: ``b12x.formats`` tracing its decoders'
device bodies); ``b12x.launch`` no ``b12x.ops``. ``oracle``'s rooms are layers, top to
bottom ``__main__``; ``cli | pytest_plugin``; ``checks | mutate``; ``run``; ``report``; ``cases``;
``judge | contracts``; ``arguments`` (``|``: independent of each other), and every module of
``oracle`` is in one (``exhaustive``). import-linter counts every import statement,
lazy ones inside functions included (grimp reads the whole syntax tree). Planting tests put
violations, lazy ones, in a copy of the tree to prove the linter run here would catch them (a
contract test that cannot fail protects nothing).

No circles: the import graph of the repository (``reference``, ``b12x``, ``oracle``, ``tests`` as
packages; ``benchmarks/`` and ``scripts/`` as the flat script directories they run as) is built
from the source with :mod:`ast` and must be acyclic. Every ``import`` / ``from ... import``
statement anywhere in a module counts as an edge, the lazy ones inside functions
(and under ``if TYPE_CHECKING:``) included: a lazy import that
closes a loop still leaves a circle a reader has to untangle, it only moves the failure from
import time to call time. Relative imports are resolved against the importing module's package,
and ``from pkg import name`` is an edge to the module ``pkg.name`` when that is a module of the
package, else to ``pkg`` itself (``import a.b.c`` is an edge to the longest prefix that is a
module). Only statements count: the implicit import of a module's parent packages is not an edge
(every ``__init__`` that re-exports a submodule would otherwise close a loop with it), and
neither is ``importlib.import_module``. On failure the message prints every circle as a path of
``module (file:line)`` steps. The finder is unit-tested on synthetic graphs and on a planted
circle (a scratch package, a copy of ``b12x`` with the old ``compile_cache`` ⇄ ``specs``
edge put back, now ``compile_cache`` ⇄ ``toolchain``, a copy of ``oracle`` with three of its old
circles put back, and two benchmark scripts importing each other), so the check is known to fail
when it should.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: ``{importer: {imported: first line of the statement}}``, modules of one package only.
Graph = Mapping[str, Mapping[str, int]]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


#: The contracts inside b12x (their names in pyproject.toml) and, for each, a lazy import planted
#: in a function of a copy of the tree that breaks it and no other.
B12X_CONTRACTS = {
    "b12x.kernels is device code: no launch, ops, runtime, support": (
        "kernels/ptx.py",
        "from b12x.support import op_contract",
    ),
    "b12x.runtime knows no kernel, launch or op": (
        "runtime/scratch.py",
        "from b12x.kernels import ptx",
    ),
    "b12x.launch builds and launches kernels: no ops": (
        "launch/records.py",
        "from b12x.ops.dense import split_k",
    ),
}


#: The rooms contract of oracle, and for each plant a lazy upward (or sideways) import in a
#: function of a copy of the tree: the edges that closed three of oracle's old import circles, and
#: one between the independent rooms checks and mutate.
ORACLE_ROOMS = "oracle's rooms import only the rooms below them"
ORACLE_PLANTS = {
    "judge/tolerance.py": ("from oracle.cases import variants", "oracle.judge", "oracle.cases"),
    "report/results.py": (
        "from oracle.run.runners import saved_inputs",
        "oracle.report",
        "oracle.run",
    ),
    "run/sharding.py": ("from oracle.checks import gpu", "oracle.run", "oracle.checks"),
    "checks/gpu.py": ("from oracle.mutate import runner", "oracle.checks", "oracle.mutate"),
}


def _plant(path: Path, statement: str) -> None:
    """Append a function whose body is ``statement`` (a lazy import) to the module at ``path``."""
    text = path.read_text(encoding="utf-8")
    path.write_text(f"{text}\n\ndef _planted():\n    {statement}\n", encoding="utf-8")


def _copy_tree(tmp_path: Path) -> Path:
    for name in ("reference", "b12x", "oracle"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_layer_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 kept, 0 broken" in result.stdout
    for name in (*B12X_CONTRACTS, ORACLE_ROOMS):
        assert f"{name} KEPT" in result.stdout, name


def test_layer_contract_catches_b12x_importing_reference(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    (root / "b12x" / "_planted_violation.py").write_text("import reference.trellis\n")
    result = _lint_imports(root)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout


def test_b12x_layer_contracts_catch_planted_lazy_imports(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    for module, statement in B12X_CONTRACTS.values():
        _plant(root / "b12x" / module, statement)
    result = _lint_imports(root)
    assert result.returncode != 0
    assert "3 kept, 3 broken" in result.stdout, result.stdout
    for name, (module, _) in B12X_CONTRACTS.items():
        assert f"{name} BROKEN" in result.stdout, name
        planted = "b12x." + module.removesuffix(".py").replace("/", ".")
        assert f"-   {planted} -> " in result.stdout, planted


def test_oracle_rooms_catch_planted_lazy_imports(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    for module, (statement, _, _) in ORACLE_PLANTS.items():
        _plant(root / "oracle" / module, statement)
    result = _lint_imports(root)
    assert result.returncode != 0
    assert "5 kept, 1 broken" in result.stdout, result.stdout
    assert f"{ORACLE_ROOMS} BROKEN" in result.stdout
    for module, (statement, room, target) in ORACLE_PLANTS.items():
        assert f"{room} is not allowed to import {target}" in result.stdout, module
        planted = "oracle." + module.removesuffix(".py").replace("/", ".")
        assert f"- {planted} -> {statement.split()[1]}" in result.stdout, planted


def test_oracle_rooms_are_exhaustive(tmp_path: Path) -> None:
    """A new module beside the rooms (the flat layout coming back) breaks the contract."""
    root = _copy_tree(tmp_path)
    (root / "oracle" / "helpers.py").write_text("VALUE = 1\n", encoding="utf-8")
    result = _lint_imports(root)
    assert result.returncode != 0
    assert "oracle.helpers" in result.stdout + result.stderr


# ------------------------------------------------------------------------------ import circles


def _modules(package_dir: Path, base: Path | None = None) -> dict[str, tuple[Path, bool]]:
    """Every module under ``package_dir``: dotted name (relative to ``base``, by default the
    package's parent) -> (file, is package)."""
    base = package_dir.parent if base is None else base
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _longest_module(name: str, modules: Mapping[str, object]) -> str | None:
    """``name`` or its longest dotted prefix that is a module of the package, else None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules) -> list:
    """The package modules one import statement of ``module`` names."""
    if isinstance(node, ast.Import):
        return [_longest_module(alias.name, modules) for alias in node.names]
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    targets = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}" if base else alias.name
        targets.append(submodule if submodule in modules else _longest_module(base, modules))
    return targets


def import_graph(package_dir: Path) -> dict[str, dict[str, int]]:
    """The import graph of the package at ``package_dir``: every import statement of every module
    (module level, functions, classes, conditionals), as edges between the package's modules."""
    return _graph(_modules(package_dir))


def repository_modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Every module of the repository at ``root``, named as it is imported: the packages
    ``reference``, ``b12x``, ``oracle``, ``tests`` and the root ``conftest``; the scripts of
    ``benchmarks/`` and ``scripts/`` by file name (each runs with its directory on ``sys.path``)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for name in ("reference", "b12x", "oracle", "tests"):
        modules.update(_modules(root / name))
    for name in ("benchmarks", "scripts"):
        modules.update(_modules(root / name, base=root / name))
    if (root / "conftest.py").exists():
        modules["conftest"] = (root / "conftest.py", False)
    return modules


def _graph(modules: Mapping[str, tuple[Path, bool]]) -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {}
    for module, (path, is_package) in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _imported(node, module, is_package, modules):
                if target is not None and target != module:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[module] = edges
    return graph


def find_cycles(graph: Graph) -> list[list[str]]:
    """One circle per strongly connected component of ``graph`` that has one, as a closed path
    ``[a, b, ..., a]``: the shortest circle through the component's first module (sorted).
    Deterministic; ``[]`` for an acyclic graph. A self-edge ``a -> a`` is the circle ``[a, a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    nodes = sorted(set(graph) | {t for edges in graph.values() for t in edges})

    def successors(node: str) -> list[str]:
        return sorted(graph.get(node, {}))

    for root in nodes:  # iterative Tarjan: no recursion limit on long import chains
        if root in index:
            continue
        work = [(root, iter(successors(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(successors(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, {}):
                    components.append(component)

    cycles = []
    for component in sorted(components, key=min):
        start = min(component)
        previous: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in previous:  # BFS inside the component back to start
            following = []
            for node in frontier:
                for child in successors(node):
                    if child in component and child not in previous:
                        previous[child] = node
                        following.append(child)
            frontier = following
        path = [start]
        node = previous[start]
        while node != start:
            path.append(node)
            node = previous[node]
        path.append(start)
        cycles.append(path[::-1])
    return cycles


def describe_cycles(
    cycles: list[list[str]], graph: Graph, package_dir: Path, modules: Mapping | None = None
) -> str:
    """Each circle as ``a (a.py:line) -> b (b.py:line) -> ... -> a``: the line of the import
    (``modules``: the graph's modules, by default those of the package at ``package_dir``; file
    paths are shown relative to ``package_dir``'s parent)."""
    modules = _modules(package_dir) if modules is None else modules
    lines = []
    for cycle in cycles:
        steps = []
        for here, there in zip(cycle, cycle[1:], strict=False):
            path = modules[here][0].relative_to(package_dir.parent) if here in modules else here
            steps.append(f"{here} ({path}:{graph[here][there]})")
        lines.append(" -> ".join([*steps, cycle[-1]]))
    return f"{len(cycles)} import circle(s):\n  " + "\n  ".join(lines)


def test_repository_has_no_import_circles() -> None:
    modules = repository_modules()
    graph = _graph(modules)
    # the graph is real: lazy imports are edges (b12x.ops.moe.support imports b12x.support inside a
    # function; oracle.cli imports oracle.run.sharding inside one), edges cross packages, and the
    # benchmark scripts and the tests' helpers resolve by the names they are imported under
    assert len(graph) > 250 and "b12x.support" in graph["b12x.ops.moe.support"]
    assert "b12x.runtime.compile_cache" in graph["b12x.launch.toolchain"]
    assert "oracle.run.sharding" in graph["oracle.cli"]
    assert "reference.trellis" in graph["oracle.run.runners.dense"]
    assert "bench_timing" in graph["dense_trellis"]
    assert "tests.benchmarks.conftest" in graph["tests.benchmarks.test_bench_cli"]
    cycles = find_cycles(graph)
    assert cycles == [], describe_cycles(cycles, graph, ROOT / "oracle", modules)


def test_cycle_finder_on_synthetic_graphs() -> None:
    assert find_cycles({}) == []
    assert find_cycles({"a": {"b": 1, "c": 2}, "b": {"c": 3}, "c": {}}) == []  # a diamond
    assert find_cycles({"a": {"b": 1}, "b": {"a": 2}}) == [["a", "b", "a"]]
    assert find_cycles({"a": {"a": 1}}) == [["a", "a"]]
    # a tail into a three-circle, plus a separate two-circle: one path per component
    graph = {
        "tail": {"x": 1},
        "x": {"y": 1},
        "y": {"z": 1},
        "z": {"x": 1, "end": 2},
        "p": {"q": 1},
        "q": {"p": 1},
    }
    assert find_cycles(graph) == [["p", "q", "p"], ["x", "y", "z", "x"]]
    # the shortest circle through the first module, not the first one a DFS happens to close
    graph = {"a": {"b": 1, "d": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}
    assert find_cycles(graph) == [["a", "d", "a"]]
    # a long chain closing on itself: no recursion limit
    chain = {f"m{i:05d}": {f"m{i + 1:05d}": 1} for i in range(5000)}
    chain["m05000"] = {"m00000": 1}
    (long_cycle,) = find_cycles(chain)
    assert len(long_cycle) == 5002 and long_cycle[0] == long_cycle[-1] == "m00000"


def test_import_graph_catches_a_planted_circle(tmp_path: Path) -> None:
    """Every import form resolves, and a circle closed only by a lazy relative import is found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .deep import VALUE\n")
    (pkg / "sub" / "deep.py").write_text("VALUE = 1\n")
    (pkg / "a.py").write_text("import os\nfrom pkg.b import helper\nimport pkg.sub.deep as d\n")
    (pkg / "b.py").write_text(
        "from . import c\nfrom .sub import VALUE\n\n\ndef helper():\n    from . import a\n"
    )
    (pkg / "c.py").write_text("from __future__ import annotations\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b": 2, "pkg.sub.deep": 3}
    assert graph["pkg.b"] == {"pkg.c": 1, "pkg.sub": 2, "pkg.a": 6}
    assert graph["pkg.sub"] == {"pkg.sub.deep": 1}
    cycles = find_cycles(graph)
    assert cycles == [["pkg.a", "pkg.b", "pkg.a"]]
    message = describe_cycles(cycles, graph, pkg)
    assert "pkg.a (pkg/a.py:2) -> pkg.b (pkg/b.py:6) -> pkg.a" in message

    # the real tree with one of the circles this check was written for put back (lazily)
    copy = tmp_path / "copy" / "b12x"
    shutil.copytree(ROOT / "b12x", copy, ignore=shutil.ignore_patterns("__pycache__"))
    cache = copy / "runtime" / "compile_cache.py"
    cache.write_text(
        cache.read_text(encoding="utf-8")
        + "\n\ndef _planted():\n    from b12x.launch.toolchain import compile_options\n",
        encoding="utf-8",
    )
    planted = find_cycles(import_graph(copy))
    assert planted == [
        ["b12x.launch.toolchain", "b12x.runtime.compile_cache", "b12x.launch.toolchain"]
    ]

    # oracle with three of its old circles put back, each closed by a lazy import
    copy = tmp_path / "repo"
    _copy_tree(copy)
    for module, statement in (
        ("cases/sampling.py", "from oracle.cases.grids import parse_case_id"),  # grids <-> sampling
        ("cases/declared.py", "from oracle.cases.variants import Variant"),  # declared <-> variants
        ("report/results.py", "from oracle.run.runners import saved_inputs"),  # the results ring
    ):
        _plant(copy / "oracle" / module, statement)
    found = find_cycles(_graph(_modules(copy / "oracle")))
    assert found == [
        ["oracle.cases.declared", "oracle.cases.variants", "oracle.cases.declared"],
        ["oracle.cases.grids", "oracle.cases.sampling", "oracle.cases.grids"],
        [
            "oracle.report.report",
            "oracle.report.results",
            "oracle.run.runners",
            "oracle.report.report",
        ],
    ], found

    # the repository-wide graph: a circle between two benchmark scripts (flat names) is found too
    shutil.copytree(
        ROOT / "benchmarks", copy / "benchmarks", ignore=shutil.ignore_patterns("__pycache__")
    )
    _plant(copy / "benchmarks" / "bench_cli.py", "from dense_trellis import auto_split")
    found = find_cycles(_graph(repository_modules(copy)))
    assert ["bench_cli", "dense_trellis", "bench_cli"] in found, found
