"""The contract checker against the two real seeds (spec §5.2-§5.3, R1/R11) on synthetic packages.

Seed 1: ``_moe_body`` gained ``fc1_trellis_lut_addr, fc2_trellis_lut_addr`` before
``weight_num_experts`` and keeps two trailing ``None``-default emit hooks; the tier kernel still
calls ``self.driver._moe_body(...)`` positionally with the old 34 arguments, so everything after
``expert_map`` shifts two slots. Seed 2: the constructor's ``trellis_codebook`` default flipped to
``"sqg_xor_cheb_t12"`` while the tier compile path passed none.

Expectations are built independently of the checker: the shifted bindings come from zipping the
old argument list with the new parameter list by position (what CPython does), and the rule ids,
parameters and expressions of the other cases are written out by hand. Standard library only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oracle.contracts import check_b12x, check_package
from oracle.contracts.cli import main

# spec §5.2: `_moe_body` at 9bbae67 (after `self`): 34 positional + 2 keyword-default hooks.
BODY_PARAMS = [
    "a_bf16_flat", "a_alt_bf16_flat", "rotation_input_flat", "w13_i32_flat", "w2_i32_flat",
    "fc1_bf16_flat", "activated_bf16_flat", "fc2_bf16_flat", "w13_scales_i32_flat",
    "w2_scales_i32_flat", "w13_global_scale", "w2_global_scale", "packed_route_indices",
    "block_expert_ids", "packed_route_count", "activation_amax_flat", "layer_idx",
    "topk_weights_flat", "fc1_c_tmp_f32_flat", "fc2_c_tmp_f32_flat", "locks_i32_flat",
    "rot_scales_flat", "suh_gate_flat", "suh_up_flat", "expert_map_flat",
    "fc1_trellis_lut_addr", "fc2_trellis_lut_addr",
    "weight_num_experts", "route_num_experts", "smem_base", "tid", "cta", "grid_x", "active_m",
]  # fmt: skip
HOOKS = ["fc1_emit_tile", "fc2_emit_tile"]

# spec §5.3: what W4A16MixedTrellisKernel.kernel passes at 9bbae67 (no LUT slots): 34 arguments.
OLD_CALL = [
    "rotation_gate", "rotation_up", "rotation_input", "t0_w13", "t0_w2", "fc1", "activated",
    "fc2", "t0_w13_scales", "t0_w2_scales", "t0_w13_global", "t0_w2_global",
    "packed_route_indices", "block_expert_ids", "packed_route_count", "t0_w13_global",
    "Int32(0)", "topk_weights", "fc1_scratch", "fc2_scratch", "workspace",
    "intermediate_rotations", "gate_suh", "up_suh", "descriptor_map",
    "total_experts", "total_experts", "smem_base", "tid", "cta", "grid_x", "active_m",
    "fc1_emit", "fc2_emit",
]  # fmt: skip
LUT_AT = BODY_PARAMS.index("fc1_trellis_lut_addr")


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def _moe_package(tmp_path: Path, call: str, *, marked: bool) -> Path:
    params = ",\n                ".join(["self", *BODY_PARAMS, *(f"{h}=None" for h in HOOKS)])
    locals_ = sorted({a for a in OLD_CALL if a.isidentifier()} - {"smem_base", "tid", "cta"})
    assigns = "\n".join(f"                {name} = None" for name in locals_)
    driver = f'''
        """Driver with the shared MoE body."""
        from .abi import shared_body


        class W4A16FusedMoeKernel:
            def __init__(self, tile_n):
                self.tile_n = tile_n

            {"@shared_body" if marked else ""}
            def _moe_body(
                {params},
            ):
                return None
        '''
    tier = f'''
        """Tier kernel that reaches the body through self.driver."""
        from cutlass import Int32, Int64

        from .driver import W4A16FusedMoeKernel


        class W4A16MixedTrellisKernel:
            def __init__(self, tile_n):
                self.driver = W4A16FusedMoeKernel(tile_n)

            def kernel(self, smem_base, tid, cta):
{assigns}
                self.driver._moe_body(
                    {call}
                )
        '''
    abi = "def shared_body(fn):\n    return fn\n"
    files = {"__init__.py": "", "abi.py": abi, "driver.py": driver, "tier.py": tier}
    return _write(tmp_path / "moepkg", files)


def _positional(args: list[str]) -> str:
    return ",\n                    ".join(args) + ","


def _keywords(pairs: list[tuple[str, str]]) -> str:
    return ",\n                    ".join(f"{k}={v}" for k, v in pairs) + ","


def _expected_shifts() -> set[tuple[str, str]]:
    """(parameter, argument) for bare-name arguments that CPython binds to another parameter."""
    names = set(BODY_PARAMS) | set(HOOKS)
    new_params = BODY_PARAMS + HOOKS
    return {
        (param, arg)
        for param, arg in zip(new_params, OLD_CALL, strict=False)
        if arg in names and arg != param
    }


def _found(report, rule: str) -> set[tuple[str, str]]:
    return {(v.parameter, v.expression) for v in report.violations if v.rule == rule}


def test_seed_geometry_is_the_spec_geometry():
    assert len(BODY_PARAMS) == 34 and len(BODY_PARAMS) + len(HOOKS) == 36
    assert len(OLD_CALL) == 34
    assert BODY_PARAMS[LUT_AT - 1] == "expert_map_flat"
    assert BODY_PARAMS[LUT_AT + 2] == "weight_num_experts"


def test_seed1_shift_caught_when_body_is_not_marked(tmp_path):
    root = _moe_package(tmp_path, _positional(OLD_CALL), marked=False)
    report = check_package(root)
    rules = {v.rule for v in report.violations}
    assert rules == {"shifted-argument"}, "plain arity must pass: the shift rule is the catch"
    shifts = _found(report, "shifted-argument")
    assert shifts == _expected_shifts()
    assert ("weight_num_experts", "smem_base") in shifts
    assert ("cta", "active_m") in shifts
    assert ("smem_base", "cta") in shifts
    for v in report.violations:
        assert v.caller.endswith("tier.W4A16MixedTrellisKernel.kernel")
        assert v.callee.endswith("driver.W4A16FusedMoeKernel._moe_body")
        assert v.path.endswith("tier.py") and v.line > 0


def test_seed1_shared_body_rules_when_marked(tmp_path):
    root = _moe_package(tmp_path, _positional(OLD_CALL), marked=True)
    report = check_package(root)
    assert _found(report, "shifted-argument") == _expected_shifts()
    positional = _found(report, "shared-body-positional")
    new_params = BODY_PARAMS + HOOKS
    assert positional == {(new_params[i], arg) for i, arg in enumerate(OLD_CALL)}
    assert _found(report, "shared-body-default") == {(h, "None") for h in HOOKS}
    assert {v.rule for v in report.violations} == {
        "shifted-argument",
        "shared-body-positional",
        "shared-body-default",
    }
    # the body's own signature (positional parameters, defaulted hooks) is flagged as an info
    signature_infos = {v.parameter for v in report.infos if v.rule == "shared-body-signature"}
    assert signature_infos == set(BODY_PARAMS + HOOKS)


def test_seed1_repaired_call_passes_when_marked(tmp_path):
    body_args = OLD_CALL[:LUT_AT] + ["Int64(0)", "Int64(0)"] + OLD_CALL[LUT_AT:]
    pairs = list(zip(BODY_PARAMS + HOOKS, body_args, strict=True))
    root = _moe_package(tmp_path, _keywords(pairs), marked=True)
    report = check_package(root)
    assert report.violations == []
    assert report.counts["resolved_calls"] >= 2  # the body call and the constructor


def test_seed1_repaired_call_passes_when_not_marked(tmp_path):
    head = OLD_CALL[:LUT_AT]
    values = ["Int64(0)", "Int64(0)", *OLD_CALL[LUT_AT:]]
    tail = list(zip(BODY_PARAMS[LUT_AT:] + HOOKS, values, strict=True))
    call = _positional(head) + "\n                    " + _keywords(tail)
    report = check_package(_moe_package(tmp_path, call, marked=False))
    assert report.violations == []


def test_seed1_marked_body_short_keyword_call_is_reported(tmp_path):
    """All keywords but the LUT slots left out: arity catches it, defaults are named."""
    pairs = list(zip(BODY_PARAMS[:LUT_AT] + BODY_PARAMS[LUT_AT + 2 :], OLD_CALL, strict=False))
    report = check_package(_moe_package(tmp_path, _keywords(pairs), marked=True))
    missing = {v.parameter for v in report.violations if v.rule == "arity"}
    assert missing == {"fc1_trellis_lut_addr", "fc2_trellis_lut_addr"}
    assert _found(report, "shared-body-default") == {(h, "None") for h in HOOKS}


# --- seed 2: the codebook default flip -------------------------------------------------------


def _codebook_package(tmp_path: Path, codebook_kw: str) -> Path:
    kernel = '''
        """Kernel whose constructor default flipped to SQG."""


        class W4A16GemmKernel:
            def __init__(self, tile_n, tile_k, *, trellis_bits=4,
                         trellis_codebook="sqg_xor_cheb_t12"):
                self.trellis_codebook = trellis_codebook
        '''
    tiers = f'''
        """Tier compile path."""
        from . import kernel as kernel_module


        def compile_tier(bits, trellis_codebook):
            return kernel_module.W4A16GemmKernel(128, 32, trellis_bits=bits{codebook_kw})


        def compile_dense(bits, trellis_codebook):
            return kernel_module.W4A16GemmKernel(
                128, 32, trellis_bits=bits, trellis_codebook=trellis_codebook
            )
        '''
    files = {"__init__.py": "", "kernel.py": kernel, "tiers.py": tiers}
    return _write(tmp_path / "cbpkg", files)


def _codebook_slots(tmp_path: Path) -> Path:
    entry = {
        "callee": "W4A16GemmKernel",
        "parameter": "trellis_codebook",
        "allowed": ["'mcg'", "trellis_codebook"],
        "explicit": True,
        "reason": "tier payloads are MCG; never rely on the constructor default",
    }
    path = tmp_path / "pinned_slots.json"
    path.write_text(json.dumps({"comment": "test", "slots": [entry]}), encoding="utf-8")
    return path


def test_seed2_missing_codebook_is_reported(tmp_path):
    report = check_package(_codebook_package(tmp_path, ""), slots_path=_codebook_slots(tmp_path))
    assert [(v.rule, v.parameter, v.expression) for v in report.violations] == [
        ("pinned-slot", "trellis_codebook", "'sqg_xor_cheb_t12'")
    ]
    violation = report.violations[0]
    assert violation.caller.endswith("tiers.compile_tier")
    assert violation.callee.endswith("kernel.W4A16GemmKernel.__init__")
    assert "explicitly" in violation.message


def test_seed2_without_slot_registry_the_flip_is_silent(tmp_path):
    assert check_package(_codebook_package(tmp_path, "")).violations == []


def test_seed2_explicit_mcg_passes(tmp_path):
    root = _codebook_package(tmp_path, ', trellis_codebook="mcg"')
    assert check_package(root, slots_path=_codebook_slots(tmp_path)).violations == []


def test_seed2_disallowed_codebook_is_reported(tmp_path):
    root = _codebook_package(tmp_path, ', trellis_codebook="sqg_e4m3"')
    report = check_package(root, slots_path=_codebook_slots(tmp_path))
    assert [(v.rule, v.parameter, v.expression) for v in report.violations] == [
        ("pinned-slot", "trellis_codebook", "'sqg_e4m3'")
    ]


def test_stale_slot_entry_is_reported(tmp_path):
    path = tmp_path / "slots.json"
    entries = [
        {"callee": "NoSuchKernel", "parameter": "x", "explicit": True},
        {"callee": "W4A16GemmKernel", "parameter": "codebook", "explicit": True},
    ]
    path.write_text(json.dumps(entries), encoding="utf-8")
    report = check_package(_codebook_package(tmp_path, ', trellis_codebook="mcg"'), slots_path=path)
    assert {(v.rule, v.callee, v.parameter) for v in report.violations} == {
        ("pinned-slot", "NoSuchKernel", "x"),
        ("pinned-slot", "W4A16GemmKernel", "codebook"),
    }


# --- the real package and the command line ---------------------------------------------------


def test_real_b12x_has_no_violations():
    report = check_b12x()
    assert report.violations == [], "\n".join(v.format() for v in report.violations)
    assert report.counts["modules"] >= 2


def test_cli_reports_and_exits_1(tmp_path, capsys):
    root = _moe_package(tmp_path, _positional(OLD_CALL), marked=False)
    json_path = tmp_path / "out" / "report.json"
    assert main(["--root", str(root), "--json", str(json_path)]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "weight_num_experts <- smem_base" in x)
    assert "tier.py:" in line and "[shifted-argument]" in line
    assert "moepkg.tier.W4A16MixedTrellisKernel.kernel -> " in line
    assert "moepkg.driver.W4A16FusedMoeKernel._moe_body" in line
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert data["ok"] is False
    assert data["by_rule"] == {"shifted-argument": len(_expected_shifts())}
    assert {(v["parameter"], v["expression"]) for v in data["violations"]} == _expected_shifts()


def test_cli_exits_0_on_a_correct_package(tmp_path, capsys):
    root = _codebook_package(tmp_path, ', trellis_codebook="mcg"')
    slots = _codebook_slots(tmp_path)
    assert main(["--root", str(root), "--slots", str(slots)]) == 0
    assert "0 violation(s)" in capsys.readouterr().out


def test_cli_subprocess_exit_codes(tmp_path):
    bad = _codebook_package(tmp_path, "")
    slots = _codebook_slots(tmp_path)
    command = [sys.executable, "-m", "oracle.contracts.cli", "--root", str(bad)]
    result = subprocess.run([*command, "--slots", str(slots)], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert (
        "[pinned-slot]" in result.stdout
        and "trellis_codebook <- 'sqg_xor_cheb_t12'" in result.stdout
    )
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("bad_json", ['{"slots": [{"callee": 3}]}', "[1]", "{nope"])
def test_bad_slots_file_raises_value_error(tmp_path, bad_json):
    path = tmp_path / "slots.json"
    path.write_text(bad_json, encoding="utf-8")
    with pytest.raises(ValueError, match="slots_path"):
        check_package(_codebook_package(tmp_path, ""), slots_path=path)


def test_bad_arguments_raise(tmp_path):
    with pytest.raises(TypeError, match="root"):
        check_package(3)
    with pytest.raises(ValueError, match="root"):
        check_package(tmp_path / "missing")
    with pytest.raises(TypeError, match="lock_path"):
        check_package(tmp_path, lock_path=1)


def test_unparsable_file_is_a_violation(tmp_path):
    root = _write(tmp_path / "brokenpkg", {"__init__.py": "", "bad.py": "def f(:\n    pass\n"})
    report = check_package(root)
    assert [(v.rule, Path(v.path).name) for v in report.violations] == [("parse-error", "bad.py")]
