"""Formats as behaviour (issue 13): the frozen :class:`~b12x.formats.DecodeFormat` object, not its
name, crosses the APIs inside ``b12x``, and no code branches on a codebook or decoder name.

* An AST scan of every module of ``b12x`` finds no comparison (``==``, ``!=``, ``in``,
  ``not in``, ``is``) against a codebook name or a decoder-family name, no comparison on an
  expression named ``codebook``/``family``/``fmt.name`` (outside :data:`ALLOWED_NAME_COMPARES`,
  each justified there) and no read of a ``.family`` attribute.
* The format carries its behaviour: decoder body, LUT, host mirror and tile hints; a format
  built under a new name with an existing decoder behaves exactly like the registered one (the
  name decides nothing).
* Inner APIs receive format objects: ``KernelSpec`` holds the format (a name given to it is
  resolved once, at construction), the declared specialisations and the planners' specs carry
  the registry's object, and the MoE geometry is planned from the format's tile hint.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

from b12x import formats
from b12x.formats import FORMATS, DecodeFormat, Fp16HashDecoder, resolve_format

ROOT = Path(__file__).resolve().parents[2]
B12X = ROOT / "b12x"

#: Decoder-family names of the old string dispatch (``DecodeFormat.family``), kept here so that
#: a reintroduced family string is caught even though no format carries one any more.
FAMILY_NAMES = frozenset({"fp16_hash", "mul1", "sqg_t12", "sqg_d3l"})
FORBIDDEN = frozenset(FORMATS) | FAMILY_NAMES

#: ``(file, line text)`` of comparisons on a codebook *name* that are allowed, and why:
#: * ``moe/run.py`` / ``moe/pairs.py``: the launch checks that the caller's codebook is the one
#:   the grouped-GEMM spec was compiled for. ``MoeGemmSpec`` (``b12x/kernels/moe_gemm.py``)
#:   still keys on the registry name, so this is an equality of two registry keys (a consistency
#:   check that raises), not a choice of behaviour.
ALLOWED_NAME_COMPARES = {
    ("b12x/ops/moe/run.py", "if codebook != spec.codebook:"),
    ("b12x/ops/moe/pairs.py", "if codebook != spec.codebook:"),
}

_NAMEY = ("codebook", "family")


def _modules() -> list[Path]:
    return sorted(p for p in B12X.rglob("*.py") if "__pycache__" not in p.parts)


def _strings(node: ast.AST) -> set[str]:
    """String constants of a comparison operand (a constant or a literal container of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant)} - {None}
    return set()


def _is_namey(node: ast.AST) -> bool:
    """``codebook``, ``x.codebook``, ``family``, ``x.family`` or ``fmt.name``-like operands."""
    if isinstance(node, ast.Name):
        return node.id in _NAMEY
    if isinstance(node, ast.Attribute):
        if node.attr in _NAMEY:
            return True
        if node.attr == "name":
            base = node.value
            text = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
            return "fmt" in text or "format" in text
    if isinstance(node, ast.Subscript):  # case["codebook"]
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in _NAMEY
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # d.get("codebook")
        first = node.args[0] if node.args else None
        return node.func.attr == "get" and isinstance(first, ast.Constant) and first.value in _NAMEY
    return False


def scan(root: Path = B12X) -> list[str]:
    """Every forbidden comparison / attribute read under ``root`` as ``file:line: text``."""
    found = []
    for path in _modules() if root == B12X else sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        rel = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and node.attr == "family":
                found.append(f"{rel}:{node.lineno}: reads .family")
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            text = lines[node.lineno - 1].strip()
            named = set().union(*(_strings(o) for o in operands)) & FORBIDDEN
            if named:
                found.append(f"{rel}:{node.lineno}: compares with {sorted(named)}: {text}")
            elif any(_is_namey(o) for o in operands) and (rel, text) not in ALLOWED_NAME_COMPARES:
                found.append(f"{rel}:{node.lineno}: compares a codebook name: {text}")
    return found


def test_no_code_in_b12x_branches_on_a_codebook_or_family_name():
    assert scan() == []


def test_the_scan_catches_the_old_branches(tmp_path):
    pkg = tmp_path / "b12x"
    pkg.mkdir()
    (pkg / "planted.py").write_text(
        "def f(fmt, codebook, c):\n"
        "    if fmt.family == 'sqg_d3l':\n"
        "        return 1\n"
        "    if codebook != 'mcg':\n"
        "        return 2\n"
        "    if c['codebook'] in ('3inst', 'mul1'):\n"
        "        return 3\n"
        "    if fmt.name == other:\n"
        "        return 4\n"
        "    if problem.get('codebook', TIER) != TIER:\n"
        "        return 5\n"
    )
    found = scan(pkg)
    assert len(found) == 6, found  # the .family read, three constant compares, two name compares
    assert any("sqg_d3l" in f for f in found) and any("fmt.name == other" in f for f in found)


def test_allowed_name_compares_still_exist():
    """An allow-list entry whose line is gone must be removed (it would hide a new one)."""
    for rel, text in ALLOWED_NAME_COMPARES:
        assert text in (ROOT / rel).read_text(), (rel, text)


