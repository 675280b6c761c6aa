"""The kernel-kind registry (:mod:`b12x.launch.kinds`): it covers every kernel class, its key
sources are derived from imports, and it refuses what it does not know by name.

Expectations come from the source tree, not from the registry: the kernel classes are found by an
AST scan of ``b12x/kernels`` (a class is a kernel when its ``__call__`` carries ``@abi_entry`` or
one of its methods ``@cute.kernel``), and the modules a kernel module imports are read from its
own import statements. The registry is then checked against them; each check was shown to fail
on a planted fault (a kernel class dropped from or added to the registry, the closure replaced
by the builder module alone, an import planted in a copy of a kernel module, an unknown spec).
"""

from __future__ import annotations

import ast
import dataclasses
import shutil
from pathlib import Path

import pytest

from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.moe_boundary import MoeBoundarySpec
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch import kinds
from b12x.launch.specs import KERNEL_SPEC_KINDS, KernelSpec
from b12x.runtime import cache_keys
from b12x.runtime import compile_cache as cc

B12X = Path(kinds.__file__).resolve().parents[1]

#: One spec per kernel class the builders can make (both MoE GEMMs, all three boundaries).
SAMPLE_SPECS = (
    KernelSpec("decode", "mcg", 4),
    KernelSpec("gemm", "sqg_e4m3", 3, geometry=GemmGeometry(m_tiles=2, n_tiles=2)),
    KernelSpec(
        "gemm_stream_k",
        "mcg",
        4,
        geometry=GemmGeometry(
            m_tiles=1,
            n_tiles=2,
            warps=8,
            m_warps=8,
            shared_rows=4,
            smem_stages=4,
            wgmma=True,
            stream_k=True,
        ),
    ),  # fmt: skip
    KernelSpec("reduce", bf16=True),
    KernelSpec("rotate_in"),
    KernelSpec("rotate_out", out_bf16=True),
    MoeGemmSpec("mcg", 4, False, m_tiles=1, n_tiles=2, depth=8),
    MoeGemmSpec("mcg", 3, False, m_tiles=1, n_tiles=2, depth=8, pair="P44", rate_axis="k"),
    MoeBoundarySpec("rotate", False, False),
    MoeBoundarySpec("activate", False, True),
    MoeBoundarySpec("reduce", True, False, top_k=2),
    MoeBoundarySpec("pack", False, False),
)
SAMPLE_IDS = [f"{i}-{kinds.kind_of(spec).name}" for i, spec in enumerate(SAMPLE_SPECS)]


def _decorators(fn: ast.FunctionDef) -> set[str]:
    """The decorators as written (``abi_entry``, ``cute.jit``, ``cute.kernel``) and by last name."""
    written = {ast.unparse(d) for d in fn.decorator_list}
    return written | {name.rpartition(".")[2] for name in written}


def kernel_classes(kernels_dir: Path) -> set[str]:
    """Dotted names of the kernel classes under ``kernels_dir`` (a ``b12x/kernels`` tree): a class
    whose ``__call__`` is ``@abi_entry`` or that has a ``@cute.kernel`` method."""
    found = set()
    for path in sorted(kernels_dir.glob("*.py")):
        module = f"b12x.kernels.{path.stem}"
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef)]
            entry = any(m.name == "__call__" and "abi_entry" in _decorators(m) for m in methods)
            device = any("cute.kernel" in _decorators(m) for m in methods)
            if entry or device:
                found.add(f"{module}.{node.name}")
    return found


def owners(registry) -> dict[str, list[str]]:
    """Kernel class -> the kinds that declare they build it."""
    built: dict[str, list[str]] = {}
    for kind in registry.values():
        for kernel in kind.kernels:
            built.setdefault(kernel, []).append(kind.name)
    return built


def coverage_problems(scanned: set[str], registry) -> list[str]:
    """Every kernel class built by no kind or by several, and every declared class that is no
    kernel class of the tree."""
    built = owners(registry)
    problems = [f"{cls}: built by no kind" for cls in sorted(scanned - set(built))]
    problems += [f"{cls}: built by {names}" for cls, names in built.items() if len(names) > 1]
    problems += [f"{cls}: declared but not a kernel class" for cls in sorted(set(built) - scanned)]
    return problems


# ------------------------------------------------------------------------------ coverage


