"""CPU: the MoE kernels compile for sm_90, and the contract checker guards the tier launcher.

The contract fixture reproduces the two seed situations (spec §5.3, R1/R11) against a copy of
THIS package: the tier launcher's call into the shared body ``launch_grouped_gemm`` made stale
(positional, in an older parameter order without ``codebook``), and the explicit ``"mcg"``
removed or replaced. The checker, run with the real ``fixtures/pinned_slots.json``, must flag
each at the mutated line; the unmutated copy must be clean.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
from pathlib import Path

import pytest

from b12x.kernels.moe_gemm import MoeGemmSpec
from b12x.ops.moe.support import (
    compile_moe_specialization,
    moe_kernel_specializations,
    supported_moe_variants,
)
from oracle.contracts import DEFAULT_SLOTS_PATH, check_package, default_root
from oracle.pytest_plugin import slow_sweep

TIER_FILE = Path("ops") / "moe" / "run.py"  # the tier stage (tier_gemm_stage) launches from run
FC2_CALL = """            launch_grouped_gemm(
                spec=bound.plan.fc2_spec[tier],
                codebook="mcg",
                ctx=ctx,
                tier=tier,
                a=a2,
                payload=inputs.w2[tier],
                num_payload_experts=e,
                out=fc2,
                expert_base=0,
                out_col=0,
            )"""
# The same launch as a stale call site would write it: positional, no codebook slot.
STALE_FC2_CALL = """            launch_grouped_gemm(
                bound.plan.fc2_spec[tier], ctx, tier, a2, inputs.w2[tier], e, fc2, 0, 0
            )"""
FC1_CODEBOOK = """                spec=bound.plan.fc1_spec[tier],
                codebook="mcg","""


@functools.cache
def _real_tier_source() -> str:
    return (default_root() / TIER_FILE).read_text(encoding="utf-8")


def _copy(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    """A copy of b12x with one edit in the tier stage's file; returns (root, first edited line)."""
    root = tmp_path / "b12x"
    shutil.copytree(default_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    source = _real_tier_source()
    assert source.count(old) == 1, f"the fixture no longer matches b12x/{TIER_FILE}"
    (root / TIER_FILE).write_text(source.replace(old, new), encoding="utf-8")
    return root, source[: source.index(old)].count("\n") + 1


def _tier_violations(root: Path) -> list:
    report = check_package(root, slots_path=DEFAULT_SLOTS_PATH)
    return [v for v in report.violations if Path(v.path).name == TIER_FILE.name]


def test_unmutated_copy_is_clean(tmp_path):
    root, _ = _copy(tmp_path, FC2_CALL, FC2_CALL)
    report = check_package(root, slots_path=DEFAULT_SLOTS_PATH)
    moe = [v for v in report.violations if "moe" in Path(v.path).parts or "moe_gemm" in v.path]
    assert moe == [], [v.message for v in moe]
    assert report.counts["pinned_slots"] >= 3


def test_stale_positional_call_is_caught(tmp_path):
    root, line = _copy(tmp_path, FC2_CALL, STALE_FC2_CALL)
    found = [v for v in _tier_violations(root) if line <= v.line <= line + 2]
    rules = {v.rule for v in found}
    assert "shared-body-positional" in rules, [(v.rule, v.message) for v in found]
    assert "arity" in rules  # keyword-only parameters cannot take positionals


def test_missing_codebook_is_caught(tmp_path):
    root, line = _copy(tmp_path, FC1_CODEBOOK, "                spec=bound.plan.fc1_spec[tier],")
    found = [v for v in _tier_violations(root) if v.line >= line - 2 and v.line <= line + 12]
    assert any(v.parameter == "codebook" for v in found), [(v.rule, v.message) for v in found]


def test_other_codebook_is_caught_by_the_pinned_slot(tmp_path):
    root, line = _copy(tmp_path, FC1_CODEBOOK, FC1_CODEBOOK.replace('"mcg"', '"sqg_e4m3"'))
    found = [v for v in _tier_violations(root) if v.rule == "pinned-slot"]
    assert [(v.parameter, v.expression) for v in found] == [("codebook", "'sqg_e4m3'")]


def test_tier_plan_codebook_is_pinned(tmp_path):
    root = tmp_path / "b12x"
    shutil.copytree(default_root(), root, ignore=shutil.ignore_patterns("__pycache__"))
    ops = root / "ops" / "moe" / "custom_op.py"
    text = ops.read_text(encoding="utf-8")
    assert text.count('        codebook="mcg",\n') == 1
    ops.write_text(text.replace('        codebook="mcg",\n', ""), "utf-8")
    report = check_package(root, slots_path=DEFAULT_SLOTS_PATH)
    found = [v for v in report.violations if Path(v.path).name == "custom_op.py"]
    assert found and all(v.parameter == "codebook" for v in found), found


# ------------------------------------------------------------------ compile on CPU for sm_90

COMPILED = [  # the small-M plan geometry, and a LUT-reading bf16 wide-block geometry
    MoeGemmSpec("mcg", 3, False, m_tiles=1, n_tiles=2, depth=8),
    MoeGemmSpec("sqg_e4m3", 4, True, m_tiles=4, n_tiles=4, depth=2),
]


def _check_ptx(spec, arch):
    ptx = compile_moe_specialization(spec, arch)
    assert re.search(rf"\.target {arch}\b", ptx)
    kind = "bf16" if spec.bf16 else "f16"
    mma = ptx.count(f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32")
    assert mma >= 2 * spec.m_tiles * spec.n_tiles * spec.depth, mma


@pytest.mark.deep
@pytest.mark.parametrize("spec", COMPILED, ids=lambda s: f"{s.codebook}-k{s.bits}-m{s.m_tiles}")
def test_grouped_gemm_compiles_for_sm90(spec):
    _check_ptx(spec, "sm_90")


#: The fields every id names; the others appear only off their default.
_MOE_ID_FIELDS = ("codebook", "bits", "bf16", "m_tiles", "n_tiles", "warps", "depth")


def _moe_spec_id(s: MoeGemmSpec) -> str:
    """``mcg-K3-f16-m1n2w8d8-P24-rate_n``: codebook and rate, dtype, tiles, warps and depth,
    then each other field off its default (``k8`` for ``k_split`` 8; the pair and its axis)."""
    parts = [s.codebook, f"K{s.bits}", "bf16" if s.bf16 else "f16"]
    parts.append(f"m{s.m_tiles}n{s.n_tiles}w{s.warps}d{s.depth}")
    short = {"k_split": "k", "rate_axis": "rate_", "pair": ""}
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        if f.name in _MOE_ID_FIELDS or value == f.default:
            continue
        if isinstance(value, bool):
            parts.append(f.name if value else f"no_{f.name}")
        else:
            parts.append(f"{short.get(f.name, f.name)}{value}")
    return "-".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_120"])
@slow_sweep(
    "spec",
    moe_kernel_specializations,
    _moe_spec_id,
    reason="the grouped-GEMM compile sweep runs only when selected with -m slow",
)
def test_every_moe_specialization_compiles(spec, arch):
    _check_ptx(spec, arch)


def test_supported_variants_cover_layouts_dtypes_and_tiers():
    variants = supported_moe_variants()
    assert {v["w13_layout"] for v in variants} == {"packed", "proj"}
    assert {v["compute_dtype"] for v in variants} == {"float16", "bfloat16"}
    tiers = [v for v in variants if v["op"] == "moe_tiers"]
    assert tiers and all(v["codebook"] == "mcg" and v["bits"] == (3, 4) for v in tiers)