def test_trellis_decode_does_not_import_formats():
    """The decoder bodies take the decoder object; formats imports them lazily (no circle)."""
    tree = ast.parse((B12X / "kernels" / "trellis_decode.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "b12x.formats" not in imported


# ------------------------------------------------------------------ the format's behaviour


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_format_carries_lut_host_mirror_and_hints(name):
    fmt = FORMATS[name]
    assert resolve_format(name) is fmt and fmt.name == name
    lut = fmt.lut()
    assert len(lut) == fmt.lut_nbytes and fmt.reads_lut == bool(lut)
    assert lut == formats.lut_bytes(name)
    assert fmt.wide_tile_cap in (2, 4)
    bits = fmt.legal_bits[0]
    values = fmt.host_values(bits)
    assert values.dtype == np.float16 and values.shape == (65536,)
    assert not values.flags.writeable
    assert values is formats.host_state_values(name, bits)
    with pytest.raises(ValueError, match="bits"):
        fmt.host_values(99)


def test_the_name_decides_nothing():
    """A format under a new name with mcg's decoder constants decodes like mcg; its tile hint is
    the decoder's data, not its name."""
    mcg = FORMATS["mcg"]
    clone = DecodeFormat(
        name="not_a_registered_codebook",
        codebook_id=99,
        decoder=Fp16HashDecoder(multiplier=mcg.decoder.multiplier, wide_tile_cap=2),
        legal_bits=(4,),
    )
    assert np.array_equal(clone.host_values(4), mcg.host_values(4))
    assert clone.lut() == b"" and not clone.reads_lut
    from b12x.ops.moe.plan import gemm_geometry

    assert gemm_geometry(4, 3072, 1, wide_tile_cap=clone.wide_tile_cap) == (2, 4, 2)
    assert gemm_geometry(4, 3072, 1, wide_tile_cap=mcg.wide_tile_cap) == (4, 4, 2)


def test_device_decode_is_the_formats_own():
    """``decode_states_to_half2x4`` hands the work to the format object (no dispatch of its own)."""
    from b12x.kernels.trellis_decode import decode_states_to_half2x4

    calls = []

    class Probe:
        def device_decode(self, bits, states, lut_addr, *, lut_in_smem, to_bf16):
            calls.append((bits, tuple(states), lut_addr, lut_in_smem, to_bf16))
            return ["r0", "r1", "r2", "r3"]

    out = decode_states_to_half2x4(Probe(), 5, [1] * 8, 7, lut_in_smem=True, to_bf16=False)
    assert out == ["r0", "r1", "r2", "r3"]
    assert calls == [(5, (1,) * 8, 7, True, False)]
    for fmt in FORMATS.values():
        assert callable(fmt.decoder.device)


# ------------------------------------------------------------------ inner APIs take the object


def test_kernel_spec_holds_the_format_object():
    from b12x.kernels.geometry import GemmGeometry
    from b12x.launch.kinds import launch_key
    from b12x.launch.specs import KernelSpec

    fmt = FORMATS["sqg_fp16"]
    geometry = GemmGeometry()
    by_object = KernelSpec("gemm", fmt, 5, bf16=True, geometry=geometry)
    by_name = KernelSpec("gemm", "sqg_fp16", 5, bf16=True, geometry=geometry)  # resolved once
    assert by_object.fmt is fmt and by_name.fmt is fmt and by_object == by_name
    assert by_object.codebook == "sqg_fp16"
    assert "fmt" in {f for f, _ in launch_key(by_object, "sm_90").codegen}
    assert KernelSpec("reduce").fmt is None
    with pytest.raises(ValueError, match="codebook"):
        KernelSpec("gemm", "no_such_codebook", 4, geometry=geometry)


def test_declared_and_planned_specs_carry_registry_objects():
    from b12x import support
    from b12x.ops.decode.plan import plan_decode

    specs = [s for s in support.kernel_specializations() if s.kind in ("decode", "gemm")]
    assert specs and all(s.fmt is FORMATS[s.fmt.name] for s in specs)
    plan = plan_decode(k=128, n=128, bits=6, codebook="sqg_fp16")
    assert plan.problem.fmt is FORMATS["sqg_fp16"]
    assert [s.fmt for s in plan.kernel_specs] == [FORMATS["sqg_fp16"]]


def test_moe_planner_takes_the_format():
    import torch

    from b12x.ops.moe import plan as moe_plan

    params = inspect.signature(moe_plan.plan_gemm_spec).parameters
    assert "fmt" in params and "codebook" not in params
    spec = moe_plan.plan_gemm_spec(
        decisions=[], role="fc1[0]", fmt=FORMATS["sqg_fp16"], bits=5,
        compute_dtype=torch.float16, m_tiles=4, phase="fc1", choice=None, k=4096, n=3072,
    )  # fmt: skip
    assert spec.n_tiles == 2  # the D3L tile hint
    spec = moe_plan.plan_gemm_spec(
        decisions=[], role="fc1[0]", fmt=FORMATS["mcg"], bits=5,
        compute_dtype=torch.float16, m_tiles=4, phase="fc1", choice=None, k=4096, n=3072,
    )  # fmt: skip
    assert spec.n_tiles == 4
