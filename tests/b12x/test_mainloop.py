"""The shared mainloop primitives (:mod:`b12x.kernels.mainloop`) and the GEMMs that compose them.

The dense, grouped-MoE and pair GEMMs build their lane setup, accumulators, A and payload
pointers, staged loads, decode-and-accumulate loop and epilogue from one module; no kernel
function stays over :data:`MAX_KERNEL_FUNCTION_LINES` lines; the pair kernel is composition
(no subclass of the grouped kernel); and one spec of each kernel still compiles on the CPU.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "b12x" / "kernels"
GEMM_MODULES = ("dense_gemm", "moe_gemm", "moe_pair_gemm")
MAX_KERNEL_FUNCTION_LINES = 80

#: The mainloop primitives each GEMM module must call (by name, imported from mainloop).
_SETUP = {"lane_coords", "zero_accumulators", "ring_word_pointers"}
_ROUTED = _SETUP | {
    "routed_a_pointers",
    "stage_rows",
    "tile_row_words",
    "accumulate_staged",
    "routed_epilogue",
}
EXPECTED_CALLS = {
    "dense_gemm": _SETUP | {"clamped_a_pointers"},
    "moe_gemm": _ROUTED,
    "moe_pair_gemm": _ROUTED | {"load_tile_words"},
}


def _tree(module: str) -> ast.Module:
    return ast.parse((KERNELS / f"{module}.py").read_text())


def _called_names(tree: ast.AST) -> set[str]:
    return {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }


def _mainloop_imports(tree: ast.Module) -> set[str]:
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "b12x.kernels.mainloop"
        for alias in node.names
    }


@pytest.mark.parametrize("module", GEMM_MODULES)
def test_each_gemm_composes_the_shared_primitives(module):
    tree = _tree(module)
    imported = _mainloop_imports(tree)
    expected = EXPECTED_CALLS[module]
    assert expected <= imported, f"{module} does not import {sorted(expected - imported)}"
    called = _called_names(tree)
    assert expected <= called, f"{module} does not call {sorted(expected - called)}"


def test_every_imported_primitive_exists_and_is_exported():
    mainloop = importlib.import_module("b12x.kernels.mainloop")
    for module in GEMM_MODULES:
        for name in _mainloop_imports(_tree(module)):
            assert name in mainloop.__all__, name
            assert callable(getattr(mainloop, name)), name


def test_mainloop_imports_no_kernel_module():
    """The GEMM modules import mainloop, so it must not import them (no import circle)."""
    imported = set()
    for node in ast.walk(_tree("mainloop")):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    gemms = {f"b12x.kernels.{m}" for m in GEMM_MODULES}
    assert not imported & gemms


@pytest.mark.parametrize("module", (*GEMM_MODULES, "mainloop"))
def test_no_kernel_function_exceeds_the_line_budget(module):
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.FunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_KERNEL_FUNCTION_LINES
    }
    assert not long, f"{module}: functions over {MAX_KERNEL_FUNCTION_LINES} lines: {long}"


def test_no_mainloop_setup_is_written_inline_again():
    """The lane split, accumulator zeroing and routed A gather live only in mainloop."""
    for module in GEMM_MODULES:
        source = (KERNELS / f"{module}.py").read_text()
        assert "tid % 32" not in source, module
        assert "make_rmem_tensor((self.m_tiles * self.n_tiles * 8,)" not in source, module
        assert "route_rows[row_base + mt * 16" not in source, module


def test_pair_kernel_is_composition_not_a_subclass():
    from b12x.kernels.moe_gemm import MoeGroupedGemmKernel
    from b12x.kernels.moe_pair_gemm import MoePairGemmKernel

    assert not issubclass(MoePairGemmKernel, MoeGroupedGemmKernel)
    (cls,) = [
        node
        for node in _tree("moe_pair_gemm").body
        if isinstance(node, ast.ClassDef) and node.name == "MoePairGemmKernel"
    ]
    assert cls.bases == []


def _compile_dense(arch: str) -> str:
    from b12x import support

    (spec,) = [
        s
        for s in support.representative_specializations()
        if s.kind == "gemm" and s.geometry.smem_stages == 0
    ][:1]
    return support.compile_specialization(spec, arch).ptx


def _compile_moe(pair: bool) -> str:
    from b12x.ops.moe.support import compile_moe_specialization, moe_kernel_specializations

    specs = [s for s in moe_kernel_specializations() if (s.pair is not None) == pair]
    return compile_moe_specialization(specs[0], "sm_90")


@pytest.mark.parametrize("which", ("dense", "grouped", "pair"))
def test_one_spec_of_each_gemm_compiles_on_the_cpu(which):
    ptx = _compile_dense("sm_90") if which == "dense" else _compile_moe(pair=which == "pair")
    assert ".entry" in ptx
    assert "mma.sync.aligned.m16n8k16" in ptx
