"""Programmatic dependent launch (:mod:`b12x.kernels.dependent_launch`), checked on the CPU.

A kernel launched with the PDL attribute that touches memory before ``griddepcontrol.wait``
races its upstream grid, and no GPU test reliably sees that race. So the rule is checked where it
is decided: in the source (every kernel body starts with ``await_upstream()``, every launch
splices ``launch_options()``) and in the compiled PTX of one spec per kernel class (no global or
shared access and no barrier before the wait, on sm_90; neither instruction on sm_80; neither
with the switch off). Planted faults, each failing here: ``await_upstream()`` removed from the
MoE reduce kernel, moved below the first load of the rotate kernel, and ``**launch_options()``
dropped from the pack kernel's launch.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from b12x.kernels import dependent_launch
from b12x.kernels.geometry import GemmGeometry
from b12x.kernels.moe_boundary import MoeBoundarySpec
from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.launch import kinds
from b12x.launch.specs import KernelSpec
from b12x.runtime import disk_store
from b12x.support import compile_specialization

#: One spec per kernel class (every kind of the registry; both MoE GEMMs, all four boundaries).
SPECS = (
    KernelSpec("decode", "mcg", 4),
    KernelSpec(
        "gemm", "sqg_e4m3", 3, geometry=GemmGeometry(m_tiles=2, n_tiles=2), write_partials=True
    ),
    KernelSpec(
        "gemm_stream_k",
        "mcg",
        4,
        geometry=GemmGeometry(
            m_tiles=16,
            n_tiles=1,
            warps=8,
            m_warps=8,
            shared_rows=4,
            smem_stages=4,
            wgmma=True,
            swap_ab=True,
            cluster=2,
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
SPEC_IDS = [
    f"{kinds.kind_of(s).name}-{getattr(s, 'kind', None) or s.pair or 'grouped'}" for s in SPECS
]

KERNELS = Path(dependent_launch.__file__).resolve().parent
REPO = KERNELS.parents[1]
#: PTX that touches memory or synchronises a CTA (parameter loads are not in the list).
MEMORY_OPS = re.compile(r"\b(ld|st)\.(global|shared)|\bcp\.async|\batom\.|\bred\.|\bbar\.|wgmma")


def _decorated_kernel(fn: ast.FunctionDef) -> bool:
    return any(ast.unparse(d).rpartition(".")[2] == "kernel" for d in fn.decorator_list)


def _body_without_docstring(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


def _kernel_functions() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(KERNELS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _decorated_kernel(node):
                found.append((f"{path.stem}:{node.lineno}", node))
    return found


def _launch_calls() -> list[tuple[str, ast.Call]]:
    found = []
    for path in sorted(KERNELS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "launch"
            ):
                found.append((f"{path.stem}:{node.lineno}", node))
    return found


def test_every_kernel_body_awaits_upstream_first():
    kernels = _kernel_functions()
    assert len(kernels) >= 11, f"found only {len(kernels)} @cute.kernel bodies"
    wrong = []
    for where, fn in kernels:
        first = _body_without_docstring(fn)[0]
        if ast.unparse(first) != "await_upstream()":
            wrong.append(f"{where} starts with {ast.unparse(first)[:60]!r}")
    assert not wrong, "kernel bodies that do not start with await_upstream(): " + "; ".join(wrong)


def test_every_launch_splices_the_launch_options():
    launches = _launch_calls()
    assert len(launches) == len(_kernel_functions()), "one launch per kernel body expected"
    missing = [
        where
        for where, call in launches
        if not any(
            kw.arg is None and ast.unparse(kw.value) == "launch_options()" for kw in call.keywords
        )
    ]
    assert not missing, f"launches without **launch_options(): {missing}"


@pytest.mark.parametrize(
    ("major", "switch", "expected"),
    [(8, True, {}), (9, True, {"use_pdl": True}), (12, True, {"use_pdl": True}), (9, False, {})],
)
def test_the_attribute_follows_the_target_and_the_switch(monkeypatch, major, switch, expected):
    monkeypatch.setattr(dependent_launch, "_target_major", lambda: major)
    monkeypatch.setattr(dependent_launch, "_ENABLED", switch)
    assert dependent_launch.launch_options() == expected
    assert dependent_launch.active() is bool(expected)


def _entries(ptx: str) -> dict[str, str]:
    parts = re.split(r"\.entry\s+", ptx)[1:]
    assert parts, "no .entry in the PTX"
    return {part.split("(", 1)[0]: part for part in parts}


def test_the_specs_cover_every_kind():
    assert {kinds.kind_of(spec).name for spec in SPECS} == set(kinds.KINDS)


@pytest.mark.deep
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_no_memory_access_precedes_the_wait_on_sm90(spec):
    for name, body in _entries(compile_specialization(spec, "sm_90").ptx).items():
        wait = body.find("griddepcontrol.wait")
        trigger = body.find("griddepcontrol.launch_dependents")
        first = MEMORY_OPS.search(body)
        assert wait >= 0, f"{name}: no griddepcontrol.wait"
        assert trigger > wait, f"{name}: launch_dependents missing or before the wait"
        assert first is None or first.start() > wait, (
            f"{name}: {first.group(0)!r} precedes griddepcontrol.wait"
        )


@pytest.mark.deep
@pytest.mark.parametrize("spec", [SPECS[0], SPECS[5]], ids=["decode", "moe_gemm"])
def test_sm80_carries_neither_instruction(spec):
    assert "griddepcontrol" not in compile_specialization(spec, "sm_80").ptx


@pytest.mark.deep
def test_the_switch_turns_both_off_and_is_part_of_the_toolchain_record():
    assert dependent_launch.ENV in disk_store.CODEGEN_ENV
    code = (
        "from b12x.launch.specs import KernelSpec\n"
        "from b12x.runtime import disk_store\n"
        "from b12x.support import compile_specialization\n"
        "ptx = compile_specialization(KernelSpec('rotate_in'), 'sm_90').ptx\n"
        "print('griddepcontrol' in ptx, disk_store.toolchain()['codegen_env'])\n"
    )
    env = {**os.environ, dependent_launch.ENV: "0", "CUTE_DSL_ARCH": "sm_90"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False {'B12X_DEPENDENT_LAUNCH': '0'}"