def test_the_scan_finds_the_kernel_classes():
    scanned = kernel_classes(B12X / "kernels")
    assert len(scanned) == 12  # 6 dense + 2 MoE GEMM + 3 boundary + packer: not vacuous
    assert "b12x.kernels.moe_pair_gemm.MoePairGemmKernel" in scanned
    assert not any(name.endswith(("Spec", "Bundle", "_SmemRing")) for name in scanned)


def test_every_kernel_class_is_built_by_exactly_one_kind():
    assert coverage_problems(kernel_classes(B12X / "kernels"), kinds.KINDS) == []


def test_a_kernel_class_planted_in_a_copy_is_reported_unbuilt(tmp_path):
    copy = tmp_path / "kernels"
    shutil.copytree(B12X / "kernels", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "planted.py").write_text(
        "import cutlass.cute as cute\n\n\nclass PlantedKernel:\n"
        "    @cute.kernel\n    def kernel(self):\n        pass\n"
    )
    assert coverage_problems(kernel_classes(copy), kinds.KINDS) == [
        "b12x.kernels.planted.PlantedKernel: built by no kind"
    ]


@pytest.mark.parametrize("spec", SAMPLE_SPECS, ids=SAMPLE_IDS)
def test_each_builder_makes_a_kernel_its_kind_declares(spec):
    kind = kinds.kind_of(spec)
    kernel, args = kind.build(spec)
    assert f"{type(kernel).__module__}.{type(kernel).__qualname__}" in kind.kernels
    assert isinstance(args, tuple) and args
    assert isinstance(spec, kind.spec_class)


def test_the_samples_reach_every_declared_kernel_class():
    made = set()
    for spec in SAMPLE_SPECS:
        kernel, _ = kinds.kind_of(spec).build(spec)
        made.add(f"{type(kernel).__module__}.{type(kernel).__qualname__}")
    assert made == set(owners(kinds.KINDS))


def test_kernel_spec_kinds_are_the_registry_kinds_of_kernel_spec():
    names = {k.name for k in kinds.KINDS.values() if k.spec_class is KernelSpec}
    assert names == set(KERNEL_SPEC_KINDS)
    assert set(kinds.KINDS) == names | {"moe_gemm", "moe_boundary"}


def test_check_registry_refuses_broken_registries():
    gemm, moe = kinds.KINDS["gemm"], kinds.KINDS["moe_gemm"]
    twice = dataclasses.replace(moe, kernels=(*moe.kernels, gemm.kernels[0]))
    cases = {
        "built by both gemm and moe_gemm": {"gemm": gemm, "moe_gemm": twice},
        "'alias' holds the kind named 'gemm'": {"alias": gemm},
        "is not in b12x.launch": {"gemm": dataclasses.replace(gemm, builder="b12x.ops.x.build")},
        "is not in b12x.kernels": {"gemm": dataclasses.replace(gemm, kernels=("b12x.abi.K",))},
        "names no kernel class": {"gemm": dataclasses.replace(gemm, kernels=())},
        "without one selector field": {
            "gemm": gemm,
            "x": dataclasses.replace(gemm, name="x", kernels=("b12x.kernels.x.X",), selector=None),
        },
    }
    for message, registry in cases.items():
        with pytest.raises(ValueError, match=message):
            kinds.check_registry(registry)


# ------------------------------------------------------------------------------ derived sources


def _direct_b12x_imports(module: str) -> set[str]:
    """b12x modules the file of ``module`` imports by name (``from b12x.kernels import ptx`` is
    ``b12x.kernels.ptx``), read from its own syntax tree."""
    path = B12X.joinpath(*module.split(".")[1:]).with_suffix(".py")
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("b12x"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found = (B12X.parent / sub.replace(".", "/")).with_suffix(".py").is_file()
                names.add(sub if found else node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("b12x"))
    return names


@pytest.mark.parametrize("name", sorted(kinds.KINDS))
def test_derived_sources_hold_the_kernel_modules_and_their_helpers(name):
    kind = kinds.KINDS[name]
    derived = set(kinds.derive_sources(kind))
    assert derived == set(kinds.sources(kind))
    assert {*kind.kernel_modules, kind.builder_module, "b12x.launch.toolchain"} <= derived
    for module in kind.kernel_modules:
        helpers = _direct_b12x_imports(module)
        assert helpers <= derived, (module, helpers - derived)
        for wanted in ("b12x.formats", "b12x.kernels.ptx"):
            if wanted in helpers:
                assert wanted in derived
    assert all(n == "b12x" or n.startswith("b12x.") for n in derived)


def test_the_kernel_modules_import_formats_and_ptx_where_expected():
    """The helper check above is not vacuous: the GEMMs import the formats, the boundary ptx."""
    assert "b12x.formats" in _direct_b12x_imports("b12x.kernels.moe_gemm")
    assert "b12x.kernels.ptx" in _direct_b12x_imports("b12x.kernels.moe_boundary")
    assert "b12x.formats" in kinds.sources(kinds.KINDS["gemm"])
    assert "b12x.kernels.moe_boundary" not in kinds.sources(kinds.KINDS["gemm"])


@pytest.mark.parametrize("spec", SAMPLE_SPECS[::3], ids=SAMPLE_IDS[::3])
def test_the_key_hashes_the_derived_sources_under_the_kind_name(spec):
    kind = kinds.kind_of(spec)
    key = kinds.launch_key(spec, "sm_90")
    assert key.kernel == kind.name
    assert key.source_hash == cc.source_hash(kinds.sources(kind))
    assert [name for name, _ in key.codegen] == sorted(f.name for f in dataclasses.fields(spec))


def test_an_import_planted_in_a_kernel_module_joins_the_closure_and_the_key(tmp_path, monkeypatch):
    """A copy of the tree gets a lazy ``b12x.support`` import in the boundary kernel module:
    the derived sources now hold it (and what it imports), so the key changes; an edit of a
    helper the kernel imports (ptx) changes the key too."""
    copy = tmp_path / "b12x"
    shutil.copytree(B12X, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_keys, "_B12X_DIR", copy)
    kind = kinds.KINDS["moe_boundary"]

    def key(sources):
        return cc.make_key(kind.name, {"top_k": 2}, arch="sm_90", modules=sources)

    before = kinds.derive_sources(kind)
    assert before == kinds.sources(kind)  # the copy derives what the tree does
    assert "b12x.support" not in before
    kernel_file = copy / "kernels" / "moe_boundary.py"
    text = kernel_file.read_text(encoding="utf-8")
    kernel_file.write_text(text + "\n\ndef _planted():\n    from b12x import support\n")
    after = kinds.derive_sources(kind)
    assert {"b12x.support", "b12x.ops"} <= set(after) and set(before) < set(after)
    assert key(after) != key(before)

    ptx = copy / "kernels" / "ptx.py"
    edited = key(before)
    ptx.write_text(ptx.read_text(encoding="utf-8") + "\n# edited\n")
    assert key(before) != edited  # same names, new bytes: a new source hash


# ------------------------------------------------------------------------------ refusals


def test_an_unknown_spec_type_is_refused_naming_spec():
    for bad in (object(), "gemm", ("gemm", "mcg", 4)):
        with pytest.raises(TypeError, match=r"^spec: expected one of .*KernelSpec"):
            kinds.kind_of(bad)
    with pytest.raises(TypeError, match="^spec: "):
        kinds.compiled(object(), "sm_90")
    with pytest.raises(TypeError, match="^spec: "):
        kinds.launch_key(object(), "sm_90")


def test_an_unknown_kind_of_a_known_spec_type_is_refused_naming_spec():
    spec = KernelSpec("reduce")
    object.__setattr__(spec, "kind", "conv")  # past KernelSpec's own check
    with pytest.raises(ValueError, match=r"^spec: KernelSpec.kind = 'conv' names no kind"):
        kinds.kind_of(spec)


def test_only_the_registry_calls_the_runtime_cache():
    """Every launch path resolves through :func:`b12x.launch.kinds.compiled`: no other b12x
    module calls ``compiled_kernel`` or ``get_or_compile``."""
    allowed = {B12X / "launch" / "kinds.py", B12X / "runtime" / "compile_cache.py"}
    callers = []
    for path in sorted(B12X.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func).rpartition(".")[2]
                if name in ("compiled_kernel", "get_or_compile") and path not in allowed:
                    callers.append(f"{path.relative_to(B12X.parent)}:{node.lineno}")
    assert callers == []
